// Package httpapi is the broker's HTTP gateway: the approvals API of DESIGN
// section 3, health endpoints, and JSON errors with stable codes.
package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"go.uber.org/zap"

	"github.com/assent-dev/assent/internal/broker"
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
	List(ctx context.Context, f broker.Filter) ([]broker.Record, error)
	Respond(ctx context.Context, principal, id string, r events.Responded) (broker.Record, error)
	Cancel(ctx context.Context, id, by, reason string) (broker.Record, error)
	Remembered() []policy.Grant
	Forget(ctx context.Context, id string) (policy.Grant, error)
	Ready() bool
}

// Config configures the gateway.
type Config struct {
	// MaxBodyBytes bounds request bodies. Default 1 MiB.
	MaxBodyBytes int64
}

// Server serves the HTTP API.
type Server struct {
	b   Broker
	cfg Config
	log *zap.Logger
	mux *http.ServeMux
}

// New returns the gateway for b. A nil logger logs nothing.
func New(b Broker, cfg Config, log *zap.Logger) *Server {
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = events.DefaultMaxEventSize
	}
	if log == nil {
		log = zap.NewNop()
	}
	s := &Server{b: b, cfg: cfg, log: log.Named("http"), mux: http.NewServeMux()}
	s.mux.HandleFunc("POST /v1/approvals", s.create)
	s.mux.HandleFunc("GET /v1/approvals", s.list)
	s.mux.HandleFunc("GET /v1/approvals/{id}", s.get)
	s.mux.HandleFunc("POST /v1/approvals/{id}/decision", s.decide)
	s.mux.HandleFunc("POST /v1/approvals/{id}/cancel", s.cancel)
	s.mux.HandleFunc("GET /v1/remembered", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]any{"remembered": s.b.Remembered()})
	})
	s.mux.HandleFunc("DELETE /v1/remembered/{id}", func(w http.ResponseWriter, r *http.Request) {
		g, err := s.b.Forget(r.Context(), r.PathValue("id"))
		if err != nil {
			s.fail(w, err)
			return
		}
		writeJSON(w, http.StatusOK, map[string]any{"revoked": g})
	})
	s.mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	s.mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !s.b.Ready() {
			writeError(w, http.StatusServiceUnavailable, "not_ready", "broker is starting, stopping, or has lost NATS")
			return
		}
		writeJSON(w, http.StatusOK, map[string]string{"status": "ready"})
	})
	return s
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
		writeError(w, http.StatusNotFound, "not_found", fmt.Sprintf("no such path: %s (the API is under /v1/, see docs/protocol.md)", r.URL.Path))
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

// Approval is the resource the API returns for a request.
type Approval struct {
	ID         string           `json:"id"`
	State      broker.State     `json:"state"`
	Request    events.Requested `json:"request"`
	Deadline   time.Time        `json:"deadline"`
	ReceivedAt time.Time        `json:"received_at"`
	Decision   *events.Decided  `json:"decision"`
	// Forgery, when set, describes a decided event on the request's
	// decision subject that no broker made (see docs/architecture.md).
	Forgery string `json:"forgery,omitempty"`
}

func approval(r broker.Record) Approval {
	return Approval{ID: r.ID, State: r.State, Request: r.Request, Deadline: r.Deadline, ReceivedAt: r.ReceivedAt, Decision: r.Decision, Forgery: r.Forgery}
}

// createBody is the body of POST /v1/approvals: the requested data plus an id.
type createBody struct {
	ID string `json:"id"`
	events.Requested
}

func (s *Server) create(w http.ResponseWriter, r *http.Request) {
	wait, ok := s.waitParam(w, r)
	if !ok {
		return
	}
	var body createBody
	if !s.readJSON(w, r, &body) {
		return
	}
	rec, err := s.b.Submit(r.Context(), body.ID, "http/"+clientName(r), body.Requested)
	if err != nil {
		s.fail(w, err)
		return
	}
	if wait > 0 && !rec.State.Terminal() {
		rec = s.wait(r.Context(), rec, wait)
	}
	w.Header().Set("Location", "/v1/approvals/"+rec.ID)
	writeJSON(w, http.StatusCreated, approval(rec))
}

func (s *Server) get(w http.ResponseWriter, r *http.Request) {
	wait, ok := s.waitParam(w, r)
	if !ok {
		return
	}
	rec, err := s.b.Get(r.Context(), r.PathValue("id"))
	if err != nil {
		s.fail(w, err)
		return
	}
	if wait > 0 && !rec.State.Terminal() {
		rec = s.wait(r.Context(), rec, wait)
	}
	writeJSON(w, http.StatusOK, approval(rec))
}

