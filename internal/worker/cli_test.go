package worker_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"io"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nkeys"
	"go.uber.org/zap/zapcore"

	"github.com/assent-dev/assent/internal/broker"
	"github.com/assent-dev/assent/internal/brokertest"
	"github.com/assent-dev/assent/internal/envflag"
	"github.com/assent-dev/assent/internal/testenv"
	"github.com/assent-dev/assent/internal/worker"
	"github.com/assent-dev/assent/pkg/events"
)

func TestParseArgs(t *testing.T) {
	tests := []struct {
		name    string
		args    string
		wantErr error
		check   func(t *testing.T, c worker.Command)
	}{
		{"run with defaults", "run --plan p.json --sandbox sb", nil, func(t *testing.T, c worker.Command) {
			if c.Name != "run" || c.Run.Plan != "p.json" || c.Run.Sandbox != "sb" || c.Run.Agent != "file-manager" ||
				c.Run.Config.Timeout != 2*time.Minute || c.Conn.URL != worker.DefaultNATSURL || c.Conn.Creds != "" || c.LogLevel != zapcore.WarnLevel || c.Run.JSON {
				t.Errorf("%+v", c)
			}
		}},
		{"run with everything", "run --plan p --sandbox s --init-sandbox --agent fm --session s1 --user carol --timeout 90s --json --nats-url nats://x:1 --creds c.creds --log-level debug", nil, func(t *testing.T, c worker.Command) {
			o := c.Run
			if !o.InitSandbox || o.Agent != "fm" || o.Config.Session != "s1" || o.Config.User != "carol" || o.Config.Timeout != 90*time.Second ||
				!o.JSON || c.Conn.URL != "nats://x:1" || c.Conn.Creds != "c.creds" || c.LogLevel != zapcore.DebugLevel {
				t.Errorf("%+v", c)
			}
		}},
		{"load with defaults", "load", nil, func(t *testing.T, c worker.Command) {
			o := c.Load
			if o.Config.N != 10000 || o.Config.Concurrency != 64 || o.Agent != "load" || o.Config.Tool != "load_test" || o.Config.Timeout != 30*time.Second || o.JSON {
				t.Errorf("%+v", c)
			}
		}},
		{"load with everything", "load --n 5 --c 2 --agent a --tool t --timeout 1s --json", nil, func(t *testing.T, c worker.Command) {
			o := c.Load
			if o.Config.N != 5 || o.Config.Concurrency != 2 || o.Agent != "a" || o.Config.Tool != "t" || o.Config.Timeout != time.Second || !o.JSON {
				t.Errorf("%+v", c)
			}
		}},
		{"load the human path", "load --answer-as alice", nil, func(t *testing.T, c worker.Command) {
			o := c.Load
			if o.AnswerAs != "alice" || o.Config.Concurrency != 16 || o.Baseline != "" {
				t.Errorf("%+v", c)
			}
		}},
		{"load the human path at 64", "load --c 64 --answer-as alice", nil, func(t *testing.T, c worker.Command) {
			if c.Load.Config.Concurrency != 64 {
				t.Errorf("%+v", c)
			}
		}},
		{"load the raw baseline", "load --baseline raw", nil, func(t *testing.T, c worker.Command) {
			o := c.Load
			if o.Baseline != worker.BaselineRaw || o.AnswerAs != "" || o.Config.Concurrency != 64 {
				t.Errorf("%+v", c)
			}
		}},
		{"load the raw baseline of stored replies", "load --baseline raw-stored", nil, func(t *testing.T, c worker.Command) {
			if c.Load.Baseline != worker.BaselineRawStored {
				t.Errorf("%+v", c)
			}
		}},
		{"load an unknown baseline", "load --baseline nats", worker.ErrUsage, nil},
		{"load answered by a bad principal", "load --answer-as a.b", worker.ErrUsage, nil},
		{"mcp", "mcp --sandbox sb --init-sandbox --log-level info", nil, func(t *testing.T, c worker.Command) {
			if c.Name != "mcp" || c.MCP.Sandbox != "sb" || !c.MCP.InitSandbox || c.LogLevel != zapcore.InfoLevel {
				t.Errorf("%+v", c)
			}
		}},
		{"mcp without sandbox", "mcp", worker.ErrUsage, nil},
		{"mcp takes no NATS flags", "mcp --sandbox sb --nats-url nats://x:1", worker.ErrUsage, nil},
		{"no command", "", worker.ErrUsage, nil},
		{"unknown command", "fly", worker.ErrUsage, nil},
		{"help", "help", flag.ErrHelp, nil},
		{"command help", "run -h", flag.ErrHelp, nil},
		{"run without plan and sandbox", "run", worker.ErrUsage, nil},
		{"unknown flag", "run --plan p --sandbox s --force", worker.ErrUsage, nil},
		{"stray argument", "run --plan p --sandbox s extra", worker.ErrUsage, nil},
		{"bad agent", "run --plan p --sandbox s --agent a.b", worker.ErrUsage, nil},
		{"bad timeout", "run --plan p --sandbox s --timeout 0s", worker.ErrUsage, nil},
		{"bad log level", "load --log-level loud", worker.ErrUsage, nil},
		{"no requests", "load --n 0", worker.ErrUsage, nil},
		{"empty URL", "load --nats-url=", worker.ErrUsage, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stderr bytes.Buffer
			c, err := worker.ParseArgs(strings.Fields(tt.args), envflag.Env{}, &stderr)
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
				t.Fatalf("err %v; stderr %s", err, stderr.String())
			}
			tt.check(t, c)
		})
	}
}

