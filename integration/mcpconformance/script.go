package mcpconformance

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"
)

// ProtocolVersion is the MCP version the script asks for.
const ProtocolVersion = "2025-11-25"

// ClientInfo is how the script's client names itself.
var ClientInfo = map[string]any{"name": "assent-conformance", "version": "1.0.0"}

// ClientCapabilities are what the script's client offers: roots (and says
// when they change), sampling, and form elicitation.
var ClientCapabilities = map[string]any{
	"roots":       map[string]any{"listChanged": true},
	"sampling":    map[string]any{},
	"elicitation": map[string]any{"form": map[string]any{}},
}

// EverythingRoots are the roots the client offers server-everything, and
// EverythingRootsChanged those it offers after it says they changed.
var (
	EverythingRoots        = []Root{{URI: "file:///conformance/project", Name: "project"}}
	EverythingRootsChanged = []Root{{URI: "file:///conformance/project", Name: "project"}, {URI: "file:///conformance/notes", Name: "notes"}}
)

// EverythingTools are the tools of server-everything 2026.8.31 the script
// calls. The last four are registered once the client has initialized,
// the first three of them only for a client that offers roots, sampling
// and elicitation; simulate-research-query is the one tool that declares
// execution.taskSupport ("required"). Not called: get-env (the server
// process's environment, which differs with how it was started) and
// toggle-simulated-logging (log messages of random levels). Not offered to
// this client: trigger-url-elicitation (URL elicitation) and the -async
// tools (a client that runs sampling and elicitation as tasks).
var EverythingTools = []string{
	"echo", "get-sum", "get-annotated-message", "get-tiny-image", "get-structured-content",
	"get-resource-links", "get-resource-reference", "gzip-file-as-resource",
	"toggle-subscriber-updates", "trigger-long-running-operation",
	"get-roots-list", "trigger-sampling-request", "trigger-elicitation-request", "simulate-research-query",
}

// Resources and prompts of server-everything the script reads and gets.
const (
	everythingDoc          = "demo://resource/static/document/instructions.md"
	everythingTextTemplate = "demo://resource/dynamic/text/{resourceId}"
	everythingTaskTool     = "simulate-research-query"
)

// RunEverything runs the script against server-everything on c: every
// kind of message the MCP specification lets a server and a client
// exchange, each step named. What is missing or unexpected along the way
// (a tool not listed, a request the server should have made and did not)
// is noted on c and the script goes on, so that a run through a proxy
// shows every difference at once. Every wait for the server (a response,
// a request or notification it should send) is bounded by patience. The
// error is for a session that could not start (initialize failed).
func RunEverything(ctx context.Context, c *Conn, patience time.Duration) error {
	s := &script{c: c, ctx: ctx, patience: patience}
	c.SetRoots(EverythingRoots)
	if err := s.initialize(); err != nil {
		return err
	}
	s.basics()
	s.resources()
	s.prompts()
	s.completions()
	s.logging()
	s.toolCalls()
	s.roots()
	s.cancel()
	s.tasks()
	s.errors()
	s.call("ping (end)", "ping", nil)
	return nil
}

// script is one run of RunEverything.
type script struct {
	c        *Conn
	ctx      context.Context
	patience time.Duration

	init   map[string]any            // the initialize result
	listed map[string]map[string]any // tools/list, by name
	// rootsAsked: the server asked for roots after initialization, so it
	// is expected to ask again when told they changed.
	rootsAsked bool
}

// call sends a request and waits for its response; a missing response is
// noted and ok is false.
func (s *script) call(step, method string, params any) (Response, bool) {
	ctx, cancel := context.WithTimeout(s.ctx, s.patience)
	defer cancel()
	r, err := s.c.Call(ctx, step, method, params)
	if err != nil {
		s.c.Note("%s: %v", step, err)
		return Response{}, false
	}
	return r, true
}

// result is call for a request expected to succeed: an error response is
// noted, and the result decoded into a map.
func (s *script) result(step, method string, params any) (map[string]any, bool) {
	r, ok := s.call(step, method, params)
	if !ok {
		return nil, false
	}
	if r.Error != nil {
		s.c.Note("%s: %v", step, r.Error)
		return nil, false
	}
	var m map[string]any
	if err := json.Unmarshal(r.Result, &m); err != nil {
		s.c.Note("%s: result is not an object: %v", step, err)
		return nil, false
	}
	return m, true
}

