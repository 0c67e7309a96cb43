// Package webui is the broker's web interface for people: the pending
// approvals, live, with everything needed to answer them (approve, deny with
// a reason, approve with edited arguments, a structured answer, remember the
// choice, answer a whole session at once), one request's timeline, the
// history of decisions and the remembered choices in force.
//
// Pages are rendered on the server with html/template; a small script
// (static/app.js) answers through the HTTP API (/v1/...), follows the event
// stream (/v1/events) to show new requests and decisions as they happen, and
// adds keyboard shortcuts. Who the user is comes from Config.Identify (the
// auth package's sessions); without authentication the page asks for a name.
//
// Everything an agent sent (tool, arguments, reasons, labels) is shown with
// its control and invisible characters made visible (internal/textsafe), on
// top of HTML escaping, so a bidirectional override cannot make one call look
// like another. Arguments are laid out by internal/argview: every key in
// sight with the start of its value, the rest behind a "N more characters"
// control, so that the order and length an agent chose cannot push an
// argument out of the approver's sight.
package webui

import (
	"bytes"
	"context"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"go.uber.org/zap"

	"github.com/assent-dev/assent/internal/access"
	"github.com/assent-dev/assent/internal/broker"
	"github.com/assent-dev/assent/internal/human"
	"github.com/assent-dev/assent/internal/insights"
	"github.com/assent-dev/assent/internal/textsafe"
	"github.com/assent-dev/assent/internal/webui/pagehead"
	"github.com/assent-dev/assent/pkg/events"
	"github.com/assent-dev/assent/pkg/policy"
)

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

// Broker is what the pages read from the broker.
type Broker interface {
	List(ctx context.Context, f broker.Filter) (broker.Page, error)
	Get(ctx context.Context, id string) (broker.Record, error)
	Audit(ctx context.Context, q broker.AuditQuery) (broker.AuditPage, error)
	Remembered() []policy.Grant
	RuleOf(r broker.Record) broker.RuleInfo
	Eligible(r broker.Record, principal string) error
	// Policy is the policy in force.
	Policy() *policy.Policy
	// Insights is what the record says about the requests f selects.
	Insights(ctx context.Context, f insights.Filter) (insights.Report, error)
}

// Identity is who is looking at a page.
type Identity struct {
	// Principal is who answers are made as; "" if the credential names none
	// (an agent's token).
	Principal string
	// Agent is the agent a token asks for; "" for none.
	Agent string
	// Admin sees every request and every remembered choice (docs/web.md,
	// "Who sees what").
	Admin bool
	// Method is how they signed in: "oidc", "proxy", "token".
	Method string
}

// Config configures the pages.
type Config struct {
	// Identify returns who made the request, or false for nobody. Nil means
	// authentication is off: every page is open and the user says who they
	// are in the page.
	Identify func(*http.Request) (Identity, bool)
	// CSRFToken returns the token the page's script sends as X-CSRF-Token.
	CSRFToken func(*http.Request) string
	// LoginPath is where a visitor who is nobody is sent (with ?next=);
	// LogoutPath takes a POST that signs out. Defaults: /login, /auth/logout.
	LoginPath, LogoutPath string
	// Title names the deployment in the header and the window title
	// (default "Assent").
	Title string
	// PageSize is how many requests a page lists (default 50).
	PageSize int
	// Now is the clock (default time.Now).
	Now func() time.Time
}

// UI serves the pages.
type UI struct {
	b     Broker
	cfg   Config
	log   *zap.Logger
	pages map[string]*template.Template
	card  *template.Template
	etag  string // of the static files, for cache busting
}

