package httpapi

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/assent-dev/assent/internal/broker"
	"github.com/assent-dev/assent/pkg/events"
)

// Approval is the resource the API returns for a request.
type Approval struct {
	ID         string           `json:"id"`
	State      broker.State     `json:"state"`
	Request    events.Requested `json:"request"`
	Deadline   time.Time        `json:"deadline"`
	ReceivedAt time.Time        `json:"received_at"`
	Decision   *events.Decided  `json:"decision"`
	// Rule says who decides a pending request, under the policy in force.
	Rule *Rule `json:"rule,omitempty"`
	// Votes are the approvals a pending request has so far, toward the
	// rule's quorum; Level the escalation level it reached.
	Votes []events.DecidedBy `json:"votes,omitempty"`
	Level int                `json:"level,omitempty"`
	// Forgery, when set, describes a decided event on the request's
	// decision subject that no broker made (see docs/architecture.md).
	Forgery string `json:"forgery,omitempty"`
}

// Rule describes how a pending request is decided.
type Rule struct {
	Name string `json:"name"`
	// Limit names the limit that held an automatic approval back.
	Limit string `json:"limit,omitempty"`
	// Approvers as the policy writes them (names and role:<role>); empty
	// means anyone.
	Approvers         []string `json:"approvers,omitempty"`
	Quorum            int      `json:"quorum"`
	AllowSelfApproval bool     `json:"allow_self_approval"`
	// OnTimeout is what a timeout means: "deny" (expired) or "approve".
	OnTimeout string `json:"on_timeout"`
	// Remember says whether and how answers may be remembered.
	Remember Remember `json:"remember"`
}

// Remember is what a rule allows an answer to remember.
type Remember struct {
	Allowed bool     `json:"allowed"`
	Scopes  []string `json:"scopes,omitempty"`
	MaxTTL  string   `json:"max_ttl,omitempty"`
}

func (s *Server) approval(r broker.Record) Approval {
	a := Approval{ID: r.ID, State: r.State, Request: r.Request, Deadline: r.Deadline, ReceivedAt: r.ReceivedAt,
		Decision: r.Decision, Votes: r.Votes, Level: r.Level, Forgery: r.Forgery}
	if r.State == broker.StatePending {
		info := s.b.RuleOf(r)
		onTimeout := string(info.OnTimeout)
		if onTimeout == "" {
			onTimeout = string(events.Deny)
		}
		a.Rule = &Rule{Name: info.Rule, Limit: info.Limit, Approvers: info.Approvers, Quorum: info.Quorum,
			AllowSelfApproval: info.AllowSelfApproval, OnTimeout: onTimeout,
			Remember: Remember{Allowed: info.Rememberable}}
		if info.Rememberable {
			a.Rule.Remember.Scopes, a.Rule.Remember.MaxTTL = info.RememberScopes, info.MaxRemember.String()
		}
	}
	return a
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
	if s.cfg.Identify != nil {
		// Only the agent's own credential asks for it.
		switch id, _ := s.cfg.Identify(r); {
		case id.Agent == "":
			writeError(w, http.StatusForbidden, "agent_mismatch", "this credential names no agent, so it cannot ask for approvals; give the agent a token of its own (broker token create NAME --agent AGENT)")
			return
		case id.Agent != body.Agent:
			writeError(w, http.StatusForbidden, "agent_mismatch", fmt.Sprintf("this credential asks for agent %q, not %q; nothing was created", id.Agent, body.Agent))
			return
		}
	}
	// The caller's W3C traceparent header, if any, is the request's trace.
	rec, err := s.b.Submit(callerTrace(r), body.ID, "http/"+clientName(r), body.Requested)
	if err != nil {
		s.fail(w, err)
		return
	}
	if wait > 0 && !rec.State.Terminal() {
		rec = s.wait(r.Context(), rec, wait)
	}
	w.Header().Set("Location", "/v1/approvals/"+rec.ID)
	writeJSON(w, http.StatusCreated, s.approval(rec))
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
	if !s.sees(s.caller(r), rec) {
		// As if there were none: ids of others' requests are not probed.
		s.fail(w, fmt.Errorf("%w: %q", broker.ErrNotFound, rec.ID))
		return
	}
	if wait > 0 && !rec.State.Terminal() {
		rec = s.wait(r.Context(), rec, wait)
	}
	writeJSON(w, http.StatusOK, s.approval(rec))
}

