// Package handler is Assent's Go SDK, handler-first.
//
// Agent side: a Client asks before a guarded tool call and blocks until the
// broker decides:
//
//	c, _ := handler.NewClient(nc, handler.Config{Agent: "file-manager"})
//	d, err := c.Request(ctx, handler.Request{Requested: events.Requested{Tool: "delete_file", Args: args}})
//	if err != nil { /* no decision: do not run */ }
//	if d.Approved() { run(d.Args) } // always the decided args: an approver may have edited them
//
// Client.Pending lists what the agent is waiting for (of one session, if
// named), and Client.CancelAll withdraws those requests at once, as when its
// user stops a session; the broker answers both for this agent's requests
// alone.
//
// A decision is read only from what the server tells once it stored it: its
// copy on assent-decided.<id> (the stream's RePublish) when it is the first
// message of its subject, and the first stored decision, read directly while
// waiting. Never from a plain subscription to assent.decision.<id>, which
// also delivers decisions the stream refused. The Channel and Approver
// runtimes follow the same rule.
//
// On a NATS server where anyone may publish on assent.decision.<id>, give the
// client the broker's decision keys (Config.TrustedKeys, the public keys of
// broker --decision-key): it then takes only a decision the broker signed.
//
// Approver side: a Handler is a func(ctx, Request) (Response, error); an
// Approver feeds it pending requests and publishes its answers. Slack, email,
// webhooks and terminals are all just Handlers.
//
// Both sides speak the wire contract of package events over NATS JetStream; the
// broker runs elsewhere (cmd/broker).
//
// Tracing: each Request is an OpenTelemetry span in the trace of its ctx, and
// the requested event carries that trace to the broker and the approvers, whose
// spans join it; the answers of Approver and Channel do the same. The package
// uses the OpenTelemetry API only: spans are recorded when the program
// installs an SDK as the global tracer provider, or names a provider in the
// configuration (Config.TracerProvider and its siblings). docs/tracing.md lists
// the spans.
package handler
