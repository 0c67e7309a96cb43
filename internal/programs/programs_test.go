package programs_test

import (
	"bytes"
	"context"
	"flag"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/assent-dev/assent/internal/app"
	"github.com/assent-dev/assent/internal/auth"
	"github.com/assent-dev/assent/internal/bot"
	"github.com/assent-dev/assent/internal/channels/email"
	"github.com/assent-dev/assent/internal/envflag"
	"github.com/assent-dev/assent/internal/hook"
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
	case "assent-hook":
		if _, err := hook.ParseArgs(args, envflag.Env{}, &out); err != flag.ErrHelp {
			t.Errorf("assent-hook %s -h: %v", command, err)
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
	if want := []string{"broker", "approver-bot", "agent-worker", "mcp-gateway", "assent-hook"}; !slices.Equal(names, want) {
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

// docs/configuration.md has the table the code makes.
func TestDocIsCurrent(t *testing.T) {
	const path = "../../docs/configuration.md"
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	want, err := programs.UpdateDoc(string(data), programs.All())
	if err != nil {
		t.Fatal(err)
	}
	if string(data) != want {
		line, have, gen := diffLine(string(data), want)
		t.Errorf("docs/configuration.md is not what the code generates: run `go generate ./internal/programs` at the repository's root, and commit docs/configuration.md.\nFirst difference, line %d:\n have %q\n want %q", line, have, gen)
	}
}

// internal/envflag/known.go lists the variables the code has, so that one
// of another command's is not warned of as a misspelling.
func TestKnownIsCurrent(t *testing.T) {
	const path = "../envflag/known.go"
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	want, err := programs.KnownSource(programs.All())
	if err != nil {
		t.Fatal(err)
	}
	if string(data) != want {
		line, have, gen := diffLine(string(data), want)
		t.Errorf("internal/envflag/known.go is not what the code generates: run `go generate ./internal/programs` at the repository's root, and commit it.\nFirst difference, line %d:\n have %q\n want %q", line, have, gen)
	}
}

// diffLine returns the first line at which a and b differ, and the two lines.
func diffLine(a, b string) (int, string, string) {
	al, bl := strings.Split(a, "\n"), strings.Split(b, "\n")
	for i := range max(len(al), len(bl)) {
		var x, y string
		if i < len(al) {
			x = al[i]
		}
		if i < len(bl) {
			y = bl[i]
		}
		if x != y {
			return i + 1, x, y
		}
	}
	return 0, "", ""
}

func TestUpdateDoc(t *testing.T) {
	progs := []programs.Program{{Name: "prog", Commands: []programs.Command{{Name: "run", Flags: flag.NewFlagSet("prog run", flag.ContinueOnError)}}}}
	progs[0].Commands[0].Flags.String("nats-url", "nats://x:4222", "the NATS `URL` | the <server>")
	progs[0].Commands[0].Flags.Bool("json", false, "print JSON")
	doc := "# title\n\nprose\n" + programs.BeginTable + "\nold table\n" + programs.EndTable + "\nmore prose\n"
	got, err := programs.UpdateDoc(doc, progs)
	if err != nil {
		t.Fatal(err)
	}
	want := "# title\n\nprose\n" + programs.BeginTable + "\n" +
		"\n### prog\n\n| command | flag | environment variable | default | description |\n| --- | --- | --- | --- | --- |\n" +
		"| `prog run` | `--json` | `ASSENT_JSON` |  | print JSON |\n" +
		"| `prog run` | `--nats-url` | `ASSENT_NATS_URL` | `nats://x:4222` | the NATS URL \\| the &lt;server&gt; |\n" +
		"\n" + programs.EndTable + "\nmore prose\n"
	if got != want {
		t.Errorf("got:\n%s\nwant:\n%s", got, want)
	}
	if again, _ := programs.UpdateDoc(got, progs); again != got {
		t.Errorf("a second update changed the document:\n%s", again)
	}
	if _, err := programs.UpdateDoc("# no markers\n", progs); err == nil {
		t.Error("no error without the markers")
	}
}

// envflag.Others are the variables Assent reads that are not flags, so that
// they are not warned of: the names the code uses.
func TestOthersAreTheCodes(t *testing.T) {
	for _, name := range []string{app.TokenEnv, auth.SecretEnv, email.DefaultPasswordEnv, email.DefaultLinkSecretEnv} {
		if !slices.Contains(envflag.Others(), name) {
			t.Errorf("envflag.Others() lacks %s", name)
		}
	}
	if n := len(envflag.Others()); n != 4 {
		t.Errorf("envflag.Others() has %d names, this test knows 4: name the new one's constant here", n)
	}
}
