package doccheck_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/conf"
	"github.com/nats-io/nats-server/v2/server"
	"gopkg.in/yaml.v3"

	"github.com/assent-dev/assent/internal/app"
	"github.com/assent-dev/assent/internal/auth"
	"github.com/assent-dev/assent/internal/bot"
	"github.com/assent-dev/assent/internal/doccheck"
	"github.com/assent-dev/assent/internal/envflag"
	"github.com/assent-dev/assent/internal/mcpgateway"
	"github.com/assent-dev/assent/internal/programs"
	"github.com/assent-dev/assent/internal/worker"
	"github.com/assent-dev/assent/pkg/events"
	"github.com/assent-dev/assent/pkg/policy"
)

// root is the repository's, from this package.
const root = "../.."

// docFiles are the Markdown files checked: README.md and docs/*.md.
func docFiles(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	return append([]string{filepath.Join(root, "README.md")}, files...)
}

// TestDocs checks every code block of README.md and docs/*.md by what it
// is (its info string, then its content): policies load as the broker loads
// them, configurations parse with their program's loader, NATS
// configurations with nats-server's parser, events decode with pkg/events,
// commands name real programs, commands and flags, and those that need no
// server run. Blocks marked as not checkable (package doccheck) are counted
// and listed; any other block that cannot be checked fails.
func TestDocs(t *testing.T) {
	tally := map[string]int{}
	var unchecked, ran []string
	for _, file := range docFiles(t) {
		data, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(root, file)
		d := &doc{t: t, file: rel, dir: t.TempDir(), files: map[string]string{}, ran: &ran}
		unchecked = append(unchecked, d.checkAll(string(data), tally)...)
	}
	var kinds []string
	for k, n := range tally {
		kinds = append(kinds, fmt.Sprintf("%s %d", k, n))
	}
	sort.Strings(kinds)
	t.Logf("blocks: %s", strings.Join(kinds, ", "))
	t.Logf("%d commands run:\n\t%s", len(ran), strings.Join(ran, "\n\t"))
	t.Logf("%d blocks not checked, as marked:\n\t%s", len(unchecked), strings.Join(unchecked, "\n\t"))
}

// checkAll checks every block of the Markdown data, counts them by kind in
// tally, and returns those not checked, with why.
func (d *doc) checkAll(data string, tally map[string]int) (unchecked []string) {
	d.t.Helper()
	for _, b := range doccheck.Extract(d.file, data) {
		kind, reason := d.check(b)
		if reason != "" {
			unchecked = append(unchecked, fmt.Sprintf("%s: %s: %s", b.Where(), kind, reason))
			tally["not checked"]++
			continue
		}
		tally[kind]++
	}
	d.crossCheck()
	return unchecked
}

// doc is the state of one Markdown file's check: the files its blocks name
// (a first line "# policy.yaml"), written into dir for its commands, and
// what the cross-checks need.
type doc struct {
	t     *testing.T
	file  string
	dir   string
	files map[string]string // base name: path in dir
	// alias maps a program built under another name (go build -o /tmp/ab
	// ./cmd/broker) to the program's name.
	alias map[string]string
	// mcpLabels are the mcp_server labels the doc's policies match, by
	// where; gateways the upstream names of each gateway shown.
	mcpLabels map[string]string
	gateways  map[string][]string
	// output is what the last command run printed; nil if it was not run.
	output *string
	// ran lists the commands run, for the report.
	ran *[]string
	// problems, if set, collects the problems found instead of failing the
	// test (TestDocCheckFinds).
	problems *[]string
}

// fail reports a problem in the doc.
func (d *doc) fail(msg string) {
	d.t.Helper()
	if d.problems != nil {
		*d.problems = append(*d.problems, msg)
		return
	}
	d.t.Error(msg)
}

// errorf reports a problem at line textLine of b's text (-1: the fence).
func (d *doc) errorf(b doccheck.Block, textLine int, format string, args ...any) {
	d.t.Helper()
	d.fail(fmt.Sprintf("%s:%d: %s block of line %d: %s", b.File, b.TextLine(textLine), b.Lang, b.Line, fmt.Sprintf(format, args...)))
}

