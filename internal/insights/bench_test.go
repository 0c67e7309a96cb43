package insights

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/assent-dev/assent/pkg/events"
)

// The benchmarks' record: requests spread evenly over 30 days, by 20
// agents, for 50 tools, answered by 10 approvers, each drawn with a skew
// (some far more often than others, as in a real installation). Of the
// requests, 60% are decided by the policy at once (55% approved, 5%
// denied); the others are announced and approved by people (30%), denied
// (5%), left to expire (4%) or cancelled (1%), after a log-normal time
// with a median of 20 s; 1 in 20 approvals edits the args, 1 in 50
// requests has a shadow disagreement.
const (
	synthDays      = 30
	synthTools     = 50
	synthAgents    = 20
	synthApprovers = 10
)

// synth is one synthetic request.
type synth struct {
	id, agent, tool, rule, approver string
	args                            string
	at, decided                     time.Time
	outcome                         events.Outcome
	auto, edited, shadow, detail    bool
	shown                           time.Time
}

// synthesize returns n requests in the order of their decisions, the last
// decided before end.
func synthesize(n int, end time.Time, seed uint64) []synth {
	rng := rand.New(rand.NewPCG(seed, 1))
	zipf := func(k int) int { return int(float64(k) * math.Pow(rng.Float64(), 2.5)) }
	start := end.Add(-synthDays * 24 * time.Hour)
	step := time.Duration(int64(synthDays*24*time.Hour) / int64(n))
	out := make([]synth, n)
	for i := range out {
		s := &out[i]
		tool := zipf(synthTools)
		s.id = fmt.Sprintf("0193a5b2-7c1e-7d3a-9f1e-%012d", i) // as long as a UUIDv7
		s.tool = fmt.Sprintf("tool-%02d", tool)
		s.agent = fmt.Sprintf("agent-%02d", zipf(synthAgents))
		s.rule = fmt.Sprintf("rule-%d", tool%8)
		s.approver = fmt.Sprintf("approver-%d", zipf(synthApprovers))
		s.args = fmt.Sprintf(`{"path":"/srv/%s/%d","count":%d}`, s.tool, rng.IntN(100), rng.IntN(10))
		s.at = start.Add(time.Duration(i) * step)
		s.decided = s.at
		switch u := rng.Float64(); {
		case u < 0.55:
			s.outcome, s.auto = events.Approved, true
		case u < 0.60:
			s.outcome, s.auto = events.Denied, true
		case u < 0.90:
			s.outcome = events.Approved
		case u < 0.95:
			s.outcome = events.Denied
		case u < 0.99:
			s.outcome = events.Expired
		default:
			s.outcome = events.Cancelled
		}
		if !s.auto {
			s.decided = s.at.Add(time.Duration(math.Exp(rng.NormFloat64()+3) * float64(time.Second)))
			s.shown = s.at.Add(time.Duration(rng.IntN(5000)) * time.Millisecond)
			s.detail = rng.IntN(3) == 0
			s.edited = s.outcome == events.Approved && rng.IntN(20) == 0
		}
		s.shadow = rng.IntN(50) == 0
	}
	return out
}

// messages returns s as the stored messages of the stream, without
// sequences and times (for Add).
func (s *synth) messages(tb testing.TB) []*jetstream.RawStreamMsg {
	var out []*jetstream.RawStreamMsg
	msg := func(subject, typ, id string, at time.Time, data any) {
		e, err := events.New(typ, id, "bench", data)
		if err != nil {
			tb.Fatal(err)
		}
		h, body, err := events.Encode(&e)
		if err != nil {
			tb.Fatal(err)
		}
		out = append(out, &jetstream.RawStreamMsg{Subject: subject, Header: nats.Header(h), Data: body, Time: at})
	}
	req := events.Requested{Tool: s.tool, Agent: s.agent, Args: json.RawMessage(s.args)}
	msg(events.RequestPrefix+s.agent, events.TypeRequested, s.id, s.at, req)
	if s.shadow {
		msg(events.ShadowPrefix+s.id, events.TypeShadowDisagreement, "", s.at, events.ShadowDisagreement{RequestID: s.id, Tool: s.tool, Agent: s.agent, Live: "allow by " + s.rule, Shadow: "deny by strict"})
	}
	d := events.Decided{RequestID: s.id, Outcome: s.outcome, Auto: s.auto, Rule: s.rule, DecidedAt: s.decided}
	if !s.auto {
		msg(events.PendingPrefix+s.agent, events.TypePending, "", s.at, events.Pending{RequestID: s.id, Request: req, Rule: s.rule, Deadline: s.at.Add(time.Hour)})
		if s.outcome == events.Approved || s.outcome == events.Denied {
			v := events.Approve
			if s.outcome == events.Denied {
				v = events.Deny
			}
			resp := events.Responded{Decision: v, ShownAt: s.shown, Detail: s.detail}
			if s.edited {
				resp.Args = json.RawMessage(`{"path":"/srv/safe","count":1}`)
				d.Args, d.Edited = resp.Args, true
			}
			msg(events.ResponsePrefix+s.approver+"."+s.id, events.TypeResponded, "", s.decided, resp)
			d.DecidedBy = []events.DecidedBy{{Principal: s.approver, Decision: v, At: s.decided}}
		}
	}
	msg(events.DecisionPrefix+s.id, events.TypeDecided, "", s.decided, d)
	return out
}