// failure is call for a request expected to fail, with a JSON-RPC error
// or a tool error (isError).
func (s *script) failure(step, method string, params any) {
	r, ok := s.call(step, method, params)
	if !ok || r.Error != nil {
		return
	}
	var m struct {
		IsError bool `json:"isError"`
	}
	if json.Unmarshal(r.Result, &m) != nil || !m.IsError {
		s.c.Note("%s: succeeded, expected an error", step)
	}
}

// notify sends a notification, noting a failure to send.
func (s *script) notify(step, method string, params any) {
	ctx, cancel := context.WithTimeout(s.ctx, s.patience)
	defer cancel()
	if err := s.c.Notify(ctx, step, method, params); err != nil {
		s.c.Note("%s: %v", step, err)
	}
}

// expect waits, from message index from on, for a message from the server
// that match accepts; when none comes, it notes that what did not.
func (s *script) expect(from int, what string, match func(Entry) bool) (int, bool) {
	ctx, cancel := context.WithTimeout(s.ctx, s.patience)
	defer cancel()
	i, err := s.c.Await(ctx, from, match)
	if err != nil {
		s.c.Note("%s did not come within %s", what, s.patience)
		return -1, false
	}
	return i, true
}

// logged matches a log message whose data contains text.
func logged(text string) func(Entry) bool {
	return ReceivedMethod("notifications/message", func(p map[string]any) bool {
		d, _ := p["data"].(string)
		return strings.Contains(d, text)
	})
}

func (s *script) initialize() error {
	r, ok := s.call("initialize", "initialize", map[string]any{
		"protocolVersion": ProtocolVersion,
		"capabilities":    ClientCapabilities,
		"clientInfo":      ClientInfo,
	})
	if !ok {
		return fmt.Errorf("initialize: no response\n%s", s.c.Diagnostics())
	}
	if err := r.Decode(&s.init); err != nil {
		return fmt.Errorf("initialize: %w", err)
	}
	v, _ := s.init["protocolVersion"].(string)
	if v != ProtocolVersion {
		s.c.Note("initialize: the server chose protocol version %q, not %q", v, ProtocolVersion)
	}
	if v != "" {
		s.c.SetProtocolVersion(v)
	}
	// Over streamable HTTP, the GET stream is opened before the session
	// starts, so that what the server sends outside any request (its
	// roots/list, list changes) has somewhere to go rather than being
	// dropped by timing.
	ctx, cancel := context.WithTimeout(s.ctx, s.patience)
	err := s.c.Listen(ctx)
	cancel()
	if err != nil {
		s.c.Note("open the GET stream: %v", err)
	}
	from := s.c.Len()
	s.notify("initialized", "notifications/initialized", nil)
	// server-everything asks for the client's roots once initialized, and
	// logs how many it got; waiting for both orders them before the next
	// steps.
	if _, ok := s.expect(from, "the server's roots/list after initialization", ReceivedMethod("roots/list", nil)); ok {
		s.rootsAsked = true
		s.expect(from, `the log "Roots updated: 1 root(s)"`, logged("Roots updated: 1 root(s)"))
	}
	return nil
}

func (s *script) basics() {
	s.call("ping", "ping", nil)
	s.listed = map[string]map[string]any{}
	for page, cursor := 1, ""; ; page++ {
		var params map[string]any
		if cursor != "" {
			params = map[string]any{"cursor": cursor}
		}
		res, ok := s.result(fmt.Sprintf("tools/list page %d", page), "tools/list", params)
		if !ok {
			break
		}
		tools, _ := res["tools"].([]any)
		for _, t := range tools {
			tool, _ := t.(map[string]any)
			name, _ := tool["name"].(string)
			s.listed[name] = tool
		}
		if cursor, _ = res["nextCursor"].(string); cursor == "" {
			break
		}
	}
	for _, name := range EverythingTools {
		if s.listed[name] == nil {
			s.c.Note("tools/list: the tool %s is missing", name)
		}
	}
}

func (s *script) listAll(step, method, field string) []map[string]any {
	var all []map[string]any
	for page, cursor := 1, ""; ; page++ {
		var params map[string]any
		if cursor != "" {
			params = map[string]any{"cursor": cursor}
		}
		res, ok := s.result(fmt.Sprintf("%s page %d", step, page), method, params)
		if !ok {
			return all
		}
		items, _ := res[field].([]any)
		for _, it := range items {
			m, _ := it.(map[string]any)
			all = append(all, m)
		}
		if cursor, _ = res["nextCursor"].(string); cursor == "" {
			return all
		}
	}
}

