package insights

import (
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/assent-dev/assent/pkg/events"
)

// story records one of every kind of decision, at known times, in the hour
// from base.
func story(t *testing.T) *record {
	t.Helper()
	r := newRecord(t, Config{})
	r.auto("r1", "a1", "ls", "reads", events.Approved)
	// r2: announced, approved a second later without a look (fast: no
	// shown_at, so from the announcement).
	r.asked("r2", "a1", "rm", "deletes", `{"path":"/a"}`)
	r.after(time.Second).voted("alice", "r2", "deletes", events.Approve, events.Responded{})
	// r3: shown 29.5 s after its announcement, approved half a second
	// later (fast), with a look at the detail.
	r.asked("r3", "a1", "rm", "deletes", `{"path":"/b"}`)
	r.after(30*time.Second).voted("bob", "r3", "deletes", events.Approve, events.Responded{ShownAt: r.now.Add(-500 * time.Millisecond), Detail: true})
	// r4: denied after 10 s.
	r.asked("r4", "a1", "rm", "deletes", `{"path":"/c"}`)
	r.after(10*time.Second).voted("alice", "r4", "deletes", events.Deny, events.Responded{})
	// r5: approved with an edit after 5 s.
	r.asked("r5", "a2", "rm", "deletes", `{"force":true,"path":"/a"}`)
	r.after(5*time.Second).voted("alice", "r5", "deletes", events.Approve, events.Responded{Args: json.RawMessage(`{"path":"/b"}`)})
	// r6 expires, r7 is cancelled.
	r.asked("r6", "a1", "rm", "deletes", `{"path":"/d"}`)
	r.after(time.Minute).decide("r6", events.Decided{Outcome: events.Expired, Rule: "deletes", Auto: true})
	r.asked("r7", "a1", "rm", "deletes", `{"path":"/e"}`)
	r.after(3*time.Second).decide("r7", events.Decided{Outcome: events.Cancelled, Rule: "deletes", DecidedBy: []events.DecidedBy{{Principal: "agent/a1", At: r.now}}})
	// r8: denied by the policy, which the shadow policy would allow.
	r.request("r8", "a2", "write", "")
	r.shadow("r8", "write", "a2", "deny by no-writes", "allow by writes")
	r.decide("r8", events.Decided{Outcome: events.Denied, Rule: "no-writes", Auto: true})
	// r9: held by a limit for the rule payments, approved after 2 minutes.
	r.request("r9", "a2", "pay", `{"amount":300}`)
	r.pending("r9", "a2", "pay", "limit:budget", "payments", `{"amount":300}`)
	r.after(2*time.Minute).answer("bob", "r9", events.Responded{Decision: events.Approve})
	r.decide("r9", events.Decided{Outcome: events.Approved, Rule: "limit:budget", ApprovalRule: "payments",
		DecidedBy: []events.DecidedBy{{Principal: "bob", Decision: events.Approve, At: r.now}}})
	return r
}

func TestReport(t *testing.T) {
	r := story(t)
	r.agg.MarkCaughtUp()
	rep := r.query(Filter{Since: base, Until: base.Add(2 * time.Hour)})
	want := Counts{Approved: 4, Denied: 1, Expired: 1, Cancelled: 1, AutoApproved: 1, AutoDenied: 1}
	if rep.Totals != want || len(rep.Hours) != 2 || rep.Hours[0].Counts != want || !rep.Hours[0].Hour.Equal(base) {
		t.Fatalf("totals %+v, hours %+v; want %+v in the first of 2 hours", rep.Totals, rep.Hours, want)
	}
	if !rep.Complete || rep.Through != r.seq || rep.Progress != 1 {
		t.Fatalf("complete %v through %d progress %v; want true, %d, 1", rep.Complete, rep.Through, rep.Progress, r.seq)
	}
	wantRules := []Latency{
		{Key: "deletes", Decided: 4, P50: lat(5 * time.Second), P90: lat(30 * time.Second), Expired: 1},
		{Key: "payments", Decided: 1, P50: lat(2 * time.Minute), P90: lat(2 * time.Minute)},
	}
	if !reflect.DeepEqual(rep.ByRule, wantRules) {
		t.Fatalf("by rule %+v, want %+v", rep.ByRule, wantRules)
	}
	// Time to answer, from the announcement: alice 1 s, 10 s, 5 s; bob 30 s
	// and 2 min.
	wantApprovers := []Latency{
		{Key: "alice", Decided: 3, P50: lat(5 * time.Second), P90: lat(10 * time.Second)},
		{Key: "bob", Decided: 2, P50: lat(30 * time.Second), P90: lat(2 * time.Minute)},
	}
	if !reflect.DeepEqual(rep.ByApprover, wantApprovers) {
		t.Fatalf("by approver %+v, want %+v", rep.ByApprover, wantApprovers)
	}
	wantStamps := []RubberStamp{
		{Approver: "bob", Answers: 2, Fast: 1, Share: 0.5, Examples: []string{"r3"}},
		{Approver: "alice", Answers: 3, Fast: 1, Share: 1.0 / 3, Examples: []string{"r2"}},
	}
	if !reflect.DeepEqual(rep.RubberStamps, wantStamps) {
		t.Fatalf("rubber stamps %+v, want %+v", rep.RubberStamps, wantStamps)
	}
	if want := (Unexamined{Approved: 4, Unedited: 3, Unlooked: 2, Share: 0.5}); !sameUnexamined(rep.Unexamined, want) {
		t.Fatalf("unexamined %+v, want %+v with an example of each unlooked approval", rep.Unexamined, want)
	}
	if want := []FieldCount{{"force", 1}, {"path", 1}}; !reflect.DeepEqual(rep.EditedFields, want) {
		t.Fatalf("edited fields %+v, want %+v", rep.EditedFields, want)
	}
	if want := []Disagreement{{Live: "deny by no-writes", Shadow: "allow by writes", Count: 1, Examples: []string{"r8"}}}; !reflect.DeepEqual(rep.Disagreements, want) {
		t.Fatalf("disagreements %+v, want %+v", rep.Disagreements, want)
	}
	if len(rep.AlwaysApproved)+len(rep.AlwaysDenied) != 0 {
		t.Fatalf("candidates from too little evidence: %+v %+v", rep.AlwaysApproved, rep.AlwaysDenied)
	}
}

