package auth

import (
	"context"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/coreos/go-oidc/v3/oidc"
	"go.uber.org/zap"
	"golang.org/x/oauth2"

	"github.com/assent-dev/assent/internal/webui/pagehead"
)

// loginCookie binds a sign-in under way to the browser that started it.
const loginCookie = "assent_login"

// loginTTL bounds how long a sign-in may take at the provider.
const loginTTL = 10 * time.Minute

// oidcClient talks to the OpenID provider; it discovers the provider on first
// use, and again after a failure.
type oidcClient struct {
	cfg  *OIDC
	http *http.Client

	mu       sync.Mutex
	provider *oidc.Provider
	oauth    *oauth2.Config
	verifier *oidc.IDTokenVerifier
}

func newOIDCClient(cfg *OIDC, hc *http.Client) *oidcClient {
	return &oidcClient{cfg: cfg, http: hc}
}

func (c *oidcClient) ctx(ctx context.Context) context.Context {
	return oidc.ClientContext(ctx, c.http)
}

// ready discovers the provider if that has not been done.
func (c *oidcClient) ready(ctx context.Context) (*oauth2.Config, *oidc.IDTokenVerifier, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.oauth != nil {
		return c.oauth, c.verifier, nil
	}
	p, err := oidc.NewProvider(c.ctx(ctx), c.cfg.Issuer)
	if err != nil {
		return nil, nil, fmt.Errorf("discover the OpenID provider %s: %w", c.cfg.Issuer, err)
	}
	c.provider = p
	c.oauth = &oauth2.Config{ClientID: c.cfg.ClientID, ClientSecret: c.cfg.secret(), RedirectURL: c.cfg.RedirectURL,
		Endpoint: p.Endpoint(), Scopes: c.cfg.Scopes}
	c.verifier = p.Verifier(&oidc.Config{ClientID: c.cfg.ClientID})
	return c.oauth, c.verifier, nil
}

// Routes serves sign-in and sign-out on mux: GET /login (a page), GET
// /auth/login (off to the OpenID provider), GET /auth/callback (back from
// it), POST /auth/logout. They must run behind Middleware.
func (a *Authenticator) Routes(mux interface {
	Handle(pattern string, h http.Handler)
}) {
	mux.Handle("GET /login", http.HandlerFunc(a.loginPage))
	mux.Handle("GET /auth/login", http.HandlerFunc(a.login))
	mux.Handle("GET /auth/callback", http.HandlerFunc(a.callback))
	mux.Handle("POST /auth/logout", http.HandlerFunc(a.logout))
}

// localPath returns next if it is a path on this site, else "/". A browser
// drops tabs and newlines from a URL ("/\t/evil.example" is
// "//evil.example" to it), so next may hold no control character.
func localPath(next string) string {
	if strings.ContainsFunc(next, func(r rune) bool { return r < ' ' || r == 0x7f }) ||
		!strings.HasPrefix(next, "/") || strings.HasPrefix(next, "//") || strings.HasPrefix(next, "/\\") {
		return "/"
	}
	return next
}

func (a *Authenticator) login(w http.ResponseWriter, r *http.Request) {
	if a.oidc == nil {
		a.page(w, http.StatusNotFound, "Sign-in is not configured", "This broker has no OpenID provider configured (oidc in its auth file). Ask its operator how to sign in.", "")
		return
	}
	oauth, _, err := a.oidc.ready(r.Context())
	if err != nil {
		a.log.Error("sign-in unavailable", zap.Error(err))
		a.page(w, http.StatusBadGateway, "Sign-in is unavailable", "The identity provider could not be reached. Try again in a moment; if it persists, tell the broker's operator.", "")
		return
	}
	now := a.opts.Now()
	state, nonce, verifier := randomString(), randomString(), oauth2.GenerateVerifier()
	if err := a.sessions.put(r.Context(), state, session{Nonce: nonce, Verifier: verifier, Next: localPath(r.URL.Query().Get("next")), Created: now, Expires: now.Add(loginTTL)}); err != nil {
		a.log.Error("store sign-in state", zap.Error(err))
		a.page(w, http.StatusServiceUnavailable, "Sign-in is unavailable", "The broker could not store the sign-in. Try again in a moment.", "")
		return
	}
	a.setCookie(w, r, loginCookie, state, loginTTL)
	http.Redirect(w, r, oauth.AuthCodeURL(state, oidc.Nonce(nonce), oauth2.S256ChallengeOption(verifier)), http.StatusFound)
}

