package insights_test

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/assent-dev/assent/internal/broker"
	"github.com/assent-dev/assent/internal/brokertest"
	"github.com/assent-dev/assent/internal/insights"
	"github.com/assent-dev/assent/internal/testenv"
	"github.com/assent-dev/assent/pkg/events"
	"github.com/assent-dev/assent/pkg/policy"
)

const livePolicy = `version: 1
principals:
  alice: {roles: [ops]}
  bob: {roles: [ops]}
rules:
  - name: reads
    tools: ["read_*"]
    action: allow
  - name: no-drops
    tools: [drop_table]
    action: deny
  - name: deletes
    tools: [delete_file]
    action: require_approval
    approvers: ["role:ops"]
    timeout: 5m
  - name: quick
    tools: [quick]
    action: require_approval
    approvers: ["role:ops"]
    timeout: 1s
`

// The shadow policy would allow what the live one denies, and agrees on
// the rest.
const shadowPolicy = `version: 1
principals:
  alice: {roles: [ops]}
  bob: {roles: [ops]}
rules:
  - name: reads
    tools: ["read_*"]
    action: allow
  - name: shadow-drops
    tools: [drop_table]
    action: allow
  - name: deletes
    tools: [delete_file]
    action: require_approval
    approvers: ["role:ops"]
    timeout: 5m
  - name: quick
    tools: [quick]
    action: require_approval
    approvers: ["role:ops"]
    timeout: 1s
`

