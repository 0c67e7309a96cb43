package handler_test

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/assent-dev/assent/internal/broker"
	"github.com/assent-dev/assent/internal/brokertest"
	"github.com/assent-dev/assent/internal/testenv"
	"github.com/assent-dev/assent/pkg/events"
	"github.com/assent-dev/assent/pkg/handler"
)

// runBroker runs a broker on nc and returns a func that stops it and waits.
func runBroker(t *testing.T, nc *nats.Conn, cfg broker.Config) func() {
	t.Helper()
	_, stop := brokertest.Run(t, nc, cfg)
	return stop
}

// runApprover runs an approver runtime with h until the test ends.
func runApprover(t *testing.T, nc *nats.Conn, principal string, h handler.Handler) {
	t.Helper()
	brokertest.RunApprover(t, nc, handler.ApproverConfig{Principal: principal, Channel: "test"}, h)
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestApproverEditsArgs(t *testing.T) {
	ns := testenv.Server(t)
	runBroker(t, testenv.Conn(t, ns), broker.Config{})
	runApprover(t, testenv.Conn(t, ns), "alice", func(_ context.Context, req handler.Request) (handler.Response, error) {
		if req.Tool != "delete_file" || req.Deadline.IsZero() {
			return handler.Response{}, handler.Permanent(errors.New("unexpected request"))
		}
		return handler.Response{Decision: events.Approve, Reason: "only the draft", Args: json.RawMessage(`{"path":"/srv/q3-draft.csv"}`)}, nil
	})
	c, err := handler.NewClient(testenv.Conn(t, ns), handler.Config{Agent: "file-manager"})
	if err != nil {
		t.Fatal(err)
	}
	d, err := c.Request(testCtx(t), handler.Request{Requested: events.Requested{Tool: "delete_file", Args: json.RawMessage(`{"path":"/srv/q3.csv"}`), Timeout: events.Duration(20 * time.Second)}})
	if err != nil {
		t.Fatal(err)
	}
	if !d.Approved() || !d.Edited || string(d.Args) != `{"path":"/srv/q3-draft.csv"}` || d.Reason != "only the draft" {
		t.Fatalf("decision %+v", d)
	}
	if len(d.DecidedBy) != 1 || d.DecidedBy[0].Principal != "alice" || d.DecidedBy[0].Channel != "test" {
		t.Fatalf("decided by %+v", d.DecidedBy)
	}
}

func TestDenyReasonAndSkip(t *testing.T) {
	ns := testenv.Server(t)
	runBroker(t, testenv.Conn(t, ns), broker.Config{})
	var skipped atomic.Int32
	runApprover(t, testenv.Conn(t, ns), "bob", func(context.Context, handler.Request) (handler.Response, error) {
		skipped.Add(1)
		return handler.Response{}, handler.ErrSkip
	})
	runApprover(t, testenv.Conn(t, ns), "carol", func(context.Context, handler.Request) (handler.Response, error) {
		return handler.Response{Decision: events.Deny, Reason: "not on a Friday"}, nil
	})
	c, _ := handler.NewClient(testenv.Conn(t, ns), handler.Config{Agent: "deployer"})
	d, err := c.Request(testCtx(t), handler.Request{Requested: events.Requested{Tool: "deploy", Timeout: events.Duration(20 * time.Second)}})
	if err != nil {
		t.Fatal(err)
	}
	if d.Approved() || d.Outcome != events.Denied || d.Reason != "not on a Friday" {
		t.Fatalf("decision %+v", d)
	}
}

func TestCancelOnContext(t *testing.T) {
	ns := testenv.Server(t)
	runBroker(t, testenv.Conn(t, ns), broker.Config{})
	c, _ := handler.NewClient(testenv.Conn(t, ns), handler.Config{Agent: "a1"})
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	id := events.NewID()
	_, err := c.Request(ctx, handler.Request{ID: id, Requested: events.Requested{Tool: "rm", Timeout: events.Duration(time.Minute)}})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err %v, want deadline exceeded", err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		d, ok, err := c.Decision(testCtx(t), id)
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			if d.Outcome != events.Cancelled {
				t.Fatalf("outcome %s", d.Outcome)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no cancelled decision")
		}
	}
	// Asking again with the same id returns the stored decision at once.
	d, err := c.Request(testCtx(t), handler.Request{ID: id, Requested: events.Requested{Tool: "rm"}})
	if err != nil || d.Outcome != events.Cancelled {
		t.Fatalf("retry: %+v, %v", d, err)
	}
}

