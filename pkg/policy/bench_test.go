package policy_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/assent-dev/assent/pkg/events"
	"github.com/assent-dev/assent/pkg/policy"
)

// benchPolicy returns a 100-rule policy in which every rule has its own tool
// glob and a CEL condition, with the three actions mixed, and a request that
// only the 95th rule matches.
func benchPolicy(b *testing.B) (*policy.Policy, policy.Input) {
	b.Helper()
	var src strings.Builder
	src.WriteString("version: 1\nmode: manual\nprincipals:\n  alice: {roles: [finance]}\n  bob: {roles: [finance]}\nrules:\n")
	actions := []string{"allow", "deny", "require_approval"}
	for i := range 100 {
		fmt.Fprintf(&src, "  - name: rule-%03d\n    tools: [\"svc%03d_*\", \"tool_%03d\"]\n    agents: [\"agent-*\"]\n", i, i, i)
		fmt.Fprintf(&src, "    when: 'has(args.amount) && double(args.amount) > %d.0 && args.path.startsWith(\"/srv/%03d/\") && labels.env == \"prod\"'\n", i*10, i)
		fmt.Fprintf(&src, "    action: %s\n", actions[i%3])
		if actions[i%3] == "require_approval" {
			src.WriteString("    approvers: [\"role:finance\"]\n    quorum: 2\n")
		}
	}
	p, err := policy.Parse([]byte(src.String()), "bench.yaml")
	if err != nil {
		b.Fatal(err)
	}
	in, err := policy.InputFrom(events.Requested{
		Tool: "svc095_transfer", Agent: "agent-7", Session: "s-1", User: "carol",
		Args:   []byte(`{"amount": 5000, "path": "/srv/095/ledger", "currency": "EUR", "note": "quarterly"}`),
		Labels: map[string]string{"env": "prod", "team": "payments"},
	})
	if err != nil {
		b.Fatal(err)
	}
	if res := p.Evaluate(in, t0, nil); res.Rule != "rule-095" || len(res.Errors) > 0 {
		b.Fatalf("bench request decided by %s (%v)", res.Rule, res.Errors)
	}
	return p, in
}

func BenchmarkEvaluate100Rules(b *testing.B) {
	p, in := benchPolicy(b)
	b.ReportAllocs()
	for b.Loop() {
		p.Evaluate(in, t0, nil)
	}
}

// BenchmarkEvaluate100RulesAllConditions is the worst case, not the target:
// every rule's globs match, so all 100 conditions run (and are false).
func BenchmarkEvaluate100RulesAllConditions(b *testing.B) {
	var src strings.Builder
	src.WriteString("version: 1\nmode: auto-approve\nrules:\n")
	for i := range 100 {
		fmt.Fprintf(&src, "  - name: rule-%03d\n    when: 'has(args.amount) && double(args.amount) > %d.0 && args.path.startsWith(\"/srv/%03d/\")'\n    action: %s\n",
			i, 10000+i, i, []string{"allow", "deny", "require_approval"}[i%3])
	}
	p, err := policy.Parse([]byte(src.String()), "bench.yaml")
	if err != nil {
		b.Fatal(err)
	}
	in, err := policy.InputFrom(events.Requested{Tool: "pay", Args: []byte(`{"amount": 5000, "path": "/srv/095/ledger"}`)})
	if err != nil {
		b.Fatal(err)
	}
	if res := p.Evaluate(in, t0, nil); res.Rule != "mode:auto-approve" {
		b.Fatalf("decided by %s", res.Rule)
	}
	b.ReportAllocs()
	for b.Loop() {
		p.Evaluate(in, t0, nil)
	}
}

// BenchmarkEvaluate100RulesWithInput includes decoding the request (InputFrom:
// args JSON and digest), as the broker does per request.
func BenchmarkEvaluate100RulesWithInput(b *testing.B) {
	p, in := benchPolicy(b)
	req := events.Requested{
		Tool: in.Tool, Agent: in.Agent, Session: in.Session, User: in.User, Labels: in.Labels,
		Args: []byte(`{"amount": 5000, "path": "/srv/095/ledger", "currency": "EUR", "note": "quarterly"}`),
	}
	b.ReportAllocs()
	for b.Loop() {
		in, err := policy.InputFrom(req)
		if err != nil {
			b.Fatal(err)
		}
		p.Evaluate(in, t0, nil)
	}
}

// BenchmarkEvaluateRemembered is the auto-approval path through a remembered
// choice: no rule matches, a session grant does.
func BenchmarkEvaluateRemembered(b *testing.B) {
	p, in := benchPolicy(b)
	in.Tool = "unmatched_tool"
	grants := policy.GrantSet{grant("g", events.Approve, "unmatched_tool", events.ScopeSession, "s-1")}
	if res := p.Evaluate(in, t0, grants); res.Rule != "remembered:g" {
		b.Fatalf("decided by %s", res.Rule)
	}
	b.ReportAllocs()
	for b.Loop() {
		p.Evaluate(in, t0, grants)
	}
}

func BenchmarkParse100Rules(b *testing.B) {
	var src strings.Builder
	src.WriteString("version: 1\nrules:\n")
	for i := range 100 {
		fmt.Fprintf(&src, "  - {name: r%d, tools: [\"t%d_*\"], when: 'args.n > %d', action: deny}\n", i, i, i)
	}
	data := []byte(src.String())
	b.ReportAllocs()
	for b.Loop() {
		if _, err := policy.Parse(data, "bench.yaml"); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkInputFrom reads a request as the broker does for every request it
// evaluates.
func BenchmarkInputFrom(b *testing.B) {
	for _, bm := range []struct{ name, args string }{
		{"small", `{"n":1}`},
		{"nested", `{"amount": 5000, "path": "/srv/095/ledger", "currency": "EUR", "note": "quarterly", "tags": ["a", "b"], "m": {"k": [1, 2.5, null]}}`},
	} {
		b.Run(bm.name, func(b *testing.B) {
			req := events.Requested{Tool: "noop", Agent: "bench", Args: []byte(bm.args)}
			b.ReportAllocs()
			for b.Loop() {
				if _, err := policy.InputFrom(req); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkGrantKeys is the broker's lookup of remembered choices for a
// request with an agent but no session or user, as every request a broker
// decides by its mode is looked up.
func BenchmarkGrantKeys(b *testing.B) {
	in, err := policy.InputFrom(events.Requested{Tool: "noop", Agent: "bench", Args: []byte(`{"n":1}`)})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if len(policy.GrantKeys(in)) != 2 {
			b.Fatal("want 2 keys")
		}
	}
}
