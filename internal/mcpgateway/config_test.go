package mcpgateway_test

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zapcore"

	"github.com/assent-dev/assent/internal/broker"
	"github.com/assent-dev/assent/internal/brokertest"
	"github.com/assent-dev/assent/internal/envflag"
	"github.com/assent-dev/assent/internal/mcpgateway"
	"github.com/assent-dev/assent/internal/testenv"
	"github.com/assent-dev/assent/pkg/events"
)

const goodConfig = `# the gateway of the docs
upstreams:
  - name: fs
    command: agent-worker
    args: [mcp, --sandbox, /srv/files]
    env: {LOG: warn}
    dir: /srv
    prefix: fs__
  - name: tickets
    url: https://tickets.example.com/mcp
    headers: {Authorization: Bearer t0ken}
identity:
  agent: claude-desktop
  user: carol
nats:
  url: nats://broker:4222
  trusted_decision_keys: [AAB2CB576PHBBPQ5ODORRZ2LYCMWPZGWGCN2KDK7DXOIMZASKUY3QPZV]
timeout: 2m
client_ping: 30s
elicitation:
  principal: carol
`

func TestParseConfig(t *testing.T) {
	c := mcpgateway.Parse([]byte(goodConfig), "gw.yaml").WithDefaults()
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	want := []mcpgateway.Upstream{
		{Name: "fs", Command: "agent-worker", Args: []string{"mcp", "--sandbox", "/srv/files"}, Env: map[string]string{"LOG": "warn"}, Dir: "/srv", Prefix: "fs__"},
		{Name: "tickets", URL: "https://tickets.example.com/mcp", Headers: map[string]string{"Authorization": "Bearer t0ken"}},
	}
	if !reflect.DeepEqual(c.Upstreams, want) || c.Identity != (mcpgateway.Identity{Agent: "claude-desktop", User: "carol"}) ||
		c.NATS.URL != "nats://broker:4222" || len(c.NATS.TrustedDecisionKeys) != 1 || c.Timeout != 2*time.Minute ||
		c.ClientPing != 30*time.Second || c.Elicitation != (mcpgateway.Elicitation{Principal: "carol"}) {
		t.Errorf("%+v", c)
	}
	if d := (mcpgateway.Config{}).WithDefaults(); d.NATS.URL != mcpgateway.DefaultNATSURL || d.ClientPing != mcpgateway.DefaultClientPing {
		t.Errorf("defaults %+v", d)
	}
}

// Every problem is reported at once, each at its file:line, saying what to
// do.
func TestConfigProblems(t *testing.T) {
	tests := []struct {
		name string
		src  string
		want []string
	}{
		{"everything wrong", `upstreams:
  - name: fs
    command: agent-worker
    url: http://x
  - name: fs
    url: ftp://x
    headers: {"bad header": x}
  - command: x
    prefix: "a b"
    guard: [resources, tools]
identity:
  agent: a.b
nats:
  trusted_decision_keys: [nope]
timeout: -1s
elicitation:
  over_http: true
colour: blue
`, []string{
			"gw.yaml:4: upstreams[0] (fs).url: both command and url: give one",
			`gw.yaml:5: upstreams[1] (fs).name: "fs": already the name of upstreams[0]`,
			`gw.yaml:6: upstreams[1] (fs).url: "ftp://x": want an http or https URL`,
			`gw.yaml:7: upstreams[1] (fs).headers: "bad header": not an HTTP header name`,
			"gw.yaml:8: upstreams[2].name: missing",
			`gw.yaml:9: upstreams[2].prefix: "a b": want at most 64 characters`,
			`gw.yaml:10: upstreams[2].guard: "tools": want resources or prompts (tool calls are always guarded)`,
			`gw.yaml:12: identity.agent: "a.b": want 1-128 characters`,
			"gw.yaml:14: nats.trusted_decision_keys:",
			"gw.yaml:15: timeout: -1s: want 0",
			"gw.yaml:17: elicitation.over_http: without elicitation.principal",
			"gw.yaml:18: colour: unknown setting (known here: upstreams, identity, nats, timeout, elicitation, client_ping, broker_wait, session_idle, tls)",
		}},
		{"no upstream", "identity: {user: carol}\n", []string{"gw.yaml: upstreams: none: name at least one MCP server"}},
		{"empty file", "", []string{"upstreams: none"}},
		{"unknown upstream setting", "upstreams:\n  - name: fs\n    cmd: x\n", []string{
			"gw.yaml:3: upstreams[0].cmd: unknown setting (known here: name, command, args, env, dir, url, headers, prefix, guard)",
			"gw.yaml:2: upstreams[0] (fs).command: neither command nor url"}},
		{"wrong type", "upstreams:\n  - name: fs\n    command: x\ntimeout: soon\n", []string{"gw.yaml:4: cannot unmarshal !!str `soon` into time.Duration"}},
		{"not YAML", "upstreams: [\n", []string{"gw.yaml:"}},
		{"private without an agent", "upstreams:\n  - name: fs\n    command: x\nnats:\n  private: true\n", []string{"gw.yaml:5: nats.private: needs identity.agent"}},
		{"headers with a command", "upstreams:\n  - name: fs\n    command: x\n    headers: {A: b}\n", []string{"gw.yaml:4: upstreams[0] (fs).headers: headers go to a url server"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := mcpgateway.Parse([]byte(tt.src), "gw.yaml").WithDefaults().Validate()
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error lacks %q:\n%v", w, err)
				}
			}
		})
	}
	// Built in code, messages name the settings without a file.
	err := mcpgateway.Config{Upstreams: []mcpgateway.Upstream{{Name: "x y", URL: "http://h"}}}.WithDefaults().Validate()
	if err == nil || !strings.HasPrefix(err.Error(), `upstreams[0] (x y).name: "x y": want`) {
		t.Errorf("error %v", err)
	}
	if _, err := mcpgateway.Load(filepath.Join(t.TempDir(), "missing.yaml")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Load of a missing file: %v", err)
	}
}

