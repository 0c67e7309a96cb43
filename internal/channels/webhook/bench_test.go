package webhook_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/assent-dev/assent/internal/channels"
	"github.com/assent-dev/assent/internal/channels/webhook"
	"github.com/assent-dev/assent/internal/testenv"
	"github.com/assent-dev/assent/pkg/events"
)

// BenchmarkWebhookDelivery measures events per second from the stream to a
// local receiver (an httptest server that reads the body and answers 204).
//
//   - webhook: the channel as it runs, one event at a time per endpoint
//     (MaxAckPending 1), each decoded, signed, POSTed, logged and acked.
//   - raw-jetstream-ordered: the least work for the same order: a consumer
//     with MaxAckPending 1 that POSTs each message's bytes and acks it; no
//     decoding, signing or delivery log.
//   - raw-jetstream-unordered: the same without the order, the server
//     handing out up to 256 messages at once (POSTed one after another);
//     what giving up the order would buy a single process.
//
// Each iteration is one event; the events are stored before the timer runs.
//
//	go test -run '^$' -bench BenchmarkWebhookDelivery -benchtime 5000x ./internal/channels/webhook/
func BenchmarkWebhookDelivery(b *testing.B) {
	b.Run("webhook", func(b *testing.B) {
		ns, nc := benchStream(b)
		secret, _ := newSecret(b)
		b.Setenv("WH_BENCH", secret)
		var got atomic.Int64
		rcv := benchReceiver(b, &got)
		cfg := webhook.Config{Endpoints: []webhook.Endpoint{{Name: "bench", URL: rcv.URL, SecretEnv: "WH_BENCH"}}}
		// A first run makes the endpoint's consumer, so that it takes the
		// events stored next.
		runAdapter(b, ns, cfg)()
		publishPending(b, nc, b.N)
		b.ResetTimer()
		stop := runAdapter(b, ns, cfg)
		waitCount(b, &got, b.N)
		b.StopTimer()
		stop()
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
	})
	for _, raw := range []struct {
		name    string
		pending int
	}{{"raw-jetstream-ordered", 1}, {"raw-jetstream-unordered", 256}} {
		b.Run(raw.name, func(b *testing.B) {
			_, nc := benchStream(b)
			var got atomic.Int64
			rcv := benchReceiver(b, &got)
			publishPending(b, nc, b.N)
			js, _ := jetstream.New(nc)
			b.ResetTimer()
			cons, err := js.CreateConsumer(context.Background(), events.StreamName, jetstream.ConsumerConfig{
				Durable: "raw", AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: raw.pending,
				FilterSubjects: []string{events.PendingPrefix + "*"},
			})
			if err != nil {
				b.Fatal(err)
			}
			client := &http.Client{}
			cc, err := cons.Consume(func(msg jetstream.Msg) {
				resp, err := client.Post(rcv.URL, "application/cloudevents+json", bytes.NewReader(msg.Data()))
				if err != nil {
					_ = msg.Nak()
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				_ = msg.Ack()
			}, jetstream.PullMaxMessages(raw.pending))
			if err != nil {
				b.Fatal(err)
			}
			waitCount(b, &got, b.N)
			b.StopTimer()
			cc.Stop()
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
		})
	}
}

// runAdapter runs the channel's deliveries alone (no channel runtime, no
// inbound routes) and returns what stops them.
func runAdapter(b *testing.B, ns *testenv.NATS, cfg webhook.Config) func() {
	b.Helper()
	a, err := webhook.New(cfg, channels.Env{NATS: testenv.Conn(b, ns)})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	if err := a.Start(ctx, nil, nil); err != nil {
		b.Fatal(err)
	}
	return func() {
		cancel()
		a.Wait()
	}
}

// benchStream starts a server with the stream ASSENT as the broker makes it,
// and no broker: nothing but the benchmark's consumers reads it.
func benchStream(b *testing.B) (*testenv.NATS, *nats.Conn) {
	b.Helper()
	ns := testenv.Server(b)
	nc := testenv.Conn(b, ns)
	js, _ := jetstream.New(nc)
	if _, err := js.CreateStream(context.Background(), jetstream.StreamConfig{
		Name: events.StreamName, Subjects: []string{events.AllSubjects}, Storage: jetstream.FileStorage,
	}); err != nil {
		b.Fatal(err)
	}
	return ns, nc
}

func benchReceiver(b *testing.B, got *atomic.Int64) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		got.Add(1)
		w.WriteHeader(http.StatusNoContent)
	}))
	b.Cleanup(srv.Close)
	return srv
}

// publishPending stores n pending events as the broker writes them.
func publishPending(b *testing.B, nc *nats.Conn, n int) {
	b.Helper()
	js, _ := jetstream.New(nc)
	deadline := time.Now().Add(time.Hour).UTC()
	for i := range n {
		id := events.NewID()
		e, err := events.New(events.TypePending, "", "broker/bench", events.Pending{
			RequestID: id, Deadline: deadline, Rule: "everything", Approvers: []string{"role:ops"},
			Request: events.Requested{Tool: "write_file", Agent: "coder", Args: []byte(fmt.Sprintf(`{"path":"/tmp/report-%d.csv","bytes":1024}`, i))},
		})
		if err != nil {
			b.Fatal(err)
		}
		h, body, _ := events.Encode(&e)
		if _, err := js.PublishMsgAsync(&nats.Msg{Subject: events.PendingPrefix + "coder", Header: nats.Header(h), Data: body}); err != nil {
			b.Fatal(err)
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(time.Minute):
		b.Fatal("publishing the events took over a minute")
	}
}

func waitCount(b *testing.B, got *atomic.Int64, n int) {
	b.Helper()
	deadline := time.Now().Add(10 * time.Minute)
	for got.Load() < int64(n) {
		if time.Now().After(deadline) {
			b.Fatalf("%d of %d events delivered after 10 minutes", got.Load(), n)
		}
		time.Sleep(time.Millisecond)
	}
}
