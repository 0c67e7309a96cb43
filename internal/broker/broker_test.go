package broker_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/assent-dev/assent/internal/broker"
	"github.com/assent-dev/assent/internal/brokertest"
	"github.com/assent-dev/assent/internal/testenv"
	"github.com/assent-dev/assent/pkg/events"
	"github.com/assent-dev/assent/pkg/policy"
)

// start runs a broker on nc until the test ends.
func start(t *testing.T, nc *nats.Conn, cfg broker.Config) *broker.Broker {
	t.Helper()
	b, _ := brokertest.Run(t, nc, cfg)
	return b
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

func TestAutoApprove(t *testing.T) {
	ns := testenv.Server(t)
	b := start(t, testenv.Conn(t, ns), broker.Config{Mode: broker.ModeAutoApprove})
	rec, err := b.Submit(ctx(t), "", "test/t", events.Requested{Tool: "ls", Agent: "a1", Args: json.RawMessage(`{"dir":"/tmp"}`)})
	if err != nil {
		t.Fatal(err)
	}
	if rec.State != broker.StateApproved || !rec.Decision.Auto || string(rec.Decision.Args) != `{"dir":"/tmp"}` {
		t.Fatalf("got %+v", rec)
	}
	if err := rec.Decision.VerifyArgs(); err != nil {
		t.Fatal(err)
	}
	waitDecision(t, ns, rec.ID, events.Approved)
}

func waitDecision(t *testing.T, ns *testenv.NATS, id string, want events.Outcome) events.Decided {
	t.Helper()
	js, err := jetstream.New(testenv.Conn(t, ns))
	if err != nil {
		t.Fatal(err)
	}
	s, err := js.Stream(ctx(t), broker.StreamName)
	if err != nil {
		t.Fatal(err)
	}
	subj, _ := events.DecisionSubject(id)
	for deadline := time.Now().Add(10 * time.Second); ; {
		// The decision is the first message on its subject.
		m, err := s.GetMsg(ctx(t), 1, jetstream.WithGetMsgSubject(subj))
		if err == nil {
			e, err := events.Decode(events.Header(m.Header), m.Data)
			if err != nil {
				t.Fatal(err)
			}
			d, err := events.DecodeDecided(&e)
			if err != nil {
				t.Fatal(err)
			}
			if d.Outcome != want {
				t.Fatalf("outcome %s, want %s (%+v)", d.Outcome, want, d)
			}
			return d
		}
		if time.Now().After(deadline) {
			t.Fatalf("no decision for %s: %v", id, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestManualApproveEditAndLateAnswer(t *testing.T) {
	ns := testenv.Server(t)
	b := start(t, testenv.Conn(t, ns), broker.Config{})
	rec, err := b.Submit(ctx(t), "", "test/t", events.Requested{Tool: "rm", Agent: "a1", Args: json.RawMessage(`{"path":"/a"}`)})
	if err != nil {
		t.Fatal(err)
	}
	if rec.State != broker.StatePending {
		t.Fatalf("state %s", rec.State)
	}
	got, err := b.Respond(ctx(t), "alice", rec.ID, events.Responded{Decision: events.Approve, Args: json.RawMessage(`{"path":"/b"}`)})
	if err != nil {
		t.Fatal(err)
	}
	if !got.Decision.Edited || string(got.Decision.Args) != `{"path":"/b"}` {
		t.Fatalf("decision %+v", got.Decision)
	}
	d := waitDecision(t, ns, rec.ID, events.Approved)
	if d.DecidedBy[0].Principal != "alice" {
		t.Fatalf("decided by %+v", d.DecidedBy)
	}
	if _, err := b.Respond(ctx(t), "bob", rec.ID, events.Responded{Decision: events.Deny}); !errors.Is(err, broker.ErrAlreadyDecided) {
		t.Fatalf("second answer: %v", err)
	}
}

func TestExpiry(t *testing.T) {
	ns := testenv.Server(t)
	b := start(t, testenv.Conn(t, ns), broker.Config{})
	rec, err := b.Submit(ctx(t), "", "test/t", events.Requested{Tool: "rm", Agent: "a1", Timeout: events.Duration(time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	final, err := b.Wait(ctx(t), rec.ID)
	if err != nil {
		t.Fatal(err)
	}
	if final.State != broker.StateExpired {
		t.Fatalf("state %s", final.State)
	}
	if final.Decision.DecidedAt.Before(rec.Deadline) {
		t.Fatalf("expired at %s before deadline %s", final.Decision.DecidedAt, rec.Deadline)
	}
	waitDecision(t, ns, rec.ID, events.Expired)
	if _, err := b.Respond(ctx(t), "bob", rec.ID, events.Responded{Decision: events.Approve}); !errors.Is(err, broker.ErrExpired) {
		t.Fatalf("late answer: %v", err)
	}
}

// TestGrantStoredWhenAnswerReturns: the gateway and the broker's consumer
// both apply an HTTP answer, and either may store the outcome first. Whichever
// does, the remembered choice the answer asked for is in force by the time
// Respond returns, so the agent's next request is decided by it.
// TestListingShowsOwnWrites: a listing made right after a request is taken
// or answered shows it as it now is (listings read the replica's index,
// which the state watcher alone updated a moment later).
func TestListingShowsOwnWrites(t *testing.T) {
	ns := testenv.Server(t)
	b := start(t, testenv.Conn(t, ns), broker.Config{})
	state := func(agent string, st broker.State) int {
		t.Helper()
		page, err := b.List(ctx(t), broker.Filter{Agent: agent, State: st})
		if err != nil {
			t.Fatal(err)
		}
		return len(page.Records)
	}
	for i := range 40 {
		agent := fmt.Sprintf("lister-%d", i)
		rec, err := b.Submit(ctx(t), "", "test/t", events.Requested{Tool: "deploy", Agent: agent})
		if err != nil {
			t.Fatal(err)
		}
		if n := state(agent, broker.StatePending); n != 1 {
			t.Fatalf("round %d: %d pending right after the request was taken, want 1", i, n)
		}
		if _, err := b.Respond(ctx(t), "alice", rec.ID, events.Responded{Decision: events.Approve}); err != nil {
			t.Fatal(err)
		}
		if p, a := state(agent, broker.StatePending), state(agent, broker.StateApproved); p != 0 || a != 1 {
			t.Fatalf("round %d: right after the answer, %d pending and %d approved, want 0 and 1", i, p, a)
		}
	}
}

func TestGrantStoredWhenAnswerReturns(t *testing.T) {
	ns := testenv.Server(t)
	b := start(t, testenv.Conn(t, ns), broker.Config{})
	for i := range 40 {
		session := fmt.Sprintf("s-%d", i)
		rec, err := b.Submit(ctx(t), "", "test/t", events.Requested{Tool: "write_secret", Agent: "a1", Session: session})
		if err != nil {
			t.Fatal(err)
		}
		remember := &events.Remember{Scope: events.ScopeSession, TTL: events.Duration(time.Hour)}
		if _, err := b.Respond(ctx(t), "alice", rec.ID, events.Responded{Decision: events.Deny, Reason: "never", Remember: remember}); err != nil {
			t.Fatal(err)
		}
		again, err := b.Submit(ctx(t), "", "test/t", events.Requested{Tool: "write_secret", Agent: "a1", Session: session})
		if err != nil {
			t.Fatal(err)
		}
		if again.State != broker.StateDenied || again.Decision == nil || !again.Decision.Auto {
			t.Fatalf("round %d: the request after a remembered denial is %s (%+v)", i, again.State, again.Decision)
		}
	}
}

// TestGrantsReadFromBucket: a remembered choice counts as the bucket holds
// it, not as this replica's watcher last saw it: one made elsewhere decides at
// once, one revoked elsewhere no longer does.
func TestGrantsReadFromBucket(t *testing.T) {
	ns := testenv.Server(t)
	b := start(t, testenv.Conn(t, ns), broker.Config{})
	remember := &events.Remember{Scope: events.ScopeSession, TTL: events.Duration(time.Hour)}

	rec, err := b.Submit(ctx(t), "", "test/t", events.Requested{Tool: "deploy", Agent: "a1", Session: "made-elsewhere"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Respond(ctx(t), "alice", rec.ID, events.Responded{Decision: events.Approve, Remember: remember}); err != nil {
		t.Fatal(err)
	}
	// The grant is written after the decision, and this replica's list
	// of them follows the bucket's watcher: a moment later.
	grants := b.Remembered()
	for end := time.Now().Add(5 * time.Second); len(grants) == 0 && time.Now().Before(end); grants = b.Remembered() {
		time.Sleep(10 * time.Millisecond)
	}
	if len(grants) != 1 {
		t.Fatalf("%d remembered choices, want 1", len(grants))
	}
	b.ForgetLocalGrants()
	again, err := b.Submit(ctx(t), "", "test/t", events.Requested{Tool: "deploy", Agent: "a1", Session: "made-elsewhere"})
	if err != nil {
		t.Fatal(err)
	}
	if again.State != broker.StateApproved || again.Decision == nil || !again.Decision.Auto {
		t.Fatalf("with the grant in the bucket but not in this replica's copy, the request is %s (%+v)", again.State, again.Decision)
	}

	b.KeepLocalGrant(grants[0])
	if _, err := b.Forget(ctx(t), grants[0].ID); err != nil {
		t.Fatal(err)
	}
	b.KeepLocalGrant(grants[0]) // the watcher has not seen the revocation yet
	revoked, err := b.Submit(ctx(t), "", "test/t", events.Requested{Tool: "deploy", Agent: "a1", Session: "made-elsewhere"})
	if err != nil {
		t.Fatal(err)
	}
	if revoked.State != broker.StatePending {
		t.Fatalf("after the grant was revoked in the bucket, the request is %s (%+v), want pending", revoked.State, revoked.Decision)
	}
}

// TestEveryReplicaHoldsTimers: a replica arms a timer for every pending
// request, also those another replica took, so that a request whose replica
// stops still expires from a local timer, not only from the durable schedule.
func TestEveryReplicaHoldsTimers(t *testing.T) {
	ns := testenv.Server(t)
	a, stopA := brokertest.Run(t, testenv.Conn(t, ns), broker.Config{Name: "a"})
	b := start(t, testenv.Conn(t, ns), broker.Config{Name: "b"})
	const n = 20
	var ids []string
	for i := range n {
		rec, err := a.Submit(ctx(t), "", "test/t", events.Requested{Tool: "rm", Agent: fmt.Sprintf("a%d", i), Timeout: events.Duration(3 * time.Second)})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, rec.ID)
	}
	deadline := time.Now().Add(patience)
	for a.Stats().Timers != n || b.Stats().Timers != n {
		if time.Now().After(deadline) {
			t.Fatalf("timers armed: %d on a, %d on b; want %d on each", a.Stats().Timers, b.Stats().Timers, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
	stopA()
	for _, id := range ids {
		wctx, cancel := context.WithTimeout(context.Background(), patience)
		rec, err := b.Wait(wctx, id)
		cancel()
		if err != nil || rec.State != broker.StateExpired {
			t.Fatalf("request %s: %s, %v; want expired", id, rec.State, err)
		}
	}
	if got := b.Stats().Timers; got != 0 {
		t.Fatalf("%d timers left on b after every request expired", got)
	}
}

// TestAnswerAfterAnotherReplicasVote: replica a knows a request from storing
// it; replica b records the first of two approvals; a then takes the second
// and must count b's vote, though its own copy of the record predates it.
func TestAnswerAfterAnotherReplicasVote(t *testing.T) {
	ns := testenv.Server(t)
	p, err := policy.Parse([]byte("version: 1\nmode: manual\ndefaults:\n  allow_self_approval: true\nrules:\n  - name: two\n    tools: [pay]\n    action: require_approval\n    quorum: 2\n"), "two.yaml")
	if err != nil {
		t.Fatal(err)
	}
	a := start(t, testenv.Conn(t, ns), broker.Config{Name: "a"})
	b := start(t, testenv.Conn(t, ns), broker.Config{Name: "b"})
	a.SetPolicy(p)
	b.SetPolicy(p)
	rec, err := a.Submit(ctx(t), "", "test/t", events.Requested{Tool: "pay", Agent: "a1"})
	if err != nil {
		t.Fatal(err)
	}
	voted, err := b.Respond(ctx(t), "alice", rec.ID, events.Responded{Decision: events.Approve})
	if err != nil || voted.State != broker.StatePending || len(voted.Votes) != 1 {
		t.Fatalf("first approval: %v, %s with %d votes", err, voted.State, len(voted.Votes))
	}
	final, err := a.Respond(ctx(t), "bob", rec.ID, events.Responded{Decision: events.Approve})
	if err != nil {
		t.Fatal(err)
	}
	if final.State != broker.StateApproved || len(final.Decision.DecidedBy) != 2 {
		t.Fatalf("second approval: %s by %+v, want approved by alice and bob", final.State, final.Decision.DecidedBy)
	}
	waitDecision(t, ns, rec.ID, events.Approved)
}

// TestGrantInForceWithItsDecision: a remembered choice is stored after its
// decision, yet an agent that sees the decision and asks again at once finds
// it in force on every replica: each replica's ledger notes it as it reads
// the decision. The grant's write, by every handling of the answer, is
// held back until the second requests are decided.
func TestGrantInForceWithItsDecision(t *testing.T) {
	ns := testenv.Server(t)
	a := start(t, testenv.Conn(t, ns), broker.Config{Name: "a"})
	b := start(t, testenv.Conn(t, ns), broker.Config{Name: "b"})
	rec, err := a.Submit(ctx(t), "", "test/t", events.Requested{Tool: "deploy", Agent: "a1", Session: "s-now"})
	if err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	for _, r := range []*broker.Broker{a, b} { // either may handle the answer, both may store the grant
		r.SetGrantHook(func(id string) {
			if id == rec.ID {
				<-release
			}
		})
	}
	defer close(release)
	go func() {
		_, _ = a.Respond(context.Background(), "alice", rec.ID, events.Responded{Decision: events.Approve, Remember: &events.Remember{Scope: events.ScopeSession, TTL: events.Duration(time.Hour)}})
	}()
	waitDecision(t, ns, rec.ID, events.Approved)
	if len(a.Remembered())+len(b.Remembered()) != 0 {
		t.Fatal("the grant was stored before its decision's handling went on")
	}
	for name, r := range map[string]*broker.Broker{"a": a, "b": b} {
		next, err := r.Submit(ctx(t), "", "test/t", events.Requested{Tool: "deploy", Agent: "a1", Session: "s-now"})
		if err != nil {
			t.Fatal(err)
		}
		if next.State != broker.StateApproved || next.Decision == nil || !next.Decision.Auto {
			t.Fatalf("asked again on %s as soon as the decision was out: %s (%+v)", name, next.State, next.Decision)
		}
	}
}

// TestRevokedGrantStaysRevoked: a ledger that reads a decision after its
// remembered choice was stored and revoked (a replica started after the
// revocation reads the stream from its beginning) does not bring the grant
// back, and neither does a second handling of its answer.
func TestRevokedGrantStaysRevoked(t *testing.T) {
	ns := testenv.Server(t)
	a := start(t, testenv.Conn(t, ns), broker.Config{Name: "a"})
	ask := events.Requested{Tool: "deploy", Agent: "a1", Session: "s-revoked"}
	rec, err := a.Submit(ctx(t), "", "test/t", ask)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Respond(ctx(t), "alice", rec.ID, events.Responded{Decision: events.Approve, Remember: &events.Remember{Scope: events.ScopeSession, TTL: events.Duration(time.Hour)}}); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); len(a.Remembered()) == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the remembered choice was not stored")
		}
	}
	gr, err := a.Forget(ctx(t), a.Remembered()[0].ID)
	if err != nil {
		t.Fatal(err)
	}
	// A second handling of the answer (its redelivery, or the consumer
	// after the HTTP request) stores the grant once more: not over the
	// revocation.
	if err := a.Remember(ctx(t), gr); !errors.Is(err, jetstream.ErrKeyExists) {
		t.Fatalf("stored again after its revocation: %v", err)
	}
	b := start(t, testenv.Conn(t, ns), broker.Config{Name: "b"})
	for name, r := range map[string]*broker.Broker{"a": a, "b": b} {
		next, err := r.Submit(ctx(t), "", "test/t", ask)
		if err != nil {
			t.Fatal(err)
		}
		if next.State != broker.StatePending {
			t.Fatalf("asked again on %s after the revocation: %s (%+v)", name, next.State, next.Decision)
		}
	}
}
