package broker_test

import (
	"encoding/json"
	"errors"
	"slices"
	"strconv"
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

// publishRequest publishes req as request id on its agent's request subject
// with Nats-Msg-Id msgID: a new message for the stream, as the same request
// asked again after the duplicate window would be.
func publishRequest(t *testing.T, js jetstream.JetStream, id, msgID string, req events.Requested) {
	t.Helper()
	e, err := events.New(events.TypeRequested, id, "agent/"+req.Agent, req)
	if err != nil {
		t.Fatal(err)
	}
	h, body, err := events.Encode(&e)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.PublishMsg(tctx(t), &nats.Msg{Subject: events.RequestPrefix + req.Agent, Header: nats.Header(h), Data: body}, jetstream.WithMsgID(msgID)); err != nil {
		t.Fatal(err)
	}
}

// requestsHandled waits until the brokers' requests consumer has handled
// every request message stored.
func requestsHandled(t *testing.T, js jetstream.JetStream) {
	t.Helper()
	requests, err := js.Consumer(tctx(t), events.StreamName, broker.ConsumerRequests)
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(patience); ; time.Sleep(20 * time.Millisecond) {
		info, err := requests.Info(tctx(t))
		if err != nil {
			t.Fatal(err)
		}
		if info.NumAckPending == 0 && info.NumPending == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("request messages not handled: %+v", info)
		}
	}
}

// TestAutomaticDecisionReadBack: a request the policy decides at once has one
// decided event; reading it by id gives the request with that decision, on
// this broker and on one started after it, and answers, cancels and the
// request asked again change nothing.
func TestAutomaticDecisionReadBack(t *testing.T) {
	ns := testenv.Server(t)
	nc := testenv.Conn(t, ns)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	b, stop := brokertest.Run(t, testenv.Conn(t, ns), broker.Config{Name: "a", Mode: broker.ModeAutoApprove})
	client, err := handler.NewClient(nc, handler.Config{Agent: "auto"})
	if err != nil {
		t.Fatal(err)
	}
	req := handler.Request{ID: events.NewID(), Requested: events.Requested{Tool: "ls", Args: json.RawMessage(`{"dir":"/srv"}`), Session: "s1", Timeout: events.Duration(time.Minute)}}
	d, err := client.Request(tctx(t), req)
	if err != nil || !d.Approved() {
		t.Fatalf("decision %+v, %v", d, err)
	}
	if n := countMsgs(t, js, events.DecisionPrefix+req.ID); n != 1 {
		t.Fatalf("%d messages on the decision subject, want 1", n)
	}
	check := func(b *broker.Broker, who string) {
		t.Helper()
		rec, err := b.Get(tctx(t), req.ID)
		if err != nil {
			t.Fatalf("%s: %v", who, err)
		}
		if rec.State != broker.StateApproved || rec.Decision == nil || !rec.Decision.Auto || rec.Decision.DecidedAt != d.DecidedAt {
			t.Fatalf("%s reads %s with %+v, the agent got %+v", who, rec.State, rec.Decision, d)
		}
		if rec.Request.Tool != "ls" || rec.Request.Agent != "auto" || rec.Request.Session != "s1" || string(rec.Request.Args) != `{"dir":"/srv"}` {
			t.Fatalf("%s reads request %+v", who, rec.Request)
		}
		if rec.ReceivedAt.IsZero() || !rec.Deadline.Equal(rec.ReceivedAt.Add(time.Minute)) {
			t.Fatalf("%s reads received %s, deadline %s", who, rec.ReceivedAt, rec.Deadline)
		}
	}
	check(b, "the broker that decided")
	if _, err := b.Respond(tctx(t), "alice", req.ID, events.Responded{Decision: events.Deny}); !errors.Is(err, broker.ErrAlreadyDecided) {
		t.Fatalf("an answer to a request decided at once: %v, want ErrAlreadyDecided", err)
	}
	stop()
	b2, _ := brokertest.Run(t, testenv.Conn(t, ns), broker.Config{Name: "b", Mode: broker.ModeAutoApprove})
	check(b2, "a broker started after it")
	if _, err := b2.Cancel(tctx(t), req.ID, "ops", "late"); !errors.Is(err, broker.ErrAlreadyDecided) {
		t.Fatalf("a cancel of a request decided at once: %v, want ErrAlreadyDecided", err)
	}
	again, err := client.Request(tctx(t), req)
	if err != nil || again.DecidedAt != d.DecidedAt {
		t.Fatalf("the request asked again got %+v (%v), the first time %+v", again, err, d)
	}
}