// wait long-polls for rec's decision, returning the newest state when the wait
// ends first.
func (s *Server) wait(ctx context.Context, rec broker.Record, d time.Duration) broker.Record {
	wctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	got, err := s.b.Wait(wctx, rec.ID)
	if err != nil && got.ID == "" {
		return rec
	}
	return got
}

func (s *Server) list(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	f := broker.Filter{Agent: q.Get("agent"), Session: q.Get("session")}
	if st := q.Get("state"); st != "" {
		state, err := broker.ParseState(st)
		if err != nil {
			writeError(w, http.StatusBadRequest, "invalid_request", err.Error())
			return
		}
		f.State = state
	}
	if l := q.Get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 1 || n > 1000 {
			writeError(w, http.StatusBadRequest, "invalid_request", "limit: want a whole number from 1 to 1000")
			return
		}
		f.Limit = n
	}
	recs, err := s.b.List(r.Context(), f)
	if err != nil {
		s.fail(w, err)
		return
	}
	out := make([]Approval, len(recs))
	for i, rec := range recs {
		out[i] = approval(rec)
	}
	writeJSON(w, http.StatusOK, map[string]any{"approvals": out})
}

// decisionBody is the body of POST /v1/approvals/{id}/decision.
type decisionBody struct {
	Principal string `json:"principal"`
	events.Responded
}

func (s *Server) decide(w http.ResponseWriter, r *http.Request) {
	var body decisionBody
	if !s.readJSON(w, r, &body) {
		return
	}
	if body.Principal == "" {
		writeError(w, http.StatusBadRequest, "invalid_request", "principal: missing (who is answering?)")
		return
	}
	if body.Channel == "" {
		body.Channel = "http"
	}
	rec, err := s.b.Respond(r.Context(), body.Principal, r.PathValue("id"), body.Responded)
	if err != nil {
		s.fail(w, err)
		return
	}
	writeJSON(w, http.StatusOK, approval(rec))
}

func (s *Server) cancel(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Reason string `json:"reason"`
		By     string `json:"by"`
	}
	if r.ContentLength != 0 && !s.readJSON(w, r, &body) {
		return
	}
	by := body.By
	if by == "" {
		by = "http/" + clientName(r)
	} else if err := events.CheckToken("by", by); err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request", err.Error()+" (by names who cancels: a principal)")
		return
	}
	rec, err := s.b.Cancel(r.Context(), r.PathValue("id"), by, body.Reason)
	if err != nil {
		s.fail(w, err)
		return
	}
	writeJSON(w, http.StatusOK, approval(rec))
}

func (s *Server) waitParam(w http.ResponseWriter, r *http.Request) (time.Duration, bool) {
	v := r.URL.Query().Get("wait")
	if v == "" {
		return 0, true
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 0 {
		writeError(w, http.StatusBadRequest, "invalid_request", fmt.Sprintf("wait: %q is not a duration such as \"30s\"", v))
		return 0, false
	}
	return min(d, MaxWait), true
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

// fail maps a broker error to a status and a stable code.
func (s *Server) fail(w http.ResponseWriter, err error) {
	switch {
	case errors.Is(err, events.ErrTooLarge):
		writeError(w, http.StatusRequestEntityTooLarge, "too_large", err.Error())
	case errors.Is(err, broker.ErrInvalid), errors.Is(err, events.ErrInvalid):
		writeError(w, http.StatusBadRequest, "invalid_request", err.Error())
	case errors.Is(err, broker.ErrNotFound):
		writeError(w, http.StatusNotFound, "not_found", err.Error())
	case errors.Is(err, broker.ErrIDConflict):
		writeError(w, http.StatusConflict, "id_conflict", err.Error())
	case errors.Is(err, broker.ErrAlreadyDecided):
		writeError(w, http.StatusConflict, "already_decided", err.Error())
	case errors.Is(err, broker.ErrBeforeRequest):
		writeError(w, http.StatusConflict, "before_request", err.Error())
	case errors.Is(err, broker.ErrForgedDecision):
		s.log.Error("decision conflict", zap.Error(err))
		writeError(w, http.StatusInternalServerError, "decision_conflict", err.Error())
	case errors.Is(err, broker.ErrExpired):
		writeError(w, http.StatusGone, "expired", err.Error())
	case errors.Is(err, broker.ErrNotEligible):
		writeError(w, http.StatusForbidden, "not_eligible", err.Error())
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		writeError(w, http.StatusServiceUnavailable, "unavailable", err.Error())
	default:
		s.log.Error("request failed", zap.Error(err))
		writeError(w, http.StatusInternalServerError, "internal", err.Error())
	}
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