// TestCancelReasonIsCause: a caller that stops waiting with a cause
// (context.WithCancelCause) has that cause recorded as the cancel's reason.
func TestCancelReasonIsCause(t *testing.T) {
	ns := testenv.Server(t)
	nc := testenv.Conn(t, ns)
	b, _ := brokertest.Run(t, nc, broker.Config{})
	c, _ := handler.NewClient(testenv.Conn(t, ns), handler.Config{Agent: "a1"})
	ctx, cancel := context.WithCancelCause(context.Background())
	id := events.NewID()
	done := make(chan error, 1)
	go func() {
		_, err := c.Request(ctx, handler.Request{ID: id, Requested: events.Requested{Tool: "rm", Timeout: events.Duration(time.Minute)}})
		done <- err
	}()
	waitPending(t, b, id)
	cancel(errors.New("user pressed stop"))
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("err %v, want context.Canceled", err)
	}
	d, err := c.Request(testCtx(t), handler.Request{ID: id, Requested: events.Requested{Tool: "rm", Timeout: events.Duration(time.Minute)}})
	if err != nil || d.Outcome != events.Cancelled || d.Reason != "requester stopped waiting: user pressed stop" {
		t.Fatalf("decision %+v, %v; want cancelled with the cause as its reason", d, err)
	}
}

// TestKeepOnContext: a request asked with Keep stays pending when its
// caller stops waiting; asking again with the same id, as an agent does
// after a restart, returns the decision made meanwhile.
func TestKeepOnContext(t *testing.T) {
	ns := testenv.Server(t)
	nc := testenv.Conn(t, ns)
	b, _ := brokertest.Run(t, nc, broker.Config{})
	c, _ := handler.NewClient(testenv.Conn(t, ns), handler.Config{Agent: "a1"})
	ctx, cancel := context.WithCancel(context.Background())
	id := events.NewID()
	req := handler.Request{ID: id, Keep: true, Requested: events.Requested{Tool: "rm", Timeout: events.Duration(time.Minute)}}
	done := make(chan error, 1)
	go func() {
		_, err := c.Request(ctx, req)
		done <- err
	}()
	waitPending(t, b, id)
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("err %v, want context.Canceled", err)
	}
	// No cancel was published: an approver still finds it pending.
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if err := handler.Answer(testCtx(t), js, "alice", id, events.Responded{Decision: events.Approve}); err != nil {
		t.Fatal(err)
	}
	d, err := c.Request(testCtx(t), req)
	if err != nil || d.Outcome != events.Approved {
		t.Fatalf("asked again: %+v, %v; want the approval made meanwhile", d, err)
	}
}

func TestNoBrokerMeansNoDecision(t *testing.T) {
	ns := testenv.Server(t)
	stop := runBroker(t, testenv.Conn(t, ns), broker.Config{})
	stop() // the stream stays; nobody decides
	c, _ := handler.NewClient(testenv.Conn(t, ns), handler.Config{Agent: "a1", Grace: 200 * time.Millisecond})
	_, err := c.Request(testCtx(t), handler.Request{Requested: events.Requested{Tool: "rm", Timeout: events.Duration(time.Second)}})
	if !errors.Is(err, handler.ErrNoDecision) {
		t.Fatalf("err %v, want ErrNoDecision", err)
	}
}

