package broker_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/assent-dev/assent/internal/broker"
	"github.com/assent-dev/assent/internal/brokertest"
	"github.com/assent-dev/assent/internal/testenv"
	"github.com/assent-dev/assent/pkg/events"
	"github.com/assent-dev/assent/pkg/handler"
	"github.com/assent-dev/assent/pkg/policy"
)

// patience bounds every wait in these tests: only a hang misses it.
const patience = 20 * time.Second

// TestCrashBetweenWrites kills a broker between the writes its handling of a
// message makes, on every path that decides: with the trigger (request,
// answer, cancel, expiry batch) stored and the decision built but not
// published; and with the decision stored but neither the remembered choice
// it asks for nor the trigger's acknowledgement. A second broker must finish
// promptly: well before the request's deadline (10 minutes for the paths a
// person or agent triggers), one decision, what the stream holds read the
// same by the broker, the remembered choice in force. The agent asks again by
// id while the broker is down and once more after the decision: neither
// changes it.
//
// The kill is the broker's NATS connections closing from inside the window:
// the server then sees what it sees when the process dies (no ack, no
// publish, nothing more from that client).
func TestCrashBetweenWrites(t *testing.T) {
	points := []struct {
		name string
		hook func(*broker.Broker, func(id string))
		// stored: the decision is on the stream when the broker dies.
		stored bool
	}{
		{"before-decision", (*broker.Broker).SetCommitHook, false},
		{"after-decision", (*broker.Broker).SetPublishHook, true},
	}
	cases := []struct {
		name    string
		mode    broker.Mode
		timeout time.Duration
		// trigger makes broker a decide request id (already pending, unless the
		// mode decides at once).
		trigger func(t *testing.T, js jetstream.JetStream, a *broker.Broker, id string)
		want    events.Outcome
		// remembers: the answer asks for a remembered choice, which must be
		// in force once the decision is out.
		remembers bool
	}{
		{name: "answer-nats", timeout: 10 * time.Minute, want: events.Approved, remembers: true,
			trigger: func(t *testing.T, js jetstream.JetStream, _ *broker.Broker, id string) {
				if err := handler.Answer(tctx(t), js, "alice", id, events.Responded{Decision: events.Approve, Channel: "cli", Remember: rememberSession}); err != nil {
					t.Fatal(err)
				}
			}},
		{name: "answer-http", timeout: 10 * time.Minute, want: events.Denied, remembers: true,
			trigger: func(t *testing.T, _ jetstream.JetStream, a *broker.Broker, id string) {
				// The broker dies inside the call; what it returns does not matter.
				_, _ = a.Respond(tctx(t), "alice", id, events.Responded{Decision: events.Deny, Reason: "no", Remember: rememberSession})
			}},
		{name: "cancel-nats", timeout: 10 * time.Minute, want: events.Cancelled,
			trigger: func(t *testing.T, js jetstream.JetStream, _ *broker.Broker, id string) {
				publishEvent(t, js, events.CancelPrefix+id, events.TypeCancel, "agent/crash", events.Cancel{Reason: "stop"})
			}},
		{name: "cancel-http", timeout: 10 * time.Minute, want: events.Cancelled,
			trigger: func(t *testing.T, _ jetstream.JetStream, a *broker.Broker, id string) {
				_, _ = a.Cancel(tctx(t), id, "ops", "stop")
			}},
		{name: "timeout", timeout: time.Second, want: events.Expired},
		{name: "automatic", mode: broker.ModeAutoApprove, timeout: 10 * time.Minute, want: events.Approved},
	}
	for _, point := range points {
		for _, tc := range cases {
			t.Run(point.name+"/"+tc.name, func(t *testing.T) {
				ns := testenv.Server(t)
				check := testenv.Conn(t, ns)
				js, err := jetstream.New(check)
				if err != nil {
					t.Fatal(err)
				}
				a, crashed := crashing(t, ns, broker.Config{Name: "a", Mode: tc.mode}, point.hook)

				id := events.NewID()
				req := events.Requested{Tool: "rm", Args: []byte(`{"path":"/tmp/x"}`), Agent: "crasher", Session: "s1", Timeout: events.Duration(tc.timeout)}
				publishEvent(t, js, events.RequestPrefix+"crasher", events.TypeRequested, "agent/crasher", req, id)
				if tc.trigger != nil {
					waitState(t, a, id, func(s broker.State) bool { return s == broker.StatePending })
					tc.trigger(t, js, a, id)
				}
				select {
				case got := <-crashed:
					if got != id {
						t.Fatalf("crashed deciding %s, want %s", got, id)
					}
				case <-time.After(patience):
					t.Fatalf("broker a never reached the window (%s)", point.name)
				}
				if d, ok := firstDecision(t, js, id); ok != point.stored {
					t.Fatalf("the decision (%s) on the stream: %v, want %v", d.Outcome, ok, point.stored)
				}

				// The agent, hearing nothing, asks again by id (past the stream's
				// duplicate window, so the stream stores it again).
				askAgain(t, js, id, req)

				crashedAt := time.Now()
				b, _ := brokertest.Run(t, testenv.Conn(t, ns), broker.Config{Name: "b", Mode: tc.mode})
				var d events.Decided
				deadline := time.Now().Add(patience)
				for {
					var ok bool
					if d, ok = firstDecision(t, js, id); ok {
						break
					}
					if time.Now().After(deadline) {
						rec, err := b.Get(tctx(t), id)
						t.Fatalf("no decision on the stream %s after the crash; the state says %s (%v)", patience, rec.State, err)
					}
					time.Sleep(20 * time.Millisecond)
				}
				t.Logf("decision published %s after the crash", time.Since(crashedAt).Round(time.Millisecond))
				if d.Outcome != tc.want {
					t.Fatalf("outcome %s, want %s", d.Outcome, tc.want)
				}
				rec, err := b.Get(tctx(t), id)
				if err != nil {
					t.Fatal(err)
				}
				if string(rec.State) != string(d.Outcome) || !rec.Decision.DecidedAt.Equal(d.DecidedAt) {
					t.Fatalf("the stream says %s at %s, the state %s at %v", d.Outcome, d.DecidedAt, rec.State, rec.Decision)
				}
				// The remembered choice is written after the decision: stored by
				// the handling that published it, a moment after it, or, when
				// the broker died in between, by the answer's redelivery an ack
				// wait later.
				for deadline := time.Now().Add(patience); tc.remembers; time.Sleep(20 * time.Millisecond) {
					if slices.ContainsFunc(b.Remembered(), func(g policy.Grant) bool { return g.RequestID == id }) {
						break
					}
					if time.Now().After(deadline) {
						t.Fatalf("the decision is out, but the remembered choice its answer asked for is not in force: %+v", b.Remembered())
					}
				}
				// Once more after the decision: it stays the one decision.
				askAgain(t, js, id, req)
				// Let redeliveries and timers run out, then count.
				time.Sleep(2500 * time.Millisecond)
				if again, err := b.Get(tctx(t), id); err != nil || again.DecisionEventID != rec.DecisionEventID || again.Revision() != rec.Revision() {
					t.Fatalf("asked again after the decision, the state holds %+v (%v), want %+v", again.Decision, err, rec.Decision)
				}
				if n := countMsgs(t, js, events.DecisionPrefix+id); n != 1 {
					t.Fatalf("%d decided events for %s, want 1", n, id)
				}
			})
		}
	}
}