// New returns the web UI over b.
func New(b Broker, cfg Config, log *zap.Logger) (*UI, error) {
	if cfg.LoginPath == "" {
		cfg.LoginPath = "/login"
	}
	if cfg.LogoutPath == "" {
		cfg.LogoutPath = "/auth/logout"
	}
	if cfg.Title == "" {
		cfg.Title = "Assent"
	}
	if cfg.PageSize <= 0 {
		cfg.PageSize = 50
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if log == nil {
		log = zap.NewNop()
	}
	u := &UI{b: b, cfg: cfg, log: log.Named("webui"), pages: map[string]*template.Template{}}
	funcs := template.FuncMap{
		"line":     textsafe.Line,
		"text":     textsafe.Text,
		"rfc3339":  func(t time.Time) string { return t.UTC().Format(time.RFC3339) },
		"clock":    func(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05 UTC") },
		"ago":      u.ago,
		"until":    u.until,
		"join":     strings.Join,
		"static":   func(name string) string { return "/static/" + name + "?v=" + u.etag },
		"outcome":  outcomeWord,
		"shortid":  shortID,
		"plural":   plural,
		"query":    query,
		"jsonattr": jsonAttr,
		"count":    count,
		"namerule": func() string { return NameRule },
		"namepat":  func() string { return namePattern },
	}
	sum, err := staticSum()
	if err != nil {
		return nil, err
	}
	u.etag = sum
	base, err := template.New("").Funcs(funcs).ParseFS(templateFS, "templates/layout.html", "templates/card.html")
	if err != nil {
		return nil, fmt.Errorf("web ui templates: %w", err)
	}
	for _, page := range []string{"pending", "approval", "history", "remembered", "insights", "problem"} {
		t, err := template.Must(base.Clone()).ParseFS(templateFS, "templates/"+page+".html")
		if err != nil {
			return nil, fmt.Errorf("web ui template %s: %w", page, err)
		}
		u.pages[page] = t
	}
	u.card = base
	return u, nil
}

// Register adds the pages to mux.
func (u *UI) Register(mux interface {
	Handle(pattern string, h http.Handler)
}) {
	for _, rt := range u.routes() {
		mux.Handle(rt.pattern, rt.h)
	}
}

// Routes lists the patterns Register adds, for the tests of who gets what.
func (u *UI) Routes() []string {
	var out []string
	for _, rt := range u.routes() {
		out = append(out, rt.pattern)
	}
	return out
}

type route struct {
	pattern string
	h       http.Handler
}

func (u *UI) routes() []route {
	return []route{
		{"GET /{$}", u.page(u.pending)},
		{"GET /approvals/{id}", u.page(u.approval)},
		{"GET /history", u.page(u.history)},
		{"GET /remembered", u.page(u.remembered)},
		{"GET /insights", u.page(u.insights)},
		{"GET /insights/requests", u.page(u.insightsRequests)},
		{"GET /ui/cards", u.fragment(u.cards)},
		{"GET /ui/cards/{id}", u.fragment(u.oneCard)},
		{"GET /static/", u.static()},
	}
}

// static serves the script, styles and images, for everyone: they hold
// nothing of any request.
func (u *UI) static() http.Handler {
	static, _ := fs.Sub(staticFS, "static")
	files := http.StripPrefix("/static/", http.FileServerFS(static))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !utf8.ValidString(r.URL.Path) {
			// No file has such a name; fs.Sub calls it invalid, which the
			// file server would answer 500.
			http.NotFound(w, r)
			return
		}
		if r.URL.Query().Get("v") == u.etag {
			w.Header().Set("Cache-Control", "public, max-age=31536000, immutable")
		} else {
			w.Header().Set("Cache-Control", "no-cache")
		}
		files.ServeHTTP(w, r)
	})
}

// viewer is who looks at a page, and what the page's script needs.
type viewer struct {
	Principal string
	Method    string
	Auth      bool // authentication is on
	CSRF      string
	// who decides what the viewer sees: the same as the HTTP API shows it
	// (docs/web.md, "Who sees what").
	who access.Caller
}

// frame is what every page has.
type frame struct {
	Title      string
	Site       string
	Nav        string
	Viewer     viewer
	LogoutPath string
	Now        time.Time
	Page       any
}