func has(items []map[string]any, field, value string) bool {
	return slices.ContainsFunc(items, func(m map[string]any) bool { return m[field] == value })
}

func (s *script) resources() {
	if !has(s.listAll("resources/list", "resources/list", "resources"), "uri", everythingDoc) {
		s.c.Note("resources/list: %s is missing", everythingDoc)
	}
	if !has(s.listAll("resources/templates/list", "resources/templates/list", "resourceTemplates"), "uriTemplate", everythingTextTemplate) {
		s.c.Note("resources/templates/list: %s is missing", everythingTextTemplate)
	}
	s.result("resources/read listed", "resources/read", map[string]any{"uri": everythingDoc})
	s.result("resources/read templated text", "resources/read", map[string]any{"uri": "demo://resource/dynamic/text/1"})
	s.result("resources/read templated blob", "resources/read", map[string]any{"uri": "demo://resource/dynamic/blob/2"})
	s.failure("resources/read unknown", "resources/read", map[string]any{"uri": "demo://resource/no-such-thing"})
}

func (s *script) prompts() {
	prompts := s.listAll("prompts/list", "prompts/list", "prompts")
	for _, name := range []string{"simple-prompt", "args-prompt", "completable-prompt", "resource-prompt"} {
		if !has(prompts, "name", name) {
			s.c.Note("prompts/list: the prompt %s is missing", name)
		}
	}
	s.result("prompts/get without arguments", "prompts/get", map[string]any{"name": "simple-prompt"})
	s.result("prompts/get with arguments", "prompts/get", map[string]any{"name": "args-prompt", "arguments": map[string]any{"city": "Lisbon", "state": "Lisboa"}})
	s.result("prompts/get with an optional argument left out", "prompts/get", map[string]any{"name": "args-prompt", "arguments": map[string]any{"city": "Porto"}})
	s.result("prompts/get embedding a resource", "prompts/get", map[string]any{"name": "resource-prompt", "arguments": map[string]any{"resourceType": "Text", "resourceId": "2"}})
	s.failure("prompts/get missing a required argument", "prompts/get", map[string]any{"name": "args-prompt", "arguments": map[string]any{}})
	s.failure("prompts/get unknown", "prompts/get", map[string]any{"name": "no-such-prompt"})
}

func (s *script) completions() {
	if caps, _ := s.init["capabilities"].(map[string]any); caps["completions"] == nil {
		s.c.Note("initialize: the server does not advertise completions")
	}
	prompt := map[string]any{"type": "ref/prompt", "name": "completable-prompt"}
	s.result("completion/complete prompt argument", "completion/complete", map[string]any{
		"ref": prompt, "argument": map[string]any{"name": "department", "value": "E"}})
	s.result("completion/complete prompt argument in context", "completion/complete", map[string]any{
		"ref": prompt, "argument": map[string]any{"name": "name", "value": ""},
		"context": map[string]any{"arguments": map[string]any{"department": "Sales"}}})
	s.result("completion/complete resource template variable", "completion/complete", map[string]any{
		"ref": map[string]any{"type": "ref/resource", "uri": everythingTextTemplate}, "argument": map[string]any{"name": "resourceId", "value": "7"}})
}

// logging sets the level and makes the server log: server-everything logs
// each resources/subscribe and unsubscribe at info. Subscribed, the
// resource gets an update notification once toggle-subscriber-updates
// turns updates on.
func (s *script) logging() {
	uri := map[string]any{"uri": everythingDoc}
	s.result("logging/setLevel info", "logging/setLevel", map[string]any{"level": "info"})
	from := s.c.Len()
	if _, ok := s.result("resources/subscribe", "resources/subscribe", uri); ok {
		s.expect(from, "the log of resources/subscribe", logged("Received Subscribe Resource request"))
		from = s.c.Len()
		s.result("tools/call toggle-subscriber-updates on", "tools/call", map[string]any{"name": "toggle-subscriber-updates", "arguments": map[string]any{}})
		s.expect(from, "notifications/resources/updated", ReceivedMethod("notifications/resources/updated", func(p map[string]any) bool { return p["uri"] == everythingDoc }))
	} else {
		s.result("tools/call toggle-subscriber-updates on", "tools/call", map[string]any{"name": "toggle-subscriber-updates", "arguments": map[string]any{}})
	}
	// Unsubscribed first, so that an update the 5-second timer sends late
	// finds no subscriber.
	s.result("resources/unsubscribe", "resources/unsubscribe", uri)
	s.result("tools/call toggle-subscriber-updates off", "tools/call", map[string]any{"name": "toggle-subscriber-updates", "arguments": map[string]any{}})
	// At level error the info lines of subscribe and unsubscribe must not
	// be sent: a difference shows a proxy that ignores setLevel.
	s.result("logging/setLevel error", "logging/setLevel", map[string]any{"level": "error"})
	s.result("resources/subscribe, not logged at level error", "resources/subscribe", uri)
	s.result("resources/unsubscribe, not logged at level error", "resources/unsubscribe", uri)
	s.result("logging/setLevel debug", "logging/setLevel", map[string]any{"level": "debug"})
}

