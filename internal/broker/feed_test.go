package broker_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/assent-dev/assent/internal/broker"
	"github.com/assent-dev/assent/internal/brokertest"
	"github.com/assent-dev/assent/internal/insights"
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
		errc <- b.Subscribe(ctx, broker.Live, broker.EventFilter{}, func(batch []*broker.Event) error {
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

// TestReadsLeaveNoConsumer: an audit query and a subscription that resumes
// from the stream each read through a consumer of their own, and delete it
// when they are done. Left to expire, every read would hold one of the
// server's consumers per stream (1,000 by default) for minutes, and a burst
// of reads would then refuse every new consumer, the broker's and the
// channels' included (found by FuzzAPI: GET /v1/audit answered 500 "maximum
// consumers limit reached").
func TestReadsLeaveNoConsumer(t *testing.T) {
	ns := testenv.Server(t)
	nc := testenv.Conn(t, ns)
	b, _ := brokertest.Run(t, nc, broker.WithFeedIdle(broker.Config{Mode: broker.ModeAutoApprove}, 100*time.Millisecond))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for range 3 {
		if _, err := b.Submit(ctx, "", "test/reads", events.Requested{Agent: "reader", Tool: "t"}); err != nil {
			t.Fatal(err)
		}
	}
	stream := assentStream(ctx, t, nc)
	consumers := func() int { return streamConsumers(ctx, t, stream) }
	before := consumers()
	for range 5 {
		if _, err := b.Audit(ctx, broker.AuditQuery{Limit: 1}); err != nil {
			t.Fatal(err)
		}
		if _, err := b.Audit(ctx, broker.AuditQuery{}); err != nil {
			t.Fatal(err)
		}
		// A subscription from the first event reads what was stored before
		// it from the stream, then follows the feed.
		sctx, scancel := context.WithCancel(ctx)
		err := b.Subscribe(sctx, 1, broker.EventFilter{}, func([]*broker.Event) error {
			scancel()
			return nil
		})
		scancel()
		if err != nil && !errors.Is(err, context.Canceled) {
			t.Fatal(err)
		}
	}
	// Deleting is asynchronous on the server's side only for the ordered
	// consumer's earlier instances; allow them to go, and the event feed's
	// own to stop once it has no subscriber.
	deadline := time.Now().Add(20 * time.Second)
	for consumers() != before && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if got := consumers(); got != before {
		t.Fatalf("the stream has %d consumers after 15 reads, %d before: reads leave their consumers behind", got, before)
	}
}

// assentStream returns the broker's stream, read through nc.
func assentStream(ctx context.Context, t *testing.T, nc *nats.Conn) jetstream.Stream {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	stream, err := js.Stream(ctx, events.StreamName)
	if err != nil {
		t.Fatal(err)
	}
	return stream
}

// streamConsumers counts the consumers on stream.
func streamConsumers(ctx context.Context, t *testing.T, stream jetstream.Stream) int {
	t.Helper()
	info, err := stream.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Consumers
}

// TestFeedReadsOnlyWhileSubscribed: the event feed holds no consumer on the
// stream while nobody subscribes; a subscriber that joins while it is
// stopped gets every event from the moment it subscribed, one that resumes
// gets what was stored while the feed was stopped, and the feed stops again
// once the last subscriber has been gone for its idle time.
func TestFeedReadsOnlyWhileSubscribed(t *testing.T) {
	ns := testenv.Server(t)
	nc := testenv.Conn(t, ns)
	b, _ := brokertest.Run(t, nc, broker.WithFeedIdle(broker.Config{Mode: broker.ModeAutoApprove}, 200*time.Millisecond))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	stream := assentStream(ctx, t, nc)
	consumers := func() int { return streamConsumers(ctx, t, stream) }
	submit := func() string {
		t.Helper()
		rec, err := b.Submit(ctx, "", "test/feed", events.Requested{Agent: "watched", Tool: "t"})
		if err != nil {
			t.Fatal(err)
		}
		return rec.ID
	}
	// ephemeral counts the stream's consumers that are not the broker's
	// durable ones: reads and the feed, beside the broker's own readings of
	// the stream: its ledger, counted here as the one there is at start,
	// and its insights follower, named by insights.ConsumerPrefix.
	ephemeral := func() int {
		t.Helper()
		n := -1
		for info := range stream.ListConsumers(ctx).Info() {
			if info.Config.Durable == "" && !strings.HasPrefix(info.Name, insights.ConsumerPrefix) {
				n++
			}
		}
		return n
	}
	submit()
	idle := consumers()
	if n := ephemeral(); n != 0 {
		t.Fatalf("%d ephemeral consumers on the stream before anyone subscribed: the feed reads with nobody listening", n)
	}

	// follow subscribes after seq and returns the request ids of the
	// decided events it gets, once it has want of them.
	follow := func(after uint64, want int, publish func()) (ids []string, last uint64) {
		t.Helper()
		sctx, scancel := context.WithCancel(ctx)
		defer scancel()
		errc := make(chan error, 1)
		go func() {
			errc <- b.Subscribe(sctx, after, broker.EventFilter{Types: []string{"decided"}}, func(batch []*broker.Event) error {
				for _, e := range batch {
					ids, last = append(ids, e.RequestID), e.Seq
				}
				if len(ids) >= want {
					scancel()
				}
				return nil
			})
		}()
		for b.Subscribers() == 0 {
			time.Sleep(time.Millisecond)
		}
		publish()
		select {
		case err := <-errc:
			if !errors.Is(err, context.Canceled) {
				t.Fatal(err)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("got %d of %d decisions", len(ids), want)
		}
		return ids, last
	}
	var want []string
	got, last := follow(broker.Live, 3, func() {
		// Published at once after subscribing, while the feed starts.
		for range 3 {
			want = append(want, submit())
		}
	})
	// Decisions of different requests are stored in the order they are
	// made, which need not be the order their Submit calls returned in.
	sameIDs := func(a, b []string) bool {
		return slices.Equal(slices.Sorted(slices.Values(a)), slices.Sorted(slices.Values(b)))
	}
	if !sameIDs(got, want) {
		t.Fatalf("a new subscriber got decisions %v, want %v", got, want)
	}

	stopped := func() bool {
		deadline := time.Now().Add(20 * time.Second)
		for (consumers() != idle || ephemeral() != 0) && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
		return consumers() == idle && ephemeral() == 0
	}
	if !stopped() {
		t.Fatalf("%d consumers on the stream with nobody subscribed, %d before anyone did: the feed kept reading", consumers(), idle)
	}
	want = []string{submit(), submit()} // while the feed is stopped
	got, _ = follow(last, 3, func() { want = append(want, submit()) })
	if !sameIDs(got, want) {
		t.Fatalf("a subscriber resuming after %d got decisions %v, want %v", last, got, want)
	}
	if !stopped() {
		t.Fatalf("the feed did not stop again after its subscriber left")
	}
}
