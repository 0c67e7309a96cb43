package httpapi

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/assent-dev/assent/internal/broker"
	"github.com/assent-dev/assent/internal/recent"
	"github.com/assent-dev/assent/pkg/events"
	"github.com/assent-dev/assent/pkg/policy"
)

// Who sees what (docs/web.md, "Who sees what"). Reading a request, following
// its events and revoking a remembered choice are permissions like answering
// it: with authentication on, an agent's credential sees its own agent's
// requests; a principal sees what it may answer, has answered, or was asked
// on behalf of; an admin sees everything. Without authentication (loopback
// only) everyone is everyone.

// caller is who calls, as the gateway authorizes it.
type caller struct {
	Identity
	// open: authentication is off, and every caller sees everything.
	open bool
}

// caller returns who calls r.
func (s *Server) caller(r *http.Request) caller {
	if s.cfg.Identify == nil {
		return caller{open: true}
	}
	id, _ := s.cfg.Identify(r)
	return caller{Identity: id}
}

// all reports whether c sees every request.
func (c caller) all() bool { return c.open || c.Admin }

// agentOnly reports whether c sees its own agent's requests and nothing
// else: a listing by agent then finds all it may see, without a look at each
// request.
func (c caller) agentOnly() bool { return !c.all() && c.Principal == "" }

// sees reports whether c may read rec.
func (s *Server) sees(c caller, rec broker.Record) bool {
	switch {
	case c.all():
		return true
	case c.Agent != "" && rec.Request.Agent == c.Agent:
		return true
	case c.Principal == "":
		return false
	case rec.Request.User == c.Principal:
		return true // asked on their behalf (self-approval aside)
	case answered(rec, c.Principal):
		return true
	case !s.forPeople(rec):
		return false // the policy decided it: nobody was asked
	}
	return s.b.Eligible(rec, c.Principal) == nil
}

// forPeople reports whether rec went to people to answer: its rule is an
// approval rule, or it fell to the manual mode. One an allow or deny rule or
// an automatic mode decided was nobody's to answer.
func (s *Server) forPeople(rec broker.Record) bool {
	if mode, ok := strings.CutPrefix(rec.Rule, "mode:"); ok {
		return policy.Mode(mode) == policy.ModeManual
	}
	if p := s.b.Policy(); p != nil {
		for _, r := range p.Rules {
			if r.Name == rec.Rule {
				return r.Action == policy.RequireApproval
			}
		}
	}
	return true // a rule gone since: as the broker judges answers to it
}

// answered reports whether principal voted on rec or took part in its
// decision.
func answered(rec broker.Record, principal string) bool {
	took := func(d events.DecidedBy) bool { return d.Principal == principal }
	return slices.ContainsFunc(rec.Votes, took) || rec.Decision != nil && slices.ContainsFunc(rec.Decision.DecidedBy, took)
}

// mayRevoke reports whether c may revoke (and so see) remembered choice g:
// an admin, or a principal the policy lets answer g's rule, who could have
// made it.
func (s *Server) mayRevoke(c caller, g policy.Grant) bool {
	if c.all() {
		return true
	}
	if c.Principal == "" {
		return false
	}
	rec := broker.Record{ID: g.RequestID, Rule: g.Rule, Request: events.Requested{Tool: g.Tool, Args: []byte(`{}`)}}
	return s.b.Eligible(rec, c.Principal) == nil
}

// agentScope narrows an agent-only caller's agent filter to its own agent:
// asking for another agent's is 403 agent_mismatch. It returns the agents to
// filter by (nil: any) and false when it wrote the error.
func agentScope(w http.ResponseWriter, c caller, asked []string) ([]string, bool) {
	if !c.agentOnly() {
		return asked, true
	}
	for _, a := range asked {
		if a != c.Agent {
			writeError(w, http.StatusForbidden, "agent_mismatch", fmt.Sprintf("this credential reads agent %q's requests, not %q's (docs/web.md, \"Who sees what\")", c.Agent, a))
			return nil, false
		}
	}
	if c.Agent == "" {
		writeError(w, http.StatusForbidden, "no_principal", "this credential names neither a principal nor an agent, so it sees no request")
		return nil, false
	}
	return []string{c.Agent}, true
}

// visibility remembers, for one listing or one event stream, whether its
// caller sees each request, so that a request's many events cost one look.
type visibility struct {
	s     *Server
	c     caller
	known *recent.Map[bool]
}

func (s *Server) visibility(c caller) *visibility {
	return &visibility{s: s, c: c, known: recent.New[bool](10_000)}
}

// event reports whether the caller sees e: events of requests it sees.
func (v *visibility) event(ctx context.Context, e *broker.Event) bool {
	switch {
	case v.c.all():
		return true
	case e.RequestID == "":
		return false
	case v.c.Agent != "" && e.Agent == v.c.Agent:
		return true
	case v.c.Principal == "":
		return false
	}
	if ok, found := v.known.Get(e.RequestID); found && ok {
		return true
	}
	// An answer of the caller's own shows it answered, whatever its rule.
	if e.Type == events.TypeResponded {
		if sub, err := events.ParseSubject(e.Subject); err == nil && sub.Principal == v.c.Principal {
			v.known.Put(e.RequestID, true)
			return true
		}
	}
	if ok, found := v.known.Get(e.RequestID); found {
		return ok
	}
	rec, err := v.s.b.Get(ctx, e.RequestID)
	if err != nil {
		return false // not stored yet, or gone: not cached, a later event looks again
	}
	ok := v.s.sees(v.c, rec)
	v.known.Put(e.RequestID, ok)
	return ok
}

// listScan bounds the requests one listing looks at for a caller who sees
// only some of them (a principal): a page holds fewer than its limit, and
// total is a lower bound, when the scan stops there.
const listScan = 10_000

// listFor lists the requests matching f that c sees. An agent-only caller's
// filter names its agent already; a principal's listing is filtered request
// by request, and its total counts what it sees among the first listScan
// matches.
func (s *Server) listFor(ctx context.Context, c caller, f broker.Filter) (broker.Page, error) {
	if c.all() || c.agentOnly() {
		return s.b.List(ctx, f)
	}
	limit := f.Limit
	out := broker.Page{Records: []broker.Record{}}
	full := false
	f.Limit = 500
	for scanned := 0; scanned < listScan; {
		page, err := s.b.List(ctx, f)
		if err != nil {
			return broker.Page{}, err
		}
		for _, rec := range page.Records {
			if !s.sees(c, rec) {
				continue
			}
			out.Total++
			if full {
				continue
			}
			out.Records = append(out.Records, rec)
			if len(out.Records) == limit {
				full, out.Next = true, rec.ID
			}
		}
		scanned += max(len(page.Records), 1)
		if page.Next == "" {
			if full && out.Total == len(out.Records) {
				out.Next = "" // nothing more to see
			}
			return out, nil
		}
		f.After = page.Next
		if !full {
			out.Next = page.Next
		}
	}
	return out, nil
}
