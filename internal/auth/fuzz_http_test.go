package auth

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"html"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/zitadel/oidc/v3/example/server/exampleop"
	"github.com/zitadel/oidc/v3/example/server/storage"
	"go.uber.org/zap"

	"github.com/assent-dev/assent/internal/testenv"
	"github.com/assent-dev/assent/pkg/policy"
)

// fuzzHost is the host the fuzzed requests are sent to.
const fuzzHost = "assent.test"

// authFuzz is what FuzzAuth runs against: an authenticator with API tokens,
// a trusted proxy and sign-in through a real OpenID provider (zitadel's
// example server on loopback), sessions in a bucket on an embedded NATS
// server, in front of a handler that reports who it was given. One for
// every input.
type authFuzz struct {
	a      *Authenticator
	h      http.Handler
	pol    *policy.Policy
	issuer string
	// tokens are the API tokens of the auth file, with who they name.
	tokens map[string]Identity
	// sessions are the session cookies the authenticator handed out, with
	// their principal and CSRF token.
	sessions map[string]session

	mu  sync.Mutex
	now time.Time // the authenticator's clock
	// got is what the inner handler was given by the last request.
	got struct {
		reached bool
		id      Identity
		ok      bool
		csrf    string
	}
}

func (e *authFuzz) clock() time.Time {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.now
}

func newAuthFuzz(f *testing.F) *authFuzz {
	ns := testenv.Server(f)
	nc := testenv.InProcessConn(f, ns)
	js, err := jetstream.New(nc)
	if err != nil {
		f.Fatal(err)
	}
	// The OpenID provider, with a web client "assent".
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		f.Fatal(err)
	}
	issuer := "http://" + ln.Addr().String()
	clients := map[string]*storage.Client{"assent": storage.WebClient("assent", "s3cret", "http://"+fuzzHost+"/auth/callback")}
	op := httptest.NewUnstartedServer(exampleop.SetupServer(issuer, storage.NewStorageWithClients(storage.NewUserStore(issuer), clients),
		slog.New(slog.NewTextHandler(io.Discard, nil)), false))
	op.Listener.Close()
	op.Listener = ln
	op.Start()
	f.Cleanup(op.Close)

	path := filepath.Join(f.TempDir(), "auth.yaml")
	file := "oidc:\n  issuer: " + issuer + "\n  client_id: assent\n  client_secret: s3cret\n  redirect_url: http://" + fuzzHost + "/auth/callback\n" +
		"proxy:\n  header: X-Forwarded-Email\n  trusted: [10.0.0.0/8]\nsessions:\n  ttl: 1h\n"
	if err := os.WriteFile(path, []byte(file), 0o600); err != nil {
		f.Fatal(err)
	}
	e := &authFuzz{issuer: issuer, tokens: map[string]Identity{}, sessions: map[string]session{}, now: time.Now()}
	for _, t := range []struct{ name, principal, agent string }{{"alice-laptop", "alice", ""}, {"coder", "", "coder"}} {
		tok, err := CreateToken(path, t.name, t.principal, t.agent, false, e.now)
		if err != nil {
			f.Fatal(err)
		}
		e.tokens[tok] = Identity{Principal: t.principal, Agent: t.agent, Method: "token", Name: t.name}
	}
	cfg, err := Load(path)
	if err != nil {
		f.Fatal(err)
	}
	if e.pol, err = policy.Parse([]byte("version: 1\nprincipals:\n  alice: {email: alice@example.com}\n  bob: {identities: {oidc: bob-sub}}\n"), "policy.yaml"); err != nil {
		f.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	e.a, err = New(ctx, cfg, path, Options{JS: js, Principals: func() PrincipalResolver { return e.pol }, Logger: zap.NewNop(), Now: e.clock})
	if err != nil {
		cancel()
		f.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = e.a.Run(ctx); close(done) }()
	f.Cleanup(func() { cancel(); <-done })
	mux := http.NewServeMux()
	e.a.Routes(mux)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		e.got.reached = true
		e.got.id, e.got.ok = FromContext(r.Context())
		e.got.csrf = CSRFToken(r.Context())
		_, _ = io.WriteString(w, "ok")
	})
	e.h = e.a.Middleware(mux)
	return e
}

// serve serves r and records the sessions the response hands out.
func (e *authFuzz) serve(r *http.Request) *httptest.ResponseRecorder {
	e.got.reached, e.got.ok, e.got.id, e.got.csrf = false, false, Identity{}, ""
	w := httptest.NewRecorder()
	e.h.ServeHTTP(w, r)
	for _, c := range w.Result().Cookies() {
		if c.Name == DefaultCookie && c.Value != "" && e.got.reached && e.got.id.Session == c.Value {
			e.sessions[c.Value] = session{Principal: e.got.id.Principal, CSRF: e.got.csrf}
		}
	}
	return w
}