func TestFilters(t *testing.T) {
	r := story(t)
	window := Filter{Since: base, Until: base.Add(time.Hour)}
	for _, tc := range []struct {
		name string
		f    func(*Filter)
		want Counts
	}{
		{"agent", func(f *Filter) { f.Agent = "a2" }, Counts{Approved: 2, AutoDenied: 1}},
		{"tool", func(f *Filter) { f.Tool = "rm" }, Counts{Approved: 3, Denied: 1, Expired: 1, Cancelled: 1}},
		{"tool and agent", func(f *Filter) { f.Tool, f.Agent = "rm", "a2" }, Counts{Approved: 1}},
		{"rule", func(f *Filter) { f.Rule = "deletes" }, Counts{Approved: 3, Denied: 1, Expired: 1, Cancelled: 1}},
		{"approval rule", func(f *Filter) { f.Rule = "payments" }, Counts{Approved: 1}},
		{"limit", func(f *Filter) { f.Rule = "limit:budget" }, Counts{Approved: 1}},
		{"approver", func(f *Filter) { f.Approver = "alice" }, Counts{Approved: 2, Denied: 1}},
		{"approver and agent", func(f *Filter) { f.Approver, f.Agent = "alice", "a2" }, Counts{Approved: 1}},
		{"approver and rule", func(f *Filter) { f.Approver, f.Rule = "bob", "payments" }, Counts{Approved: 1}},
		{"unknown agent", func(f *Filter) { f.Agent = "nobody" }, Counts{}},
		{"unknown approver", func(f *Filter) { f.Approver = "nobody" }, Counts{}},
		{"canceller is no approver", func(f *Filter) { f.Approver = "agent/a1" }, Counts{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := window
			tc.f(&f)
			rep := r.query(f)
			if rep.Totals != tc.want || len(rep.Hours) != 1 {
				t.Fatalf("totals %+v over %d hours, want %+v over 1", rep.Totals, len(rep.Hours), tc.want)
			}
		})
	}
	// What an approver's filter selects is the requests they answered.
	rep := r.query(Filter{Since: base, Until: base.Add(time.Hour), Approver: "alice"})
	if len(rep.ByApprover) != 1 || rep.ByApprover[0].Key != "alice" || rep.ByApprover[0].Decided != 3 ||
		len(rep.ByRule) != 1 || rep.ByRule[0].Decided != 3 || rep.ByRule[0].Expired != 0 ||
		!sameUnexamined(rep.Unexamined, Unexamined{Approved: 2, Unedited: 1, Unlooked: 1, Share: 0.5}) ||
		len(rep.RubberStamps) != 1 || rep.RubberStamps[0].Fast != 1 || len(rep.EditedFields) != 2 {
		t.Fatalf("alice's report: %+v", rep)
	}
	rep = r.query(Filter{Since: base, Until: base.Add(time.Hour), Agent: "a1"})
	if len(rep.Disagreements) != 0 || len(rep.EditedFields) != 0 || len(rep.RubberStamps) != 2 || rep.RubberStamps[1].Examples[0] != "r2" {
		t.Fatalf("a1's report: %+v", rep)
	}
}

func TestHourBoundaries(t *testing.T) {
	r := newRecord(t, Config{})
	r.now = base.Add(-time.Nanosecond) // 09:59:59.999999999
	r.auto("early", "a", "t", "r", events.Approved)
	r.now = base // 10:00
	r.auto("on-the-hour", "a", "t", "r", events.Denied)
	r.now = base.Add(time.Hour - time.Nanosecond)
	r.auto("late", "a", "t", "r", events.Approved)
	r.now = base.Add(time.Hour)
	r.auto("next", "a", "t", "r", events.Approved)
	for _, tc := range []struct {
		name         string
		since, until time.Time
		want         Counts
		hours        int
		first        time.Time
	}{
		{"one hour", base, base.Add(time.Hour), Counts{AutoApproved: 1, AutoDenied: 1}, 1, base},
		{"since within an hour counts all of it", base.Add(30 * time.Minute), base.Add(time.Hour), Counts{AutoApproved: 1, AutoDenied: 1}, 1, base},
		{"until within an hour counts all of it", base.Add(-time.Hour), base.Add(time.Minute), Counts{AutoApproved: 2, AutoDenied: 1}, 2, base.Add(-time.Hour)},
		{"until on the hour leaves it out", base.Add(-time.Hour), base, Counts{AutoApproved: 1}, 1, base.Add(-time.Hour)},
		{"three hours", base.Add(-time.Hour), base.Add(2 * time.Hour), Counts{AutoApproved: 3, AutoDenied: 1}, 3, base.Add(-time.Hour)},
		{"empty", base, base, Counts{}, 0, base},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rep := r.query(Filter{Since: tc.since, Until: tc.until})
			if rep.Totals != tc.want || len(rep.Hours) != tc.hours || !rep.Since.Equal(tc.first) || !rep.Until.Equal(tc.until) {
				t.Fatalf("totals %+v over %d hours from %s to %s, want %+v over %d from %s to %s", rep.Totals, len(rep.Hours), rep.Since, rep.Until, tc.want, tc.hours, tc.first, tc.until)
			}
		})
	}
	// The default window: the 30 days to now, every hour of them.
	r.now = base.Add(time.Hour + time.Minute)
	rep := r.query(Filter{})
	if len(rep.Hours) != 24*30+1 || rep.Totals.Total() != 4 || !rep.Until.Equal(r.now) {
		t.Fatalf("default window: %d hours, %d decisions, until %s", len(rep.Hours), rep.Totals.Total(), rep.Until)
	}
}

