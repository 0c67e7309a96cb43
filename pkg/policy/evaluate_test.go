package policy_test

import (
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/assent-dev/assent/pkg/events"
	"github.com/assent-dev/assent/pkg/policy"
)

var t0 = time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)

// input builds an Input from requested data written as JSON.
func input(t testing.TB, data string) policy.Input {
	t.Helper()
	var req events.Requested
	if err := json.Unmarshal([]byte(data), &req); err != nil {
		t.Fatalf("request %s: %v", data, err)
	}
	in, err := policy.InputFrom(req)
	if err != nil {
		t.Fatalf("InputFrom: %v", err)
	}
	return in
}

func grant(id string, v events.Verdict, tool, scope, value string) policy.Grant {
	return policy.Grant{
		ID: id, Verdict: v, Tool: tool, Scope: scope, ScopeValue: value,
		CreatedBy: "alice", CreatedAt: t0.Add(-time.Minute), ExpiresAt: t0.Add(30 * time.Minute),
	}
}

const precedencePolicy = `version: 1
mode: auto-approve
principals:
  alice: {roles: [finance]}
  bob: {roles: [finance]}
rules:
  - name: allow-reads
    tools: ["read_*"]
    action: allow
  - name: deny-secrets
    tools: ["read_*", "write_*"]
    when: 'args.path.startsWith("/secret")'
    action: deny
    reason: secrets are off limits
  - name: approve-writes
    tools: ["write_*"]
    action: require_approval
    approvers: [alice]
  - name: approve-writes-again
    tools: ["write_*"]
    action: require_approval
    approvers: [bob]
  - name: prod-agents
    agents: ["prod-*"]
    labels: {env: "prod*", team: pay}
    action: deny
  - name: no-remember
    tools: [pay]
    action: require_approval
    rememberable: false
  - name: session-only
    tools: [transfer]
    action: require_approval
    remember_scopes: [session]
    max_remember: 1h
  - name: allow-fail
    tools: [fail_allow]
    when: 'args.missing == 1'
    action: allow
  - name: deny-fail
    tools: [fail_deny]
    when: 'args.missing == 1'
    action: deny
  - name: require-fail
    tools: [fail_require]
    when: 'args.missing == 1'
    action: require_approval
  - name: not-bool
    tools: [not_bool]
    when: 'args.x'
    action: deny
`

