// Package mcpgateway is cmd/mcp-gateway: an MCP server that stands in front
// of other MCP servers (upstreams), passes everything they offer through
// unchanged, and asks Assent before each tool call runs, so that an agent
// needs no change to be guarded: its MCP client talks to the gateway instead
// of the server.
//
//	nc, _ := natsconn.Connect(cfg.NATS.Settings())
//	g, _ := mcpgateway.New(nc, cfg, log)
//	err := g.Run(ctx, mcpgateway.RunOptions{Stdin: os.Stdin, Stdout: os.Stdout})
//
// # A proxy of messages
//
// The gateway speaks JSON-RPC with both sides, not the SDK's typed
// requests, so that what it does not know (a tool's execution, a newer
// capability) passes as it came (wire.go). Each client session (session.go)
// opens a session of its own with every upstream (upstream.go), with the
// client's initialize: the servers see the client's name, capabilities,
// roots and protocol version, and their sampling, elicitation and roots
// requests reach the client and its answers come back. Resources,
// templates, subscriptions, prompts, completions, logging, progress,
// cancellation, _meta, list changes and tasks pass through; with several
// upstreams the lists are merged, tools and prompts behind each upstream's
// Prefix, and requests go to whose their tool, prompt, resource or task is
// (lists.go). Only tools/call waits for Assent (call.go), and, when an
// upstream's Guard says so, resources/read and prompts/get (asked as tools
// ToolReadResource and ToolGetPrompt).
//
// Clients reach it over stdio (Serve) or MCP's streamable HTTP
// (Handler, httpserver.go), whose streams carry what an upstream sends
// about a request on that request's stream. A stdio upstream is a command
// the gateway starts (once per client session); a URL upstream is reached
// over streamable HTTP (httpclient.go). What a stdio upstream writes on its
// stderr is logged, a warning a line, and its last lines end the error when
// it fails to start or exits. Start looks at every upstream once, to check
// it answers and that no two offer a tool under the same name; an upstream
// whose name was made up (Upstream.AutoName: the command line's, without
// --name) takes the name the server gives itself.
//
// # What each call asks
//
// Every tools/call becomes one Assent request (handler.Client.Request), on
// the record whatever the outcome:
//
//   - tool: the tool's name as the upstream knows it, without the prefix;
//     the label mcp_server names the upstream, so a policy tells servers
//     apart with labels: {mcp_server: fs}.
//   - args: the call's arguments, as the client sent them.
//   - agent: Identity.Agent, else the client's initialize clientInfo.name
//     made into a subject token by AgentName ("Claude Desktop" asks as
//     claude-desktop).
//   - session: Identity.Session, else the MCP session id (streamable HTTP),
//     else an id the gateway makes for each stdio connection.
//   - user: Identity.User, else none.
//   - hint: what a person reads: the tool's title and description and the
//     name the client called (the description cut to the hint's 4096
//     bytes).
//   - input_schema: the tool's input schema as the upstream declares it,
//     for approvers; left out (and the hint says so) when over
//     events.MaxInputSchemaSize.
//   - labels: mcp_server, and the upstream's annotations mcp_read_only
//     ("true" or "false") and mcp_destructive, read as the MCP
//     specification does: destructive unless the tool says
//     destructiveHint: false, or says readOnlyHint: true and no
//     destructiveHint. Annotations are the upstream's claims: base policy
//     on them only for upstreams you trust.
//   - timeout: Config.Timeout, else the broker's default.
//
// The broker's policy decides before anyone is asked: an allow rule
// approves at once (read-only tools, say), a deny rule denies at once. The
// gateway has no policy of its own, so that one policy, in one place,
// decides every call and every call is recorded.
//
// # What the client sees
//
// An approved call runs upstream with the decision's args (an approver may
// have edited them), and its result comes back as the upstream made it,
// with the Verdict added to its _meta under MetaKey. A call that is denied,
// expires or is cancelled does not run: the result is a tool error
// (IsError) whose text says what happened, who decided or which rule, the
// reason, and what to do next, with the Verdict as structured content and in
// _meta. A call that cannot be asked (arguments that are not an object, a
// broker that does not answer) is a tool error too, and does not run. With
// no broker to answer (NATS unreachable, no broker ever run on it, or none
// taking up the request within Config.BrokerWait) the call fails at once
// with ErrNoBroker rather than waiting its timeout.
//
// A client that cancels its call (notifications/cancelled), ends its session
// (stdio closed, HTTP DELETE) or stops answering pings while the call waits
// (Config.ClientPing) cancels the call's request: its decision is
// cancelled, and its reason says which (ErrClientCancelled with the
// client's own reason, ErrClientGone with how it went, ErrStopped).
//
// # Asking the user in the client
//
// With Elicitation.Principal set, a client that can elicit (form mode) is
// asked too, once the broker says the request waits for people and the
// policy could let that principal answer: accept approves, decline denies,
// both with an optional reason, and the answer is published as the
// principal's on assent.response.<principal>.<id>, channel "mcp". The form
// (elicit.go) also offers to approve for the session (a remembered choice,
// where the rule allows it) and the call's arguments as fields, filled in:
// changed, they are an edit, checked against the tool's input schema. The first
// answer to count decides, from whichever channel; when another decides
// first, the question is withdrawn from the client. The user is usually the
// request's user too: the policy must then allow self-approval
// (allow_self_approval: true) for their answers to count. Clients over
// streamable HTTP are asked only with Elicitation.OverHTTP, since anyone who
// reaches the gateway's HTTP address would answer as the principal.
//
// The gateway serves its clients the MCP versions with sessions (up to
// 2025-11-25): it asks during a call and withdraws the question when the
// call is decided elsewhere, which the sessionless 2026-07-28 protocol has
// no way to do. It refuses server/discover, so clients that know the newer
// protocol fall back to the initialize handshake.
package mcpgateway
