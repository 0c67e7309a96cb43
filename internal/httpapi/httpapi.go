// Package httpapi is the broker's HTTP gateway: the approvals API of DESIGN
// section 3 (approvals, batch decisions, the event stream, the audit log,
// remembered choices), health endpoints, the OpenAPI document, and JSON
// errors with stable codes. Who calls is decided before it (see Config.Identify).
package httpapi

import (
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"time"

	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"

	"github.com/assent-dev/assent/internal/access"
	"github.com/assent-dev/assent/internal/broker"
	"github.com/assent-dev/assent/internal/insights"
	"github.com/assent-dev/assent/pkg/events"
	"github.com/assent-dev/assent/pkg/policy"
)

// MaxWait caps ?wait=, so a long poll cannot hold a connection forever.
const MaxWait = 5 * time.Minute

// Broker is what the gateway needs of the broker.
type Broker interface {
	Submit(ctx context.Context, id, source string, req events.Requested) (broker.Record, error)
	Get(ctx context.Context, id string) (broker.Record, error)
	Wait(ctx context.Context, id string) (broker.Record, error)
	List(ctx context.Context, f broker.Filter) (broker.Page, error)
	Respond(ctx context.Context, principal, id string, r events.Responded) (broker.Record, error)
	// RequestContext returns ctx carrying request id's trace context.
	RequestContext(ctx context.Context, id string) context.Context
	Cancel(ctx context.Context, id, by, reason string) (broker.Record, error)
	Eligible(r broker.Record, principal string) error
	// Policy is the policy in force.
	Policy() *policy.Policy
	RuleOf(r broker.Record) broker.RuleInfo
	Subscribe(ctx context.Context, after uint64, f broker.EventFilter, deliver func([]*broker.Event) error) error
	// LastSeq is the stream sequence of the last event stored.
	LastSeq(ctx context.Context) (uint64, error)
	Audit(ctx context.Context, q broker.AuditQuery) (broker.AuditPage, error)
	Remembered() []policy.Grant
	Forget(ctx context.Context, id string) (policy.Grant, error)
	// Insights is what the record says about the requests f selects.
	Insights(ctx context.Context, f insights.Filter) (insights.Report, error)
	Ready() bool
}

// Identity is who a request comes from, as the authentication in front of the
// gateway established it.
type Identity struct {
	// Principal is who answers are made as; "" if the credential names none.
	Principal string
	// Agent is the agent the credential may ask and cancel for; "" for none.
	Agent string
	// Admin may read, follow and cancel every request and revoke every
	// remembered choice (docs/web.md, "Who sees what").
	Admin bool
	// Name names the credential (a token's name), for the record of what an
	// admin without a principal cancels.
	Name string
}

// Config configures the gateway.
type Config struct {
	// MaxBodyBytes bounds request bodies. Default 1 MiB.
	MaxBodyBytes int64
	// Identify returns the identity of a request, or false if it carried
	// none. Nil means authentication is off: answers name their principal in
	// the body, which only a broker serving loopback may allow.
	Identify func(*http.Request) (Identity, bool)
	// Heartbeat is how often the event stream sends a comment to keep idle
	// connections open. Default 15s.
	Heartbeat time.Duration
	// Observe, if set, is told about each event stream client that comes
	// (+1) and goes (-1).
	Observe func(delta int)
	// TracerProvider makes the spans of answers (SpanDecision); nil uses
	// OpenTelemetry's global provider.
	TracerProvider trace.TracerProvider
	// Stopping, if set, ends long polls (?wait=) and event streams when it
	// ends: a server shutting down answers them with what it has, and the
	// client asks again (of another replica), instead of holding the
	// shutdown. Requests that change something finish as usual.
	Stopping context.Context
}

// untilStopping returns ctx, ended early when the server starts stopping.
func (s *Server) untilStopping(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	if s.cfg.Stopping == nil {
		return ctx, cancel
	}
	stop := context.AfterFunc(s.cfg.Stopping, cancel)
	return ctx, func() { stop(); cancel() }
}

// Server serves the HTTP API.
type Server struct {
	b      Broker
	cfg    Config
	log    *zap.Logger
	tracer trace.Tracer
	mux    *http.ServeMux
	routes []route
}

// route is one operation of the API.
type route struct {
	method, path string
	handle       http.HandlerFunc
	// open routes need no identity even with authentication on.
	open bool
}

