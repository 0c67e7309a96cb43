// Package brokertest runs real brokers and approver runtimes inside tests.
package brokertest

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"

	"github.com/assent-dev/assent/internal/broker"
	"github.com/assent-dev/assent/internal/testenv"
	"github.com/assent-dev/assent/pkg/handler"
)

// patience bounds how long a broker may take to become ready or to stop.
const patience = 30 * time.Second

// Run starts a broker on nc and returns it once it is ready, with a func that
// stops it and waits for Run to return. The broker is also stopped when the
// test ends; stopping twice is fine.
func Run(t testing.TB, nc *nats.Conn, cfg broker.Config) (*broker.Broker, func()) {
	t.Helper()
	log := testenv.Logger(t)
	if _, bench := t.(*testing.B); bench {
		log = zap.NewNop() // a benchmark prints every log line
	}
	return RunLogged(t, nc, cfg, log)
}

// RunLogged is Run with the broker logging to log.
func RunLogged(t testing.TB, nc *nats.Conn, cfg broker.Config, log *zap.Logger) (*broker.Broker, func()) {
	t.Helper()
	b, err := broker.New(nc, cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- b.Run(ctx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("broker %s: Run: %v", cfg.Name, err)
				}
			case <-time.After(patience):
				t.Errorf("broker %s: Run did not return %s after its context ended", cfg.Name, patience)
			}
		})
	}
	t.Cleanup(stop)
	deadline := time.Now().Add(patience)
	for !b.Ready() {
		select {
		case err := <-done:
			once.Do(func() {})
			t.Fatalf("broker %s stopped before it was ready: %v", cfg.Name, err)
		case <-time.After(5 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("broker %s not ready after %s", cfg.Name, patience)
		}
	}
	return b, stop
}

// RunApprover runs an approver runtime with cfg and h on nc until the test
// ends, then stops it and waits for Run to return.
func RunApprover(t testing.TB, nc *nats.Conn, cfg handler.ApproverConfig, h handler.Handler) {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = testenv.Logger(t)
	}
	a, err := handler.NewApprover(nc, cfg, h)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("approver %s: %v", cfg.Principal, err)
			}
		case <-time.After(patience):
			t.Errorf("approver %s: Run did not return %s after its context ended", cfg.Principal, patience)
		}
	})
}