func TestAgentName(t *testing.T) {
	for in, want := range map[string]string{
		"Claude Desktop":        "claude-desktop",
		"Visual Studio Code":    "visual-studio-code",
		"cursor-vscode":         "cursor-vscode",
		"  Zed / Agent  v2 ":    "zed-agent-v2",
		"ÉlanAI":                "lanai",
		"":                      "mcp-client",
		"🤖":                     "mcp-client",
		"a.b_c":                 "a-b_c",
		strings.Repeat("x", 70): strings.Repeat("x", 64),
	} {
		if got := mcpgateway.AgentName(in); got != want {
			t.Errorf("AgentName(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestParseArgs(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "gw.yaml")
	if err := os.WriteFile(file, []byte(goodConfig), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		args    []string
		wantErr error
		check   func(t *testing.T, c mcpgateway.Command)
	}{
		{"config file", []string{"--config", file}, nil, func(t *testing.T, c mcpgateway.Command) {
			if c.Name != "serve" || !c.Stdio || c.HTTP != "" || len(c.Config.Upstreams) != 2 || c.Config.Identity.Agent != "claude-desktop" || c.LogLevel != zapcore.WarnLevel {
				t.Errorf("%+v", c)
			}
		}},
		{"flags override the file", []string{"--config", file, "--agent", "ide", "--user", "dave", "--timeout", "30s", "--nats-url", "nats://other:4222",
			"--elicit-as", "dave", "--trust-decision-key", "AAB2CB576PHBBPQ5ODORRZ2LYCMWPZGWGCN2KDK7DXOIMZASKUY3QPZV", "--log-level", "debug"}, nil, func(t *testing.T, c mcpgateway.Command) {
			cfg := c.Config
			if cfg.Identity.Agent != "ide" || cfg.Identity.User != "dave" || cfg.Timeout != 30*time.Second || cfg.NATS.URL != "nats://other:4222" ||
				cfg.Elicitation.Principal != "dave" || len(cfg.NATS.TrustedDecisionKeys) != 2 || c.LogLevel != zapcore.DebugLevel {
				t.Errorf("%+v", c)
			}
		}},
		{"a command upstream", []string{"--agent", "claude", "--prefix", "fs__", "--", "/usr/bin/agent-worker", "mcp", "--sandbox", "/x"}, nil, func(t *testing.T, c mcpgateway.Command) {
			want := mcpgateway.Upstream{Name: "agent-worker", Command: "/usr/bin/agent-worker", Args: []string{"mcp", "--sandbox", "/x"}, Prefix: "fs__", AutoName: true}
			if len(c.Config.Upstreams) != 1 || !reflect.DeepEqual(c.Config.Upstreams[0], want) || !c.Stdio || c.Config.NATS.URL != mcpgateway.DefaultNATSURL {
				t.Errorf("%+v", c)
			}
		}},
		{"a URL upstream over HTTP", []string{"--http", "127.0.0.1:0", "--name", "tix", "https://Tickets.example.com/mcp"}, nil, func(t *testing.T, c mcpgateway.Command) {
			if u := c.Config.Upstreams; len(u) != 1 || u[0].URL != "https://Tickets.example.com/mcp" || u[0].Name != "tix" || u[0].AutoName || c.Stdio || c.HTTP != "127.0.0.1:0" {
				t.Errorf("%+v", c)
			}
		}},
		{"a URL names its upstream", []string{"--stdio", "--http", "127.0.0.1:0", "https://Tickets.example.com/mcp"}, nil, func(t *testing.T, c mcpgateway.Command) {
			if u := c.Config.Upstreams; u[0].Name != "tickets-example-com" || !u[0].AutoName || !c.Stdio {
				t.Errorf("%+v", c)
			}
		}},
		{"a script names its upstream, not its interpreter", []string{"--", "node", "/srv/notes/build/index.js", "--root", "/x"}, nil, func(t *testing.T, c mcpgateway.Command) {
			if u := c.Config.Upstreams; u[0].Name != "build" || !u[0].AutoName {
				t.Errorf("%+v", u)
			}
		}},
		{"check", []string{"check", "--config", file}, nil, func(t *testing.T, c mcpgateway.Command) {
			if c.Name != "check" {
				t.Errorf("%+v", c)
			}
		}},
		{"no upstream", nil, mcpgateway.ErrUsage, nil},
		{"a bad config file", []string{"--config", filepath.Join(dir, "missing.yaml")}, mcpgateway.ErrUsage, nil},
		{"nothing to serve", []string{"--stdio=false", "x"}, mcpgateway.ErrUsage, nil},
		{"bad --http", []string{"--http", "8931", "x"}, mcpgateway.ErrUsage, nil},
		{"--name without an upstream", []string{"--config", file, "--name", "x"}, mcpgateway.ErrUsage, nil},
		{"bad agent", []string{"--agent", "a.b", "x"}, mcpgateway.ErrUsage, nil},
		{"unknown flag", []string{"--force", "x"}, mcpgateway.ErrUsage, nil},
		{"help", []string{"help"}, flag.ErrHelp, nil},
		{"-h", []string{"-h"}, flag.ErrHelp, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stderr bytes.Buffer
			c, err := mcpgateway.ParseArgs(tt.args, envflag.Env{}, &stderr)
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("err %v, want %v", err, tt.wantErr)
				}
				if !strings.Contains(stderr.String(), "usage:") {
					t.Errorf("no usage printed: %q", stderr.String())
				}
				return
			}
			if err != nil {
				t.Fatalf("err %v; stderr %s", err, &stderr)
			}
			tt.check(t, c)
		})
	}
}

