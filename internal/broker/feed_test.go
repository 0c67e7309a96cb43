package broker_test

import (
	"context"
	"errors"
	"sync"
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
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	stuck := make(chan struct{})
	var last uint64
	var got []uint64
	subscribed := make(chan struct{})
	var once sync.Once
	errc := make(chan error, 1)
	go func() {
		errc <- b.Subscribe(ctx, 0, broker.EventFilter{}, func(e *broker.Event) error {
			once.Do(func() { close(subscribed) })
			<-stuck
			got = append(got, e.Seq)
			last = e.Seq
			return nil
		})
	}()
	// Each automatic decision is two events: requested and decided.
	const n = 700
	submit := func() {
		if _, err := b.Submit(ctx, "", "test/feed", events.Requested{Agent: "feeder", Tool: "t"}); err != nil {
			t.Error(err)
		}
	}
	submit()
	<-subscribed
	for range n - 1 {
		submit()
	}
	for deadline := time.Now().Add(10 * time.Second); b.Subscribers() != 0 && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	close(stuck)
	if err := <-errc; !errors.Is(err, broker.ErrFellBehind) {
		t.Fatalf("Subscribe returned %v, want ErrFellBehind", err)
	}
	// Resume after the last event delivered: the rest, through the end.
	rctx, rcancel := context.WithTimeout(ctx, 20*time.Second)
	defer rcancel()
	_ = b.Subscribe(rctx, last, broker.EventFilter{}, func(e *broker.Event) error {
		got = append(got, e.Seq)
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