// page wraps a page handler: it finds the viewer (sending nobody to sign
// in), renders the page's data in the layout, and shows errors as a page.
func (u *UI) page(fn func(r *http.Request, v viewer) (name, title, nav string, data any, err error)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		v, ok := u.viewer(r)
		if !ok {
			http.Redirect(w, r, u.cfg.LoginPath+"?next="+url.QueryEscape(r.URL.RequestURI()), http.StatusSeeOther)
			return
		}
		name, title, nav, data, err := fn(r, v)
		if err != nil {
			name, title, nav, data = u.problem(w, err)
		}
		u.render(w, name, frame{Title: title, Site: u.cfg.Title, Nav: nav, Viewer: v, LogoutPath: u.cfg.LogoutPath, Now: u.cfg.Now(), Page: data})
	})
}

// fragment wraps a handler of an HTML fragment the script fetches.
func (u *UI) fragment(fn func(w http.ResponseWriter, r *http.Request, v viewer) error) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		v, ok := u.viewer(r)
		if !ok {
			http.Error(w, "sign in first", http.StatusUnauthorized)
			return
		}
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		if err := fn(w, r, v); err != nil {
			status := http.StatusInternalServerError
			var bad *badInput
			switch {
			case errors.Is(err, broker.ErrNotFound):
				status = http.StatusNotFound
			case errors.As(err, &bad):
				status = http.StatusBadRequest
			default:
				u.log.Error("render fragment", zap.String("path", r.URL.Path), zap.Error(err))
			}
			http.Error(w, err.Error(), status)
		}
	})
}

func (u *UI) viewer(r *http.Request) (viewer, bool) {
	if u.cfg.Identify == nil {
		return viewer{who: access.Caller{Open: true}}, true
	}
	id, ok := u.cfg.Identify(r)
	if !ok {
		return viewer{}, false
	}
	v := viewer{Principal: id.Principal, Method: id.Method, Auth: true,
		who: access.Caller{Principal: id.Principal, Agent: id.Agent, Admin: id.Admin}}
	if u.cfg.CSRFToken != nil {
		v.CSRF = u.cfg.CSRFToken(r)
	}
	return v, true
}

// render writes page name; a template error is logged and answered 500.
func (u *UI) render(w http.ResponseWriter, name string, f frame) {
	var buf bytes.Buffer
	if err := u.pages[name].ExecuteTemplate(&buf, "layout", f); err != nil {
		u.log.Error("render page", zap.String("page", name), zap.Error(err))
		http.Error(w, "the page could not be rendered; the broker's log says why", http.StatusInternalServerError)
		return
	}
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Cache-Control", "no-store")
	pagehead.Set(h)
	if p, ok := f.Page.(problemPage); ok {
		w.WriteHeader(p.Status)
	}
	_, _ = buf.WriteTo(w)
}

// problemPage says what went wrong and what to do.
type problemPage struct {
	Status  int
	Heading string
	Message string
	Hint    string
}

func (u *UI) problem(w http.ResponseWriter, err error) (string, string, string, any) {
	p := problemPage{Status: http.StatusInternalServerError, Heading: "Something went wrong", Message: err.Error(),
		Hint: "Reload the page in a moment. If this keeps happening, the broker's log has the details."}
	var bad *badInput
	switch {
	case errors.Is(err, broker.ErrNotFound):
		p = problemPage{Status: http.StatusNotFound, Heading: "No such request", Message: err.Error(),
			Hint: "Requests decided long ago may have left the broker's store; the audit log (broker audit --request ID) still has them."}
	case errors.As(err, &bad):
		p = problemPage{Status: http.StatusBadRequest, Heading: "That address is not right", Message: bad.msg, Hint: "Go back and try again, or start from the approvals page."}
	default:
		u.log.Error("page", zap.Error(err))
	}
	return "problem", p.Heading, "", p
}

type badInput struct{ msg string }

func (e *badInput) Error() string { return e.msg }

// listing is a page of requests.
type listing struct {
	Cards    []card
	Total    int
	Next     string // query for the next page, or ""
	Agent    string
	Session  string
	State    string
	Sessions []sessionGroup
	Empty    string
}

// sessionGroup is a session with several pending requests on the page.
type sessionGroup struct {
	Session string
	Count   int
}