// placeholders returns what the placeholders of an input stand for: an API
// token ($TOKEN, $AGENT), a session cookie and its CSRF token ($SESSION,
// $CSRF: a sign-in through the proxy), and the state of a sign-in under way
// ($STATE: a visit to /auth/login).
func (e *authFuzz) placeholders(t *testing.T, in string) *strings.Replacer {
	var pairs []string
	for tok, id := range e.tokens {
		if id.Agent != "" {
			pairs = append(pairs, "$AGENT", tok)
		} else {
			pairs = append(pairs, "$TOKEN", tok)
		}
	}
	if strings.Contains(in, "$SESSION") || strings.Contains(in, "$CSRF") {
		r := httptest.NewRequest(http.MethodGet, "http://"+fuzzHost+"/", nil)
		r.RemoteAddr = "10.0.0.1:4000"
		r.Header.Set("X-Forwarded-Email", "alice@example.com")
		if w := e.serve(r); e.got.id.Session == "" {
			t.Fatalf("sign-in through the proxy: %d %s", w.Code, w.Body)
		}
		pairs = append(pairs, "$SESSION", e.got.id.Session, "$CSRF", e.got.csrf)
	}
	if strings.Contains(in, "$STATE") {
		w := e.serve(httptest.NewRequest(http.MethodGet, "http://"+fuzzHost+"/auth/login", nil))
		state := ""
		for _, c := range w.Result().Cookies() {
			if c.Name == loginCookie {
				state = c.Value
			}
		}
		if state == "" {
			t.Fatalf("sign-in start: %d %s", w.Code, w.Body)
		}
		pairs = append(pairs, "$STATE", state)
	}
	return strings.NewReplacer(pairs...)
}

// browserURL resolves a Location as a browser does (the WHATWG URL
// standard): tabs and newlines dropped, leading and trailing spaces and
// controls trimmed, and "\" read as "/", against base.
func browserURL(base *url.URL, loc string) (*url.URL, error) {
	loc = strings.Map(func(r rune) rune {
		switch r {
		case '\t', '\n', '\r':
			return -1
		case '\\':
			return '/'
		}
		return r
	}, loc)
	loc = strings.TrimFunc(loc, func(r rune) bool { return r <= ' ' })
	u, err := url.Parse(loc)
	if err != nil {
		return nil, err
	}
	return base.ResolveReference(u), nil
}

// hrefPattern finds the links of a page.
var hrefPattern = regexp.MustCompile(`(?i)\bhref="([^"]*)"`)

// authStatus are the statuses the authenticator and its pages answer, the
// inner handler's 200, and the mux's redirects to a clean path.
var authStatus = map[int]bool{200: true, 204: true, 301: true, 302: true, 303: true, 307: true, 308: true, 400: true, 401: true, 403: true, 429: true, 502: true, 503: true}

