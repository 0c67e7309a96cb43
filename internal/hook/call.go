package hook

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/assent-dev/assent/pkg/events"
)

// ErrInput: the hook's input is not a call this hook can put to Assent (not
// JSON, no tool, the wrong event, a tool input that is not an object, a
// field Assent refuses). The call is denied.
var ErrInput = errors.New("unreadable hook input")

// MaxInput bounds what Parse reads: more than the broker takes in one event
// (1 MiB by default), so a call too large for it is refused by the broker's
// rules, not cut here.
const MaxInput = 8 << 20

// Call is one tool call, as a coding agent's hook input gives it.
type Call struct {
	// Tool is the agent's name for the tool: Bash, Edit, read_file,
	// mcp__github__create_issue.
	Tool string
	// Input is the tool's input object, compact.
	Input json.RawMessage
	// Session is the agent's session id; ToolUseID the call's id (Claude
	// Code and Codex).
	Session, ToolUseID string
	// Cwd is the agent's working directory; PermissionMode its permission
	// mode (default, plan, acceptEdits, ...), when it says.
	Cwd, PermissionMode string
}

// input is what the agents send: the fields all three share, and Claude
// Code's and Codex's permission_mode and tool_use_id. Others (transcript_path,
// timestamp, turn_id, model, mcp_context) are not needed.
type input struct {
	SessionID      string          `json:"session_id"`
	Cwd            string          `json:"cwd"`
	HookEventName  string          `json:"hook_event_name"`
	ToolName       string          `json:"tool_name"`
	ToolInput      json.RawMessage `json:"tool_input"`
	ToolUseID      string          `json:"tool_use_id"`
	PermissionMode string          `json:"permission_mode"`
}

// Parse reads one hook input of dialect d. Errors wrap ErrInput and say
// what is wrong.
func Parse(d Dialect, data []byte) (Call, error) {
	var in input
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&in); err != nil {
		return Call{}, fmt.Errorf("%w: not a JSON object: %v", ErrInput, err)
	}
	if rest := events.TrimJSONSpace(data[dec.InputOffset():]); len(rest) > 0 {
		return Call{}, fmt.Errorf("%w: more after the JSON object", ErrInput)
	}
	switch {
	case in.HookEventName != "" && in.HookEventName != d.Event:
		return Call{}, fmt.Errorf("%w: a %s event, not %s: configure assent-hook %s as a %s hook", ErrInput, in.HookEventName, d.Event, d.Name, d.Event)
	case in.ToolName == "":
		return Call{}, fmt.Errorf("%w: no tool_name", ErrInput)
	}
	args := json.RawMessage("{}")
	if !events.EmptyJSON(in.ToolInput) {
		var b bytes.Buffer
		if err := json.Compact(&b, in.ToolInput); err != nil || b.Bytes()[0] != '{' {
			return Call{}, fmt.Errorf("%w: tool_input is not a JSON object", ErrInput)
		}
		args = b.Bytes()
	}
	return Call{Tool: in.ToolName, Input: args, Session: in.SessionID, ToolUseID: in.ToolUseID, Cwd: in.Cwd, PermissionMode: in.PermissionMode}, nil
}

// Labels are the labels of c's request, for policies: coding_agent (the
// dialect's agent name), read_only ("true" for a tool that cannot change
// anything), cwd and permission_mode when the agent says and they fit in a
// label, and mcp_server and mcp_tool for an MCP tool (mcp__<server>__<tool>).
func (d Dialect) Labels(c Call) map[string]string {
	labels := map[string]string{"coding_agent": d.Agent, "read_only": strconv.FormatBool(d.ReadOnly(c.Tool))}
	for k, v := range map[string]string{"cwd": c.Cwd, "permission_mode": c.PermissionMode} {
		if v != "" && len(v) <= events.MaxLabelLength && events.CheckIdentifier(k, v) == nil {
			labels[k] = v
		}
	}
	if server, tool, ok := mcpTool(c.Tool); ok {
		labels["mcp_server"], labels["mcp_tool"] = server, tool
	}
	return labels
}

