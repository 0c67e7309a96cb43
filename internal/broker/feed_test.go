package broker_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/assent-dev/assent/internal/broker"
	"github.com/assent-dev/assent/internal/brokertest"
	"github.com/assent-dev/assent/internal/testenv"
	"github.com/assent-dev/assent/pkg/events"
)

// TestSubscriberFallsBehind: a subscriber that stops reading is dropped
// (ErrFellBehind) instead of holding up the feed; resuming after the last
// event it got delivers the rest, in order, without a gap or a duplicate.
func TestSubscriberFallsBehind(t *testing.T) {
	ns := testenv.Server(t)
	b, _ := brokertest.Run(t, testenv.Conn(t, ns), broker.Config{Mode: broker.ModeAutoApprove})
	// 9,000 requests under -race on two busy cores: a bound only a hang
	// misses.
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	stuck := make(chan struct{})
	var last uint64
	var got []uint64
	subscribed := make(chan struct{})
	var last0 atomic.Uint64 // the first event the stuck subscriber got
	var once sync.Once
	errc := make(chan error, 1)
	go func() {
		errc <- b.Subscribe(ctx, 0, broker.EventFilter{}, func(batch []*broker.Event) error {
			once.Do(func() { last0.Store(batch[0].Seq); close(subscribed) })
			<-stuck
			for _, e := range batch {
				got = append(got, e.Seq)
				last = e.Seq
			}
			return nil
		})
	}()
	// Each automatic decision is two events (requested, decided): more than
	// the feed holds while the subscriber is stuck.
	const n = 9000
	submit := func() {
		if _, err := b.Submit(ctx, "", "test/feed", events.Requested{Agent: "feeder", Tool: "t"}); err != nil {
			t.Error(err)
		}
	}
	// The subscriber follows new events only: let it join before the first.
	for b.Subscribers() == 0 {
		time.Sleep(time.Millisecond)
	}
	submit()
	<-subscribed
	stuckAt := last0.Load()
	var wg sync.WaitGroup
	var next atomic.Int64
	for range 32 {
		wg.Go(func() {
			for next.Add(1) < n {
				submit()
			}
		})
	}
	wg.Wait()
	// Let the feed take in the last of them: a subscriber that keeps up
	// sees them all.
	seen := 0
	wctx, wcancel := context.WithTimeout(ctx, 20*time.Second)
	_ = b.Subscribe(wctx, stuckAt, broker.EventFilter{}, func(batch []*broker.Event) error {
		if seen += len(batch); seen >= 2*n-1 {
			wcancel()
		}
		return nil
	})
	wcancel()
	close(stuck)
	if err := <-errc; !errors.Is(err, broker.ErrFellBehind) {
		t.Fatalf("Subscribe returned %v, want ErrFellBehind", err)
	}
	// Resume after the last event delivered: the rest, through the end.
	rctx, rcancel := context.WithTimeout(ctx, 20*time.Second)
	defer rcancel()
	_ = b.Subscribe(rctx, last, broker.EventFilter{}, func(batch []*broker.Event) error {
		for _, e := range batch {
			got = append(got, e.Seq)
		}
		if len(got) == 2*n {
			rcancel()
		}
		return nil
	})
	if len(got) != 2*n {
		t.Fatalf("%d events in all, want %d", len(got), 2*n)
	}
	for i := 1; i < len(got); i++ {
		if got[i] <= got[i-1] {
			t.Fatalf("event %d has sequence %d after %d", i, got[i], got[i-1])
		}
	}
}
