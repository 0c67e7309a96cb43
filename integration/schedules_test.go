package integration

import (
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
// may publish only its own requests can have the server store, a moment
// later, a message on any subject of the stream. The broker takes none of
// them: an approval in alice's name for the agent's own request does not
// count, nor does a batch of expiries naming it; alice's real answer
// decides it.
func TestScheduledForgeriesRefused(t *testing.T) {
	a, ns, b, brokerJS := operatorBroker(t, "b1")
	agentNC, _ := connectAs(t, ns, a, creds.Identity{Role: creds.RoleAgent, Name: "coder"})
	id, _ := askPending(t, b, agentNC, "coder")
	ajs := itest.NewJS(t, agentNC)

	// One schedule a subject: the agent's request subject and a cancel
	// subject of its own.
	answer := eventMsg(t, events.TypeResponded, "approver/alice", events.Responded{Decision: events.Approve})
	answer.Subject = events.RequestPrefix + "coder"
	due := &nats.Msg{Subject: events.CancelPrefix + "coder.x", Data: []byte(id)}
	for target, m := range map[string]*nats.Msg{events.ResponsePrefix + "alice." + id: answer, "assent.tick.due": due} {
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
