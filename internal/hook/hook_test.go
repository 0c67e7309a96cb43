package hook_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

	"github.com/assent-dev/assent/internal/broker"
	"github.com/assent-dev/assent/internal/brokertest"
	"github.com/assent-dev/assent/internal/hook"
	"github.com/assent-dev/assent/internal/natsconn"
	"github.com/assent-dev/assent/internal/testenv"
	"github.com/assent-dev/assent/pkg/events"
	"github.com/assent-dev/assent/pkg/handler"
	"github.com/assent-dev/assent/pkg/policy"
)

// patience bounds every wait: long enough that only a hang misses it, even
// with -race on two busy cores.
const patience = 30 * time.Second

// env is an embedded NATS server with a broker on it running the docs'
// policy, and the test's own connection.
type env struct {
	ns   *testenv.NATS
	nc   *nats.Conn
	js   jetstream.JetStream
	b    *broker.Broker
	stop func()
}

func newEnv(t *testing.T, p *policy.Policy) *env {
	t.Helper()
	ns := testenv.Server(t)
	b, stop := brokertest.Run(t, testenv.Conn(t, ns), broker.Config{Name: "hook-test", Policy: p})
	nc := testenv.Conn(t, ns)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return &env{ns: ns, nc: nc, js: js, b: b, stop: stop}
}

// config is how a hook reaches e, asking on carol's behalf.
func (e *env) config() hook.Config {
	return hook.Config{User: "carol", NATS: natsconn.Settings{URL: e.ns.ClientURL()}, HookTimeout: 40 * time.Second}
}

// pendingOf watches the pending requests of agent; each call of the
// returned func waits for the next one.
func (e *env) pendingOf(t *testing.T, agent string) func() events.Pending {
	t.Helper()
	subj, err := events.PendingSubject(agent)
	if err != nil {
		t.Fatal(err)
	}
	sub, err := e.nc.SubscribeSync(subj)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := e.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return func() events.Pending {
		t.Helper()
		for {
			m, err := sub.NextMsg(patience)
			if err != nil {
				t.Fatalf("no pending request of %s: %v", agent, err)
			}
			ev, err := events.Decode(events.Header(m.Header), m.Data)
			if err != nil {
				t.Fatal(err)
			}
			if ev.Type() == events.TypePending {
				p, err := events.DecodePending(&ev)
				if err != nil {
					t.Fatal(err)
				}
				return p
			}
		}
	}
}

// answer publishes principal's answer to request id.
func (e *env) answer(t *testing.T, principal, id string, r events.Responded) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	if err := handler.Answer(ctx, e.js, principal, id, r); err != nil {
		t.Fatalf("answer %s as %s: %v", id, principal, err)
	}
}

