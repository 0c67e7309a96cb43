package integration

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/assent-dev/assent/integration/itest"
	"github.com/assent-dev/assent/internal/broker"
	"github.com/assent-dev/assent/internal/brokertest"
	"github.com/assent-dev/assent/internal/worker"
	"github.com/assent-dev/assent/pkg/events"
	"github.com/assent-dev/assent/pkg/handler"
	"github.com/assent-dev/assent/pkg/policy"
)

// BenchmarkRoundTrip measures request-to-decision through the broker in
// auto-approve mode: the SDK publishes a request, the broker stores its state
// with a compare-and-set and publishes the decision, the SDK receives and
// verifies it.
func BenchmarkRoundTrip(b *testing.B) {
	for _, sync := range []string{"always", "2m"} {
		for _, conc := range []int{1, 64} {
			b.Run(fmt.Sprintf("assent/sync=%s/c=%d", sync, conc), func(b *testing.B) {
				b.ReportAllocs()
				nc := itest.BenchServer(b, sync)
				// Tracing off, as the broker program runs by default.
				brokertest.Run(b, nc, broker.Config{Mode: broker.ModeAutoApprove, TracerProvider: noop.NewTracerProvider()})
				client, err := handler.NewClient(nc, handler.Config{Agent: "bench"})
				if err != nil {
					b.Fatal(err)
				}
				itest.RunLoad(b, conc, func(ctx context.Context, _ int) error {
					d, err := client.Request(ctx, handler.Request{Requested: events.Requested{Tool: "noop", Args: []byte(`{"n":1}`)}})
					if err == nil && !d.Approved() {
						err = fmt.Errorf("outcome %s", d.Outcome)
					}
					return err
				})
			})
			b.Run(fmt.Sprintf("raw-jetstream/sync=%s/c=%d", sync, conc), func(b *testing.B) {
				b.ReportAllocs()
				benchRaw(b, itest.BenchServer(b, sync), conc)
			})
		}
	}
}

// benchRaw is the minimum equivalent work on raw JetStream
// (worker.RawService): the requester subscribes to its reply subject and
// publishes a request to a file-backed stream; a consumer receives it,
// publishes a reply to the stream, and acks; the requester receives the
// reply.
func benchRaw(b *testing.B, nc *nats.Conn, conc int) {
	client := startRaw(b, nc, nc, false)
	itest.RunLoad(b, conc, func(ctx context.Context, _ int) error {
		_, err := client.Request(ctx, handler.Request{Requested: events.Requested{Tool: "noop", Args: []byte(`{"n":1}`)}})
		return err
	})
}

// startRaw serves the raw JetStream baseline on nc until the benchmark
// ends, and returns a client of it on clientConn.
func startRaw(b *testing.B, nc, clientConn *nats.Conn, manual bool) *worker.RawClient {
	b.Helper()
	svc, err := worker.StartRaw(context.Background(), nc, worker.RawConfig{Manual: manual}, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if err := svc.Close(context.Background()); err != nil {
			b.Error(err)
		}
	})
	client, err := worker.NewRawClient(clientConn, false)
	if err != nil {
		b.Fatal(err)
	}
	return client
}

// benchConn opens another connection to nc's server, closed when the
// benchmark ends.
func benchConn(b *testing.B, nc *nats.Conn) *nats.Conn {
	b.Helper()
	c, err := nats.Connect(nc.ConnectedUrl())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(c.Close)
	return c
}

// BenchmarkAnswerToDecision measures the human path: the broker in manual
// mode announces each request as pending; an approver subscribed to the
// agent's pending subject approves it at once with a JetStream publish to
// its response subject; the agent, waiting in handler.Client.Request,
// receives the decision. p50-ms and p99-ms are of the span from just before
// the approval's publish to the agent receiving the decision;
// pending-p99-ms is of the span from the request to the approver seeing the
// pending event. raw-jetstream is the same shape on raw JetStream
// (worker.RawService in manual mode): the request stored, a stored pending
// notice, a stored answer, a stored reply. The agent, the approver and the
// broker (or raw service) each have a connection of their own;
// worker.AnswerLoad drives both, as agent-worker load --answer-as does.
func BenchmarkAnswerToDecision(b *testing.B) {
	for _, sync := range []string{"always", "2m"} {
		for _, conc := range []int{1, 16} {
			b.Run(fmt.Sprintf("assent/sync=%s/c=%d", sync, conc), func(b *testing.B) {
				nc := itest.BenchServer(b, sync)
				brokertest.Run(b, nc, broker.Config{})
				client, err := handler.NewClient(benchConn(b, nc), handler.Config{Agent: "bench"})
				if err != nil {
					b.Fatal(err)
				}
				target, err := worker.NewAssentTarget(client, "bench")
				if err != nil {
					b.Fatal(err)
				}
				runAnswerLoad(b, benchConn(b, nc), target, conc)
			})
			b.Run(fmt.Sprintf("raw-jetstream/sync=%s/c=%d", sync, conc), func(b *testing.B) {
				nc := itest.BenchServer(b, sync)
				runAnswerLoad(b, benchConn(b, nc), startRaw(b, nc, benchConn(b, nc), true), conc)
			})
		}
	}
}

// runAnswerLoad runs worker.AnswerLoad for b.N requests at conc and reports
// its spans.
func runAnswerLoad(b *testing.B, approver *nats.Conn, target worker.AnswerTarget, conc int) {
	b.Helper()
	b.ResetTimer()
	res, err := worker.AnswerLoad(context.Background(), approver, target, worker.AnswerConfig{
		LoadConfig: worker.LoadConfig{N: b.N, Concurrency: conc}, Principal: "alice"})
	b.StopTimer()
	if err != nil {
		b.Fatal(err)
	}
	if res.Errors > 0 || res.Outcomes[events.Approved] != b.N {
		b.Fatalf("%d of %d failed (%v); first: %s", res.Errors, b.N, res.ErrorKinds, res.FirstError)
	}
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	b.ReportMetric(res.Throughput, "req/s")
	b.ReportMetric(ms(res.Answer.P50), "p50-ms")
	b.ReportMetric(ms(res.Answer.P99), "p99-ms")
	b.ReportMetric(ms(res.Pending.P99), "pending-p99-ms")
}

// BenchmarkRememberedRoundTrip is BenchmarkRoundTrip's assent case decided by a
// remembered choice instead of the mode: a policy that requires approval, one
// approval remembered for the agent, then every request auto-approved through
// the remembered-choice lookup. Run beside the auto-approve mode in the same
// process for the comparison.
func BenchmarkRememberedRoundTrip(b *testing.B) {
	for _, how := range []string{"auto-approve-mode", "remembered"} {
		b.Run(fmt.Sprintf("%s/sync=2m/c=64", how), func(b *testing.B) {
			nc := itest.BenchServer(b, "2m")
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
			itest.RunLoad(b, 64, func(ctx context.Context, _ int) error {
				d, err := client.Request(ctx, handler.Request{Requested: events.Requested{Tool: "noop", Args: []byte(`{"n":1}`)}})
				if err == nil && (!d.Approved() || !d.Auto) {
					err = fmt.Errorf("outcome %s by %s", d.Outcome, d.Rule)
				}
				return err
			})
		})
	}
}
