package policy_test

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/assent-dev/assent/pkg/events"
	"github.com/assent-dev/assent/pkg/policy"
)

const approvalPolicy = `version: 1
principals:
  alice: {roles: [finance]}
  bob:   {roles: [finance]}
  carol: {roles: [cfo]}
  dave:  {}
rules:
  - name: finance
    tools: [reimburse]
    action: require_approval
    approvers: ["role:finance"]
    quorum: 2
    timeout: 1h
    escalation:
      - {after: 30m, approvers: ["role:cfo"], extend: 30m}
      - {after: 80m, approvers: [dave]}
  - name: self-ok
    tools: [self]
    action: require_approval
    approvers: [alice, bob]
    allow_self_approval: true
  - name: anyone
    tools: [any]
    action: require_approval
    approvers: [any]
  - name: anyone-two
    tools: [any2]
    action: require_approval
    quorum: 2
`

func approvalFor(t *testing.T, p *policy.Policy, req string) (*policy.Approval, policy.Input) {
	t.Helper()
	in := input(t, req)
	res := p.Evaluate(in, t0, nil)
	if res.Approval == nil {
		t.Fatalf("%s: no approval: %+v", req, res)
	}
	return res.Approval, in
}

func TestEligible(t *testing.T) {
	p := mustParse(t, approvalPolicy)
	tests := []struct {
		req       string
		principal string
		want      error
	}{
		{`{"tool":"reimburse","user":"zed"}`, "alice", nil},
		{`{"tool":"reimburse","user":"zed"}`, "bob", nil},
		{`{"tool":"reimburse","user":"zed"}`, "carol", nil}, // escalation level, eligible from the start
		{`{"tool":"reimburse","user":"zed"}`, "dave", nil},
		{`{"tool":"reimburse","user":"zed"}`, "zed", policy.ErrNotEligible},
		{`{"tool":"reimburse","user":"zed"}`, "mallory", policy.ErrNotEligible},
		{`{"tool":"reimburse","user":"zed"}`, "", policy.ErrNotEligible},
		{`{"tool":"reimburse","user":"alice"}`, "alice", policy.ErrSelfApproval},
		{`{"tool":"reimburse","user":"alice"}`, "bob", nil},
		{`{"tool":"self","user":"alice"}`, "alice", nil},
		{`{"tool":"self","user":"alice"}`, "carol", policy.ErrNotEligible},
		{`{"tool":"any","user":"alice"}`, "mallory", nil},
		{`{"tool":"any","user":"alice"}`, "alice", policy.ErrSelfApproval},
		{`{"tool":"any"}`, "alice", nil},
		{`{"tool":"unmatched","user":"u"}`, "whoever", nil}, // mode:manual, anyone
		{`{"tool":"unmatched","user":"u"}`, "u", policy.ErrSelfApproval},
	}
	for _, tc := range tests {
		a, in := approvalFor(t, p, tc.req)
		err := a.Eligible(tc.principal, in)
		if !errors.Is(err, tc.want) || (tc.want == nil) != (err == nil) {
			t.Errorf("%s by %q: %v, want %v", tc.req, tc.principal, err, tc.want)
		}
		if errors.Is(err, policy.ErrSelfApproval) && !errors.Is(err, policy.ErrNotEligible) {
			t.Errorf("self-approval error %v does not match ErrNotEligible", err)
		}
	}
}

