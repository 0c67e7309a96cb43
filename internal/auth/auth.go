package auth

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
	"golang.org/x/time/rate"

	"github.com/assent-dev/assent/pkg/events"
)

// Identity is who an HTTP request comes from.
type Identity struct {
	// Principal is who answers are made as; "" if the credential names none.
	Principal string
	// Agent is the agent the credential may ask and cancel for; "" for none.
	Agent string
	// Admin may read, follow and cancel every request and revoke every
	// remembered choice: an admin token, or a principal the auth file's
	// admins list names.
	Admin bool
	// Method is how the caller was identified: "token", "oidc" or "proxy".
	Method string
	// Name is the token's name, the OIDC subject, or the proxy header's value.
	Name string
	// Session is the browser session id, when the request came with a
	// session cookie.
	Session string

	csrf string
}

type identityKey struct{}

// FromContext returns the identity the middleware attached; ok is false for
// a request that carried no credential.
func FromContext(ctx context.Context) (Identity, bool) {
	id, ok := ctx.Value(identityKey{}).(Identity)
	return id, ok
}

// WithIdentity returns ctx carrying id.
func WithIdentity(ctx context.Context, id Identity) context.Context {
	return context.WithValue(ctx, identityKey{}, id)
}

// CSRFToken returns the CSRF token of the request's browser session ("" without
// one): state-changing requests of the session send it as X-CSRF-Token.
func CSRFToken(ctx context.Context) string {
	id, _ := FromContext(ctx)
	return id.csrf
}

// PrincipalResolver is what auth needs of a policy: *policy.Policy has it.
type PrincipalResolver interface {
	PrincipalFor(channel, id string) (string, bool)
}

// Options are what an Authenticator needs besides its file.
type Options struct {
	// JS holds the session bucket; required when the file enables sessions
	// (OIDC or a proxy).
	JS jetstream.JetStream
	// Principals returns the policy in force (it may change on reload).
	Principals func() PrincipalResolver
	Logger     *zap.Logger
	Now        func() time.Time
	// Replicas is the session bucket's replication (default 1).
	Replicas int
	// HTTPClient talks to the OpenID provider; nil: http.DefaultClient.
	HTTPClient *http.Client
}

// Stats counts what the authenticator refused.
type Stats struct {
	// Failures counts failed authentications by reason.
	Failures map[string]int64
	// RateLimited counts requests refused without a look at their credential.
	RateLimited int64
	// Sessions counts browser sessions created.
	Sessions int64
}

// Authenticator resolves and checks the credentials of HTTP requests.
type Authenticator struct {
	path string
	opts Options
	log  *zap.Logger

	cfg      atomic.Pointer[Config]
	tokens   atomic.Pointer[map[string]Token] // by hash
	modTime  time.Time
	sessions *sessions
	limit    *limiter
	oidc     *oidcClient

	mu          sync.Mutex
	failures    map[string]int64
	rateLimited atomic.Int64
	created     atomic.Int64
}

// New returns an authenticator for cfg, read from path (which Run watches).
func New(ctx context.Context, cfg *Config, path string, opts Options) (*Authenticator, error) {
	if opts.Logger == nil {
		opts.Logger = zap.NewNop()
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Principals == nil {
		return nil, errors.New("auth: Options.Principals is required")
	}
	if opts.HTTPClient == nil {
		opts.HTTPClient = http.DefaultClient
	}
	a := &Authenticator{path: path, opts: opts, log: opts.Logger.Named("auth"), limit: newLimiter(), failures: map[string]int64{}}
	a.apply(cfg)
	if fi, err := os.Stat(path); err == nil {
		a.modTime = fi.ModTime()
	}
	if cfg.OIDC != nil || cfg.Proxy != nil {
		if opts.JS == nil {
			return nil, errors.New("auth: browser sessions (oidc or proxy) need a JetStream connection")
		}
		s, err := newSessions(ctx, opts.JS, cfg.Sessions.TTL, opts.Replicas, a.log)
		if err != nil {
			return nil, err
		}
		a.sessions = s
	}
	if cfg.OIDC != nil {
		if cfg.OIDC.secret() == "" {
			return nil, fmt.Errorf("auth: oidc: no client secret: set client_secret, client_secret_env, or %s", SecretEnv)
		}
		a.oidc = newOIDCClient(cfg.OIDC, opts.HTTPClient)
	}
	return a, nil
}

func (a *Authenticator) apply(cfg *Config) {
	byHash := make(map[string]Token, len(cfg.Tokens))
	for _, t := range cfg.Tokens {
		byHash[t.Hash] = t
	}
	a.cfg.Store(cfg)
	a.tokens.Store(&byHash)
}

// Run keeps the token set and the session cache current until ctx ends: the
// auth file is read again when it changes.
func (a *Authenticator) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	if a.sessions != nil {
		wg.Go(func() { a.sessions.watch(ctx) })
	}
	t := time.NewTicker(2 * time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			wg.Wait()
			return nil
		case <-t.C:
			fi, err := os.Stat(a.path)
			if err != nil || fi.ModTime().Equal(a.modTime) {
				continue
			}
			a.modTime = fi.ModTime()
			if err := a.Reload(); err != nil {
				a.log.Error("auth file reload refused; keeping the one in force", zap.String("file", a.path), zap.Error(err))
			}
		}
	}
}