// mcpTool splits an MCP tool's name, mcp__<server>__<tool>.
func mcpTool(name string) (server, tool string, ok bool) {
	rest, ok := strings.CutPrefix(name, "mcp__")
	if !ok {
		return "", "", false
	}
	server, tool, ok = strings.Cut(rest, "__")
	return server, tool, ok && server != "" && tool != ""
}

// hintLimit bounds what the hint quotes of the call; the approver sees the
// whole arguments beside it.
const hintLimit = 600

// Hint is one line for the approver saying what c does: the command for a
// shell tool, the file for a read or an edit, the address for a fetch. It
// quotes at most hintLimit bytes of the call and says so when it cuts;
// control characters and line breaks are shown as spaces and "⏎", so the
// line cannot pass for more than it is. The arguments, which the approver
// also sees in full, are what runs.
func (d Dialect) Hint(c Call) string {
	var in map[string]json.RawMessage
	_ = json.Unmarshal(c.Input, &in)
	str := func(keys ...string) string {
		for _, k := range keys {
			var s string
			if json.Unmarshal(in[k], &s) == nil && s != "" {
				return s
			}
		}
		return ""
	}
	var what string
	switch path, command := str("file_path", "absolute_path", "notebook_path", "path"), str("command"); {
	case c.Tool == "apply_patch":
		what = "apply a patch: " + quote(command)
	case command != "":
		what = "run " + quote(command)
		if desc := str("description"); desc != "" {
			what += " (" + cut(oneLine(desc), 200) + ")"
		}
	case str("pattern") != "":
		what = "search for " + quote(str("pattern"))
		if path != "" {
			what += " under " + quote(path)
		}
	case path != "" && d.ReadOnly(c.Tool):
		what = "read " + quote(path)
	case path != "":
		what = editVerb(c.Tool) + " " + quote(path)
		if n := edits(in["edits"]); n > 1 {
			what += fmt.Sprintf(" (%d edits)", n)
		}
	case str("url") != "":
		what = "fetch " + quote(str("url"))
	case str("query") != "":
		what = "search the web for " + quote(str("query"))
	default:
		if server, tool, ok := mcpTool(c.Tool); ok {
			what = fmt.Sprintf("call the MCP tool %s of server %s", tool, server)
		} else {
			what = "use its tool " + c.Tool
		}
	}
	h := d.Title + " wants to " + what
	if c.Cwd != "" {
		h += " in " + quote(c.Cwd)
	}
	return cut(h, events.MaxTextLength)
}

// editVerb says what tool does to the file it names.
func editVerb(tool string) string {
	switch tool {
	case "Write", "write_file":
		return "write"
	case "Edit", "MultiEdit", "NotebookEdit", "replace":
		return "edit"
	}
	return "use " + tool + " on"
}

// edits counts the edits of a MultiEdit-like input.
func edits(raw json.RawMessage) int {
	var list []json.RawMessage
	if json.Unmarshal(raw, &list) != nil {
		return 0
	}
	return len(list)
}

// quote is s on one line in backquotes, cut to hintLimit bytes.
func quote(s string) string {
	one := oneLine(s)
	if len(one) > hintLimit {
		return "`" + cut(one, hintLimit) + "` (cut: see the arguments)"
	}
	return "`" + one + "`"
}

// oneLine shows line breaks in s as "⏎" and other control and format
// characters as spaces.
func oneLine(s string) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	return strings.Map(func(r rune) rune {
		switch {
		case r == '\n':
			return '⏎'
		case unicode.Is(unicode.Cc, r) || unicode.Is(unicode.Cf, r):
			return ' '
		}
		return r
	}, strings.ReplaceAll(s, "\r\n", "\n"))
}

// cut shortens s to at most n bytes at a character boundary, marking the
// cut with "…".
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	const mark = "…"
	s = s[:n-len(mark)]
	for !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return s + mark
}