func TestTally(t *testing.T) {
	p := mustParse(t, approvalPolicy)
	a, in := approvalFor(t, p, `{"tool":"reimburse","user":"alice"}`)
	vote := func(who string, v events.Verdict) policy.Vote { return policy.Vote{Principal: who, Verdict: v} }
	A, D := events.Approve, events.Deny
	tests := []struct {
		name    string
		votes   []policy.Vote
		decided bool
		verdict events.Verdict
		approvs []string
	}{
		{"none", nil, false, "", nil},
		{"one of two", []policy.Vote{vote("bob", A)}, false, "", []string{"bob"}},
		{"same principal twice", []policy.Vote{vote("bob", A), vote("bob", A)}, false, "", []string{"bob"}},
		{"quorum", []policy.Vote{vote("bob", A), vote("carol", A)}, true, A, []string{"bob", "carol"}},
		{"self vote ignored", []policy.Vote{vote("bob", A), vote("alice", A)}, false, "", []string{"bob"}},
		{"ineligible ignored", []policy.Vote{vote("bob", A), vote("mallory", A)}, false, "", []string{"bob"}},
		{"one deny denies", []policy.Vote{vote("bob", A), vote("carol", D)}, true, D, []string{"bob"}},
		{"deny after quorum still denies", []policy.Vote{vote("bob", A), vote("carol", A), vote("dave", D)}, true, D, []string{"bob", "carol"}},
		{"ineligible deny ignored", []policy.Vote{vote("mallory", D), vote("bob", A)}, false, "", []string{"bob"}},
		{"self deny ignored", []policy.Vote{vote("alice", D)}, false, "", nil},
		{"change of mind denies", []policy.Vote{vote("bob", A), vote("bob", D), vote("carol", A)}, true, D, []string{"bob", "carol"}},
	}
	for _, tc := range tests {
		got := a.Tally(in, tc.votes)
		if got.Decided != tc.decided || got.Verdict != tc.verdict || !slices.Equal(got.Approvals, tc.approvs) || got.Need != 2 {
			t.Errorf("%s: %+v, want decided %v %q approvals %v", tc.name, got, tc.decided, tc.verdict, tc.approvs)
		}
	}
	one, in := approvalFor(t, p, `{"tool":"any"}`)
	if got := one.Tally(in, []policy.Vote{{Principal: "x", Verdict: A}}); !got.Decided || got.Verdict != A {
		t.Errorf("quorum 1: %+v", got)
	}
}

func TestEscalation(t *testing.T) {
	p := mustParse(t, approvalPolicy)
	a, _ := approvalFor(t, p, `{"tool":"reimburse"}`)
	start := t0
	tests := []struct {
		at       time.Duration
		level    int
		deadline time.Duration
		next     time.Duration // 0: none
	}{
		{0, 0, time.Hour, 30 * time.Minute},
		{29 * time.Minute, 0, time.Hour, 30 * time.Minute},
		{30 * time.Minute, 1, 90 * time.Minute, 80 * time.Minute},
		{79 * time.Minute, 1, 90 * time.Minute, 80 * time.Minute},
		{80 * time.Minute, 2, 90 * time.Minute, 0},
		{3 * time.Hour, 2, 90 * time.Minute, 0},
	}
	for _, tc := range tests {
		now := start.Add(tc.at)
		e := a.At(start, time.Time{}, now)
		var next time.Time
		if tc.next > 0 {
			next = start.Add(tc.next)
		}
		if e.Level != tc.level || !e.Deadline.Equal(start.Add(tc.deadline)) || !e.Next.Equal(next) {
			t.Errorf("at +%s: %+v, want level %d deadline +%s next +%s", tc.at, e, tc.level, tc.deadline, tc.next)
		}
		if a.Level(start, time.Time{}, now) != tc.level || !a.Deadline(start, time.Time{}, now).Equal(e.Deadline) {
			t.Errorf("at +%s: Level/Deadline disagree with At", tc.at)
		}
	}
	// A request that asked for a shorter timeout never reaches a step due
	// after its deadline.
	short, _ := approvalFor(t, p, `{"tool":"reimburse","timeout":"20m"}`)
	if e := short.At(start, time.Time{}, start.Add(time.Hour)); e.Level != 0 || !e.Deadline.Equal(start.Add(20*time.Minute)) || !e.Next.IsZero() {
		t.Errorf("short request: %+v", e)
	}
	// The same, judged by the request's own deadline on the rule's approval
	// (as the broker does): a step due at or after it never fires, however
	// late the broker looks.
	for _, own := range []time.Duration{20 * time.Minute, 30 * time.Minute} {
		for _, late := range []time.Duration{own, time.Hour, 5 * time.Hour} {
			e := a.At(start, start.Add(own), start.Add(late))
			if e.Level != 0 || !e.Deadline.Equal(start.Add(own)) || !e.Next.IsZero() {
				t.Errorf("own deadline +%s, at +%s: %+v, want level 0 and deadline +%s", own, late, e, own)
			}
		}
	}
	// A deadline just past the first step lets that step fire and extend it.
	if e := a.At(start, start.Add(31*time.Minute), start.Add(40*time.Minute)); e.Level != 1 || !e.Deadline.Equal(start.Add(61*time.Minute)) {
		t.Errorf("own deadline +31m, at +40m: %+v, want level 1, deadline +61m", e)
	}

	if got := a.ApproversAt(0); !slices.Equal(got, []string{"role:finance"}) {
		t.Errorf("ApproversAt(0) = %v", got)
	}
	if got := a.ApproversAt(1); !slices.Equal(got, []string{"role:cfo"}) {
		t.Errorf("ApproversAt(1) = %v", got)
	}
	if got := a.ApproversAt(3); got != nil {
		t.Errorf("ApproversAt(3) = %v", got)
	}
	for level, want := range [][]string{{"alice", "bob"}, {"carol"}, {"dave"}} {
		if got, ok := a.Notify(level); !ok || !slices.Equal(got, want) {
			t.Errorf("Notify(%d) = %v, %v; want %v", level, got, ok, want)
		}
	}
	if _, ok := a.Notify(9); ok {
		t.Error("Notify(9) ok")
	}
	open, _ := approvalFor(t, p, `{"tool":"any"}`)
	if got, ok := open.Notify(0); ok || got != nil {
		t.Errorf("open Notify(0) = %v, %v", got, ok)
	}
}

