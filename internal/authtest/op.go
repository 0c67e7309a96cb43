package authtest

import (
	"io"
	"log/slog"
	"net"
	"net/http/httptest"
	"testing"

	"github.com/zitadel/oidc/v3/example/server/exampleop"
	"github.com/zitadel/oidc/v3/example/server/storage"
)

// StartOP runs zitadel's example OpenID provider (in-memory storage) on
// loopback until the test ends, and returns its issuer URL. Its client
// "assent" (secret "s3cret") returns to redirect. Its users:
// "test-user@127.0.0.1" (email test-user@zitadel.ch) and "test-user2"
// (test-user2@zitadel.ch), both with password "verysecure".
func StartOP(t testing.TB, redirect string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	issuer := "http://" + ln.Addr().String()
	storage.RegisterClients(storage.WebClient("assent", "s3cret", redirect))
	router := exampleop.SetupServer(issuer, storage.NewStorage(storage.NewUserStore(issuer)), slog.New(slog.NewTextHandler(io.Discard, nil)), false)
	srv := httptest.NewUnstartedServer(router)
	srv.Listener.Close()
	srv.Listener = ln
	srv.Start()
	t.Cleanup(srv.Close)
	return issuer
}