// check checks b and returns its kind, and the reason it is not checked if
// it is not.
func (d *doc) check(b doccheck.Block) (kind, notChecked string) {
	d.t.Helper()
	switch {
	case b.NotChecked != "":
		return b.Lang, b.NotChecked
	case b.Has("excerpt"):
		if len(b.Attrs) > 1 {
			return d.excerpt(b, b.Attrs[len(b.Attrs)-1]), ""
		}
		return b.Lang, "an excerpt"
	}
	switch b.Lang {
	case "":
		d.errorf(b, -1, "no info string: say what the block is (sh, yaml, json, go, conf, ... or text for output and diagrams; internal/doccheck says how)")
		return "unlabelled", ""
	case "text":
		return "text", "output or a diagram"
	case "sh", "console":
		return d.shell(b), ""
	case "yaml":
		return d.yaml(b), ""
	case "json":
		return d.json(b), ""
	case "conf":
		return d.natsConf(b), ""
	case "go":
		return d.goBlock(b), ""
	case "python", "ts":
		return d.source(b), ""
	case "permissions":
		// internal/creds's TestDocPermissions compares them with the
		// permissions broker creds issues.
		return "permissions (internal/creds)", ""
	}
	d.errorf(b, -1, "language %q: no check for it; mark the block (<!-- not checked: REASON -->) or add one", b.Lang)
	return b.Lang, ""
}

// excerpt checks a block marked "excerpt FILE": every line of it (but
// those with "..." or "…", elisions) is a line of FILE, a file of the
// repository, which is checked as a block of the same language would be.
func (d *doc) excerpt(b doccheck.Block, file string) string {
	d.t.Helper()
	data, err := os.ReadFile(filepath.Join(root, file))
	if err != nil {
		d.errorf(b, -1, "an excerpt of %s: %v", file, err)
		return b.Lang + " excerpt"
	}
	have := map[string]bool{}
	for _, l := range strings.Split(string(data), "\n") {
		have[strings.TrimSpace(l)] = true
	}
	for i, l := range strings.Split(b.Text, "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.Contains(l, "...") && !strings.Contains(l, "…") && !have[l] {
			d.errorf(b, i, "an excerpt of %s, which has no line %q", file, l)
		}
	}
	whole := doccheck.Block{File: file, Line: 0, Lang: b.Lang, Text: string(data)}
	kind, _ := d.check(whole)
	return kind + " excerpt of " + file
}

// fileName is the file a block says it is, on its first line: "#
// policy.yaml (...)", "// agent.go"; "" if none.
func fileName(b doccheck.Block) string {
	first, _, _ := strings.Cut(b.Text, "\n")
	first = strings.TrimSpace(strings.TrimLeft(strings.TrimSpace(first), "#/"))
	name, _, _ := strings.Cut(first, " ")
	switch path.Ext(name) {
	case ".yaml", ".yml", ".json", ".conf":
		return path.Base(name)
	}
	return ""
}

// keep writes b into the doc's directory under the name it gives itself.
func (d *doc) keep(b doccheck.Block) {
	if name := fileName(b); name != "" {
		p := filepath.Join(d.dir, name)
		if err := os.WriteFile(p, []byte(b.Text), 0o600); err != nil {
			d.t.Fatal(err)
		}
		d.files[name] = p
	}
}

// Top-level keys of each kind of YAML file.
var (
	policyKeys  = []string{"version", "mode", "defaults", "principals", "rules", "limits"}
	botKeys     = []string{"nats", "policy", "http", "web_ui", "remind", "agents", "trusted_decision_keys", "slack", "email", "webhooks"}
	gatewayKeys = []string{"upstreams", "identity", "nats", "timeout", "elicitation", "client_ping"}
	authKeys    = []string{"tokens", "oidc", "proxy", "sessions", "admins"}
)

