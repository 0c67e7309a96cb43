package auth_test

import (
	"context"
	"crypto/tls"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/assent-dev/assent/internal/auth"
	"github.com/assent-dev/assent/internal/testenv"
	"github.com/assent-dev/assent/pkg/policy"
)

const testPolicy = `version: 1
principals:
  alice: {email: alice@example.com}
  bob:   {identities: {oidc: bob-sub}}
`

func mustPolicy(t *testing.T) *policy.Policy {
	t.Helper()
	p, err := policy.Parse([]byte(testPolicy), "policy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// harness is an authenticator in front of a handler that reports the
// identity it was given.
type harness struct {
	t    *testing.T
	a    *auth.Authenticator
	path string
	h    http.Handler
}

func newHarness(t *testing.T, js jetstream.JetStream, file string, now func() time.Time) *harness {
	t.Helper()
	path := filepath.Join(t.TempDir(), "auth.yaml")
	if err := os.WriteFile(path, []byte(file), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := auth.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	p := mustPolicy(t)
	ctx, cancel := context.WithCancel(context.Background())
	a, err := auth.New(ctx, cfg, path, auth.Options{JS: js, Principals: func() auth.PrincipalResolver { return p }, Logger: testenv.Logger(t), Now: now})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = a.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	mux := http.NewServeMux()
	a.Routes(mux)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		id, ok := auth.FromContext(r.Context())
		if !ok {
			w.Header().Set("X-Who", "nobody")
		} else {
			w.Header().Set("X-Who", id.Method+":"+id.Principal+":"+id.Agent)
			w.Header().Set("X-Admin", strconv.FormatBool(id.Admin))
			w.Header().Set("X-CSRF", auth.CSRFToken(r.Context()))
		}
		w.WriteHeader(http.StatusOK)
	})
	return &harness{t: t, a: a, path: path, h: a.Middleware(mux)}
}

// do serves one request from remote (an "ip:port") with headers.
func (h *harness) do(method, path, remote string, header map[string]string, cookies ...*http.Cookie) *httptest.ResponseRecorder {
	r := httptest.NewRequest(method, path, nil)
	r.RemoteAddr = remote
	for k, v := range header {
		r.Header.Set(k, v)
	}
	for _, c := range cookies {
		r.AddCookie(c)
	}
	w := httptest.NewRecorder()
	h.h.ServeHTTP(w, r)
	return w
}

func wantStatus(t *testing.T, w *httptest.ResponseRecorder, status int, code string) {
	t.Helper()
	if w.Code != status || (code != "" && !strings.Contains(w.Body.String(), `"code":"`+code+`"`)) {
		t.Fatalf("status %d %s, want %d %s", w.Code, w.Body.String(), status, code)
	}
}

// TestAdmins: an admin token, and a principal the auth file's admins list
// names (through any sign-in), are admin; no one else is.
func TestAdmins(t *testing.T) {
	h := newHarness(t, nil, "admins: [carol]\n", nil)
	tokens := map[string]string{}
	for _, tc := range []struct {
		name, principal, agent string
		admin                  bool
	}{{"ops", "", "", true}, {"carol", "carol", "", false}, {"alice", "alice", "", false}, {"coder", "", "coder", false}} {
		tok, err := auth.CreateToken(h.path, tc.name, tc.principal, tc.agent, tc.admin, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		tokens[tc.name] = tok
	}
	if err := h.a.Reload(); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{"ops": "true", "carol": "true", "alice": "false", "coder": "false"} {
		w := h.do("GET", "/v1/approvals", "192.0.2.1:5000", map[string]string{"Authorization": "Bearer " + tokens[name]})
		if got := w.Header().Get("X-Admin"); got != want {
			t.Errorf("token %s: admin %s, want %s", name, got, want)
		}
	}
	for _, bad := range []string{"admins: carol\n", "admins: [\"a b\"]\n", "admins: [carol, carol]\n", "tokens:\n  - {name: x, admin: maybe, hash: sha256:" + strings.Repeat("0", 64) + "}\n"} {
		if _, err := auth.Parse([]byte(bad), "auth.yaml"); !errors.Is(err, auth.ErrBadValue) && !errors.Is(err, auth.ErrDuplicate) {
			t.Errorf("%q: %v, want a bad value or duplicate", bad, err)
		}
	}
}

func TestTokens(t *testing.T) {
	h := newHarness(t, nil, "# API tokens\ntokens: []\n", nil)
	tok, err := auth.CreateToken(h.path, "alice-laptop", "alice", "", false, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	agentTok, err := auth.CreateToken(h.path, "fm", "", "file-manager", false, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if err := h.a.Reload(); err != nil {
		t.Fatal(err)
	}
	const from = "192.0.2.1:5000"
	if w := h.do("GET", "/v1/approvals", from, nil); w.Header().Get("X-Who") != "nobody" {
		t.Fatalf("no credential: %q", w.Header().Get("X-Who"))
	}
	if w := h.do("GET", "/v1/approvals", from, map[string]string{"Authorization": "Bearer " + tok}); w.Header().Get("X-Who") != "token:alice:" {
		t.Fatalf("token: %q", w.Header().Get("X-Who"))
	}
	if w := h.do("POST", "/v1/approvals", from, map[string]string{"Authorization": "Bearer " + agentTok}); w.Code != http.StatusOK || w.Header().Get("X-Who") != "token::file-manager" {
		t.Fatalf("agent token, no CSRF needed: %d %q", w.Code, w.Header().Get("X-Who"))
	}
	w := h.do("GET", "/v1/approvals", from, map[string]string{"Authorization": "Bearer assent_wrong"})
	wantStatus(t, w, http.StatusUnauthorized, "unauthenticated")
	if w.Header().Get("WWW-Authenticate") == "" {
		t.Fatal("401 without WWW-Authenticate")
	}
	wantStatus(t, h.do("GET", "/v1/approvals", from, map[string]string{"Authorization": "Basic " + tok}), http.StatusUnauthorized, "unauthenticated")

	// Revoked while running: refused within a few seconds, no restart.
	if err := auth.RevokeToken(h.path, "alice-laptop"); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for h.do("GET", "/v1/approvals", "198.51.100.7:1", map[string]string{"Authorization": "Bearer " + tok}).Code != http.StatusUnauthorized {
		if time.Now().After(deadline) {
			t.Fatal("a revoked token still works")
		}
		time.Sleep(100 * time.Millisecond)
	}
	if w := h.do("GET", "/v1/approvals", from, map[string]string{"Authorization": "Bearer " + agentTok}); w.Code != http.StatusOK {
		t.Fatalf("the other token stopped working: %d", w.Code)
	}
	if f := h.a.Stats().Failures["unknown_token"]; f < 3 {
		t.Fatalf("failures counted: %d", f)
	}
}

func TestRateLimit(t *testing.T) {
	h := newHarness(t, nil, "", nil)
	tok, err := auth.CreateToken(h.path, "ok", "alice", "", false, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if err := h.a.Reload(); err != nil {
		t.Fatal(err)
	}
	const attacker = "203.0.113.9:4000"
	for range 10 {
		wantStatus(t, h.do("GET", "/v1/audit", attacker, map[string]string{"Authorization": "Bearer nope"}), http.StatusUnauthorized, "unauthenticated")
	}
	w := h.do("GET", "/v1/audit", attacker, map[string]string{"Authorization": "Bearer " + tok})
	wantStatus(t, w, http.StatusTooManyRequests, "rate_limited")
	if w.Header().Get("Retry-After") == "" {
		t.Fatal("429 without Retry-After")
	}
	// Another address is not held back, and nobody without a credential is.
	if w := h.do("GET", "/v1/audit", "203.0.113.10:4000", map[string]string{"Authorization": "Bearer " + tok}); w.Code != http.StatusOK {
		t.Fatalf("another address: %d", w.Code)
	}
	if w := h.do("GET", "/healthz", attacker, nil); w.Code != http.StatusOK {
		t.Fatalf("no credential from the limited address: %d", w.Code)
	}
	if h.a.Stats().RateLimited != 1 {
		t.Fatalf("rate-limited count %d", h.a.Stats().RateLimited)
	}
}

const proxyFile = `proxy:
  header: X-Forwarded-Email
  trusted: [127.0.0.1/32]
sessions:
  ttl: 1h
`

// proxyLogin loads a page through the proxy as email and returns the session
// cookie it gets.
func proxyLogin(t *testing.T, h *harness, email string) *http.Cookie {
	t.Helper()
	w := h.do("GET", "/", "127.0.0.1:9999", map[string]string{"X-Forwarded-Email": email})
	if w.Header().Get("X-Who") != "proxy:alice:" {
		t.Fatalf("through the proxy: %q (%d %s)", w.Header().Get("X-Who"), w.Code, w.Body)
	}
	for _, c := range w.Result().Cookies() {
		if c.Name == auth.DefaultCookie {
			return c
		}
	}
	t.Fatal("no session cookie")
	return nil
}

func TestProxyAndSessions(t *testing.T) {
	ns := testenv.Server(t)
	js, err := jetstream.New(testenv.Conn(t, ns))
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	now := time.Now()
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	one := newHarness(t, js, proxyFile, clock)
	two := newHarness(t, js, proxyFile, clock)

	// Only the proxy's address is believed; an unmapped identity is refused.
	if w := one.do("GET", "/", "10.9.9.9:1", map[string]string{"X-Forwarded-Email": "alice@example.com"}); w.Header().Get("X-Who") != "nobody" {
		t.Fatalf("header from an untrusted address: %q", w.Header().Get("X-Who"))
	}
	wantStatus(t, one.do("GET", "/v1/approvals", "127.0.0.1:9", map[string]string{"X-Forwarded-Email": "eve@example.com"}), http.StatusUnauthorized, "unauthenticated")
	if one.a.Stats().Failures["proxy_untrusted"] != 1 || one.a.Stats().Failures["unmapped_identity"] != 1 {
		t.Fatalf("failures %v", one.a.Stats().Failures)
	}

	cookie := proxyLogin(t, one, "alice@example.com")
	if !cookie.HttpOnly || cookie.SameSite != http.SameSiteLaxMode || cookie.Secure || cookie.MaxAge != 3600 {
		t.Fatalf("cookie %+v: want HttpOnly, SameSite=Lax, not Secure over plain HTTP, an hour", cookie)
	}
	// The session works on the other replica, with no proxy header.
	w := two.do("GET", "/v1/approvals", "192.0.2.50:1", nil, cookie)
	if w.Header().Get("X-Who") != "proxy:alice:" {
		t.Fatalf("session on another replica: %q", w.Header().Get("X-Who"))
	}
	csrf := w.Header().Get("X-CSRF")

	// CSRF on state-changing requests.
	wantStatus(t, two.do("POST", "/v1/decisions", "192.0.2.50:1", nil, cookie), http.StatusForbidden, "csrf")
	wantStatus(t, two.do("POST", "/v1/decisions", "192.0.2.50:1", map[string]string{"X-CSRF-Token": "guess"}, cookie), http.StatusForbidden, "csrf")
	wantStatus(t, two.do("POST", "/v1/decisions", "192.0.2.50:1", map[string]string{"X-CSRF-Token": csrf, "Origin": "https://evil.example"}, cookie), http.StatusForbidden, "csrf")
	if w := two.do("POST", "/v1/decisions", "192.0.2.50:1", map[string]string{"X-CSRF-Token": csrf, "Origin": "http://example.com"}, cookie); w.Code != http.StatusOK {
		t.Fatalf("right CSRF token from the same origin: %d %s", w.Code, w.Body)
	}

	// Logout on one replica ends the session on the other.
	if w := one.do("POST", "/auth/logout", "192.0.2.50:1", map[string]string{"X-CSRF-Token": csrf, "Accept": "application/json"}, cookie); w.Code != http.StatusNoContent {
		t.Fatalf("logout: %d %s", w.Code, w.Body)
	}
	deadline := time.Now().Add(5 * time.Second)
	for two.do("GET", "/v1/approvals", "192.0.2.50:1", nil, cookie).Code != http.StatusUnauthorized {
		if time.Now().After(deadline) {
			t.Fatal("a logged-out session still works on another replica")
		}
		time.Sleep(50 * time.Millisecond)
	}
	// A page request with the dead cookie goes on without identity and
	// clears it.
	w = two.do("GET", "/", "192.0.2.50:1", nil, cookie)
	if w.Header().Get("X-Who") != "nobody" || !strings.Contains(w.Header().Get("Set-Cookie"), "Max-Age=0") {
		t.Fatalf("page with an ended session: %q %q", w.Header().Get("X-Who"), w.Header().Get("Set-Cookie"))
	}

	// Expiry.
	cookie = proxyLogin(t, one, "alice@example.com")
	mu.Lock()
	now = now.Add(2 * time.Hour)
	mu.Unlock()
	wantStatus(t, one.do("GET", "/v1/approvals", "192.0.2.50:1", nil, cookie), http.StatusUnauthorized, "unauthenticated")
	if one.a.Stats().Failures["expired_session"] == 0 {
		t.Fatalf("failures %v", one.a.Stats().Failures)
	}
}

// TestSecureCookieOverTLS: with secure: auto, cookies are Secure over TLS.
func TestSecureCookieOverTLS(t *testing.T) {
	ns := testenv.Server(t)
	js, err := jetstream.New(testenv.Conn(t, ns))
	if err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, js, proxyFile, nil)
	srv := httptest.NewTLSServer(h.h)
	defer srv.Close()
	client := srv.Client()
	client.Transport.(*http.Transport).TLSClientConfig = &tls.Config{InsecureSkipVerify: true} //nolint:gosec // the test server's own certificate
	req, _ := http.NewRequest("GET", srv.URL+"/", nil)
	req.Header.Set("X-Forwarded-Email", "alice@example.com")
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	cookies := resp.Cookies()
	if len(cookies) != 1 || !cookies[0].Secure || !cookies[0].HttpOnly {
		t.Fatalf("cookies over TLS: %+v", cookies)
	}
}

func TestParseErrors(t *testing.T) {
	tests := []struct {
		name, file string
		line       int
		want       error
	}{
		{"unknown field", "tokenz: []\n", 1, auth.ErrUnknownField},
		{"syntax", "tokens: [\n", 1, auth.ErrSyntax},
		{"no hash", "tokens:\n  - name: a\n    principal: alice\n", 2, auth.ErrMissing},
		{"bad hash", "tokens:\n  - name: a\n    principal: alice\n    hash: md5:00\n", 2, auth.ErrBadValue},
		{"duplicate name", "tokens:\n  - {name: a, principal: x, hash: \"sha256:" + strings.Repeat("a", 64) + "\"}\n  - {name: a, principal: y, hash: \"sha256:" + strings.Repeat("b", 64) + "\"}\n", 3, auth.ErrDuplicate},
		{"neither principal nor agent", "tokens:\n  - {name: a, hash: \"sha256:" + strings.Repeat("a", 64) + "\"}\n", 2, auth.ErrMissing},
		{"oidc without issuer", "oidc:\n  client_id: x\n  redirect_url: https://a/auth/callback\n", 2, auth.ErrMissing},
		{"proxy without trusted", "proxy:\n  header: X-Email\n", 2, auth.ErrMissing},
		{"bad prefix", "proxy:\n  header: X-Email\n  trusted: [somewhere]\n", 3, auth.ErrBadValue},
		{"bad ttl", "sessions:\n  ttl: forever\n", 2, auth.ErrBadValue},
		{"bad secure", "sessions:\n  secure: maybe\n", 2, auth.ErrBadValue},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := auth.Parse([]byte(tc.file), "auth.yaml")
			if !errors.Is(err, tc.want) || !errors.Is(err, auth.ErrInvalid) {
				t.Fatalf("error %v, want %v", err, tc.want)
			}
			var p *auth.Problem
			if !errors.As(err, &p) || p.Line != tc.line || !strings.HasPrefix(err.Error(), "auth.yaml:") {
				t.Fatalf("error %v: want line %d", err, tc.line)
			}
		})
	}
	cfg, err := auth.Parse(nil, "empty.yaml")
	if err != nil || len(cfg.Tokens) != 0 || cfg.Sessions.TTL != auth.DefaultSessionTTL {
		t.Fatalf("empty file: %+v %v", cfg, err)
	}
}

func TestEditTokens(t *testing.T) {
	path := filepath.Join(t.TempDir(), "auth.yaml")
	if err := os.WriteFile(path, []byte("# who may call the broker\nsessions:\n  ttl: 8h # a working day\n"), 0o640); err != nil {
		t.Fatal(err)
	}
	tok, err := auth.CreateToken(path, "ci", "", "deployer", false, time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(tok, "assent_") || len(tok) < 40 {
		t.Fatalf("token %q", tok)
	}
	if _, err := auth.CreateToken(path, "ci", "alice", "", false, time.Now()); !errors.Is(err, auth.ErrTokenExists) {
		t.Fatalf("second token of a name: %v", err)
	}
	if _, err := auth.CreateToken(path, "x", "", "", false, time.Now()); err == nil {
		t.Fatal("a token for nobody")
	}
	data, _ := os.ReadFile(path)
	if !strings.Contains(string(data), "# who may call the broker") || !strings.Contains(string(data), "# a working day") || strings.Contains(string(data), tok) {
		t.Fatalf("edited file:\n%s", data)
	}
	if fi, _ := os.Stat(path); fi.Mode().Perm() != 0o640 {
		t.Fatalf("mode %v", fi.Mode().Perm())
	}
	cfg, err := auth.Load(path)
	if err != nil || len(cfg.Tokens) != 1 || cfg.Tokens[0].Hash != auth.HashToken(tok) || cfg.Tokens[0].Agent != "deployer" || cfg.Sessions.TTL != 8*time.Hour {
		t.Fatalf("loaded %+v %v", cfg, err)
	}
	if err := auth.RevokeToken(path, "ci"); err != nil {
		t.Fatal(err)
	}
	if err := auth.RevokeToken(path, "ci"); !errors.Is(err, auth.ErrNoToken) {
		t.Fatalf("revoke twice: %v", err)
	}
	if cfg, _ := auth.Load(path); len(cfg.Tokens) != 0 {
		t.Fatalf("after revoke: %+v", cfg.Tokens)
	}
	// A new file is made with mode 0600.
	fresh := filepath.Join(t.TempDir(), "new.yaml")
	if _, err := auth.CreateToken(fresh, "a", "alice", "", false, time.Now()); err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Stat(fresh); fi.Mode().Perm() != 0o600 {
		t.Fatalf("new file mode %v", fi.Mode().Perm())
	}
}
