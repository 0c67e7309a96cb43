package policy_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/assent-dev/assent/pkg/events"
	"github.com/assent-dev/assent/pkg/policy"
)

// principalsYAML is a principals section the parse cases can refer to.
const principalsYAML = `
principals:
  alice: {roles: [finance, sre], slack: U024BE7LH, email: alice@example.com}
  bob:   {roles: [finance]}
  carol: {roles: [cfo]}
`

func mustParse(t testing.TB, src string) *policy.Policy {
	t.Helper()
	p, err := policy.Parse([]byte(src), "test.yaml")
	if err != nil {
		t.Fatalf("Parse: %v\n%s", err, src)
	}
	return p
}

func TestParseErrors(t *testing.T) {
	rule := func(body string) string {
		return "version: 1\n" + principalsYAML + "rules:\n  - name: r1\n" + body
	}
	limit := func(body string) string {
		return "version: 1\nlimits:\n  - name: l1\n" + body
	}
	tests := []struct {
		name    string
		src     string
		wantErr error  // nil: valid
		want    string // substring of the message, with file:line
	}{
		{"minimal", "version: 1\n", nil, ""},
		{"empty file", "", policy.ErrMissingField, "test.yaml:1: empty policy"},
		{"only comments", "# nothing\n", policy.ErrMissingField, "empty policy"},
		{"yaml syntax", "version: 1\nmode: [manual\n", policy.ErrSyntax, "test.yaml:"},
		{"bad indentation", "version: 1\n rules:\n- x\n", policy.ErrSyntax, ""},
		{"two documents", "version: 1\n---\nversion: 1\n", policy.ErrSyntax, "more than one YAML document"},
		{"top level list", "- version: 1\n", policy.ErrBadType, "must be a mapping"},
		{"top level scalar", "hello\n", policy.ErrBadType, "must be a mapping"},
		{"missing version", "mode: manual\n", policy.ErrMissingField, "version: missing"},
		{"version 2", "version: 2\n", policy.ErrVersion, "test.yaml:1: version 2: only version 1"},
		{"version string", "version: one\n", policy.ErrBadType, "version \"one\": must be a whole number"},
		{"unknown top field", "version: 1\nrulez: []\n", policy.ErrUnknownField, "test.yaml:2: unknown field \"rulez\""},
		{"duplicate top field", "version: 1\nmode: manual\nmode: auto-deny\n", policy.ErrDuplicate, "test.yaml:3: mode: field given twice"},
		{"mode auto-approve", "version: 1\nmode: auto-approve\n", nil, ""},
		{"mode auto-deny", "version: 1\nmode: auto-deny\n", nil, ""},
		{"bad mode", "version: 1\nmode: yolo\n", policy.ErrBadValue, "mode \"yolo\""},
		{"mode list", "version: 1\nmode: [manual]\n", policy.ErrBadType, "mode: must be a string"},

		// defaults
		{"defaults all", "version: 1\ndefaults: {timeout: 1m, on_timeout: approve, on_no_approver: wait, allow_self_approval: true, rememberable: false, max_remember: 1h}\n", nil, ""},
		{"defaults unknown", "version: 1\ndefaults:\n  timout: 5m\n", policy.ErrUnknownField, "test.yaml:3: defaults: unknown field \"timout\""},
		{"defaults bad duration", "version: 1\ndefaults:\n  timeout: 5 minutes\n", policy.ErrBadDuration, "defaults: timeout \"5 minutes\""},
		{"defaults number duration", "version: 1\ndefaults:\n  timeout: 300\n", policy.ErrBadDuration, "timeout \"300\""},
		{"defaults zero timeout", "version: 1\ndefaults:\n  timeout: 0s\n", policy.ErrBadDuration, "must be positive"},
		{"defaults negative", "version: 1\ndefaults:\n  max_remember: -1h\n", policy.ErrBadDuration, "must be positive"},
		{"defaults on_timeout", "version: 1\ndefaults:\n  on_timeout: maybe\n", policy.ErrBadValue, "on_timeout \"maybe\""},
		{"defaults on_no_approver", "version: 1\ndefaults:\n  on_no_approver: approve\n", policy.ErrBadValue, "on_no_approver \"approve\""},
		{"defaults bool", "version: 1\ndefaults:\n  rememberable: yes\n", policy.ErrBadType, "rememberable \"yes\": must be true or false"},
		{"defaults not mapping", "version: 1\ndefaults: 5m\n", policy.ErrBadType, "defaults: must be a mapping"},

		// principals
		{"principal bad name", "version: 1\nprincipals:\n  al.ice: {}\n", policy.ErrBadName, "principal \"al.ice\""},
		{"principal any", "version: 1\nprincipals:\n  any: {}\n", policy.ErrBadName, "reserved"},
		{"principal null", "version: 1\nprincipals:\n  alice:\n", nil, ""},
		{"principal unknown field", "version: 1\nprincipals:\n  alice: {role: [x]}\n", policy.ErrUnknownField, "principals.alice: unknown field \"role\""},
		{"principal bad role", "version: 1\nprincipals:\n  alice: {roles: [\"a b\"]}\n", policy.ErrBadName, "roles[0]"},
		{"principal roles scalar", "version: 1\nprincipals:\n  alice: {roles: finance}\n", policy.ErrBadType, "roles: must be a list"},
		{"principal bad email", "version: 1\nprincipals:\n  alice: {email: alice}\n", policy.ErrBadValue, "not an email address"},
		{"principal duplicate slack", "version: 1\nprincipals:\n  alice: {slack: U1}\n  bob: {slack: U1}\n", policy.ErrDuplicate, "already the identity of principal"},
		{"principal identities", "version: 1\nprincipals:\n  alice: {identities: {github: al, teams: x}}\n", nil, ""},
		{"principal identities slack", "version: 1\nprincipals:\n  alice: {identities: {slack: U1}}\n", policy.ErrBadName, "other than slack and email"},
		{"principal duplicate name", "version: 1\nprincipals:\n  alice: {}\n  alice: {}\n", policy.ErrDuplicate, "given twice"},

		// rules
		{"rules not a list", "version: 1\nrules: {name: x}\n", policy.ErrBadType, "rules: must be a list"},
		{"rule not mapping", "version: 1\nrules:\n  - allow\n", policy.ErrBadType, "rules[0]: must be a mapping"},
		{"rule missing name", "version: 1\nrules:\n  - action: allow\n", policy.ErrMissingField, "rules[0]: name: missing"},
		{"rule missing action", "version: 1\nrules:\n  - name: x\n", policy.ErrMissingField, "rules[0] (x): action: missing"},
		{"rule bad name", "version: 1\nrules:\n  - name: a b\n    action: allow\n", policy.ErrBadName, "name \"a b\""},
		{"rule duplicate name", "version: 1\nrules:\n  - name: x\n    action: allow\n  - name: x\n    action: deny\n", policy.ErrDuplicate, "test.yaml:5: rules[1] (x): name \"x\": already used by the rule at line 3"},
		{"rule unknown field", rule("    action: allow\n    tool: [x]\n"), policy.ErrUnknownField, "rules[0] (r1): unknown field \"tool\""},
		{"rule bad action", rule("    action: permit\n"), policy.ErrBadValue, "action \"permit\""},
		{"rule bad tool glob", rule("    action: allow\n    tools: [\"read_[\"]\n"), policy.ErrBadGlob, "tools[0] \"read_[\""},
		{"rule empty tool glob", rule("    action: allow\n    tools: [\"\"]\n"), policy.ErrBadGlob, "tools[0]"},
		{"rule bad agent glob", rule("    action: allow\n    agents: [\"a\\\\\"]\n"), policy.ErrBadGlob, "agents[0]"},
		{"rule tools scalar", rule("    action: allow\n    tools: read_file\n"), policy.ErrBadType, "tools: must be a list"},
		{"rule tools item list", rule("    action: allow\n    tools: [[a]]\n"), policy.ErrBadType, "tools[0]: must be a string"},
		{"rule bad label glob", rule("    action: allow\n    labels: {env: \"[\"}\n"), policy.ErrBadGlob, "labels.env"},
		{"rule labels list", rule("    action: allow\n    labels: [env]\n"), policy.ErrBadType, "must be a mapping"},
		{"rule labels ok", rule("    action: allow\n    labels: {env: \"prod*\", team: pay}\n"), nil, ""},
		{"rule cel syntax", rule("    action: deny\n    when: 'args.x =='\n"), policy.ErrBadCEL, "test.yaml:10: rules[0] (r1): when: line 1 col"},
		{"rule cel undeclared", rule("    action: deny\n    when: 'argz.x == 1'\n"), policy.ErrBadCEL, "undeclared reference to 'argz'"},
		{"rule cel dyn", rule("    action: deny\n    when: 'args.x'\n"), nil, ""}, // dyn: checked at run time
		{"rule cel dyn plus int", rule("    action: deny\n    when: 'args.x + 1'\n"), policy.ErrNotBool, "has type int"},
		{"rule cel string", rule("    action: deny\n    when: 'tool + \"x\"'\n"), policy.ErrNotBool, "has type string, want bool"},
		{"rule cel int", rule("    action: deny\n    when: '1 + 2'\n"), policy.ErrNotBool, "has type int"},
		{"rule cel all vars", rule("    action: deny\n    when: 'tool == \"a\" && agent == \"b\" && session == \"c\" && user == \"d\" && labels.env == \"e\" && args.n > 1'\n"), nil, ""},
		{"rule cel string ext", rule("    action: deny\n    when: 'args.p.lowerAscii().startsWith(\"/\")'\n"), nil, ""},
		{"rule cel optional", rule("    action: deny\n    when: 'args.?n.orValue(0) > 1'\n"), nil, ""},
		{"rule cel matches literal", rule("    action: deny\n    when: 'args.p.matches(\"^/srv/\")'\n"), nil, ""},
		{"rule cel matches dynamic", rule("    action: deny\n    when: 'args.p.matches(args.re)'\n"), policy.ErrBadCEL, "matches: the pattern must be a string literal"},
		{"rule cel replace literal", rule("    action: deny\n    when: 'args.p.replace(\"//\", \"/\") == \"/a\"'\n"), nil, ""},
		{"rule cel replace dynamic", rule("    action: deny\n    when: 'args.p.replace(\"\", args.q) == \"\"'\n"), policy.ErrBadCEL, "replace: the old and new strings"},
		{"rule cel comprehension", rule("    action: deny\n    when: 'args.l.exists(x, x == 1)'\n"), nil, ""},
		{"rule when list", rule("    action: deny\n    when: [a]\n"), policy.ErrBadType, "when: must be a string"},
		{"approvers on allow", rule("    action: allow\n    approvers: [alice]\n"), policy.ErrBadValue, "approvers: only require_approval rules"},
		{"quorum on deny", rule("    action: deny\n    quorum: 2\n"), policy.ErrBadValue, "quorum: only require_approval"},
		{"escalation on allow", rule("    action: allow\n    escalation: []\n"), policy.ErrBadValue, "escalation: only"},
		{"quorum zero", rule("    action: require_approval\n    quorum: 0\n"), policy.ErrQuorum, "test.yaml:10: rules[0] (r1): quorum 0: must be at least 1"},
		{"quorum negative", rule("    action: require_approval\n    quorum: -1\n"), policy.ErrQuorum, "quorum -1"},
		{"quorum string", rule("    action: require_approval\n    quorum: two\n"), policy.ErrBadType, "quorum \"two\""},
		{"quorum float", rule("    action: require_approval\n    quorum: 1.5\n"), policy.ErrBadType, "quorum \"1.5\""},
		{"quorum too big", rule("    action: require_approval\n    approvers: [\"role:finance\"]\n    quorum: 3\n"), policy.ErrQuorum, "quorum 3: only 2 principal(s) can approve (alice, bob)"},
		{"quorum anyone", rule("    action: require_approval\n    quorum: 5\n"), nil, ""},
		{"quorum counts escalation", rule("    action: require_approval\n    approvers: [\"role:finance\"]\n    quorum: 3\n    escalation: [{after: 1m, approvers: [carol]}]\n"), nil, ""},
		{"approver unknown principal", rule("    action: require_approval\n    approvers: [zed]\n"), policy.ErrUnknownApprover, "approvers[0] \"zed\": not a principal"},
		{"approver unknown role", rule("    action: require_approval\n    approvers: [\"role:ops\"]\n"), policy.ErrUnknownApprover, "no principal has role \"ops\""},
		{"approver any", rule("    action: require_approval\n    approvers: [any]\n"), nil, ""},
		{"approver any mixed", rule("    action: require_approval\n    approvers: [any, alice]\n"), policy.ErrBadValue, "any cannot be combined"},
		{"approver duplicate", rule("    action: require_approval\n    approvers: [alice, alice]\n"), policy.ErrDuplicate, "listed twice"},
		{"approvers empty", rule("    action: require_approval\n    approvers: []\n"), policy.ErrBadValue, "approvers: empty"},
		{"approval timeout", rule("    action: require_approval\n    timeout: soon\n"), policy.ErrBadDuration, "timeout \"soon\""},
		{"approval on_timeout", rule("    action: require_approval\n    on_timeout: allow\n"), policy.ErrBadValue, "on_timeout \"allow\""},
		{"approval on_no_approver", rule("    action: require_approval\n    on_no_approver: later\n"), policy.ErrBadValue, "on_no_approver \"later\""},
		{"approval self bool", rule("    action: require_approval\n    allow_self_approval: 1\n"), policy.ErrBadType, "allow_self_approval"},
		{"approval rememberable bool", rule("    action: require_approval\n    rememberable: \"true\"\n"), policy.ErrBadType, "rememberable"},
		{"approval remember scope", rule("    action: require_approval\n    remember_scopes: [forever]\n"), policy.ErrBadValue, "remember_scopes[0] \"forever\""},
		{"approval remember scopes empty", rule("    action: require_approval\n    remember_scopes: []\n"), policy.ErrBadValue, "remember_scopes: empty"},
		{"approval remember scope twice", rule("    action: require_approval\n    remember_scopes: [call, call]\n"), policy.ErrDuplicate, "listed twice"},
		{"approval max_remember", rule("    action: require_approval\n    max_remember: 0s\n"), policy.ErrBadDuration, "max_remember"},
		{"approval all fields", rule("    action: require_approval\n    approvers: [\"role:finance\", alice]\n    quorum: 2\n    timeout: 1h\n    on_timeout: approve\n    on_no_approver: wait\n    allow_self_approval: true\n    rememberable: true\n    remember_scopes: [session]\n    max_remember: 1h\n    escalation:\n      - after: 30m\n        approvers: [\"role:cfo\"]\n        extend: 30m\n      - after: 80m\n        approvers: [any]\n"), nil, ""},
		{"escalation not list", rule("    action: require_approval\n    escalation: {after: 1m}\n"), policy.ErrBadType, "escalation: must be a list"},
		{"escalation missing after", rule("    action: require_approval\n    escalation: [{approvers: [alice]}]\n"), policy.ErrMissingField, "escalation[0].after: missing"},
		{"escalation missing approvers", rule("    action: require_approval\n    escalation: [{after: 1m}]\n"), policy.ErrMissingField, "escalation[0].approvers: missing"},
		{"escalation unknown field", rule("    action: require_approval\n    escalation: [{after: 1m, approvers: [alice], notify: x}]\n"), policy.ErrUnknownField, "unknown field \"notify\""},
		{"escalation bad after", rule("    action: require_approval\n    escalation: [{after: x, approvers: [alice]}]\n"), policy.ErrBadDuration, "escalation[0].after \"x\""},
		{"escalation bad extend", rule("    action: require_approval\n    escalation: [{after: 1m, approvers: [alice], extend: -1m}]\n"), policy.ErrBadDuration, "escalation[0].extend"},
		{"escalation out of order", rule("    action: require_approval\n    escalation: [{after: 2m, approvers: [alice]}, {after: 1m, approvers: [bob]}]\n"), policy.ErrBadValue, "escalation[1].after 1m0s: must be later"},
		{"escalation after timeout", rule("    action: require_approval\n    timeout: 10m\n    escalation: [{after: 10m, approvers: [alice]}]\n"), policy.ErrBadValue, "never reached"},
		{"escalation reached by extension", rule("    action: require_approval\n    timeout: 10m\n    escalation: [{after: 5m, approvers: [alice], extend: 10m}, {after: 15m, approvers: [bob]}]\n"), nil, ""},
		{"escalation unknown approver", rule("    action: require_approval\n    escalation: [{after: 1m, approvers: [\"role:ceo\"]}]\n"), policy.ErrUnknownApprover, "escalation[0].approvers[0]"},
		{"escalation uses default timeout", "version: 1\ndefaults: {timeout: 1m}\nrules:\n  - name: r\n    action: require_approval\n    escalation: [{after: 2m, approvers: [any]}]\n", policy.ErrBadValue, "never reached, the request times out at 1m0s"},
		{"defaults after rules", "version: 1\nrules:\n  - name: r\n    action: require_approval\n    approvers: [alice]\nprincipals:\n  alice: {}\n", nil, ""},

		// limits
		{"limit ok", limit("    tools: [pay]\n    per: session\n    sum: args.amount\n    max: 5000\n    window: 24h\n    over: deny\n"), nil, ""},
		{"limit count", limit("    per: global\n    max: 100\n"), nil, ""},
		{"limit missing per max", limit(""), policy.ErrMissingField, "per: missing"},
		{"limit missing name", "version: 1\nlimits:\n  - {per: global, max: 1}\n", policy.ErrMissingField, "name: missing"},
		{"limit bad per", limit("    per: tenant\n    max: 1\n"), policy.ErrBadValue, "per \"tenant\""},
		{"limit negative max", limit("    per: agent\n    max: -1\n"), policy.ErrBadValue, "max -1"},
		{"limit max string", limit("    per: agent\n    max: lots\n"), policy.ErrBadType, "max \"lots\""},
		{"limit max nan", limit("    per: agent\n    max: .nan\n"), policy.ErrBadType, "max"},
		{"limit bad window", limit("    per: user\n    max: 1\n    window: daily\n"), policy.ErrBadDuration, "window \"daily\""},
		{"limit bad over", limit("    per: user\n    max: 1\n    over: allow\n"), policy.ErrBadValue, "over \"allow\""},
		{"limit sum not number", limit("    per: user\n    max: 1\n    sum: tool\n"), policy.ErrBadValue, "sum: has type string, want a number"},
		{"limit sum bad cel", limit("    per: user\n    max: 1\n    sum: 'args.'\n"), policy.ErrBadCEL, "sum: line 1"},
		{"limit bad glob", limit("    per: user\n    max: 1\n    tools: [\"[\"]\n"), policy.ErrBadGlob, "tools[0]"},
		{"limit unknown field", limit("    per: user\n    max: 1\n    every: 1h\n"), policy.ErrUnknownField, "limits[0] (l1): unknown field \"every\""},
		{"limit duplicate", "version: 1\nlimits:\n  - {name: a, per: user, max: 1}\n  - {name: a, per: user, max: 1}\n", policy.ErrDuplicate, "already used by the limit"},
		{"limit bad name", "version: 1\nlimits:\n  - {name: \"a.b\", per: user, max: 1}\n", policy.ErrBadName, "name \"a.b\""},

		// YAML features
		{"alias", "version: 1\nprincipals:\n  alice: {roles: [fin]}\nx-approvers: &fin [\"role:fin\"]\n", policy.ErrUnknownField, "x-approvers"},
		{"alias used", "version: 1\nprincipals:\n  alice: {roles: &r [fin]}\n  bob: {roles: *r}\nrules:\n  - {name: a, action: require_approval, approvers: [\"role:fin\"], quorum: 2}\n", nil, ""},
		{"merge key", "version: 1\ndefaults:\n  <<: {timeout: 1m}\n", policy.ErrUnknownField, "unknown field \"<<\""},
		{"null values are absent", "version: 1\nmode:\ndefaults:\nrules:\n  - name: x\n    action: allow\n    tools:\n    reason:\n", nil, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, err := policy.Parse([]byte(tc.src), "test.yaml")
			if tc.wantErr == nil {
				if err != nil {
					t.Fatalf("Parse: %v", err)
				}
				if p == nil {
					t.Fatal("nil policy without error")
				}
				return
			}
			if err == nil {
				t.Fatalf("Parse succeeded, want %v", tc.wantErr)
			}
			if !errors.Is(err, tc.wantErr) {
				t.Errorf("error %q does not match %v", err, tc.wantErr)
			}
			if !errors.Is(err, policy.ErrInvalid) {
				t.Errorf("error %q does not match ErrInvalid", err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not contain %q", err, tc.want)
			}
			if p != nil {
				t.Error("policy returned with an error")
			}
		})
	}
}

