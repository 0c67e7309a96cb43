package handler_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/assent-dev/assent/internal/broker"
	"github.com/assent-dev/assent/internal/brokertest"
	"github.com/assent-dev/assent/internal/testenv"
	"github.com/assent-dev/assent/pkg/events"
	"github.com/assent-dev/assent/pkg/handler"
)

// TestPendingAndCancelAll: an agent lists what it waits for (all of it, or
// one session's), never another agent's, and cancels a session's requests at
// once: its waiting calls return cancelled, recorded as the agent's cancels,
// and the rest stay pending.
func TestPendingAndCancelAll(t *testing.T) {
	ns := testenv.Server(t)
	b, _ := brokertest.Run(t, testenv.Conn(t, ns), broker.Config{})
	c, err := handler.NewClient(testenv.Conn(t, ns), handler.Config{Agent: "coder"})
	if err != nil {
		t.Fatal(err)
	}
	ctx := testCtx(t)
	type result struct {
		d   handler.Decision
		err error
	}
	ask := func(id, session string) <-chan result {
		ch := make(chan result, 1)
		go func() {
			d, err := c.Request(ctx, handler.Request{ID: id, Requested: events.Requested{Tool: "delete_" + id, Session: session, Hint: "Delete " + id + "?"}})
			ch <- result{d, err}
		}()
		return ch
	}
	a1, a2, b1 := ask("a1", "s-a"), ask("a2", "s-a"), ask("b1", "s-b")
	if _, err := b.Submit(ctx, "other-1", "test", events.Requested{Agent: "victim", Tool: "delete_x", Session: "s-a"}); err != nil {
		t.Fatal(err)
	}
	ids := func(ps []events.AgentPending) []string {
		var out []string
		for _, p := range ps {
			out = append(out, p.ID)
		}
		slices.Sort(out)
		return out
	}
	var all []events.AgentPending
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if all, err = c.Pending(ctx, ""); err != nil {
			t.Fatal(err)
		}
		if len(all) >= 3 || time.Now().After(deadline) {
			break
		}
	}
	if got := ids(all); !slices.Equal(got, []string{"a1", "a2", "b1"}) {
		t.Fatalf("Pending: %v, want a1 a2 b1 (and not another agent's)", got)
	}
	for _, p := range all {
		if p.Tool != "delete_"+p.ID || p.Hint == "" || p.Deadline.IsZero() || p.ReceivedAt.IsZero() {
			t.Errorf("pending %+v", p)
		}
	}
	session, err := c.Pending(ctx, "s-a")
	if got := ids(session); err != nil || !slices.Equal(got, []string{"a1", "a2"}) {
		t.Fatalf("Pending(s-a): %v %v", got, err)
	}

	cancelled, err := c.CancelAll(ctx, "s-a", "the user stopped the session")
	if slices.Sort(cancelled); err != nil || !slices.Equal(cancelled, []string{"a1", "a2"}) {
		t.Fatalf("CancelAll(s-a): %v %v", cancelled, err)
	}
	for _, ch := range []<-chan result{a1, a2} {
		r := <-ch
		if r.err != nil || r.d.Outcome != events.Cancelled || len(r.d.DecidedBy) != 1 || r.d.DecidedBy[0].Principal != "agent/coder" {
			t.Errorf("a cancelled call: %+v %v", r.d, r.err)
		}
	}
	for _, id := range []string{"b1", "other-1"} {
		if rec, err := b.Get(ctx, id); err != nil || rec.State != broker.StatePending {
			t.Errorf("%s: %v %s, want still pending", id, err, rec.State)
		}
	}
	rest, err := c.CancelAll(ctx, "", "")
	if err != nil || !slices.Equal(rest, []string{"b1"}) {
		t.Fatalf("CancelAll: %v %v", rest, err)
	}
	if r := <-b1; r.d.Outcome != events.Cancelled {
		t.Errorf("b1: %+v %v", r.d, r.err)
	}
	if left, err := c.Pending(ctx, ""); err != nil || len(left) != 0 {
		t.Errorf("left pending: %v %v", left, err)
	}
	if _, err := (&handler.Client{}).Pending(context.Background(), ""); err == nil {
		t.Error("a client without an agent listed something")
	}
}
