package handler_test

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/assent-dev/assent/internal/broker"
	"github.com/assent-dev/assent/internal/brokertest"
	"github.com/assent-dev/assent/internal/clustertest"
	"github.com/assent-dev/assent/internal/testenv"
	"github.com/assent-dev/assent/pkg/events"
	"github.com/assent-dev/assent/pkg/handler"
)

// patience bounds each wait of these tests for something that must happen.
const patience = 20 * time.Second

// TestConflictingDecision: a request is decided while its agent's connection
// is down, so the agent misses the server's copy of the decision; once it is
// back, a different decided event (an approval, where the broker denied)
// arrives on the request's decision subject. The agent (Request, Decision, a
// retry by id) and a channel runtime keep the broker's denial:
//
//   - published with expected last subject sequence 0, as a second broker
//     replica would: the stream refuses it, yet a plain subscriber on
//     assent.decision.<id> receives it, which is why no reader may act there;
//   - published with no expected sequence, as a client without permissions
//     could: the stream stores it second, and its copy on assent-decided.<id>
//     says so (Nats-Last-Sequence is the decision's sequence, not 0);
//   - none at all: the agent gets the decision whose copy it missed from its
//     reads of the stored decision.
func TestConflictingDecision(t *testing.T) {
	for _, tc := range []struct {
		name string
		// publish publishes the conflicting event m with js, nil for none.
		publish func(t *testing.T, js jetstream.JetStream, m *nats.Msg) (stored uint64)
	}{
		{"refused second decision", func(t *testing.T, js jetstream.JetStream, m *nats.Msg) uint64 {
			_, err := js.PublishMsg(testCtx(t), m, jetstream.WithExpectLastSequencePerSubject(0))
			if apiErr := (*jetstream.APIError)(nil); !errors.As(err, &apiErr) || apiErr.ErrorCode != jetstream.JSErrCodeStreamWrongLastSequence {
				t.Fatalf("a second decision with expected last subject sequence 0: %v, want the stream to refuse it", err)
			}
			return 0
		}},
		{"stored second decision", func(t *testing.T, js jetstream.JetStream, m *nats.Msg) uint64 {
			ack, err := js.PublishMsg(testCtx(t), m)
			if err != nil {
				t.Fatal(err)
			}
			return ack.Sequence
		}},
		{"republish lost", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ns := testenv.Server(t)
			b, _ := brokertest.Run(t, testenv.Conn(t, ns), broker.Config{})
			log, logged := observed(t)
			r := newRecorder("slack")
			brokertest.RunChannel(t, testenv.Conn(t, ns), handler.ChannelConfig{Channel: "slack", Principals: []string{"alice"}, Logger: log}, r)
			// The agent reaches NATS through a proxy the test takes down.
			proxy := clustertest.NewProxy(t, "agent", ns.Addr().String())
			agentNC, err := nats.Connect(proxy.URL(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(agentNC.Close)
			c, err := handler.NewClient(agentNC, handler.Config{Agent: "victim", Logger: testenv.Logger(t)})
			if err != nil {
				t.Fatal(err)
			}
			nc := testenv.Conn(t, ns)
			js, err := jetstream.New(nc)
			if err != nil {
				t.Fatal(err)
			}

			id := events.NewID()
			stored, decided := tapDecision(t, nc, id)
			req := handler.Request{ID: id, Requested: events.Requested{Tool: "rm", Args: json.RawMessage(`{"path":"/tmp/x"}`), Timeout: events.Duration(time.Minute)}}
			_, answer := brokertest.Ask(t, c, req)
			rec := waitPending(t, b, id)
			r.wait(t, "notified", func() bool { return len(r.notices[id]) == 1 })

			// Decided while the agent is away: it misses the server's copy.
			proxy.Down()
			waitConnected(t, agentNC, false)
			if _, err := b.Respond(testCtx(t), "alice", id, events.Responded{Decision: events.Deny, Reason: "real"}); err != nil {
				t.Fatal(err)
			}
			first := firstSeq(t, js, id)
			if err := proxy.Up(); err != nil {
				t.Fatal(err)
			}
			waitConnected(t, agentNC, true)
			if err := agentNC.Flush(); err != nil { // its subscriptions are back
				t.Fatal(err)
			}

			last := first
			if tc.publish != nil {
				m := conflicting(t, rec)
				if seq := tc.publish(t, js, m); seq != 0 {
					last = seq
				}
				// A plain subscriber on the stored subject sees it, stored
				// or not.
				for {
					if e := nextEvent(t, stored); e.Source() == "broker/evil" {
						break
					}
				}
			}
			if last != first {
				// Its copy says it is not the first on its subject.
				for {
					m := next(t, decided)
					if m.Header.Get(events.SequenceHeader) != strconv.FormatUint(last, 10) {
						continue
					}
					if got := m.Header.Get(events.LastSequenceHeader); got != strconv.FormatUint(first, 10) {
						t.Fatalf("the stored second decision's copy has %s %q, want %d", events.LastSequenceHeader, got, first)
					}
					break
				}
			}

			denial := func(what string, d handler.Decision) {
				t.Helper()
				if d.Outcome != events.Denied || d.Reason != "real" || string(d.Args) != `{"path":"/tmp/x"}` {
					t.Fatalf("%s: %s %q with args %s, want the broker's denial", what, d.Outcome, d.Reason, d.Args)
				}
			}
			denial("Request", brokertest.Decision(t, answer))
			d, ok, err := c.Decision(testCtx(t), id)
			if err != nil || !ok {
				t.Fatalf("Decision: %+v %v %v", d, ok, err)
			}
			denial("Decision", d)
			d, err = c.Request(testCtx(t), req)
			if err != nil {
				t.Fatal(err)
			}
			denial("a retry by id", d)

			// The channel resolved the request with the denial, and has
			// handled every stored decision of it.
			r.wait(t, "resolved", func() bool { return len(r.outcomes[id]) > 0 })
			if last != first {
				logged("ignoring a decided event that is not the first on its subject")
			}
			caughtUp(t, js, "channel-slack-resolve", last)
			r.mu.Lock()
			defer r.mu.Unlock()
			for _, o := range r.outcomes[id] {
				denial("the channel", o.Decision)
			}
			if got := lastSeqOf(t, js, id); got != last {
				t.Fatalf("the decision subject's last message is %d, want %d", got, last)
			}
		})
	}
}

// tapDecision subscribes plainly to request id's stored decision subject and
// to the server's copies of what it stored there.
func tapDecision(t *testing.T, nc *nats.Conn, id string) (stored, decided *nats.Subscription) {
	t.Helper()
	stored, err := nc.SubscribeSync(events.DecisionPrefix + id)
	if err != nil {
		t.Fatal(err)
	}
	if decided, err = nc.SubscribeSync(events.DecidedPrefix + id); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return stored, decided
}

// next returns the next message of sub, failing after patience.
func next(t *testing.T, sub *nats.Subscription) *nats.Msg {
	t.Helper()
	m, err := sub.NextMsg(patience)
	if err != nil {
		t.Fatalf("%s: %v", sub.Subject, err)
	}
	return m
}

// nextEvent is next, decoded.
func nextEvent(t *testing.T, sub *nats.Subscription) events.Event {
	t.Helper()
	m := next(t, sub)
	e, err := events.Decode(events.Header(m.Header), m.Data)
	if err != nil {
		t.Fatalf("%s: %v", sub.Subject, err)
	}
	return e
}

// conflicting is an approval of request rec with the digests an agent
// checks right and no signature, as a message without a subject.
func conflicting(t *testing.T, rec broker.Record) *nats.Msg {
	t.Helper()
	d := events.Decided{RequestID: rec.ID, Outcome: events.Approved, Reason: "forged", Args: rec.Request.Args,
		DecidedAt: time.Now().UTC(), RequestDigest: rec.RequestDigest}
	var err error
	if d.ArgsDigest, err = events.ArgsDigest(d.Args); err != nil {
		t.Fatal(err)
	}
	e, err := events.New(events.TypeDecided, "", "broker/evil", d)
	if err != nil {
		t.Fatal(err)
	}
	h, body, err := events.Encode(&e)
	if err != nil {
		t.Fatal(err)
	}
	return &nats.Msg{Subject: events.DecisionPrefix + rec.ID, Header: nats.Header(h), Data: body}
}

// waitConnected waits until nc is connected, or not.
func waitConnected(t *testing.T, nc *nats.Conn, connected bool) {
	t.Helper()
	for deadline := time.Now().Add(patience); nc.IsConnected() != connected; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("connection %s, want connected %v", nc.Status(), connected)
		}
	}
}

