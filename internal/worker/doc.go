// Package worker is the logic behind cmd/agent-worker: a real example agent
// that runs a scripted tool plan against a sandbox directory and asks Assent
// before every guarded call, and a load generator for the broker.
//
// The agent side, in brief:
//
//	sb, _ := worker.OpenSandbox("/tmp/demo")
//	plan, _ := worker.LoadPlan("examples/plan.json")
//	client, _ := handler.NewClient(nc, handler.Config{Agent: "file-manager"})
//	a, _ := worker.NewAgent(client, sb, worker.AgentConfig{}, log)
//	sum, err := a.RunPlan(ctx, plan, func(r worker.StepReport) { ... })
//
// A step marked "approval": true runs only if the broker's decision is
// approved, and then with the decision's args (an approver may have edited
// them), after checking them against the decision's digest. Every path a tool
// touches is confined to the sandbox: Sandbox.Resolve rejects absolute paths
// outside it, ".." that climbs out of it and symbolic links that lead out of
// it, and the tools themselves go through an os.Root, so a link swapped in
// after the check cannot lead out either.
//
// Load sends N requests at concurrency C through the same SDK call and
// measures request-to-decision latency; point it at a broker in auto-approve
// mode. AnswerLoad measures the human path against a broker in manual mode:
// it approves each request as soon as it is pending, and times the answer to
// the decision. Both also run against the raw JetStream baseline (StartRaw,
// RawClient): the least a durable broker must do for the same exchange, on
// the same server, for comparison.
package worker