// The example plan, end to end through the command line code, against an
// auto-approve broker: every step runs.
func TestExecuteExamplePlan(t *testing.T) {
	ns := testenv.Server(t)
	startBroker(t, testenv.Conn(t, ns), broker.ModeAutoApprove)
	dir := filepath.Join(t.TempDir(), "demo")

	for _, asJSON := range []bool{true, false} {
		args := []string{"run", "--plan", "../../examples/plan.json", "--sandbox", dir, "--init-sandbox", "--nats-url", ns.ClientURL()}
		if asJSON {
			args = append(args, "--json")
		}
		cmd, err := worker.ParseArgs(args, envflag.Env{}, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		var stdout, stderr bytes.Buffer
		if err := cmd.Execute(testCtx(t), testenv.Logger(t), &stdout, &stderr); err != nil {
			t.Fatalf("execute: %v\nstdout:\n%s\nstderr:\n%s", err, &stdout, &stderr)
		}
		if !exists(t, filepath.Join(dir, "archive", "todo.txt")) || exists(t, filepath.Join(dir, "old-report.csv")) ||
			readFile(t, filepath.Join(dir, "notes", "summary.txt")) == "" {
			t.Fatal("the example plan's effects are not on disk")
		}
		if !asJSON {
			out := stdout.String()
			for _, want := range []string{"step 4/6 delete_file: approved", "-> deleted old-report.csv", "step 5/6 move_file: approved", "6 steps: 6 executed"} {
				if !strings.Contains(out, want) {
					t.Errorf("text output lacks %q:\n%s", want, out)
				}
			}
			continue
		}
		sc := bufio.NewScanner(&stdout)
		n := 0
		for sc.Scan() {
			var r struct {
				Step      int             `json:"step"`
				Tool      string          `json:"tool"`
				RequestID string          `json:"request_id"`
				Outcome   string          `json:"outcome"`
				Edited    *bool           `json:"edited"`
				Executed  bool            `json:"executed"`
				Result    json.RawMessage `json:"result"`
				Error     string          `json:"error"`
			}
			if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
				t.Fatalf("line %q: %v", sc.Text(), err)
			}
			n++
			if r.Step != n || !r.Executed || r.Error != "" || len(r.Result) == 0 || r.Edited == nil {
				t.Errorf("line %d: %s", n, sc.Text())
			}
			guarded := r.Tool == worker.ToolDeleteFile || r.Tool == worker.ToolMoveFile
			if guarded && (r.Outcome != "approved" || r.RequestID == "") || !guarded && r.Outcome != "unguarded" {
				t.Errorf("line %d: %s", n, sc.Text())
			}
		}
		if n != 6 {
			t.Fatalf("%d JSON lines, want 6:\n%s", n, &stdout)
		}
	}
}