// feed folds s into a without encoding and decoding its messages: what
// Add does once it has read them.
func (s *synth) feed(a *Aggregator, seq *uint64) {
	step := func(at time.Time, apply func()) {
		*seq++
		a.mu.Lock()
		if a.first == 0 {
			a.first = *seq
		}
		a.tick(at.UnixNano())
		apply()
		a.through.Store(*seq)
		a.mu.Unlock()
	}
	step(s.at, func() { a.request(requestMsg{id: s.id, tool: s.tool}, s.agent, *seq) })
	if s.shadow {
		sh := shadowMsg{id: s.id, tool: s.tool, agent: s.agent, live: "allow by " + s.rule, shadow: "deny by strict"}
		step(s.at, func() { a.shadow(&sh, s.at.UnixNano()) })
	}
	d := decisionMsg{id: s.id, outcome: s.outcome, auto: s.auto, rule: s.rule, decidedAt: s.decided}
	if !s.auto {
		p := pendingMsg{id: s.id, tool: s.tool, agent: s.agent, rule: s.rule}
		p.args, p.digest, p.hasArgs = summarize(json.RawMessage(s.args))
		vals := a.values(p.args)
		step(s.at, func() { a.pending(&p, vals, s.at.UnixNano()) })
		if s.outcome == events.Approved || s.outcome == events.Denied {
			v := events.Approve
			if s.outcome == events.Denied {
				v = events.Deny
			}
			m := answerMsg{principal: s.approver, id: s.id, shown: s.shown, detail: s.detail}
			step(s.decided, func() { a.answer(&m, s.decided.UnixNano()) })
			d.by = []events.DecidedBy{{Principal: s.approver, Decision: v, At: s.decided}}
			if s.edited {
				d.edited = true
				d.args, _, _ = summarize(json.RawMessage(`{"path":"/srv/safe","count":1}`))
			}
		}
	}
	step(s.decided, func() { a.decision(&d, s.decided.UnixNano()) })
}

var benchEnd = time.Date(2030, 3, 1, 0, 0, 0, 0, time.UTC)

// million is an aggregator that has read a million synthetic requests, made
// once for all the benchmarks that query it.
var million = sync.OnceValues(func() (*Aggregator, uint64) {
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	reqs := synthesize(1_000_000, benchEnd, 42)
	a, err := New(Config{})
	if err != nil {
		panic(err)
	}
	var seq uint64
	for i := range reqs {
		reqs[i].feed(a, &seq)
	}
	a.MarkCaughtUp()
	reqs = nil
	runtime.GC()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	return a, after.HeapAlloc - min(before.HeapAlloc, after.HeapAlloc)
})

// BenchmarkQuery: a 30-day report over a million requests, without a
// filter and with each kind of filter.
func BenchmarkQuery(b *testing.B) {
	a, heap := million()
	s := a.Stats()
	b.Logf("a million requests: %.1f MiB held (%.0f bytes a request); %+v", float64(heap)/(1<<20), float64(heap)/1e6, s)
	for _, tc := range []struct {
		name string
		f    Filter
	}{
		{"all", Filter{}},
		{"tool", Filter{Tool: "tool-03"}},
		{"agent", Filter{Agent: "agent-01"}},
		{"rule", Filter{Rule: "rule-2"}},
		{"approver", Filter{Approver: "approver-1"}},
		{"day", Filter{Since: benchEnd.Add(-24 * time.Hour)}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			b.ReportAllocs()
			var rep Report
			for b.Loop() {
				rep = a.Query(tc.f, benchEnd)
			}
			b.ReportMetric(float64(rep.Totals.Total()), "decisions")
			b.ReportMetric(float64(heap)/1e6, "heap-B/request")
		})
	}
}

// BenchmarkHistory: the history of a request being announced.
func BenchmarkHistory(b *testing.B) {
	a, _ := million()
	digest, _ := events.ArgsDigest(json.RawMessage(`{"path":"/srv/tool-00/1","count":1}`))
	b.ReportAllocs()
	for b.Loop() {
		a.History("tool-00", "agent-00", digest, benchEnd)
	}
}

// BenchmarkAdd: reading stored messages, per message, into an aggregator
// that holds a day of the synthetic record.
func BenchmarkAdd(b *testing.B) {
	const pool = 20_000
	reqs := synthesize(pool, benchEnd, 7)
	var msgs []*jetstream.RawStreamMsg
	for i := range reqs {
		msgs = append(msgs, reqs[i].messages(b)...)
	}
	perRequest := float64(len(msgs)) / pool
	var a *Aggregator
	var seq uint64
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		if i%len(msgs) == 0 {
			// The record's ids are used up: read them again into a new
			// aggregator.
			b.StopTimer()
			a, _ = New(Config{})
			seq = 0
			b.StartTimer()
		}
		m := *msgs[i%len(msgs)]
		seq++
		m.Sequence = seq
		a.Add(&m)
	}
	b.ReportMetric(perRequest, "msgs/request")
}
