package httpapi

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/assent-dev/assent/internal/broker"
	"github.com/assent-dev/assent/pkg/events"
)

// cancelsBody is the body of POST /v1/cancels: one cancel for many requests,
// selected by agent and/or session (every pending request of them) or by
// ids.
type cancelsBody struct {
	Agent   string   `json:"agent"`
	Session string   `json:"session"`
	IDs     []string `json:"ids"`
	Reason  string   `json:"reason"`
	By      string   `json:"by"`
}

// cancelMany serves POST /v1/cancels: every pending request of an agent, of
// a session, or of a list of ids, cancelled one by one under the
// authorization of a single cancel, each recorded with who asked. With
// authentication on, an agent's credential cancels its own agent's requests
// (an agent selector defaults to its own, a session selector is narrowed to
// it) and an admin anyone's.
func (s *Server) cancelMany(w http.ResponseWriter, r *http.Request) {
	var body cancelsBody
	if !s.readJSON(w, r, &body) {
		return
	}
	c := s.caller(r)
	var problems []string
	switch {
	case len(body.IDs) > 0 && (body.Agent != "" || body.Session != ""):
		problems = append(problems, `want "ids", or "agent" and/or "session", not both`)
	case len(body.IDs) > MaxBatch:
		problems = append(problems, fmt.Sprintf("ids: %d ids, at most %d", len(body.IDs), MaxBatch))
	case len(body.IDs) == 0 && body.Agent == "" && body.Session == "" && c.all():
		problems = append(problems, `want "agent" (every pending request of an agent), "session" (of a session), or "ids"`)
	}
	for field, v := range map[string]string{"agent": body.Agent, "session": body.Session, "by": body.By} {
		if v != "" {
			if err := events.CheckToken(field, v); err != nil {
				problems = append(problems, err.Error())
			}
		}
	}
	if err := (&events.Cancel{Reason: body.Reason}).Validate(); err != nil {
		problems = append(problems, err.Error())
	}
	if len(problems) > 0 {
		writeError(w, http.StatusBadRequest, "invalid_request", fmt.Sprint(problems))
		return
	}
	if !c.all() {
		switch {
		case c.Agent == "":
			writeError(w, http.StatusForbidden, "agent_mismatch", "only an agent's credential (its own requests) or an admin cancels; an approver denies instead (docs/web.md)")
			return
		case body.Agent != "" && body.Agent != c.Agent:
			writeError(w, http.StatusForbidden, "agent_mismatch", fmt.Sprintf("this credential cancels agent %q's requests, not %q's; nothing was changed", c.Agent, body.Agent))
			return
		case len(body.IDs) == 0:
			body.Agent = c.Agent
		}
	}
	ids := body.IDs
	if len(ids) == 0 {
		f := broker.Filter{State: broker.StatePending, Agent: body.Agent, Session: body.Session, Limit: MaxBatch}
		for {
			page, err := s.b.List(r.Context(), f)
			if err != nil {
				s.fail(w, err)
				return
			}
			for _, rec := range page.Records {
				ids = append(ids, rec.ID)
			}
			if page.Next == "" {
				break
			}
			f.After = page.Next
		}
	}
	results := make([]Result, 0, len(ids))
	cancelled := 0
	for _, id := range ids {
		res := Result{ID: id}
		rec, err := s.cancelOne(r, c, id, body.By, body.Reason)
		switch {
		case err != nil:
			res.HTTP, res.Status = errorStatus(err)
			res.Message = err.Error()
			var refused *refusal
			if errors.As(err, &refused) {
				res.HTTP, res.Status = http.StatusForbidden, refused.code
			}
		default:
			a := s.approval(rec)
			res.HTTP, res.Status, res.Approval, res.State = http.StatusOK, "cancelled", &a, rec.State
			cancelled++
		}
		results = append(results, res)
	}
	writeJSON(w, http.StatusOK, map[string]any{"results": results, "cancelled": cancelled, "total": len(results)})
}

// cancelOne cancels request id for c, as a single cancel would.
func (s *Server) cancelOne(r *http.Request, c caller, id, by, reason string) (broker.Record, error) {
	if !events.ValidToken(id) {
		return broker.Record{}, fmt.Errorf("%w: %q", broker.ErrNotFound, id)
	}
	if c.open {
		if by == "" {
			by = "http/" + clientName(r)
		}
	} else {
		rec, err := s.b.Get(r.Context(), id)
		if err != nil {
			return rec, err
		}
		if by, err = s.canceller(c, rec, by); err != nil {
			return broker.Record{}, err
		}
	}
	return s.b.Cancel(r.Context(), id, by, reason)
}

// refusal is a 403 with its code: what a caller may not do.
type refusal struct{ code, msg string }

func (e *refusal) Error() string { return e.code + ": " + e.msg }
