package adkassent_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"time"

	"google.golang.org/adk/agent"
	"google.golang.org/adk/agent/llmagent"
	"google.golang.org/adk/runner"
	"google.golang.org/adk/session"
	"google.golang.org/adk/tool"
	"google.golang.org/adk/tool/functiontool"
	"google.golang.org/genai"

	"github.com/assent-dev/assent/internal/brokertest"
	"github.com/assent-dev/assent/pkg/adkassent"
	"github.com/assent-dev/assent/pkg/events"
	"github.com/assent-dev/assent/pkg/handler"
	"github.com/assent-dev/assent/pkg/policy"
)

// An ADK agent wants to delete a file; the functiontool requires a
// confirmation, the Runner asks Assent, and the approver narrows the call to
// the draft: the tool deletes the draft.
func ExampleRunner_Run() {
	nc, stop := brokertest.Example()
	defer stop()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	// Someone approves, with edited arguments.
	a, _ := handler.NewApprover(nc, handler.ApproverConfig{Principal: "alice", Channel: "cli"},
		func(context.Context, handler.Request) (handler.Response, error) {
			return handler.Response{Decision: events.Approve, Args: json.RawMessage(`{"path":"/srv/reports/q3-draft.csv"}`)}, nil
		})
	go a.Run(ctx) //nolint:errcheck

	// The agent: a tool that always asks, and a model (scripted here) that calls it.
	del, _ := functiontool.New(functiontool.Config{Name: "delete_file", Description: "Deletes a file.", RequireConfirmation: true},
		func(_ agent.ToolContext, args deleteArgs) (deleteResult, error) {
			return deleteResult{Deleted: args.Path}, nil // os.Remove(args.Path) in earnest
		})
	model := scripted{calls: []*genai.FunctionCall{{Name: "delete_file", Args: map[string]any{"path": "/srv/reports/q3.csv"}}}}
	assistant, _ := llmagent.New(llmagent.Config{Name: "assistant", Model: model, Tools: []tool.Tool{del}})
	sessions := session.InMemoryService()
	s, _ := sessions.Create(ctx, &session.CreateRequest{AppName: "files", UserID: "carol"})

	client, _ := handler.NewClient(nc, handler.Config{Agent: "file-manager"})
	r, err := adkassent.NewRunner(client, runner.Config{AppName: "files", Agent: assistant, SessionService: sessions},
		adkassent.Config{Agent: "file-manager", Timeout: 2 * time.Minute})
	if err != nil {
		log.Fatal(err)
	}
	msg := genai.NewContentFromText("Delete the Q3 report.", genai.RoleUser)
	for ev, err := range r.Run(ctx, "carol", s.Session.ID(), msg, agent.RunConfig{}) {
		if err != nil {
			log.Fatal(err)
		}
		if ev.Content == nil {
			continue
		}
		for _, p := range ev.Content.Parts {
			if fr := p.FunctionResponse; fr != nil && fr.Response["deleted"] != nil {
				fmt.Println("deleted", fr.Response["deleted"])
			}
		}
	}
	// Output: deleted /srv/reports/q3-draft.csv
}

// The policy the broker applies decides which calls need a confirmation at
// all: small reimbursements run at once, the rest are asked.
func ExampleRequireConfirmation() {
	p, err := policy.Parse([]byte(`
version: 1
rules:
  - name: small-reimbursements
    tools: [reimburse]
    when: 'has(args.amount) && args.amount <= 100'
    action: allow
`), "policy.yaml")
	if err != nil {
		log.Fatal(err)
	}
	type reimburse struct {
		Amount float64 `json:"amount"`
	}
	needs := adkassent.RequireConfirmation[reimburse](adkassent.Gate{Policy: p, Agent: "expenses"}, "reimburse")
	// functiontool.Config{Name: "reimburse", RequireConfirmationProvider: needs}
	fmt.Println(needs(reimburse{Amount: 40}), needs(reimburse{Amount: 4000}))
	// Output: false true
}

// A tool that proposes a payload asks for an answer of the same shape.
func ExampleSchemaOf() {
	schema, _ := adkassent.SchemaOf(json.RawMessage(`{"days_approved": 0}`))
	fmt.Println(string(schema))
	// Output: {"properties":{"days_approved":{"type":"number"}},"required":["days_approved"],"type":"object"}
}

// The same confirmation is always the same Assent request.
func ExampleRequestID() {
	fmt.Println(adkassent.RequestID("file-manager", "files", "carol", "s-42", "adk-7f3c"))
	// Output: adk-dc5f99a9cb9c2d6721c80c126c01793e
}
