package handler_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/assent-dev/assent/internal/broker"
	"github.com/assent-dev/assent/internal/brokertest"
	"github.com/assent-dev/assent/internal/testenv"
	"github.com/assent-dev/assent/pkg/events"
	"github.com/assent-dev/assent/pkg/handler"
)

// signingBroker runs a broker that signs its decisions with a new key, and
// returns it with the key's public key.
func signingBroker(t *testing.T, ns *testenv.NATS, cfg broker.Config) (*broker.Broker, string) {
	t.Helper()
	key, err := events.NewDecisionKey()
	if err != nil {
		t.Fatal(err)
	}
	cfg.DecisionKey = key
	b, _ := brokertest.Run(t, testenv.Conn(t, ns), cfg)
	pub, _ := key.PublicKey()
	return b, pub
}

// trustingClient is an agent's client that trusts keys.
func trustingClient(t *testing.T, ns *testenv.NATS, agent string, keys ...string) *handler.Client {
	t.Helper()
	c, err := handler.NewClient(testenv.Conn(t, ns), handler.Config{Agent: agent, TrustedKeys: keys, Logger: testenv.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// waitPending polls b until request id is pending.
func waitPending(t *testing.T, b *broker.Broker, id string) broker.Record {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		rec, err := b.Get(context.Background(), id)
		if err == nil && rec.State == broker.StatePending {
			return rec
		}
		if time.Now().After(deadline) {
			t.Fatalf("request %s is not pending: %s %v", id, rec.State, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// forge publishes on request rec's decision subject an unsigned approval of
// args, with the digests an agent checks right: what any client on an open
// NATS server can do.
func forge(t *testing.T, nc *nats.Conn, rec broker.Record, args string) {
	t.Helper()
	d := events.Decided{RequestID: rec.ID, Outcome: events.Approved, Reason: "forged", Args: json.RawMessage(args),
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
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.PublishMsg(testCtx(t), &nats.Msg{Subject: events.DecisionPrefix + rec.ID, Header: nats.Header(h), Data: body}); err != nil {
		t.Fatal(err)
	}
}

// observed is a logger that keeps warnings, and a func that waits until one
// with message msg was logged.
func observed(t *testing.T) (*zap.Logger, func(msg string)) {
	core, logs := observer.New(zap.WarnLevel)
	return zap.New(core), func(msg string) {
		t.Helper()
		for deadline := time.Now().Add(20 * time.Second); logs.FilterMessage(msg).Len() == 0; time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("no %q logged", msg)
			}
		}
	}
}

// TestClientRefusesForgedDecision: a client that trusts the broker's key
// skips a forged decision published before the broker's, keeps waiting, and
// gets the broker's; Decision does not take the forgery for a decision.
func TestClientRefusesForgedDecision(t *testing.T) {
	ns := testenv.Server(t)
	b, pub := signingBroker(t, ns, broker.Config{})
	c := trustingClient(t, ns, "victim", pub)
	id, decided := brokertest.Ask(t, c, handler.Request{Requested: events.Requested{Tool: "rm", Args: json.RawMessage(`{"path":"/tmp/x"}`), Timeout: events.Duration(time.Minute)}})
	rec := waitPending(t, b, id)

	forge(t, testenv.Conn(t, ns), rec, `{"path":"/"}`)
	if d, ok, err := c.Decision(testCtx(t), id); err != nil || ok {
		t.Fatalf("Decision with only a forgery stored: %+v %v %v", d, ok, err)
	}
	if _, err := b.Respond(testCtx(t), "alice", id, events.Responded{Decision: events.Deny, Reason: "no"}); err != nil {
		t.Fatal(err)
	}
	d := brokertest.Decision(t, decided)
	if d.Outcome != events.Denied || d.Reason != "no" || string(d.Args) != `{"path":"/tmp/x"}` {
		t.Fatalf("Request returned %s %q with args %s, want the broker's denial", d.Outcome, d.Reason, d.Args)
	}
	// The live copy can reach a subscriber a moment before the stream
	// serves the stored one: read until it does.
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		d, ok, err := c.Decision(testCtx(t), id)
		if err != nil || (ok && d.Outcome != events.Denied) {
			t.Fatalf("Decision: %+v %v %v", d, ok, err)
		}
		if ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("Decision: the broker's signed decision not found after 20s")
		}
	}
}

// TestClientKeyRotation: a broker signs with key A; clients trusting A and B
// accept its decisions, and still do once the broker restarts with key B;
// a client trusting only B refuses A's decisions and takes B's.
func TestClientKeyRotation(t *testing.T) {
	ns := testenv.Server(t)
	keyA, _ := events.NewDecisionKey()
	keyB, _ := events.NewDecisionKey()
	pubA, _ := keyA.PublicKey()
	pubB, _ := keyB.PublicKey()
	both := trustingClient(t, ns, "rotating", pubA, pubB)
	onlyB := trustingClient(t, ns, "rotating", pubB)
	ask := func(c *handler.Client) string {
		t.Helper()
		id, decided := brokertest.Ask(t, c, handler.Request{Requested: events.Requested{Tool: "ls", Timeout: events.Duration(time.Minute)}})
		if d := brokertest.Decision(t, decided); !d.Approved() {
			t.Fatalf("%s: %+v", id, d)
		}
		return id
	}

	_, stopA := brokertest.Run(t, testenv.Conn(t, ns), broker.Config{Name: "a", Mode: broker.ModeAutoApprove, DecisionKey: keyA})
	byA := ask(both)
	stopA()
	brokertest.Run(t, testenv.Conn(t, ns), broker.Config{Name: "b", Mode: broker.ModeAutoApprove, DecisionKey: keyB, TrustedDecisionKeys: []string{pubA}})
	byB := ask(both)
	ask(onlyB)

	for _, id := range []string{byA, byB} {
		if d, ok, err := both.Decision(testCtx(t), id); err != nil || !ok || !d.Approved() {
			t.Fatalf("trusting A and B, %s: %+v %v %v", id, d, ok, err)
		}
	}
	if d, ok, err := onlyB.Decision(testCtx(t), byB); err != nil || !ok || !d.Approved() {
		t.Fatalf("trusting B, B's decision: %+v %v %v", d, ok, err)
	}
	if d, ok, err := onlyB.Decision(testCtx(t), byA); err != nil || ok {
		t.Fatalf("trusting B, A's decision was taken: %+v %v %v", d, ok, err)
	}
}

// TestApproverIgnoresForgedDecision: an approver runtime that trusts the
// broker's key keeps offering a request whose decision subject holds a
// forgery; its answer decides.
func TestApproverIgnoresForgedDecision(t *testing.T) {
	ns := testenv.Server(t)
	b, pub := signingBroker(t, ns, broker.Config{})
	log, logged := observed(t)
	started, release := make(chan string, 1), make(chan struct{})
	brokertest.RunApprover(t, testenv.Conn(t, ns), handler.ApproverConfig{Principal: "alice", Channel: "test", TrustedKeys: []string{pub}, Logger: log},
		func(ctx context.Context, req handler.Request) (handler.Response, error) {
			started <- req.ID
			select {
			case <-release:
			case <-ctx.Done():
				return handler.Response{}, ctx.Err()
			}
			return handler.Response{Decision: events.Approve, Reason: "real"}, nil
		})
	c := trustingClient(t, ns, "victim", pub)
	id, decided := brokertest.Ask(t, c, handler.Request{Requested: events.Requested{Tool: "rm", Args: json.RawMessage(`{"path":"/tmp/x"}`), Timeout: events.Duration(time.Minute)}})
	select {
	case got := <-started:
		if got != id {
			t.Fatalf("offered %s, want %s", got, id)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the request was never offered")
	}
	forge(t, testenv.Conn(t, ns), waitPending(t, b, id), `{"path":"/"}`)
	logged("ignoring a decided event that no trusted key signed")
	close(release)
	if d := brokertest.Decision(t, decided); !d.Approved() || d.Reason != "real" || string(d.Args) != `{"path":"/tmp/x"}` {
		t.Fatalf("decision %+v", d)
	}
}

// TestChannelIgnoresForgedDecision: a channel runtime that trusts the
// broker's key does not resolve a request with a forged decision; the
// broker's resolves it.
func TestChannelIgnoresForgedDecision(t *testing.T) {
	ns := testenv.Server(t)
	b, pub := signingBroker(t, ns, broker.Config{})
	log, logged := observed(t)
	r := newRecorder("slack")
	ch, _ := brokertest.RunChannel(t, testenv.Conn(t, ns), handler.ChannelConfig{Channel: "slack", Principals: []string{"alice"}, TrustedKeys: []string{pub}, Logger: log}, r)
	c := trustingClient(t, ns, "victim", pub)
	id, decided := ask(t, c, events.Requested{Tool: "rm", Args: json.RawMessage(`{"path":"/tmp/x"}`), Timeout: events.Duration(time.Minute)})
	r.wait(t, "notified", func() bool { return len(r.notices[id]) == 1 })

	forge(t, testenv.Conn(t, ns), waitPending(t, b, id), `{"path":"/"}`)
	logged("ignoring a decided event that no trusted key signed")
	if err := ch.Answer(testCtx(t), "alice", id, handler.Response{Decision: events.Deny, Reason: "real"}); err != nil {
		t.Fatal(err)
	}
	if d := brokertest.Decision(t, decided); d.Outcome != events.Denied {
		t.Fatalf("decision %+v", d)
	}
	r.wait(t, "resolved", func() bool { return len(r.outcomes[id]) > 0 })
	r.mu.Lock()
	defer r.mu.Unlock()
	if o := r.outcomes[id][0]; o.Decision.Outcome != events.Denied || o.Decision.Reason != "real" {
		t.Fatalf("resolved with %s %q, want the broker's denial", o.Decision.Outcome, o.Decision.Reason)
	}
}

// TestTrustedKeysChecked: a key that is not an account public key is a
// configuration error for every runtime.
func TestTrustedKeysChecked(t *testing.T) {
	nc := testenv.Conn(t, testenv.Server(t))
	bad := []string{"UAB2CB576PHBBPQ5ODORRZ2LYCMWPZGWGCN2KDK7DXOIMZASKUY3QPZV"}
	if _, err := handler.NewClient(nc, handler.Config{Agent: "a", TrustedKeys: bad}); err == nil {
		t.Error("NewClient took a bad key")
	}
	if _, err := handler.NewApprover(nc, handler.ApproverConfig{Principal: "p", TrustedKeys: bad}, func(context.Context, handler.Request) (handler.Response, error) {
		return handler.Response{}, handler.ErrSkip
	}); err == nil {
		t.Error("NewApprover took a bad key")
	}
	if _, err := handler.NewChannel(nc, handler.ChannelConfig{Channel: "c", TrustedKeys: bad}, newRecorder("c")); err == nil {
		t.Error("NewChannel took a bad key")
	}
}