// check connects to NATS and the upstreams and lists what the gateway
// would offer, each upstream under the name it gives itself when the
// command line gave it none; it fails, saying why, where there is no
// broker.
func TestCheck(t *testing.T) {
	ns := testenv.Server(t)
	_, url := newNotes(t)
	args := []string{"check", "--nats-url", ns.ClientURL(), "--prefix", "n_", url}
	cmd, err := mcpgateway.ParseArgs(args, envflag.Env{}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	var out bytes.Buffer
	if err := cmd.Execute(ctx, testenv.Logger(t), nil, &out, &bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), "has a broker run on this NATS server?") {
		t.Errorf("check without a broker: %v\n%s", err, &out)
	}
	brokertest.Run(t, testenv.Conn(t, ns), broker.Config{Name: "check"})
	out.Reset()
	if err := cmd.Execute(ctx, testenv.Logger(t), nil, &out, &bytes.Buffer{}); err != nil {
		t.Fatalf("check: %v\n%s", err, &out)
	}
	for _, want := range []string{"config: ok, 1 upstream(s)", "stream ASSENT found", "upstream notes: 2 tool(s): n_delete_file, n_list_files"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, &out)
		}
	}
}

// Any file: Parse and Validate neither panic nor accept a configuration
// that cannot work, and any client name makes a valid agent.
func FuzzParse(f *testing.F) {
	f.Add([]byte(goodConfig))
	f.Add([]byte("upstreams:\n  - name: fs\n    command: x\n    url: http://x\ncolour: blue\n"))
	f.Add([]byte("upstreams: [\n"))
	f.Add([]byte("timeout: soon\nupstreams: [{name: a, url: 'http://h/mcp', headers: {A: b}, prefix: a.}]\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		if name := mcpgateway.AgentName(string(data)); !events.ValidToken(name) || len(name) > 64 {
			t.Fatalf("AgentName(%q) = %q", data, name)
		}
		c := mcpgateway.Parse(data, "fuzz.yaml").WithDefaults()
		if err := c.Validate(); err != nil {
			return
		}
		if len(c.Upstreams) == 0 {
			t.Fatal("a configuration without upstreams passed")
		}
		for _, u := range c.Upstreams {
			if !events.ValidToken(u.Name) || (u.Command == "") == (u.URL == "") {
				t.Fatalf("upstream %+v passed", u)
			}
		}
	})
}

