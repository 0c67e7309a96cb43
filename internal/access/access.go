// Package access decides who sees what (docs/web.md, "Who sees what"), for
// the HTTP API and the web UI's pages alike. Reading a request, following
// its events and revoking a remembered choice are permissions like answering
// it: with authentication on, an agent's credential sees its own agent's
// requests; a principal sees what it may answer, has answered, or was asked
// on behalf of; an admin sees everything. Without authentication (loopback
// only) everyone is everyone.
package access

import (
	"context"
	"slices"
	"strings"

	"github.com/assent-dev/assent/internal/broker"
	"github.com/assent-dev/assent/internal/recent"
	"github.com/assent-dev/assent/pkg/events"
	"github.com/assent-dev/assent/pkg/policy"
)

// Broker is what the decisions read of the broker.
type Broker interface {
	Get(ctx context.Context, id string) (broker.Record, error)
	List(ctx context.Context, f broker.Filter) (broker.Page, error)
	Eligible(r broker.Record, principal string) error
	// Policy is the policy in force.
	Policy() *policy.Policy
}

// Caller is who reads, as the authentication established it.
type Caller struct {
	// Principal is who answers are made as; "" if the credential names none.
	Principal string
	// Agent is the agent the credential asks for; "" for none.
	Agent string
	// Admin sees every request and may revoke every remembered choice.
	Admin bool
	// Open: authentication is off, and every caller sees everything.
	Open bool
}

// All reports whether c sees every request.
func (c Caller) All() bool { return c.Open || c.Admin }

// AgentOnly reports whether c sees its own agent's requests and nothing
// else: a listing by agent then finds all it may see, without a look at each
// request.
func (c Caller) AgentOnly() bool { return !c.All() && c.Principal == "" }

// Sees reports whether c may read rec.
func Sees(b Broker, c Caller, rec broker.Record) bool {
	switch {
	case c.All():
		return true
	case c.Agent != "" && rec.Request.Agent == c.Agent:
		return true
	case c.Principal == "":
		return false
	case rec.Request.User == c.Principal:
		return true // asked on their behalf (self-approval aside)
	case Answered(rec, c.Principal):
		return true
	case !ForPeople(b, rec):
		return false // the policy decided it: nobody was asked
	}
	return b.Eligible(rec, c.Principal) == nil
}

// ForPeople reports whether rec went to people to answer: its rule is an
// approval rule, or it fell to the manual mode. One an allow or deny rule or
// an automatic mode decided was nobody's to answer.
func ForPeople(b Broker, rec broker.Record) bool {
	if mode, ok := strings.CutPrefix(rec.Rule, "mode:"); ok {
		return policy.Mode(mode) == policy.ModeManual
	}
	if p := b.Policy(); p != nil {
		for _, r := range p.Rules {
			if r.Name == rec.Rule {
				return r.Action == policy.RequireApproval
			}
		}
	}
	return true // a rule gone since: as the broker judges answers to it
}

// Answered reports whether principal voted on rec or took part in its
// decision.
func Answered(rec broker.Record, principal string) bool {
	took := func(d events.DecidedBy) bool { return d.Principal == principal }
	return slices.ContainsFunc(rec.Votes, took) || rec.Decision != nil && slices.ContainsFunc(rec.Decision.DecidedBy, took)
}

// MayRevoke reports whether c may revoke (and so see) remembered choice g:
// an admin, or a principal the policy lets answer g's rule, who could have
// made it.
func MayRevoke(b Broker, c Caller, g policy.Grant) bool {
	if c.All() {
		return true
	}
	if c.Principal == "" {
		return false
	}
	rec := broker.Record{ID: g.RequestID, Rule: g.Rule, Request: events.Requested{Tool: g.Tool, Args: []byte(`{}`)}}
	return b.Eligible(rec, c.Principal) == nil
}

// Revocable returns the remembered choices among grants that c may revoke.
func Revocable(b Broker, c Caller, grants []policy.Grant) []policy.Grant {
	out := []policy.Grant{}
	for _, g := range grants {
		if MayRevoke(b, c, g) {
			out = append(out, g)
		}
	}
	return out
}

// Visibility remembers, for one listing or one event stream, whether its
// caller sees each request, so that a request's many events cost one look.
type Visibility struct {
	b     Broker
	c     Caller
	known *recent.Map[bool]
}

// NewVisibility returns c's view of the events of b's requests.
func NewVisibility(b Broker, c Caller) *Visibility {
	return &Visibility{b: b, c: c, known: recent.New[bool](10_000)}
}

// Event reports whether the caller sees e: events of requests it sees.
func (v *Visibility) Event(ctx context.Context, e *broker.Event) bool {
	switch {
	case v.c.All():
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
	rec, err := v.b.Get(ctx, e.RequestID)
	if err != nil {
		return false // not stored yet, or gone: not cached, a later event looks again
	}
	ok := Sees(v.b, v.c, rec)
	v.known.Put(e.RequestID, ok)
	return ok
}

// ListScan bounds the requests one listing looks at for a caller who sees
// only some of them (a principal): a page holds fewer than its limit, and
// total is a lower bound, when the scan stops there.
const ListScan = 10_000

// List lists the requests matching f that c sees. An agent-only caller's
// listing is narrowed to its agent (a filter naming another agent finds
// nothing); a principal's is filtered request by request, and its total
// counts what it sees among the first ListScan matches.
func List(ctx context.Context, b Broker, c Caller, f broker.Filter) (broker.Page, error) {
	if c.All() {
		return b.List(ctx, f)
	}
	if c.AgentOnly() {
		if c.Agent == "" || f.Agent != "" && f.Agent != c.Agent {
			return broker.Page{Records: []broker.Record{}}, nil
		}
		f.Agent = c.Agent
		return b.List(ctx, f)
	}
	limit := f.Limit
	out := broker.Page{Records: []broker.Record{}}
	full := false
	f.Limit = 500
	for scanned := 0; scanned < ListScan; {
		page, err := b.List(ctx, f)
		if err != nil {
			return broker.Page{}, err
		}
		for _, rec := range page.Records {
			if !Sees(b, c, rec) {
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
