package insights

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/assent-dev/assent/pkg/events"
)

// record feeds an aggregator a synthetic stream: stored messages with
// increasing sequences, stored at a clock the test moves.
type record struct {
	t   testing.TB
	agg *Aggregator
	seq uint64
	now time.Time
}

// base is when synthetic records start.
var base = time.Date(2030, 1, 7, 10, 0, 0, 0, time.UTC)

func newRecord(t testing.TB, cfg Config) *record {
	t.Helper()
	agg, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &record{t: t, agg: agg, now: base}
}

// store stores an event of typ with id and data on subject, now.
func (r *record) store(subject, typ, id string, data any) uint64 {
	r.t.Helper()
	e, err := events.New(typ, id, "test/insights", data)
	if err != nil {
		r.t.Fatal(err)
	}
	h, body, err := events.Encode(&e)
	if err != nil {
		r.t.Fatal(err)
	}
	return r.raw(subject, nats.Header(h), body)
}

// raw stores a message as it is.
func (r *record) raw(subject string, h nats.Header, body []byte) uint64 {
	r.seq++
	r.agg.Add(&jetstream.RawStreamMsg{Subject: subject, Sequence: r.seq, Header: h, Data: body, Time: r.now})
	return r.seq
}

func (r *record) after(d time.Duration) *record {
	r.now = r.now.Add(d)
	return r
}

// request stores request id of agent for tool with args (JSON, "" none).
func (r *record) request(id, agent, tool, args string) uint64 {
	r.t.Helper()
	req := events.Requested{Tool: tool, Agent: agent}
	if args != "" {
		req.Args = json.RawMessage(args)
	}
	return r.store(events.RequestPrefix+agent, events.TypeRequested, id, req)
}

// pending stores the announcement of request id under rule (and approval
// rule arule).
func (r *record) pending(id, agent, tool, rule, arule, args string) uint64 {
	r.t.Helper()
	p := events.Pending{RequestID: id, Request: events.Requested{Tool: tool, Agent: agent}, Deadline: r.now.Add(time.Hour), Rule: rule, ApprovalRule: arule}
	if args != "" {
		p.Request.Args = json.RawMessage(args)
	}
	return r.store(events.PendingPrefix+agent, events.TypePending, "", p)
}

// asked stores request id and its announcement.
func (r *record) asked(id, agent, tool, rule, args string) {
	r.t.Helper()
	r.request(id, agent, tool, args)
	r.pending(id, agent, tool, rule, "", args)
}

// answer stores principal's answer to id.
func (r *record) answer(principal, id string, resp events.Responded) uint64 {
	r.t.Helper()
	return r.store(events.ResponsePrefix+principal+"."+id, events.TypeResponded, "", resp)
}

// decide stores the decision of id; DecidedAt defaults to now.
func (r *record) decide(id string, d events.Decided) uint64 {
	r.t.Helper()
	d.RequestID = id
	if d.DecidedAt.IsZero() {
		d.DecidedAt = r.now
	}
	return r.store(events.DecisionPrefix+id, events.TypeDecided, "", d)
}

// voted answers id as principal with verdict v and decides it so (not
// automatically), with rule.
func (r *record) voted(principal, id, rule string, v events.Verdict, resp events.Responded) {
	r.t.Helper()
	resp.Decision = v
	r.answer(principal, id, resp)
	out := events.Approved
	if v == events.Deny {
		out = events.Denied
	}
	r.decide(id, events.Decided{Outcome: out, Rule: rule, Edited: resp.Args != nil, Args: resp.Args,
		DecidedBy: []events.DecidedBy{{Principal: principal, Decision: v, At: r.now}}})
}

// auto decides request id at once with outcome by rule.
func (r *record) auto(id, agent, tool, rule string, out events.Outcome) {
	r.t.Helper()
	r.request(id, agent, tool, "")
	r.decide(id, events.Decided{Outcome: out, Rule: rule, Auto: true})
}

func (r *record) shadow(id, tool, agent, live, shadow string) {
	r.t.Helper()
	r.store(events.ShadowPrefix+id, events.TypeShadowDisagreement, "", events.ShadowDisagreement{RequestID: id, Tool: tool, Agent: agent, Live: live, Shadow: shadow})
}

// query returns agg's report of f at now, checking that every hour of the
// window is there and that the hours sum to the totals.
func (r *record) query(f Filter) Report {
	r.t.Helper()
	rep := r.agg.Query(f, r.now)
	var sum Counts
	for i, h := range rep.Hours {
		addAll(&sum, h.Counts)
		if i > 0 && !h.Hour.Equal(rep.Hours[i-1].Hour.Add(time.Hour)) {
			r.t.Fatalf("hour %d is %s, after %s", i, h.Hour, rep.Hours[i-1].Hour)
		}
	}
	if sum != rep.Totals {
		r.t.Fatalf("hours sum to %+v, totals are %+v", sum, rep.Totals)
	}
	return rep
}

// lat is the time a histogram reads for d.
func lat(d time.Duration) events.Duration { return events.Duration(binValue(binOf(d))) }