func (s *script) tool(step, name string, args map[string]any) (map[string]any, bool) {
	return s.result(step, "tools/call", map[string]any{"name": name, "arguments": args})
}

func (s *script) toolCalls() {
	s.tool("tools/call echo", "echo", map[string]any{"message": "hello, conformance"})
	s.result("tools/call echo with _meta", "tools/call", map[string]any{
		"name": "echo", "arguments": map[string]any{"message": "with _meta"},
		"_meta": map[string]any{"dev.assent.conformance/trace": "step-echo"}})
	s.tool("tools/call get-sum", "get-sum", map[string]any{"a": 2, "b": 40})
	s.tool("tools/call get-sum of fractions", "get-sum", map[string]any{"a": 0.25, "b": 1.5})
	s.tool("tools/call get-annotated-message", "get-annotated-message", map[string]any{"messageType": "error", "includeImage": true})
	s.tool("tools/call get-tiny-image", "get-tiny-image", map[string]any{})
	s.tool("tools/call get-structured-content", "get-structured-content", map[string]any{"location": "Chicago"})
	s.tool("tools/call get-resource-links", "get-resource-links", map[string]any{"count": 2})
	s.tool("tools/call get-resource-reference", "get-resource-reference", map[string]any{"resourceType": "Blob", "resourceId": 3})

	// gzip-file-as-resource adds a resource to the session: the server
	// says the resource list changed, and the new one can be read.
	from := s.c.Len()
	data := "data:text/plain;base64," + base64.StdEncoding.EncodeToString([]byte("conformance\n"))
	if _, ok := s.tool("tools/call gzip-file-as-resource", "gzip-file-as-resource", map[string]any{"name": "conformance.txt.gz", "data": data, "outputType": "resourceLink"}); ok {
		s.expect(from, "notifications/resources/list_changed", ReceivedMethod("notifications/resources/list_changed", nil))
	}
	if !has(s.listAll("resources/list after gzip-file-as-resource", "resources/list", "resources"), "uri", "demo://resource/session/conformance.txt.gz") {
		s.c.Note("resources/list: the session resource made by gzip-file-as-resource is missing")
	}
	s.result("resources/read session resource", "resources/read", map[string]any{"uri": "demo://resource/session/conformance.txt.gz"})

	// Progress: the tool reports each step to the token the call carries.
	from = s.c.Len()
	const token = "conformance-progress-1"
	if _, ok := s.result("tools/call trigger-long-running-operation with progress", "tools/call", map[string]any{
		"name": "trigger-long-running-operation", "arguments": map[string]any{"duration": 1, "steps": 3},
		"_meta": map[string]any{"progressToken": token}}); ok {
		if n := s.count(from, ReceivedMethod("notifications/progress", func(p map[string]any) bool { return p["progressToken"] == token })); n != 3 {
			s.c.Note("trigger-long-running-operation: %d progress notifications before its result, want 3", n)
		}
	}

	// Sampling and elicitation: the server asks the client during the call.
	from = s.c.Len()
	if _, ok := s.tool("tools/call trigger-sampling-request", "trigger-sampling-request", map[string]any{"prompt": "Say hello to the conformance suite", "maxTokens": 32}); ok {
		if s.count(from, ReceivedMethod("sampling/createMessage", nil)) != 1 {
			s.c.Note("trigger-sampling-request: no sampling/createMessage during the call")
		}
	}
	from = s.c.Len()
	if _, ok := s.tool("tools/call trigger-elicitation-request", "trigger-elicitation-request", map[string]any{}); ok {
		if s.count(from, ReceivedMethod("elicitation/create", nil)) != 1 {
			s.c.Note("trigger-elicitation-request: no elicitation/create during the call")
		}
	}
}

