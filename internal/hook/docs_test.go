package hook_test

import (
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/assent-dev/assent/internal/doccheck"
	"github.com/assent-dev/assent/internal/envflag"
	"github.com/assent-dev/assent/internal/hook"
	"github.com/assent-dev/assent/pkg/policy"
)

// The section of docs/integrations.md about the hook, and the README.
const (
	integrations = "../../docs/integrations.md"
	readme       = "../../README.md"
	section      = "## Coding agents: `assent-hook`"
)

// docBlocks returns the code blocks of the hook's section of
// docs/integrations.md.
func docBlocks(t testing.TB) []doccheck.Block {
	t.Helper()
	data, err := os.ReadFile(integrations)
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(data), "\n"+section+"\n")
	if !ok {
		t.Fatalf("%s has no section %q", integrations, section)
	}
	if end := strings.Index(rest, "\n## "); end >= 0 {
		rest = rest[:end]
	}
	return doccheck.Extract(integrations, rest)
}

// docPolicy is the policy the section shows (coding-agents.yaml): the one
// these tests run the broker with.
func docPolicy(t testing.TB) *policy.Policy {
	t.Helper()
	for _, b := range docBlocks(t) {
		if b.Lang == "yaml" && strings.HasPrefix(b.Text, "# coding-agents.yaml\n") {
			p, err := policy.Parse([]byte(b.Text), "coding-agents.yaml")
			if err != nil {
				t.Fatal(err)
			}
			return p
		}
	}
	t.Fatalf("%s: no coding-agents.yaml in the section %q", integrations, section)
	return nil
}

// agentConfig is a coding agent's hook configuration as the docs show it.
type agentConfig struct {
	Hooks map[string][]struct {
		Matcher string `json:"matcher"`
		Hooks   []struct {
			Type    string  `json:"type"`
			Command string  `json:"command"`
			Timeout float64 `json:"timeout"`
		} `json:"hooks"`
	} `json:"hooks"`
}

// Every hook configuration the docs show (each agent's in the section, the
// README's) runs a command line assent-hook takes, in the dialect of the
// event it is under, and tells the hook the timeout the agent gives it:
// Gemini CLI's in milliseconds, the others' in seconds.
func TestDocHookConfigs(t *testing.T) {
	var blocks []doccheck.Block
	blocks = append(blocks, docBlocks(t)...)
	data, err := os.ReadFile(readme)
	if err != nil {
		t.Fatal(err)
	}
	blocks = append(blocks, doccheck.Extract(readme, string(data))...)
	seen := map[string]int{}
	for _, b := range blocks {
		if b.Lang != "json" || !strings.Contains(b.Text, `"hooks"`) {
			continue
		}
		var cfg agentConfig
		if err := json.Unmarshal([]byte(b.Text), &cfg); err != nil {
			t.Errorf("%s: %v", b.Where(), err)
			continue
		}
		for event, groups := range cfg.Hooks {
			for _, g := range groups {
				for _, h := range g.Hooks {
					cmds := doccheck.Commands(h.Command)
					if h.Type != "command" || len(cmds) != 1 || !strings.HasSuffix(cmds[0].Args[0], "assent-hook") {
						t.Errorf("%s: %s hook %q: want one assent-hook command", b.Where(), event, h.Command)
						continue
					}
					cmd, err := hook.ParseArgs(cmds[0].Args[1:], envflag.Env{}, t.Output())
					if err != nil {
						t.Errorf("%s: %s: %v", b.Where(), h.Command, err)
						continue
					}
					if cmd.Dialect.Event != event {
						t.Errorf("%s: assent-hook %s under %s: it answers %s", b.Where(), cmd.Name, event, cmd.Dialect.Event)
					}
					unit := time.Second
					if cmd.Name == "gemini" {
						unit = time.Millisecond
					}
					if given := time.Duration(h.Timeout * float64(unit)); given != cmd.Config.HookTimeout {
						t.Errorf("%s: %s: the agent's timeout is %s, --hook-timeout %s: give the same", b.Where(), h.Command, given, cmd.Config.HookTimeout)
					}
					seen[cmd.Name]++
				}
			}
		}
	}
	for _, d := range hook.Dialects() {
		if seen[d.Name] == 0 {
			t.Errorf("no configuration of assent-hook %s in %s or %s", d.Name, integrations, readme)
		}
	}
}

// The hints the docs show ("What the approver sees") are the hints of
// recorded inputs, as the hook makes them.
func TestDocHints(t *testing.T) {
	hints := map[string]bool{}
	for _, r := range inputs {
		d := dialect(t, r.dialect)
		c, err := hook.Parse(d, r.data(t))
		if err != nil {
			t.Fatal(err)
		}
		hints[d.Hint(c)] = true
	}
	shown := 0
	for _, b := range docBlocks(t) {
		if b.Lang != "text" || !strings.Contains(b.Text, " wants to ") {
			continue
		}
		for i, line := range strings.Split(strings.TrimSuffix(b.Text, "\n"), "\n") {
			shown++
			if !hints[line] {
				t.Errorf("%s:%d: %q is the hint of no recorded input", integrations, b.TextLine(i), line)
			}
		}
	}
	if shown == 0 {
		t.Errorf("%s shows no hints", integrations)
	}
}
