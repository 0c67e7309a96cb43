// Package brokertest runs real brokers and approver runtimes inside tests.
package brokertest

import (
	"context"
	"log"
	"net/http"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"

	"github.com/assent-dev/assent/internal/broker"
	"github.com/assent-dev/assent/internal/channels"
	"github.com/assent-dev/assent/internal/natsembed"
	"github.com/assent-dev/assent/internal/testenv"
	"github.com/assent-dev/assent/pkg/events"
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
	stop, finished := background(context.Background(), t, "broker "+cfg.Name, b.Run)
	deadline := time.Now().Add(patience)
	for !b.Ready() {
		select {
		case <-finished:
			t.Fatalf("broker %s stopped before it was ready (its error is reported below)", cfg.Name)
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
	background(context.Background(), t, "approver "+cfg.Principal, a.Run)
}

// Ask makes a request with c without waiting for its decision, which arrives
// on the returned channel; an empty req.ID is made. The request is withdrawn
// when the test ends; an error before then fails the test.
func Ask(t testing.TB, c *handler.Client, req handler.Request) (string, <-chan handler.Decision) {
	t.Helper()
	if req.ID == "" {
		req.ID = events.NewID()
	}
	ch := make(chan handler.Decision, 1)
	ctx := t.Context()
	go func() {
		d, err := c.Request(ctx, req)
		if err != nil && ctx.Err() == nil {
			t.Errorf("request %s: %v", req.ID, err)
		}
		ch <- d
	}()
	return req.ID, ch
}

// Decision waits for the decision Ask delivers, failing the test after
// patience.
func Decision(t testing.TB, ch <-chan handler.Decision) handler.Decision {
	t.Helper()
	select {
	case d := <-ch:
		return d
	case <-time.After(patience):
		t.Fatalf("no decision after %s", patience)
	}
	return handler.Decision{}
}

// RunChannel runs a channel runtime for n on nc until the returned func is
// called or the test ends, and waits for it to return.
func RunChannel(t testing.TB, nc *nats.Conn, cfg handler.ChannelConfig, n handler.Notifier) (*handler.Channel, func()) {
	t.Helper()
	return runChannel(t, nc, cfg, n, nil)
}

// RunAdapter runs a channel adapter as approver-bot does: a channel runtime
// for it (cfg's Channel, Reachable and Logger default to the adapter's), the
// adapter started with that runtime and mux, both until the returned func is
// called or the test ends. Stopping waits for the runtime and for the
// adapter's own work (its Wait, if it has one).
func RunAdapter(t testing.TB, nc *nats.Conn, cfg handler.ChannelConfig, a channels.Adapter, mux *http.ServeMux) (*handler.Channel, func()) {
	t.Helper()
	if cfg.Channel == "" {
		cfg.Channel = a.Name()
	}
	if cfg.Reachable == nil {
		cfg.Reachable = a.Reaches
	}
	return runChannel(t, nc, cfg, a, func(ctx context.Context, c *handler.Channel) error { return a.Start(ctx, c, mux) })
}

func runChannel(t testing.TB, nc *nats.Conn, cfg handler.ChannelConfig, n handler.Notifier, start func(context.Context, *handler.Channel) error) (*handler.Channel, func()) {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = testenv.Logger(t)
	}
	c, err := handler.NewChannel(nc, cfg, n)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	if start != nil {
		if err := start(ctx, c); err != nil {
			cancel()
			t.Fatal(err)
		}
	}
	stopRun, _ := background(ctx, t, "channel "+cfg.Channel, c.Run)
	var once sync.Once
	stop := func() {
		once.Do(func() {
			stopRun()
			cancel()
			w, ok := n.(interface{ Wait() })
			if !ok {
				return
			}
			waited := make(chan struct{})
			go func() { w.Wait(); close(waited) }()
			select {
			case <-waited:
			case <-time.After(patience):
				t.Errorf("channel %s: its own work still running %s after its context ended", cfg.Channel, patience)
			}
		})
	}
	t.Cleanup(stop)
	return c, stop
}

// background runs run in a goroutine until the returned stop is called or
// the test ends; stop ends its context and waits (up to patience) for it to
// return, reporting its error. finished is closed when run returns.
func background(ctx context.Context, t testing.TB, what string, run func(context.Context) error) (stop func(), finished <-chan struct{}) {
	ctx, cancel := context.WithCancel(ctx)
	fin := make(chan struct{})
	var runErr error
	go func() {
		runErr = run(ctx)
		close(fin)
	}()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case <-fin:
				if runErr != nil {
					t.Errorf("%s: Run: %v", what, runErr)
				}
			case <-time.After(patience):
				t.Errorf("%s: Run did not return %s after its context ended", what, patience)
			}
		})
	}
	t.Cleanup(stop)
	return stop, fin
}

// SubmitPending submits req to b under ids from newID until the request is
// pending, and returns its id. Remembered choices are revoked before each
// attempt, since one would decide the request at once (the broker lists one
// a moment after the answer that made it).
func SubmitPending(ctx context.Context, t testing.TB, b *broker.Broker, newID func() string, req events.Requested) string {
	t.Helper()
	for attempt := 0; ; attempt++ {
		for _, g := range b.Remembered() {
			if _, err := b.Forget(ctx, g.ID); err != nil {
				t.Fatalf("forget %s: %v", g.ID, err)
			}
		}
		id := newID()
		rec, err := b.Submit(ctx, id, "fuzz", req)
		if err == nil && rec.State == broker.StatePending {
			return id
		}
		if err != nil || attempt == 100 {
			t.Fatalf("make a pending request: %v (state %q)", err, rec.State)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Example starts an embedded NATS server and a manual-mode broker for
// runnable examples, which have no testing.T, and returns a connection to it
// with a func that stops everything. Real programs connect to a running
// broker's NATS instead.
func Example() (*nats.Conn, func()) {
	dir, err := os.MkdirTemp("", "assent-example")
	if err != nil {
		log.Fatal(err)
	}
	ns, err := natsembed.Start(natsembed.Config{Port: -1, StoreDir: dir}, nil)
	if err != nil {
		log.Fatal(err)
	}
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		log.Fatal(err)
	}
	b, err := broker.New(nc, broker.Config{}, nil)
	if err != nil {
		log.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- b.Run(ctx) }()
	for !b.Ready() {
		time.Sleep(5 * time.Millisecond)
	}
	return nc, func() {
		cancel()
		<-done
		nc.Close()
		ns.Shutdown()
		ns.WaitForShutdown()
		os.RemoveAll(dir)
	}
}
