package integration

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/assent-dev/assent/internal/broker"
	"github.com/assent-dev/assent/internal/brokertest"
	"github.com/assent-dev/assent/internal/natsembed"
	"github.com/assent-dev/assent/pkg/events"
	"github.com/assent-dev/assent/pkg/handler"
	"github.com/assent-dev/assent/pkg/policy"
)

// benchServer starts an embedded server with file storage and the given fsync
// policy for a benchmark.
func benchServer(b *testing.B, sync string) *nats.Conn {
	b.Helper()
	s, err := natsembed.Start(natsembed.Config{Port: -1, StoreDir: b.TempDir(), Sync: sync}, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	nc, err := nats.Connect(s.ClientURL())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(nc.Close)
	return nc
}

// runLoad calls one b.N times from conc goroutines and reports throughput and
// latency percentiles.
func runLoad(b *testing.B, conc int, one func(ctx context.Context, i int) error) {
	b.Helper()
	ctx := context.Background()
	lat := make([]time.Duration, b.N)
	var next atomic.Int64
	var failed atomic.Int64
	var firstErr atomic.Value
	var wg sync.WaitGroup
	b.ResetTimer()
	start := time.Now()
	for range conc {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= b.N {
					return
				}
				t0 := time.Now()
				if err := one(ctx, i); err != nil {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, err)
				}
				lat[i] = time.Since(t0)
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	if n := failed.Load(); n > 0 {
		b.Fatalf("%d of %d failed; first: %v", n, b.N, firstErr.Load())
	}
	slices.Sort(lat)
	pct := func(p float64) float64 { return float64(lat[int(float64(len(lat)-1)*p)].Microseconds()) / 1000 }
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "req/s")
	b.ReportMetric(pct(0.50), "p50-ms")
	b.ReportMetric(pct(0.99), "p99-ms")
}

// BenchmarkRoundTrip measures request-to-decision through the broker in
// auto-approve mode: the SDK publishes a request, the broker stores its state
// with a compare-and-set and publishes the decision, the SDK receives and
// verifies it.
func BenchmarkRoundTrip(b *testing.B) {
	for _, sync := range []string{"always", "2m"} {
		for _, conc := range []int{1, 64} {
			b.Run(fmt.Sprintf("assent/sync=%s/c=%d", sync, conc), func(b *testing.B) {
				nc := benchServer(b, sync)
				brokertest.Run(b, nc, broker.Config{Mode: broker.ModeAutoApprove})
				client, err := handler.NewClient(nc, handler.Config{Agent: "bench"})
				if err != nil {
					b.Fatal(err)
				}
				runLoad(b, conc, func(ctx context.Context, _ int) error {
					d, err := client.Request(ctx, handler.Request{Requested: events.Requested{Tool: "noop", Args: []byte(`{"n":1}`)}})
					if err == nil && !d.Approved() {
						err = fmt.Errorf("outcome %s", d.Outcome)
					}
					return err
				})
			})
			b.Run(fmt.Sprintf("raw-jetstream/sync=%s/c=%d", sync, conc), func(b *testing.B) {
				benchRaw(b, benchServer(b, sync), conc)
			})
		}
	}
}

// benchRaw is the minimum equivalent work on raw JetStream: the requester
// subscribes to its reply subject and publishes a request to a file-backed
// stream; a consumer receives it, publishes a reply to the stream, and acks;
// the requester receives the reply.
func benchRaw(b *testing.B, nc *nats.Conn, conc int) {
	ctx, cancel := context.WithCancel(context.Background())
	b.Cleanup(cancel)
	js, err := jetstream.New(nc)
	if err != nil {
		b.Fatal(err)
	}
	s, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "RAW", Subjects: []string{"raw.>"}, Storage: jetstream.FileStorage})
	if err != nil {
		b.Fatal(err)
	}
	cons, err := s.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "svc", FilterSubject: "raw.req.*", AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: 1024})
	if err != nil {
		b.Fatal(err)
	}
	work := make(chan jetstream.Msg)
	var wg sync.WaitGroup
	for range 64 {
		wg.Go(func() {
			for m := range work {
				id := m.Subject()[len("raw.req."):]
				if _, err := js.Publish(ctx, "raw.reply."+id, m.Data()); err != nil {
					_ = m.Nak()
					continue
				}
				_ = m.Ack()
			}
		})
	}
	cc, err := cons.Consume(func(m jetstream.Msg) { work <- m }, jetstream.PullMaxMessages(128))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { cc.Stop(); <-cc.Closed(); close(work); wg.Wait() })
	runLoad(b, conc, func(ctx context.Context, _ int) error {
		id := events.NewID()
		ch := make(chan *nats.Msg, 1)
		sub, err := nc.ChanSubscribe("raw.reply."+id, ch)
		if err != nil {
			return err
		}
		defer sub.Unsubscribe() //nolint:errcheck
		if _, err := js.Publish(ctx, "raw.req."+id, []byte(`{"tool":"noop","args":{"n":1}}`), jetstream.WithMsgID(id)); err != nil {
			return err
		}
		select {
		case <-ch:
			return nil
		case <-time.After(30 * time.Second):
			return fmt.Errorf("no reply for %s", id)
		}
	})
}

// BenchmarkRememberedRoundTrip is BenchmarkRoundTrip's assent case decided by a
// remembered choice instead of the mode: a policy that requires approval, one
// approval remembered for the agent, then every request auto-approved through
// the remembered-choice lookup. Run beside the auto-approve mode in the same
// process for the comparison.
func BenchmarkRememberedRoundTrip(b *testing.B) {
	for _, how := range []string{"auto-approve-mode", "remembered"} {
		b.Run(fmt.Sprintf("%s/sync=2m/c=64", how), func(b *testing.B) {
			nc := benchServer(b, "2m")
			cfg := broker.Config{Mode: broker.ModeAutoApprove}
			if how == "remembered" {
				p, err := policy.Parse([]byte("version: 1\nrules:\n  - name: guarded\n    tools: [noop]\n    action: require_approval\n"), "bench.yaml")
				if err != nil {
					b.Fatal(err)
				}
				cfg = broker.Config{Policy: p}
			}
			br, _ := brokertest.Run(b, nc, cfg)
			ctx := context.Background()
			if how == "remembered" {
				first, err := br.Submit(ctx, "", "agent/bench", events.Requested{Agent: "bench", Tool: "noop"})
				if err != nil {
					b.Fatal(err)
				}
				if _, err := br.Respond(ctx, "alice", first.ID, events.Responded{Decision: events.Approve, Remember: &events.Remember{Scope: events.ScopeAgent, TTL: events.Duration(time.Hour)}}); err != nil {
					b.Fatal(err)
				}
			}
			client, err := handler.NewClient(nc, handler.Config{Agent: "bench"})
			if err != nil {
				b.Fatal(err)
			}
			runLoad(b, 64, func(ctx context.Context, _ int) error {
				d, err := client.Request(ctx, handler.Request{Requested: events.Requested{Tool: "noop", Args: []byte(`{"n":1}`)}})
				if err == nil && (!d.Approved() || !d.Auto) {
					err = fmt.Errorf("outcome %s by %s", d.Outcome, d.Rule)
				}
				return err
			})
		})
	}
}