// yaml checks a YAML block with the loader of what it is.
func (d *doc) yaml(b doccheck.Block) string {
	d.t.Helper()
	d.keep(b)
	var top map[string]any
	if err := yaml.Unmarshal([]byte(b.Text), &top); err != nil {
		d.errorf(b, 0, "not YAML: %v", err)
		return "yaml"
	}
	var keys []string
	for k := range top {
		keys = append(keys, k)
	}
	within := func(set []string) bool {
		for _, k := range keys {
			if !slices.Contains(set, k) {
				return false
			}
		}
		return len(keys) > 0
	}
	has := func(any ...string) bool {
		return slices.ContainsFunc(any, func(k string) bool { return top[k] != nil })
	}
	// Blank lines before the text make the loaders' line numbers the
	// Markdown file's.
	name, text := b.File, []byte(strings.Repeat("\n", b.Line)+b.Text)
	switch {
	case within(policyKeys):
		p, err := policy.Parse(text, name)
		if err != nil {
			d.errorf(b, -1, "the policy does not load (broker policy check): %v", err)
			return "policy"
		}
		for _, r := range p.Rules {
			if l, ok := r.Labels["mcp_server"]; ok {
				if d.mcpLabels == nil {
					d.mcpLabels = map[string]string{}
				}
				d.mcpLabels[l] = fmt.Sprintf("%s:%d rule %s", b.File, b.Line, r.Name)
			}
		}
		return "policy"
	case within(gatewayKeys) && has("upstreams", "identity", "elicitation"):
		c := mcpgateway.Parse(text, name)
		if err := c.Validate(); err != nil {
			d.errorf(b, -1, "the mcp-gateway configuration does not load: %v", err)
			return "mcp-gateway config"
		}
		d.gateway(b, c)
		return "mcp-gateway config"
	case within(botKeys):
		if _, err := bot.ParseConfig(text, name); err != nil {
			d.errorf(b, -1, "the approver-bot configuration does not load: %v", err)
		}
		d.secretVars(b)
		return "approver-bot config"
	case within(authKeys):
		if _, err := auth.Parse(text, name); err != nil {
			d.errorf(b, -1, "the auth file does not load: %v", err)
		}
		d.secretVars(b)
		return "auth file"
	case has("display_information"):
		return "slack app manifest (YAML)"
	case has("groups"), has("scrape_configs"), has("rule_files"):
		return "Prometheus configuration (YAML)"
	case has("receivers") && has("exporters"):
		return "OpenTelemetry Collector configuration (YAML)"
	}
	d.errorf(b, -1, "YAML of no kind this test knows (top-level %v): a policy, an approver-bot, mcp-gateway or auth file; mark it or teach the test", keys)
	return "yaml"
}

// secretVars checks that the variables a configuration names for secrets
// (*_env) are not taken for misspelt flags: a name with Assent's prefix must
// be one of envflag.Others, or every program warns that it is ignored.
func (d *doc) secretVars(b doccheck.Block) {
	d.t.Helper()
	var root yaml.Node
	if err := yaml.Unmarshal([]byte(b.Text), &root); err != nil {
		return // reported by the loader
	}
	var walk func(n *yaml.Node)
	walk = func(n *yaml.Node) {
		for i, c := range n.Content {
			if n.Kind == yaml.MappingNode && i%2 == 1 {
				k, v := n.Content[i-1].Value, c.Value
				if strings.HasSuffix(k, "_env") && c.Kind == yaml.ScalarNode && strings.HasPrefix(v, envflag.Prefix) && !slices.Contains(envflag.Others(), v) {
					d.errorf(b, c.Line-1, "%s: %s: every program warns that it names no flag and ignores it; give secrets a name without %s (docs/configuration.md)", k, v, envflag.Prefix)
				}
			}
			walk(c)
		}
	}
	walk(&root)
}

// assentVar checks that a variable set in a command line, if it has
// Assent's prefix, is one Assent reads: a flag's (or its _FILE), or one of
// envflag.Others. Any other is ignored, with a warning from every program.
func (d *doc) assentVar(b doccheck.Block, line int, name string) {
	d.t.Helper()
	if !strings.HasPrefix(name, envflag.Prefix) || slices.Contains(envflag.Others(), name) {
		return
	}
	if slices.Contains(programs.Vars(programs.All()), strings.TrimSuffix(name, envflag.FileSuffix)) {
		return
	}
	d.errorf(b, line, "%s names no flag of any of Assent's programs: each program warns that it is ignored (docs/configuration.md)", name)
}

// gateway records the upstream names of a gateway's configuration.
func (d *doc) gateway(b doccheck.Block, c mcpgateway.Config) {
	var names []string
	for _, u := range c.Upstreams {
		names = append(names, u.Name)
	}
	if d.gateways == nil {
		d.gateways = map[string][]string{}
	}
	d.gateways[b.Where()] = names
}

// crossCheck checks what blocks of one file say of each other: a policy
// rule matching mcp_server X matches calls of every gateway shown.
func (d *doc) crossCheck() {
	d.t.Helper()
	for label, rule := range d.mcpLabels {
		for where, names := range d.gateways {
			if !slices.ContainsFunc(names, func(n string) bool { ok, _ := path.Match(label, n); return ok }) {
				d.fail(fmt.Sprintf("%s: the gateway's upstreams are named %v: the policy's %s (labels: {mcp_server: %s}) never matches its calls; pass --name or say so", where, names, rule, label))
			}
		}
	}
}

