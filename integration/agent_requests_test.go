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
//
// The same roles and the server's copies of stored decisions
// (assent-decided.<id>) and the lookups: every role but a private agent
// gets the copy the server republishes, nobody may publish one (not even
// with the broker's credentials); the bot and the admin may ask the broker
// about any request (assent-broker.lookup.<id>), the others not; an agent,
// a private agent and a gateway may look up their own agent's requests and
// no other's.
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

	// The server's copy of a stored decision reaches every role that may
	// read it, though the server refuses everyone publishing there.
	copies := map[string]*nats.Subscription{}
	for role, c := range roles {
		if role == "private" {
			c.v.refusedSub(t, c.nc, events.DecidedPrefix+"*")
			continue
		}
		sub, err := c.nc.SubscribeSync(events.DecidedPrefix + "*")
		if err != nil {
			t.Fatal(err)
		}
		if err := c.nc.Flush(); err != nil {
			t.Fatal(err)
		}
		copies[role] = sub
	}
	submit("r1", "victim", "s2")
	if _, err := b.Cancel(ctx, "r1", "admin/test", "to be told"); err != nil {
		t.Fatal(err)
	}
	for role, sub := range copies {
		for {
			m, err := sub.NextMsg(itest.Patience)
			if err != nil {
				t.Fatalf("%s: no copy of r1's decision: %v", role, err)
			}
			if m.Subject != events.DecidedPrefix+"r1" {
				continue
			}
			if got := m.Header.Get(events.LastSequenceHeader); got != "0" {
				t.Errorf("%s: r1's decision copied with %s %q, want 0", role, events.LastSequenceHeader, got)
			}
			break
		}
	}
	for _, c := range roles {
		c.v.refused(t, c.nc, events.DecidedPrefix+"r1", &nats.Msg{Data: []byte(`{"forged":true}`)})
	}

	// Lookups: of any request, and of an agent's own.
	lookup := func(role, subject, want string) {
		t.Helper()
		m, err := roles[role].nc.Request(subject, nil, itest.Patience)
		if err != nil || m.Header.Get(events.LookupStatus) != want {
			t.Fatalf("%s asking %s: %v %v, want %s", role, subject, m, err, want)
		}
	}
	for _, tc := range []struct {
		role, own, ownID string
		any              bool // may ask assent-broker.lookup.<id>
	}{
		{"agent", "coder", "c2", false},
		{"private", "quiet", "q1", false},
		{"approver", "", "", false},
		{"bot", "", "", true},
		{"gateway", "desktop", "d1", false},
		{"admin", "victim", "v1", true},
	} {
		c := roles[tc.role]
		if tc.any {
			lookup(tc.role, events.BrokerLookupPrefix+"v1", events.LookupPending)
		} else {
			c.v.refused(t, c.nc, events.BrokerLookupPrefix+"v1", &nats.Msg{})
		}
		if tc.own != "" {
			lookup(tc.role, events.PrivatePrefix+tc.own+".lookup."+tc.ownID, events.LookupPending)
		}
		if tc.own != "victim" {
			c.v.refused(t, c.nc, events.PrivatePrefix+"victim.lookup.v1", &nats.Msg{})
		}
	}

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