func TestEvaluatePrecedence(t *testing.T) {
	p := mustParse(t, precedencePolicy)
	sess := func(id string, v events.Verdict, tool string) policy.Grant {
		return grant(id, v, tool, events.ScopeSession, "s-1")
	}
	tests := []struct {
		name     string
		req      string
		grants   policy.GrantSet
		action   policy.Action
		rule     string
		auto     bool
		approver string // first approver, for RequireApproval
		errs     int
	}{
		{"allow rule", `{"tool":"read_file","args":{"path":"/tmp/x"}}`, nil, policy.Allow, "allow-reads", true, "", 0},
		{"deny beats allow", `{"tool":"read_file","args":{"path":"/secret/x"}}`, nil, policy.Deny, "deny-secrets", true, "", 0},
		{"deny beats allow grant", `{"tool":"read_file","session":"s-1","args":{"path":"/secret/x"}}`, policy.GrantSet{sess("g1", events.Approve, "read_file")}, policy.Deny, "deny-secrets", true, "", 0},
		{"allow beats remembered denial", `{"tool":"read_file","session":"s-1","args":{"path":"/tmp"}}`, policy.GrantSet{sess("g1", events.Deny, "read_file")}, policy.Allow, "allow-reads", true, "", 0},
		{"remembered beats require", `{"tool":"write_file","session":"s-1","args":{"path":"/tmp"}}`, policy.GrantSet{sess("g1", events.Approve, "write_file")}, policy.Allow, "remembered:g1", true, "", 0},
		{"remembered denial beats require", `{"tool":"write_file","session":"s-1","args":{"path":"/tmp"}}`, policy.GrantSet{sess("g1", events.Deny, "write_file")}, policy.Deny, "remembered:g1", true, "", 0},
		{"remembered denial beats approval", `{"tool":"write_file","session":"s-1","args":{"path":"/tmp"}}`, policy.GrantSet{sess("a", events.Approve, "write_file"), sess("z", events.Deny, "write_file")}, policy.Deny, "remembered:z", true, "", 0},
		{"require first in order", `{"tool":"write_file","args":{"path":"/tmp"}}`, nil, policy.RequireApproval, "approve-writes", false, "alice", 0},
		{"require beats mode", `{"tool":"write_file","session":"s-2","args":{"path":"/tmp"}}`, policy.GrantSet{sess("g1", events.Approve, "write_file")}, policy.RequireApproval, "approve-writes", false, "alice", 0},
		{"mode last", `{"tool":"other"}`, nil, policy.Allow, "mode:auto-approve", true, "", 0},
		{"remembered beats mode", `{"tool":"other","session":"s-1"}`, policy.GrantSet{sess("g1", events.Deny, "other")}, policy.Deny, "remembered:g1", true, "", 0},
		{"grant other tool", `{"tool":"write_file","session":"s-1","args":{"path":"/tmp"}}`, policy.GrantSet{sess("g1", events.Approve, "write_files")}, policy.RequireApproval, "approve-writes", false, "alice", 0},
		{"expired grant ignored", `{"tool":"write_file","session":"s-1","args":{"path":"/tmp"}}`, policy.GrantSet{func() policy.Grant {
			g := sess("g1", events.Approve, "write_file")
			g.ExpiresAt = t0
			return g
		}()}, policy.RequireApproval, "approve-writes", false, "alice", 0},
		{"rememberable false ignores grants", `{"tool":"pay","session":"s-1"}`, policy.GrantSet{sess("g1", events.Approve, "pay")}, policy.RequireApproval, "no-remember", false, "", 0},
		{"rememberable false ignores denials", `{"tool":"pay","session":"s-1"}`, policy.GrantSet{sess("g1", events.Deny, "pay")}, policy.RequireApproval, "no-remember", false, "", 0},
		{"scope not allowed by rule", `{"tool":"transfer","session":"s-1","agent":"a1"}`, policy.GrantSet{grant("g1", events.Approve, "transfer", events.ScopeAgent, "a1")}, policy.RequireApproval, "session-only", false, "", 0},
		{"scope allowed by rule", `{"tool":"transfer","session":"s-1","agent":"a1"}`, policy.GrantSet{sess("g1", events.Approve, "transfer")}, policy.Allow, "remembered:g1", true, "", 0},
		{"grant longer than rule allows", `{"tool":"transfer","session":"s-1"}`, policy.GrantSet{func() policy.Grant {
			g := sess("g1", events.Approve, "transfer")
			g.CreatedAt = t0.Add(-2 * time.Hour)
			return g
		}()}, policy.RequireApproval, "session-only", false, "", 0},
		{"labels and agent glob", `{"tool":"x","agent":"prod-7","labels":{"env":"production","team":"pay"}}`, nil, policy.Deny, "prod-agents", true, "", 0},
		{"label missing", `{"tool":"x","agent":"prod-7","labels":{"env":"production"}}`, nil, policy.Allow, "mode:auto-approve", true, "", 0},
		{"label value mismatch", `{"tool":"x","agent":"prod-7","labels":{"env":"staging","team":"pay"}}`, nil, policy.Allow, "mode:auto-approve", true, "", 0},
		{"agent mismatch", `{"tool":"x","agent":"dev-7","labels":{"env":"prod","team":"pay"}}`, nil, policy.Allow, "mode:auto-approve", true, "", 0},
		{"cel error allow no match", `{"tool":"fail_allow"}`, nil, policy.Allow, "mode:auto-approve", true, "", 1},
		{"cel error deny matches", `{"tool":"fail_deny"}`, nil, policy.Deny, "deny-fail", true, "", 1},
		{"cel error require matches", `{"tool":"fail_require"}`, nil, policy.RequireApproval, "require-fail", false, "", 1},
		{"cel non-bool is error", `{"tool":"not_bool","args":{"x":"yes"}}`, nil, policy.Deny, "not-bool", true, "", 1},
		{"cel true bool", `{"tool":"not_bool","args":{"x":false}}`, nil, policy.Allow, "mode:auto-approve", true, "", 0},
		{"cel error in deny for read", `{"tool":"read_file","args":{}}`, nil, policy.Deny, "deny-secrets", true, "", 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			in := input(t, tc.req)
			var rem policy.Remembered
			if tc.grants != nil {
				rem = tc.grants
			}
			for _, res := range []policy.Result{p.Evaluate(in, t0, rem), p.Trace(in, t0, rem)} {
				if res.Action != tc.action || res.Rule != tc.rule || res.Auto != tc.auto {
					t.Errorf("got %s by %s (auto %v), want %s by %s (auto %v)\n%s", res.Action, res.Rule, res.Auto, tc.action, tc.rule, tc.auto, policy.Explain(res))
				}
				if len(res.Errors) != tc.errs {
					t.Errorf("errors %v, want %d", res.Errors, tc.errs)
				}
				for _, err := range res.Errors {
					if !errors.Is(err, policy.ErrCondition) {
						t.Errorf("error %v does not match ErrCondition", err)
					}
				}
				if strings.HasPrefix(tc.rule, "remembered:") != (res.Grant != nil) {
					t.Errorf("grant %+v for rule %s", res.Grant, res.Rule)
				}
				if tc.action == policy.RequireApproval {
					if res.Approval == nil {
						t.Fatal("no approval")
					}
					if tc.approver != "" && res.Approval.Approvers[0] != tc.approver {
						t.Errorf("approvers %v, want %s first", res.Approval.Approvers, tc.approver)
					}
				} else if res.Approval != nil {
					t.Errorf("approval %+v on %s", res.Approval, res.Action)
				}
			}
		})
	}
}

