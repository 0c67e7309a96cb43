package cluster

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/assent-dev/assent/integration/itest"
	"github.com/assent-dev/assent/internal/broker"
	"github.com/assent-dev/assent/internal/testenv"
	"github.com/assent-dev/assent/pkg/events"
	"github.com/assent-dev/assent/pkg/handler"
)

// TestTwoReplicas runs two brokers on the same NATS, each on its own
// connection, sharing the work. 200 requests are asked for at once through the
// SDK, and each is answered three ways at the same moment: Respond on replica
// one, Respond on replica two, and a NATS answer. Every request ends with
// exactly one decided message, the one its worker received, naming the
// answer that won.
func TestTwoReplicas(t *testing.T) {
	ns := testenv.Server(t)
	b1, _ := itest.RunBroker(t, testenv.Conn(t, ns), broker.Config{Name: "replica-1"})
	b2, _ := itest.RunBroker(t, testenv.Conn(t, ns), broker.Config{Name: "replica-2"})
	nc := testenv.Conn(t, ns)
	js := itest.NewJS(t, nc)
	const agent, n = "fleet", 200
	client := itest.NewClient(t, nc, agent)

	ids := make([]string, n)
	results := make([]<-chan itest.Result, n)
	ctx := itest.TestCtx(t, 2*time.Minute)
	for i := range ids {
		ids[i] = events.NewID()
		results[i] = itest.RequestAsync(t, ctx, client, handler.Request{ID: ids[i], Requested: events.Requested{
			Tool: "scale", Args: json.RawMessage(fmt.Sprintf(`{"replicas":%d}`, i)), Timeout: events.Duration(2 * time.Minute),
		}})
	}
	// Both replicas see every request (whichever stored it).
	for _, id := range ids {
		itest.WaitState(t, b1, id, broker.StatePending)
		itest.WaitState(t, b2, id, broker.StatePending)
	}

	type outcome struct {
		mu      sync.Mutex
		winners []string // principals whose Respond call succeeded
	}
	outs := make([]outcome, n)
	errs := make(chan error, 3*n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i, id := range ids {
		o := &outs[i]
		respond := func(b *broker.Broker, principal string, v events.Verdict) {
			<-start
			// Jitter, so that each of the three ways wins some of the races:
			// the NATS answer goes through a consumer, so it needs a head start.
			jitter := time.Duration(rand.IntN(40)) * time.Millisecond
			if i%4 == 0 {
				jitter += 500 * time.Millisecond
			}
			time.Sleep(jitter)
			rctx, cancel := itest.OpCtx()
			defer cancel()
			_, err := b.Respond(rctx, principal, id, events.Responded{Decision: v, Reason: principal})
			switch {
			case err == nil:
				o.mu.Lock()
				o.winners = append(o.winners, principal)
				o.mu.Unlock()
			case !errors.Is(err, broker.ErrAlreadyDecided):
				errs <- fmt.Errorf("%s on %s: %w", principal, id, err)
			}
		}
		wg.Go(func() { respond(b1, "via-replica-1", events.Approve) })
		wg.Go(func() { respond(b2, "via-replica-2", events.Deny) })
		wg.Go(func() {
			<-start
			actx, cancel := itest.OpCtx()
			defer cancel()
			if err := handler.Answer(actx, js, "via-nats", id, events.Responded{Decision: events.Approve, Reason: "via-nats", Args: json.RawMessage(`{"replicas":-1}`)}); err != nil {
				errs <- fmt.Errorf("answer %s: %w", id, err)
			}
		})
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if t.Failed() {
		t.FailNow()
	}

	wonBy := map[string]int{}
	for i, id := range ids {
		r := itest.Await(t, results[i])
		if r.Err != nil {
			t.Fatalf("request %d: %v", i, r.Err)
		}
		d := r.D
		if len(d.DecidedBy) != 1 || d.Reason != d.DecidedBy[0].Principal {
			t.Fatalf("request %d decided %+v", i, d)
		}
		winner := d.DecidedBy[0].Principal
		wonBy[winner]++
		switch w := outs[i].winners; {
		case len(w) > 1:
			t.Fatalf("request %d: Respond succeeded for %v", i, w)
		case len(w) == 1 && w[0] != winner:
			t.Fatalf("request %d: Respond succeeded for %s but %s decided", i, w[0], winner)
		case len(w) == 0 && winner != "via-nats":
			t.Fatalf("request %d: both Respond calls lost, but %s decided", i, winner)
		}
		want := map[string]events.Outcome{"via-replica-1": events.Approved, "via-replica-2": events.Denied, "via-nats": events.Approved}[winner]
		if d.Outcome != want || d.Edited != (winner == "via-nats") {
			t.Fatalf("request %d decided by %s: %+v", i, winner, d)
		}
		stored := itest.WaitDecision(t, js, id)
		itest.SameDecision(t, stored, d)
	}
	t.Logf("won by: %v", wonBy)

	itest.WaitBrokerIdle(t, js)
	counts := itest.DecisionCounts(t, js)
	if len(counts) != n {
		t.Errorf("%d decision subjects, want %d", len(counts), n)
	}
	for _, id := range ids {
		if counts[id] != 1 {
			t.Errorf("request %s has %d decided messages, want 1", id, counts[id])
		}
	}
}