// TestCrashAfterAutomaticDecision kills a broker right after it published a
// decision it made at once and before it acknowledged the request: the
// request comes back to another broker, which finds it decided and decides
// nothing more. The request published again (a new message, as after the
// duplicate window) and a different request under its id get no second
// decision either; the agent learns of the conflict.
func TestCrashAfterAutomaticDecision(t *testing.T) {
	ns := testenv.Server(t)
	check := testenv.Conn(t, ns)
	js, err := jetstream.New(check)
	if err != nil {
		t.Fatal(err)
	}
	_, crashed := crashing(t, ns, broker.Config{Name: "a", Mode: broker.ModeAutoApprove}, (*broker.Broker).SetPublishHook)

	id := events.NewID()
	asked := events.Requested{Tool: "rm", Args: []byte(`{"path":"/tmp/x"}`), Agent: "crasher", Timeout: events.Duration(time.Minute)}
	publishEvent(t, js, events.RequestPrefix+"crasher", events.TypeRequested, "agent/crasher", asked, id)
	select {
	case got := <-crashed:
		if got != id {
			t.Fatalf("crashed after deciding %s, want %s", got, id)
		}
	case <-time.After(patience):
		t.Fatal("broker a never published the decision")
	}
	first, ok := firstDecision(t, js, id)
	if !ok {
		t.Fatal("no decision on the stream")
	}

	// The second broker runs a policy under which the request would wait
	// for a person: it must find the decision, not start a second life.
	p, err := policy.Parse([]byte("version: 1\nmode: manual\n"), "manual.yaml")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := brokertest.Run(t, testenv.Conn(t, ns), broker.Config{Name: "b", Policy: p})
	requestsHandled(t, js)
	rec, err := b.Get(tctx(t), id)
	if err != nil {
		t.Fatal(err)
	}
	if rec.State != broker.StateApproved || rec.Decision.DecidedAt != first.DecidedAt {
		t.Fatalf("after the crash the request reads %s (%+v), the stream decided %+v", rec.State, rec.Decision, first)
	}

	// The same request as a new message, beyond the duplicate window: the
	// decision stands, and nothing starts waiting.
	conflicts, err := check.SubscribeSync(events.RejectionPrefix + id)
	if err != nil {
		t.Fatal(err)
	}
	if err := check.Flush(); err != nil { // the server has the subscription before anything is published
		t.Fatal(err)
	}
	publishRequest(t, js, id, "again-"+id, asked)
	other := asked
	other.Args = []byte(`{"path":"/etc"}`)
	publishRequest(t, js, id, "other-"+id, other)
	m, err := conflicts.NextMsg(patience)
	if err != nil {
		t.Fatalf("the different request under a decided id got no rejection: %v", err)
	}
	e, err := events.Decode(events.Header(m.Header), m.Data)
	if err != nil {
		t.Fatal(err)
	}
	if r, err := events.DecodeRejected(&e); err != nil || r.Code != events.RejectIDConflict {
		t.Fatalf("rejection %+v (%v), want an id conflict", r, err)
	}
	time.Sleep(500 * time.Millisecond) // let anything more arrive
	if n := countMsgs(t, js, events.DecisionPrefix+id); n != 1 {
		t.Fatalf("%d decisions for %s, want 1", n, id)
	}
	if rec, err := b.Get(tctx(t), id); err != nil || rec.State != broker.StateApproved || b.Pending() != 0 {
		t.Fatalf("%d pending, the request reads %s (%v): the request asked again started waiting", b.Pending(), rec.State, err)
	}
}

