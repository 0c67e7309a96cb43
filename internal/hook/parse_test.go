package hook_test

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/assent-dev/assent/internal/hook"
	"github.com/assent-dev/assent/pkg/events"
)

// recorded is one recorded hook input (testdata/<dialect>/<name>.json) and
// what the hook must make of it.
type recorded struct {
	dialect, file string
	tool          string
	readOnly      bool
	// hint is a part of the hint the approver reads.
	hint string
	// session and callID are the hook's session_id and tool_use_id.
	session, callID string
	// mcp is the server and tool of an MCP tool.
	mcp [2]string
}

const (
	claudeSession = "9f1c2e7a-4b3d-4e8f-a1b2-c3d4e5f60718"
	codexSession  = "0199a3f2-6b1e-7c2d-9e8f-1a2b3c4d5e6f"
	geminiSession = "4e2d8c1a-77b0-4c59-8d6e-0f1e2d3c4b5a"
)

// inputs are every recorded input of a tool call, of each dialect.
var inputs = []recorded{
	{dialect: "claude", file: "bash", tool: "Bash", hint: "Claude Code wants to run `rm -rf build node_modules/.cache` (Remove build output and the module cache) in `/home/carol/proj`", session: claudeSession, callID: "toolu_01BashRmRf"},
	{dialect: "claude", file: "edit", tool: "Edit", hint: "Claude Code wants to edit `/home/carol/proj/internal/server/server.go` in `/home/carol/proj`", session: claudeSession, callID: "toolu_01EditServer"},
	{dialect: "claude", file: "multiedit", tool: "MultiEdit", hint: "Claude Code wants to edit `/home/carol/proj/README.md` (2 edits) in `/home/carol/proj`", session: claudeSession, callID: "toolu_01MultiEdit"},
	{dialect: "claude", file: "write", tool: "Write", hint: "Claude Code wants to write `/home/carol/proj/.env` in", session: claudeSession, callID: "toolu_01WriteEnv"},
	{dialect: "claude", file: "read", tool: "Read", readOnly: true, hint: "Claude Code wants to read `/home/carol/proj/go.mod`", session: claudeSession, callID: "toolu_01ReadGoMod"},
	{dialect: "claude", file: "glob", tool: "Glob", readOnly: true, hint: "Claude Code wants to search for `**/*_test.go` under `/home/carol/proj` in `/home/carol/proj`", session: claudeSession, callID: "toolu_01GlobTests"},
	{dialect: "claude", file: "grep", tool: "Grep", readOnly: true, hint: "search for `TODO\\(carol\\)` under `/home/carol/proj`", session: claudeSession, callID: "toolu_01GrepTodo"},
	{dialect: "claude", file: "webfetch", tool: "WebFetch", hint: "Claude Code wants to fetch `https://docs.nats.io/nats-concepts/jetstream`", session: claudeSession, callID: "toolu_01WebFetch"},
	{dialect: "claude", file: "websearch", tool: "WebSearch", readOnly: true, hint: "search the web for `nats jetstream message schedules`", session: claudeSession, callID: "toolu_01WebSearch"},
	{dialect: "claude", file: "todowrite", tool: "TodoWrite", readOnly: true, hint: "Claude Code wants to use its tool TodoWrite", session: claudeSession, callID: "toolu_01Todo"},
	{dialect: "claude", file: "mcp", tool: "mcp__github__create_issue", hint: "Claude Code wants to call the MCP tool create_issue of server github", session: claudeSession, callID: "toolu_01McpIssue", mcp: [2]string{"github", "create_issue"}},
	{dialect: "codex", file: "bash", tool: "Bash", hint: "Codex wants to run `git push --force origin main` in `/home/carol/proj`", session: codexSession, callID: "call_7QkBash"},
	{dialect: "codex", file: "apply_patch", tool: "apply_patch", hint: "Codex wants to apply a patch: `*** Begin Patch⏎*** Update File: main.go⏎", session: codexSession, callID: "call_7QkPatch"},
	{dialect: "codex", file: "mcp", tool: "mcp__linear__create_issue", hint: "Codex wants to call the MCP tool create_issue of server linear", session: codexSession, callID: "call_7QkMcp", mcp: [2]string{"linear", "create_issue"}},
	{dialect: "gemini", file: "run_shell_command", tool: "run_shell_command", hint: "Gemini CLI wants to run `rm -rf ~/.cache/proj` (Clear the cache)", session: geminiSession},
	{dialect: "gemini", file: "read_file", tool: "read_file", readOnly: true, hint: "Gemini CLI wants to read `/home/carol/proj/package.json`", session: geminiSession},
	{dialect: "gemini", file: "write_file", tool: "write_file", hint: "Gemini CLI wants to write `/home/carol/proj/CHANGELOG.md`", session: geminiSession},
	{dialect: "gemini", file: "replace", tool: "replace", hint: "Gemini CLI wants to edit `/home/carol/proj/src/app.ts`", session: geminiSession},
	{dialect: "gemini", file: "glob", tool: "glob", readOnly: true, hint: "Gemini CLI wants to search for `src/**/*.ts`", session: geminiSession},
	{dialect: "gemini", file: "google_web_search", tool: "google_web_search", readOnly: true, hint: "search the web for `typescript 5.9 release notes`", session: geminiSession},
	{dialect: "gemini", file: "web_fetch", tool: "web_fetch", hint: "Gemini CLI wants to use its tool web_fetch", session: geminiSession},
	{dialect: "gemini", file: "mcp", tool: "mcp__github__list_issues", hint: "call the MCP tool list_issues of server github", session: geminiSession, mcp: [2]string{"github", "list_issues"}},
}

