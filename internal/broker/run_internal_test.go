package broker

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"

	"github.com/assent-dev/assent/internal/testenv"
	"github.com/assent-dev/assent/pkg/events"
)

// runInternal runs a broker on nc until the test ends, and returns it once
// it is ready, with a context for the test's calls (30 s). Tests outside the
// package use internal/brokertest, which imports this one.
func runInternal(t *testing.T, nc *nats.Conn, cfg Config) (*Broker, context.Context) {
	t.Helper()
	return runInternalLogged(t, nc, cfg, testenv.Logger(t))
}

// runInternalLogged is runInternal with the broker logging to log.
func runInternalLogged(t *testing.T, nc *nats.Conn, cfg Config, log *zap.Logger, before ...func(*Broker)) (*Broker, context.Context) {
	t.Helper()
	b, err := New(nc, cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	for _, fn := range before {
		fn(b)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	done := make(chan error, 1)
	go func() { done <- b.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	for !b.Ready() {
		if ctx.Err() != nil {
			t.Fatal("the broker did not get ready")
		}
		time.Sleep(5 * time.Millisecond)
	}
	return b, ctx
}

// submit asks b on the test subject for req and fails the test if it cannot.
func submit(ctx context.Context, t *testing.T, b *Broker, req events.Requested) Record {
	t.Helper()
	rec, err := b.Submit(ctx, "", "test/t", req)
	if err != nil {
		t.Fatal(err)
	}
	return rec
}