// json checks a JSON block: events decode with pkg/events, plans with
// agent-worker's parser, MCP client configurations run the gateway's
// command line; every other block is JSON (or JSON lines).
func (d *doc) json(b doccheck.Block) string {
	d.t.Helper()
	d.keep(b)
	var v any
	if err := json.Unmarshal([]byte(b.Text), &v); err != nil {
		// JSON lines: one value a line.
		for i, l := range strings.Split(strings.TrimSpace(b.Text), "\n") {
			if err := json.Unmarshal([]byte(l), &v); err != nil {
				d.errorf(b, i, "neither JSON nor JSON lines: %v", err)
				return "json"
			}
		}
		return "json lines"
	}
	switch v := v.(type) {
	case map[string]any:
		if v["specversion"] != nil {
			e, err := events.Decode(events.Header{}, []byte(b.Text))
			if err != nil {
				d.errorf(b, -1, "the event does not decode (pkg/events): %v", err)
				return "event"
			}
			if err := decodeData(&e); err != nil {
				d.errorf(b, -1, "the event's data does not decode (pkg/events): %v", err)
			}
			return "event"
		}
		for _, k := range []string{"mcpServers", "servers"} {
			servers, ok := v[k].(map[string]any)
			if !ok {
				continue
			}
			for _, s := range servers {
				s, _ := s.(map[string]any)
				command, _ := s["command"].(string)
				if command == "" {
					continue
				}
				args := []string{command}
				list, _ := s["args"].([]any)
				for _, a := range list {
					args = append(args, fmt.Sprint(a))
				}
				d.command(b, 0, doccheck.Command{Args: args})
			}
			return "MCP client config"
		}
	case []any:
		if len(v) > 0 {
			if step, ok := v[0].(map[string]any); ok && step["tool"] != nil {
				if _, err := worker.ParsePlan(b.Where(), []byte(b.Text)); err != nil {
					d.errorf(b, -1, "the agent-worker plan does not load: %v", err)
				}
				return "agent-worker plan"
			}
		}
	}
	return "json"
}

// decodeData decodes an event's data by its type.
func decodeData(e *events.Event) error {
	var err error
	switch e.Type() {
	case events.TypeRequested:
		_, err = events.DecodeRequested(e)
	case events.TypeResponded:
		_, err = events.DecodeResponded(e)
	case events.TypeCancel:
		_, err = events.DecodeCancel(e)
	case events.TypeDecided:
		_, err = events.DecodeDecided(e)
	case events.TypePending:
		_, err = events.DecodePending(e)
	case events.TypeEscalated:
		_, err = events.DecodeEscalated(e)
	default:
		err = fmt.Errorf("type %q: not an event type of pkg/events", e.Type())
	}
	return err
}

// natsConf parses a NATS server configuration with nats-server's parser.
func (d *doc) natsConf(b doccheck.Block) string {
	d.t.Helper()
	if _, err := conf.Parse(b.Text); err != nil {
		d.errorf(b, -1, "nats-server cannot parse it: %v", err)
		return "NATS server config"
	}
	var o server.Options
	if err := o.ProcessConfigString(b.Text); err != nil {
		if strings.Contains(err.Error(), "no such file or directory") {
			// Certificates and the like of the reader's machine.
			d.t.Logf("%s: NATS server config: parsed; its options name files this machine lacks: %v", b.Where(), err)
			return "NATS server config"
		}
		d.errorf(b, -1, "nats-server does not take it: %v", err)
	}
	return "NATS server config"
}

// goBlock builds a complete program (package main) with go vet, inside the
// module; other Go blocks must be marked.
func (d *doc) goBlock(b doccheck.Block) string {
	d.t.Helper()
	if !strings.HasPrefix(strings.TrimSpace(b.Text), "package ") && !strings.Contains(b.Text, "\npackage ") {
		d.errorf(b, -1, "Go that is not a complete program (package main): mark it (<!-- not checked: REASON -->), or make it whole")
		return "go"
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		d.t.Skip("go is not on PATH")
	}
	// In a directory of the module ("_": no pattern matches it), so that it
	// builds against the module's go.mod, removed afterwards.
	abs, err := filepath.Abs(root)
	if err != nil {
		d.t.Fatal(err)
	}
	pkg, err := os.MkdirTemp(filepath.Join(abs, "internal", "doccheck"), "_block-")
	if err != nil {
		d.t.Fatal(err)
	}
	d.t.Cleanup(func() { os.RemoveAll(pkg) })
	if err := os.WriteFile(filepath.Join(pkg, "main.go"), []byte(b.Text), 0o600); err != nil {
		d.t.Fatal(err)
	}
	rel, _ := filepath.Rel(abs, pkg)
	for _, step := range [][]string{{"vet"}, {"build", "-o", os.DevNull}} {
		cmd := exec.Command(goBin, append(step, "./"+filepath.ToSlash(rel))...)
		cmd.Dir = abs
		if out, err := cmd.CombinedOutput(); err != nil {
			d.errorf(b, -1, "go %s: %v\n%s", step[0], err, out)
			break
		}
	}
	return "go program"
}

