package policy_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/assent-dev/assent/pkg/events"
	"github.com/assent-dev/assent/pkg/policy"
)

const limitPolicy = `version: 1
mode: auto-approve
principals:
  alice: {roles: [finance]}
rules:
  - {name: reads, tools: ["read_*"], action: allow}
  - {name: big, tools: [pay], when: 'args.amount > 100000', action: require_approval, approvers: [alice]}
limits:
  - {name: spend, tools: [pay], per: session, sum: args.amount, max: 5000, window: 24h}
  - {name: rate, per: agent, max: 100, window: 1h, over: deny}
  - {name: reads, tools: ["read_*"], agents: ["bot-*"], per: global, max: 10}
  - {name: per-user, tools: [pay], per: user, sum: 'double(args.amount) * 2.0', max: 1}
`

func TestLimitsInResult(t *testing.T) {
	p := mustParse(t, limitPolicy)
	names := func(ls []*policy.Limit) string {
		var s []string
		for _, l := range ls {
			s = append(s, l.Name)
		}
		return strings.Join(s, ",")
	}
	tests := []struct {
		req    string
		grants policy.GrantSet
		action policy.Action
		limits string
	}{
		{`{"tool":"pay","agent":"a","session":"s","args":{"amount":10}}`, nil, policy.Allow, "spend,rate,per-user"},
		{`{"tool":"read_x","agent":"bot-1"}`, nil, policy.Allow, "rate,reads"},
		{`{"tool":"read_x","agent":"human"}`, nil, policy.Allow, "rate"},
		{`{"tool":"pay","agent":"a","session":"s","args":{"amount":200000}}`, nil, policy.RequireApproval, ""},
		{`{"tool":"pay","agent":"a","session":"s","args":{"amount":200000}}`, policy.GrantSet{grant("g", events.Approve, "pay", events.ScopeSession, "s")}, policy.Allow, "spend,rate,per-user"},
		{`{"tool":"pay","agent":"a","session":"s","args":{"amount":200000}}`, policy.GrantSet{grant("g", events.Deny, "pay", events.ScopeSession, "s")}, policy.Deny, ""},
	}
	for _, tc := range tests {
		var rem policy.Remembered
		if tc.grants != nil {
			rem = tc.grants
		}
		res := p.Evaluate(input(t, tc.req), t0, rem)
		if res.Action != tc.action || names(res.Limits) != tc.limits {
			t.Errorf("%s: %s with limits %q, want %s with %q", tc.req, res.Action, names(res.Limits), tc.action, tc.limits)
		}
	}
}

func TestLimitAmountAndKeys(t *testing.T) {
	p := mustParse(t, limitPolicy)
	spend, rate, reads, perUser := p.Limits[0], p.Limits[1], p.Limits[2], p.Limits[3]
	in := input(t, `{"tool":"pay","agent":"a1","session":"s 1","user":"u1","args":{"amount":12.5}}`)
	for _, tc := range []struct {
		l      *policy.Limit
		amount float64
		scope  string
		key    string
	}{
		{spend, 12.5, "session:s 1", "spend.session." + policy.KeyToken("s 1")},
		{rate, 1, "agent:a1", "rate.agent.a1"},
		{reads, 1, "global", "reads.global"},
		{perUser, 25, "user:u1", "per-user.user.u1"},
	} {
		got, err := tc.l.Amount(in)
		if err != nil || got != tc.amount {
			t.Errorf("%s: Amount = %v, %v; want %v", tc.l.Name, got, err, tc.amount)
		}
		if s := tc.l.Scope(in); s != tc.scope {
			t.Errorf("%s: Scope = %q, want %q", tc.l.Name, s, tc.scope)
		}
		if k := tc.l.Key(in); k != tc.key || !kvKey.MatchString(k) {
			t.Errorf("%s: Key = %q, want %q", tc.l.Name, k, tc.key)
		}
	}
	if k := spend.Key(input(t, `{"tool":"pay"}`)); k != "spend.session.=" || !kvKey.MatchString(k) {
		t.Errorf("Key without session = %q", k)
	}
	for _, args := range []string{`{}`, `{"amount":"x"}`, `{"amount":-5}`, `{"amount":1e400}`} {
		if _, err := spend.Amount(input(t, `{"tool":"pay","args":`+args+`}`)); !errors.Is(err, policy.ErrCondition) {
			t.Errorf("Amount of %s: %v, want ErrCondition", args, err)
		}
	}
	if !spend.Allows(4990, 10) || spend.Allows(4990, 10.5) {
		t.Error("Allows")
	}
	if d := spend.Describe(); d != "spend: sum of args.amount per session at most 5000 over 24h0m0s, else require_approval" {
		t.Errorf("Describe = %q", d)
	}
	if d := reads.Describe(); d != "reads: count overall at most 10, else require_approval" {
		t.Errorf("Describe = %q", d)
	}
}

func TestExceeded(t *testing.T) {
	p := mustParse(t, limitPolicy)
	in := input(t, `{"tool":"pay","agent":"a","session":"s","user":"alice","timeout":"1m","args":{"amount":10}}`)
	res := p.Evaluate(in, t0, nil)
	spend, rate := res.Limits[0], res.Limits[1]

	over := res.Exceeded(spend, in)
	if over.Action != policy.RequireApproval || over.Auto || over.Rule != "limit:spend" || over.Approval == nil {
		t.Fatalf("Exceeded spend: %+v", over)
	}
	// No require_approval rule matched a small payment: the mode fallback's
	// approval (anyone) with the request's timeout.
	if !over.Approval.Anyone() || over.Approval.Rule != "mode:manual" || over.Approval.Timeout.Minutes() != 1 {
		t.Errorf("fallback approval %+v", over.Approval)
	}
	if err := over.Approval.Eligible("alice", in); !errors.Is(err, policy.ErrSelfApproval) {
		t.Errorf("fallback allows self-approval: %v", err)
	}
	if d := res.Exceeded(rate, in); d.Action != policy.Deny || !d.Auto || d.Rule != "limit:rate" || d.Approval != nil {
		t.Errorf("Exceeded rate: %+v", d)
	}

	// When a require_approval rule matches too (here behind a remembered
	// approval), an exceeded limit goes to that rule's approvers.
	big := input(t, `{"tool":"pay","agent":"a","session":"s","args":{"amount":200000}}`)
	res = p.Evaluate(big, t0, policy.GrantSet{grant("g", events.Approve, "pay", events.ScopeSession, "s")})
	if over := res.Exceeded(res.Limits[0], big); over.Approval == nil || over.Approval.Rule != "big" {
		t.Errorf("Exceeded behind a grant: %+v", over)
	}
	// An allow rule: the fallback is the first matching require_approval rule.
	q := mustParse(t, `version: 1
principals: {alice: {}}
rules:
  - {name: ok, tools: [pay], action: allow}
  - {name: ask, tools: [pay], action: require_approval, approvers: [alice]}
limits:
  - {name: l, tools: [pay], per: global, max: 1}
`)
	res = q.Evaluate(in, t0, nil)
	if res.Rule != "ok" || len(res.Limits) != 1 {
		t.Fatalf("allow rule: %+v", res)
	}
	if over := res.Exceeded(res.Limits[0], in); over.Approval == nil || over.Approval.Rule != "ask" {
		t.Errorf("Exceeded after an allow rule: %+v", over)
	}
	// A Result not from Evaluate fails closed.
	if d := (policy.Result{}).Exceeded(spend, in); d.Action != policy.Deny {
		t.Errorf("zero Result Exceeded: %+v", d)
	}
}