func TestWindow(t *testing.T) {
	now := base
	for _, tc := range []struct {
		name         string
		f            Filter
		since, until time.Time
		bad          string
	}{
		{"defaults", Filter{}, now.Add(-DefaultWindow), now, ""},
		{"since only", Filter{Since: now.Add(-time.Hour)}, now.Add(-time.Hour), now, ""},
		{"until only", Filter{Until: now.Add(-time.Hour)}, now.Add(-time.Hour - DefaultWindow), now.Add(-time.Hour), ""},
		{"since after until", Filter{Since: now, Until: now.Add(-time.Second)}, now, now.Add(-time.Second), "is after"},
		{"since in the future", Filter{Since: now.Add(time.Hour)}, now.Add(time.Hour), now, "is after"},
		{"too long", Filter{Since: now.Add(-MaxWindow - time.Hour)}, now.Add(-MaxWindow - time.Hour), now, "longer than"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			since, until, err := tc.f.Window(now)
			if !since.Equal(tc.since) || !until.Equal(tc.until) || (err == nil) != (tc.bad == "") || err != nil && !strings.Contains(err.Error(), tc.bad) {
				t.Fatalf("window %s to %s, %v; want %s to %s, error %q", since, until, err, tc.since, tc.until, tc.bad)
			}
		})
	}
	// Query takes what Window refuses as near as it goes.
	r := newRecord(t, Config{})
	for i := range MinEvidence {
		id := fmt.Sprintf("c%d", i)
		r.asked(id, "a", "rm", "deletes", "")
		r.voted("alice", id, "deletes", events.Approve, events.Responded{})
	}
	midnight := base.Truncate(24 * time.Hour)
	for _, at := range []time.Time{base, midnight, midnight.Add(24 * time.Hour)} {
		if rep := r.query(Filter{Since: at, Until: at}); len(rep.Hours) != 0 || len(rep.AlwaysApproved) != 0 || rep.Totals.Total() != 0 {
			t.Fatalf("an empty window at %s: %+v", at, rep)
		}
	}
	if rep := r.query(Filter{Since: now, Until: now.Add(-time.Hour)}); len(rep.Hours) != 0 {
		t.Fatalf("since after until: %d hours", len(rep.Hours))
	}
	if rep := r.query(Filter{Since: now.Add(-10 * MaxWindow)}); len(rep.Hours) != int(MaxWindow/time.Hour) {
		t.Fatalf("a window too long: %d hours", len(rep.Hours))
	}
}

// TestDecisionOnce: only the first decided event of a request is its
// decision; later ones on its subject, a decided event naming another
// request, and one about no request read count for nothing.
func TestDecisionOnce(t *testing.T) {
	r := newRecord(t, Config{})
	r.asked("r1", "a", "rm", "deletes", "")
	r.after(time.Second).voted("alice", "r1", "deletes", events.Approve, events.Responded{})
	// A forgery after it, and the broker's decision again.
	r.decide("r1", events.Decided{Outcome: events.Denied, Rule: "forged", DecidedBy: []events.DecidedBy{{Principal: "mallory", Decision: events.Deny, At: r.now}}})
	r.decide("r1", events.Decided{Outcome: events.Approved, Rule: "deletes", DecidedBy: []events.DecidedBy{{Principal: "alice", Decision: events.Approve, At: r.now}}})
	// On r2's subject, what is no decided event; then r2's.
	r.asked("r2", "a", "rm", "deletes", "")
	r.store(events.DecisionPrefix+"r2", events.TypeRequested, "", events.Requested{Tool: "not a decision"})
	r.raw(events.DecisionPrefix+"r2", nil, []byte("not even JSON"))
	r.store(events.DecisionPrefix+"r2", events.TypeDecided, "", events.Decided{RequestID: "r2", Outcome: "maybe"})
	r.after(time.Second).voted("bob", "r2", "deletes", events.Deny, events.Responded{})
	// A decided event that names another request is the decision readers
	// take, as the first on its subject.
	r.asked("r3", "a", "rm", "deletes", "")
	r.store(events.DecisionPrefix+"r3", events.TypeDecided, "", events.Decided{RequestID: "r4", Outcome: events.Cancelled, DecidedAt: r.now})
	r.after(time.Second).voted("carol", "r3", "deletes", events.Approve, events.Responded{})
	// A decision about a request never read, that says it came after the
	// first message read: nothing.
	r.decide("ghost", events.Decided{Outcome: events.Approved, RequestSeq: 2})
	// The same request asked again after its decision is no new request.
	r.request("r1", "a", "rm", "")
	r.decide("r1", events.Decided{Outcome: events.Expired, Auto: true})
	rep := r.query(Filter{Since: base, Until: base.Add(time.Hour)})
	if want := (Counts{Approved: 1, Denied: 1, Cancelled: 1}); rep.Totals != want {
		t.Fatalf("totals %+v, want %+v", rep.Totals, want)
	}
	if len(rep.ByApprover) != 2 || rep.ByApprover[0].Key != "alice" || rep.ByApprover[1].Key != "bob" {
		t.Fatalf("by approver %+v: a forger counted", rep.ByApprover)
	}
	if s := r.agg.Stats(); s.Open != 0 || s.DecidedWithoutFacts != 0 {
		t.Fatalf("stats %+v", s)
	}
}

