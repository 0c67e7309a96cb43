package broker

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/assent-dev/assent/internal/testenv"
	"github.com/assent-dev/assent/pkg/events"
)

// TestDurableScheduleExpires drops the local timer, as when the replica that
// held it died, and checks the JetStream schedule alone still expires the request.
func TestDurableScheduleExpires(t *testing.T) {
	ns := testenv.Server(t)
	b, err := New(testenv.Conn(t, ns), Config{}, testenv.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- b.Run(ctx) }()
	defer func() { cancel(); <-done }()
	for !b.Ready() {
		time.Sleep(5 * time.Millisecond)
	}
	rec, err := b.Submit(ctx, "", "test/t", events.Requested{Tool: "rm", Agent: "a1", Timeout: events.Duration(time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	b.timers.stop(rec.ID)
	final, err := b.Wait(ctx, rec.ID)
	if err != nil {
		t.Fatal(err)
	}
	if final.State != StateExpired || !strings.HasPrefix(final.Decision.Reason, "timeout") {
		t.Fatalf("got %s: %q", final.State, final.Decision.Reason)
	}
	late := final.Decision.DecidedAt.Sub(rec.Deadline)
	t.Logf("durable schedule expired the request %s after its deadline", late)
	if late < 0 || late > 3*time.Second {
		t.Fatalf("expired %s after the deadline", late)
	}
}
