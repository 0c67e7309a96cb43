// Package hook puts a coding agent's own tool calls to Assent: the shell,
// edit, read and fetch tools that run inside the agent (Claude Code, Codex,
// Gemini CLI), which no MCP gateway sees. The agent runs cmd/assent-hook as
// its before-tool hook for each call, with the call as JSON on stdin; the
// hook makes the call one approval request, blocks until the broker decides
// it, and prints the answer in the agent's own hook protocol on stdout:
// allow, deny with the reason, or the arguments an approver edited, where
// the protocol can carry them.
//
// A Dialect is one agent's protocol: what its hook input holds and how an
// answer is written (dialect.go). Parse reads a hook input into a Call
// (call.go); Hook asks Assent about it and answers (hook.go); verdict.go
// turns a decision, or the lack of one, into what the agent is told.
//
// The hook fails closed. Whatever goes wrong (input it cannot read, NATS or
// the broker unreachable, no decision before the agent's own hook timeout,
// a signal) it answers deny, with a reason that says what to do next, and
// prints nothing else on stdout; diagnostics go to stderr. It answers
// before the agent's hook timeout (Config.HookTimeout), since an agent that
// kills a slow hook lets the call run.
//
// docs/integrations.md, "Coding agents", has each agent's configuration.
package hook