// wait long-polls for rec's decision, returning the newest state when the wait
// ends first.
func (s *Server) wait(ctx context.Context, rec broker.Record, d time.Duration) broker.Record {
	ctx, stop := s.untilStopping(ctx)
	defer stop()
	wctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	got, err := s.b.Wait(wctx, rec.ID)
	if err != nil && got.ID == "" {
		return rec
	}
	return got
}

// listPage is the body of GET /v1/approvals.
type listPage struct {
	Approvals []Approval `json:"approvals"`
	// Total counts the requests matching the filter; Next is the query
	// parameter after= for the next page, "" on the last.
	Total int    `json:"total"`
	Next  string `json:"next,omitempty"`
}

func (s *Server) list(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	f := broker.Filter{Agent: q.Get("agent"), Session: q.Get("session"), After: q.Get("after"), Limit: 100}
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
	c := s.caller(r)
	if c.agentOnly() {
		var asked []string
		if f.Agent != "" {
			asked = []string{f.Agent}
		}
		agents, ok := agentScope(w, c, asked)
		if !ok {
			return
		}
		f.Agent = agents[0]
	}
	page, err := s.listFor(r.Context(), c, f)
	if err != nil {
		s.fail(w, err)
		return
	}
	out := listPage{Approvals: make([]Approval, len(page.Records)), Total: page.Total}
	for i, rec := range page.Records {
		out.Approvals[i] = s.approval(rec)
	}
	out.Next = page.Next
	writeJSON(w, http.StatusOK, out)
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
	principal, ok := s.principal(w, r, body.Principal)
	if !ok {
		return
	}
	if body.Channel == "" {
		body.Channel = "http"
	}
	ctx, span := s.startDecision(r, r.PathValue("id"), principal, body.Responded)
	rec, err := s.b.Respond(ctx, principal, r.PathValue("id"), body.Responded)
	endDecision(span, err)
	if err != nil {
		s.fail(w, err)
		return
	}
	writeJSON(w, http.StatusOK, s.approval(rec))
}

func (s *Server) cancel(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Reason string `json:"reason"`
		By     string `json:"by"`
	}
	if r.ContentLength != 0 && !s.readJSON(w, r, &body) {
		return
	}
	id := r.PathValue("id")
	by := body.By
	if by != "" {
		if err := events.CheckToken("by", by); err != nil {
			writeError(w, http.StatusBadRequest, "invalid_request", err.Error()+" (by names who cancels: a principal)")
			return
		}
	}
	if !events.ValidToken(id) {
		// No request has it.
		s.fail(w, fmt.Errorf("%w: %q", broker.ErrNotFound, id))
		return
	}
	if s.cfg.Identify != nil {
		rec, err := s.b.Get(r.Context(), id)
		if err != nil {
			s.fail(w, err)
			return
		}
		if by, err = s.canceller(s.caller(r), rec, by); err != nil {
			var refused *refusal
			if errors.As(err, &refused) {
				writeError(w, http.StatusForbidden, refused.code, refused.msg)
				return
			}
			s.fail(w, err)
			return
		}
	} else if by == "" {
		by = "http/" + clientName(r)
	}
	rec, err := s.b.Cancel(r.Context(), id, by, body.Reason)
	if err != nil {
		s.fail(w, err)
		return
	}
	writeJSON(w, http.StatusOK, s.approval(rec))
}

