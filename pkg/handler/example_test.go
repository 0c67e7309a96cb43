package handler_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"time"

	"github.com/assent-dev/assent/internal/brokertest"
	"github.com/assent-dev/assent/pkg/events"
	"github.com/assent-dev/assent/pkg/handler"
)

// An agent asks before deleting a file and runs only what was approved, with the
// arguments the approver settled on.
func ExampleClient_Request() {
	nc, stop := brokertest.Example()
	defer stop()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	// Someone approves, narrowing the call to the draft.
	a, _ := handler.NewApprover(nc, handler.ApproverConfig{Principal: "alice", Channel: "cli"},
		func(_ context.Context, req handler.Request) (handler.Response, error) {
			return handler.Response{Decision: events.Approve, Args: json.RawMessage(`{"path":"/srv/reports/q3-draft.csv"}`)}, nil
		})
	go a.Run(ctx) //nolint:errcheck

	client, err := handler.NewClient(nc, handler.Config{Agent: "file-manager"})
	if err != nil {
		log.Fatal(err)
	}
	d, err := client.Request(ctx, handler.Request{Requested: events.Requested{
		Tool:    "delete_file",
		Args:    json.RawMessage(`{"path":"/srv/reports/q3.csv"}`),
		Hint:    "Delete the Q3 report?",
		Timeout: events.Duration(2 * time.Minute),
	}})
	if err != nil {
		log.Fatal(err) // no decision: do not run the call
	}
	fmt.Println(d.Outcome, d.Edited, string(d.Args), d.DecidedBy[0].Principal)
	// Output: approved true {"path":"/srv/reports/q3-draft.csv"} alice
}

// An approver is a Handler: here a rule bot that denies anything touching /etc.
func ExampleNewApprover() {
	nc, stop := brokertest.Example()
	defer stop()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	bot := func(_ context.Context, req handler.Request) (handler.Response, error) {
		var args struct{ Path string }
		if err := json.Unmarshal(req.Args, &args); err != nil {
			return handler.Response{}, handler.Permanent(err)
		}
		if len(args.Path) >= 5 && args.Path[:5] == "/etc/" {
			return handler.Response{Decision: events.Deny, Reason: "system files are off limits"}, nil
		}
		return handler.Response{}, handler.ErrSkip // leave it to people
	}
	a, err := handler.NewApprover(nc, handler.ApproverConfig{Principal: "rulebot", Channel: "bot"}, bot)
	if err != nil {
		log.Fatal(err)
	}
	go a.Run(ctx) //nolint:errcheck

	client, _ := handler.NewClient(nc, handler.Config{Agent: "file-manager"})
	d, _ := client.Request(ctx, handler.Request{Requested: events.Requested{Tool: "delete_file", Args: json.RawMessage(`{"path":"/etc/passwd"}`)}})
	fmt.Println(d.Outcome+":", d.Reason)
	// Output: denied: system files are off limits
}

// An agent looks at what it is waiting for, then withdraws a whole session's
// requests at once, as when its user stops the session.
func ExampleClient_CancelAll() {
	nc, stop := brokertest.Example()
	defer stop()
	ctx := context.Background()

	client, err := handler.NewClient(nc, handler.Config{Agent: "file-manager"})
	if err != nil {
		log.Fatal(err)
	}
	done := make(chan handler.Decision)
	go func() {
		d, _ := client.Request(ctx, handler.Request{Requested: events.Requested{
			Tool: "delete_file", Session: "s-42", Args: json.RawMessage(`{"path":"/srv/reports/q3.csv"}`)}})
		done <- d
	}()
	var waiting []events.AgentPending
	for len(waiting) == 0 { // until the broker has stored the request
		time.Sleep(10 * time.Millisecond)
		waiting, err = client.Pending(ctx, "s-42")
		if err != nil {
			log.Fatal(err)
		}
	}
	fmt.Println("waiting for", waiting[0].Tool)
	if _, err := client.CancelAll(ctx, "s-42", "the user stopped the session"); err != nil {
		log.Fatal(err)
	}
	d := <-done
	fmt.Println(d.Outcome, "by", d.DecidedBy[0].Principal)
	// Output:
	// waiting for delete_file
	// cancelled by agent/file-manager
}