// A failed step makes Execute fail with ErrStepsFailed (and so a non-zero
// exit status); the report still has every line.
func TestExecuteFailedStep(t *testing.T) {
	ns := testenv.Server(t)
	startBroker(t, testenv.Conn(t, ns), broker.ModeAutoDeny)
	dir := t.TempDir()
	plan := filepath.Join(t.TempDir(), "plan.json")
	writeFiles(t, filepath.Dir(plan), map[string]string{"plan.json": `[
		{"tool": "read_file", "args": {"path": "missing.txt"}},
		{"tool": "write_file", "args": {"path": "x.txt", "content": "x"}, "approval": true}
	]`})
	cmd, err := worker.ParseArgs([]string{"run", "--plan", plan, "--sandbox", dir, "--nats-url", ns.ClientURL()}, envflag.Env{}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	var stdout bytes.Buffer
	err = cmd.Execute(testCtx(t), testenv.Logger(t), &stdout, io.Discard)
	if !errors.Is(err, worker.ErrStepsFailed) {
		t.Fatalf("execute: %v", err)
	}
	out := stdout.String()
	for _, want := range []string{"step 1/2 read_file: no approval needed -> FAILED:", "step 2/2 write_file: denied", "-> not executed", "2 steps: 0 executed, 1 not executed by decision, 1 failed"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if exists(t, filepath.Join(dir, "x.txt")) {
		t.Fatal("the denied write ran")
	}
}

func TestExecuteLoad(t *testing.T) {
	ns := testenv.Server(t)
	startBroker(t, testenv.Conn(t, ns), broker.ModeAutoApprove)
	cmd, err := worker.ParseArgs([]string{"load", "--n", "50", "--c", "4", "--nats-url", ns.ClientURL()}, envflag.Env{}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	var stdout bytes.Buffer
	if err := cmd.Execute(testCtx(t), testenv.Logger(t), &stdout, io.Discard); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"requests    50 sent, concurrency 4", "throughput", "p50", "p99", "outcomes    approved=50", "errors      0"} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, &stdout)
		}
	}
}