// source checks a Python or TypeScript block: an excerpt of a file under
// examples/ (every line without "..." is a line of one such file), or, for
// Python, a program python3 parses.
func (d *doc) source(b doccheck.Block) string {
	d.t.Helper()
	ext := map[string]string{"python": ".py", "ts": ".ts"}[b.Lang]
	var lines []string
	for _, l := range strings.Split(b.Text, "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.Contains(l, "...") {
			lines = append(lines, l)
		}
	}
	var best string
	bestMissing := -1
	var missing []string
	filepath.WalkDir(filepath.Join(root, "examples"), func(p string, e os.DirEntry, err error) error {
		if err != nil || e.IsDir() && (e.Name() == "node_modules" || e.Name() == "dist") {
			return filepath.SkipDir
		}
		if !strings.HasSuffix(p, ext) {
			return nil
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		have := map[string]bool{}
		for _, l := range strings.Split(string(data), "\n") {
			have[strings.TrimSpace(l)] = true
		}
		var miss []string
		for _, l := range lines {
			if !have[l] {
				miss = append(miss, l)
			}
		}
		if bestMissing < 0 || len(miss) < bestMissing {
			best, bestMissing, missing = p, len(miss), miss
		}
		return nil
	})
	if bestMissing == 0 {
		rel, _ := filepath.Rel(root, best)
		return b.Lang + " excerpt of " + filepath.ToSlash(rel)
	}
	if b.Lang == "python" && bestMissing > len(lines)/2 {
		py, err := exec.LookPath("python3")
		if err != nil {
			d.t.Logf("%s: python3 is not installed: not parsed", b.Where())
			return "python"
		}
		cmd := exec.Command(py, "-c", "import ast, sys; ast.parse(sys.stdin.read())")
		cmd.Stdin = strings.NewReader(b.Text)
		if out, err := cmd.CombinedOutput(); err != nil {
			d.errorf(b, -1, "python3 does not parse it: %v\n%s", err, out)
		}
		return "python program"
	}
	rel, _ := filepath.Rel(root, best)
	d.errorf(b, -1, "an excerpt of %s? these lines are not in it (a line of \"...\" marks an elision): %q", rel, missing)
	return b.Lang
}

// shell checks the commands of a sh block, or the "$ " lines of a console
// block. In a console block, what "$ cat FILE" shows is FILE, for the
// commands after it, and a command that is run must print what is shown.
func (d *doc) shell(b doccheck.Block) string {
	d.t.Helper()
	if b.Lang == "sh" {
		for _, c := range doccheck.Commands(b.Text) {
			d.command(b, c.Line, c)
		}
		return "commands"
	}
	lines := strings.Split(strings.TrimSuffix(b.Text, "\n"), "\n")
	for i := 0; i < len(lines); i++ {
		text, ok := strings.CutPrefix(lines[i], "$ ")
		if !ok {
			continue
		}
		j := i + 1
		for j < len(lines) && !strings.HasPrefix(lines[j], "$ ") {
			j++
		}
		shown := strings.Join(lines[i+1:j], "\n")
		for _, c := range doccheck.Commands(text) {
			if len(c.Args) == 2 && c.Args[0] == "cat" && shown != "" {
				name := path.Base(c.Args[1])
				p := filepath.Join(d.dir, name)
				if err := os.WriteFile(p, []byte(shown+"\n"), 0o600); err != nil {
					d.t.Fatal(err)
				}
				d.files[name] = p
				continue
			}
			d.output = nil
			d.command(b, i, c)
			if d.output != nil && shown != "" {
				if line, have, want := firstDiff(*d.output, shown); line >= 0 {
					d.errorf(b, i+1+line, "%s prints, from this line on, %q, not %q:\n%s", strings.Join(c.Args, " "), have, want, *d.output)
				}
			}
		}
		i = j - 1
	}
	return "console"
}

