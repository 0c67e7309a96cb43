package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/assent-dev/assent/integration/itest"
	"github.com/assent-dev/assent/internal/broker"
	"github.com/assent-dev/assent/internal/slacktest"
	"github.com/assent-dev/assent/internal/smtptest"
	"github.com/assent-dev/assent/internal/testenv"
	"github.com/assent-dev/assent/pkg/events"
)

// BenchmarkFanOut measures how long a pending request takes to reach the
// people and systems of every channel: b.N requests are made at once, and
// each channel's delivery of each is timed from the moment its pending
// event was stored.
//
//   - approver-bot: one bot process (in this one) running Slack (the local
//     Web API server: chat.postMessage), email (the local SMTP server,
//     STARTTLS and AUTH, one mail per request to bob) and a webhook endpoint
//     (a local receiver). Reported per channel: p50 and p99 in ms.
//
//   - raw-jetstream: the least work for the same fan-out: for each request a
//     "requested" and a "pending" message stored at once on a stream; three
//     durable consumers, one per channel, POST each message they take to a
//     local HTTP server and acknowledge it. Slack and email take the pending
//     messages, 16 at once as the bot's runtime does; the webhook takes both,
//     one at a time, in order, as the webhook channel does. No decoding,
//     policy lookup, rendering, TLS, SMTP, signing or recording what was
//     shown.
//
// docs/benchmarks.md records:
//
//	go test ./integration -run '^$' -bench FanOut -benchtime 1000x
func BenchmarkFanOut(b *testing.B) {
	b.Run("approver-bot", func(b *testing.B) {
		w := newChannelWorld(b)
		w.runBot(b, "bench")
		// A first request makes the channels' consumers and connections.
		warm, _ := w.ask(b, "warm-up")
		w.shown(b, warm)

		ids := make([]string, b.N)
		b.ResetTimer()
		for i := range b.N {
			ids[i], _ = w.ask(b, fmt.Sprintf("svc-%d", i))
		}
		itest.Eventually(b, 10*time.Minute, func() (bool, string) {
			s, m, h := len(w.slack.Messages()), len(w.smtp.Matching(func(smtptest.Delivery) bool { return true })), len(w.hooks.byType(events.TypePending))
			return s > b.N && m > b.N && h > b.N, fmt.Sprintf("%d Slack messages, %d mails, %d pending webhooks of %d requests", s-1, m-1, h-1, b.N)
		})
		b.StopTimer()

		pending := pendingTimes(b, w)
		var slack, mail, hook []time.Duration
		for _, m := range w.slack.Messages() {
			slack = appendSince(b, slack, pending, slackRequestID(b, m), m.Posted)
		}
		for _, d := range w.smtp.Matching(func(smtptest.Delivery) bool { return true }) {
			mail = appendSince(b, mail, pending, mailRequestID(b, d.Data), d.At)
		}
		for _, e := range w.hooks.byType(events.TypePending) {
			hook = appendSince(b, hook, pending, e.RequestID, e.At)
		}
		for _, c := range []struct {
			name string
			lat  []time.Duration
		}{{"slack", slack}, {"email", mail}, {"webhook", hook}} {
			reportLatency(b, c.name, c.lat)
		}
	})
	b.Run("raw-jetstream", func(b *testing.B) {
		ns := testenv.Server(b)
		nc := testenv.Conn(b, ns)
		js := itest.NewJS(b, nc)
		ctx := context.Background()
		if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "RAW", Subjects: []string{"raw.>"}, Storage: jetstream.FileStorage}); err != nil {
			b.Fatal(err)
		}
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusOK) }))
		b.Cleanup(srv.Close)
		var mu sync.Mutex
		lat := map[string][]time.Duration{}
		var wg sync.WaitGroup
		wg.Add(3 * b.N)
		for _, c := range []struct {
			name, filter string
			at           int // handlers at once
		}{{"slack", "raw.pending.>", 16}, {"email", "raw.pending.>", 16}, {"webhook", "raw.>", 1}} {
			cons, err := js.CreateOrUpdateConsumer(ctx, "RAW", jetstream.ConsumerConfig{Durable: c.name, FilterSubject: c.filter, AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: c.at})
			if err != nil {
				b.Fatal(err)
			}
			sem := make(chan struct{}, c.at)
			cc, err := cons.Consume(func(m jetstream.Msg) {
				sem <- struct{}{}
				go func() {
					defer func() { <-sem }()
					if resp, err := http.Post(srv.URL, "application/octet-stream", bytes.NewReader(m.Data())); err == nil {
						resp.Body.Close()
					}
					_ = m.Ack()
					if !strings.HasPrefix(m.Subject(), "raw.pending.") {
						return
					}
					meta, err := m.Metadata()
					if err != nil {
						b.Error(err)
					}
					mu.Lock()
					lat[c.name] = append(lat[c.name], time.Since(meta.Timestamp))
					mu.Unlock()
					wg.Done()
				}()
			})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(cc.Stop)
		}
		body := []byte(`{"request_id":"x","tool":"deploy","args":{"service":"svc"}}`)
		b.ResetTimer()
		for i := range b.N {
			for _, kind := range []string{"requested", "pending"} {
				if _, err := js.PublishAsync(fmt.Sprintf("raw.%s.%d", kind, i), body); err != nil {
					b.Fatal(err)
				}
			}
		}
		wg.Wait()
		b.StopTimer()
		for _, name := range []string{"slack", "email", "webhook"} {
			reportLatency(b, name, lat[name])
		}
	})
}