// The environment comes between the command line and the configuration
// file: ASSENT_AGENT overrides identity.agent, and --agent both.
func TestParseArgsEnvironment(t *testing.T) {
	file := filepath.Join(t.TempDir(), "gw.yaml")
	if err := os.WriteFile(file, []byte(goodConfig), 0o644); err != nil {
		t.Fatal(err)
	}
	env := envflag.Map(map[string]string{"ASSENT_CONFIG": file, "ASSENT_AGENT": "ide", "ASSENT_TIMEOUT": "45s", "ASSENT_STDIO": "false", "ASSENT_HTTP": "127.0.0.1:0"})
	var stderr bytes.Buffer
	c, err := mcpgateway.ParseArgs(nil, env, &stderr)
	if err != nil {
		t.Fatalf("%v\n%s", err, &stderr)
	}
	if c.Config.Identity.Agent != "ide" || c.Config.Identity.User != "carol" || c.Config.Timeout != 45*time.Second || c.Stdio || c.HTTP != "127.0.0.1:0" {
		t.Errorf("%+v", c)
	}
	c, err = mcpgateway.ParseArgs([]string{"--agent", "cli"}, env, &stderr)
	if err != nil || c.Config.Identity.Agent != "cli" {
		t.Errorf("--agent cli: agent %q, %v", c.Config.Identity.Agent, err)
	}
	stderr.Reset()
	_, err = mcpgateway.ParseArgs(nil, envflag.Map(map[string]string{"ASSENT_CONFIG": file, "ASSENT_TIMEOUT": "soon"}), &stderr)
	if !errors.Is(err, mcpgateway.ErrUsage) || !strings.Contains(stderr.String(), "ASSENT_TIMEOUT, for --timeout: want a duration") || !strings.Contains(stderr.String(), "usage:") {
		t.Errorf("a bad ASSENT_TIMEOUT: %v\n%s", err, &stderr)
	}
}

// check runs from ASSENT_ variables: the NATS server and the upstream's
// prefix come from the environment, the upstream from the command line.
func TestCheckFromEnvironment(t *testing.T) {
	ns := testenv.Server(t)
	brokertest.Run(t, testenv.Conn(t, ns), broker.Config{Name: "check"})
	_, url := newNotes(t)
	var stderr bytes.Buffer
	cmd, err := mcpgateway.ParseArgs([]string{"check", url}, envflag.Map(map[string]string{
		"ASSENT_NATS_URL": ns.ClientURL(),
		"ASSENT_PREFIX":   "e_",
		"ASSENT_POLICY":   "/etc/assent/policy.yaml", // the broker's, in a shared environment
	}), &stderr)
	if err != nil {
		t.Fatalf("%v\n%s", err, &stderr)
	}
	if want := ""; stderr.String() != want { // ASSENT_POLICY is another program's
		t.Errorf("stderr %q, want %q", &stderr, want)
	}
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	var out bytes.Buffer
	if err := cmd.Execute(ctx, testenv.Logger(t), nil, &out, &bytes.Buffer{}); err != nil {
		t.Fatalf("check: %v\n%s", err, &out)
	}
	for _, want := range []string{"connected to " + ns.ClientURL(), "stream ASSENT found", "upstream notes: 2 tool(s): e_delete_file, e_list_files"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, &out)
		}
	}
}

// An upstream named on the command line by its command alone is named
// after what the command runs, not the interpreter that runs it.
func TestCommandName(t *testing.T) {
	tests := []struct {
		command string
		args    []string
		want    string
	}{
		{"/usr/bin/agent-worker", []string{"mcp", "--sandbox", "/x"}, "agent-worker"},
		{"node", []string{"/srv/notes/server.js"}, "server"},
		{"node", []string{"--enable-source-maps", "/srv/notes/index.js"}, "notes"},
		{"/usr/local/bin/node", nil, "node"},
		{"npx", []string{"-y", "@modelcontextprotocol/server-filesystem", "/Users/carol"}, "server-filesystem"},
		{"npx", []string{"-y", "@modelcontextprotocol/server-filesystem@2025.8.21", "/tmp"}, "server-filesystem"},
		{"uvx", []string{"mcp-server-fetch"}, "mcp-server-fetch"},
		{"uv", []string{"run", "weather.py"}, "weather"},
		{"python3.12", []string{"-m", "mcp_server_git", "--repository", "."}, "mcp_server_git"},
		{"docker", []string{"run", "-i", "--rm", "-e", "TOKEN=x", "mcp/github:latest"}, "github"},
		{"/opt/nodejs/node.exe", []string{"/mcp/Tickets Server.js"}, "tickets-server"},
		{"bash", []string{"-c", "--"}, "bash"},
	}
	for _, tt := range tests {
		if got := mcpgateway.CommandName(tt.command, tt.args); got != tt.want {
			t.Errorf("CommandName(%q, %q) = %q, want %q", tt.command, tt.args, got, tt.want)
		}
	}
}
