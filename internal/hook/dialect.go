package hook

import (
	"bytes"
	"encoding/json"
	"slices"
)

// Dialect is one coding agent's before-tool hook protocol: the event its
// input is for, which of its tools change nothing, and how an answer is
// written on stdout.
//
// All three agents send the same snake_case fields on stdin (session_id,
// cwd, hook_event_name, tool_name, tool_input, ...; see Parse). They differ
// in the answer:
//
//   - Claude Code (PreToolUse): {"hookSpecificOutput": {"hookEventName":
//     "PreToolUse", "permissionDecision": "allow" or "deny",
//     "permissionDecisionReason": ..., "updatedInput": {...}}}; updatedInput
//     replaces the tool's input.
//   - Codex (PreToolUse): the same object, but Codex takes "allow" only with
//     updatedInput, so an approval of the call as asked prints nothing,
//     which lets the call go on as Codex would run it.
//   - Gemini CLI (BeforeTool): {"decision": "allow" or "deny", "reason":
//     ..., "hookSpecificOutput": {"tool_input": {...}}}; tool_input is
//     merged over the model's arguments, so an edit that removes an
//     argument cannot be carried, and is refused with the arguments to
//     call it with instead.
type Dialect struct {
	// Name selects the dialect on the command line: "claude", "codex",
	// "gemini".
	Name string
	// Agent is the Assent agent the hook asks as unless told otherwise, and
	// the requests' label coding_agent: "claude-code", "codex",
	// "gemini-cli".
	Agent string
	// Title names the coding agent to people: "Claude Code".
	Title string
	// Event is the hook event the input is for: "PreToolUse", "BeforeTool".
	Event string
	// readOnly are the agent's tools that cannot change anything: no file,
	// no process, no request to an address the model chose.
	readOnly []string
	// render writes v as the agent reads it; nil output prints nothing.
	render func(v Verdict) ([]byte, error)
	// carries reports whether running edited in place of asked can be said
	// in the protocol.
	carries func(asked, edited json.RawMessage) bool
}

// Dialects returns the dialects assent-hook speaks, in the order of its
// commands.
func Dialects() []Dialect {
	return []Dialect{Claude(), Codex(), Gemini()}
}

// DialectNamed returns the dialect called name, and whether there is one.
func DialectNamed(name string) (Dialect, bool) {
	for _, d := range Dialects() {
		if d.Name == name {
			return d, true
		}
	}
	return Dialect{}, false
}

// Claude is Claude Code's PreToolUse command hook.
func Claude() Dialect {
	return Dialect{
		Name: "claude", Agent: "claude-code", Title: "Claude Code", Event: "PreToolUse",
		// Reading files and searches; the todo list and a background
		// shell's output are the agent's own state. Bash, WebFetch (a GET
		// can carry data out), Task (a subagent), the MCP resource tools
		// and every MCP tool are not here.
		readOnly: []string{"Read", "Glob", "Grep", "LS", "NotebookRead", "WebSearch", "TodoRead", "TodoWrite", "BashOutput"},
		render:   preToolUse,
		carries:  func(_, _ json.RawMessage) bool { return true },
	}
}

// Codex is Codex's PreToolUse command hook. Its tools (Bash, apply_patch,
// MCP tools) all change things or may.
func Codex() Dialect {
	return Dialect{
		Name: "codex", Agent: "codex", Title: "Codex", Event: "PreToolUse",
		render: func(v Verdict) ([]byte, error) {
			if v.Allow && v.Input == nil {
				// Codex refuses "allow" without updatedInput as a failed
				// hook; no answer lets the call go on.
				return nil, nil
			}
			return preToolUse(v)
		},
		carries: func(_, _ json.RawMessage) bool { return true },
	}
}

// Gemini is Gemini CLI's BeforeTool command hook.
func Gemini() Dialect {
	return Dialect{
		Name: "gemini", Agent: "gemini-cli", Title: "Gemini CLI", Event: "BeforeTool",
		readOnly: []string{"read_file", "read_many_files", "list_directory", "glob", "search_file_content", "google_web_search", "write_todos"},
		render:   beforeTool,
		carries:  keepsEveryKey,
	}
}

// ReadOnly reports whether tool is one of the dialect's tools that cannot
// change anything (the label read_only). Bash and the like never are, nor
// is any MCP tool: the hook cannot know what one does.
func (d Dialect) ReadOnly(tool string) bool { return slices.Contains(d.readOnly, tool) }

// Render returns v as the agent reads it on stdout: one line of JSON, or
// nothing.
func (d Dialect) Render(v Verdict) ([]byte, error) { return d.render(v) }

// preToolUse writes v as the hookSpecificOutput of a PreToolUse hook.
func preToolUse(v Verdict) ([]byte, error) {
	type specific struct {
		HookEventName            string          `json:"hookEventName"`
		PermissionDecision       string          `json:"permissionDecision"`
		PermissionDecisionReason string          `json:"permissionDecisionReason,omitempty"`
		UpdatedInput             json.RawMessage `json:"updatedInput,omitempty"`
	}
	out := specific{HookEventName: "PreToolUse", PermissionDecision: "deny", PermissionDecisionReason: v.Reason}
	if v.Allow {
		out.PermissionDecision, out.UpdatedInput = "allow", v.Input
	}
	return line(struct {
		HookSpecificOutput specific `json:"hookSpecificOutput"`
	}{out})
}

// beforeTool writes v as a Gemini CLI BeforeTool hook's answer.
func beforeTool(v Verdict) ([]byte, error) {
	type specific struct {
		ToolInput json.RawMessage `json:"tool_input"`
	}
	out := struct {
		Decision           string    `json:"decision"`
		Reason             string    `json:"reason,omitempty"`
		HookSpecificOutput *specific `json:"hookSpecificOutput,omitempty"`
	}{Decision: "deny", Reason: v.Reason}
	if v.Allow {
		out.Decision, out.Reason = "allow", ""
		if v.Input != nil {
			out.HookSpecificOutput = &specific{v.Input}
		}
	}
	return line(out)
}

// keepsEveryKey reports whether edited, merged over asked, is edited: it has
// every top-level key of asked.
func keepsEveryKey(asked, edited json.RawMessage) bool {
	var a, e map[string]json.RawMessage
	if json.Unmarshal(asked, &a) != nil || json.Unmarshal(edited, &e) != nil {
		return false
	}
	for k := range a {
		if _, ok := e[k]; !ok {
			return false
		}
	}
	return true
}

// line is v as one line of JSON, HTML characters unescaped.
func line(v any) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}