// Reload reads the auth file again now. Its tokens replace the ones in force;
// a file with problems is refused and the old one kept. Sessions and sign-in
// settings take effect at the next start.
func (a *Authenticator) Reload() error {
	cfg, err := Load(a.path)
	if err != nil {
		return err
	}
	a.apply(cfg)
	a.log.Info("auth file reloaded", zap.String("file", a.path), zap.Int("tokens", len(cfg.Tokens)))
	return nil
}

// Stats returns the authenticator's counters.
func (a *Authenticator) Stats() Stats {
	a.mu.Lock()
	defer a.mu.Unlock()
	f := make(map[string]int64, len(a.failures))
	for k, v := range a.failures {
		f[k] = v
	}
	return Stats{Failures: f, RateLimited: a.rateLimited.Load(), Sessions: a.created.Load()}
}

// fail counts a failed authentication from client.
func (a *Authenticator) fail(client, reason string) {
	a.mu.Lock()
	a.failures[reason]++
	a.mu.Unlock()
	a.limit.fail(client, a.opts.Now())
	a.log.Info("authentication failed", zap.String("reason", reason), zap.String("client", client))
}

// Middleware resolves the caller of each request (a bearer token, a session
// cookie, or a trusted proxy's header, in that order) and attaches its
// Identity to the request's context. A credential that is present but wrong
// is refused: 401 for the API under /v1/; for pages, a bad session cookie is
// cleared and the request goes on without identity. A request without a
// credential goes on without identity: the handlers decide. Session requests
// that change state need the session's CSRF token. An address with too many
// failures gets 429 for any credential until the limit refills.
func (a *Authenticator) Middleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		cfg := a.cfg.Load()
		client, viaProxy := a.client(r)
		api := strings.HasPrefix(r.URL.Path, "/v1/")
		authz := r.Header.Get("Authorization")
		cookie, _ := r.Cookie(cfg.Sessions.Cookie)
		proxied := cfg.Proxy != nil && r.Header.Get(cfg.Proxy.Header) != ""
		if (authz != "" || cookie != nil || proxied) && a.limit.blocked(client, a.opts.Now()) {
			a.rateLimited.Add(1)
			w.Header().Set("Retry-After", "6")
			writeError(w, http.StatusTooManyRequests, "rate_limited", "too many failed sign-ins from your address; try again in a few seconds")
			return
		}
		if proxied && !viaProxy {
			// Anyone can set a header; only the proxy is believed.
			a.fail(client, "proxy_untrusted")
			proxied = false
		}
		var id Identity
		switch {
		case authz != "":
			tok, ok := strings.CutPrefix(authz, "Bearer ")
			t, found := (*a.tokens.Load())[HashToken(strings.TrimSpace(tok))]
			if !ok || !found {
				a.fail(client, "unknown_token")
				unauthenticated(w, "the API token is not known (revoked, mistyped, or from another broker)")
				return
			}
			id = Identity{Principal: t.Principal, Agent: t.Agent, Admin: t.Admin, Method: "token", Name: t.Name}
		case proxied:
			value := r.Header.Get(cfg.Proxy.Header)
			principal, ok := a.resolve(cfg.Proxy.Channel, value)
			if !ok {
				a.fail(client, "unmapped_identity")
				unauthenticated(w, fmt.Sprintf("%s %q is not a principal of the policy", cfg.Proxy.Channel, value))
				return
			}
			id = Identity{Principal: principal, Method: "proxy", Name: value}
			// A browser behind the proxy gets a session, for its CSRF token.
			if s, reason := a.session(r, cookie); reason == "" && s.Principal == principal {
				id.Session, id.csrf = cookie.Value, s.CSRF
			} else if !changes(r.Method) && !api {
				sid, s, err := a.newSession(r.Context(), principal, "proxy", value)
				if err != nil {
					a.log.Error("create session", zap.Error(err))
				} else {
					a.setCookie(w, r, cfg.Sessions.Cookie, sid, cfg.Sessions.TTL)
					id.Session, id.csrf = sid, s.CSRF
				}
			}
			if changes(r.Method) {
				if reason := checkCSRF(r, id.csrf); id.csrf == "" || reason != "" {
					a.fail(client, "csrf")
					writeError(w, http.StatusForbidden, "csrf", "load a page of the broker first, then send its CSRF token as X-CSRF-Token")
					return
				}
			}
		case cookie != nil && a.sessions != nil:
			s, reason := a.session(r, cookie)
			if reason != "" {
				a.fail(client, reason)
				a.clearCookie(w, r)
				if api {
					unauthenticated(w, "your session has ended; sign in again")
					return
				}
				break
			}
			id = Identity{Principal: s.Principal, Method: s.Method, Name: s.Name, Session: cookie.Value, csrf: s.CSRF}
			if changes(r.Method) {
				if reason := checkCSRF(r, s.CSRF); reason != "" {
					a.fail(client, "csrf")
					writeError(w, http.StatusForbidden, "csrf", reason)
					return
				}
			}
		}
		if id.Method != "" {
			id.Admin = id.Admin || id.Principal != "" && slices.Contains(cfg.Admins, id.Principal)
			r = r.WithContext(WithIdentity(r.Context(), id))
		}
		next.ServeHTTP(w, r)
	})
}