func TestEvaluateModes(t *testing.T) {
	for _, tc := range []struct {
		mode   string
		action policy.Action
		auto   bool
	}{
		{"manual", policy.RequireApproval, false},
		{"auto-approve", policy.Allow, true},
		{"auto-deny", policy.Deny, true},
	} {
		p := mustParse(t, "version: 1\nmode: "+tc.mode+"\n")
		res := p.Evaluate(input(t, `{"tool":"x"}`), t0, nil)
		if res.Action != tc.action || res.Auto != tc.auto || res.Rule != "mode:"+tc.mode || res.Reason == "" {
			t.Errorf("mode %s: %+v", tc.mode, res)
		}
	}
}

func TestEvaluateRequestTimeout(t *testing.T) {
	p := mustParse(t, `version: 1
rules:
  - {name: deny-on-timeout, tools: [a], action: require_approval, timeout: 10m}
  - {name: approve-on-timeout, tools: [b], action: require_approval, timeout: 10m, on_timeout: approve}
`)
	for _, tc := range []struct {
		req  string
		want time.Duration
	}{
		{`{"tool":"a"}`, 10 * time.Minute},
		{`{"tool":"a","timeout":"2m"}`, 2 * time.Minute},
		{`{"tool":"a","timeout":"1h"}`, 10 * time.Minute},
		{`{"tool":"b","timeout":"2m"}`, 10 * time.Minute},
		{`{"tool":"c","timeout":"2m"}`, 2 * time.Minute},
		{`{"tool":"c","timeout":"1h"}`, 5 * time.Minute},
	} {
		res := p.Evaluate(input(t, tc.req), t0, nil)
		if res.Approval.Timeout != tc.want {
			t.Errorf("%s: timeout %s, want %s", tc.req, res.Approval.Timeout, tc.want)
		}
	}
	if p.Rules[0].Approval.Timeout != 10*time.Minute {
		t.Error("Evaluate changed the rule's approval")
	}
}