// firstDiff returns the first line at which a and b differ (trailing
// blanks aside), and the two lines; -1 if they do not.
func firstDiff(a, b string) (int, string, string) {
	al := strings.Split(strings.TrimRight(a, "\n "), "\n")
	bl := strings.Split(strings.TrimRight(b, "\n "), "\n")
	for i := range max(len(al), len(bl)) {
		var x, y string
		if i < len(al) {
			x = strings.TrimRight(al[i], " ")
		}
		if i < len(bl) {
			y = strings.TrimRight(bl[i], " ")
		}
		if x != y {
			return i, x, y
		}
	}
	return -1, "", ""
}

// tools are the programs other than Assent's that the docs run.
var tools = map[string]bool{
	"curl": true, "nats": true, "nats-server": true, "docker": true, "kubectl": true, "helm": true,
	"git": true, "jq": true, "openssl": true, "python3": true, "node": true, "npm": true, "npx": true, "cd": true, "echo": true, "cat": true,
	"uuidgen": true, "flock": true, "env": true, "mkdir": true, "cp": true, "chmod": true, "kill": true, "sleep": true, "export": true,
	"ls": true, "rm": true, "grep": true, "sed": true, "tail": true, "head": true, "wait": true, "systemctl": true, "date": true, "true": true,
	"claude": true, "code": true, "oauth2-proxy": true, "go": true, "sh": true, "bash": true, "ssh": true, "scp": true, "tar": true, "watch": true, "printf": true,
}

// command checks one command line: Assent's programs (by name, by path,
// or go run ./cmd/NAME) with their commands and flags, and runs the ones
// that need no server; other programs must be known tools or files of the
// repository.
func (d *doc) command(b doccheck.Block, line int, c doccheck.Command) {
	d.t.Helper()
	for _, kv := range c.Env {
		d.assentVar(b, line, strings.TrimPrefix(kv[:strings.Index(kv, "=")], "export "))
	}
	args := slices.Clone(c.Args)
	// Wrappers: env VAR=..., flock FILE, nice, time.
	for len(args) > 0 {
		switch {
		case args[0] == "env" || args[0] == "nice" || args[0] == "time" || args[0] == "exec":
			args = args[1:]
			for len(args) > 0 && strings.Contains(args[0], "=") && !strings.HasPrefix(args[0], "-") {
				args = args[1:]
			}
			continue
		case args[0] == "flock" && len(args) > 2:
			args = args[2:]
			continue
		}
		break
	}
	if len(args) == 0 {
		return
	}
	name := args[0]
	prog := ""
	switch base := path.Base(name); {
	case name == "go" && len(args) > 2 && args[1] == "run" && strings.HasPrefix(args[2], "./cmd/"):
		prog, args = strings.TrimPrefix(args[2], "./cmd/"), args[3:]
	case name == "go":
		d.goCommand(b, line, args)
		return
	case isProgram(base):
		prog, args = base, args[1:]
	case d.alias[base] != "":
		prog, args = d.alias[base], args[1:]
	case strings.Contains(name, "/") && !doccheck.Expands(name):
		if strings.HasPrefix(name, "/") {
			return // a file of the reader's machine
		}
		script, err := os.ReadFile(filepath.Join(root, name))
		if err != nil {
			d.errorf(b, line, "%s: no such file in the repository", name)
			return
		}
		// A script of the repository: its options are case patterns,
		// "--out)".
		for _, a := range args[1:] {
			a = strings.Trim(a, "[]")
			opt, _, _ := strings.Cut(a, "=")
			if strings.HasPrefix(opt, "--") && !strings.Contains(string(script), opt+")") && !strings.Contains(string(script), opt+"|") {
				d.errorf(b, line, "%s has no option %s", name, opt)
			}
		}
		return
	case doccheck.Expands(name):
		return // $VAR: known only when run
	default:
		if !tools[name] {
			d.errorf(b, line, "%s: a program this test does not know: Assent's, or add it to the known tools", name)
		}
		d.payloads(b, line, args)
		return
	}
	if !isProgram(prog) {
		d.errorf(b, line, "go run ./cmd/%s: no such program (have %v)", prog, programNames())
		return
	}
	d.assentCommand(b, line, prog, args, c)
}

// shellValue stands for a shell expansion in a payload: $ID, $(uuidgen),
// "'"$(date +%s)-$RANDOM"'".
var shellValue = regexp.MustCompile(`\$\([^)]*\)|\$\{?[A-Za-z_][A-Za-z0-9_]*\}?`)