// session returns the session of cookie, or why there is none.
func (a *Authenticator) session(r *http.Request, cookie *http.Cookie) (session, string) {
	if cookie == nil || a.sessions == nil {
		return session{}, "bad_session"
	}
	return a.sessions.get(r.Context(), cookie.Value, a.opts.Now())
}

// newSession creates a session for principal.
func (a *Authenticator) newSession(ctx context.Context, principal, method, name string) (string, session, error) {
	now := a.opts.Now()
	s := session{Principal: principal, Method: method, Name: name, CSRF: randomString(), Created: now, Expires: now.Add(a.cfg.Load().Sessions.TTL)}
	id, err := a.sessions.create(ctx, s)
	if err == nil {
		a.created.Add(1)
	}
	return id, s, err
}

// resolve maps an identity on channel to a principal of the policy in force.
func (a *Authenticator) resolve(channel, value string) (string, bool) {
	if channel == "principal" {
		return value, events.ValidToken(value)
	}
	if p := a.opts.Principals(); p != nil {
		return p.PrincipalFor(channel, value)
	}
	return "", false
}

// client returns the caller's address, and whether the request came through
// the trusted proxy (then the address is the client the proxy names last in
// X-Forwarded-For).
func (a *Authenticator) client(r *http.Request) (string, bool) {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	cfg := a.cfg.Load()
	if cfg.Proxy == nil {
		return host, false
	}
	addr, err := netip.ParseAddr(host)
	if err != nil {
		return host, false
	}
	for _, pfx := range cfg.Proxy.Trusted {
		if pfx.Contains(addr.Unmap()) {
			if fwd := r.Header.Get("X-Forwarded-For"); fwd != "" {
				parts := strings.Split(fwd, ",")
				return strings.TrimSpace(parts[len(parts)-1]), true
			}
			return host, true
		}
	}
	return host, false
}

