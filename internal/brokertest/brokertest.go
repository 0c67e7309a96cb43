// Package brokertest runs real brokers inside tests.
package brokertest

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/assent-dev/assent/internal/broker"
	"github.com/assent-dev/assent/internal/testenv"
)

// Run starts a broker on nc and returns it once it is ready, with a func that
// stops it and waits for Run to return. The broker is also stopped when the
// test ends; stopping twice is fine.
func Run(t testing.TB, nc *nats.Conn, cfg broker.Config) (*broker.Broker, func()) {
	t.Helper()
	b, err := broker.New(nc, cfg, testenv.Logger(t))
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
			if err := <-done; err != nil {
				t.Errorf("broker run: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	deadline := time.Now().Add(10 * time.Second)
	for !b.Ready() {
		select {
		case err := <-done:
			once.Do(func() {})
			t.Fatalf("broker stopped before it was ready: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("broker not ready after 10s")
		}
		time.Sleep(5 * time.Millisecond)
	}
	return b, stop
}