// anID is what an expansion becomes in a payload: a UUIDv7, valid as an id
// and a subject token.
const anID = "0193a5b2-7c1e-7d3a-9f1e-3c2b1a0f9e8d"

// payloads checks what curl and the nats CLI send: a JSON body (-d) is
// JSON; an event published on one of the contract's subjects (nats pub
// SUBJECT BODY) is a subject pkg/events parses and an event it decodes.
func (d *doc) payloads(b doccheck.Block, line int, args []string) {
	d.t.Helper()
	expand := func(s string) string { return shellValue.ReplaceAllString(s, anID) }
	switch args[0] {
	case "curl":
		for i := 1; i+1 < len(args); i++ {
			if args[i] == "-d" || args[i] == "--data" {
				if body := expand(args[i+1]); !json.Valid([]byte(body)) {
					d.errorf(b, line, "curl -d %s: not JSON", args[i+1])
				}
			}
		}
	case "nats":
		var words []string
		for i := 1; i < len(args); i++ {
			switch a := args[i]; {
			case a == "-H" || a == "--header" || a == "--server" || a == "-s" || a == "--count":
				i++
			case strings.HasPrefix(a, "-"):
			default:
				words = append(words, a)
			}
		}
		if len(words) < 2 || !strings.HasPrefix(words[1], events.Prefix) {
			return
		}
		subject := expand(words[1])
		if _, err := events.ParseSubject(subject); err != nil && !strings.HasSuffix(subject, ">") {
			d.errorf(b, line, "nats %s %s: %v", words[0], words[1], err)
		}
		if words[0] != "pub" || len(words) < 3 {
			return
		}
		e, err := events.Decode(events.Header{}, []byte(expand(words[2])))
		if err == nil {
			err = decodeData(&e)
		}
		if err != nil {
			d.errorf(b, line, "nats pub %s: the event does not decode (pkg/events): %v", words[1], err)
		}
	}
}

func isProgram(name string) bool { return slices.Contains(programNames(), name) }

func programNames() []string {
	var names []string
	for _, p := range programs.All() {
		names = append(names, p.Name)
	}
	return names
}

// goCommand checks go build (and records the names it builds programs
// under), go test and the rest: packages named ./x must exist.
func (d *doc) goCommand(b doccheck.Block, line int, args []string) {
	d.t.Helper()
	if len(args) < 2 {
		return
	}
	switch args[1] {
	case "build", "test", "vet", "run", "generate", "tool", "install", "mod", "env", "version", "get", "work":
	default:
		d.errorf(b, line, "go %s: not a go command", args[1])
		return
	}
	out := ""
	for i := 2; i < len(args); i++ {
		a := args[i]
		if a == "-o" && i+1 < len(args) {
			out = args[i+1]
			i++
			continue
		}
		if strings.HasPrefix(a, "-") {
			continue
		}
		if strings.HasPrefix(a, "./") && !doccheck.Expands(a) {
			dir := strings.TrimSuffix(strings.TrimSuffix(a, "/..."), "/")
			if fi, err := os.Stat(filepath.Join(root, dir)); err != nil || !fi.IsDir() {
				d.errorf(b, line, "go %s %s: no such package in the repository", args[1], a)
			}
			if args[1] == "build" && strings.HasPrefix(a, "./cmd/") && out != "" && !strings.HasSuffix(out, "/") {
				if d.alias == nil {
					d.alias = map[string]string{}
				}
				d.alias[path.Base(out)] = strings.TrimPrefix(dir, "./cmd/")
			}
		}
	}
}

// assentCommand checks a command line of one of Assent's programs against
// its flag sets, and runs it when it needs no server.
func (d *doc) assentCommand(b doccheck.Block, line int, prog string, args []string, c doccheck.Command) {
	d.t.Helper()
	// A usage line's [optional] parts and alternatives are its words too.
	var words []string
	for _, a := range args {
		a = strings.Trim(a, "[]")
		if a == "" || a == "|" || a == "..." || strings.HasSuffix(a, "...") {
			continue
		}
		words = append(words, a)
	}
	cmdName, fs, rest, ok := programs.Find(prog, words)
	if !ok {
		d.errorf(b, line, "%s: no command in %q", prog, words)
		return
	}
	full := strings.TrimSpace(prog + " " + cmdName)
	help := false
	var positional []string
	for i := 0; i < len(rest); i++ {
		a := rest[i]
		if a == "--" {
			positional = append(positional, rest[i+1:]...)
			break
		}
		if !strings.HasPrefix(a, "-") || a == "-" {
			positional = append(positional, a)
			continue
		}
		key, _, hasVal := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if key == "h" || key == "help" {
			help = true
			continue
		}
		f := fs.Lookup(key)
		if f == nil {
			d.errorf(b, line, "%s has no flag --%s (its flags: %s)", full, key, flagNames(fs))
			continue
		}
		if bf, ok := f.Value.(interface{ IsBoolFlag() bool }); !hasVal && !(ok && bf.IsBoolFlag()) {
			i++
		}
	}
	// A command of flags only, given a word, names a command it lacks.
	if len(positional) > 0 && (cmdName == "" || prog == "agent-worker") && !slices.Contains(rest, "--") {
		d.errorf(b, line, "%s: %q is no command of %s (its commands: %s)", full, positional[0], prog, commandNames(prog))
		return
	}
	if c.Synopsis || slices.ContainsFunc(args, doccheck.Expands) {
		return
	}
	d.run(b, line, prog, cmdName, args, help)
}