// firstSeq waits until the stream holds a decision of request id, and
// returns the sequence of the first.
func firstSeq(t *testing.T, js jetstream.JetStream, id string) uint64 {
	t.Helper()
	s, err := js.Stream(testCtx(t), events.StreamName)
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(patience); ; time.Sleep(10 * time.Millisecond) {
		m, err := s.GetMsg(testCtx(t), 1, jetstream.WithGetMsgSubject(events.DecisionPrefix+id))
		if err == nil {
			return m.Sequence
		}
		if !errors.Is(err, jetstream.ErrMsgNotFound) || time.Now().After(deadline) {
			t.Fatalf("first decision of %s: %v", id, err)
		}
	}
}

// lastSeqOf returns the sequence of the last message stored on request id's
// decision subject.
func lastSeqOf(t *testing.T, js jetstream.JetStream, id string) uint64 {
	t.Helper()
	s, err := js.Stream(testCtx(t), events.StreamName)
	if err != nil {
		t.Fatal(err)
	}
	m, err := s.GetLastMsgForSubject(testCtx(t), events.DecisionPrefix+id)
	if err != nil {
		t.Fatal(err)
	}
	return m.Sequence
}

// caughtUp waits until the stream's consumer name has delivered and had
// acknowledged everything up to sequence seq.
func caughtUp(t *testing.T, js jetstream.JetStream, name string, seq uint64) {
	t.Helper()
	for deadline := time.Now().Add(patience); ; time.Sleep(20 * time.Millisecond) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		info, err := js.Consumer(ctx, events.StreamName, name)
		var ci *jetstream.ConsumerInfo
		if err == nil {
			ci, err = info.Info(ctx)
		}
		cancel()
		if err == nil && ci.Delivered.Stream >= seq && ci.NumAckPending == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("consumer %s: %+v %v, want everything up to %d handled", name, ci, err, seq)
		}
	}
}
