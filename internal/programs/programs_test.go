package programs_test

import (
	"bytes"
	"context"
	"flag"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/assent-dev/assent/internal/app"
	"github.com/assent-dev/assent/internal/bot"
	"github.com/assent-dev/assent/internal/envflag"
	"github.com/assent-dev/assent/internal/mcpgateway"
	"github.com/assent-dev/assent/internal/programs"
	"github.com/assent-dev/assent/internal/worker"
)

// help runs program's command with -h, as its main does, and returns what
// it printed.
func help(t *testing.T, program, command string) string {
	t.Helper()
	args := append(strings.Fields(command), "-h")
	var out bytes.Buffer
	switch program {
	case "broker":
		if command == "" {
			if _, err := app.ParseServe(args, envflag.Env{}, &out); err != flag.ErrHelp {
				t.Errorf("broker -h: %v", err)
			}
			break
		}
		if code := (app.CLI{Stdout: &out, Stderr: &out}).Run(context.Background(), args); code != app.ExitOK {
			t.Errorf("broker %s -h: exit %d", command, code)
		}
	case "approver-bot":
		if code := bot.Main(context.Background(), "test", args, envflag.Env{}, &out, &out); code != bot.ExitOK {
			t.Errorf("approver-bot %s -h: exit %d", command, code)
		}
	case "agent-worker":
		if _, err := worker.ParseArgs(args, envflag.Env{}, &out); err != flag.ErrHelp {
			t.Errorf("agent-worker %s -h: %v", command, err)
		}
	case "mcp-gateway":
		if _, err := mcpgateway.ParseArgs(args, envflag.Env{}, &out); err != flag.ErrHelp {
			t.Errorf("mcp-gateway %s -h: %v", command, err)
		}
	default:
		t.Fatalf("no way to run %s", program)
	}
	return out.String()
}

var flagLine = regexp.MustCompile(`(?m)^  -([a-z0-9-]+)\b`)

// Each command's listed flags are exactly those its -h shows, each with its
// variable: the listing is of the flag sets the programs parse.
func TestAllMatchesHelp(t *testing.T) {
	all := programs.All()
	var names []string
	for _, p := range all {
		names = append(names, p.Name)
	}
	if want := []string{"broker", "approver-bot", "agent-worker", "mcp-gateway"}; !slices.Equal(names, want) {
		t.Fatalf("programs %v, want %v", names, want)
	}
	for _, p := range all {
		if len(p.Commands) == 0 {
			t.Errorf("%s: no commands", p.Name)
		}
		for _, c := range p.Commands {
			t.Run(strings.TrimSpace(p.Name+" "+c.Name), func(t *testing.T) {
				if c.Flags == nil {
					t.Fatal("no flag set")
				}
				var listed []string
				c.Flags.VisitAll(func(f *flag.Flag) { listed = append(listed, f.Name) })
				out := help(t, p.Name, c.Name)
				var shown []string
				for _, m := range flagLine.FindAllStringSubmatch(out, -1) {
					shown = append(shown, m[1])
				}
				if !slices.Equal(listed, shown) {
					t.Errorf("listed flags %v, -h shows %v:\n%s", listed, shown, out)
				}
				for _, name := range listed {
					if !strings.Contains(out, "(env "+envflag.Var(name)+")") {
						t.Errorf("-h does not name %s:\n%s", envflag.Var(name), out)
					}
				}
			})
		}
	}
}

// A flag called x-file would make ASSENT_X_FILE ambiguous: the variable of
// --x-file, or the file of --x.
func TestNoFlagEndsInFile(t *testing.T) {
	for _, p := range programs.All() {
		for _, c := range p.Commands {
			c.Flags.VisitAll(func(f *flag.Flag) {
				if strings.HasSuffix(envflag.Var(f.Name), envflag.FileSuffix) {
					t.Errorf("%s %s: flag --%s: its variable %s reads as the file of another", p.Name, c.Name, f.Name, envflag.Var(f.Name))
				}
			})
		}
	}
}

// The broker's serving flags are listed without running it, and are the
// ones the broker documents.
func TestBrokerServeFlags(t *testing.T) {
	serve := programs.All()[0].Commands[0]
	if serve.Name != "" {
		t.Fatalf("the broker's first command is %q, want the serving one, \"\"", serve.Name)
	}
	for _, name := range []string{"nats-url", "policy", "http", "data", "decision-key", "trust-decision-key", "log-level"} {
		if serve.Flags.Lookup(name) == nil {
			t.Errorf("no --%s", name)
		}
	}
}