// TestDecisionBeforeTheRecord: a decision whose request was stored before
// the first message read counts, without its request's facts.
func TestDecisionBeforeTheRecord(t *testing.T) {
	r := newRecord(t, Config{})
	r.seq = 100 // the stream starts at 101
	r.decide("old", events.Decided{Outcome: events.Approved, RequestSeq: 50, Rule: "deletes", DecidedBy: []events.DecidedBy{{Principal: "alice", Decision: events.Approve, At: r.now}}})
	r.decide("new", events.Decided{Outcome: events.Approved, RequestSeq: 150})
	rep := r.query(Filter{Since: base, Until: base.Add(time.Hour)})
	if rep.Totals != (Counts{Approved: 1}) || len(rep.ByRule) != 1 || rep.ByRule[0].Decided != 1 || rep.ByRule[0].P50 != 0 {
		t.Fatalf("report %+v", rep)
	}
	if !sameUnexamined(rep.Unexamined, Unexamined{Approved: 1, Unedited: 1}) {
		t.Fatalf("unexamined %+v: unknown looks counted as none", rep.Unexamined)
	}
	if s := r.agg.Stats(); s.DecidedWithoutFacts != 1 {
		t.Fatalf("stats %+v", s)
	}
	if rep := r.query(Filter{Since: base, Until: base.Add(time.Hour), Rule: "deletes"}); rep.Totals != (Counts{Approved: 1}) {
		t.Fatalf("by its rule: %+v", rep.Totals)
	}
}

// TestDisagreementSameRule: where the live and shadow policies take the
// same action by the same rule and differ in its terms, the pair names what
// differs, so that its row says something.
func TestDisagreementSameRule(t *testing.T) {
	r := newRecord(t, Config{})
	r.asked("d1", "a", "deploy", "deploys", "")
	r.store(events.ShadowPrefix+"d1", events.TypeShadowDisagreement, "", events.ShadowDisagreement{RequestID: "d1", Tool: "deploy", Agent: "a",
		Live: "require_approval by deploys", Shadow: "require_approval by deploys", Summary: "timeout 10m0s vs 1h0m0s"})
	r.after(time.Second).voted("alice", "d1", "deploys", events.Approve, events.Responded{})
	rep := r.query(Filter{Since: base, Until: base.Add(time.Hour)})
	want := []Disagreement{{Live: "require_approval by deploys", Shadow: "require_approval by deploys (timeout 10m0s vs 1h0m0s)", Count: 1, Examples: []string{"d1"}}}
	if !reflect.DeepEqual(rep.Disagreements, want) {
		t.Fatalf("disagreements %+v, want %+v", rep.Disagreements, want)
	}
}

// TestBacklog: a backlog of requests larger than MaxOpen and than the
// evicted ids it remembers (a million stored before the broker decides
// any): every decision naming a request evicted from it still counts.
func TestBacklog(t *testing.T) {
	r := newRecord(t, Config{MaxOpen: 2})
	seqs := map[string]uint64{}
	for i := range 20 {
		id := fmt.Sprintf("b%d", i)
		seqs[id] = r.request(id, "a", "read_file", "")
	}
	for i := range 20 {
		id := fmt.Sprintf("b%d", i)
		r.decide(id, events.Decided{Outcome: events.Approved, Rule: "reads", Auto: true, RequestSeq: seqs[id]})
	}
	// A decision of a request never read (and after the first read) is
	// none: it names no request of this stream.
	r.decide("ghost", events.Decided{Outcome: events.Approved, Auto: true, RequestSeq: seqs["b19"] + 1000})
	if rep := r.query(Filter{Since: base, Until: base.Add(time.Hour)}); rep.Totals != (Counts{AutoApproved: 20}) {
		t.Fatalf("totals %+v, want 20 approved by policy", rep.Totals)
	}
}

// TestEviction: past MaxOpen the oldest open request is evicted; its
// decision still counts, without its facts.
func TestEviction(t *testing.T) {
	r := newRecord(t, Config{MaxOpen: 2})
	r.asked("r1", "a", "rm", "deletes", "")
	r.asked("r2", "a", "rm", "deletes", "")
	r.asked("r3", "a", "rm", "deletes", "") // evicts r1
	for _, id := range []string{"r3", "r2", "r1"} {
		r.after(time.Second).voted("alice", id, "deletes", events.Approve, events.Responded{})
	}
	s := r.agg.Stats()
	if s.Open != 0 || s.Evicted != 1 || s.DecidedWithoutFacts != 1 {
		t.Fatalf("stats %+v", s)
	}
	all := r.query(Filter{Since: base, Until: base.Add(time.Hour)})
	byTool := r.query(Filter{Since: base, Until: base.Add(time.Hour), Tool: "rm"})
	if all.Totals.Approved != 3 || byTool.Totals.Approved != 2 {
		t.Fatalf("approved %d in all, %d of tool rm; want 3 and 2 (the evicted one's tool unknown)", all.Totals.Approved, byTool.Totals.Approved)
	}
	if all.ByRule[0].Decided != 3 || all.ByApprover[0].Decided != 3 || all.Unexamined.Unlooked != 2 {
		t.Fatalf("report %+v", all)
	}
	// Many more than the bound come and go: the queue does not grow.
	for i := range 5000 {
		id := fmt.Sprintf("x%d", i)
		r.asked(id, "a", "rm", "deletes", "")
		r.decide(id, events.Decided{Outcome: events.Expired, Auto: true})
	}
	if n := len(r.agg.queue) - r.agg.qhead; n > 2048 {
		t.Fatalf("the queue holds %d entries with none open", n)
	}
}

