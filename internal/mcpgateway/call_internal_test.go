package mcpgateway

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/assent-dev/assent/pkg/events"
	"github.com/assent-dev/assent/pkg/handler"
)

func TestMayAnswer(t *testing.T) {
	self := &events.Terms{AllowSelfApproval: true}
	tests := []struct {
		name      string
		p         events.Pending
		user      string
		principal string
		want      bool
	}{
		{"anyone", events.Pending{}, "", "carol", true},
		{"named", events.Pending{Approvers: []string{"alice", "carol"}}, "", "carol", true},
		{"a role (the broker resolves it)", events.Pending{Approvers: []string{"role:finance"}}, "", "carol", true},
		{"others only", events.Pending{Approvers: []string{"alice"}}, "", "carol", false},
		{"their own, self-approval allowed", events.Pending{Terms: self}, "carol", "carol", true},
		{"their own, not allowed", events.Pending{Terms: &events.Terms{}}, "carol", "carol", false},
		{"their own, an older broker says nothing", events.Pending{}, "carol", "carol", false},
	}
	for _, tt := range tests {
		if got := mayAnswer(tt.p, tt.principal, tt.user); got != tt.want {
			t.Errorf("%s: mayAnswer = %v, want %v", tt.name, got, tt.want)
		}
	}
}

// The hint is what a person reads: title, description and the name the
// client called, within the wire contract's limit, cut in the description
// and never in the middle of a character; no input schema in it.
func TestHint(t *testing.T) {
	tool := &mcp.Tool{Name: "delete_file", Title: "Delete", Description: strings.Repeat("Delete one fïle. ", 400),
		InputSchema: map[string]any{"type": "object", "properties": map[string]any{"path": map[string]any{"type": "string"}}}}
	h := hint("fs__delete_file", "fs", tool, true)
	if len(h) > events.MaxTextLength || !utf8.ValidString(h) || !strings.HasPrefix(h, "Delete: Delete one fïle.") ||
		!strings.HasSuffix(h, "…\nMCP tool fs__delete_file of server fs.") || strings.Contains(h, `"path"`) {
		t.Errorf("hint of %d bytes: %q", len(h), h[max(len(h)-200, 0):])
	}
	small := hint("x", "s", &mcp.Tool{Name: "x", Annotations: &mcp.ToolAnnotations{Title: "Ex"}, InputSchema: map[string]any{"type": "object"}}, true)
	if small != "Ex: (no description)\nMCP tool x of server s." {
		t.Errorf("hint %q", small)
	}
	if h := hint("x", "s", &mcp.Tool{Name: "x", Description: "X."}, false); h != "X.\nMCP tool x of server s. Its input schema is too large to show." {
		t.Errorf("hint without the schema %q", h)
	}
	long := strings.Repeat("n", events.MaxTextLength)
	if h := hint(long, "s", tool, true); len(h) > events.MaxTextLength || !utf8.ValidString(h) {
		t.Errorf("hint for a long name: %d bytes", len(h))
	}
}

// The input schema goes as the upstream declares it, unless it is over the
// wire contract's limit.
func TestInputSchema(t *testing.T) {
	tests := []struct {
		name   string
		schema any
		want   string
	}{
		{"object", map[string]any{"type": "object", "properties": map[string]any{"q": map[string]any{"type": "string", "description": "<b> & co"}}}, `{"properties":{"q":{"description":"<b> & co","type":"string"}},"type":"object"}`},
		{"raw", json.RawMessage(`{"type":"object"}`), `{"type":"object"}`},
		{"too large", map[string]any{"type": "object", "description": strings.Repeat("d", events.MaxInputSchemaSize)}, ""},
		{"not an object", []any{"type"}, ""},
		{"none", nil, ""},
	}
	for _, tt := range tests {
		got := inputSchema(&mcp.Tool{Name: "x", InputSchema: tt.schema})
		if string(got) != tt.want {
			t.Errorf("%s: %s, want %s", tt.name, got, tt.want)
		}
		r := events.Requested{Tool: "x", InputSchema: got}
		if err := r.Validate(); err != nil {
			t.Errorf("%s: the request is invalid: %v", tt.name, err)
		}
	}
}

func TestRefusal(t *testing.T) {
	tests := []struct {
		d    handler.Decision
		want []string
	}{
		{handler.Decision{RequestID: "r1", Outcome: events.Denied, Reason: "no", DecidedBy: []events.DecidedBy{{Principal: "alice", Channel: "slack"}, {Principal: "bob"}}, Rule: "big"},
			[]string{`Denied by alice (slack), bob, under rule big: "no"`, "Do not call it again unchanged", `request r1, outcome "denied"`}},
		{handler.Decision{RequestID: "r2", Outcome: events.Denied, Auto: true, Rule: "remembered:g1"}, []string{"Denied by a remembered choice (g1)."}},
		{handler.Decision{RequestID: "r2", Outcome: events.Denied, DecidedBy: []events.DecidedBy{{Principal: "alice"}}, Rule: "mode:manual"}, []string{"Denied by alice. Do not"}},
		{handler.Decision{RequestID: "r3", Outcome: events.Denied, Auto: true, Rule: "no-drop", Reason: "never"}, []string{`Denied by policy rule no-drop: "never"`}},
		{handler.Decision{RequestID: "r4", Outcome: events.Expired, Reason: "timeout"}, []string{"nobody approved this call of t in time", "ask the user"}},
		{handler.Decision{RequestID: "r5", Outcome: events.Cancelled, Reason: "by admin"}, []string{`was cancelled: "by admin"`}},
	}
	for _, tt := range tests {
		got := refusal("t", tt.d)
		for _, w := range tt.want {
			if !strings.Contains(got, w) {
				t.Errorf("refusal %q lacks %q", got, w)
			}
		}
	}
}

// The labels read the tool's hints as the MCP specification does: a
// read-only tool is not destructive unless it says so.
func TestLabelsOf(t *testing.T) {
	yes, no := true, false
	tests := []struct {
		name                  string
		a                     *mcp.ToolAnnotations
		readOnly, destructive string
	}{
		{"no annotations", nil, "false", "true"},
		{"no hints", &mcp.ToolAnnotations{Title: "T"}, "false", "true"},
		{"read-only", &mcp.ToolAnnotations{ReadOnlyHint: true}, "true", "false"},
		{"read-only, says not destructive", &mcp.ToolAnnotations{ReadOnlyHint: true, DestructiveHint: &no}, "true", "false"},
		{"read-only, says destructive", &mcp.ToolAnnotations{ReadOnlyHint: true, DestructiveHint: &yes}, "true", "true"},
		{"writes, destructive by default", &mcp.ToolAnnotations{OpenWorldHint: &no}, "false", "true"},
		{"writes, additive only", &mcp.ToolAnnotations{DestructiveHint: &no}, "false", "false"},
		{"writes, destructive", &mcp.ToolAnnotations{DestructiveHint: &yes}, "false", "true"},
	}
	for _, tt := range tests {
		l := labelsOf("fs", tt.a)
		if l["mcp_server"] != "fs" || l["mcp_read_only"] != tt.readOnly || l["mcp_destructive"] != tt.destructive || len(l) != 3 {
			t.Errorf("%s: labels %v, want mcp_read_only %s, mcp_destructive %s", tt.name, l, tt.readOnly, tt.destructive)
		}
	}
}