// TestCrashAfterPending kills a broker after a request's pending event is
// stored and before its request message is acknowledged. The next broker
// takes the redelivered request up where it stands: one pending event on the
// stream, the request waiting with the deadline it was given, and an answer
// decides it.
func TestCrashAfterPending(t *testing.T) {
	ns := testenv.Server(t)
	js, err := jetstream.New(testenv.Conn(t, ns))
	if err != nil {
		t.Fatal(err)
	}
	_, crashed := crashing(t, ns, broker.Config{Name: "a"}, (*broker.Broker).SetPendingHook)
	id := events.NewID()
	req := events.Requested{Tool: "rm", Args: []byte(`{"path":"/tmp/x"}`), Agent: "crasher", Timeout: events.Duration(10 * time.Minute)}
	publishEvent(t, js, events.RequestPrefix+"crasher", events.TypeRequested, "agent/crasher", req, id)
	select {
	case <-crashed:
	case <-time.After(patience):
		t.Fatal("broker a never stored the pending event")
	}
	b, _ := brokertest.Run(t, testenv.Conn(t, ns), broker.Config{Name: "b"})
	waitState(t, b, id, func(s broker.State) bool { return s == broker.StatePending })
	rec, err := b.Get(tctx(t), id)
	if err != nil {
		t.Fatal(err)
	}
	if rec.Deadline.IsZero() || rec.Deadline.Sub(rec.ReceivedAt) != 10*time.Minute {
		t.Fatalf("pending with deadline %s, received %s", rec.Deadline, rec.ReceivedAt)
	}
	// The redelivery (an ack wait after the crash) announces nothing new.
	time.Sleep(2500 * time.Millisecond)
	if n := countMsgs(t, js, events.PendingPrefix+"crasher"); n != 1 {
		t.Fatalf("%d pending events stored, want 1", n)
	}
	if _, err := b.Respond(tctx(t), "alice", id, events.Responded{Decision: events.Approve}); err != nil {
		t.Fatal(err)
	}
	if d, ok := firstDecision(t, js, id); !ok || d.Outcome != events.Approved {
		t.Fatalf("decision %+v %v", d, ok)
	}
}