// byType returns the deliveries of type typ.
func (r *hookReceiver) byType(typ string) []hookEvent {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []hookEvent
	for _, e := range r.got {
		if e.Type == typ {
			out = append(out, e)
		}
	}
	return out
}

// pendingTimes reads when each request's pending event was stored.
func pendingTimes(b *testing.B, w *channelWorld) map[string]time.Time {
	b.Helper()
	ctx, cancel := itest.OpCtx()
	defer cancel()
	c, err := w.js.OrderedConsumer(ctx, broker.StreamName, jetstream.OrderedConsumerConfig{FilterSubjects: []string{events.PendingPrefix + "*"}})
	if err != nil {
		b.Fatal(err)
	}
	out := map[string]time.Time{}
	for {
		batch, err := c.FetchNoWait(500)
		if err != nil {
			b.Fatal(err)
		}
		n := 0
		for m := range batch.Messages() {
			n++
			e, err := events.Decode(events.Header(m.Headers()), m.Data())
			if err != nil {
				b.Fatal(err)
			}
			p, err := events.DecodePending(&e)
			if err != nil {
				b.Fatal(err)
			}
			meta, err := m.Metadata()
			if err != nil {
				b.Fatal(err)
			}
			out[p.RequestID] = meta.Timestamp
		}
		if batch.Error() != nil {
			b.Fatal(batch.Error())
		}
		if n == 0 {
			return out
		}
	}
}

// appendSince appends how long after its pending event request id was
// delivered at.
func appendSince(b *testing.B, lat []time.Duration, pending map[string]time.Time, id string, at time.Time) []time.Duration {
	b.Helper()
	p, ok := pending[id]
	if !ok {
		b.Fatalf("a delivery about %q, which has no pending event", id)
	}
	return append(lat, at.Sub(p))
}

// slackRequestID is the request a Slack message is about: its buttons carry
// the id.
func slackRequestID(b *testing.B, m slacktest.Message) string {
	b.Helper()
	var blocks []struct {
		Elements []struct {
			Value string `json:"value"`
		} `json:"elements"`
	}
	if err := json.Unmarshal([]byte(m.Blocks), &blocks); err != nil {
		b.Fatal(err)
	}
	for _, bl := range blocks {
		for _, e := range bl.Elements {
			if e.Value != "" {
				return e.Value
			}
		}
	}
	b.Fatalf("a Slack message without a button: %s", m.Blocks)
	return ""
}

var mailID = regexp.MustCompile(`<assent\.([A-Za-z0-9_-]+)\.`)

// mailRequestID is the request a mail is about, from its Message-ID.
func mailRequestID(b *testing.B, data []byte) string {
	b.Helper()
	m := mailID.FindSubmatch(data)
	if m == nil {
		b.Fatalf("a mail without an Assent Message-ID:\n%s", data)
	}
	return string(m[1])
}

// reportLatency reports the p50 and p99 of lat as name-p50-ms and
// name-p99-ms.
func reportLatency(b *testing.B, name string, lat []time.Duration) {
	b.Helper()
	if len(lat) == 0 {
		b.Fatalf("%s: nothing delivered", name)
	}
	slices.Sort(lat)
	pct := func(p float64) float64 { return float64(lat[int(float64(len(lat)-1)*p)].Microseconds()) / 1000 }
	b.ReportMetric(pct(0.50), name+"-p50-ms")
	b.ReportMetric(pct(0.99), name+"-p99-ms")
}
