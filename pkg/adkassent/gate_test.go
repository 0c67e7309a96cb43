package adkassent_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"google.golang.org/adk/agent"
	"google.golang.org/adk/tool/functiontool"
	"google.golang.org/genai"

	"github.com/assent-dev/assent/internal/broker"
	"github.com/assent-dev/assent/internal/brokertest"
	"github.com/assent-dev/assent/pkg/adkassent"
	"github.com/assent-dev/assent/pkg/events"
	"github.com/assent-dev/assent/pkg/handler"
	"github.com/assent-dev/assent/pkg/policy"
)

const gatePolicy = `
version: 1
mode: manual
rules:
  - name: small-reimbursements
    tools: [reimburse]
    when: 'has(args.amount) && args.amount <= 100'
    action: allow
  - name: reads
    tools: ["read_*"]
    action: allow
  - name: no-secrets-for-mallory
    tools: [read_secret]
    when: 'user == "mallory"'
    action: deny
  - name: unshared-notes
    tools: ["note_*"]
    when: '!session.startsWith("shared-")'
    action: allow
  - name: lookups
    tools: ["lookup_*"]
    action: allow
  - name: big-reimbursements
    tools: [reimburse]
    when: 'double(args.amount) > 100.0'
    action: require_approval
limits:
  - {name: lookups, tools: ["lookup_*"], per: agent, max: 100}
`

// The mode allows everything no rule decides.
const autoPolicy = `
version: 1
mode: auto-approve
`

func mustPolicy(t *testing.T, src string) *policy.Policy {
	t.Helper()
	p, err := policy.Parse([]byte(src), "policy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	return p
}

type reimburseArgs struct {
	Amount float64 `json:"amount"`
	Note   string  `json:"note,omitempty"`
}

func TestGate(t *testing.T) {
	p := mustPolicy(t, gatePolicy)
	now := func() time.Time { return time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC) }
	tests := []struct {
		name  string
		gate  adkassent.Gate
		tool  string
		args  any
		needs bool
	}{
		{"allowed by a rule", adkassent.Gate{Policy: p, Agent: agentName, Now: now}, "reimburse", reimburseArgs{Amount: 50}, false},
		{"needs approval", adkassent.Gate{Policy: p, Agent: agentName, Now: now}, "reimburse", reimburseArgs{Amount: 5000}, true},
		{"no amount", adkassent.Gate{Policy: p, Agent: agentName, Now: now}, "reimburse", map[string]any{}, true},
		{"allowed without a condition", adkassent.Gate{Policy: p, Now: now}, "read_file", map[string]any{"path": "/tmp/x"}, false},
		{"manual mode", adkassent.Gate{Policy: p, Now: now}, "delete_file", map[string]any{}, true},
		{"a deny rule reads the unknown user", adkassent.Gate{Policy: p, Now: now}, "read_secret", map[string]any{}, true},
		{"the user is known", adkassent.Gate{Policy: p, User: "carol", Now: now}, "read_secret", map[string]any{}, false},
		{"the user is known and denied", adkassent.Gate{Policy: p, User: "mallory", Now: now}, "read_secret", map[string]any{}, true},
		{"the allow rule reads the session", adkassent.Gate{Policy: p, User: "carol", Now: now}, "note_add", map[string]any{}, true},
		{"a limit counts it", adkassent.Gate{Policy: p, Now: now}, "lookup_user", map[string]any{}, true},
		{"the mode allows", adkassent.Gate{Policy: mustPolicy(t, autoPolicy), Now: now}, "anything", map[string]any{}, true},
		{"no policy", adkassent.Gate{Now: now}, "read_file", map[string]any{}, true},
		{"args not an object", adkassent.Gate{Policy: p, Now: now}, "read_file", []int{1}, true},
		{"args not JSON", adkassent.Gate{Policy: p, Now: now}, "read_file", func() {}, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.gate.Needs(tc.tool, tc.args); got != tc.needs {
				t.Errorf("Needs(%s, %v) = %v, want %v", tc.tool, tc.args, got, tc.needs)
			}
		})
	}
}

// With the Gate as the tool's RequireConfirmationProvider, what the policy
// allows runs at once, and the rest goes to the broker, which applies the
// same policy.
func TestGateWithBroker(t *testing.T) {
	p := mustPolicy(t, gatePolicy)
	tests := []struct {
		amount        float64
		confirmations int
	}{
		{amount: 50, confirmations: 0},
		{amount: 5000, confirmations: 1},
	}
	for _, tc := range tests {
		t.Run("", func(t *testing.T) {
			e := newEnv(t, broker.Config{Policy: p})
			brokertest.RunApprover(t, e.nc, handler.ApproverConfig{Principal: "alice", Channel: "cli"},
				func(context.Context, handler.Request) (handler.Response, error) {
					return handler.Response{Decision: events.Approve}, nil
				})
			rec := &runs{}
			gate := adkassent.Gate{Policy: p, Agent: agentName}
			tl, err := functiontool.New(functiontool.Config{Name: "reimburse", RequireConfirmationProvider: adkassent.RequireConfirmation[reimburseArgs](gate, "reimburse")},
				func(ctx agent.ToolContext, a reimburseArgs) (map[string]any, error) {
					rec.add(a, ctx.ToolConfirmation())
					return map[string]any{"paid": a.Amount}, nil
				})
			if err != nil {
				t.Fatal(err)
			}
			call := []*genai.FunctionCall{{Name: "reimburse", Args: map[string]any{"amount": tc.amount}}}
			p := e.agent(t, dbPath(t), tl, call, adkassent.Config{})
			sid := newSession(t, p.sessions)

			got := drain(p.r.Run(t.Context(), userID, sid, userText("reimburse me"), agent.RunConfig{}))
			if len(got.errs) > 0 {
				t.Fatalf("run: %v", errors.Join(got.errs...))
			}
			if n := got.confirmations(); n != tc.confirmations {
				t.Errorf("%d confirmations asked, want %d", n, tc.confirmations)
			}
			if n := rec.count(); n != 1 {
				t.Fatalf("the tool ran %d times, want 1", n)
			}
			if res := got.toolResult(t, "reimburse"); res["paid"] != tc.amount {
				t.Errorf("the tool's result %v", res)
			}
			if as := answers(t, p.sessions, sid); len(as) != tc.confirmations {
				t.Errorf("answers %v, want %d", as, tc.confirmations)
			}
		})
	}
}