// rememberSession asks for the answer to hold for the request's session.
var rememberSession = &events.Remember{Scope: events.ScopeSession, TTL: events.Duration(time.Hour)}

func tctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), patience)
	t.Cleanup(cancel)
	return c
}

// crashing runs a broker with cfg on a connection of its own, which it
// closes (what the server sees when the process dies) the first time the
// hook that setHook installs fires; crashed then receives the request id.
func crashing(t *testing.T, ns *testenv.NATS, cfg broker.Config, setHook func(*broker.Broker, func(id string))) (b *broker.Broker, crashed <-chan string) {
	t.Helper()
	nc := testenv.Conn(t, ns)
	b, err := broker.New(nc, cfg, testenv.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	ch := make(chan string, 1)
	var once sync.Once
	setHook(b, func(id string) {
		once.Do(func() {
			b.CloseConnections()
			ch <- id
		})
	})
	runUntilCleanup(t, b)
	return b, ch
}

// runUntilCleanup runs b until the test ends; it does not wait for readiness
// to be reported twice, nor care how Run ends (the test may kill b's
// connection).
func runUntilCleanup(t *testing.T, b *broker.Broker) {
	t.Helper()
	c, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- b.Run(c) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(patience):
			t.Error("broker did not stop")
		}
	})
	for deadline := time.Now().Add(patience); !b.Ready(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("broker not ready")
		}
	}
}

// publishEvent publishes a structured-mode event with data on subject; an id
// given is the event id and Nats-Msg-Id.
func publishEvent(t *testing.T, js jetstream.JetStream, subject, typ, source string, data any, id ...string) {
	t.Helper()
	eid := ""
	if len(id) > 0 {
		eid = id[0]
	}
	msg, eid := eventMsg(t, subject, typ, source, data, eid)
	if _, err := js.PublishMsg(tctx(t), msg, jetstream.WithMsgID(eid)); err != nil {
		t.Fatal(err)
	}
}

// askAgain publishes request id again as its agent's retry would once the
// stream's duplicate window has passed: the same event, stored again.
func askAgain(t *testing.T, js jetstream.JetStream, id string, req events.Requested) {
	t.Helper()
	msg, _ := eventMsg(t, events.RequestPrefix+req.Agent, events.TypeRequested, "agent/crasher", req, id)
	if _, err := js.PublishMsg(tctx(t), msg); err != nil {
		t.Fatal(err)
	}
}