func mustPolicy(t *testing.T, src, name string) *policy.Policy {
	t.Helper()
	p, err := policy.Parse([]byte(src), name)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// answered is one request of the history that people answered.
type answered struct {
	id, agent, principal string
	v                    events.Verdict
	args                 string // asked
	edit                 string // the approver's edit, if any
	shown                time.Duration
	detail               bool
}

// TestBrokerRecord drives a real broker through a known history (automatic
// decisions, answers fast and slow, with and without a look, an edit, a
// denial, an expiry, a cancel, a shadow disagreement) and checks every
// number of its report, and the history in the next pending event, against
// the record.
func TestBrokerRecord(t *testing.T) {
	ns := testenv.Server(t)
	nc := testenv.Conn(t, ns)
	b, _ := brokertest.Run(t, nc, broker.Config{Policy: mustPolicy(t, livePolicy, "live.yaml"), Shadow: mustPolicy(t, shadowPolicy, "shadow.yaml")})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	stream, err := js.Stream(ctx, events.StreamName)
	if err != nil {
		t.Fatal(err)
	}
	submit := func(agent, tool, args string, want broker.State) string {
		t.Helper()
		req := events.Requested{Agent: agent, Tool: tool}
		if args != "" {
			req.Args = json.RawMessage(args)
		}
		rec, err := b.Submit(ctx, "", "agent/"+agent, req)
		if err != nil || rec.State != want {
			t.Fatalf("submit %s for %s: %s, %v; want %s", tool, agent, rec.State, err, want)
		}
		return rec.ID
	}

	var reads []string
	for range 3 {
		reads = append(reads, submit("fm", "read_file", `{"path":"/etc/motd"}`, broker.StateApproved))
	}
	dropped := submit("db", "drop_table", `{"table":"users"}`, broker.StateDenied)
	story := []answered{
		{id: "d1", agent: "fm", principal: "alice", v: events.Approve, args: `{"path":"/tmp/a"}`, shown: time.Nanosecond},
		{id: "d2", agent: "fm", principal: "alice", v: events.Approve, args: `{"path":"/tmp/a"}`, shown: -time.Hour, detail: true},
		{id: "d3", agent: "fm2", principal: "bob", v: events.Deny, args: `{"path":"/tmp/b"}`},
		{id: "d4", agent: "fm", principal: "bob", v: events.Approve, args: `{"force":true,"path":"/tmp/a"}`, edit: `{"path":"/tmp/b"}`},
		{id: "d6", agent: "fm", principal: "alice", v: events.Approve, args: `{"path":"/tmp/c"}`, shown: time.Nanosecond},
		{id: "d7", agent: "fm", principal: "alice", v: events.Approve, args: `{"path":"/tmp/d"}`},
		{id: "d8", agent: "fm", principal: "bob", v: events.Approve, args: `{"path":"/tmp/e"}`, shown: -time.Minute},
	}
	ids := map[string]string{}
	shownAt := map[string]time.Time{} // by story id, where the channel said
	for i, a := range story {
		id := submit(a.agent, "delete_file", a.args, broker.StatePending)
		ids[a.id] = id
		if i == 3 {
			// One that waits a while before it is answered.
			time.Sleep(2100 * time.Millisecond)
		}
		resp := events.Responded{Decision: a.v, Detail: a.detail, Channel: "test"}
		if a.shown != 0 {
			// Shown now (a nanosecond on) or long ago: what counts as fast
			// is read from the record below.
			resp.ShownAt = time.Now().Add(a.shown).UTC()
			shownAt[a.id] = resp.ShownAt
		}
		if a.edit != "" {
			resp.Args = json.RawMessage(a.edit)
		}
		if _, err := b.Respond(ctx, a.principal, id, resp); err != nil {
			t.Fatalf("%s answers %s: %v", a.principal, a.id, err)
		}
	}
	cancelled := submit("fm", "delete_file", `{"path":"/tmp/x"}`, broker.StatePending)
	if _, err := b.Cancel(ctx, cancelled, "agent/fm", "not needed"); err != nil {
		t.Fatal(err)
	}
	expired := submit("fm", "quick", "", broker.StatePending)
	if rec, err := b.Wait(ctx, expired); err != nil || rec.State != broker.StateExpired {
		t.Fatalf("quick: %s, %v", rec.State, err)
	}

	// What the record says, read from the stream.
	stored := func(seq uint64) time.Time {
		t.Helper()
		m, err := stream.GetMsg(ctx, seq)
		if err != nil {
			t.Fatal(err)
		}
		return m.Time.UTC()
	}
	decision := func(id string) (events.Decided, time.Time) {
		t.Helper()
		m, err := stream.GetMsg(ctx, 1, jetstream.WithGetMsgSubject(events.DecisionPrefix+id))
		if err != nil {
			t.Fatal(err)
		}
		e, err := events.Decode(events.Header(m.Header), m.Data)
		if err != nil {
			t.Fatal(err)
		}
		d, err := events.DecodeDecided(&e)
		if err != nil {
			t.Fatal(err)
		}
		return d, m.Time.UTC()
	}
	decide := map[string][]time.Duration{}
	answer := map[string][]time.Duration{}
	fast := map[string][]string{} // by approver, newest first
	answers := map[string]int{}
	var first, last time.Time
	var examples []string
	lastSeq := uint64(0)
	for _, a := range story {
		d, at := decision(ids[a.id])
		pendingAt := stored(d.Trail[0])
		answerAt := d.DecidedBy[0].At
		decide["deletes"] = append(decide["deletes"], d.DecidedAt.Sub(pendingAt))
		answer[a.principal] = append(answer[a.principal], answerAt.Sub(pendingAt))
		answers[a.principal]++
		shown := pendingAt
		if at, ok := shownAt[a.id]; ok {
			shown = at
		}
		if answerAt.Sub(shown) < insights.RubberStampUnder {
			fast[a.principal] = append([]string{ids[a.id]}, fast[a.principal]...)
		}
		if a.agent == "fm" {
			if first.IsZero() {
				first = at
			}
			last = at
			examples = append([]string{ids[a.id]}, examples...)
		}
		lastSeq = max(lastSeq, d.Trail[len(d.Trail)-1])
	}

	// The aggregator follows the stream: wait until it has read the last
	// decision.
	var rep insights.Report
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if rep, err = b.Insights(ctx, insights.Filter{}); err != nil {
			t.Fatal(err)
		}
		if rep.Complete && rep.Totals.Total() == 13 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the report holds %d decisions, not 13: %+v", rep.Totals.Total(), rep)
		}
	}
	if want := (insights.Counts{Approved: 6, Denied: 1, Expired: 1, Cancelled: 1, AutoApproved: 3, AutoDenied: 1}); rep.Totals != want {
		t.Fatalf("totals %+v, want %+v", rep.Totals, want)
	}
	if rep.Progress != 1 || rep.Through < lastSeq || len(rep.Hours) < 24*30 {
		t.Fatalf("progress %v, through %d (last decision's trigger at %d), %d hours", rep.Progress, rep.Through, lastSeq, len(rep.Hours))
	}
	wantRules := []insights.Latency{
		{Key: "deletes", Decided: 7, P50: quantile(decide["deletes"], 0.5), P90: quantile(decide["deletes"], 0.9)},
		{Key: "quick", Expired: 1},
	}
	if !reflect.DeepEqual(rep.ByRule, wantRules) {
		t.Fatalf("by rule %+v, want %+v", rep.ByRule, wantRules)
	}
	wantApprovers := []insights.Latency{
		{Key: "alice", Decided: 4, P50: quantile(answer["alice"], 0.5), P90: quantile(answer["alice"], 0.9)},
		{Key: "bob", Decided: 3, P50: quantile(answer["bob"], 0.5), P90: quantile(answer["bob"], 0.9)},
	}
	if !reflect.DeepEqual(rep.ByApprover, wantApprovers) {
		t.Fatalf("by approver %+v, want %+v", rep.ByApprover, wantApprovers)
	}
	var wantStamps []insights.RubberStamp
	for _, p := range []string{"alice", "bob"} {
		rs := insights.RubberStamp{Approver: p, Answers: answers[p], Fast: len(fast[p]), Share: float64(len(fast[p])) / float64(answers[p]), Examples: fast[p]}
		wantStamps = append(wantStamps, rs)
	}
	slices.SortStableFunc(wantStamps, func(x, y insights.RubberStamp) int {
		switch {
		case x.Share > y.Share:
			return -1
		case x.Share < y.Share:
			return 1
		}
		return y.Fast - x.Fast
	})
	if !reflect.DeepEqual(rep.RubberStamps, wantStamps) {
		t.Fatalf("rubber stamps %+v, want %+v", rep.RubberStamps, wantStamps)
	}
	ux := rep.Unexamined
	uxExamples := ux.Examples
	ux.Examples = nil
	if want := (insights.Unexamined{Approved: 6, Unedited: 5, Unlooked: 4, Share: 4.0 / 6}); !reflect.DeepEqual(ux, want) || len(uxExamples) != want.Unlooked {
		t.Fatalf("unexamined %+v with examples %v, want %+v with one of each unlooked approval", ux, uxExamples, want)
	}
	if want := []insights.FieldCount{{Field: "force", Count: 1}, {Field: "path", Count: 1}}; !reflect.DeepEqual(rep.EditedFields, want) {
		t.Fatalf("edited fields %+v, want %+v", rep.EditedFields, want)
	}
	if want := []insights.Disagreement{{Live: "deny by no-drops", Shadow: "allow by shadow-drops", Count: 1, Examples: []string{dropped}}}; !reflect.DeepEqual(rep.Disagreements, want) {
		t.Fatalf("disagreements %+v, want %+v", rep.Disagreements, want)
	}
	// Every decision in the hour its decided event was stored in.
	perHour := map[time.Time]int{}
	all := append(slices.Collect(mapValues(ids)), dropped, cancelled, expired)
	for _, id := range append(all, reads...) {
		_, at := decision(id)
		perHour[at.Truncate(time.Hour)]++
	}
	for _, h := range rep.Hours {
		if n := h.Total(); n != perHour[h.Hour] {
			t.Fatalf("hour %s holds %d decisions, the record %d", h.Hour, n, perHour[h.Hour])
		}
	}
	// The candidate: people approved delete_file by fm six times.
	if len(rep.AlwaysDenied) != 0 || len(rep.AlwaysApproved) != 1 {
		t.Fatalf("candidates %+v %+v", rep.AlwaysApproved, rep.AlwaysDenied)
	}
	c := rep.AlwaysApproved[0]
	raw := func(s ...string) []json.RawMessage {
		out := make([]json.RawMessage, len(s))
		for i, v := range s {
			out[i] = json.RawMessage(v)
		}
		return out
	}
	want := insights.Candidate{
		Tool: "delete_file", Agent: "fm", Count: 6, Principals: []string{"alice", "bob"}, First: first, Last: last,
		Args: []insights.ArgPattern{
			{Field: "force", Values: raw("true"), Optional: true},
			{Field: "path", Values: raw(`"/tmp/a"`, `"/tmp/c"`, `"/tmp/d"`, `"/tmp/e"`)},
		},
		Examples: examples[:insights.DayExamples],
	}
	if first.Truncate(24*time.Hour) != last.Truncate(24*time.Hour) {
		want.Examples = c.Examples // the record spans midnight: each day keeps its own
	}
	if !reflect.DeepEqual(c, want) {
		t.Fatalf("candidate %+v, want %+v", c, want)
	}

	// Filters.
	for _, tc := range []struct {
		f    insights.Filter
		want insights.Counts
	}{
		{insights.Filter{Approver: "bob"}, insights.Counts{Approved: 2, Denied: 1}},
		{insights.Filter{Rule: "quick"}, insights.Counts{Expired: 1}},
		{insights.Filter{Tool: "read_file"}, insights.Counts{AutoApproved: 3}},
		{insights.Filter{Agent: "db"}, insights.Counts{AutoDenied: 1}},
		{insights.Filter{Agent: "fm", Tool: "delete_file"}, insights.Counts{Approved: 6, Cancelled: 1}},
	} {
		got, err := b.Insights(ctx, tc.f)
		if err != nil || got.Totals != tc.want {
			t.Fatalf("%+v: %+v, %v; want %+v", tc.f, got.Totals, err, tc.want)
		}
	}
	if _, err := b.Insights(ctx, insights.Filter{Since: time.Now(), Until: time.Now().Add(-time.Hour)}); !errors.Is(err, broker.ErrInvalid) {
		t.Fatalf("since after until: %v", err)
	}

	// The next request like them is announced with their history.
	asked := submit("fm", "delete_file", `{"path":"/tmp/a"}`, broker.StatePending)
	m, err := stream.GetLastMsgForSubject(ctx, events.PendingPrefix+"fm")
	if err != nil {
		t.Fatal(err)
	}
	e, err := events.Decode(events.Header(m.Header), m.Data)
	if err != nil {
		t.Fatal(err)
	}
	p, err := events.DecodePending(&e)
	if err != nil || p.RequestID != asked {
		t.Fatalf("pending %+v, %v; want %s's", p, err, asked)
	}
	wantHistory := &events.History{Window: events.Duration(insights.HistoryWindow), Approved: 6, Exact: 2, Principals: []string{"alice", "bob"}}
	if !reflect.DeepEqual(p.History, wantHistory) {
		t.Fatalf("history %+v, want %+v", p.History, wantHistory)
	}
}

// quantile is what a report reads for the q-quantile of ds.
func quantile(ds []time.Duration, q float64) events.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	rank := int(math.Ceil(q * float64(len(s))))
	return insights.LatencyOf(s[max(rank, 1)-1])
}

func mapValues(m map[string]string) func(func(string) bool) {
	return func(yield func(string) bool) {
		for _, v := range m {
			if !yield(v) {
				return
			}
		}
	}
}