// TestForgedDecisionIgnored publishes decided events whose args do not match
// their digest on the request's decision subject, as a client without
// permissions could, while the request waits: the client must not accept
// them. The first of them is the first message stored there, so the broker
// cannot publish its own decision after it (it reports the forgery), and the
// client ends without a decision rather than with a forged one; Decision
// reports the stored one as tampered.
func TestForgedDecisionIgnored(t *testing.T) {
	ns := testenv.Server(t)
	runBroker(t, testenv.Conn(t, ns), broker.Config{})
	nc := testenv.Conn(t, ns)
	c, _ := handler.NewClient(nc, handler.Config{Agent: "a1", Grace: 200 * time.Millisecond})
	id := events.NewID()
	type result struct {
		d   handler.Decision
		err error
	}
	res := make(chan result, 1)
	go func() {
		d, err := c.Request(testCtx(t), handler.Request{ID: id, Requested: events.Requested{Tool: "pay", Args: json.RawMessage(`{"amount":5}`), Timeout: events.Duration(3 * time.Second)}})
		res <- result{d, err}
	}()
	digest, _ := events.ArgsDigest(json.RawMessage(`{"amount":5}`))
	otherDigest, _ := events.ArgsDigest(json.RawMessage(`{"amount":5000}`))
	requestDigest, _ := events.RequestDigest(events.Requested{Tool: "pay", Args: json.RawMessage(`{"amount":5}`), Agent: "a1"})
	forged := []events.Decided{
		{RequestID: id, Outcome: events.Approved, Args: json.RawMessage(`{"amount":5000}`), ArgsDigest: digest, DecidedAt: time.Now()},
		// The request's own args, byte for byte, under another digest.
		{RequestID: id, Outcome: events.Approved, Args: json.RawMessage(`{"amount":5}`), ArgsDigest: otherDigest, RequestDigest: requestDigest, DecidedAt: time.Now()},
	}
	subj, _ := events.DecisionSubject(id)
	for i := range 20 { // keep forging while the client waits
		e, _ := events.New(events.TypeDecided, "", "broker/evil", forged[i%len(forged)])
		h, body, _ := events.Encode(&e)
		_ = nc.PublishMsg(&nats.Msg{Subject: subj, Header: nats.Header(h), Data: body})
		time.Sleep(20 * time.Millisecond)
	}
	r := <-res
	if !errors.Is(r.err, handler.ErrNoDecision) || r.d.Approved() {
		t.Fatalf("Request returned %+v, %v; want ErrNoDecision", r.d, r.err)
	}
	if d, ok, err := c.Decision(testCtx(t), id); ok || !errors.Is(err, handler.ErrTampered) {
		t.Fatalf("Decision: %+v %v %v, want ErrTampered", d, ok, err)
	}
}

func TestConfigErrors(t *testing.T) {
	ns := testenv.Server(t)
	nc := testenv.Conn(t, ns)
	if _, err := handler.NewClient(nc, handler.Config{Agent: "bad agent"}); !errors.Is(err, events.ErrBadToken) {
		t.Fatalf("client: %v", err)
	}
	_, err := handler.NewApprover(nc, handler.ApproverConfig{Principal: "a.b", Channel: "x y", Agents: []string{"*"}}, func(context.Context, handler.Request) (handler.Response, error) {
		return handler.Response{}, nil
	})
	if !errors.Is(err, events.ErrBadToken) {
		t.Fatalf("approver: %v", err)
	}
	c, _ := handler.NewClient(nc, handler.Config{})
	if _, err := c.Request(testCtx(t), handler.Request{Requested: events.Requested{Tool: "x"}}); !errors.Is(err, events.ErrBadToken) {
		t.Fatalf("request without agent: %v", err)
	}
	if _, err := c.Request(testCtx(t), handler.Request{Requested: events.Requested{Agent: "a"}}); !errors.Is(err, events.ErrMissingTool) {
		t.Fatalf("request without tool: %v", err)
	}
}

// TestWaitsForBrokerDeadline asks with no timeout of its own: the client must
// learn the broker's deadline (2s here, not its 5 minute fallback) from the
// broker's lookup, and give up shortly after it when no broker is left to
// decide.
func TestWaitsForBrokerDeadline(t *testing.T) {
	ns := testenv.Server(t)
	stop := runBroker(t, testenv.Conn(t, ns), broker.Config{DefaultTimeout: 2 * time.Second})
	nc := testenv.Conn(t, ns)
	c, _ := handler.NewClient(nc, handler.Config{Agent: "a1", Grace: 500 * time.Millisecond})
	// Stop the broker once it told the client the request is pending (its
	// answer to the lookup, in the client's inbox), so nothing will expire
	// it.
	var once sync.Once
	tap := testenv.Conn(t, ns)
	sub, err := tap.Subscribe("_INBOX.>", func(m *nats.Msg) {
		if m.Header.Get(events.LookupStatus) == events.LookupPending {
			once.Do(func() { go stop() })
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := tap.Flush(); err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe() //nolint:errcheck
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	d, err := c.Request(ctx, handler.Request{Requested: events.Requested{Tool: "rm"}})
	if !errors.Is(err, handler.ErrNoDecision) {
		t.Fatalf("err %v, want ErrNoDecision", err)
	}
	if d.RequestID == "" || d.Approved() {
		t.Fatalf("decision %+v", d)
	}
}