func (u *UI) filter(r *http.Request) (broker.Filter, error) {
	q := r.URL.Query()
	f := broker.Filter{Agent: q.Get("agent"), Session: q.Get("session"), After: q.Get("after"), Limit: u.cfg.PageSize}
	for name, v := range map[string]string{"agent": f.Agent, "session": f.Session, "after": f.After} {
		if v != "" && !events.ValidToken(v) {
			return f, &badInput{fmt.Sprintf("%s %q is not a name the broker uses (letters, digits, _ and -)", name, textsafe.Line(v))}
		}
	}
	return f, nil
}

func (u *UI) pending(r *http.Request, v viewer) (string, string, string, any, error) {
	f, err := u.filter(r)
	if err != nil {
		return "", "", "", nil, err
	}
	f.State = broker.StatePending
	l, err := u.list(r.Context(), f, v)
	if err != nil {
		return "", "", "", nil, err
	}
	l.Empty = "Nothing is waiting for an answer."
	counts := map[string]int{}
	for _, c := range l.Cards {
		if c.Session != "" {
			counts[c.Session]++
		}
	}
	for s, n := range counts {
		if n > 1 || f.Session != "" {
			l.Sessions = append(l.Sessions, sessionGroup{Session: s, Count: n})
		}
	}
	sort.Slice(l.Sessions, func(i, j int) bool { return l.Sessions[i].Session < l.Sessions[j].Session })
	title := "Pending"
	if l.Total > 0 {
		title = fmt.Sprintf("Pending (%d)", l.Total)
	}
	return "pending", title, "pending", l, nil
}

func (u *UI) history(r *http.Request, v viewer) (string, string, string, any, error) {
	f, err := u.filter(r)
	if err != nil {
		return "", "", "", nil, err
	}
	state := r.URL.Query().Get("state")
	switch broker.State(state) {
	case "":
		f.Decided = true
	case broker.StateApproved, broker.StateDenied, broker.StateExpired, broker.StateCancelled:
		f.State = broker.State(state)
	default:
		return "", "", "", nil, &badInput{fmt.Sprintf("state %q: want approved, denied, expired or cancelled", textsafe.Line(state))}
	}
	l, err := u.list(r.Context(), f, v)
	if err != nil {
		return "", "", "", nil, err
	}
	l.State = state
	l.Empty = "No decisions match."
	return "history", "History", "history", l, nil
}

// list reads one page of f, of the requests v sees, and makes its cards.
func (u *UI) list(ctx context.Context, f broker.Filter, v viewer) (listing, error) {
	page, err := access.List(ctx, u.b, v.who, f)
	if err != nil {
		return listing{}, err
	}
	l := listing{Total: page.Total, Agent: f.Agent, Session: f.Session}
	for _, rec := range page.Records {
		l.Cards = append(l.Cards, u.makeCard(rec, v))
	}
	if page.Next != "" {
		q := url.Values{"after": {page.Next}}
		if f.Agent != "" {
			q.Set("agent", f.Agent)
		}
		if f.Session != "" {
			q.Set("session", f.Session)
		}
		if f.State != "" && f.State != broker.StatePending {
			q.Set("state", string(f.State))
		}
		l.Next = "?" + q.Encode()
	}
	return l, nil
}

// detail is one request's page.
type detail struct {
	Card     card
	Timeline []step
	More     bool // the timeline has more than was read
	Request  string
}

// step is one event of a request's timeline.
type step struct {
	At    time.Time
	Type  string
	What  string
	Who   string
	Extra string
}

func (u *UI) approval(r *http.Request, v viewer) (string, string, string, any, error) {
	id := r.PathValue("id")
	if !events.ValidToken(id) {
		return "", "", "", nil, fmt.Errorf("%w: %q", broker.ErrNotFound, textsafe.Line(id))
	}
	rec, err := u.get(r.Context(), v, id)
	if err != nil {
		return "", "", "", nil, err
	}
	d := detail{Card: u.makeCard(rec, v)}
	d.Card.Detail = true
	req, _ := json.MarshalIndent(rec.Request, "", "  ")
	d.Request = string(textsafe.JSON(req))
	page, err := u.b.Audit(r.Context(), broker.AuditQuery{RequestID: id, Limit: 200})
	if err != nil {
		return "", "", "", nil, err
	}
	d.More = page.Next != 0 && len(page.Events) == 200
	for _, e := range page.Events {
		d.Timeline = append(d.Timeline, describe(e))
	}
	if d.Card.Pending && d.Card.History == "" {
		d.Card.setHistory(pendingHistory(page.Events), u.cfg.Now())
	}
	return "approval", textsafe.Line(rec.Request.Tool) + " · " + shortID(id), "", d, nil
}

