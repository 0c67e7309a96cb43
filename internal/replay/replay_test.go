package replay_test

import (
	"context"
	"encoding/json"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/assent-dev/assent/internal/broker"
	"github.com/assent-dev/assent/internal/brokertest"
	"github.com/assent-dev/assent/internal/replay"
	"github.com/assent-dev/assent/internal/testenv"
	"github.com/assent-dev/assent/pkg/events"
	"github.com/assent-dev/assent/pkg/handler"
	"github.com/assent-dev/assent/pkg/policy"
)

// livePolicy is the policy the broker of the recorded history runs: rules of
// every action, CEL conditions, a limit, remembered choices, escalation, a
// rule nobody present can answer.
const livePolicy = `version: 1
mode: manual
defaults:
  timeout: 1h
principals:
  alice: {roles: [finance]}
  bob:   {roles: [finance]}
  carol: {roles: [ops]}
  dave:  {roles: [night]}
rules:
  - name: reads
    tools: [read_file]
    action: allow
  - name: lists
    tools: [list_dir]
    action: allow
  - name: no-drop
    tools: ["drop_*"]
    action: deny
  - name: small-pay
    tools: [pay]
    when: 'args.amount <= 100'
    action: allow
  - name: big-pay
    tools: [pay]
    when: 'args.amount > 100'
    action: require_approval
    approvers: ["role:finance"]
  - name: writes
    tools: [write_file]
    action: require_approval
    approvers: [alice, bob, carol]
  - name: night-ops
    tools: [reboot]
    action: require_approval
    approvers: [dave]
  - name: deploys
    tools: [deploy]
    action: require_approval
    approvers: [alice]
    timeout: 2s
    escalation:
      - after: 1s
        approvers: [carol]
  - name: probes
    tools: [probe]
    action: require_approval
    approvers: [alice, bob, carol]
    quorum: 3
limits:
  - name: pay-per-session
    tools: [pay]
    per: session
    sum: args.amount
    max: 250
    window: 1h
`

// candidatePolicy changes livePolicy so that each kind of change happens:
// lists gone, a deny for secret reads and big payments, drop_index allowed
// and drop_view asked, the limit raised, writes allowed, deploys denied,
// night-ops waiting for dave.
const candidatePolicy = `version: 1
mode: manual
defaults:
  timeout: 1h
principals:
  alice: {roles: [finance]}
  bob:   {roles: [finance]}
  carol: {roles: [ops]}
  dave:  {roles: [night]}
rules:
  - name: no-secret-reads
    tools: [read_file]
    when: 'args.path.startsWith("/secret")'
    action: deny
  - name: reads
    tools: [read_file]
    action: allow
  - name: no-drop
    tools: [drop_table]
    action: deny
  - name: drop-index-ok
    tools: [drop_index]
    action: allow
  - name: no-big-pay
    tools: [pay]
    when: 'args.amount > 400'
    action: deny
  - name: small-pay
    tools: [pay]
    when: 'args.amount <= 100'
    action: allow
  - name: big-pay
    tools: [pay]
    when: 'args.amount > 100'
    action: require_approval
    approvers: ["role:finance"]
  - name: writes
    tools: [write_file]
    action: allow
  - name: night-ops
    tools: [reboot]
    action: require_approval
    approvers: [dave]
    on_no_approver: wait
  - name: no-deploys
    tools: [deploy]
    action: deny
  - name: probes
    tools: [probe]
    action: require_approval
    approvers: [alice, bob, carol]
    quorum: 3
limits:
  - name: pay-per-session
    tools: [pay]
    per: session
    sum: args.amount
    max: 1000
    window: 1h
`

// history is a broker's recorded stream, made once by recordHistory.
type history struct {
	ns       *testenv.NATS
	js       jetstream.JetStream
	requests int       // requests made
	marked   time.Time // after the agent-scoped remembered denial was made
	ids      map[string]string
}

