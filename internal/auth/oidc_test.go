package auth_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/assent-dev/assent/internal/auth"
	"github.com/assent-dev/assent/internal/authtest"
	"github.com/assent-dev/assent/internal/testenv"
	"github.com/assent-dev/assent/pkg/policy"
)

// signIn drives a browser's sign-in (a cookie jar that follows redirects)
// from ours/auth/login through the provider's login form as user, and
// returns the last response.
func signIn(t *testing.T, client *http.Client, ours, user string) *http.Response {
	t.Helper()
	resp, err := client.Get(ours + "/auth/login?next=/whoami")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	// The provider's login form: its URL carries the auth request id.
	id := resp.Request.URL.Query().Get("authRequestID")
	if id == "" {
		t.Fatalf("not at the provider's login form: %s", resp.Request.URL)
	}
	form := url.Values{"id": {id}, "username": {user}, "password": {"verysecure"}}
	resp, err = client.PostForm(resp.Request.URL.Scheme+"://"+resp.Request.URL.Host+"/login/username", form)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// TestOIDCSignIn signs people in through a real OpenID provider: a mapped
// user gets a session as their principal (by verified email); an unmapped one
// a page saying how to be mapped; a callback whose state is not the browser's
// is refused.
func TestOIDCSignIn(t *testing.T) {
	ns := testenv.Server(t)
	js, err := jetstream.New(testenv.Conn(t, ns))
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ours := "http://" + ln.Addr().String()
	issuer := authtest.StartOP(t, ours+"/auth/callback")

	path := filepath.Join(t.TempDir(), "auth.yaml")
	file := "oidc:\n  issuer: " + issuer + "\n  client_id: assent\n  client_secret_env: TEST_OIDC_SECRET\n  redirect_url: " + ours + "/auth/callback\n"
	if err := os.WriteFile(path, []byte(file), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("TEST_OIDC_SECRET", "s3cret")
	cfg, err := auth.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	pol, err := policy.Parse([]byte("version: 1\nprincipals:\n  alice: {email: test-user@zitadel.ch}\n"), "policy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	a, err := auth.New(ctx, cfg, path, auth.Options{JS: js, Principals: func() auth.PrincipalResolver { return pol }, Logger: testenv.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = a.Run(ctx) }()
	mux := http.NewServeMux()
	a.Routes(mux)
	mux.HandleFunc("GET /whoami", func(w http.ResponseWriter, r *http.Request) {
		id, ok := auth.FromContext(r.Context())
		if !ok {
			http.Error(w, "nobody", http.StatusUnauthorized)
			return
		}
		_, _ = io.WriteString(w, id.Method+":"+id.Principal)
	})
	srv := httptest.NewUnstartedServer(a.Middleware(mux))
	srv.Listener.Close()
	srv.Listener = ln
	srv.Start()
	defer srv.Close()

	newBrowser := func() *http.Client {
		jar, _ := cookiejar.New(nil)
		return &http.Client{Jar: jar}
	}

	t.Run("mapped", func(t *testing.T) {
		browser := newBrowser()
		resp := signIn(t, browser, ours, "test-user@127.0.0.1")
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || string(body) != "oidc:alice" || resp.Request.URL.Path != "/whoami" {
			t.Fatalf("after sign-in: %d at %s: %s", resp.StatusCode, resp.Request.URL, body)
		}
		if a.Stats().Sessions != 1 {
			t.Fatalf("sessions %d", a.Stats().Sessions)
		}
		u, _ := url.Parse(ours)
		var session *http.Cookie
		for _, c := range browser.Jar.Cookies(u) {
			if c.Name == auth.DefaultCookie {
				session = c
			}
		}
		if session == nil {
			t.Fatal("no session cookie")
		}
	})
	t.Run("unmapped", func(t *testing.T) {
		resp := signIn(t, newBrowser(), ours, "test-user2")
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusForbidden || !strings.Contains(string(body), "test-user2@zitadel.ch") || !strings.Contains(string(body), "identities") {
			t.Fatalf("unmapped user: %d %s", resp.StatusCode, body)
		}
		if a.Stats().Failures["unmapped_identity"] != 1 {
			t.Fatalf("failures %v", a.Stats().Failures)
		}
	})
	t.Run("foreign state", func(t *testing.T) {
		browser := newBrowser()
		resp, err := browser.Get(ours + "/auth/login")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		resp, err = browser.Get(ours + "/auth/callback?state=forged&code=whatever")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), "not yours") {
			t.Fatalf("forged state: %d %s", resp.StatusCode, body)
		}
	})
}