// FuzzAuth sends the authenticator's middleware and its sign-in routes any
// method, target and header lines (placeholders: see placeholders) from a
// trusted proxy address or not, with any body; the clock moves a second
// before each input unless hold. Whatever comes, it must not panic; answer
// only its statuses, never 500; write its errors as {"error": {"code",
// "message"}}; give the handler behind it an identity only for a token of
// the auth file, a session it handed out, or the trusted proxy's header of
// a principal, and a session's state-changing request only with the
// session's CSRF token and no foreign Origin; set cookies HttpOnly and
// SameSite=Lax; and redirect and link only within the site (sign-in start:
// to the provider), also after a sign-in that the input started.
func FuzzAuth(f *testing.F) {
	e := newAuthFuzz(f)
	for _, s := range []struct {
		method, target string
		remote         uint8
		header, body   string
	}{
		{"GET", "/v1/approvals", 1, "Authorization: Bearer $TOKEN", ""},
		{"POST", "/v1/approvals", 3, "Authorization: Bearer  $AGENT \nContent-Type: application/json", "{}"},
		{"GET", "/v1/approvals", 5, "Authorization: Bearer nope", ""},
		{"GET", "/v1/approvals", 7, "Authorization: Basic YWxpY2U6eA==", ""},
		{"GET", "/", 2, "X-Forwarded-Email: alice@example.com", ""},
		{"GET", "/", 3, "X-Forwarded-Email: alice@example.com", ""},
		{"GET", "/v1/approvals", 4, "X-Forwarded-Email: eve@example.com\nX-Forwarded-For: 192.0.2.9, 198.51.100.1", ""},
		{"POST", "/v1/decisions", 6, "X-Forwarded-Email: alice@example.com\nCookie: assent_session=$SESSION\nX-CSRF-Token: $CSRF", ""},
		{"GET", "/history", 9, "Cookie: assent_session=$SESSION", ""},
		{"POST", "/v1/decisions", 9, "Cookie: assent_session=$SESSION\nX-CSRF-Token: $CSRF\nOrigin: http://assent.test", ""},
		{"POST", "/v1/decisions", 9, "Cookie: assent_session=$SESSION\nX-CSRF-Token: $CSRF\nOrigin: https://evil.example", ""},
		{"POST", "/ui/answer", 11, "Cookie: assent_session=$SESSION\nContent-Type: application/x-www-form-urlencoded", "csrf_token=$CSRF&x=1"},
		{"DELETE", "/v1/remembered/x", 11, "Cookie: assent_session=$SESSION\nX-CSRF-Token: guess", ""},
		{"POST", "/auth/logout", 13, "Cookie: assent_session=$SESSION\nX-CSRF-Token: $CSRF\nAccept: application/json", ""},
		{"POST", "/auth/logout", 13, "Cookie: assent_session=$SESSION", ""},
		{"GET", "/", 15, "Cookie: assent_session=not-a-session; assent_session=$SESSION", ""},
		{"GET", "/login?next=/approvals/a1", 17, "", ""},
		{"GET", "/auth/../v1/./approvals", 17, "Authorization: Bearer $TOKEN", ""},
		{"GET", "/login?next=//evil.example", 17, "Cookie: assent_session=$SESSION", ""},
		{"GET", "/auth/login?next=/approvals/a1", 19, "", ""},
		{"GET", "/auth/login?next=/%09/evil.example", 19, "", ""},
		{"GET", "/auth/login?next=/%5Cevil.example", 19, "", ""},
		{"GET", "/auth/callback?state=$STATE&code=bogus", 21, "Cookie: assent_login=$STATE", ""},
		{"GET", "/auth/callback?state=$STATE&code=bogus", 21, "Cookie: assent_login=other", ""},
		{"GET", "/auth/callback?error=access_denied&error_description=%3Cb%3Eno%3C%2Fb%3E", 21, "", ""},
		{"GET", "/auth/callback?state=forged", 23, "Cookie: assent_login=forged", ""},
	} {
		f.Add(s.method, s.target, s.remote, false, s.header, []byte(s.body))
	}
	base, _ := url.Parse("http://" + fuzzHost + "/")
	f.Fuzz(func(t *testing.T, method, target string, remote uint8, hold bool, header string, body []byte) {
		if !hold {
			e.mu.Lock()
			e.now = e.now.Add(time.Second)
			e.mu.Unlock()
		}
		rep := e.placeholders(t, target+header+string(body))
		target, header, body = rep.Replace(target), rep.Replace(header), []byte(rep.Replace(string(body)))
		var raw bytes.Buffer
		fmt.Fprintf(&raw, "%s %s HTTP/1.1\r\nHost: %s\r\n", method, target, fuzzHost)
		for line := range strings.Lines(header) {
			line = strings.TrimRight(line, "\r\n")
			k, v, ok := strings.Cut(line, ":")
			if !ok || k == "" || strings.EqualFold(k, "Host") || strings.EqualFold(k, "Content-Length") || strings.EqualFold(k, "Transfer-Encoding") || !testenv.ValidHeaderName(k) || !testenv.ValidHeaderValue(v) {
				return // not a header line the server takes
			}
			fmt.Fprintf(&raw, "%s:%s\r\n", k, v)
		}
		fmt.Fprintf(&raw, "Content-Length: %d\r\n\r\n", len(body))
		raw.Write(body)
		if strings.ContainsAny(method+target, "\r\n") {
			return
		}
		r, err := http.ReadRequest(bufio.NewReader(&raw))
		if err != nil {
			return // not a request net/http would serve
		}
		trusted := remote%2 == 0
		if trusted {
			r.RemoteAddr = fmt.Sprintf("10.0.0.%d:4000", remote)
		} else {
			r.RemoteAddr = fmt.Sprintf("192.0.2.%d:4000", remote)
		}
		h := r.Header.Clone()
		w := e.serve(r)

		input := fmt.Sprintf("%s %q from %s (hold %v) headers %q body %q", method, target, r.RemoteAddr, hold, header, body)
		status, out := w.Code, w.Body.String()
		if !authStatus[status] {
			t.Fatalf("%s: %d %q", input, status, out)
		}
		if ct := w.Header().Get("Content-Type"); ct == "application/json" {
			var v struct {
				Error *struct{ Code, Message string } `json:"error"`
			}
			if err := testenv.StrictJSON([]byte(out), &v); err != nil || v.Error == nil || v.Error.Code == "" || v.Error.Message == "" {
				t.Fatalf("%s: %d with body %q, want {\"error\": {\"code\", \"message\"}} (%v)", input, status, out, err)
			}
		}
		for _, c := range w.Result().Cookies() {
			if !c.HttpOnly || c.SameSite != http.SameSiteLaxMode || c.Path != "/" {
				t.Fatalf("%s: cookie %s", input, c)
			}
		}
		if loc := w.Header().Get("Location"); loc != "" {
			u, err := browserURL(base, loc)
			if err != nil || u.Host != fuzzHost && (r.URL.Path != "/auth/login" || !strings.HasPrefix(u.String(), e.issuer+"/")) {
				t.Fatalf("%s: %d to %q, which a browser opens as %v (%v)", input, status, loc, u, err)
			}
		}
		if strings.HasPrefix(w.Header().Get("Content-Type"), "text/html") {
			for _, m := range hrefPattern.FindAllStringSubmatch(out, -1) {
				if u, err := browserURL(base, html.UnescapeString(m[1])); err != nil || u.Host != fuzzHost && !strings.HasPrefix(u.String(), e.issuer+"/") {
					t.Fatalf("%s: a page links to %q, which a browser opens as %v (%v)", input, m[1], u, err)
				}
			}
		}
		if e.got.reached {
			e.checkIdentity(t, input, r, h, body, trusted)
		}
		if r.URL.Path == "/auth/login" && status == http.StatusFound {
			e.checkSignedIn(t, input, w)
		}
	})
}