func TestParseReportsEverything(t *testing.T) {
	src := `version: 1
mode: sometimes
principals:
  alice: {roles: [finance]}
rules:
  - name: big-reimbursements
    tools: [reimburse]
    action: require_approval
    approvers: ["role:finance", carol]
    quorum: 0
  - name: bad-cel
    when: 'args.amount >'
    action: deny
limits:
  - name: l
    per: forever
    max: 1
`
	_, err := policy.Parse([]byte(src), "policy.yaml")
	if err == nil {
		t.Fatal("Parse succeeded")
	}
	want := []string{
		"policy.yaml:2: mode \"sometimes\": want manual, auto-approve or auto-deny",
		"policy.yaml:9: rules[0] (big-reimbursements): approvers[1] \"carol\": not a principal",
		"policy.yaml:10: rules[0] (big-reimbursements): quorum 0: must be at least 1",
		"policy.yaml:12: rules[1] (bad-cel): when: line 1 col",
		"policy.yaml:16: limits[0] (l): per \"forever\"",
	}
	lines := strings.Split(err.Error(), "\n")
	if len(lines) != len(want) {
		t.Fatalf("got %d problems, want %d:\n%v", len(lines), len(want), err)
	}
	for i, w := range want {
		if !strings.HasPrefix(lines[i], w) {
			t.Errorf("problem %d = %q, want prefix %q", i, lines[i], w)
		}
	}
	var pe *policy.Error
	if !errors.As(err, &pe) || pe.File != "policy.yaml" || pe.Line != 2 {
		t.Errorf("errors.As *Error = %+v", pe)
	}
	for _, kind := range []error{policy.ErrBadValue, policy.ErrUnknownApprover, policy.ErrQuorum, policy.ErrBadCEL} {
		if !errors.Is(err, kind) {
			t.Errorf("joined error does not match %v", kind)
		}
	}
}