// eventMsg encodes a structured-mode event with data on subject, with event
// id id ("": a new one), and returns it with its id.
func eventMsg(t *testing.T, subject, typ, source string, data any, id string) (*nats.Msg, string) {
	t.Helper()
	e, err := events.New(typ, id, source, data)
	if err != nil {
		t.Fatal(err)
	}
	h, body, err := events.Encode(&e)
	if err != nil {
		t.Fatal(err)
	}
	return &nats.Msg{Subject: subject, Header: nats.Header(h), Data: body}, e.ID()
}

// firstDecision reads the first decided event stored for request id.
func firstDecision(t *testing.T, js jetstream.JetStream, id string) (events.Decided, bool) {
	t.Helper()
	s, err := js.Stream(tctx(t), events.StreamName)
	if err != nil {
		t.Fatal(err)
	}
	m, err := s.GetMsg(tctx(t), 1, jetstream.WithGetMsgSubject(events.DecisionPrefix+id))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return events.Decided{}, false
	}
	if err != nil {
		t.Fatal(err)
	}
	e, err := events.Decode(events.Header(m.Header), m.Data)
	if err != nil {
		t.Fatal(err)
	}
	d, err := events.DecodeDecided(&e)
	if err != nil {
		t.Fatal(err)
	}
	return d, true
}

// countMsgs counts the messages stored on subject.
func countMsgs(t *testing.T, js jetstream.JetStream, subject string) uint64 {
	t.Helper()
	s, err := js.Stream(tctx(t), events.StreamName)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(tctx(t), jetstream.WithSubjectFilter(subject))
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Subjects[subject]
}

// waitState polls b until request id exists and its state satisfies ok.
func waitState(t *testing.T, b *broker.Broker, id string, ok func(broker.State) bool) {
	t.Helper()
	deadline := time.Now().Add(patience)
	for {
		rec, err := b.Get(tctx(t), id)
		if err == nil && ok(rec.State) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("request %s: state %s (%v)", id, rec.State, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestCancelWhileRequestHeld: a replica takes a request and dies before it
// stores it; the agent's cancel, stored after the request, comes to a live
// replica first. The cancel waits until the request comes back (its ack
// wait, longer than the first few retries) and then cancels it, rather than
// being dropped as a cancel of an unknown request.
func TestCancelWhileRequestHeld(t *testing.T) {
	ns := testenv.Server(t)
	nc := testenv.Conn(t, ns)
	cfg := broker.Config{AckWait: 4 * time.Second}
	_, stop := brokertest.Run(t, nc, cfg)
	stop() // resources provisioned; nobody consumes

	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	id := events.NewID()
	publishEvent(t, js, events.RequestPrefix+"a1", events.TypeRequested, "agent/a1", events.Requested{Tool: "deploy", Agent: "a1"}, id)
	cons, err := js.Consumer(tctx(t), events.StreamName, broker.ConsumerRequests)
	if err != nil {
		t.Fatal(err)
	}
	batch, err := cons.Fetch(1, jetstream.FetchMaxWait(patience))
	if err != nil {
		t.Fatal(err)
	}
	held := <-batch.Messages() // taken by a replica that dies: never acknowledged
	if held == nil {
		t.Fatal("the request was not handed out")
	}
	cancelSubj, err := events.AgentCancelSubject("a1", id)
	if err != nil {
		t.Fatal(err)
	}
	publishEvent(t, js, cancelSubj, events.TypeCancel, "agent/a1", events.Cancel{Reason: "stopped waiting"})

	b, _ := brokertest.Run(t, nc, cfg)
	wctx, cancel := context.WithTimeout(context.Background(), 4*patience)
	defer cancel()
	rec, err := b.Wait(wctx, id)
	if err != nil {
		t.Fatalf("request %s: %v (state %s)", id, err, rec.State)
	}
	if rec.State != broker.StateCancelled {
		t.Fatalf("request %s is %s, want cancelled", id, rec.State)
	}
}
