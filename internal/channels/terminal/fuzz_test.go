package terminal

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/charmbracelet/x/ansi"

	"github.com/assent-dev/assent/pkg/events"
)

// FuzzAgentJSON feeds what agents control (a response schema, arguments) and
// what users type (edited arguments, an answer) to the helpers that read
// them: none may panic, and what they return for the screen must hold no
// control characters.
func FuzzAgentJSON(f *testing.F) {
	for _, seed := range []string{
		`{"type":"object","required":["env"],"properties":{"env":{"type":"string","enum":["prod","staging"],"description":"where"}}}`,
		`{"type":"object","properties":{"n":{"type":["integer","null"],"default":3},"tags":{"type":"array"},"o":{"type":"object"},"b":{"type":"boolean"}}}`,
		`{"properties":{"x":{"description":"\u202eevil\u001b[2J"}},"required":["x","missing"]}`,
		`{"path": "/srv/reports/q3.csv", "n": 1.50, "big": 12345678901234567890}`,
		`[1, 2]`, `null`, `"text"`, `{`, `{"a":`, ``, `{"a":"\ud800"}`, "{\"a\":\"\xff\"}",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		raw := json.RawMessage(b)
		for _, l := range schemaFields(raw) {
			if ansi.Strip(l) != l || strings.ContainsAny(l, "\x1b\r\n\u202e") {
				t.Fatalf("schema field line %q holds control characters", l)
			}
		}
		if tmpl := payloadTemplate(raw); strings.ContainsAny(tmpl, "\x1b\r\n") {
			t.Fatalf("template %q holds control characters", tmpl)
		}
		_, _ = checkPayload(raw, string(b))
		if args, err := readArgs(b); err == nil {
			if _, err := events.CanonicalArgs(args); err != nil {
				t.Fatalf("readArgs accepted %q, which is not valid args: %v", b, err)
			}
		}
		for _, l := range lines(pretty(raw)) {
			if strings.ContainsAny(l, "\x1b\r\u202e") {
				t.Fatalf("pretty line %q holds control characters", l)
			}
		}
		_ = lineDiff(lines(b), lines(pretty(raw)))
	})
}