func TestEvaluateCEL(t *testing.T) {
	tests := []struct {
		when  string
		req   string
		match bool
		errs  int
	}{
		{`args.amount > 1000`, `{"tool":"t","args":{"amount":1500}}`, true, 0},
		{`args.amount > 1000`, `{"tool":"t","args":{"amount":1000.5}}`, true, 0},
		{`args.amount > 1000`, `{"tool":"t","args":{"amount":999}}`, false, 0},
		{`double(args.amount) > 1000.0`, `{"tool":"t","args":{"amount":1001}}`, true, 0},
		{`args.amount == 12345678901234567`, `{"tool":"t","args":{"amount":12345678901234567}}`, true, 0},
		{`args.n > 1.0e300`, `{"tool":"t","args":{"n":1e400}}`, true, 0},
		{`args.amount > 1000`, `{"tool":"t","args":{"amount":"lots"}}`, false, 1},
		{`args.amount > 1000`, `{"tool":"t","args":{}}`, false, 1},
		{`has(args.amount) && args.amount > 1000`, `{"tool":"t","args":{}}`, false, 0},
		{`args.?amount.orValue(0) > 1000`, `{"tool":"t"}`, false, 0},
		{`args.path.startsWith("/tmp/")`, `{"tool":"t","args":{"path":"/tmp/a"}}`, true, 0},
		{`args.tags.exists(t, t == "x")`, `{"tool":"t","args":{"tags":["a","x"]}}`, true, 0},
		{`args.nested.deep.ok`, `{"tool":"t","args":{"nested":{"deep":{"ok":true}}}}`, true, 0},
		{`args.v == null`, `{"tool":"t","args":{"v":null}}`, true, 0},
		{`tool == "t" && agent == "a" && session == "s" && user == "u" && labels.env == "prod"`, `{"tool":"t","agent":"a","session":"s","user":"u","labels":{"env":"prod"}}`, true, 0},
		{`labels.env == "prod"`, `{"tool":"t"}`, false, 1},
		{`"env" in labels`, `{"tool":"t"}`, false, 0},
		{`args.p.matches("^/srv/[a-z]+$")`, `{"tool":"t","args":{"p":"/srv/abc"}}`, true, 0},
		{`args.p.lowerAscii() == "abc"`, `{"tool":"t","args":{"p":"ABC"}}`, true, 0},
		{`size(args.l) > 2`, `{"tool":"t","args":{"l":[1,2,3]}}`, true, 0},
		{`1 / args.zero == 1`, `{"tool":"t","args":{"zero":0}}`, false, 1},
		// The examples of docs/policy.md.
		{`labels.?env.orValue("") == "prod"`, `{"tool":"t"}`, false, 0},
		{`labels.?env.orValue("") == "prod"`, `{"tool":"t","labels":{"env":"prod"}}`, true, 0},
		{`"env" in labels && labels.env == "prod"`, `{"tool":"t"}`, false, 0},
		{`args.recipients.exists(r, !r.endsWith("@example.com"))`, `{"tool":"t","args":{"recipients":["a@example.com","b@evil.test"]}}`, true, 0},
		{`tool in ["rm", "rmdir"] && args.path.matches("^/srv/[a-z]+/?$")`, `{"tool":"rm","args":{"path":"/srv/data/"}}`, true, 0},
		{`labels.env == "prod" && user != "oncall-bot"`, `{"tool":"t","user":"carol","labels":{"env":"prod"}}`, true, 0},
		{`double(args.amount) * 1.2 > 1200.0`, `{"tool":"t","args":{"amount":1001}}`, true, 0},
		{`args.amount * 1.2 > 1200.0`, `{"tool":"t","args":{"amount":1001}}`, false, 1},
		{`args.statement.upperAscii().contains("DROP ")`, `{"tool":"t","args":{"statement":"drop table x"}}`, true, 0},
		// The cost limit stops runaway comprehensions; the error fails closed.
		{`args.l.all(a, args.l.all(b, args.l.all(c, true)))`, `{"tool":"t","args":{"l":[` + strings.Repeat("0,", 200) + `0]}}`, false, 1},
	}
	for _, tc := range tests {
		t.Run(tc.when, func(t *testing.T) {
			src := "version: 1\nmode: auto-deny\nrules:\n  - name: r\n    action: allow\n    when: '" + strings.ReplaceAll(tc.when, "'", "''") + "'\n"
			p := mustParse(t, src)
			res := p.Evaluate(input(t, tc.req), t0, nil)
			if got := res.Action == policy.Allow; got != tc.match {
				t.Errorf("match = %v, want %v (errors %v)", got, tc.match, res.Errors)
			}
			if len(res.Errors) != tc.errs {
				t.Errorf("errors = %v, want %d", res.Errors, tc.errs)
			}
		})
	}
}