func TestCandidates(t *testing.T) {
	r := newRecord(t, Config{})
	n := 0
	ask := func(agent, tool, args string) string {
		n++
		id := fmt.Sprintf("q%d", n)
		r.asked(id, agent, tool, "deploys", args)
		return id
	}
	// A denial before the window: LastOther.
	denied := ask("coder", "deploy", `{"env":"staging"}`)
	r.after(time.Second).voted("carol", denied, "deploys", events.Deny, events.Responded{})
	lastDenied := r.now
	r.after(48 * time.Hour)
	since := r.now
	var approved []string
	for i, args := range []string{
		`{"env":"staging","version":"1.2.0","replicas":2}`,
		`{"env":"staging","version":"1.2.1","replicas":3}`,
		`{"env":"staging","version":"1.3.0","replicas":2,"note":"x"}`,
		`{"env":"staging","version":"1.3.1","replicas":5}`,
		`{"env":"staging","version":"1.4.0","replicas":2}`,
	} {
		id := ask("coder", "deploy", args)
		who := "alice"
		if i == 4 {
			who = "bob"
		}
		r.after(time.Minute).voted(who, id, "deploys", events.Approve, events.Responded{})
		approved = append(approved, id)
	}
	// Too little evidence either way; a mixed group.
	for range 4 {
		r.after(time.Minute).voted("alice", ask("coder", "drop", `{}`), "drops", events.Deny, events.Responded{})
	}
	for i := range 6 {
		v := events.Approve
		if i == 5 {
			v = events.Deny
		}
		r.after(time.Minute).voted("alice", ask("ops", "restart", `{"svc":"web"}`), "restarts", v, events.Responded{})
	}
	// Always denied; a day keeps its last dayExamples examples.
	var rejected []string
	for i := range 6 {
		id := ask("ops", "wipe", `{"disk":"/dev/sd`+string(rune('a'+i))+`"}`)
		r.after(time.Minute).voted("carol", id, "wipes", events.Deny, events.Responded{})
		rejected = append(rejected, id)
	}
	rep := r.query(Filter{Since: since})
	want := []Candidate{{
		Tool: "deploy", Agent: "coder", Count: 5, Principals: []string{"alice", "bob"},
		First: since.Add(time.Minute), Last: since.Add(5 * time.Minute), LastOther: lastDenied,
		Args: []ArgPattern{
			{Field: "env", Values: []json.RawMessage{json.RawMessage(`"staging"`)}},
			{Field: "note", Values: []json.RawMessage{json.RawMessage(`"x"`)}, Optional: true},
			{Field: "replicas", Values: []json.RawMessage{json.RawMessage(`2`), json.RawMessage(`3`), json.RawMessage(`5`)}},
			{Field: "version", Values: []json.RawMessage{json.RawMessage(`"1.2.0"`), json.RawMessage(`"1.2.1"`), json.RawMessage(`"1.3.0"`), json.RawMessage(`"1.3.1"`), json.RawMessage(`"1.4.0"`)}},
		},
		Examples: reversed(approved)[:dayExamples], // the day keeps its last few
	}}
	if !reflect.DeepEqual(rep.AlwaysApproved, want) {
		t.Fatalf("always approved:\n%s\nwant\n%s", js(rep.AlwaysApproved), js(want))
	}
	if len(rep.AlwaysDenied) != 1 || rep.AlwaysDenied[0].Tool != "wipe" || rep.AlwaysDenied[0].Count != 6 || !reflect.DeepEqual(rep.AlwaysDenied[0].Examples, reversed(rejected)[:dayExamples]) {
		t.Fatalf("always denied: %s", js(rep.AlwaysDenied))
	}
	disk := rep.AlwaysDenied[0].Args[0]
	if disk.Field != "disk" || len(disk.Values) != 6 || disk.Varied {
		t.Fatalf("disk: %+v", disk)
	}
	// A window with the denial: no candidate; by approver: bob approved
	// only once; alice four times, and never denied one.
	if rep := r.query(Filter{Since: base, Tool: "deploy"}); len(rep.AlwaysApproved) != 0 {
		t.Fatalf("a group denied in the window is a candidate: %s", js(rep.AlwaysApproved))
	}
	if rep := r.query(Filter{Since: since, Approver: "bob"}); len(rep.AlwaysApproved) != 0 {
		t.Fatalf("a candidate from one approval: %s", js(rep.AlwaysApproved))
	}
	if rep := r.query(Filter{Since: since, Rule: "wipes"}); len(rep.AlwaysApproved) != 0 || len(rep.AlwaysDenied) != 1 {
		t.Fatalf("by rule: %s %s", js(rep.AlwaysApproved), js(rep.AlwaysDenied))
	}
	// Past MaxValues a field varies: strings by their common prefix,
	// numbers by their range.
	for i := range MaxValues + 1 {
		id := ask("coder", "deploy", `{"env":"staging-`+string(rune('a'+i))+`","version":"1.4.0","replicas":`+string(rune('1'+i))+`}`)
		r.after(time.Minute).voted("alice", id, "deploys", events.Approve, events.Responded{})
	}
	rep = r.query(Filter{Since: since, Tool: "deploy"})
	if len(rep.AlwaysApproved) != 1 {
		t.Fatalf("always approved: %s", js(rep.AlwaysApproved))
	}
	args := rep.AlwaysApproved[0].Args
	one, nine := 1.0, 9.0
	if env := args[0]; env.Field != "env" || !env.Varied || env.Values != nil || env.Prefix != "staging" || env.Min != nil {
		t.Fatalf("env: %+v", env)
	}
	if rp := args[2]; rp.Field != "replicas" || !rp.Varied || *rp.Min != one || *rp.Max != nine || rp.Prefix != "" {
		t.Fatalf("replicas: %+v", rp)
	}
}