// record reads request id as the broker has it, once decided.
func (e *env) record(t *testing.T, id string) broker.Record {
	t.Helper()
	deadline := time.Now().Add(patience)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), patience)
		rec, err := e.b.Get(ctx, id)
		cancel()
		if err == nil && rec.Decision != nil {
			return rec
		}
		if time.Now().After(deadline) {
			t.Fatalf("request %s not decided: %+v, %v", id, rec, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// ran is what one hook run answered and printed.
type ran struct {
	a   hook.Answer
	out string
	err error
	in  time.Duration
}

// run runs a hook of dialect d with cfg on the hook input in, with ctx.
func run(t *testing.T, ctx context.Context, d hook.Dialect, cfg hook.Config, in []byte) <-chan ran {
	t.Helper()
	h, err := hook.New(d, cfg, testenv.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	return testenv.Go(t, func() ran {
		var out bytes.Buffer
		start := time.Now()
		a, err := h.Run(ctx, bytes.NewReader(in), &out)
		return ran{a, out.String(), err, time.Since(start)}
	})
}

// await is what a run answered.
func await(t *testing.T, ch <-chan ran) ran {
	t.Helper()
	r := testenv.Await(t, ch, 2*patience, "Hook.Run")
	if r.err != nil {
		t.Fatal(r.err)
	}
	if string(r.a.Output) != r.out {
		t.Fatalf("printed %q, answered %q", r.out, r.a.Output)
	}
	return r
}

// verdict reads what a dialect printed: whether it allows the call, the
// input it runs instead, and the reason.
func verdict(t *testing.T, d hook.Dialect, out string) (allow bool, input json.RawMessage, reason string) {
	t.Helper()
	if out == "" {
		if d.Name != "codex" {
			t.Fatalf("%s printed nothing", d.Name)
		}
		return true, nil, "" // Codex: no answer lets the call go on
	}
	if strings.Count(out, "\n") != 1 || !strings.HasSuffix(out, "\n") {
		t.Fatalf("printed %q, want one line", out)
	}
	switch d.Name {
	case "gemini":
		var v struct {
			Decision           string `json:"decision"`
			Reason             string `json:"reason"`
			HookSpecificOutput *struct {
				ToolInput json.RawMessage `json:"tool_input"`
			} `json:"hookSpecificOutput"`
		}
		if err := testenv.StrictJSON([]byte(out), &v); err != nil {
			t.Fatalf("%s: %v", out, err)
		}
		if v.HookSpecificOutput != nil {
			input = v.HookSpecificOutput.ToolInput
		}
		return v.Decision == "allow", input, v.Reason
	default:
		var v struct {
			HookSpecificOutput struct {
				HookEventName            string          `json:"hookEventName"`
				PermissionDecision       string          `json:"permissionDecision"`
				PermissionDecisionReason string          `json:"permissionDecisionReason"`
				UpdatedInput             json.RawMessage `json:"updatedInput"`
			} `json:"hookSpecificOutput"`
		}
		if err := testenv.StrictJSON([]byte(out), &v); err != nil {
			t.Fatalf("%s: %v", out, err)
		}
		o := v.HookSpecificOutput
		if o.HookEventName != "PreToolUse" || o.PermissionDecision != "allow" && o.PermissionDecision != "deny" {
			t.Fatalf("printed %s", out)
		}
		if d.Name == "codex" && o.PermissionDecision == "allow" && o.UpdatedInput == nil {
			t.Fatalf("Codex refuses allow without updatedInput: %s", out)
		}
		return o.PermissionDecision == "allow", o.UpdatedInput, o.PermissionDecisionReason
	}
}

// Every recorded tool call, of each agent, through the hook to a broker
// running the docs' policy: read-only tools run at once (policy), a force
// push is refused at once (policy), everything else waits for carol with the
// request a policy and an approver need, and runs once she approves.
func TestHookRecordedInputs(t *testing.T) {
	e := newEnv(t, docPolicy(t))
	for _, r := range inputs {
		t.Run(r.name(), func(t *testing.T) {
			d := dialect(t, r.dialect)
			pending := e.pendingOf(t, d.Agent)
			ch := run(t, context.Background(), d, e.config(), r.data(t))
			forcePush := r.dialect == "codex" && r.file == "bash"
			if !r.readOnly && !forcePush {
				p := pending()
				c, err := hook.Parse(d, r.data(t))
				if err != nil {
					t.Fatal(err)
				}
				req := p.Request
				if req.Tool != r.tool || req.Agent != d.Agent || req.User != "carol" || req.Session != r.session || req.CallID != r.callID ||
					req.Hint != d.Hint(c) || !sameArgs(t, req.Args, r.toolInput(t)) || p.Rule != "coding-agent-changes" {
					t.Errorf("request %+v (rule %s), want tool %s, the tool_input as args, session %s, call id %s", req, p.Rule, r.tool, r.session, r.callID)
				}
				if req.Labels["coding_agent"] != d.Agent || req.Labels["read_only"] != "false" || req.Labels["cwd"] != "/home/carol/proj" {
					t.Errorf("labels %v", req.Labels)
				}
				if time.Duration(req.Timeout) != e.config().HookTimeout-hook.DefaultTimeoutMargin {
					t.Errorf("timeout %s, want --hook-timeout less 10s", req.Timeout.Std())
				}
				e.answer(t, "carol", p.RequestID, events.Responded{Decision: events.Approve, Channel: "web"})
			}
			got := await(t, ch)
			allow, input, reason := verdict(t, d, got.out)
			rec := e.record(t, got.a.RequestID)
			switch {
			case forcePush:
				if allow || !strings.Contains(reason, `policy rule no-force-push denied this Bash call in Assent: "no force-pushing from a coding agent"`) {
					t.Errorf("force push: allow %v, %q", allow, reason)
				}
			case r.readOnly:
				if !allow || input != nil || rec.Decision.Rule != "coding-agent-reads" || !rec.Decision.Auto {
					t.Errorf("read-only: allow %v, input %s, decided %+v", allow, input, rec.Decision)
				}
			default:
				if !allow || input != nil || rec.Decision.Outcome != events.Approved || rec.Decision.DecidedBy[0].Principal != "carol" {
					t.Errorf("approved: allow %v, input %s, decided %+v", allow, input, rec.Decision)
				}
			}
			if rec.Request.Tool != r.tool || rec.Request.Labels["read_only"] != map[bool]string{true: "true", false: "false"}[r.readOnly] {
				t.Errorf("stored request %+v", rec.Request)
			}
		})
	}
}

// Approved, denied with a reason, approved with edited arguments: each
// agent is told in its own protocol; an edit runs where the protocol can
// carry it, and is refused with the arguments to use where it cannot.
func TestHookAnswers(t *testing.T) {
	e := newEnv(t, docPolicy(t))
	for _, tc := range []struct {
		name, dialect, file string
		answer              events.Responded
		allow               bool
		input               string
		reason              string
	}{
		{"approved", "claude", "bash", events.Responded{Decision: events.Approve}, true, "", "Approved in Assent by carol (web) under rule coding-agent-changes"},
		{"denied", "claude", "bash", events.Responded{Decision: events.Deny, Reason: "not the cache"}, false, "",
			`Not run: carol (web) under rule coding-agent-changes denied this Bash call in Assent: "not the cache". Do not try it again unchanged`},
		{"edited", "claude", "bash", events.Responded{Decision: events.Approve, Args: json.RawMessage(`{"command":"rm -rf build","description":"Remove build output"}`)},
			true, `{"command":"rm -rf build","description":"Remove build output"}`, "with changed arguments, which are what runs"},
		{"approved", "codex", "apply_patch", events.Responded{Decision: events.Approve}, true, "", ""},
		{"denied", "codex", "apply_patch", events.Responded{Decision: events.Deny, Reason: "wrong file"}, false, "", `denied this apply_patch call in Assent: "wrong file"`},
		{"edited", "codex", "mcp", events.Responded{Decision: events.Approve, Args: json.RawMessage(`{"title":"Rotate the staging keys","team":"security"}`)},
			true, `{"title":"Rotate the staging keys","team":"security"}`, "with changed arguments"},
		{"approved", "gemini", "write_file", events.Responded{Decision: events.Approve}, true, "", ""},
		{"denied", "gemini", "run_shell_command", events.Responded{Decision: events.Deny, Reason: "keep the cache"}, false, "", `"keep the cache"`},
		{"edited", "gemini", "run_shell_command", events.Responded{Decision: events.Approve, Args: json.RawMessage(`{"command":"rm -rf ~/.cache/proj/tmp","description":"Clear the cache","directory":"."}`)},
			true, `{"command":"rm -rf ~/.cache/proj/tmp","description":"Clear the cache","directory":"."}`, ""},
		{"edited, an argument removed", "gemini", "run_shell_command", events.Responded{Decision: events.Approve, Args: json.RawMessage(`{"command":"rm -rf ~/.cache/proj/tmp"}`)},
			false, "", `which this hook cannot pass on to Gemini CLI. If it is still wanted, call run_shell_command again with exactly these arguments: {"command":"rm -rf ~/.cache/proj/tmp"}`},
	} {
		t.Run(tc.dialect+"/"+tc.name, func(t *testing.T) {
			d := dialect(t, tc.dialect)
			r := recorded{dialect: tc.dialect, file: tc.file}
			pending := e.pendingOf(t, d.Agent)
			ch := run(t, context.Background(), d, e.config(), r.data(t))
			p := pending()
			tc.answer.Channel = "web"
			e.answer(t, "carol", p.RequestID, tc.answer)
			got := await(t, ch)
			allow, input, reason := verdict(t, d, got.out)
			if allow != tc.allow || tc.input == "" && input != nil || tc.input != "" && !sameArgs(t, input, json.RawMessage(tc.input)) {
				t.Errorf("printed %s: want allow %v, input %s", got.out, tc.allow, tc.input)
			}
			if !strings.Contains(reason, tc.reason) || reason != "" && !strings.Contains(reason, "Assent request "+p.RequestID) {
				t.Errorf("reason %q, want %q and the request", reason, tc.reason)
			}
		})
	}
}

// A call nobody answers expires in Assent, on the record, and is denied
// saying so, well before the hook's time runs out.
func TestHookExpires(t *testing.T) {
	e := newEnv(t, docPolicy(t))
	cfg := e.config()
	cfg.HookTimeout, cfg.Timeout = 20*time.Second, time.Second
	got := await(t, run(t, context.Background(), hook.Claude(), cfg, recorded{dialect: "claude", file: "write"}.data(t)))
	allow, _, reason := verdict(t, hook.Claude(), got.out)
	if allow || !strings.Contains(reason, "Not run: nobody approved this Write call in Assent in time") {
		t.Errorf("printed %s", got.out)
	}
	if rec := e.record(t, got.a.RequestID); rec.Decision.Outcome != events.Expired {
		t.Errorf("decided %+v", rec.Decision)
	}
	if got.in > cfg.HookTimeout-hook.AnswerMargin {
		t.Errorf("answered after %s", got.in)
	}
}

// Without a broker to decide, a call is denied at once, saying what to do:
// NATS unreachable, NATS without a broker ever, a broker stopped.
func TestHookNoBroker(t *testing.T) {
	bash := recorded{dialect: "claude", file: "bash"}
	gone := testenv.Server(t)
	goneURL := gone.ClientURL()
	gone.Stop()
	stopped := newEnv(t, docPolicy(t))
	stopped.stop()
	for _, tc := range []struct {
		name, url, reason string
	}{
		{"NATS unreachable", goneURL, "because Assent is unreachable (connect to NATS at " + goneURL},
		{"no broker ever", testenv.Server(t).ClientURL(), "because no Assent broker answers: no broker is connected to NATS"},
		{"broker stopped", stopped.ns.ClientURL(), "because no Assent broker answers: no broker is connected to NATS"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := hook.Config{NATS: natsconn.Settings{URL: tc.url}, HookTimeout: 5 * time.Minute}
			got := await(t, run(t, context.Background(), hook.Claude(), cfg, bash.data(t)))
			allow, _, reason := verdict(t, hook.Claude(), got.out)
			if allow || !strings.Contains(reason, "Not run: this Bash call was not approved, "+tc.reason) ||
				!strings.Contains(reason, "Nothing runs without Assent's approval: tell the user to start the Assent broker") {
				t.Errorf("printed %s", got.out)
			}
			if got.in > hook.DefaultBrokerWait+5*time.Second {
				t.Errorf("answered after %s, with %s to go", got.in, cfg.HookTimeout)
			}
		})
	}
}

// A broker that takes the request up and then stops decides nothing: the
// hook answers deny before the agent's time for it runs out, and withdraws
// the request.
func TestHookAnswersInTime(t *testing.T) {
	e := newEnv(t, docPolicy(t))
	cfg := e.config()
	cfg.HookTimeout, cfg.Timeout = hook.MinHookTimeout, 3*time.Second
	cfg.BrokerWait = -1 // not watching for the broker to take the request up, which it does before it stops
	pending := e.pendingOf(t, "claude-code")
	ch := run(t, context.Background(), hook.Claude(), cfg, recorded{dialect: "claude", file: "edit"}.data(t))
	p := pending()
	e.stop()
	got := await(t, ch)
	allow, _, reason := verdict(t, hook.Claude(), got.out)
	if allow || !strings.Contains(reason, "nobody decided it in Assent before the hook had to answer (its timeout is 11s); the request was withdrawn (Assent request "+p.RequestID) {
		t.Errorf("printed %s", got.out)
	}
	// Run returns once the request is withdrawn, before the hook timeout.
	if got.in < cfg.HookTimeout-hook.AnswerMargin-time.Second || got.in >= cfg.HookTimeout {
		t.Errorf("returned after %s, hook timeout %s", got.in, cfg.HookTimeout)
	}
	subj, err := events.AgentCancelSubject("claude-code", p.RequestID)
	if err != nil {
		t.Fatal(err)
	}
	stream, err := e.js.Stream(context.Background(), events.StreamName)
	if err != nil {
		t.Fatal(err)
	}
	m, err := stream.GetLastMsgForSubject(context.Background(), subj)
	if err != nil {
		t.Fatalf("no cancel stored on %s: %v", subj, err)
	}
	if !strings.Contains(string(m.Data), "requester stopped waiting: the hook's time ran out") {
		t.Errorf("cancel %s", m.Data)
	}
}

// A hook stopped while it waits (the agent's SIGTERM, Ctrl-C) denies the
// call and withdraws the request: cancelled, on the record.
func TestHookStopped(t *testing.T) {
	e := newEnv(t, docPolicy(t))
	pending := e.pendingOf(t, "gemini-cli")
	ctx, cancel := context.WithCancel(context.Background())
	ch := run(t, ctx, hook.Gemini(), e.config(), recorded{dialect: "gemini", file: "replace"}.data(t))
	p := pending()
	cancel()
	got := await(t, ch)
	allow, _, reason := verdict(t, hook.Gemini(), got.out)
	if allow || !strings.Contains(reason, "assent-hook was stopped before Assent decided; the request was withdrawn (Assent request "+p.RequestID) {
		t.Errorf("printed %s", got.out)
	}
	rec := e.record(t, p.RequestID)
	if rec.Decision.Outcome != events.Cancelled || !strings.Contains(rec.Decision.Reason, "requester stopped waiting") {
		t.Errorf("decided %+v", rec.Decision)
	}
}

// Input the hook cannot put to Assent is denied without asking (the NATS
// URL here is nobody's), saying what is wrong.
func TestHookRefusesInput(t *testing.T) {
	cfg := hook.Config{NATS: natsconn.Settings{URL: "nats://127.0.0.1:1"}}
	for _, tc := range []struct {
		file, dialect, reason string
	}{
		{"not_json.txt", "claude", "assent-hook could not read its input (unreadable hook input: not a JSON object"},
		{"empty.json", "gemini", "assent-hook could not read its input"},
		{"no_tool.json", "codex", "no tool_name"},
		{"input_string.json", "claude", "tool_input is not a JSON object"},
		{"post_tool_use.json", "claude", "a PostToolUse event, not PreToolUse: configure assent-hook claude as a PreToolUse hook"},
		{"two_values.json", "claude", "more after the JSON object"},
		{"control_in_session.json", "claude", "Assent does not take it as asked (session: "},
	} {
		t.Run(tc.file, func(t *testing.T) {
			data, err := os.ReadFile(filepath.Join("testdata", "malformed", tc.file))
			if err != nil {
				t.Fatal(err)
			}
			d := dialect(t, tc.dialect)
			got := await(t, run(t, context.Background(), d, cfg, data))
			allow, _, reason := verdict(t, d, got.out)
			if allow || got.a.RequestID != "" || !strings.Contains(reason, tc.reason) || !strings.Contains(reason, "Nothing runs without Assent's approval") {
				t.Errorf("printed %s (request %q), want a denial saying %q", got.out, got.a.RequestID, tc.reason)
			}
		})
	}
}

// A call too large for a broker to take (a Write of a big file) is denied
// at once, saying so, rather than waiting for a broker that refuses it.
func TestHookTooLarge(t *testing.T) {
	e := newEnv(t, docPolicy(t))
	content, err := json.Marshal(strings.Repeat("x", events.DefaultMaxEventSize))
	if err != nil {
		t.Fatal(err)
	}
	in := `{"session_id":"s","cwd":"/home/carol/proj","hook_event_name":"PreToolUse","tool_name":"Write","tool_input":{"file_path":"/home/carol/proj/big.txt","content":` + string(content) + `}}`
	got := await(t, run(t, context.Background(), hook.Claude(), e.config(), []byte(in)))
	allow, _, reason := verdict(t, hook.Claude(), got.out)
	if allow || got.a.RequestID != "" || !strings.Contains(reason, "because it is too large to put to Assent (its request is ") || got.in > hook.DefaultBrokerWait {
		t.Errorf("after %s printed %.300s (request %q)", got.in, got.out, got.a.RequestID)
	}
}

// A hook that cannot be told a stdin's end still answers in time.
func TestHookStdinThatDoesNotEnd(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close(); w.Close() })
	h, err := hook.New(hook.Claude(), hook.Config{HookTimeout: hook.MinHookTimeout}, testenv.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	start := time.Now()
	if _, err := h.Run(context.Background(), r, &out); err != nil {
		t.Fatal(err)
	}
	allow, _, reason := verdict(t, hook.Claude(), out.String())
	if allow || !strings.Contains(reason, "stdin did not end: the hook's time ran out") || time.Since(start) >= hook.MinHookTimeout {
		t.Errorf("after %s printed %s", time.Since(start), out.String())
	}
}

// Every problem with a configuration is reported at once.
func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  hook.Config
		want []string
	}{
		{"defaults", hook.Config{}, nil},
		{"hook timeout too short", hook.Config{HookTimeout: 10 * time.Second}, []string{"--hook-timeout 10s: want 11s or more"}},
		{"timeout too long", hook.Config{HookTimeout: time.Minute, Timeout: 55 * time.Second}, []string{"--timeout 55s: want 1s up to 52s"}},
		{"everything wrong", hook.Config{Agent: "claude code", User: "bad\x07", Labels: map[string]string{"read_only": "true", "team": "pay\x00"},
			HookTimeout: 5 * time.Minute, Timeout: 10 * time.Minute, TrustedKeys: []string{"not-a-key"}, NATS: natsconn.Settings{Creds: "/nonexistent.creds"}},
			[]string{"--agent", "--user", "--label read_only: the hook sets this label itself", `--label "team"`, "--timeout 10m0s", "--trust-decision-key", "NATS credentials file"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.WithDefaults(hook.Claude()).Validate()
			if tc.want == nil {
				if err != nil {
					t.Errorf("error %v", err)
				}
				return
			}
			for _, w := range tc.want {
				if err == nil || !strings.Contains(err.Error(), w) {
					t.Errorf("error %v, want %q", err, w)
				}
			}
		})
	}
	if cfg := (hook.Config{}).WithDefaults(hook.Gemini()); cfg.Agent != "gemini-cli" || cfg.HookTimeout != time.Minute || cfg.Timeout != 50*time.Second || cfg.NATS.URL != hook.DefaultNATSURL {
		t.Errorf("defaults %+v", cfg)
	}
	_, err := hook.New(hook.Codex(), hook.Config{HookTimeout: time.Second}, nil)
	if err == nil {
		t.Error("New took a configuration Validate refuses")
	}
	if errors.Is(err, hook.ErrInput) {
		t.Error("a configuration error is not an input error")
	}
}

// With the broker's decision key trusted, the broker's signed decisions
// decide.
func TestHookTrustsSignedDecisions(t *testing.T) {
	key, err := nkeys.CreateAccount()
	if err != nil {
		t.Fatal(err)
	}
	pub, err := key.PublicKey()
	if err != nil {
		t.Fatal(err)
	}
	ns := testenv.Server(t)
	brokertest.Run(t, testenv.Conn(t, ns), broker.Config{Name: "signing", Policy: docPolicy(t), DecisionKey: key})
	cfg := hook.Config{NATS: natsconn.Settings{URL: ns.ClientURL()}, TrustedKeys: []string{pub}}
	got := await(t, run(t, context.Background(), hook.Claude(), cfg, recorded{dialect: "claude", file: "grep"}.data(t)))
	if allow, _, reason := verdict(t, hook.Claude(), got.out); !allow || !strings.Contains(reason, "by policy rule coding-agent-reads") {
		t.Errorf("printed %s", got.out)
	}
}
