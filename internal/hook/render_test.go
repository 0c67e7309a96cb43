package hook_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/assent-dev/assent/internal/hook"
	"github.com/assent-dev/assent/pkg/events"
	"github.com/assent-dev/assent/pkg/handler"
)

// Each dialect writes each kind of verdict as its agent reads it: exactly
// these bytes, one line, or nothing.
func TestRender(t *testing.T) {
	allow := hook.Verdict{Allow: true, Reason: "Approved in Assent by carol (web) (Assent request r1)."}
	edited := hook.Verdict{Allow: true, Input: json.RawMessage(`{"command":"rm -rf build"}`), Reason: "Approved <with> changes."}
	deny := hook.Verdict{Reason: `Not run: carol (slack) denied this Bash call in Assent: "not on main".`}
	for _, tc := range []struct {
		dialect string
		v       hook.Verdict
		want    string
	}{
		{"claude", allow, `{"hookSpecificOutput":{"hookEventName":"PreToolUse","permissionDecision":"allow","permissionDecisionReason":"Approved in Assent by carol (web) (Assent request r1)."}}`},
		{"claude", edited, `{"hookSpecificOutput":{"hookEventName":"PreToolUse","permissionDecision":"allow","permissionDecisionReason":"Approved <with> changes.","updatedInput":{"command":"rm -rf build"}}}`},
		{"claude", deny, `{"hookSpecificOutput":{"hookEventName":"PreToolUse","permissionDecision":"deny","permissionDecisionReason":"Not run: carol (slack) denied this Bash call in Assent: \"not on main\"."}}`},
		{"codex", allow, ``},
		{"codex", edited, `{"hookSpecificOutput":{"hookEventName":"PreToolUse","permissionDecision":"allow","permissionDecisionReason":"Approved <with> changes.","updatedInput":{"command":"rm -rf build"}}}`},
		{"codex", deny, `{"hookSpecificOutput":{"hookEventName":"PreToolUse","permissionDecision":"deny","permissionDecisionReason":"Not run: carol (slack) denied this Bash call in Assent: \"not on main\"."}}`},
		{"gemini", allow, `{"decision":"allow"}`},
		{"gemini", edited, `{"decision":"allow","hookSpecificOutput":{"tool_input":{"command":"rm -rf build"}}}`},
		{"gemini", deny, `{"decision":"deny","reason":"Not run: carol (slack) denied this Bash call in Assent: \"not on main\"."}`},
	} {
		got, err := dialect(t, tc.dialect).Render(tc.v)
		if err != nil {
			t.Fatal(err)
		}
		want := tc.want
		if want != "" {
			want += "\n"
		}
		if string(got) != want {
			t.Errorf("%s, allow %v, input %s:\n got %q\nwant %q", tc.dialect, tc.v.Allow, tc.v.Input, got, want)
		}
	}
}

// Each outcome of a decision becomes what the agent must do, saying who or
// which rule decided; an edit runs where the dialect can say it, and is
// refused with the arguments to use where it cannot.
func TestDecided(t *testing.T) {
	asked := json.RawMessage(`{"command":"rm -rf build node_modules/.cache","description":"Clean"}`)
	call := hook.Call{Tool: "Bash", Input: asked}
	by := func(principal, channel string) []events.DecidedBy {
		return []events.DecidedBy{{Principal: principal, Channel: channel, Decision: events.Approve}}
	}
	for _, tc := range []struct {
		name    string
		dialect string
		d       handler.Decision
		allow   bool
		input   string // the input to run instead, "" for none
		reason  []string
	}{
		{"approved", "claude", handler.Decision{Outcome: events.Approved, Args: asked, DecidedBy: by("carol", "web"), Rule: "coding-agent-changes"},
			true, "", []string{"Approved in Assent by carol (web) under rule coding-agent-changes (Assent request r1)."}},
		{"approved, args the same but for their order", "claude", handler.Decision{Outcome: events.Approved, Args: json.RawMessage(`{"description":"Clean", "command":"rm -rf build node_modules/.cache"}`), DecidedBy: by("carol", "web")},
			true, "", []string{"Approved in Assent by carol (web)"}},
		{"allowed by policy", "claude", handler.Decision{Outcome: events.Approved, Args: asked, Auto: true, Rule: "coding-agent-reads"},
			true, "", []string{"by policy rule coding-agent-reads"}},
		{"allowed by a remembered choice", "gemini", handler.Decision{Outcome: events.Approved, Args: asked, Auto: true, Rule: "remembered:g1"},
			true, "", []string{"by a remembered choice (g1)"}},
		{"allowed by the mode", "codex", handler.Decision{Outcome: events.Approved, Args: asked, Auto: true, Rule: "mode:auto-approve"},
			true, "", []string{"by the broker's auto-approve mode"}},
		{"edited", "claude", handler.Decision{Outcome: events.Approved, Edited: true, Args: json.RawMessage(`{"command":"rm -rf build"}`), DecidedBy: by("carol", "slack")},
			true, `{"command":"rm -rf build"}`, []string{"carol (slack) with changed arguments, which are what runs"}},
		{"edited, codex", "codex", handler.Decision{Outcome: events.Approved, Edited: true, Args: json.RawMessage(`{"command":"rm -rf build"}`), DecidedBy: by("carol", "slack")},
			true, `{"command":"rm -rf build"}`, nil},
		{"edited, every key kept, gemini", "gemini", handler.Decision{Outcome: events.Approved, Edited: true, Args: json.RawMessage(`{"command":"rm -rf build","description":"Clean"}`), DecidedBy: by("carol", "email")},
			true, `{"command":"rm -rf build","description":"Clean"}`, nil},
		{"edited, a key removed, gemini", "gemini", handler.Decision{Outcome: events.Approved, Edited: true, Args: json.RawMessage(`{"command":"rm -rf build"}`), DecidedBy: by("carol", "email")},
			false, "", []string{"carol (email) approved this Bash call in Assent only with changed arguments, which this hook cannot pass on to Gemini CLI", `call Bash again with exactly these arguments: {"command":"rm -rf build"}`}},
		{"denied", "claude", handler.Decision{Outcome: events.Denied, Reason: "not on main", DecidedBy: by("carol", "slack"), Rule: "coding-agent-changes"},
			false, "", []string{`Not run: carol (slack) under rule coding-agent-changes denied this Bash call in Assent: "not on main". Do not try it again unchanged`}},
		{"denied by policy", "codex", handler.Decision{Outcome: events.Denied, Reason: "no force-pushing from a coding agent", Auto: true, Rule: "no-force-push"},
			false, "", []string{`Not run: policy rule no-force-push denied this Bash call in Assent: "no force-pushing from a coding agent".`}},
		{"expired", "gemini", handler.Decision{Outcome: events.Expired, Reason: "timed out"},
			false, "", []string{`Not run: nobody approved this Bash call in Assent in time: "timed out". Ask the user to approve it`}},
		{"cancelled", "claude", handler.Decision{Outcome: events.Cancelled, Reason: "requester stopped waiting"},
			false, "", []string{`the Assent request for this Bash call was cancelled: "requester stopped waiting"`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.d.RequestID = "r1"
			v := dialect(t, tc.dialect).Decided(call, tc.d)
			if v.Allow != tc.allow || string(v.Input) != tc.input {
				t.Errorf("verdict allow %v, input %s; want allow %v, input %s", v.Allow, v.Input, tc.allow, tc.input)
			}
			for _, r := range append(tc.reason, "(Assent request r1)") {
				if !strings.Contains(v.Reason, r) {
					t.Errorf("reason %q, want it to hold %q", v.Reason, r)
				}
			}
		})
	}
}