func TestEvaluateGlobs(t *testing.T) {
	p := mustParse(t, `version: 1
mode: auto-deny
rules:
  - {name: lit, tools: [exact], action: allow}
  - {name: prefix, tools: ["list_*"], action: allow}
  - {name: star, tools: ["*"], agents: ["bot-?"], action: allow}
  - {name: class, tools: ["[xy]_tool", "q*z"], action: allow}
`)
	for _, tc := range []struct {
		req  string
		rule string
	}{
		{`{"tool":"exact"}`, "lit"},
		{`{"tool":"exactly"}`, "mode:auto-deny"},
		{`{"tool":"list_files"}`, "prefix"},
		{`{"tool":"list_"}`, "prefix"},
		{`{"tool":"list_a/b"}`, "mode:auto-deny"},
		{`{"tool":"anything","agent":"bot-1"}`, "star"},
		{`{"tool":"any/thing","agent":"bot-1"}`, "mode:auto-deny"},
		{`{"tool":"anything","agent":"bot-12"}`, "mode:auto-deny"},
		{`{"tool":"x_tool"}`, "class"},
		{`{"tool":"qabcz"}`, "class"},
		{`{"tool":"z_tool"}`, "mode:auto-deny"},
	} {
		if res := p.Evaluate(input(t, tc.req), t0, nil); res.Rule != tc.rule {
			t.Errorf("%s: rule %s, want %s", tc.req, res.Rule, tc.rule)
		}
	}
}

// TestRuleSelects: Selects matches tools, agents and labels as Evaluate
// does, whatever the rule's condition says.
func TestRuleSelects(t *testing.T) {
	p := mustParse(t, `version: 1
rules:
  - {name: r, tools: ["list_*"], agents: ["bot-?"], labels: {env: "prod*"}, when: 'false', action: deny}
`)
	r := p.Rules[0]
	for _, tc := range []struct {
		req  string
		want bool
	}{
		{`{"tool":"list_files","agent":"bot-1","labels":{"env":"production"}}`, true},
		{`{"tool":"read_file","agent":"bot-1","labels":{"env":"production"}}`, false},
		{`{"tool":"list_files","agent":"bot-12","labels":{"env":"production"}}`, false},
		{`{"tool":"list_files","agent":"bot-1","labels":{"env":"staging"}}`, false},
		{`{"tool":"list_files","agent":"bot-1"}`, false},
	} {
		if got := r.Selects(input(t, tc.req)); got != tc.want {
			t.Errorf("%s: Selects %v, want %v", tc.req, got, tc.want)
		}
	}
}