func reversed(s []string) []string {
	out := make([]string, len(s))
	for i, v := range s {
		out[len(s)-1-i] = v
	}
	return out
}

func js(v any) string {
	b, _ := json.MarshalIndent(v, "", "  ")
	return string(b)
}

func TestHistory(t *testing.T) {
	r := newRecord(t, Config{})
	exact := `{"path":"/tmp/x"}`
	exactDigest, _ := events.ArgsDigest(json.RawMessage(exact))
	n := 0
	decide := func(who string, v events.Verdict, args string) {
		n++
		id := fmt.Sprintf("h%d", n)
		r.asked(id, "fm", "rm", "deletes", args)
		r.after(time.Minute).voted(who, id, "deletes", v, events.Responded{})
	}
	decide("alice", events.Deny, exact) // 40 days ago: outside the window
	r.after(40 * 24 * time.Hour)
	if h := r.agg.History("rm", "fm", exactDigest, r.now); h != nil {
		t.Fatalf("a history before the record was read: %+v", h)
	}
	r.agg.MarkCaughtUp()
	decide("alice", events.Approve, exact)
	decide("alice", events.Approve, ` { "path" : "/tmp/x" } `) // the same args, written otherwise
	decide("bob", events.Approve, `{"path":"/tmp/y"}`)
	decide("carol", events.Deny, `{"path":"/etc"}`)
	lastDenial := r.now
	decide("bob", events.Approve, `{"path":"/tmp/z"}`)
	r.asked("exp", "fm", "rm", "deletes", exact)
	r.after(time.Hour).decide("exp", events.Decided{Outcome: events.Expired, Auto: true, Rule: "deletes"})
	r.auto("auto", "fm", "rm", "reads", events.Approved) // not people's
	h := r.agg.History("rm", "fm", exactDigest, r.now)
	want := &events.History{Window: events.Duration(HistoryWindow), Approved: 4, Denied: 1, Expired: 1, Exact: 2, Principals: []string{"alice", "bob", "carol"}, LastDenied: lastDenial}
	if !reflect.DeepEqual(h, want) {
		t.Fatalf("history %+v, want %+v", h, want)
	}
	if h := r.agg.History("rm", "other", exactDigest, r.now); !reflect.DeepEqual(h, &events.History{Window: events.Duration(HistoryWindow)}) {
		t.Fatalf("history of an unknown agent %+v", h)
	}
	// Once the window has passed the recent ones, the denial before it is
	// still the last one.
	r.after(HistoryWindow+24*time.Hour).auto("later", "fm", "ls", "reads", events.Approved)
	later := r.agg.History("rm", "fm", exactDigest, r.now)
	if later.Approved+later.Denied+later.Expired+later.Exact != 0 || len(later.Principals) != 0 || !later.LastDenied.Equal(lastDenial) {
		t.Fatalf("history after the window: %+v", later)
	}
}

// TestKeep: what is older than Keep is dropped as the record grows.
func TestKeep(t *testing.T) {
	r := newRecord(t, Config{Keep: 48 * time.Hour})
	r.asked("old", "a", "rm", "deletes", "")
	r.after(time.Second).voted("alice", "old", "deletes", events.Approve, events.Responded{})
	r.after(72*time.Hour).auto("new", "a", "ls", "reads", events.Approved)
	s := r.agg.Stats()
	if s.Hours != 1 || s.Pairs != 0 {
		t.Fatalf("stats %+v: kept what is older than Keep", s)
	}
	if rep := r.query(Filter{Since: base.Add(-time.Hour)}); rep.Totals != (Counts{AutoApproved: 1}) {
		t.Fatalf("totals %+v", rep.Totals)
	}
}

// TestSignedDecisions: with trusted keys, a decided event none of them
// signed is not a decision; the signed one after it is.
func TestSignedDecisions(t *testing.T) {
	kp, err := nkeys.CreateAccount()
	if err != nil {
		t.Fatal(err)
	}
	signer, err := events.NewSigner(kp)
	if err != nil {
		t.Fatal(err)
	}
	trusted, err := events.NewTrustedKeys(signer.PublicKey())
	if err != nil {
		t.Fatal(err)
	}
	r := newRecord(t, Config{Trusted: trusted})
	r.asked("r1", "a", "rm", "deletes", "")
	r.decide("r1", events.Decided{Outcome: events.Denied, Rule: "forged"})
	d := events.Decided{RequestID: "r1", Outcome: events.Approved, Rule: "deletes", DecidedAt: r.now.UTC().Truncate(time.Second), DecidedBy: []events.DecidedBy{{Principal: "alice", Decision: events.Approve, At: r.now}}}
	e, err := events.New(events.TypeDecided, "", "broker/b", d)
	if err != nil {
		t.Fatal(err)
	}
	if err := signer.Sign(&e); err != nil {
		t.Fatal(err)
	}
	h, body, err := events.Encode(&e)
	if err != nil {
		t.Fatal(err)
	}
	r.raw(events.DecisionPrefix+"r1", nats.Header(h), body)
	if rep := r.query(Filter{Since: base, Until: base.Add(time.Hour)}); rep.Totals != (Counts{Approved: 1}) {
		t.Fatalf("totals %+v", rep.Totals)
	}
}