// The load command's other measurements, against a broker in manual mode:
// the raw baseline of the automatic path, and the human path through
// Assent and through the raw baseline.
func TestExecuteLoadModes(t *testing.T) {
	ns := testenv.Server(t)
	startBroker(t, testenv.Conn(t, ns), broker.ModeManual)
	tests := []struct {
		name, args string
		want       []string // text lines, or JSON fields with --json
	}{
		{"raw baseline", "--baseline raw --json", []string{`"target":"raw-jetstream"`, `"decided":30`, `"outcomes":{"approved":30}`, `"errors":0`, `"latency_ms":{`}},
		{"human path", "--answer-as alice", []string{"target      assent\n", "requests    30 sent, concurrency 16\n", "\nanswer      p50 ", "\npending     p50 ", "outcomes    approved=30\n", "errors      0\n"}},
		{"raw human path", "--answer-as alice --baseline raw --json", []string{`"target":"raw-jetstream"`, `"decided":30`, `"errors":0`, `"answer_ms":{`, `"pending_ms":{`}},
		{"raw baseline, replies once stored", "--baseline raw-stored --json", []string{`"target":"raw-jetstream-stored"`, `"decided":30`, `"errors":0`}},
		{"raw human path, replies once stored", "--answer-as alice --baseline raw-stored --json", []string{`"target":"raw-jetstream-stored"`, `"decided":30`, `"errors":0`, `"answer_ms":{`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			args := append([]string{"load", "--n", "30", "--nats-url", ns.ClientURL()}, strings.Fields(tt.args)...)
			cmd, err := worker.ParseArgs(args, envflag.Env{}, io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			var stdout bytes.Buffer
			if err := cmd.Execute(testCtx(t), testenv.Logger(t), &stdout, io.Discard); err != nil {
				t.Fatal(err)
			}
			for _, want := range tt.want {
				if !strings.Contains(stdout.String(), want) {
					t.Errorf("output lacks %q:\n%s", want, &stdout)
				}
			}
		})
	}
}

func TestExecuteNoServer(t *testing.T) {
	cmd, err := worker.ParseArgs([]string{"load", "--n", "1", "--nats-url", "nats://127.0.0.1:1"}, envflag.Env{}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Execute(testCtx(t), nil, io.Discard, io.Discard); err == nil || !strings.Contains(err.Error(), "connect to NATS") {
		t.Fatalf("execute without a server: %v", err)
	}
}

func TestParseArgsHelp(t *testing.T) {
	tests := []struct {
		args      string
		wantUsage string
	}{
		{"-h", "usage: agent-worker <command>"},
		{"--help", "usage: agent-worker <command>"},
		{"help", "usage: agent-worker <command>"},
		{"run -h", "usage: agent-worker run --plan FILE --sandbox DIR"},
		{"run --plan p.json --help", "usage: agent-worker run --plan FILE --sandbox DIR"},
		{"load -h", "usage: agent-worker load [flags]"},
		{"load --n 5 -help", "usage: agent-worker load [flags]"},
	}
	for _, tt := range tests {
		t.Run(tt.args, func(t *testing.T) {
			var stderr bytes.Buffer
			_, err := worker.ParseArgs(strings.Fields(tt.args), envflag.Env{}, &stderr)
			if !errors.Is(err, flag.ErrHelp) {
				t.Fatalf("err %v, want flag.ErrHelp (exit status 0)", err)
			}
			if !strings.HasPrefix(stderr.String(), tt.wantUsage) {
				t.Errorf("stderr does not start with %q:\n%s", tt.wantUsage, &stderr)
			}
		})
	}
}

// Tool names, reasons, errors and args come from plans, approvers and the
// broker; the text report shows them escaped, never as terminal controls.
func TestWriteTextEscapes(t *testing.T) {
	const evil = "\x1b[2J\u202Egnp.exe"
	var b bytes.Buffer
	steps := []worker.StepReport{
		{Step: 1, Tool: "rm" + evil, Outcome: worker.OutcomeDenied, Reason: "no" + evil, DecidedBy: []string{"alice" + evil}, RequestID: "id" + evil},
		{Step: 2, Tool: "x", Outcome: worker.OutcomeApproved, Edited: true, Args: json.RawMessage(`{"p":"` + evil + `"}`), Failed: true, Error: "boom" + evil},
	}
	for _, r := range steps {
		if err := worker.WriteStepText(&b, r, 2); err != nil {
			t.Fatal(err)
		}
	}
	if err := worker.WriteLoadText(&b, worker.LoadResult{Sent: 1, Errors: 1, ErrorKinds: map[string]int{"other" + evil: 1}, FirstError: "first" + evil}); err != nil {
		t.Fatal(err)
	}
	if err := worker.WriteJSONLine(&b, steps[0]); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	if strings.ContainsAny(out, "\x1b\u202E") {
		t.Errorf("output has raw terminal controls: %q", out)
	}
	for _, want := range []string{`rm\x1b[2J\u202egnp.exe: denied by alice\x1b[2J\u202egnp.exe`, `("no\x1b[2J\u202egnp.exe")`, `[request id\x1b[2J\u202egnp.exe]`,
		`FAILED: boom\x1b[2J\u202egnp.exe`, `first\x1b[2J\u202egnp.exe`, `other\x1b[2J\u202egnp.exe=1`, `"tool":"rm\u001b[2J\u202egnp.exe"`} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %s:\n%s", want, out)
		}
	}
	if n := strings.Count(out, "\n"); n != 9 {
		t.Errorf("%d lines, want 9 (2 steps, 6 of load report, 1 JSON):\n%s", n, out)
	}
}