// secure reports whether cookies for r get the Secure attribute.
func (a *Authenticator) secure(r *http.Request) bool {
	switch a.cfg.Load().Sessions.Secure {
	case "always":
		return true
	case "never":
		return false
	}
	if r.TLS != nil {
		return true
	}
	_, viaProxy := a.client(r)
	return viaProxy && r.Header.Get("X-Forwarded-Proto") == "https"
}

func (a *Authenticator) setCookie(w http.ResponseWriter, r *http.Request, name, value string, maxAge time.Duration) {
	http.SetCookie(w, &http.Cookie{Name: name, Value: value, Path: "/", MaxAge: int(maxAge.Seconds()),
		HttpOnly: true, Secure: a.secure(r), SameSite: http.SameSiteLaxMode})
}

func (a *Authenticator) clearCookie(w http.ResponseWriter, r *http.Request) {
	http.SetCookie(w, &http.Cookie{Name: a.cfg.Load().Sessions.Cookie, Value: "", Path: "/", MaxAge: -1,
		HttpOnly: true, Secure: a.secure(r), SameSite: http.SameSiteLaxMode})
}

// changes reports whether method changes state.
func changes(method string) bool {
	switch method {
	case http.MethodGet, http.MethodHead, http.MethodOptions:
		return false
	}
	return true
}

// checkCSRF returns why a state-changing session request is refused, or "".
func checkCSRF(r *http.Request, want string) string {
	if origin := r.Header.Get("Origin"); origin != "" {
		u, err := url.Parse(origin)
		if err != nil || u.Host != r.Host {
			return "the request comes from another site (" + origin + ")"
		}
	}
	got := r.Header.Get("X-CSRF-Token")
	if got == "" && strings.HasPrefix(r.Header.Get("Content-Type"), "application/x-www-form-urlencoded") {
		got = r.PostFormValue("csrf_token")
	}
	if got == "" {
		return "missing CSRF token: send the session's token as the X-CSRF-Token header"
	}
	if subtle.ConstantTimeCompare([]byte(got), []byte(want)) != 1 {
		return "wrong CSRF token: reload the page"
	}
	return ""
}

// NewToken returns a new API token and its hash.
func NewToken() (token, hash string) {
	token = "assent_" + randomString()
	return token, HashToken(token)
}

// HashToken returns the hash an auth file keeps of token.
func HashToken(token string) string {
	sum := sha256.Sum256([]byte(token))
	return "sha256:" + hex.EncodeToString(sum[:])
}

// randomString returns 32 random bytes in base64url.
func randomString() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b) // never fails (crypto/rand panics instead)
	return base64.RawURLEncoding.EncodeToString(b)
}

func unauthenticated(w http.ResponseWriter, msg string) {
	w.Header().Set("WWW-Authenticate", `Bearer realm="assent"`)
	writeError(w, http.StatusUnauthorized, "unauthenticated", msg)
}

func writeError(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]map[string]string{"error": {"code": code, "message": msg}})
}

// limiter bounds failed authentications per client address: a burst of
// failBurst, refilling one per failRefill.
type limiter struct {
	mu      sync.Mutex
	clients map[string]*rate.Limiter
	seen    map[string]time.Time
}

const (
	failBurst     = 10
	failRefill    = 6 * time.Second
	limiterSize   = 10000
	limiterForget = 15 * time.Minute
)

func newLimiter() *limiter {
	return &limiter{clients: map[string]*rate.Limiter{}, seen: map[string]time.Time{}}
}

func (l *limiter) get(client string, now time.Time) *rate.Limiter {
	lim, ok := l.clients[client]
	if !ok {
		if len(l.clients) >= limiterSize {
			for c, t := range l.seen {
				if now.Sub(t) > limiterForget || len(l.clients) >= limiterSize {
					delete(l.clients, c)
					delete(l.seen, c)
				}
				if len(l.clients) < limiterSize/2 {
					break
				}
			}
		}
		lim = rate.NewLimiter(rate.Every(failRefill), failBurst)
		l.clients[client] = lim
	}
	l.seen[client] = now
	return lim
}

// fail takes one from client's allowance.
func (l *limiter) fail(client string, now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.get(client, now).AllowN(now, 1)
}

// blocked reports whether client has no failures left.
func (l *limiter) blocked(client string, now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	lim, ok := l.clients[client]
	return ok && lim.TokensAt(now) < 1
}