// get reads request id for v: one v may not see is not found, the same as
// one there is none of, so that others' ids cannot be probed.
func (u *UI) get(ctx context.Context, v viewer, id string) (broker.Record, error) {
	rec, err := u.b.Get(ctx, id)
	if err != nil {
		return broker.Record{}, err
	}
	if !access.Sees(u.b, v.who, rec) {
		return broker.Record{}, fmt.Errorf("%w: %s", broker.ErrNotFound, id) // as Get says it
	}
	return rec, nil
}

// describe turns an event of the audit log into a step of a timeline.
func describe(e *broker.Event) step {
	s := step{At: e.Time, Type: e.ShortType()}
	var ce struct {
		Source string          `json:"source"`
		Data   json.RawMessage `json:"data"`
	}
	_ = json.Unmarshal(e.Event, &ce)
	var d map[string]json.RawMessage
	_ = json.Unmarshal(ce.Data, &d)
	str := func(k string) string {
		var v string
		_ = json.Unmarshal(d[k], &v)
		return textsafe.Line(v)
	}
	switch s.Type {
	case "requested":
		s.What, s.Who = "Requested", textsafe.Line(strings.TrimPrefix(ce.Source, "agent/"))
	case "pending":
		s.What = "Waiting for an answer"
		if rule := str("rule"); rule != "" {
			s.Extra = "rule " + rule
		}
	case "escalated":
		s.What = "Escalated"
		var lvl int
		_ = json.Unmarshal(d["level"], &lvl)
		var approvers []string
		_ = json.Unmarshal(d["approvers"], &approvers)
		s.Extra = fmt.Sprintf("level %d: %s", lvl, textsafe.Line(strings.Join(approvers, ", ")))
	case "responded":
		verdict := str("decision")
		s.What = map[string]string{"approve": "Approved", "deny": "Denied"}[verdict]
		if s.What == "" {
			s.What = "Answered " + verdict
		}
		s.Who = textsafe.Line(strings.TrimPrefix(ce.Source, "approver/"))
		if ch := str("channel"); ch != "" {
			s.Extra = "via " + ch
		}
		if reason := str("reason"); reason != "" {
			s.Extra = strings.TrimSpace(s.Extra + " · " + reason)
		}
	case "decided":
		s.What = "Decided: " + outcomeWord(str("outcome"))
		if reason := str("reason"); reason != "" {
			s.Extra = reason
		}
		if rule := str("rule"); rule != "" {
			s.Extra = strings.TrimSpace(s.Extra + " (rule " + rule + ")")
		}
	case "cancel":
		s.What, s.Who = "Cancelled", textsafe.Line(ce.Source)
		s.Extra = str("reason")
	case "rejected":
		s.What, s.Extra = "Rejected", str("reason")
	default:
		s.What = s.Type
	}
	return s
}

// grantRow is a remembered choice.
type grantRow struct {
	ID, Decision, Scope, ScopeValue, Tool, Args, CreatedBy, RequestID string
	Created, Expires                                                  time.Time
}

// remembered lists the remembered choices v may revoke: all of them for an
// admin (or without authentication), those of rules a principal may answer,
// none for an agent.
func (u *UI) remembered(_ *http.Request, v viewer) (string, string, string, any, error) {
	var rows []grantRow
	for _, g := range access.Revocable(u.b, v.who, u.b.Remembered()) {
		row := grantRow{ID: g.ID, Decision: string(g.Verdict), Scope: g.Scope, ScopeValue: textsafe.Line(g.ScopeValue),
			Tool: textsafe.Line(g.Tool), CreatedBy: textsafe.Line(g.CreatedBy), RequestID: g.RequestID, Created: g.CreatedAt, Expires: g.ExpiresAt}
		if len(g.ArgsPattern) > 0 {
			row.Args = string(textsafe.JSON(g.ArgsPattern))
		}
		rows = append(rows, row)
	}
	return "remembered", "Remembered choices", "remembered", rows, nil
}

