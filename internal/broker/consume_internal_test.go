package broker

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/assent-dev/assent/internal/testenv"
)

// TestConsumeStopsAfterOverlongDrain: a drain that outlasts drainTimeout is
// stopped while a delivery still waits for a busy worker; consume returns
// once the worker finishes (it used to close the work channel under that
// delivery, which panicked), and every message it did not handle is
// delivered again to the next consumer.
func TestConsumeStopsAfterOverlongDrain(t *testing.T) {
	defer func(d time.Duration) { drainTimeout = d }(drainTimeout)
	drainTimeout = 100 * time.Millisecond

	ns := testenv.Server(t)
	nc := testenv.Conn(t, ns)
	b, err := New(nc, Config{Workers: 1}, testenv.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "T", Subjects: []string{"t.>"}}); err != nil {
		t.Fatal(err)
	}
	const ackWait = time.Second
	cons, err := js.CreateOrUpdateConsumer(ctx, "T", jetstream.ConsumerConfig{Durable: "c", AckPolicy: jetstream.AckExplicitPolicy, AckWait: ackWait})
	if err != nil {
		t.Fatal(err)
	}
	const n = 5
	for i := range n {
		if _, err := js.Publish(ctx, "t."+strconv.Itoa(i), nil); err != nil {
			t.Fatal(err)
		}
	}

	var (
		mu      sync.Mutex
		handled = map[string]int{}
	)
	started, release := make(chan struct{}), make(chan struct{})
	first := true
	hold := func(_ context.Context, msg jetstream.Msg) error {
		mu.Lock()
		handled[msg.Subject()]++
		wasFirst := first
		first = false
		mu.Unlock()
		if wasFirst {
			close(started)
			<-release
		}
		return nil
	}
	cctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- b.consume(cctx, cons, "test", ackWait, hold) }()
	<-started
	stop()
	// The drain cannot finish while the worker holds its message; release
	// it well after drainTimeout has stopped the drain.
	time.AfterFunc(5*drainTimeout, func() { close(release) })
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	// The next consumer gets the rest, once their ack wait has passed.
	again, stopAgain := context.WithCancel(ctx)
	defer stopAgain()
	go func() { done <- b.consume(again, cons, "test", ackWait, hold) }()
	for {
		mu.Lock()
		got := len(handled)
		mu.Unlock()
		if got == n {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("handled %v, want all %d messages", handled, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
	stopAgain()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
