package broker

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestCoalescerAnswersFromALaterCall: every caller gets the answer of a call
// that began after it arrived, and callers arriving together share calls.
func TestCoalescerAnswersFromALaterCall(t *testing.T) {
	var calls atomic.Int64
	var now atomic.Int64 // a clock the calls read: the answer is when the call began
	c := newCoalescer(func(context.Context) (int64, error) {
		calls.Add(1)
		began := now.Add(1)
		time.Sleep(2 * time.Millisecond)
		return began, nil
	})
	const n = 200
	var wg sync.WaitGroup
	var stale atomic.Int64
	for range n {
		wg.Go(func() {
			arrived := now.Load()
			got, err := c.wait(context.Background())
			if err != nil {
				t.Error(err)
			}
			if got <= arrived {
				stale.Add(1)
			}
		})
	}
	wg.Wait()
	if s := stale.Load(); s > 0 {
		t.Fatalf("%d of %d callers got the answer of a call that began before they arrived", s, n)
	}
	if k := calls.Load(); k >= n/2 {
		t.Fatalf("%d calls for %d concurrent callers; they should share calls", k, n)
	}
}

// TestCoalescerCallerGivesUp: a caller whose context ends returns at once;
// the round still answers the others.
func TestCoalescerCallerGivesUp(t *testing.T) {
	release := make(chan struct{})
	c := newCoalescer(func(context.Context) (int, error) { <-release; return 7, nil })
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := c.wait(ctx); err == nil {
		t.Fatal("a cancelled caller got an answer")
	}
	done := make(chan int)
	go func() { v, _ := c.wait(context.Background()); done <- v }()
	close(release)
	select {
	case v := <-done:
		if v != 7 {
			t.Fatalf("got %d, want 7", v)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the remaining caller got no answer")
	}
}