func TestParseFields(t *testing.T) {
	p := mustParse(t, readExample(t, "reference.yaml"))
	if p.Version != 1 || p.Mode != policy.ModeManual || p.File != "test.yaml" {
		t.Errorf("header: %+v", p)
	}
	d := p.Defaults
	if d.Timeout != 5*time.Minute || d.OnTimeout != events.Deny || d.OnNoApprover != policy.NoApproverDeny ||
		d.AllowSelfApproval || !d.Rememberable || d.MaxRemember != 720*time.Hour {
		t.Errorf("defaults: %+v", d)
	}
	alice := p.Principals["alice"]
	if alice == nil || alice.Slack != "U024BE7LH" || alice.Email != "alice@example.com" || len(alice.Roles) != 2 {
		t.Errorf("alice: %+v", alice)
	}
	if name, ok := p.PrincipalFor("slack", "U024BE7LH"); !ok || name != "alice" {
		t.Errorf("PrincipalFor slack = %q, %v", name, ok)
	}
	if name, ok := p.PrincipalFor("github", "carol-gh"); !ok || name != "carol" {
		t.Errorf("PrincipalFor github = %q, %v", name, ok)
	}
	if _, ok := p.PrincipalFor("slack", "nobody"); ok {
		t.Error("PrincipalFor found nobody")
	}
	if len(p.Rules) != 2 {
		t.Fatalf("rules: %d", len(p.Rules))
	}
	r := p.Rules[0]
	if r.Name != "read-only-tools" || r.Action != policy.Allow || r.Reason == "" || r.Labels["env"] != "prod*" ||
		len(r.Tools) != 2 || len(r.Agents) != 1 || r.When == "" || r.Approval != nil || r.Line != 21 {
		t.Errorf("rule 0: %+v", r)
	}
	a := p.Rules[1].Approval
	if a == nil {
		t.Fatal("rule 1 has no approval")
	}
	if a.Rule != "big-reimbursements" || a.Quorum != 2 || a.Timeout != time.Hour || a.OnTimeout != events.Deny ||
		a.OnNoApprover != policy.NoApproverDeny || a.AllowSelfApproval || !a.Rememberable ||
		strings.Join(a.RememberScopes, ",") != "call,session" || a.MaxRemember != 24*time.Hour ||
		len(a.Escalation) != 1 || a.Escalation[0].After != 30*time.Minute || a.Escalation[0].Extend != 30*time.Minute ||
		strings.Join(a.Approvers, ",") != "role:finance,carol" {
		t.Errorf("approval: %+v", a)
	}
	l := p.Limits[0]
	if l.Name != "session-spend" || l.Per != policy.PerSession || l.Sum != "args.amount" || l.Max != 5000 ||
		l.Window != 24*time.Hour || l.Over != policy.RequireApproval {
		t.Errorf("limit: %+v", l)
	}
}

