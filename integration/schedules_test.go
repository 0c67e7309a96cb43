package integration

import (
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/assent-dev/assent/integration/itest"
	"github.com/assent-dev/assent/internal/broker"
	"github.com/assent-dev/assent/internal/creds"
	"github.com/assent-dev/assent/pkg/events"
)

// TestScheduledForgeriesRefused: the server checks a publisher's
// permissions on a schedule's subject, not on its target, so an agent that
// may publish only its own requests could have the server store, a moment
// later, a message on any subject of a stream that takes schedules. The
// stream a broker makes takes none: a scheduled decision, answer or batch
// of expiries is refused when the agent publishes it, as is a message
// with a TTL (which would leave the record early).
func TestScheduledForgeriesRefused(t *testing.T) {
	a, ns, b, brokerJS := operatorBroker(t, "b1")
	agentNC, _ := connectAs(t, ns, a, creds.Identity{Role: creds.RoleAgent, Name: "coder"})
	id, _ := askPending(t, b, agentNC, "coder")
	ajs := itest.NewJS(t, agentNC)
	decision, _ := forgeries(t, id, "alice")
	decision.Subject = events.RequestPrefix + "coder"
	scheduled := scheduledForgeries(t, id)
	scheduled[events.DecisionPrefix+id] = decision
	for target, m := range scheduled {
		if _, err := ajs.PublishMsg(itest.TestCtx(t, itest.Patience), m, jetstream.WithScheduleAt(time.Now().Add(time.Second)), jetstream.WithScheduleTarget(target)); err == nil {
			t.Fatalf("a schedule onto %s stored", target)
		}
	}
	if _, err := ajs.PublishMsg(itest.TestCtx(t, itest.Patience), eventMsg(t, events.TypeRequested, "agent/coder", events.Requested{Tool: "rm", Agent: "coder"}), jetstream.WithMsgTTL(time.Second)); err == nil {
		t.Fatal("a request with a TTL stored")
	}
	untouched(t, b, brokerJS, id)
}

// scheduledForgeries are the scheduled messages an agent tries, by target:
// an approval in alice's name for its own request id, and a batch of
// expiries naming it, each on a subject the agent may publish on.
func scheduledForgeries(t *testing.T, id string) map[string]*nats.Msg {
	_, answer := forgeries(t, id, "alice")
	answer.Subject = events.RequestPrefix + "coder"
	due := &nats.Msg{Subject: events.CancelPrefix + "coder.x", Data: []byte(id)}
	return map[string]*nats.Msg{events.ResponsePrefix + "alice." + id: answer, "assent.tick.due": due}
}

// TestScheduledForgeriesIgnored: a stream made by an earlier broker still
// takes schedules (the server refuses to turn them off). The broker takes
// none it did not schedule: an approval in alice's name for the agent's
// own request does not count, nor does a batch of expiries naming it;
// alice's real answer decides it.
func TestScheduledForgeriesIgnored(t *testing.T) {
	a, ns, brokerNC := operatorServer(t)
	old := broker.StreamConfig(broker.Config{})
	old.AllowMsgSchedules, old.AllowMsgTTL = true, true
	brokerJS := itest.NewJS(t, brokerNC)
	if _, err := brokerJS.CreateStream(itest.TestCtx(t, itest.Patience), old); err != nil {
		t.Fatal(err)
	}
	b, _ := itest.RunBroker(t, brokerNC, broker.Config{Name: "b1", Policy: itest.MustPolicy(t, permsPolicy, "perms.yaml")})
	agentNC, _ := connectAs(t, ns, a, creds.Identity{Role: creds.RoleAgent, Name: "coder"})
	id, _ := askPending(t, b, agentNC, "coder")
	ajs := itest.NewJS(t, agentNC)

	for target, m := range scheduledForgeries(t, id) {
		if _, err := ajs.PublishMsg(itest.TestCtx(t, itest.Patience), m, jetstream.WithScheduleAt(time.Now().Add(time.Second)), jetstream.WithScheduleTarget(target)); err != nil {
			t.Fatalf("schedule onto %s: %v", target, err)
		}
	}
	// Both fire, and the server stores them on their targets.
	s, err := brokerJS.Stream(itest.TestCtx(t, itest.Patience), broker.StreamName)
	if err != nil {
		t.Fatal(err)
	}
	for _, subject := range []string{events.ResponsePrefix + "alice." + id, "assent.tick.due"} {
		deadline := time.Now().Add(10 * time.Second)
		for {
			m, err := s.GetLastMsgForSubject(itest.TestCtx(t, itest.Patience), subject)
			if err == nil && m.Header.Get("Nats-Scheduler") != "" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the schedule onto %s never fired: %v", subject, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	untouched(t, b, brokerJS, id)

	aliceNC, _ := connectAs(t, ns, a, creds.Identity{Role: creds.RoleApprover, Name: "alice"})
	itest.AnswerNATS(t, itest.NewJS(t, aliceNC), "alice", id, events.Responded{Decision: events.Deny, Reason: "not now"})
	if d := itest.WaitDecision(t, brokerJS, id); d.Outcome != events.Denied || d.Reason != "not now" {
		t.Fatalf("decision %+v, want alice's denial", d)
	}
}

// TestTimerStreamIsBrokers: the broker's own ticks (ASSENT_TIMERS,
// assent-timer.>) fire the deadlines, so a tick that someone else put
// there would expire requests early. The server refuses every other role a
// publish on those subjects, a schedule onto them and a read of the
// broker's consumer of them; without credentials nobody connects at all
// (TestServerEnforcesRoles).
func TestTimerStreamIsBrokers(t *testing.T) {
	a, ns, b, brokerJS := operatorBroker(t, "b1")
	agentNC, _ := connectAs(t, ns, a, creds.Identity{Role: creds.RoleAgent, Name: "coder"})
	id, _ := askPending(t, b, agentNC, "coder")
	now := time.Now().Unix()
	due := &nats.Msg{Data: []byte(id)}
	for _, who := range []creds.Identity{
		{Role: creds.RoleAgent, Name: "coder"},
		{Role: creds.RoleApprover, Name: "alice"},
		{Role: creds.RoleBot, Name: "bot", Principals: []string{"alice"}},
		{Role: creds.RoleGateway, Name: "gw", Agent: "coder", Principal: "alice"},
		{Role: creds.RoleAuditor, Name: "witness"},
	} {
		t.Run(string(who.Role), func(t *testing.T) {
			nc, v := connectAs(t, ns, a, who)
			for _, subj := range []string{
				fmt.Sprintf("assent-timer.at.%d", now),
				fmt.Sprintf("assent-timer.tick.%d", now+1),
				"$JS.API.CONSUMER.MSG.NEXT." + broker.TimerStreamName + ".assent-broker-timer-ticks",
			} {
				v.refused(t, nc, subj, due)
			}
		})
	}
	// The broker's own publish there is stored: the role that may.
	if _, err := brokerJS.Publish(itest.TestCtx(t, itest.Patience), fmt.Sprintf("assent-timer.at.%d", now-3600), nil); err != nil {
		t.Fatalf("the broker's tick: %v", err)
	}
	untouched(t, b, brokerJS, id)
}