// TestBinaryMode: events in binary mode (ce- headers) read as structured
// ones do.
func TestBinaryMode(t *testing.T) {
	r := newRecord(t, Config{})
	binary := func(subject, typ, id string, data any) {
		e, err := events.New(typ, id, "agent/a", data)
		if err != nil {
			t.Fatal(err)
		}
		h, body, err := events.EncodeBinary(&e)
		if err != nil {
			t.Fatal(err)
		}
		r.raw(subject, nats.Header(h), body)
	}
	binary(events.RequestPrefix+"a", events.TypeRequested, "b1", events.Requested{Tool: "rm"})
	r.pending("b1", "a", "rm", "deletes", "", "")
	r.after(time.Second)
	binary(events.ResponsePrefix+"alice.b1", events.TypeResponded, "", events.Responded{Decision: events.Approve, ShownAt: r.now.Add(-time.Hour), Detail: true})
	r.decide("b1", events.Decided{Outcome: events.Approved, Rule: "deletes", DecidedBy: []events.DecidedBy{{Principal: "alice", Decision: events.Approve, At: r.now}}})
	rep := r.query(Filter{Since: base, Until: base.Add(time.Hour), Tool: "rm"})
	if rep.Totals != (Counts{Approved: 1}) || rep.RubberStamps[0].Fast != 0 || rep.Unexamined.Unlooked != 0 {
		t.Fatalf("report %+v", rep)
	}
}

// TestSealed: an hour the clock has left behind answers as it did before it
// was sealed, with and without filters; a message stored late in it unseals
// it, and it is sealed again with the next hour.
func TestSealed(t *testing.T) {
	r := story(t)
	filters := []Filter{{}, {Agent: "a2"}, {Tool: "rm"}, {Rule: "payments"}, {Approver: "alice"}, {Approver: "bob", Rule: "deletes"}, {Agent: "nobody"}}
	before := make([]Report, len(filters))
	for i, f := range filters {
		f.Since, f.Until = base, base.Add(time.Hour)
		before[i] = r.query(f)
	}
	r.now = base.Add(4 * time.Hour)
	r.auto("later", "a3", "ls", "reads", events.Approved)
	if s := r.agg.Stats(); s.Sealed != 1 || s.Hours != 2 {
		t.Fatalf("stats %+v; want the first hour sealed", s)
	}
	for i, f := range filters {
		f.Since, f.Until = base, base.Add(time.Hour)
		after := r.query(f)
		after.Through, before[i].Through = 0, 0
		if !reflect.DeepEqual(after, before[i]) {
			t.Fatalf("%+v sealed:\n%s\nbefore:\n%s", f, js(after), js(before[i]))
		}
	}
	// Stored late, in the sealed hour.
	r.now = base.Add(30 * time.Minute)
	r.auto("late", "a1", "ls", "reads", events.Approved)
	rep := r.query(Filter{Since: base, Until: base.Add(time.Hour)})
	if rep.Totals.AutoApproved != 2 || rep.Totals.Total() != 10 {
		t.Fatalf("totals %+v", rep.Totals)
	}
	if s := r.agg.Stats(); s.Sealed != 0 || s.Cells != 6 {
		t.Fatalf("stats %+v; want the first hour unsealed", s)
	}
	r.now = base.Add(5 * time.Hour)
	r.auto("next", "a3", "ls", "reads", events.Approved)
	if s := r.agg.Stats(); s.Sealed != 1 {
		t.Fatalf("stats %+v; want the first hour sealed again", s)
	}
	if again := r.query(Filter{Since: base, Until: base.Add(time.Hour)}); again.Totals != rep.Totals || !reflect.DeepEqual(again.ByRule, rep.ByRule) {
		t.Fatalf("sealed again: %+v, before %+v", again, rep)
	}
}

// FuzzAdd: whatever a stored message holds, adding it neither panics nor
// breaks the report's sums.
func FuzzAdd(f *testing.F) {
	for _, seed := range []struct {
		subject string
		body    string
	}{
		{events.RequestPrefix + "a", `{"specversion":"1.0","id":"r1","type":"dev.assent.approval.requested","source":"x","data":{"tool":"rm","args":{"path":"/a"}}}`},
		{events.PendingPrefix + "a", `{"specversion":"1.0","id":"p1","type":"dev.assent.approval.pending","source":"x","data":{"request_id":"r1","request":{"tool":"rm","args":{"path":"/a","n":[1,{"x":2}]}},"rule":"deletes"}}`},
		{events.ResponsePrefix + "alice.r1", `{"specversion":"1.0","id":"a1","type":"dev.assent.approval.responded","source":"x","data":{"decision":"approve","shown_at":"2030-01-01T00:00:00Z","detail":true}}`},
		{events.DecisionPrefix + "r1", `{"specversion":"1.0","id":"d1","type":"dev.assent.approval.decided","source":"x","data":{"request_id":"r1","outcome":"approved","edited":true,"args":{"path":"/b"},"decided_by":[{"principal":"alice","decision":"approve","at":"2030-01-01T00:00:01Z"}]}}`},
		{events.ShadowPrefix + "r1", `{"specversion":"1.0","id":"s1","type":"dev.assent.policy.shadow_disagreement","source":"x","data":{"request_id":"r1","tool":"rm","live":"a","shadow":"b"}}`},
		{events.DecisionPrefix + "r1", `{"data":{"request_id":"r1","outcome":"approved","decided_at":"bad"}}`},
		{events.PendingPrefix + "a", `[]`},
	} {
		f.Add(seed.subject, []byte(seed.body), int64(0))
	}
	f.Fuzz(func(t *testing.T, subject string, body []byte, offset int64) {
		r := newRecord(t, Config{MaxOpen: 4})
		r.asked("r1", "a", "rm", "deletes", `{"path":"/a"}`)
		r.now = r.now.Add(time.Duration(offset % int64(1000*time.Hour)))
		r.raw(subject, nats.Header{"Content-Type": {events.ContentTypeStructured}}, body)
		r.raw(subject, nil, body)
		r.after(time.Second).voted("bob", "r1", "deletes", events.Approve, events.Responded{})
		r.query(Filter{Since: base.Add(-2000 * time.Hour), Until: base.Add(2000 * time.Hour)})
		r.query(Filter{Since: base.Add(-2000 * time.Hour), Until: base.Add(2000 * time.Hour), Approver: "alice"})
		r.agg.History("rm", "a", "", r.now)
	})
}