// New returns the gateway for b. A nil logger logs nothing.
func New(b Broker, cfg Config, log *zap.Logger) *Server {
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = events.DefaultMaxEventSize
	}
	if cfg.Heartbeat <= 0 {
		cfg.Heartbeat = 15 * time.Second
	}
	if log == nil {
		log = zap.NewNop()
	}
	s := &Server{b: b, cfg: cfg, log: log.Named("http"), mux: http.NewServeMux(), tracer: newTracer(cfg.TracerProvider)}
	s.routes = []route{
		{method: "POST", path: "/v1/approvals", handle: s.create},
		{method: "GET", path: "/v1/approvals", handle: s.list},
		{method: "GET", path: "/v1/approvals/{id}", handle: s.get},
		{method: "POST", path: "/v1/approvals/{id}/decision", handle: s.decide},
		{method: "POST", path: "/v1/approvals/{id}/cancel", handle: s.cancel},
		{method: "POST", path: "/v1/decisions", handle: s.decideMany},
		{method: "POST", path: "/v1/cancels", handle: s.cancelMany},
		{method: "GET", path: "/v1/events", handle: s.events},
		{method: "GET", path: "/v1/audit", handle: s.audit},
		{method: "GET", path: "/v1/insights", handle: s.insights},
		{method: "GET", path: "/v1/remembered", handle: s.remembered},
		{method: "DELETE", path: "/v1/remembered/{id}", handle: s.forget},
		{method: "GET", path: "/v1/openapi.json", handle: serveOpenAPI, open: true},
		{method: "GET", path: "/healthz", handle: s.healthz, open: true},
		{method: "GET", path: "/readyz", handle: s.readyz, open: true},
	}
	for _, rt := range s.routes {
		h := rt.handle
		if !rt.open {
			h = s.authenticated(h)
		}
		s.mux.HandleFunc(rt.method+" "+rt.path, h)
	}
	return s
}

// Routes lists the API's operations as "METHOD /path", for checking the
// OpenAPI document against the router.
func (s *Server) Routes() []string {
	out := make([]string, len(s.routes))
	for i, rt := range s.routes {
		out[i] = rt.method + " " + rt.path
	}
	return out
}

// Handle adds a handler to the gateway's mux (for the web UI, metrics, ...).
func (s *Server) Handle(pattern string, h http.Handler) { s.mux.Handle(pattern, h) }

// ServeHTTP implements http.Handler. A path no route serves, or a method a
// route does not take, gets a JSON error like every other (404 not_found, 405
// method_not_allowed with an Allow header).
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Cache-Control", "no-store")
	h, pattern := s.mux.Handler(r)
	if pattern != "" {
		s.mux.ServeHTTP(w, r) // which sets the path values
		return
	}
	// The mux's own answer says which of the two it is, and which methods
	// the path takes; keep that and write the body as JSON.
	probe := &statusRecorder{header: http.Header{}}
	h.ServeHTTP(probe, r)
	switch probe.status {
	case http.StatusMethodNotAllowed:
		w.Header().Set("Allow", probe.header.Get("Allow"))
		writeError(w, http.StatusMethodNotAllowed, "method_not_allowed", fmt.Sprintf("%s is not allowed on %s (allowed: %s)", r.Method, r.URL.Path, probe.header.Get("Allow")))
	case http.StatusNotFound:
		writeError(w, http.StatusNotFound, "not_found", fmt.Sprintf("no such path: %s (the API is under /v1/, see /v1/openapi.json)", r.URL.Path))
	default:
		h.ServeHTTP(w, r) // a redirect, such as for a path that is not clean
	}
}

// statusRecorder keeps the status and headers a handler writes, and drops its
// body.
type statusRecorder struct {
	header http.Header
	status int
}

func (r *statusRecorder) Header() http.Header { return r.header }
func (r *statusRecorder) WriteHeader(code int) {
	if r.status == 0 {
		r.status = code
	}
}
func (r *statusRecorder) Write(b []byte) (int, error) {
	r.WriteHeader(http.StatusOK)
	return len(b), nil
}

// authenticated refuses a request without an identity when authentication is
// on (401 unauthenticated).
func (s *Server) authenticated(next http.HandlerFunc) http.HandlerFunc {
	if s.cfg.Identify == nil {
		return next
	}
	return func(w http.ResponseWriter, r *http.Request) {
		if _, ok := s.cfg.Identify(r); !ok {
			w.Header().Set("WWW-Authenticate", `Bearer realm="assent"`)
			writeError(w, http.StatusUnauthorized, "unauthenticated", "sign in, or send an API token as Authorization: Bearer <token> (docs/web.md)")
			return
		}
		next(w, r)
	}
}

// principal returns who answers a request: with authentication on, the
// caller's identity, which a body principal must agree with; with it off, the
// body's. It writes the error and returns false when there is none.
func (s *Server) principal(w http.ResponseWriter, r *http.Request, body string) (string, bool) {
	if s.cfg.Identify == nil {
		if body == "" {
			writeError(w, http.StatusBadRequest, "invalid_request", "principal: missing (who is answering?)")
			return "", false
		}
		return body, true
	}
	id, _ := s.cfg.Identify(r)
	switch {
	case id.Principal == "":
		writeError(w, http.StatusForbidden, "no_principal", "this credential names no principal, so it cannot answer (docs/web.md)")
		return "", false
	case body != "" && body != id.Principal:
		writeError(w, http.StatusForbidden, "principal_mismatch", fmt.Sprintf("principal %q in the body, but you are %q; nothing was changed", body, id.Principal))
		return "", false
	}
	return id.Principal, true
}