// count is how many messages from index from on match, leaving out an
// approval's own (normalize.go): a proxy's keep-alive progress is not the
// server's.
func (s *script) count(from int, match func(Entry) bool) int {
	n := 0
	for _, e := range s.c.Transcript("").Entries[from:] {
		if !match(e) {
			continue
		}
		if m, err := parseMessage(e.Msg); err == nil {
			if v, err := decode(e.Msg); err == nil && approvalOwn(m, v) {
				continue
			}
		}
		n++
	}
	return n
}

func (s *script) roots() {
	s.tool("tools/call get-roots-list", "get-roots-list", map[string]any{})
	s.c.SetRoots(EverythingRootsChanged)
	from := s.c.Len()
	s.notify("notifications/roots/list_changed", "notifications/roots/list_changed", nil)
	if s.rootsAsked {
		if _, ok := s.expect(from, "the server's roots/list after roots/list_changed", ReceivedMethod("roots/list", nil)); ok {
			s.expect(from, `the log "Roots updated: 2 root(s)"`, logged("Roots updated: 2 root(s)"))
		}
	}
	s.tool("tools/call get-roots-list after the change", "get-roots-list", map[string]any{})
}

// cancel starts a slow call and cancels it: the server must not answer it.
// The call carries no progress token, so that nothing at all follows the
// cancellation; a ping after it orders what comes next.
func (s *script) cancel() {
	ctx, done := context.WithTimeout(s.ctx, s.patience)
	defer done()
	p, err := s.c.Start(ctx, "tools/call trigger-long-running-operation, cancelled", "tools/call", map[string]any{
		"name": "trigger-long-running-operation", "arguments": map[string]any{"duration": 120, "steps": 1}})
	if err != nil {
		s.c.Note("start the call to cancel: %v", err)
		return
	}
	s.notify("notifications/cancelled", "notifications/cancelled", map[string]any{"requestId": p.ID, "reason": "the conformance script cancels it"})
	s.call("ping after the cancellation", "ping", nil)
}

// tasks runs a task-augmented call to completion, with the elicitation the
// task makes on the way (delivered through tasks/result), and cancels
// another.
func (s *script) tasks() {
	caps, _ := s.init["capabilities"].(map[string]any)
	tasks, _ := caps["tasks"].(map[string]any)
	requests, _ := tasks["requests"].(map[string]any)
	toolReqs, _ := requests["tools"].(map[string]any)
	if toolReqs["call"] == nil {
		s.c.Note("initialize: the server does not advertise tasks for tools/call; no task steps")
		return
	}
	exec, _ := s.listed[everythingTaskTool]["execution"].(map[string]any)
	if exec["taskSupport"] != "required" {
		s.c.Note("tools/list: %s does not declare execution.taskSupport required (%v)", everythingTaskTool, exec["taskSupport"])
	}
	s.failure("tools/call task-only tool without a task", "tools/call", map[string]any{"name": everythingTaskTool, "arguments": map[string]any{"topic": "tides"}})

	from := s.c.Len()
	id := s.startTask("tools/call as a task", map[string]any{"topic": "python", "ambiguous": true})
	if id != "" {
		s.result("tasks/result", "tasks/result", map[string]any{"taskId": id})
		if s.count(from, ReceivedMethod("elicitation/create", nil)) != 1 {
			s.c.Note("the ambiguous research task asked no elicitation/create")
		}
		s.result("tasks/get completed", "tasks/get", map[string]any{"taskId": id})
	}
	if id := s.startTask("tools/call as a task, to cancel", map[string]any{"topic": "tides"}); id != "" {
		s.result("tasks/cancel", "tasks/cancel", map[string]any{"taskId": id})
		s.result("tasks/get cancelled", "tasks/get", map[string]any{"taskId": id})
	}
	s.result("tasks/list", "tasks/list", nil)
}

// startTask calls the task tool as a task and returns the task's id.
func (s *script) startTask(step string, args map[string]any) string {
	res, ok := s.result(step, "tools/call", map[string]any{"name": everythingTaskTool, "arguments": args, "task": map[string]any{"ttl": 60000}})
	if !ok {
		return ""
	}
	task, _ := res["task"].(map[string]any)
	id, _ := task["taskId"].(string)
	if id == "" {
		s.c.Note("%s: no task in the result", step)
	}
	return id
}

func (s *script) errors() {
	s.failure("tools/call unknown tool", "tools/call", map[string]any{"name": "no-such-tool", "arguments": map[string]any{}})
	s.failure("tools/call arguments against the input schema", "tools/call", map[string]any{"name": "get-sum", "arguments": map[string]any{"a": "two", "b": 2}})
	s.failure("unknown method", "conformance/no-such-method", map[string]any{})
}