// --trust-decision-key takes public keys, repeated or comma-separated, and
// refuses anything else.
func TestParseTrustedKeys(t *testing.T) {
	var keys []string
	for range 3 {
		kp, err := events.NewDecisionKey()
		if err != nil {
			t.Fatal(err)
		}
		pub, _ := kp.PublicKey()
		keys = append(keys, pub)
	}
	c, err := worker.ParseArgs([]string{"load", "--trust-decision-key", keys[0], "--trust-decision-key", keys[1] + "," + keys[2]}, envflag.Env{}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(c.TrustedKeys, " ") != strings.Join(keys, " ") {
		t.Fatalf("trusted keys %v, want %v", c.TrustedKeys, keys)
	}
	if c, err := worker.ParseArgs([]string{"load"}, envflag.Env{}, io.Discard); err != nil || len(c.TrustedKeys) != 0 {
		t.Fatalf("without the flag: %v %v", c.TrustedKeys, err)
	}
	user, _ := nkeys.CreateUser()
	userPub, _ := user.PublicKey()
	for _, bad := range []string{userPub, "AXYZ", keys[0] + ",nonsense"} {
		var stderr bytes.Buffer
		if _, err := worker.ParseArgs([]string{"run", "--plan", "p", "--sandbox", "s", "--trust-decision-key", bad}, envflag.Env{}, &stderr); !errors.Is(err, worker.ErrUsage) {
			t.Errorf("--trust-decision-key %s: %v", bad, err)
		}
	}
}

// With --trust-decision-key, the worker runs what a broker signing with
// that key approves.
func TestExecuteTrustingDecisionKey(t *testing.T) {
	ns := testenv.Server(t)
	key, err := events.NewDecisionKey()
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := key.PublicKey()
	brokertest.Run(t, testenv.Conn(t, ns), broker.Config{Name: "test", Mode: broker.ModeAutoApprove, DecisionKey: key})
	dir := filepath.Join(t.TempDir(), "demo")
	cmd, err := worker.ParseArgs([]string{"run", "--plan", "../../examples/plan.json", "--sandbox", dir, "--init-sandbox",
		"--nats-url", ns.ClientURL(), "--trust-decision-key", pub}, envflag.Env{}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	if err := cmd.Execute(testCtx(t), testenv.Logger(t), &stdout, &stderr); err != nil {
		t.Fatalf("execute: %v\nstdout:\n%s\nstderr:\n%s", err, &stdout, &stderr)
	}
	if !strings.Contains(stdout.String(), "6 steps: 6 executed") {
		t.Fatalf("output:\n%s", &stdout)
	}
}

// load runs from ASSENT_ variables alone, one of them read from a file; the
// command line wins over them.
func TestLoadFromEnvironment(t *testing.T) {
	ns := testenv.Server(t)
	startBroker(t, testenv.Conn(t, ns), broker.ModeAutoApprove)
	urlFile := filepath.Join(t.TempDir(), "nats-url")
	writeFiles(t, filepath.Dir(urlFile), map[string]string{"nats-url": ns.ClientURL() + "\n"})
	env := envflag.Map(map[string]string{
		"ASSENT_NATS_URL_FILE": urlFile,
		"ASSENT_N":             "500", // the command line says 20
		"ASSENT_C":             "4",
		"ASSENT_AGENT":         "env-load",
		"ASSENT_JSON":          "true",
		"ASSENT_TIMEOUT":       "20s",
	})
	var stderr bytes.Buffer
	cmd, err := worker.ParseArgs([]string{"load", "--n", "20"}, env, &stderr)
	if err != nil {
		t.Fatalf("%v\n%s", err, &stderr)
	}
	if stderr.Len() > 0 {
		t.Errorf("stderr: %s", &stderr)
	}
	var stdout bytes.Buffer
	if err := cmd.Execute(testCtx(t), testenv.Logger(t), &stdout, io.Discard); err != nil {
		t.Fatal(err)
	}
	var res struct {
		Sent        int            `json:"sent"`
		Concurrency int            `json:"concurrency"`
		Outcomes    map[string]int `json:"outcomes"`
	}
	if err := json.Unmarshal(stdout.Bytes(), &res); err != nil {
		t.Fatalf("the report is not the JSON ASSENT_JSON asks for: %v\n%s", err, &stdout)
	}
	if res.Sent != 20 || res.Concurrency != 4 || res.Outcomes["approved"] != 20 {
		t.Errorf("report %+v, want 20 sent 4 at a time, all approved:\n%s", res, &stdout)
	}
	if cmd.Load.Agent != "env-load" || cmd.Load.Config.Timeout != 20*time.Second {
		t.Errorf("agent %q, timeout %s: not ASSENT_AGENT's and ASSENT_TIMEOUT's", cmd.Load.Agent, cmd.Load.Config.Timeout)
	}

	stderr.Reset()
	_, err = worker.ParseArgs([]string{"load"}, envflag.Map(map[string]string{"ASSENT_C": "four", "ASSENT_PLAN": "p.json"}), &stderr)
	if !errors.Is(err, worker.ErrUsage) || !strings.Contains(stderr.String(), "ASSENT_C, for --c: want a whole number") || !strings.Contains(stderr.String(), "usage: agent-worker load") {
		t.Errorf("a bad ASSENT_C: %v\n%s", err, &stderr)
	}
	if strings.Contains(stderr.String(), "ASSENT_PLAN") {
		t.Errorf("warned of ASSENT_PLAN though the environment was refused:\n%s", &stderr)
	}
}
