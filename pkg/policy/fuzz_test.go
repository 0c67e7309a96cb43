package policy_test

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/assent-dev/assent/pkg/events"
	"github.com/assent-dev/assent/pkg/policy"
)

func FuzzParse(f *testing.F) {
	files, _ := filepath.Glob(filepath.Join("..", "..", "examples", "policies", "*.yaml"))
	for _, file := range files {
		b, err := os.ReadFile(file)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	for _, s := range []string{
		"", "version: 1\n", precedencePolicy, limitPolicy, approvalPolicy,
		"version: 1\nrules:\n  - {name: a, action: deny, when: 'args.x ==='}\n",
		"a: &a [*a]\n",
		"version: 1\nprincipals:\n  alice: {roles: &r [x]}\n  bob: {roles: *r}\n",
		"version: 1\nrules: [{name: a, action: require_approval, escalation: [{after: 1m, approvers: [any]}]}]\n",
		"\t\x00version",
		// A CEL error quoting source that spans lines must stay one line.
		"rules: \n  - when: '\"\n\n'",
	} {
		f.Add([]byte(s))
	}
	in, err := policy.InputFrom(events.Requested{
		Tool: "reimburse", Agent: "a", Session: "s", User: "alice",
		Args: json.RawMessage(`{"amount": 2500, "path": "/tmp/x", "statement": "DROP TABLE x"}`), Labels: map[string]string{"env": "prod"},
	})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := policy.Parse(data, "fuzz.yaml")
		if err != nil {
			if p != nil {
				t.Fatal("policy and error")
			}
			if !errors.Is(err, policy.ErrInvalid) {
				t.Fatalf("error %v does not match ErrInvalid", err)
			}
			for _, line := range strings.Split(err.Error(), "\n") {
				if !strings.HasPrefix(line, "fuzz.yaml:") {
					t.Fatalf("problem %q lacks file:line", line)
				}
			}
			return
		}
		res := p.Trace(in, t0, policy.GrantSet{grant("g", events.Approve, "reimburse", events.ScopeSession, "s")})
		_ = policy.Explain(res)
		if res.Approval != nil {
			res.Approval.Reachable(in, policy.StaticPresence{Principals: []string{"alice", "bob"}})
			res.Approval.Tally(in, []policy.Vote{{Principal: "bob", Verdict: events.Approve}})
			res.Approval.At(t0, time.Time{}, t0.Add(1e12))
			res.Approval.At(t0, t0.Add(1e9), t0.Add(1e12))
		}
		for _, l := range res.Limits {
			_, _ = l.Amount(in)
			_ = res.Exceeded(l, in)
		}
		if ev := p.Evaluate(in, t0, policy.GrantSet{grant("g", events.Approve, "reimburse", events.ScopeSession, "s")}); ev.Action != res.Action || ev.Rule != res.Rule {
			t.Fatalf("Evaluate %s by %s, Trace %s by %s", ev.Action, ev.Rule, res.Action, res.Rule)
		}
	})
}

// FuzzEvaluate feeds arbitrary requests to the example policies.
func FuzzEvaluate(f *testing.F) {
	var policies []*policy.Policy
	files, _ := filepath.Glob(filepath.Join("..", "..", "examples", "policies", "*.yaml"))
	for _, file := range files {
		b, err := os.ReadFile(file)
		if err != nil {
			f.Fatal(err)
		}
		p, err := policy.Parse(b, file)
		if err != nil {
			f.Fatal(err)
		}
		policies = append(policies, p)
	}
	f.Add("reimburse", `{"amount": 2500}`, `{"amount": 2500}`)
	f.Add("sql_exec", `{"statement": "drop table x"}`, `{"statement": "drop *"}`)
	f.Add("read_file", `{"path": "/tmp/a", "n": [1, 2.5, null, true, {"x": "y"}]}`, `{"n": [1, 2.5, null, true, {}]}`)
	f.Add("cat_file", `{"path": 12345678901234567890}`, `{"path": "["}`)
	f.Fuzz(func(t *testing.T, tool, args, pattern string) {
		req := events.Requested{Tool: tool, Args: json.RawMessage(args), Session: "s", Labels: map[string]string{"env": "prod"}}
		in, err := policy.InputFrom(req)
		if err != nil {
			return
		}
		g := grant("g", events.Approve, tool, events.ScopeSession, "s")
		g.ArgsPattern = json.RawMessage(pattern)
		for _, p := range policies {
			res := p.Evaluate(in, t0, policy.GrantSet{g})
			if res.Action == "" || res.Rule == "" {
				t.Fatalf("empty result %+v", res)
			}
			for _, l := range res.Limits {
				_, _ = l.Amount(in)
			}
		}
	})
}
