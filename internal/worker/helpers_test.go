package worker_test

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/assent-dev/assent/internal/broker"
	"github.com/assent-dev/assent/internal/brokertest"
	"github.com/assent-dev/assent/internal/testenv"
	"github.com/assent-dev/assent/pkg/events"
	"github.com/assent-dev/assent/pkg/handler"
)

// startBroker runs a broker on nc until the test ends.
func startBroker(t *testing.T, nc *nats.Conn, mode broker.Mode) *broker.Broker {
	t.Helper()
	b, _ := brokertest.Run(t, nc, broker.Config{Name: "test", Mode: mode})
	return b
}

// env is a NATS server, a broker on it and an agent-side client.
type env struct {
	ns     *testenv.NATS
	b      *broker.Broker
	client *handler.Client
}

func newEnv(t *testing.T, mode broker.Mode, agent string) env {
	t.Helper()
	ns := testenv.Server(t)
	b := startBroker(t, testenv.Conn(t, ns), mode)
	client, err := handler.NewClient(testenv.Conn(t, ns), handler.Config{Agent: agent, Logger: testenv.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	return env{ns: ns, b: b, client: client}
}

// testCtx ends with the test, or after a minute.
func testCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// answer plays an approver: it watches assent.pending.<agent> and answers
// each pending request with decide's response through broker.Respond, as
// principal. A nil response leaves the request alone. The goroutine is
// stopped and waited for at cleanup.
func answer(t *testing.T, e env, agent, principal string, decide func(events.Pending) *events.Responded) {
	t.Helper()
	subj, err := events.PendingSubject(agent)
	if err != nil {
		t.Fatal(err)
	}
	msgs := make(chan *nats.Msg, 64)
	nc := testenv.Conn(t, e.ns)
	sub, err := nc.ChanSubscribe(subj, msgs)
	if err != nil {
		t.Fatal(err)
	}
	// The server has the subscription once the flush returns: a request
	// made right after this cannot be announced before it.
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-ctx.Done():
				return
			case m := <-msgs:
				ev, err := events.Decode(events.Header(m.Header), m.Data)
				if err != nil {
					t.Errorf("decode pending: %v", err)
					continue
				}
				p, err := events.DecodePending(&ev)
				if err != nil {
					t.Errorf("decode pending: %v", err)
					continue
				}
				resp := decide(p)
				if resp == nil {
					continue
				}
				if _, err := e.b.Respond(ctx, principal, p.RequestID, *resp); err != nil && ctx.Err() == nil {
					t.Errorf("respond to %s: %v", p.RequestID, err)
				}
			}
		}
	})
	t.Cleanup(func() {
		_ = sub.Unsubscribe()
		cancel()
		wg.Wait()
	})
}

// writeFiles creates files (slash-separated names) under dir.
func writeFiles(t testing.TB, dir string, files map[string]string) {
	t.Helper()
	for name, content := range files {
		p := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func exists(t *testing.T, p string) bool {
	t.Helper()
	_, err := os.Lstat(p)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	return err == nil
}

func readFile(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