func TestParseDefaultsInherited(t *testing.T) {
	p := mustParse(t, `version: 1
defaults: {timeout: 2m, on_timeout: approve, on_no_approver: wait, allow_self_approval: true, rememberable: false, max_remember: 3h}
rules:
  - {name: r, action: require_approval}
`)
	a := p.Rules[0].Approval
	if a.Timeout != 2*time.Minute || a.OnTimeout != events.Approve || a.OnNoApprover != policy.NoApproverWait ||
		!a.AllowSelfApproval || a.Rememberable || a.MaxRemember != 3*time.Hour || a.Quorum != 1 || !a.Anyone() {
		t.Errorf("inherited approval: %+v", a)
	}
	m := p.ModeApproval()
	if m.Rule != "mode:manual" || m.Timeout != 2*time.Minute || m.Rememberable || !m.Anyone() {
		t.Errorf("mode approval: %+v", m)
	}
}

func TestDefault(t *testing.T) {
	p := policy.Default()
	if p.Mode != policy.ModeManual || len(p.Rules) != 0 {
		t.Fatalf("Default: %+v", p)
	}
	res := p.Evaluate(input(t, `{"tool":"delete_file","user":"carol"}`), t0, nil)
	a := res.Approval
	if res.Action != policy.RequireApproval || res.Auto || res.Rule != "mode:manual" || a == nil {
		t.Fatalf("Default result: %+v", res)
	}
	if !a.Anyone() || a.Quorum != 1 || a.Timeout != 5*time.Minute || a.OnTimeout != events.Deny ||
		a.OnNoApprover != policy.NoApproverDeny || !a.Rememberable || a.AllowSelfApproval || a.MaxRemember != 720*time.Hour {
		t.Errorf("Default approval: %+v", a)
	}
}