func (a *Authenticator) callback(w http.ResponseWriter, r *http.Request) {
	client, _ := a.client(r)
	q := r.URL.Query()
	retry := "Start again from the sign-in page."
	if e := q.Get("error"); e != "" {
		a.fail(client, "oidc_refused")
		a.page(w, http.StatusForbidden, "Sign-in was refused", fmt.Sprintf("The identity provider said: %s %s", e, q.Get("error_description")), retry)
		return
	}
	state := q.Get("state")
	c, err := r.Cookie(loginCookie)
	if a.oidc == nil || state == "" || err != nil || c.Value != state {
		a.fail(client, "oidc_state")
		a.page(w, http.StatusBadRequest, "This sign-in link is not yours", "The sign-in did not start in this browser, or it took too long.", retry)
		return
	}
	http.SetCookie(w, &http.Cookie{Name: loginCookie, Value: "", Path: "/", MaxAge: -1, HttpOnly: true, Secure: a.secure(r), SameSite: http.SameSiteLaxMode})
	st, err := a.sessions.take(r.Context(), state)
	if err != nil || !a.opts.Now().Before(st.Expires) || st.Verifier == "" {
		a.fail(client, "oidc_state")
		a.page(w, http.StatusBadRequest, "This sign-in has expired", "A sign-in must finish within ten minutes, once.", retry)
		return
	}
	oauth, verifier, err := a.oidc.ready(r.Context())
	if err != nil {
		a.page(w, http.StatusBadGateway, "Sign-in is unavailable", "The identity provider could not be reached.", retry)
		return
	}
	tok, err := oauth.Exchange(a.oidc.ctx(r.Context()), q.Get("code"), oauth2.VerifierOption(st.Verifier))
	if err != nil {
		a.fail(client, "oidc_exchange")
		a.log.Warn("OIDC code exchange failed", zap.Error(err))
		a.page(w, http.StatusBadGateway, "Sign-in failed", "The identity provider did not accept the sign-in code.", retry)
		return
	}
	raw, _ := tok.Extra("id_token").(string)
	idt, err := verifier.Verify(a.oidc.ctx(r.Context()), raw)
	if err != nil || idt.Nonce != st.Nonce {
		a.fail(client, "oidc_token")
		a.log.Warn("OIDC ID token refused", zap.Error(err))
		a.page(w, http.StatusForbidden, "Sign-in failed", "The identity token did not check out.", retry)
		return
	}
	var claims struct {
		Email         string `json:"email"`
		EmailVerified bool   `json:"email_verified"`
	}
	_ = idt.Claims(&claims)
	if claims.Email == "" {
		// Some providers give the email only from the userinfo endpoint.
		if info, err := a.oidc.provider.UserInfo(a.oidc.ctx(r.Context()), oauth2.StaticTokenSource(tok)); err == nil && info.Subject == idt.Subject {
			claims.Email, claims.EmailVerified = info.Email, info.EmailVerified
		}
	}
	principal, ok := a.resolve("oidc", idt.Subject)
	if !ok && claims.Email != "" && claims.EmailVerified {
		principal, ok = a.resolve("email", claims.Email)
	}
	if !ok {
		a.fail(client, "unmapped_identity")
		who := "subject " + idt.Subject
		if claims.Email != "" {
			who += fmt.Sprintf(" (email %s, %s)", claims.Email, map[bool]string{true: "verified", false: "not verified"}[claims.EmailVerified])
		}
		a.page(w, http.StatusForbidden, "You are not an approver here",
			"You signed in as "+who+", but no principal of this broker's policy has that identity.",
			"An operator can map you in the policy's principals: email: ADDRESS (verified addresses only), or identities: {oidc: SUBJECT}.")
		return
	}
	a.startSession(w, r, principal, "oidc", idt.Subject, st.Next)
}

// startSession creates a session for principal and sends the browser to next.
func (a *Authenticator) startSession(w http.ResponseWriter, r *http.Request, principal, method, name, next string) {
	id, _, err := a.newSession(r.Context(), principal, method, name)
	if err != nil {
		a.log.Error("create session", zap.Error(err))
		a.page(w, http.StatusServiceUnavailable, "Sign-in is unavailable", "The broker could not store the session. Try again in a moment.", "")
		return
	}
	a.log.Info("signed in", zap.String("principal", principal), zap.String("method", method))
	cfg := a.cfg.Load()
	a.setCookie(w, r, cfg.Sessions.Cookie, id, cfg.Sessions.TTL)
	http.Redirect(w, r, localPath(next), http.StatusSeeOther)
}