// run runs the commands that need no server: -h, broker policy check and
// policy test, mcp-gateway's command line (parsed, not served); files they
// name are the doc's blocks (by base name) or the repository's.
func (d *doc) run(b doccheck.Block, line int, prog, cmdName string, args []string, help bool) {
	d.t.Helper()
	runs := help || prog == "broker" && (cmdName == "policy check" || cmdName == "policy test") || prog == "mcp-gateway"
	if !runs {
		return
	}
	resolved := slices.Clone(args)
	for i, a := range resolved {
		if strings.HasPrefix(a, "-") || i < len(strings.Fields(cmdName)) {
			continue
		}
		if p, ok := d.files[path.Base(a)]; ok && strings.ContainsAny(a, "./") {
			resolved[i] = p
		} else if _, err := os.Stat(filepath.Join(root, a)); err == nil && !filepath.IsAbs(a) {
			resolved[i] = filepath.Join(root, a)
		} else if looksLikeFile(a) && prog != "mcp-gateway" {
			d.t.Logf("%s:%d: %s %s: not run: no block or file %s", b.File, b.TextLine(line), prog, cmdName, a)
			return
		}
	}
	var out bytes.Buffer
	ctx := context.Background()
	ok := true
	switch prog {
	case "broker":
		if cmdName == "" {
			_, err := app.ParseServe(resolved, envflag.Env{}, &out)
			ok = errors.Is(err, flag.ErrHelp)
			break
		}
		ok = (app.CLI{Stdout: &out, Stderr: &out}).Run(ctx, resolved) == app.ExitOK
	case "approver-bot":
		ok = bot.Main(ctx, "doc", resolved, envflag.Env{}, &out, &out) == bot.ExitOK
	case "agent-worker":
		_, err := worker.ParseArgs(resolved, envflag.Env{}, &out)
		ok = errors.Is(err, flag.ErrHelp)
	case "mcp-gateway":
		c, err := mcpgateway.ParseArgs(resolved, envflag.Env{}, &out)
		if help {
			ok = errors.Is(err, flag.ErrHelp)
			break
		}
		if ok = err == nil; ok {
			d.gateway(b, c.Config)
		} else if errors.Is(err, os.ErrNotExist) {
			ok = true // a configuration file the docs do not show
		}
	}
	if !ok {
		d.errorf(b, line, "%s %v failed:\n%s", prog, args, out.String())
	}
	printed := out.String()
	for i := range resolved {
		if resolved[i] != args[i] {
			printed = strings.ReplaceAll(printed, resolved[i], args[i]) // as the reader named it
		}
	}
	d.output = &printed
	*d.ran = append(*d.ran, fmt.Sprintf("%s:%d: %s %s", b.File, b.TextLine(line), prog, strings.Join(args, " ")))
}

// looksLikeFile reports whether a is probably a file name.
func looksLikeFile(a string) bool {
	switch path.Ext(a) {
	case ".yaml", ".yml", ".json", ".conf", ".nk", ".creds", ".pem":
		return true
	}
	return false
}

func flagNames(fs *flag.FlagSet) string {
	var names []string
	fs.VisitAll(func(f *flag.Flag) { names = append(names, "--"+f.Name) })
	return strings.Join(names, " ")
}

func commandNames(prog string) string {
	for _, p := range programs.All() {
		if p.Name == prog {
			var names []string
			for _, c := range p.Commands {
				if c.Name != "" {
					names = append(names, c.Name)
				}
			}
			return strings.Join(names, ", ")
		}
	}
	return ""
}
