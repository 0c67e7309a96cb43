package policy_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/assent-dev/assent/pkg/events"
	"github.com/assent-dev/assent/pkg/policy"
)

func Example() {
	p, err := policy.Parse([]byte(`
version: 1
principals:
  alice: {roles: [finance]}
  bob:   {roles: [finance]}
rules:
  - name: read-only
    tools: ["read_*", "list_*"]
    action: allow
  - name: big-reimbursements
    tools: [reimburse]
    when: 'double(args.amount) > 1000.0'
    action: require_approval
    approvers: ["role:finance"]
    quorum: 2
`), "policy.yaml")
	if err != nil {
		fmt.Println(err)
		return
	}
	in, err := policy.InputFrom(events.Requested{
		Tool: "reimburse", Args: []byte(`{"amount": 2500}`), User: "alice",
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	res := p.Evaluate(in, time.Now(), nil)
	fmt.Println(res.Action, res.Rule, res.Approval.Approvers, res.Approval.Quorum)
	fmt.Println(res.Approval.Eligible("alice", in)) // alice asked for the money herself

	t := res.Approval.Tally(in, []policy.Vote{{Principal: "bob", Verdict: events.Approve}})
	fmt.Println(t.Decided, len(t.Approvals), "of", t.Need)
	// Output:
	// require_approval big-reimbursements [role:finance] 2
	// not an eligible approver: self-approval is not allowed: alice is the user the request is made for (rule big-reimbursements)
	// false 1 of 2
}

func ExampleExplain() {
	p, _ := policy.Parse([]byte(`
version: 1
mode: auto-deny
rules:
  - name: read-only
    tools: ["read_*"]
    action: allow
`), "policy.yaml")
	in, _ := policy.InputFrom(events.Requested{Tool: "read_file"})
	fmt.Print(policy.Explain(p.Evaluate(in, time.Now(), nil)))
	// Output:
	// decision: allow (automatic)
	// rule: read-only
	// reason: allowed by rule read-only
}

// The worked examples of docs/policy.md behave as the page says.
func TestWorkedExamples(t *testing.T) {
	type check struct {
		req    string
		action policy.Action
		rule   string
	}
	for file, checks := range map[string][]check{
		"reimbursements.yaml": {
			{`{"tool":"reimburse","session":"s","args":{"amount":250}}`, policy.Allow, "small-reimbursements"},
			{`{"tool":"reimburse","session":"s","args":{"amount":1000}}`, policy.Allow, "small-reimbursements"},
			{`{"tool":"reimburse","session":"s","args":{"amount":1000.01}}`, policy.RequireApproval, "big-reimbursements"},
			{`{"tool":"reimburse","session":"s","args":{"amount":"many"}}`, policy.RequireApproval, "big-reimbursements"},
			{`{"tool":"reimburse","session":"s"}`, policy.RequireApproval, "big-reimbursements"},
			{`{"tool":"send_email"}`, policy.RequireApproval, "mode:manual"},
		},
		"production-databases.yaml": {
			{`{"tool":"drop_database","labels":{"env":"production"},"args":{"name":"orders"}}`, policy.Deny, "no-drop-in-prod"},
			{`{"tool":"sql_exec","labels":{"env":"prod"},"args":{"statement":"drop table orders;"}}`, policy.Deny, "no-drop-in-prod"},
			{`{"tool":"sql_exec","labels":{"env":"prod"},"args":{"sql":"select 1"}}`, policy.Deny, "no-drop-in-prod"},
			{`{"tool":"sql_exec","labels":{"env":"prod"},"args":{"statement":"SELECT 1"}}`, policy.RequireApproval, "prod-sql-needs-dba"},
			{`{"tool":"drop_database","labels":{"env":"staging"}}`, policy.RequireApproval, "mode:manual"},
		},
		"read-only.yaml": {
			{`{"tool":"list_files"}`, policy.Allow, "read-only-tools"},
			{`{"tool":"read_file","args":{"path":"/etc/shadow"}}`, policy.Allow, "read-only-tools"},
			{`{"tool":"cat_file","args":{"path":"/tmp/a"}}`, policy.Allow, "reads-under-tmp"},
			{`{"tool":"cat_file","args":{"path":"/etc/a"}}`, policy.RequireApproval, "mode:manual"},
			{`{"tool":"cat_file"}`, policy.RequireApproval, "mode:manual"},
			{`{"tool":"delete_file"}`, policy.RequireApproval, "mode:manual"},
		},
	} {
		p := mustParse(t, readExample(t, file))
		for _, c := range checks {
			res := p.Evaluate(input(t, c.req), t0, policy.GrantSet{})
			if res.Action != c.action || res.Rule != c.rule {
				t.Errorf("%s: %s: %s by %s, want %s by %s", file, c.req, res.Action, res.Rule, c.action, c.rule)
			}
		}
	}

	// Reimbursements: two distinct people from finance, neither the requester.
	p := mustParse(t, readExample(t, "reimbursements.yaml"))
	in := input(t, `{"tool":"reimburse","user":"alice","session":"s","args":{"amount":5000}}`)
	a := p.Evaluate(in, t0, nil).Approval
	votes := []policy.Vote{{Principal: "alice", Verdict: events.Approve}, {Principal: "bob", Verdict: events.Approve}}
	if tl := a.Tally(in, votes); tl.Decided {
		t.Errorf("requester counted: %+v", tl)
	}
	votes = append(votes, policy.Vote{Principal: "dana", Verdict: events.Approve})
	if tl := a.Tally(in, votes); !tl.Decided || tl.Verdict != events.Approve {
		t.Errorf("bob and dana: %+v", tl)
	}
	if tl := a.Tally(in, append(votes[:2:2], policy.Vote{Principal: "dana", Verdict: events.Deny})); !tl.Decided || tl.Verdict != events.Deny {
		t.Errorf("one deny: %+v", tl)
	}
	if err := a.Eligible("carol", in); err == nil {
		t.Error("carol (engineering) may approve")
	}
	if _, err := a.NewGrant("g", events.Approve, events.Remember{Scope: "session"}, in, "bob", t0); err == nil {
		t.Error("big reimbursements are rememberable")
	}
	// Small reimbursements count against the session's daily 5000.
	small := p.Evaluate(input(t, `{"tool":"reimburse","session":"s","args":{"amount":300}}`), t0, nil)
	if len(small.Limits) != 1 || small.Limits[0].Name != "session-reimbursed" {
		t.Errorf("small reimbursement limits: %+v", small.Limits)
	}
}