func (r recorded) name() string { return r.dialect + "/" + r.file }

// data is the recorded input.
func (r recorded) data(t testing.TB) []byte {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", r.dialect, r.file+".json"))
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// toolInput is the recorded input's tool_input.
func (r recorded) toolInput(t testing.TB) json.RawMessage {
	t.Helper()
	var in struct {
		ToolInput json.RawMessage `json:"tool_input"`
	}
	if err := json.Unmarshal(r.data(t), &in); err != nil {
		t.Fatal(err)
	}
	return in.ToolInput
}

func dialect(t testing.TB, name string) hook.Dialect {
	t.Helper()
	d, ok := hook.DialectNamed(name)
	if !ok {
		t.Fatalf("no dialect %s", name)
	}
	return d
}

// sameArgs reports whether a and b are the same JSON object (as Assent
// hashes args).
func sameArgs(t testing.TB, a, b json.RawMessage) bool {
	t.Helper()
	da, err := events.ArgsDigest(a)
	if err != nil {
		t.Fatal(err)
	}
	db, err := events.ArgsDigest(b)
	if err != nil {
		t.Fatal(err)
	}
	return da == db
}

// Every recorded input parses into the call it holds, with the labels and
// hint a policy and an approver need.
func TestParseRecorded(t *testing.T) {
	covered := map[string]bool{}
	for _, r := range inputs {
		covered[r.name()] = true
		t.Run(r.name(), func(t *testing.T) {
			d := dialect(t, r.dialect)
			c, err := hook.Parse(d, r.data(t))
			if err != nil {
				t.Fatal(err)
			}
			if c.Tool != r.tool || c.Session != r.session || c.ToolUseID != r.callID || c.Cwd != "/home/carol/proj" {
				t.Errorf("call %+v, want tool %s, session %s, tool use %s, cwd /home/carol/proj", c, r.tool, r.session, r.callID)
			}
			if !sameArgs(t, c.Input, r.toolInput(t)) {
				t.Errorf("input %s, want the tool_input %s", c.Input, r.toolInput(t))
			}
			labels := d.Labels(c)
			want := map[string]string{"coding_agent": d.Agent, "read_only": map[bool]string{true: "true", false: "false"}[r.readOnly], "cwd": "/home/carol/proj"}
			if r.dialect != "gemini" {
				want["permission_mode"] = "default"
			}
			if r.mcp[0] != "" {
				want["mcp_server"], want["mcp_tool"] = r.mcp[0], r.mcp[1]
			}
			if len(labels) != len(want) {
				t.Errorf("labels %v, want %v", labels, want)
			}
			for k, v := range want {
				if labels[k] != v {
					t.Errorf("label %s = %q, want %q (labels %v)", k, labels[k], v, labels)
				}
			}
			h := d.Hint(c)
			if !strings.Contains(h, r.hint) || strings.ContainsAny(h, "\n\r\t") {
				t.Errorf("hint %q, want one line holding %q", h, r.hint)
			}
		})
	}
	// Every file of testdata is a case.
	for _, dir := range []string{"claude", "codex", "gemini"} {
		files, _ := filepath.Glob(filepath.Join("testdata", dir, "*.json"))
		for _, f := range files {
			if name := dir + "/" + strings.TrimSuffix(filepath.Base(f), ".json"); !covered[name] {
				t.Errorf("%s: a recorded input no case checks", f)
			}
		}
	}
}

// Inputs that are not a call this hook can put to Assent are refused with
// ErrInput, saying what is wrong.
func TestParseRefuses(t *testing.T) {
	for _, tc := range []struct {
		file, dialect, why string
	}{
		{"not_json.txt", "claude", "not a JSON object"},
		{"array.json", "claude", "not a JSON object"},
		{"empty.json", "gemini", "not a JSON object"},
		{"no_tool.json", "claude", "no tool_name"},
		{"input_string.json", "claude", "tool_input is not a JSON object"},
		{"post_tool_use.json", "claude", "a PostToolUse event, not PreToolUse"},
		{"two_values.json", "codex", "more after the JSON object"},
		// A Claude Code input given to the Gemini CLI hook.
		{"../claude/bash.json", "gemini", "a PreToolUse event, not BeforeTool"},
	} {
		t.Run(tc.file, func(t *testing.T) {
			data, err := os.ReadFile(filepath.Join("testdata", "malformed", tc.file))
			if err != nil {
				t.Fatal(err)
			}
			_, err = hook.Parse(dialect(t, tc.dialect), data)
			if !errors.Is(err, hook.ErrInput) || !strings.Contains(err.Error(), tc.why) {
				t.Errorf("error %v, want ErrInput saying %q", err, tc.why)
			}
		})
	}
}

// The hint never passes for more than the call: line breaks and control
// characters are shown, a long command is cut and says so.
func TestHintShowsAndCuts(t *testing.T) {
	d := hook.Claude()
	long := "ls" + strings.Repeat(" ", 2000) + "; rm -rf ~"
	for _, tc := range []struct {
		input   string
		want    string
		wantNot string
	}{
		{`{"command":"echo ok\nrm -rf ~"}`, "run `echo ok⏎rm -rf ~`", "\n"},
		{`{"command":"echo \u001b[2Jok\u202e"}`, "run `echo  [2Jok `", "\u001b"},
		{`{"command":"` + long + `"}`, "(cut: see the arguments)", "rm -rf"},
		{`{}`, "use its tool Bash", ""},
	} {
		c, err := hook.Parse(d, []byte(`{"tool_name":"Bash","tool_input":`+tc.input+`}`))
		if err != nil {
			t.Fatal(err)
		}
		h := d.Hint(c)
		if !strings.Contains(h, tc.want) || tc.wantNot != "" && strings.Contains(h, tc.wantNot) || len(h) > events.MaxTextLength {
			t.Errorf("hint of %.40s: %q, want %q without %q", tc.input, h, tc.want, tc.wantNot)
		}
	}
}

// Parse takes anything without panicking, and what it takes has an object
// as its input and a tool.
func FuzzParse(f *testing.F) {
	for _, dir := range []string{"claude", "codex", "gemini", "malformed"} {
		files, _ := filepath.Glob(filepath.Join("testdata", dir, "*"))
		for _, file := range files {
			data, err := os.ReadFile(file)
			if err != nil {
				f.Fatal(err)
			}
			f.Add(data)
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, d := range hook.Dialects() {
			c, err := hook.Parse(d, data)
			if err != nil {
				if !errors.Is(err, hook.ErrInput) {
					t.Fatalf("error %v does not wrap ErrInput", err)
				}
				continue
			}
			if c.Tool == "" || len(c.Input) == 0 || c.Input[0] != '{' || !json.Valid(c.Input) {
				t.Fatalf("took %q as tool %q, input %q", data, c.Tool, c.Input)
			}
			_ = d.Labels(c)
			if h := d.Hint(c); len(h) > events.MaxTextLength {
				t.Fatalf("hint of %d bytes", len(h))
			}
		}
	})
}