func (s *Server) healthz(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

func (s *Server) readyz(w http.ResponseWriter, _ *http.Request) {
	if !s.b.Ready() {
		writeError(w, http.StatusServiceUnavailable, "not_ready", "broker is starting, stopping, or has lost NATS")
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ready"})
}

// remembered lists the remembered choices the caller may revoke: all of
// them for an admin, those of rules a principal may answer, none for an
// agent.
func (s *Server) remembered(w http.ResponseWriter, r *http.Request) {
	out := access.Revocable(s.b, s.caller(r).access(), s.b.Remembered())
	writeJSON(w, http.StatusOK, map[string]any{"remembered": out})
}

// forget revokes a remembered choice: for an admin, or a principal the
// policy lets answer its rule (who could have made it).
func (s *Server) forget(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if c := s.caller(r); !c.all() {
		grants := s.b.Remembered()
		i := slices.IndexFunc(grants, func(g policy.Grant) bool { return g.ID == id })
		switch {
		case c.Principal == "":
			writeError(w, http.StatusForbidden, "no_principal", "this credential names no principal, so it cannot revoke a remembered choice (docs/web.md)")
			return
		case i < 0:
			s.fail(w, fmt.Errorf("%w: no remembered choice %q", broker.ErrNotFound, id))
			return
		case !s.mayRevoke(c, grants[i]):
			writeError(w, http.StatusForbidden, "not_eligible", fmt.Sprintf("%s may not answer the rule this choice was remembered for, so may not revoke it; nothing was changed", c.Principal))
			return
		}
	}
	g, err := s.b.Forget(r.Context(), id)
	if err != nil {
		s.fail(w, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"revoked": g})
}

//go:embed openapi.json
var openAPI []byte

func serveOpenAPI(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "public, max-age=300")
	_, _ = w.Write(openAPI)
}

func (s *Server) readJSON(w http.ResponseWriter, r *http.Request, v any) bool {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			writeError(w, http.StatusRequestEntityTooLarge, "too_large", fmt.Sprintf("body over %d bytes", s.cfg.MaxBodyBytes))
			return false
		}
		writeError(w, http.StatusBadRequest, "invalid_request", "read body: "+err.Error())
		return false
	}
	// Decoding would turn invalid UTF-8 and lone surrogates into U+FFFD, and
	// an agent could then run something other than what was approved.
	if err := events.CheckJSONText(body); err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request", "body: "+err.Error())
		return false
	}
	if err := json.Unmarshal(body, v); err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request", "body: "+err.Error())
		return false
	}
	return true
}

// errorStatus maps a broker error to a status and a stable code.
func errorStatus(err error) (int, string) {
	switch {
	case errors.Is(err, events.ErrTooLarge):
		return http.StatusRequestEntityTooLarge, "too_large"
	case errors.Is(err, broker.ErrInvalid), errors.Is(err, events.ErrInvalid):
		return http.StatusBadRequest, "invalid_request"
	case errors.Is(err, broker.ErrNotFound):
		return http.StatusNotFound, "not_found"
	case errors.Is(err, broker.ErrIDConflict):
		return http.StatusConflict, "id_conflict"
	case errors.Is(err, broker.ErrAlreadyDecided):
		return http.StatusConflict, "already_decided"
	case errors.Is(err, broker.ErrBeforeRequest):
		return http.StatusConflict, "before_request"
	case errors.Is(err, broker.ErrExpired):
		return http.StatusGone, "expired"
	case errors.Is(err, broker.ErrNotEligible):
		return http.StatusForbidden, "not_eligible"
	case errors.Is(err, broker.ErrForgedDecision):
		return http.StatusInternalServerError, "decision_conflict"
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return http.StatusServiceUnavailable, "unavailable"
	}
	return http.StatusInternalServerError, "internal"
}

// fail writes err as a JSON error.
func (s *Server) fail(w http.ResponseWriter, err error) {
	status, code := errorStatus(err)
	if status >= 500 && code != "unavailable" {
		s.log.Error("request failed", zap.String("code", code), zap.Error(err))
	}
	writeError(w, status, code, err.Error())
}

// Error is the JSON error body: {"error": {"code", "message"}}.
type Error struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

func writeError(w http.ResponseWriter, status int, code, msg string) {
	writeJSON(w, status, map[string]Error{"error": {Code: code, Message: msg}})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v)
}

// clientName is the caller's address as a name: letters, digits, "-", "_"
// and "." only.
func clientName(r *http.Request) string {
	host := r.RemoteAddr
	for i := len(host) - 1; i >= 0; i-- {
		if host[i] == ':' {
			host = host[:i]
			break
		}
	}
	out := make([]byte, 0, len(host))
	for i := 0; i < len(host); i++ {
		c := host[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.' {
			out = append(out, c)
		}
	}
	if len(out) == 0 {
		return "unknown"
	}
	return string(out)
}
