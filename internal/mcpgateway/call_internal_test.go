package mcpgateway

import (
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

// The hint fits the wire contract's limit, cut in the schema and never in
// the middle of a character.
func TestHint(t *testing.T) {
	props := map[string]any{}
	for i := range 400 {
		props[strings.Repeat("é", 5)+string(rune('a'+i%26))+strings.Repeat("x", i%7)] = map[string]any{"type": "string", "description": "ünïcödé"}
	}
	tool := &mcp.Tool{Name: "delete_file", Title: "Delete", Description: "Delete one file.", InputSchema: map[string]any{"type": "object", "properties": props}}
	h := hint("fs__delete_file", "fs", tool)
	if len(h) > events.MaxTextLength || !utf8.ValidString(h) || !strings.HasSuffix(h, "…") ||
		!strings.HasPrefix(h, "Delete: Delete one file.\nMCP tool fs__delete_file of server fs.\nInput schema: {") {
		t.Errorf("hint of %d bytes: %q", len(h), h[:200])
	}
	small := hint("x", "s", &mcp.Tool{Name: "x", Annotations: &mcp.ToolAnnotations{Title: "Ex"}, InputSchema: map[string]any{"type": "object"}})
	if small != "Ex: (no description)\nMCP tool x of server s.\nInput schema: {\"type\":\"object\"}" {
		t.Errorf("hint %q", small)
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