func mustPolicy(t testing.TB, src, name string) *policy.Policy {
	t.Helper()
	p, err := policy.Parse([]byte(src), name)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func ctxFor(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// recordHistory runs a broker with livePolicy, approvers alice, bob and
// carol present (dave is not), and makes requests that end in every way:
// allowed, denied, approved and denied by people, remembered both ways,
// held by the limit, no approver, expired after escalating, cancelled,
// denied by their input schema and invalid.
func recordHistory(t *testing.T) *history {
	ns := testenv.Server(t)
	nc := testenv.Conn(t, ns)
	b, _ := brokertest.Run(t, nc, broker.Config{Name: "recorder", Policy: mustPolicy(t, livePolicy, "live.yaml"), AnnouncedOnly: true})
	skip := func(context.Context, handler.Request) (handler.Response, error) {
		return handler.Response{}, handler.ErrSkip
	}
	for _, p := range []string{"alice", "bob", "carol"} {
		brokertest.RunApprover(t, testenv.Conn(t, ns), handler.ApproverConfig{Principal: p, Channel: "test"}, skip)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	h := &history{ns: ns, js: js, ids: map[string]string{}}
	ctx := ctxFor(t)
	submit := func(name string, req events.Requested) broker.Record {
		t.Helper()
		id := events.NewID()
		rec, err := b.Submit(ctx, id, "agent/"+req.Agent, req)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		h.requests++
		h.ids[name] = id
		return rec
	}
	want := func(name string, rec broker.Record, state broker.State) {
		t.Helper()
		if rec.State != state {
			t.Fatalf("%s: %s (%+v), want %s", name, rec.State, rec.Decision, state)
		}
	}
	respond := func(name, principal string, resp events.Responded, state broker.State) {
		t.Helper()
		rec, err := b.Respond(ctx, principal, h.ids[name], resp)
		if err != nil {
			t.Fatalf("%s: %s answers: %v", name, principal, err)
		}
		want(name, rec, state)
	}
	args := func(s string) json.RawMessage { return json.RawMessage(s) }

	// Wait until the broker sees the three approvers: a probe waits only
	// if all three are reachable. Probes before that are denied, and all
	// are part of the history.
	for i := 0; ; i++ {
		rec := submit("probe", events.Requested{Tool: "probe", Agent: "prober"})
		if rec.State == broker.StatePending {
			if _, err := b.Cancel(ctx, rec.ID, "admin", "probe done"); err != nil {
				t.Fatal(err)
			}
			break
		}
		if i == 200 {
			t.Fatal("the approvers' presence never reached the broker")
		}
		time.Sleep(50 * time.Millisecond)
	}

	want("read", submit("read", events.Requested{Tool: "read_file", Agent: "files", Args: args(`{"path":"/srv/a"}`)}), broker.StateApproved)
	want("secret read", submit("secret read", events.Requested{Tool: "read_file", Agent: "files", Args: args(`{"path":"/secret/key"}`)}), broker.StateApproved)
	want("list", submit("list", events.Requested{Tool: "list_dir", Agent: "files", Args: args(`{"path":"/srv"}`)}), broker.StateApproved)
	for _, tool := range []string{"drop_table", "drop_index", "drop_view"} {
		want(tool, submit(tool, events.Requested{Tool: tool, Agent: "db"}), broker.StateDenied)
	}

	// The limit: 50 + 80 + 100 + 20 fit in 250, 30 more does not, and a
	// person approves it. A payment whose args break its input schema is
	// denied before the policy, and charges nothing.
	for _, amount := range []string{"50", "80", "100"} {
		want("pay", submit("pay"+amount, events.Requested{Tool: "pay", Agent: "payer", Session: "s1", User: "u1", Args: args(`{"amount":` + amount + `}`)}), broker.StateApproved)
	}
	schema := args(`{"type":"object","required":["amount","currency"]}`)
	bad := submit("pay bad schema", events.Requested{Tool: "pay", Agent: "payer", Session: "s1", User: "u1", Args: args(`{"amount":20}`), InputSchema: schema})
	want("pay bad schema", bad, broker.StateDenied)
	if bad.Decision.Rule != broker.RuleInputSchema {
		t.Fatalf("pay bad schema: rule %s", bad.Decision.Rule)
	}
	// 230 + 20 fits: the denied payment charged nothing.
	want("pay20", submit("pay20", events.Requested{Tool: "pay", Agent: "payer", Session: "s1", User: "u1", Args: args(`{"amount":20,"currency":"EUR"}`), InputSchema: schema}), broker.StateApproved)
	held := submit("pay30", events.Requested{Tool: "pay", Agent: "payer", Session: "s1", User: "u1", Args: args(`{"amount":30}`)})
	want("pay30", held, broker.StatePending)
	if held.Limit != "pay-per-session" {
		t.Fatalf("pay30: limit %q", held.Limit)
	}
	respond("pay30", "alice", events.Responded{Decision: events.Approve}, broker.StateApproved)

	want("pay500", submit("pay500", events.Requested{Tool: "pay", Agent: "payer", Session: "s2", User: "u1", Args: args(`{"amount":500}`)}), broker.StatePending)
	respond("pay500", "alice", events.Responded{Decision: events.Approve}, broker.StateApproved)
	want("pay700", submit("pay700", events.Requested{Tool: "pay", Agent: "payer", Session: "s2", User: "u1", Args: args(`{"amount":700}`)}), broker.StatePending)
	respond("pay700", "bob", events.Responded{Decision: events.Deny, Reason: "too much"}, broker.StateDenied)

	// Remembered choices: an approval for session w2, then a denial for
	// the whole agent.
	want("write w2", submit("write w2", events.Requested{Tool: "write_file", Agent: "writer", Session: "w2", Args: args(`{"path":"/a"}`)}), broker.StatePending)
	respond("write w2", "alice", events.Responded{Decision: events.Approve, Remember: &events.Remember{Scope: events.ScopeSession, TTL: events.Duration(time.Hour)}}, broker.StateApproved)
	again := submit("write w2 again", events.Requested{Tool: "write_file", Agent: "writer", Session: "w2", Args: args(`{"path":"/b"}`)})
	want("write w2 again", again, broker.StateApproved)
	if !strings.HasPrefix(again.Decision.Rule, "remembered:") {
		t.Fatalf("write w2 again: rule %s", again.Decision.Rule)
	}
	want("write w3", submit("write w3", events.Requested{Tool: "write_file", Agent: "writer", Session: "w3", Args: args(`{"path":"/c"}`)}), broker.StatePending)
	respond("write w3", "carol", events.Responded{Decision: events.Deny, Remember: &events.Remember{Scope: events.ScopeAgent}}, broker.StateDenied)
	time.Sleep(20 * time.Millisecond)
	h.marked = time.Now()
	time.Sleep(20 * time.Millisecond)
	denied := submit("write w5", events.Requested{Tool: "write_file", Agent: "writer", Session: "w5", Args: args(`{"path":"/d"}`)})
	want("write w5", denied, broker.StateDenied)
	if !strings.HasPrefix(denied.Decision.Rule, "remembered:") {
		t.Fatalf("write w5: rule %s", denied.Decision.Rule)
	}

	// Nobody can answer night-ops: dave is not there.
	reboot := submit("reboot", events.Requested{Tool: "reboot", Agent: "ops"})
	want("reboot", reboot, broker.StateDenied)
	if reboot.Decision.Reason != policy.ReasonNoApprover {
		t.Fatalf("reboot: %s", reboot.Decision.Reason)
	}

	// A deploy escalates after 1s and expires after 2s.
	want("deploy", submit("deploy", events.Requested{Tool: "deploy", Agent: "ci"}), broker.StatePending)

	// A write that its agent cancels.
	want("write w4", submit("write w4", events.Requested{Tool: "write_file", Agent: "writer2", Session: "w4", Args: args(`{"path":"/e"}`)}), broker.StatePending)
	if _, err := b.Cancel(ctx, h.ids["write w4"], "agent/writer2", "not needed"); err != nil {
		t.Fatal(err)
	}

	// Denied before the policy: args that break the input schema, and an
	// invalid request (no tool), published as any NATS client would.
	resize := submit("resize", events.Requested{Tool: "resize", Agent: "img", Args: args(`{"size":"big"}`),
		InputSchema: args(`{"type":"object","properties":{"size":{"type":"integer"}},"required":["size"]}`)})
	want("resize", resize, broker.StateDenied)
	invalid := publishInvalid(t, nc)
	h.requests++
	if rec, err := b.Wait(ctx, invalid); err != nil || rec.State != broker.StateDenied || rec.Decision.Rule != "validation" {
		t.Fatalf("invalid request: %v %+v", err, rec.Decision)
	}

	if rec, err := b.Wait(ctx, h.ids["deploy"]); err != nil || rec.State != broker.StateExpired || rec.Level != 1 {
		t.Fatalf("deploy: %v %s level %d", err, rec.State, rec.Level)
	}
	return h
}

// publishInvalid publishes a request without a tool, whose envelope is
// sound: the broker denies it (rule validation). It returns its id.
func publishInvalid(t *testing.T, nc *nats.Conn) string {
	t.Helper()
	id := events.NewID()
	e, err := events.New(events.TypeRequested, id, "agent/odd", map[string]any{"args": map[string]any{"x": 1}})
	if err != nil {
		t.Fatal(err)
	}
	hdr, body, err := events.Encode(&e)
	if err != nil {
		t.Fatal(err)
	}
	js, _ := jetstream.New(nc)
	if _, err := js.PublishMsg(ctxFor(t), &nats.Msg{Subject: events.RequestPrefix + "odd", Header: nats.Header(hdr), Data: body}); err != nil {
		t.Fatal(err)
	}
	return id
}

func run(t *testing.T, h *history, src string, cfg replay.Config) *replay.Report {
	t.Helper()
	rep, err := replay.Run(ctxFor(t), h.js, events.StreamName, mustPolicy(t, src, "replayed.yaml"), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

// TestReplay records a varied history with a real broker, then replays
// policies over it.
func TestReplay(t *testing.T) {
	h := recordHistory(t)

	// The key property: the policy that decided replays to the very same
	// outcomes, with the same rules, grants and limits.
	t.Run("same policy, no change", func(t *testing.T) {
		rep := run(t, h, livePolicy, replay.Config{})
		if rep.Changed != 0 || rep.Open != 0 || rep.Requests != h.requests || rep.Unchanged != h.requests {
			var b strings.Builder
			rep.WriteText(&b)
			t.Fatalf("%d requests made; replay: %d decided, %d unchanged, %d changed, %d open\n%s", h.requests, rep.Requests, rep.Unchanged, rep.Changed, rep.Open, b.String())
		}
	})

	t.Run("changed policy", func(t *testing.T) {
		rep := run(t, h, candidatePolicy, replay.Config{})
		want := map[replay.Kind]int{
			replay.AskWhatWasAllowed:       1, // list_dir: lists gone
			replay.DenyWhatWasAllowed:      1, // /secret read
			replay.AllowWhatWasDenied:      2, // drop_index; the remembered denial of writes
			replay.AskWhatWasDenied:        2, // drop_view; reboot now waits for dave
			replay.AllowWhatPeopleApproved: 2, // pay30 under the raised limit; write w2
			replay.DenyWhatPeopleApproved:  1, // pay500
			replay.DenyWhatPeopleDenied:    1, // pay700
			replay.AllowWhatPeopleDenied:   1, // write w3
			replay.AllowWhatWentUnanswered: 1, // write w4, cancelled
			replay.DenyWhatWentUnanswered:  1, // deploy, expired
			replay.OtherRule:               1, // write w2 again: writes, not the remembered choice
		}
		var b strings.Builder
		rep.WriteText(&b)
		if !maps.Equal(rep.Kinds, want) || rep.Changed != 14 || rep.Requests != h.requests {
			t.Fatalf("kinds %v, want %v\n%s", rep.Kinds, want, b.String())
		}
		t.Log("\n" + b.String())
		byRule := map[string]map[replay.Kind]int{}
		for _, rc := range rep.Rules {
			byRule[rc.Rule] = rc.Kinds
		}
		wantRules := map[string]map[replay.Kind]int{
			"mode:manual":     {replay.AskWhatWasAllowed: 1, replay.AskWhatWasDenied: 1},
			"no-secret-reads": {replay.DenyWhatWasAllowed: 1},
			"drop-index-ok":   {replay.AllowWhatWasDenied: 1},
			"small-pay":       {replay.AllowWhatPeopleApproved: 1},
			"no-big-pay":      {replay.DenyWhatPeopleApproved: 1, replay.DenyWhatPeopleDenied: 1},
			"writes":          {replay.AllowWhatPeopleApproved: 1, replay.AllowWhatPeopleDenied: 1, replay.AllowWhatWasDenied: 1, replay.AllowWhatWentUnanswered: 1, replay.OtherRule: 1},
			"night-ops":       {replay.AskWhatWasDenied: 1},
			"no-deploys":      {replay.DenyWhatWentUnanswered: 1},
		}
		if len(byRule) != len(wantRules) {
			t.Errorf("rules %v, want %v", byRule, wantRules)
		}
		for rule, kinds := range wantRules {
			if !maps.Equal(byRule[rule], kinds) {
				t.Errorf("rule %s: %v, want %v", rule, byRule[rule], kinds)
			}
		}
		found := map[string]replay.Change{}
		for _, c := range rep.Changes {
			found[c.ID] = c
		}
		if c := found[h.ids["pay500"]]; c.Kind != replay.DenyWhatPeopleApproved || c.Tool != "pay" || c.Agent != "payer" ||
			c.Recorded.Outcome != events.Approved || c.Recorded.Rule != "big-pay" || len(c.Recorded.DecidedBy) != 1 || c.Recorded.DecidedBy[0] != "alice" ||
			c.Replayed.Action != policy.Deny || c.Replayed.Rule != "no-big-pay" {
			t.Errorf("pay500: %+v", c)
		}
		if c := found[h.ids["pay30"]]; c.Recorded.Rule != "limit:pay-per-session" || c.Recorded.ApprovalRule != "mode:manual" || c.Replayed.Rule != "small-pay" {
			t.Errorf("pay30: %+v", c)
		}
		if c := found[h.ids["write w5"]]; !strings.HasPrefix(c.Recorded.Rule, "remembered:") || c.Replayed.Rule != "writes" {
			t.Errorf("write w5: %+v", c)
		}
		if !strings.Contains(b.String(), "approved by alice (big-pay)") || !strings.Contains(b.String(), "deny by no-big-pay") {
			t.Errorf("the text report does not describe pay500:\n%s", b.String())
		}
	})

	// The remembered denial that decided write w5 was made before the
	// window: the replay still holds it.
	t.Run("window", func(t *testing.T) {
		rep := run(t, h, livePolicy, replay.Config{Since: h.marked})
		if rep.Changed != 0 || rep.Requests != 6 || rep.Replayed != h.requests {
			var b strings.Builder
			rep.WriteText(&b)
			t.Fatalf("since the mark: %d decided, %d changed, %d replayed\n%s", rep.Requests, rep.Changed, rep.Replayed, b.String())
		}
		rep = run(t, h, candidatePolicy, replay.Config{Since: h.marked, List: 2})
		if rep.Changed != 4 || rep.Listed != 2 || len(rep.Changes) != 2 {
			t.Fatalf("candidate since the mark: %d changed, %d listed", rep.Changed, rep.Listed)
		}
		rep = run(t, h, livePolicy, replay.Config{Until: h.marked})
		if rep.Changed != 0 || rep.Requests != h.requests-6 {
			t.Fatalf("until the mark: %d decided, %d changed", rep.Requests, rep.Changed)
		}
	})

	t.Run("cli", func(t *testing.T) { testCLI(t, h) })
}

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}