func (a *Authenticator) logout(w http.ResponseWriter, r *http.Request) {
	if id, ok := FromContext(r.Context()); ok && id.Session != "" && a.sessions != nil {
		if err := a.sessions.end(r.Context(), id.Session); err != nil {
			a.log.Warn("end session", zap.Error(err))
		}
	}
	a.clearCookie(w, r)
	if strings.Contains(r.Header.Get("Accept"), "application/json") {
		w.WriteHeader(http.StatusNoContent)
		return
	}
	http.Redirect(w, r, "/login", http.StatusSeeOther)
}

func (a *Authenticator) loginPage(w http.ResponseWriter, r *http.Request) {
	cfg := a.cfg.Load()
	data := loginData{Next: localPath(r.URL.Query().Get("next")), Tokens: len(cfg.Tokens) > 0, Icon: pagehead.Icon}
	if cfg.OIDC != nil {
		if u, err := url.Parse(cfg.OIDC.Issuer); err == nil {
			data.Provider = u.Host
		}
	}
	if id, ok := FromContext(r.Context()); ok {
		data.SignedIn = id.Principal
	}
	data.Proxy = cfg.Proxy != nil
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	pagehead.Set(w.Header(), loginStyle)
	_ = loginTemplate.Execute(w, data)
}

type loginData struct {
	Next, Provider, SignedIn string
	Tokens, Proxy            bool
	Title, Message, Hint     string
	Icon                     string
}

// page writes a short page that says what went wrong and what to do.
func (a *Authenticator) page(w http.ResponseWriter, status int, title, msg, hint string) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	pagehead.Set(w.Header(), loginStyle)
	w.WriteHeader(status)
	_ = loginTemplate.Execute(w, loginData{Title: title, Message: msg, Hint: hint, Next: "/", Icon: pagehead.Icon})
}

// loginStyle is the sign-in page's style sheet, allowed by its hash
// (pagehead.Set).
const loginStyle = `
:root { color-scheme: light dark; --bg: #f6f7f9; --card: #fff; --fg: #1d2330; --muted: #5b6475; --accent: #2f5bd3; --line: #dde1e8; }
@media (prefers-color-scheme: dark) { :root { --bg: #12151b; --card: #1b2029; --fg: #e7eaf0; --muted: #9aa3b5; --accent: #7ea2ff; --line: #2c3340; } }
* { box-sizing: border-box; }
body { margin: 0; min-height: 100vh; display: grid; place-items: center; background: var(--bg); color: var(--fg);
  font: 16px/1.5 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; }
main { width: min(26rem, 100% - 2rem); background: var(--card); border: 1px solid var(--line); border-radius: 12px; padding: 2rem; }
h1 { font-size: 1.35rem; margin: 0 0 .5rem; }
p { color: var(--muted); margin: .5rem 0; }
.brand { font-weight: 700; letter-spacing: .02em; color: var(--accent); margin-bottom: 1.25rem; }
a.button { display: block; text-align: center; margin-top: 1.25rem; padding: .75rem 1rem; border-radius: 8px; background: var(--accent);
  color: #fff; text-decoration: none; font-weight: 600; min-height: 44px; }
a.button:focus-visible, a:focus-visible { outline: 3px solid var(--accent); outline-offset: 3px; }
code { font-size: .9em; }
`

var loginTemplate = template.Must(template.New("login").Parse(`<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="icon" href="{{.Icon}}" type="image/svg+xml">
<title>{{if .Title}}{{.Title}}{{else}}Sign in{{end}} · Assent</title>
<style>` + loginStyle + `</style>
</head>
<body>
<main>
<div class="brand">Assent</div>
{{if .Title}}
<h1>{{.Title}}</h1>
<p>{{.Message}}</p>
{{if .Hint}}<p>{{.Hint}}</p>{{end}}
<a class="button" href="/login">Back to sign-in</a>
{{else if .SignedIn}}
<h1>Signed in</h1>
<p>You are signed in as <strong>{{.SignedIn}}</strong>.</p>
<a class="button" href="{{.Next}}">Continue</a>
{{else}}
<h1>Sign in to approve</h1>
{{if .Provider}}
<p>Approvals are made as you, so sign in first.</p>
<a class="button" href="/auth/login?next={{.Next}}">Sign in with {{.Provider}}</a>
{{else if .Proxy}}
<p>Sign-in is done by the proxy in front of this broker. Open it through that address.</p>
{{else}}
<p>This broker has no sign-in for people configured. Ask its operator.</p>
{{end}}
{{if .Tokens}}<p>Programs use API tokens instead: <code>Authorization: Bearer &lt;token&gt;</code>.</p>{{end}}
{{end}}
</main>
</body>
</html>
`))