// TestPendingAfterAutomaticDecision: a request decided at once is published
// again (a new message) while the policy now asks a person; the new message
// finds the decision and records it instead of waiting, and the agent that
// asks again gets the first decision.
func TestPendingAfterAutomaticDecision(t *testing.T) {
	ns := testenv.Server(t)
	nc := testenv.Conn(t, ns)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	a, stop := brokertest.Run(t, testenv.Conn(t, ns), broker.Config{Name: "a", Mode: broker.ModeAutoApprove})
	rec, err := a.Submit(tctx(t), "", "agent/t", events.Requested{Agent: "t", Tool: "deploy"})
	if err != nil || rec.State != broker.StateApproved {
		t.Fatalf("%s %v", rec.State, err)
	}
	// Newer decisions, so that b, keeping only the newest in its index,
	// does not know rec's.
	for range 3 {
		if _, err := a.Submit(tctx(t), "", "agent/t", events.Requested{Agent: "t", Tool: "other"}); err != nil {
			t.Fatal(err)
		}
	}
	stop()
	b, _ := brokertest.Run(t, testenv.Conn(t, ns), broker.Config{Name: "b", KeepDecided: 1}) // manual mode
	// A listing waits for b to read the stream for decisions made at
	// once; keeping only the newest, b then does not know rec's.
	if _, err := b.List(tctx(t), broker.Filter{Decided: true}); err != nil {
		t.Fatal(err)
	}
	if b.Knows(rec.ID) {
		t.Fatal("b's index holds the decision; the test needs one it does not know")
	}
	publishRequest(t, js, rec.ID, "later-"+rec.ID, events.Requested{Agent: "t", Tool: "deploy"})
	// b's index does not keep the id: the new message goes the way of a
	// new request, and its announcement is refused by the stream, which
	// holds the decision.
	requestsHandled(t, js)
	got, err := b.Get(tctx(t), rec.ID)
	if err != nil || got.State != broker.StateApproved || got.Decision.DecidedAt != rec.Decision.DecidedAt {
		t.Fatalf("the state records %s %+v (%v), the first decision was %+v", got.State, got.Decision, err, rec.Decision)
	}
	// (A plain subscriber would see the refused announcement: the stream
	// holds none.)
	if n := countMsgs(t, js, events.PendingPrefix+"t"); n != 0 {
		t.Fatalf("a decided request was announced as pending: %d stored", n)
	}
	if b.Pending() != 0 || countMsgs(t, js, events.DecisionPrefix+rec.ID) != 1 {
		t.Fatalf("%d pending, %d decisions", b.Pending(), countMsgs(t, js, events.DecisionPrefix+rec.ID))
	}
}

// TestListingsShowDecisionsMadeAtOnce: listings of decided requests show
// the decisions made at once: those of another replica, and after a restart
// a replica's own.
func TestListingsShowDecisionsMadeAtOnce(t *testing.T) {
	ns := testenv.Server(t)
	a, stopA := brokertest.Run(t, testenv.Conn(t, ns), broker.Config{Name: "a", Mode: broker.ModeAutoApprove})
	b, _ := brokertest.Run(t, testenv.Conn(t, ns), broker.Config{Name: "b", Mode: broker.ModeAutoApprove})
	var ids []string
	for i := range 5 {
		rec, err := a.Submit(tctx(t), "", "agent/lister", events.Requested{Agent: "lister", Tool: "ls", Session: "s" + strconv.Itoa(i)})
		if err != nil || rec.State != broker.StateApproved {
			t.Fatalf("%s %v", rec.State, err)
		}
		ids = append(ids, rec.ID)
	}
	// listed checks x's listing; another replica's index follows the
	// bucket through its watcher, so it may take a moment (within).
	listed := func(x *broker.Broker, who string, within time.Duration) {
		t.Helper()
		deadline := time.Now().Add(within)
		for {
			page, err := x.List(tctx(t), broker.Filter{Decided: true, Agent: "lister"})
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, r := range page.Records {
				if r.Request.Tool != "ls" || r.Decision == nil || !r.Decision.Auto {
					t.Fatalf("%s lists %+v", who, r)
				}
				got = append(got, r.ID)
			}
			slices.Reverse(got) // newest first
			if slices.Equal(got, ids) && page.Total == len(ids) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s lists %v (total %d), want %v", who, got, page.Total, ids)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	listed(a, "the replica that decided", 0)
	listed(b, "another replica", 5*time.Second)
	stopA()
	restarted, _ := brokertest.Run(t, testenv.Conn(t, ns), broker.Config{Name: "a", Mode: broker.ModeAutoApprove})
	listed(restarted, "the replica that decided, restarted", 0)
}