// canceller returns who cancels rec with authentication on, as the cancel
// records it: the request's own agent (agent/<name>), or an admin (its
// principal, or admin/<credential name>). Anyone else gets 403
// agent_mismatch (an approver denies instead), and a body "by" naming
// someone else than who cancels 403 principal_mismatch: a *refusal.
func (s *Server) canceller(c caller, rec broker.Record, by string) (string, error) {
	var as string
	switch {
	case c.Agent != "" && c.Agent == rec.Request.Agent && (by == "" || !c.Admin):
		as = "agent/" + c.Agent
	case c.Admin && c.Principal != "":
		as = c.Principal
	case c.Admin:
		as = "admin/" + c.Name
	default:
		msg := fmt.Sprintf("request %s is agent %q's; only its agent's credential or an admin cancels it (an approver denies instead); nothing was changed", rec.ID, rec.Request.Agent)
		if !s.sees(c, rec) {
			msg = fmt.Sprintf("request %s is not one of this credential's agent's; nothing was changed", rec.ID)
		}
		return "", &refusal{"agent_mismatch", msg}
	}
	if by != "" && by != as {
		return "", &refusal{"principal_mismatch", fmt.Sprintf("by %q in the body, but the cancel is made as %q; nothing was changed", by, as)}
	}
	return as, nil
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

// MaxBatch bounds the requests one POST /v1/decisions answers.
const MaxBatch = 1000

// batchBody is the body of POST /v1/decisions: one answer for many requests,
// selected by session (every pending request of it, of one agent if given)
// or by ids.
type batchBody struct {
	Principal string   `json:"principal"`
	Session   string   `json:"session"`
	Agent     string   `json:"agent"`
	IDs       []string `json:"ids"`
	events.Responded
}

// Result is one request's result in a batch.
type Result struct {
	ID string `json:"id"`
	// Status is "decided", "voted" (counted, the quorum not reached yet), or
	// the error code the single-request route would have answered
	// (not_eligible, already_decided, expired, not_found, invalid_request, ...).
	Status   string       `json:"status"`
	Message  string       `json:"message,omitempty"`
	Approval *Approval    `json:"approval,omitempty"`
	HTTP     int          `json:"http_status"`
	State    broker.State `json:"state,omitempty"`
}

func (s *Server) decideMany(w http.ResponseWriter, r *http.Request) {
	var body batchBody
	if !s.readJSON(w, r, &body) {
		return
	}
	principal, ok := s.principal(w, r, body.Principal)
	if !ok {
		return
	}
	switch {
	case (body.Session == "") == (len(body.IDs) == 0):
		writeError(w, http.StatusBadRequest, "invalid_request", `want exactly one of "session" (every pending request of a session) or "ids"`)
		return
	case len(body.IDs) > MaxBatch:
		writeError(w, http.StatusBadRequest, "invalid_request", fmt.Sprintf("ids: %d ids, at most %d", len(body.IDs), MaxBatch))
		return
	case len(body.Args) > 0 && string(body.Args) != "null":
		writeError(w, http.StatusBadRequest, "invalid_request", "args: edited arguments belong to one request; answer it on its own")
		return
	}
	if err := body.Responded.Validate(); err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request", err.Error())
		return
	}
	if body.Channel == "" {
		body.Channel = "http"
	}
	ids := body.IDs
	if body.Session != "" {
		// Requests the caller may not see are left out, not answered
		// not_eligible: their ids are not the caller's to learn.
		c := s.caller(r)
		page, err := s.listFor(r.Context(), c, broker.Filter{State: broker.StatePending, Session: body.Session, Agent: body.Agent, Limit: MaxBatch})
		if err != nil {
			s.fail(w, err)
			return
		}
		for _, rec := range page.Records {
			ids = append(ids, rec.ID)
		}
	}
	results := make([]Result, 0, len(ids))
	decided := 0
	for _, id := range ids {
		res := Result{ID: id}
		ctx, span := s.startDecision(r, id, principal, body.Responded)
		rec, err := s.b.Respond(ctx, principal, id, body.Responded)
		endDecision(span, err)
		if err != nil {
			res.HTTP, res.Status = errorStatus(err)
			res.Message = err.Error()
		} else {
			a := s.approval(rec)
			res.HTTP, res.Status, res.Approval, res.State = http.StatusOK, "voted", &a, rec.State
			if rec.State.Terminal() {
				res.Status = "decided"
				decided++
			}
		}
		results = append(results, res)
	}
	writeJSON(w, http.StatusOK, map[string]any{"results": results, "decided": decided, "total": len(results)})
}
