package healthcheck_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/assent-dev/assent/internal/healthcheck"
	"github.com/assent-dev/assent/internal/httptls"
	"github.com/assent-dev/assent/internal/testcerts"
)

func TestCheck(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/ok":
			_, _ = w.Write([]byte("ok\n"))
		case "/down":
			http.Error(w, "NATS: RECONNECTING\nmore", http.StatusServiceUnavailable)
		default:
			http.Error(w, "missing session", http.StatusBadRequest)
		}
	}))
	t.Cleanup(srv.Close)
	// A port nothing listens on: a listener opened and closed.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "http://" + ln.Addr().String() + "/healthz"
	ln.Close()

	tests := []struct {
		name    string
		o       healthcheck.Options
		wantErr error
		msg     string // in the error
	}{
		{"healthy", healthcheck.Options{URL: srv.URL + "/ok"}, nil, ""},
		{"503 with its reason", healthcheck.Options{URL: srv.URL + "/down"}, healthcheck.ErrUnhealthy, "503 Service Unavailable: NATS: RECONNECTING"},
		{"client error", healthcheck.Options{URL: srv.URL + "/mcp"}, healthcheck.ErrUnhealthy, "400 Bad Request"},
		{"client error, any status", healthcheck.Options{URL: srv.URL + "/mcp", AnyStatus: true}, nil, ""},
		{"server error, any status", healthcheck.Options{URL: srv.URL + "/down", AnyStatus: true}, healthcheck.ErrUnhealthy, "503"},
		{"nothing listens", healthcheck.Options{URL: closed}, healthcheck.ErrUnhealthy, "refused"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := healthcheck.Check(context.Background(), tt.o)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("err %v, want %v", err, tt.wantErr)
			}
			if err != nil && (!strings.Contains(err.Error(), tt.msg) || strings.Contains(err.Error(), "\n")) {
				t.Fatalf("err %q: want one line with %q", err, tt.msg)
			}
		})
	}
}

func TestMainCommand(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/healthz" {
			http.NotFound(w, r)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	}))
	t.Cleanup(srv.Close)
	d := healthcheck.Options{URL: srv.URL + "/healthz"}
	tests := []struct {
		args       []string
		code       int
		out, erred string
	}{
		{nil, 0, "200 OK", ""},
		{[]string{"--url", srv.URL + "/nope"}, 1, "", "prog health: unhealthy: " + srv.URL + "/nope answered 404 Not Found"},
		{[]string{"extra"}, 2, "", `unexpected argument "extra"`},
		{[]string{"--bogus"}, 2, "", "flag provided but not defined"},
		{[]string{"-h"}, 0, "", "usage: prog health"},
	}
	for _, tt := range tests {
		var out, errb bytes.Buffer
		code := healthcheck.Main(context.Background(), "prog health", d, tt.args, &out, &errb)
		if code != tt.code || !strings.Contains(out.String(), tt.out) || !strings.Contains(errb.String(), tt.erred) {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want %d, %q, %q", tt.args, code, out.String(), errb.String(), tt.code, tt.out, tt.erred)
		}
	}
}

// TestCheckTLS: an https endpoint is healthy to a check that trusts its
// CA (--ca), and, behind mutual TLS, presents a certificate the server's
// client CA signed (--cert, --key); otherwise it is unhealthy, saying why.
func TestCheckTLS(t *testing.T) {
	set := testcerts.New(t)
	for _, mutual := range []bool{false, true} {
		certs, err := httptls.Load(httptls.Files{CertFile: set.ServerCertFile, KeyFile: set.ServerKey, ClientCAFile: map[bool]string{true: set.CAFile}[mutual]}, nil)
		if err != nil {
			t.Fatal(err)
		}
		srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte("ok\n")) }))
		// Served as the programs serve: the certificate from certs.
		srv.Listener = tls.NewListener(srv.Listener, certs.Config())
		srv.Start()
		t.Cleanup(srv.Close)
		srv.URL = strings.Replace(srv.URL, "http://", "https://", 1)
		client := httptls.ClientFiles{CAFile: set.CAFile, CertFile: set.ClientCertFile, KeyFile: set.ClientKey}
		tests := []struct {
			name string
			tls  httptls.ClientFiles
			ok   bool
		}{
			{"the CA and a certificate", client, true},
			{"the CA", httptls.ClientFiles{CAFile: set.CAFile}, !mutual},
			{"nothing", httptls.ClientFiles{}, false},
		}
		for _, tt := range tests {
			_, err := healthcheck.Check(context.Background(), healthcheck.Options{URL: srv.URL + "/readyz", TLS: tt.tls})
			if (err == nil) != tt.ok || err != nil && !errors.Is(err, healthcheck.ErrUnhealthy) {
				t.Errorf("mutual %v, %s: %v, want healthy %v", mutual, tt.name, err, tt.ok)
			}
		}
		var out, errb bytes.Buffer
		args := []string{"--url", srv.URL + "/readyz", "--ca", set.CAFile, "--cert", set.ClientCertFile, "--key", set.ClientKey}
		if code := healthcheck.Main(context.Background(), "prog health", healthcheck.Options{}, args, &out, &errb); code != 0 || !strings.Contains(out.String(), "200 OK") {
			t.Errorf("mutual %v: Main %q: exit %d, %q %q", mutual, args, code, &out, &errb)
		}
	}
	_, err := healthcheck.Check(context.Background(), healthcheck.Options{URL: "https://127.0.0.1:1/", TLS: httptls.ClientFiles{CertFile: set.ClientCertFile}})
	if err == nil || errors.Is(err, healthcheck.ErrUnhealthy) || !strings.Contains(err.Error(), "--cert without --key") {
		t.Errorf("--cert without --key: %v, want a usage error", err)
	}
}