// TestApproverScope: a report with an approver filter draws only on the
// requests that approver answered: its candidates' arguments and examples,
// its disagreements' examples, its rubber stamps.
func TestApproverScope(t *testing.T) {
	r := newRecord(t, Config{})
	var alices []string
	for i := range 10 {
		id := fmt.Sprintf("s%d", i)
		who, env := "alice", "staging"
		if i%2 == 1 {
			who, env = "bob", "prod"
		}
		r.asked(id, "coder", "deploy", "deploys", `{"env":"`+env+`"}`)
		r.shadow(id, "deploy", "coder", "require_approval by deploys", "allow by deploys-"+env)
		r.voted(who, id, "deploys", events.Approve, events.Responded{})
		if who == "alice" {
			alices = append(alices, id)
		}
		r.after(time.Minute)
	}
	all := r.query(Filter{Since: base})
	if len(all.AlwaysApproved) != 1 || all.AlwaysApproved[0].Count != 10 || len(all.AlwaysApproved[0].Args[0].Values) != 2 {
		t.Fatalf("all: %s", js(all.AlwaysApproved))
	}
	alice := r.query(Filter{Since: base, Approver: "alice"})
	if len(alice.AlwaysApproved) != 1 {
		t.Fatalf("alice: %s", js(alice.AlwaysApproved))
	}
	c := alice.AlwaysApproved[0]
	if c.Count != 5 || !reflect.DeepEqual(c.Principals, []string{"alice"}) || len(c.Args) != 1 || len(c.Args[0].Values) != 1 || string(c.Args[0].Values[0]) != `"staging"` ||
		!reflect.DeepEqual(c.Examples, reversed(alices)[:dayExamples]) {
		t.Fatalf("alice's candidate: %s", js(c))
	}
	if len(alice.Disagreements) != 1 || alice.Disagreements[0].Count != 5 || !reflect.DeepEqual(alice.Disagreements[0].Examples, reversed(alices)) {
		t.Fatalf("alice's disagreements: %s", js(alice.Disagreements))
	}
	if len(alice.RubberStamps) != 1 || alice.RubberStamps[0].Approver != "alice" || !reflect.DeepEqual(alice.RubberStamps[0].Examples, reversed(alices)) {
		t.Fatalf("alice's rubber stamps: %s", js(alice.RubberStamps))
	}
	if len(all.Disagreements) != 2 || all.Disagreements[0].Count != 5 {
		t.Fatalf("all disagreements: %s", js(all.Disagreements))
	}
}

// TestQuorumScope: a decision two approvers took part in counts for each,
// and each sees the other among its candidate's principals.
func TestQuorumScope(t *testing.T) {
	r := newRecord(t, Config{})
	for i := range 6 {
		id := fmt.Sprintf("w%d", i)
		r.asked(id, "bank", "wire", "wires", `{"amount":100}`)
		r.after(time.Minute)
		by := []events.DecidedBy{{Principal: "alice", Decision: events.Approve, At: r.now}}
		if i >= 1 {
			by = append(by, events.DecidedBy{Principal: "bob", Decision: events.Approve, At: r.now})
		}
		r.decide(id, events.Decided{Outcome: events.Approved, Rule: "wires", DecidedBy: by})
	}
	for who, want := range map[string]int{"": 6, "alice": 6, "bob": 5} {
		rep := r.query(Filter{Since: base, Approver: who})
		if want < MinEvidence {
			continue
		}
		if len(rep.AlwaysApproved) != 1 || rep.AlwaysApproved[0].Count != want || !reflect.DeepEqual(rep.AlwaysApproved[0].Principals, []string{"alice", "bob"}) {
			t.Fatalf("%q: %s", who, js(rep.AlwaysApproved))
		}
		if who != "" && (len(rep.ByApprover) != 1 || rep.ByApprover[0].Decided != want) {
			t.Fatalf("%q: by approver %+v", who, rep.ByApprover)
		}
	}
	h := r.agg.History("wire", "bank", "", r.now)
	if h != nil {
		t.Fatalf("history before caught up: %+v", h)
	}
	r.agg.MarkCaughtUp()
	if h := r.agg.History("wire", "bank", "", r.now); h.Approved != 6 || !reflect.DeepEqual(h.Principals, []string{"alice", "bob"}) {
		t.Fatalf("history %+v", h)
	}
}

// sameUnexamined reports whether got counts what want does and lists one
// example of each unlooked approval (fewer than MaxExamples here).
func sameUnexamined(got, want Unexamined) bool {
	ex := got.Examples
	got.Examples, want.Examples = nil, nil
	return reflect.DeepEqual(got, want) && len(ex) == want.Unlooked && len(slices.Compact(slices.Sorted(slices.Values(ex)))) == len(ex)
}
