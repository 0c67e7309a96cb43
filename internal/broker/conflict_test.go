package broker_test

import (
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/assent-dev/assent/internal/broker"
	"github.com/assent-dev/assent/internal/brokertest"
	"github.com/assent-dev/assent/internal/testenv"
	"github.com/assent-dev/assent/pkg/events"
)

// TestConflictingDecisionNeverSeen publishes a second decision straight to
// a decided request's stored subject, as a second replica would (expected
// last subject sequence 0) and as a client without permissions could (no
// header). The first is refused by the stream: a plain subscriber the test
// sets up on the subject sees it, the broker never does. The second is
// stored after the decision: the broker's record keeps the first as the
// decision and notes the second, and the audit log marks the second as not
// the decision.
func TestConflictingDecisionNeverSeen(t *testing.T) {
	ns := testenv.Server(t)
	nc := testenv.Conn(t, ns)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := brokertest.Run(t, testenv.Conn(t, ns), broker.Config{Name: "a"})
	rec, err := b.Submit(tctx(t), "", "agent/t", events.Requested{Agent: "t", Tool: "rm", Args: []byte(`{"path":"/tmp/x"}`)})
	if err != nil {
		t.Fatal(err)
	}
	decided, err := b.Respond(tctx(t), "alice", rec.ID, events.Responded{Decision: events.Deny, Reason: "no"})
	if err != nil || decided.State != broker.StateDenied {
		t.Fatalf("answer: %s %v", decided.State, err)
	}
	plain, err := nc.SubscribeSync(events.DecisionPrefix + rec.ID)
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	conflicting := func() *nats.Msg {
		e, err := events.New(events.TypeDecided, "", "broker/other", events.Decided{RequestID: rec.ID, Outcome: events.Approved,
			Args: []byte(`{"path":"/"}`), DecidedAt: time.Now().UTC(), RequestDigest: rec.RequestDigest})
		if err != nil {
			t.Fatal(err)
		}
		h, body, err := events.Encode(&e)
		if err != nil {
			t.Fatal(err)
		}
		return &nats.Msg{Subject: events.DecisionPrefix + rec.ID, Header: nats.Header(h), Data: body}
	}

	// As a second replica would: refused.
	_, err = js.PublishMsg(tctx(t), conflicting(), jetstream.WithExpectLastSequencePerSubject(0))
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) || apiErr.ErrorCode != jetstream.JSErrCodeStreamWrongLastSequence {
		t.Fatalf("a second decision with expected sequence 0: %v, want refused", err)
	}
	if _, err := plain.NextMsg(patience); err != nil {
		t.Fatalf("the plain subscriber did not see the refused publish (%v): the test shows nothing", err)
	}
	if n := countMsgs(t, js, events.DecisionPrefix+rec.ID); n != 1 {
		t.Fatalf("%d messages on the decision subject, want 1", n)
	}
	check := func(wantNote bool) {
		t.Helper()
		got, err := b.Get(tctx(t), rec.ID)
		if err != nil || got.State != broker.StateDenied || got.DecisionEventID != decided.DecisionEventID || got.Decision.Reason != "no" {
			t.Fatalf("the broker reads %s %+v (%v), want the denial", got.State, got.Decision, err)
		}
		if (got.Forgery != "") != wantNote {
			t.Fatalf("the record's note of a second decision: %q", got.Forgery)
		}
	}
	check(false)

	// As a client without permissions could: stored second, never the
	// decision.
	ack, err := js.PublishMsg(tctx(t), conflicting())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Published(tctx(t), rec.ID); err != nil {
		t.Fatal(err)
	}
	check(true)
	page, err := b.Audit(tctx(t), broker.AuditQuery{RequestID: rec.ID, Types: []string{events.TypeDecided}})
	if err != nil {
		t.Fatal(err)
	}
	if len(page.Events) != 2 {
		t.Fatalf("%d decided events in the audit log, want 2", len(page.Events))
	}
	for _, e := range page.Events {
		if (e.Seq == ack.Sequence) != (e.NotDecision != "") {
			t.Fatalf("audit event at %d (the second is at %d) says not the decision: %q", e.Seq, ack.Sequence, e.NotDecision)
		}
	}
}