func TestTraceExplains(t *testing.T) {
	p := mustParse(t, precedencePolicy)
	in := input(t, `{"tool":"write_file","session":"s-1","args":{"path":"/tmp"}}`)
	res := p.Trace(in, t0, policy.GrantSet{grant("g1", events.Approve, "write_file", events.ScopeSession, "s-1")})
	out := policy.Explain(res)
	for _, want := range []string{
		"decision: allow (automatic)",
		"rule: remembered:g1",
		"rules[0] allow-reads (allow): no match: tool \"write_file\" is not one of [read_*]",
		"rules[1] deny-secrets (deny): no match: condition args.path.startsWith(\"/secret\") is false",
		"rules[2] approve-writes (require_approval): MATCH",
		"grant g1 (approve, session scope, by alice): matches",
		"decision: allow by remembered:g1",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("Explain lacks %q:\n%s", want, out)
		}
	}
	if ev := p.Evaluate(in, t0, nil); ev.Trace != nil {
		t.Errorf("Evaluate filled Trace: %v", ev.Trace)
	}

	res = p.Trace(input(t, `{"tool":"write_x","args":{"path":"/a"}}`), t0, nil)
	out = policy.Explain(res)
	for _, want := range []string{"decision: require_approval\n", "approvers: alice, quorum 1", "timeout: 5m0s, then deny", "self-approval: not allowed", "remember: allowed"} {
		if !strings.Contains(out, want) {
			t.Errorf("Explain lacks %q:\n%s", want, out)
		}
	}
	res = p.Trace(input(t, `{"tool":"fail_deny"}`), t0, nil)
	if out = policy.Explain(res); !strings.Contains(out, "counts as a match (fail closed)") || !strings.Contains(out, "errors (applied fail-closed):") {
		t.Errorf("Explain of a failed condition:\n%s", out)
	}
	res = p.Trace(input(t, `{"tool":"pay","session":"s-1"}`), t0, policy.GrantSet{})
	if out = policy.Explain(res); !strings.Contains(out, "not consulted, no-remember is not rememberable") {
		t.Errorf("Explain of a rememberable:false rule:\n%s", out)
	}
}

func TestDiff(t *testing.T) {
	live := mustParse(t, "version: 1\nprincipals: {alice: {}, bob: {}}\nrules:\n  - {name: r, tools: [a], action: require_approval, approvers: [alice]}\n")
	shadow := mustParse(t, "version: 1\nprincipals: {alice: {}, bob: {}}\nrules:\n  - {name: r, tools: [a], action: require_approval, approvers: [alice, bob], quorum: 2}\n  - {name: reads, tools: [read], action: allow}\n")
	for _, tc := range []struct {
		req    string
		differ bool
		want   string
	}{
		{`{"tool":"a"}`, true, "approvers [alice] vs [alice bob]; quorum 1 vs 2"},
		{`{"tool":"read"}`, true, "action require_approval vs allow; rule mode:manual vs reads"},
		{`{"tool":"other"}`, false, ""},
	} {
		in := input(t, tc.req)
		differ, summary := policy.Diff(live.Evaluate(in, t0, nil), shadow.Evaluate(in, t0, nil))
		if differ != tc.differ || summary != tc.want {
			t.Errorf("%s: Diff = %v, %q; want %v, %q", tc.req, differ, summary, tc.differ, tc.want)
		}
	}
}

func TestInputFrom(t *testing.T) {
	in := input(t, `{"tool":"t","args":{"i":42,"big":12345678901234567890,"f":1.5,"e":1e3,"s":"x","n":null,"b":true,"l":[1,2.5,{"k":3}]},"timeout":"90s","labels":{"env":"prod"}}`)
	want := map[string]any{"i": int64(42), "big": 12345678901234567890.0, "f": 1.5, "e": 1000.0, "s": "x", "n": nil, "b": true}
	for k, v := range want {
		if in.Args[k] != v {
			t.Errorf("args[%s] = %#v, want %#v", k, in.Args[k], v)
		}
	}
	l := in.Args["l"].([]any)
	if l[0] != int64(1) || l[1] != 2.5 || l[2].(map[string]any)["k"] != int64(3) {
		t.Errorf("args.l = %#v", l)
	}
	if in.Timeout != 90*time.Second || in.Labels["env"] != "prod" || !strings.HasPrefix(in.ArgsDigest, "sha256:") {
		t.Errorf("input %+v", in)
	}
	empty := input(t, `{"tool":"t"}`)
	if empty.Args == nil || len(empty.Args) != 0 {
		t.Errorf("empty args = %#v", empty.Args)
	}
	for _, args := range []string{`[1]`, `"x"`, `{"a":`} {
		if _, err := policy.InputFrom(events.Requested{Tool: "t", Args: json.RawMessage(args)}); !errors.Is(err, policy.ErrInput) {
			t.Errorf("args %s: err %v, want ErrInput", args, err)
		}
	}
}