// cards serves the cards of a pending listing, for the script to reconcile
// the page with after it connects to the event stream.
func (u *UI) cards(w http.ResponseWriter, r *http.Request, v viewer) error {
	f, err := u.filter(r)
	if err != nil {
		return err
	}
	f.State = broker.StatePending
	l, err := u.list(r.Context(), f, v)
	if err != nil {
		return err
	}
	w.Header().Set("X-Total", strconv.Itoa(l.Total))
	for _, c := range l.Cards {
		if err := u.card.ExecuteTemplate(w, "card", c); err != nil {
			return err
		}
	}
	return nil
}

// oneCard serves one request's card, as it is now.
func (u *UI) oneCard(w http.ResponseWriter, r *http.Request, v viewer) error {
	id := r.PathValue("id")
	if !events.ValidToken(id) {
		return fmt.Errorf("%w: %q", broker.ErrNotFound, id)
	}
	rec, err := u.get(r.Context(), v, id)
	if err != nil {
		return err
	}
	c := u.makeCard(rec, v)
	c.Detail = r.URL.Query().Get("detail") == "1"
	return u.card.ExecuteTemplate(w, "card", c)
}

// ago says how long before now t was, briefly.
func (u *UI) ago(t time.Time) string {
	return human.Duration(u.cfg.Now().Sub(t)) + " ago"
}

// until says how long after now t is, briefly.
func (u *UI) until(t time.Time) string {
	d := t.Sub(u.cfg.Now())
	if d <= 0 {
		return "now"
	}
	return "in " + human.Duration(d)
}

func outcomeWord(o string) string {
	switch o {
	case string(events.Approved):
		return "approved"
	case string(events.Denied):
		return "denied"
	case string(events.Expired):
		return "expired"
	case string(events.Cancelled):
		return "cancelled"
	}
	return textsafe.Line(o)
}

// shortID is the last part of a request id, enough to tell requests apart on
// a page.
func shortID(id string) string {
	if i := strings.LastIndexByte(id, '-'); i >= 0 && len(id)-i > 6 {
		return id[i+1:]
	}
	return id
}

func plural(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return strconv.Itoa(n) + " " + many
}

// NameRule says which names the broker takes as a principal (a subject
// token: events.ValidToken, up to events.MaxTokenLength); the page says it
// where it asks for a name.
const NameRule = "1 to 128 letters (A-Z, a-z), digits, _ or -: no spaces, dots or @"

// namePattern is NameRule as an <input pattern>: the page checks a name
// before the broker would refuse it.
const namePattern = `[A-Za-z0-9_\-]{1,128}`

// count writes n with thousands separators: 3,140.
func count(n int) string {
	s := strconv.Itoa(n)
	for i := len(s) - 3; i > 0 && s[i-1] != '-'; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

// query builds ?k=v&... from pairs, skipping empty values.
func query(kv ...string) string {
	q := url.Values{}
	for i := 0; i+1 < len(kv); i += 2 {
		if kv[i+1] != "" {
			q.Set(kv[i], kv[i+1])
		}
	}
	if len(q) == 0 {
		return "?"
	}
	return "?" + q.Encode()
}

// jsonAttr encodes v for a data- attribute the script reads with JSON.parse.
func jsonAttr(v any) (string, error) {
	b, err := json.Marshal(v)
	return string(b), err
}

// staticSum is a short digest of the static files, so that their URLs change
// when they do.
func staticSum() (string, error) {
	var all []byte
	err := fs.WalkDir(staticFS, "static", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := staticFS.ReadFile(path)
		all = append(append(all, path...), b...)
		return err
	})
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(all)
	return hex.EncodeToString(sum[:6]), nil
}