// checkIdentity fails t if the handler behind the authenticator was given
// an identity that the request's credentials do not prove, or a session's
// state-changing request without its CSRF token.
func (e *authFuzz) checkIdentity(t *testing.T, input string, r *http.Request, h http.Header, body []byte, trusted bool) {
	if !e.got.ok {
		return
	}
	id := e.got.id
	switch id.Method {
	case "token":
		tok, _ := strings.CutPrefix(h.Get("Authorization"), "Bearer ")
		if want, ok := e.tokens[strings.TrimSpace(tok)]; !ok || want.Principal != id.Principal || want.Agent != id.Agent {
			t.Fatalf("%s: given %+v for Authorization %q", input, id, h.Get("Authorization"))
		}
		return
	case "proxy":
		// The trusted proxy's header, or a session it started.
		p, ok := e.pol.PrincipalFor("email", h.Get("X-Forwarded-Email"))
		if s, known := e.sessions[id.Session]; !(trusted && ok && p == id.Principal) && !(known && s.Principal == id.Principal) {
			t.Fatalf("%s: given %+v from %s (trusted %v)", input, id, r.RemoteAddr, trusted)
		}
	default:
		if s, known := e.sessions[id.Session]; !known || s.Principal != id.Principal {
			t.Fatalf("%s: given %+v, not a session handed out", input, id)
		}
	}
	if !changes(r.Method) {
		return
	}
	s, known := e.sessions[id.Session]
	got := h.Get("X-CSRF-Token")
	if got == "" && strings.HasPrefix(h.Get("Content-Type"), "application/x-www-form-urlencoded") {
		form, _ := url.ParseQuery(string(body))
		got = form.Get("csrf_token")
	}
	origin, err := url.Parse(h.Get("Origin"))
	if !known || got != s.CSRF || h.Get("Origin") != "" && (err != nil || origin.Host != fuzzHost) {
		t.Fatalf("%s: a %s as %+v got through without its session's CSRF token (%q) from its own site", input, r.Method, id, s.CSRF)
	}
}

// checkSignedIn finishes the sign-in the input started as a successful
// callback would (the provider's part aside) and fails t if the browser is
// then sent off the site.
func (e *authFuzz) checkSignedIn(t *testing.T, input string, w *httptest.ResponseRecorder) {
	state := ""
	for _, c := range w.Result().Cookies() {
		if c.Name == loginCookie {
			state = c.Value
		}
	}
	st, err := e.a.sessions.take(context.Background(), state)
	if err != nil {
		t.Fatalf("%s: the sign-in state: %v", input, err)
	}
	done := httptest.NewRecorder()
	e.a.startSession(done, httptest.NewRequest(http.MethodGet, "http://"+fuzzHost+"/auth/callback", nil), "alice", "oidc", "alice-sub", st.Next)
	base, _ := url.Parse("http://" + fuzzHost + "/auth/callback")
	if u, err := browserURL(base, done.Header().Get("Location")); done.Code != http.StatusSeeOther || err != nil || u.Host != fuzzHost {
		t.Fatalf("%s: after the sign-in, %d to %q, which a browser opens as %v (%v)", input, done.Code, done.Header().Get("Location"), u, err)
	}
}