// TestInputWithDigest: an Input from InputWithDigest, whose args are decoded
// only when read, is evaluated as one from InputFrom: by conditions, limit
// sums and remembered choices with args patterns.
func TestInputWithDigest(t *testing.T) {
	p := mustParse(t, readExample(t, "reimbursements.yaml"))
	withPattern := grant("g-pattern", events.Approve, "reimburse", events.ScopeSession, "s")
	withPattern.ArgsPattern = json.RawMessage(`{"currency":"E*"}`)
	grants := policy.GrantSet{withPattern}
	for _, data := range []string{
		`{"tool":"reimburse","session":"s","args":{"amount":10}}`,
		`{"tool":"reimburse","session":"s","args":{"amount":5000,"currency":"EUR"}}`,
		`{"tool":"reimburse","session":"s","args":{"amount":5000,"currency":"USD"}}`,
		`{"tool":"reimburse","session":"s","args":{"amount":"x"}}`,
		`{"tool":"reimburse","session":"s"}`,
		`{"tool":"other","args":{"amount":10}}`,
	} {
		var req events.Requested
		if err := json.Unmarshal([]byte(data), &req); err != nil {
			t.Fatal(err)
		}
		want, err := policy.InputFrom(req)
		if err != nil {
			t.Fatal(err)
		}
		got := policy.InputWithDigest(req, want.ArgsDigest)
		if got.ArgsDigest != want.ArgsDigest || got.Tool != want.Tool || got.Session != want.Session || got.Args != nil {
			t.Errorf("%s: InputWithDigest = %+v, InputFrom = %+v", data, got, want)
		}
		rw, rg := p.Evaluate(want, t0, grants), p.Evaluate(got, t0, grants)
		if rw.Action != rg.Action || rw.Rule != rg.Rule || len(rw.Errors) != len(rg.Errors) || len(rw.Limits) != len(rg.Limits) {
			t.Errorf("%s: evaluated as %s by %s (%v), want %s by %s (%v)", data, rg.Action, rg.Rule, rg.Errors, rw.Action, rw.Rule, rw.Errors)
		}
		if mw, mg := withPattern.Matches(want, t0), withPattern.Matches(got, t0); mw != mg {
			t.Errorf("%s: args pattern matches: %v, want %v", data, mg, mw)
		}
		for i, l := range rw.Limits {
			aw, errW := l.Amount(want)
			ag, errG := rg.Limits[i].Amount(got)
			if aw != ag || (errW == nil) != (errG == nil) {
				t.Errorf("%s: limit %s amount %v (%v), want %v (%v)", data, l.Name, ag, errG, aw, errW)
			}
		}
	}

	// Args that do not decode, under a digest that says they would: the
	// conditions that read them fail, fail-closed, and patterns do not match.
	bad := policy.InputWithDigest(events.Requested{Tool: "reimburse", Session: "s", Args: json.RawMessage(`[1]`)}, "sha256:00")
	res := p.Evaluate(bad, t0, grants)
	if res.Action != policy.RequireApproval || len(res.Errors) == 0 {
		t.Errorf("bad args: %s by %s (%v)", res.Action, res.Rule, res.Errors)
	}
	if withPattern.Matches(bad, t0) {
		t.Error("bad args match an args pattern")
	}
}

func TestEvaluateConcurrent(t *testing.T) {
	p := mustParse(t, readExample(t, "reimbursements.yaml"))
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			in := input(t, `{"tool":"reimburse","session":"s","args":{"amount":`+[]string{"10", "5000"}[i%2]+`}}`)
			for range 200 {
				res := p.Evaluate(in, t0, nil)
				if want := []policy.Action{policy.Allow, policy.RequireApproval}[i%2]; res.Action != want {
					t.Errorf("action %s, want %s", res.Action, want)
					return
				}
			}
		}()
	}
	wg.Wait()
}
