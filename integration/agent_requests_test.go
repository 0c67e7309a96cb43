package integration

import (
	"encoding/json"
	"slices"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/assent-dev/assent/integration/itest"
	"github.com/assent-dev/assent/internal/broker"
	"github.com/assent-dev/assent/internal/creds"
	"github.com/assent-dev/assent/pkg/events"
	"github.com/assent-dev/assent/pkg/handler"
)

// TestAgentOwnRequestsPerRole: on an operator-mode server, each role's
// credentials and the subjects an agent lists and cancels its own pending
// requests on (assent-private.<agent>.list and .cancel). An agent, a private
// agent and a gateway list and cancel their own agent's requests and see no
// other's; the server refuses them another agent's subjects, and refuses
// approvers and bots both; the broker's credentials (an admin's tools) may
// list any agent's; nobody connects without credentials.
func TestAgentOwnRequestsPerRole(t *testing.T) {
	a, ns, b, _ := operatorBroker(t, "own")
	if _, err := nats.Connect(ns.ClientURL()); err == nil {
		t.Fatal("a client without credentials connected")
	}
	ctx := itest.TestCtx(t, itest.Patience)
	submit := func(id, agent, session string) {
		t.Helper()
		rec, err := b.Submit(ctx, id, "test", events.Requested{Agent: agent, Tool: "deploy", Session: session, Args: json.RawMessage(`{"secret":"` + agent + `"}`)})
		if err != nil || rec.State != broker.StatePending {
			t.Fatalf("submit %s: %v %s", id, err, rec.State)
		}
	}
	submit("c1", "coder", "s1")
	submit("c2", "coder", "s2")
	submit("q1", "quiet", "s1")
	submit("d1", "desktop", "s1")
	submit("v1", "victim", "s1")

	type conn struct {
		nc *nats.Conn
		v  *violations
	}
	agentNC, agentV := connectAs(t, ns, a, creds.Identity{Role: creds.RoleAgent, Name: "coder"})
	quietNC, quietV := connectPrivate(t, ns, a, "quiet")
	aliceNC, aliceV := connectAs(t, ns, a, creds.Identity{Role: creds.RoleApprover, Name: "alice"})
	botNC, botV := connectAs(t, ns, a, creds.Identity{Role: creds.RoleBot, Name: "bot", Principals: []string{"alice", "bob"}})
	gwNC, gwV := connectAs(t, ns, a, creds.Identity{Role: creds.RoleGateway, Name: "gw", Agent: "desktop", Principal: "alice"})
	adminNC, adminV := connectAs(t, ns, a, creds.Identity{Role: creds.RoleBroker, Name: "admin-tool"})
	roles := map[string]conn{"agent": {agentNC, agentV}, "private": {quietNC, quietV}, "approver": {aliceNC, aliceV},
		"bot": {botNC, botV}, "gateway": {gwNC, gwV}, "admin": {adminNC, adminV}}

	list := func(nc *nats.Conn, agent string) []string {
		t.Helper()
		m, err := nc.Request(events.PrivatePrefix+agent+"."+events.AgentList, nil, itest.Patience)
		if err != nil {
			t.Fatalf("list %s: %v", agent, err)
		}
		var r events.AgentReply
		if err := json.Unmarshal(m.Data, &r); err != nil || r.Error != "" {
			t.Fatalf("list %s: %s %v", agent, m.Data, err)
		}
		var ids []string
		for _, p := range r.Pending {
			ids = append(ids, p.ID)
		}
		slices.Sort(ids)
		return ids
	}
	for _, tc := range []struct {
		role, own string
		sees      []string // the own agent's listing
		victim    bool     // may ask about victim's
	}{
		{"agent", "coder", []string{"c1", "c2"}, false},
		{"private", "quiet", []string{"q1"}, false},
		{"approver", "", nil, false},
		{"bot", "", nil, false},
		{"gateway", "desktop", []string{"d1"}, false},
		{"admin", "", nil, true},
	} {
		c := roles[tc.role]
		if tc.own != "" {
			if got := list(c.nc, tc.own); !slices.Equal(got, tc.sees) {
				t.Errorf("%s lists %v, want %v", tc.role, got, tc.sees)
			}
			c.v.none(t, tc.role+" listing its own")
		}
		if tc.victim {
			if got := list(c.nc, "victim"); !slices.Equal(got, []string{"v1"}) {
				t.Errorf("%s lists victim's: %v", tc.role, got)
			}
			continue
		}
		for _, kind := range []string{events.AgentList, events.AgentCancel} {
			c.v.refused(t, c.nc, events.PrivatePrefix+"victim."+kind, &nats.Msg{})
		}
	}
	adminV.none(t, "the admin listing victim's")

	// The agent cancels one session of its own; the private agent all of
	// its own, through the SDK.
	coder, err := handler.NewClient(agentNC, handler.Config{Agent: "coder"})
	if err != nil {
		t.Fatal(err)
	}
	if got, err := coder.CancelAll(ctx, "s1", "stopped"); err != nil || !slices.Equal(got, []string{"c1"}) {
		t.Fatalf("coder cancels s1: %v %v", got, err)
	}
	quiet, err := handler.NewClient(quietNC, handler.Config{Agent: "quiet", Private: true})
	if err != nil {
		t.Fatal(err)
	}
	if got, err := quiet.CancelAll(ctx, "", ""); err != nil || !slices.Equal(got, []string{"q1"}) {
		t.Fatalf("quiet cancels all: %v %v", got, err)
	}
	for id, want := range map[string]string{"c1": "agent/coder", "q1": "agent/quiet"} {
		rec := itest.WaitState(t, b, id, broker.StateCancelled)
		if by := rec.Decision.DecidedBy[0].Principal; by != want {
			t.Errorf("%s cancelled by %q, want %q", id, by, want)
		}
	}
	for _, id := range []string{"c2", "d1", "v1"} {
		if rec, err := b.Get(ctx, id); err != nil || rec.State != broker.StatePending {
			t.Errorf("%s: %v %s, want still pending", id, err, rec.State)
		}
	}
	if left, err := quiet.Pending(ctx, ""); err != nil || len(left) != 0 {
		t.Errorf("quiet still waits for %v (%v)", left, err)
	}
}