func readExample(t testing.TB, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "examples", "policies", name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestExamplesParse(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("..", "..", "examples", "policies", "*.yaml"))
	if err != nil || len(files) < 5 {
		t.Fatalf("examples: %v, %v", files, err)
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := policy.Parse(b, filepath.Base(f)); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// yaml.v3 reports many syntax errors at the line where the enclosing block
// starts; Parse names the line where the problem is.
func TestParseSyntaxErrorLine(t *testing.T) {
	tests := []struct {
		name string
		src  string
		want string // prefix of the error
	}{
		{"sequence item key outdented", "version: 1\nrules:\n  - name: a\n    tools: [x]\n  action: allow\n",
			"test.yaml:5: did not find expected '-' indicator"},
		{"mapping key outdented", "version: 1\ndefaults:\n  timeout: 1m\n  on_timeout: deny\n rememberable: true\n",
			"test.yaml:5: did not find expected key"},
		{"mapping key indented", "version: 1\ndefaults:\n  timeout: 1m\n  on_timeout: deny\n   rememberable: true\n",
			"test.yaml:5: mapping values are not allowed in this context"},
		{"tab", "version: 1\ndefaults:\n  timeout: 1m\n  on_timeout: deny\n\trememberable: true\n",
			"test.yaml:5: found a tab character"},
		{"tab in a rule", "version: 1\nrules:\n  - name: a\n    tools: [x]\n\taction: allow\n",
			"test.yaml:5: found character that cannot start any token"},
		{"after a multi-line flow sequence", "version: 1\nrules:\n  - name: a\n    tools: [x,\n      y,\n      z]\n    action: allow\n  action: deny\n",
			"test.yaml:8: did not find expected '-' indicator"},
		{"after a block scalar", "version: 1\nrules:\n  - name: a\n    reason: |\n      one\n\n      two\n    action: allow\n  tools: [x]\n",
			"test.yaml:9: did not find expected '-' indicator"},
		{"CRLF", "version: 1\r\nrules:\r\n  - name: a\r\n    tools: [x]\r\n  action: allow\r\n",
			"test.yaml:5: did not find expected '-' indicator"},
		{"no newline at the end", "version: 1\nrules:\n  - name: a\n    tools: [x]\n  action: allow",
			"test.yaml:5: did not find expected '-' indicator"},
		{"unclosed flow sequence", "version: 1\nmode: [manual\n", "test.yaml:2: did not find expected ',' or ']'"},
		{"unclosed quote", "version: 1\nrules:\n  - name: a\n    when: 'x\n    action: deny\n", "test.yaml:4: found unexpected end of stream"},
		{"first line", "version: 1: 2\n", "test.yaml:1: mapping values are not allowed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := policy.Parse([]byte(tt.src), "test.yaml")
			if !errors.Is(err, policy.ErrSyntax) {
				t.Fatalf("err %v, want ErrSyntax", err)
			}
			if !strings.HasPrefix(err.Error(), tt.want) {
				t.Errorf("error %q, want prefix %q", err, tt.want)
			}
			var pe *policy.Error
			if !errors.As(err, &pe) {
				t.Fatalf("errors.As *Error failed: %v", err)
			}
			if got := strings.TrimPrefix(tt.want, "test.yaml:"); !strings.HasPrefix(got, fmt.Sprint(pe.Line)+":") {
				t.Errorf("Line = %d, want the one in %q", pe.Line, tt.want)
			}
		})
	}
}
