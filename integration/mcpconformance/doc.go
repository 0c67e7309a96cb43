// Package mcpconformance is the MCP conformance suite of mcp-gateway (issue
// 25): the same scripted client session runs directly against the MCP
// reference server server-everything and through the gateway, and the two
// transcripts are compared message by message, except an approval's own
// messages. Whatever the gateway changes, drops or adds is a difference.
//
// The client (Conn) is written directly on JSON-RPC, not on an MCP SDK, so
// that no typed struct drops a field or hides a difference: StartStdio
// speaks newline-delimited JSON with a process, DialHTTP the streamable
// HTTP transport (POST with SSE answers, Mcp-Session-Id, the GET stream,
// DELETE at the end). It records every message both ways, in order, as
// raw JSON (Transcript), and answers the server's requests itself:
// sampling, elicitation, roots, ping.
//
// RunEverything is the script: initialization, ping, tools, resources
// (read, templates, subscriptions), prompts, completions, logging levels,
// progress, sampling and elicitation during a call, roots and their
// change, cancellation, tasks, and errors. Compare normalises what
// legitimately differs between two runs (normalize.go lists each rule and
// why) and reports every difference with where it is (compare.go explains
// how messages are matched, strict about content and tolerant of
// interleaving no client can rely on).
//
// The servers are the npm packages pinned in package.json and
// package-lock.json, installed with `npm ci` in this directory;
// docs/testing.md says how to run the tests.
package mcpconformance
