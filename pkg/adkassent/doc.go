// Package adkassent answers ADK-Go's tool confirmations through Assent.
//
// ADK's Human-in-the-Loop flow works like this: a tool calls
// ctx.RequestConfirmation(hint, payload) (or a functiontool has
// RequireConfirmation or RequireConfirmationProvider), ADK emits a function
// call named "adk_request_confirmation" carrying the original call, and the
// application answers it with a function response {"confirmed", "payload"}.
// ADK then runs the original call again with ctx.ToolConfirmation() set.
//
// A Runner wraps ADK's runner.Runner and gives every such confirmation to the
// broker as one approval request: tool and args are the original call's, the
// hint is the tool's, the session and user are ADK's, call_id is the original
// call's id. It forwards every event, waits for the decision and sends the
// answer back itself:
//
//	r, err := adkassent.NewRunner(client, runner.Config{AppName: "files", Agent: a, SessionService: sessions},
//		adkassent.Config{Agent: "file-manager"})
//	for ev, err := range r.Run(ctx, userID, sessionID, msg, agent.RunConfig{}) { ... }
//
// Approved is confirmed=true; denied, expired and cancelled are
// confirmed=false, and the tool's error result says why.
//
// # What runs is what was approved
//
// ADK runs the original call again with the arguments the model gave. The
// Runner installs an ADK plugin that stands between the confirmation and the
// tool: it replaces the arguments with the decision's when an approver edited
// them, so the tool runs with the edited ones; and it stops any call
// confirmed by anyone but Assent through this Runner (ErrNotApproved), such as
// a function response the application sent itself.
//
// # Payloads
//
// A tool that proposes a payload asks for a structured answer. The request's
// response_schema is Config.Schemas[tool] (SchemaFor derives one from a Go
// type), else one derived from the proposed payload's JSON (SchemaOf). The
// broker refuses an approval whose payload does not fit it; the Runner checks
// again before handing the payload to ADK and refuses one that does not fit
// (ErrPayload: the confirmation is answered confirmed=false). An approval
// without a payload (a policy's, say) hands the tool its own proposal.
//
// # Restarts
//
// Request ids are derived from the agent, the ADK app, user and session and
// the confirmation call's id (RequestID), so asking again is the same Assent
// request and gets the same decision, even one made while the agent was
// down. Resume finds the confirmations a persisted session (such as ADK's
// session/database) still waits for and answers them.
//
// # Which calls need asking
//
// Gate evaluates the same policy the broker applies (package policy, no I/O):
// RequireConfirmation[T] plugs it into functiontool.Config's
// RequireConfirmationProvider, so a call the policy allows outright runs at
// once and every other call goes to the broker, which decides and records it.
package adkassent