func TestReachable(t *testing.T) {
	p := mustParse(t, approvalPolicy)
	live := func(names ...string) policy.Presence { return policy.StaticPresence{Principals: names} }
	tests := []struct {
		req  string
		live policy.Presence
		want bool
	}{
		{`{"tool":"reimburse","user":"zed"}`, live(), false},
		{`{"tool":"reimburse","user":"zed"}`, live("alice"), false}, // quorum 2
		{`{"tool":"reimburse","user":"zed"}`, live("alice", "alice"), false},
		{`{"tool":"reimburse","user":"zed"}`, live("alice", "bob"), true},
		{`{"tool":"reimburse","user":"zed"}`, live("alice", "carol"), true}, // escalation approver counts
		{`{"tool":"reimburse","user":"alice"}`, live("alice", "mallory"), false},
		{`{"tool":"reimburse","user":"zed"}`, policy.StaticPresence{All: true}, true},
		{`{"tool":"self","user":"alice"}`, live("alice"), true},
		{`{"tool":"any","user":"alice"}`, live("alice"), false},
		{`{"tool":"any","user":"alice"}`, live("mallory"), true},
		{`{"tool":"any","user":"alice"}`, policy.StaticPresence{All: true}, true},
		{`{"tool":"any2","user":"alice"}`, live("alice", "bob"), false},
		{`{"tool":"any2","user":"alice"}`, live("carol", "bob"), true},
		{`{"tool":"unmatched"}`, live(), false},
		{`{"tool":"unmatched"}`, nil, false},
	}
	for _, tc := range tests {
		a, in := approvalFor(t, p, tc.req)
		if got := a.Reachable(in, tc.live); got != tc.want {
			t.Errorf("%s with %+v: %v, want %v", tc.req, tc.live, got, tc.want)
		}
	}
	// Named approvers with a gateway for everyone, but the only approver is
	// the requester.
	solo := mustParse(t, "version: 1\nprincipals: {alice: {}}\nrules:\n  - {name: r, action: require_approval, approvers: [alice]}\n")
	a, in := approvalFor(t, solo, `{"tool":"x","user":"alice"}`)
	if a.Reachable(in, policy.StaticPresence{All: true}) {
		t.Error("requester alone is reachable")
	}
}

func TestTimeoutFor(t *testing.T) {
	a := &policy.Approval{Timeout: 10 * time.Minute, OnTimeout: events.Deny}
	for req, want := range map[time.Duration]time.Duration{0: 10 * time.Minute, time.Minute: time.Minute, time.Hour: 10 * time.Minute} {
		if got := a.TimeoutFor(req); got != want {
			t.Errorf("TimeoutFor(%s) = %s, want %s", req, got, want)
		}
	}
	a.OnTimeout = events.Approve
	if got := a.TimeoutFor(time.Minute); got != 10*time.Minute {
		t.Errorf("on_timeout approve: TimeoutFor(1m) = %s", got)
	}
}
