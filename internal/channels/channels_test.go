package channels_test

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/assent-dev/assent/internal/channels"
	"github.com/assent-dev/assent/pkg/events"
	"github.com/assent-dev/assent/pkg/handler"
	"github.com/assent-dev/assent/pkg/policy"
)

const src = `version: 1
principals:
  alice: {roles: [finance], slack: U01ALICE, email: Alice@Example.com}
  bob:   {roles: [finance], email: bob@example.com}
  carol: {roles: [ops], identities: {pager: carol-p}}
rules:
  - name: reimburse
    tools: [reimburse]
    action: require_approval
    approvers: ["role:finance"]
  - name: deploy
    tools: [deploy]
    action: require_approval
    approvers: [carol]
    allow_self_approval: true
`

func directory(t *testing.T) *channels.Directory {
	t.Helper()
	p, err := policy.Parse([]byte(src), "dir.yaml")
	if err != nil {
		t.Fatal(err)
	}
	return channels.NewDirectory(p)
}

func TestDirectoryIdentities(t *testing.T) {
	d := directory(t)
	for _, c := range []struct{ channel, id, want string }{
		{"slack", "U01ALICE", "alice"},
		{"email", "alice@example.COM", "alice"}, // addresses compare case-insensitively
		{"email", " bob@example.com ", "bob"},
		{"pager", "carol-p", "carol"},
	} {
		got, err := d.Principal(c.channel, c.id)
		if err != nil || got != c.want {
			t.Errorf("Principal(%s, %q) = %q, %v; want %q", c.channel, c.id, got, err, c.want)
		}
	}
	for _, c := range []struct{ channel, id string }{{"slack", "U0NOBODY"}, {"email", ""}, {"email", "eve@example.com"}, {"slack", "alice"}} {
		if got, err := d.Principal(c.channel, c.id); !errors.Is(err, channels.ErrUnknown) {
			t.Errorf("Principal(%s, %q) = %q, %v; want ErrUnknown", c.channel, c.id, got, err)
		}
	}
	if id, ok := d.Identity("alice", "slack"); !ok || id != "U01ALICE" {
		t.Errorf("alice on slack: %q %v", id, ok)
	}
	if _, ok := d.Identity("bob", "slack"); ok {
		t.Error("bob has no Slack id")
	}
	if got := d.Reachable("email"); !slices.Equal(got, []string{"alice", "bob"}) {
		t.Errorf("reachable by email: %v", got)
	}
}

func TestDirectoryRecipientsAndEligibility(t *testing.T) {
	d := directory(t)
	if got := d.Expand([]string{"role:finance", "carol", "alice"}); !slices.Equal(got, []string{"alice", "bob", "carol"}) {
		t.Errorf("expand: %v", got)
	}
	if got := d.Expand(nil); !slices.Equal(got, []string{"alice", "bob", "carol"}) {
		t.Errorf("anyone: %v", got)
	}
	n := handler.Notice{Request: handler.Request{ID: "r1", Requested: events.Requested{Tool: "reimburse", Agent: "expenses", User: "alice"}},
		Approvers: []string{"role:finance"}, Rule: "reimburse", Terms: &events.Terms{Quorum: 1}}
	// alice asked on her own behalf and may not approve herself.
	if got := d.Recipients(n, "email"); len(got) != 1 || got["bob"] != "bob@example.com" {
		t.Errorf("recipients: %v", got)
	}
	if err := d.MayAnswer("bob", n); err != nil {
		t.Errorf("bob: %v", err)
	}
	for _, who := range []string{"alice", "carol", ""} {
		if err := d.MayAnswer(who, n); !errors.Is(err, policy.ErrNotEligible) {
			t.Errorf("%q may answer: %v", who, err)
		}
	}
	deploy := handler.Notice{Request: handler.Request{ID: "r2", Requested: events.Requested{Tool: "deploy", User: "carol"}}, Approvers: []string{"carol"}, Rule: "deploy", Terms: &events.Terms{Quorum: 1, AllowSelfApproval: true}}
	if err := d.MayAnswer("carol", deploy); err != nil {
		t.Errorf("carol on her own deploy (self-approval allowed): %v", err)
	}
	if got := d.Recipients(deploy, "pager"); got["carol"] != "carol-p" {
		t.Errorf("pager recipients: %v", got)
	}
}

func TestWho(t *testing.T) {
	for _, c := range []struct {
		d    handler.Decision
		want string
	}{
		{handler.Decision{Outcome: events.Approved, DecidedBy: []events.DecidedBy{{Principal: "alice", Channel: "slack"}, {Principal: "bob"}}}, "alice via slack, bob"},
		{handler.Decision{Outcome: events.Approved, Auto: true}, "policy"},
		{handler.Decision{Outcome: events.Expired}, "timeout"},
		{handler.Decision{Outcome: events.Cancelled}, ""},
	} {
		if got := channels.Who(c.d); got != c.want {
			t.Errorf("Who(%+v) = %q, want %q", c.d, got, c.want)
		}
	}
}

// TestArgsProblem: what a channel shows an approver whose edited arguments
// the broker would refuse, in the schema's words; nothing for arguments
// that fit, or without a schema.
func TestArgsProblem(t *testing.T) {
	const schema = `{"type":"object","properties":{"path":{"type":"string"}},"required":["path"]}`
	for _, c := range []struct{ schema, args, want string }{
		{"", `{"anything":1}`, ""},
		{schema, `{"path":"/a"}`, ""},
		{schema, `{"path":1}`, "The tool's input schema refuses these arguments: /path: got number, want string"},
		{schema, `{}`, "The tool's input schema refuses these arguments: missing property 'path'"},
		{`{"type":5}`, `{"path":"/a"}`, "The request's input schema cannot check edited arguments (input_schema: input schema: "},
	} {
		if got := channels.ArgsProblem([]byte(c.schema), []byte(c.args)); c.want == "" && got != "" || !strings.HasPrefix(got, c.want) {
			t.Errorf("ArgsProblem(%s, %s) = %q, want %q", c.schema, c.args, got, c.want)
		}
	}
}
