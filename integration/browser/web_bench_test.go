package browser

import (
	"bufio"
	"bytes"
	"context"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/assent-dev/assent/integration/itest"
	"github.com/assent-dev/assent/internal/broker"
	"github.com/assent-dev/assent/internal/brokertest"
	"github.com/assent-dev/assent/internal/clustertest"
	"github.com/assent-dev/assent/pkg/events"
)

var (
	sseClients = flag.Int("sse-clients", 1000, "BenchmarkEventStream: event stream clients")
	sseRate    = flag.Int("sse-rate", 1000, "BenchmarkEventStream: requests per second")
)

// latencies collects delivery latencies from many goroutines.
type latencies struct {
	mu sync.Mutex
	d  []time.Duration
}

func (l *latencies) add(d time.Duration) {
	l.mu.Lock()
	l.d = append(l.d, d)
	l.mu.Unlock()
}

func (l *latencies) report(b *testing.B, want int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.d) == 0 {
		b.Fatal("no deliveries")
	}
	slices.Sort(l.d)
	pct := func(p float64) float64 { return float64(l.d[int(float64(len(l.d)-1)*p)].Microseconds()) / 1000 }
	b.ReportMetric(pct(0.50), "p50-ms")
	b.ReportMetric(pct(0.99), "p99-ms")
	b.ReportMetric(float64(l.d[len(l.d)-1].Microseconds())/1000, "max-ms")
	b.ReportMetric(float64(len(l.d))/float64(want), "delivered")
}

// stage reports the median of a stage's latencies as name-p50-ms.
func (l *latencies) stage(b *testing.B, name string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	slices.Sort(l.d)
	b.ReportMetric(float64(l.d[(len(l.d)-1)/2].Microseconds())/1000, name+"-p50-ms")
}

// pace publishes n requests at rate per second with publish, on a schedule
// that catches up if it falls behind.
func pace(b *testing.B, n, rate int, publish func(i int) error) {
	b.Helper()
	start := time.Now()
	for i := range n {
		if d := time.Until(start.Add(time.Duration(i) * time.Second / time.Duration(rate))); d > 0 {
			time.Sleep(d)
		}
		if err := publish(i); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(n)/time.Since(start).Seconds(), "req/s")
}

// storedAt reads the "time" of an event stream data line without decoding
// the whole event: a benchmark client must cost little beside the broker.
func storedAt(data []byte) (time.Time, bool) {
	const key = `"time":"`
	i := bytes.Index(data, []byte(key))
	if i < 0 {
		return time.Time{}, false
	}
	rest := data[i+len(key):]
	j := bytes.IndexByte(rest, '"')
	if j < 0 {
		return time.Time{}, false
	}
	t, err := time.Parse(time.RFC3339Nano, string(rest[:j]))
	return t, err == nil
}

// BenchmarkEventStream: -sse-clients clients follow GET /v1/events of a
// broker process (auto-approve, --sync 2m) while requests arrive at -sse-rate
// per second; each request is two events (requested, decided). In
// "every-event" each client follows every event; in "one-agent-of-100" the
// requests come from 100 agents and each client follows one of them, as an
// approver's page follows its team. Latency is from the stream storing an
// event to a client reading it. b.N is the number of requests. Reports the
// broker's resident memory at the end. The baseline: as many core NATS
// subscribers receiving the same messages from the same kind of publisher.
func BenchmarkEventStream(b *testing.B) {
	for _, shape := range []struct {
		name   string
		agents int
	}{{"every-event", 1}, {"one-agent-of-100", 100}} {
		b.Run("assent/"+shape.name, func(b *testing.B) { benchEventStream(b, shape.agents) })
		b.Run("raw-nats/"+shape.name, func(b *testing.B) { benchRawFanOut(b, shape.agents) })
	}
}

func benchEventStream(b *testing.B, agents int) {
	bin := itest.BrokerBinary(b)
	natsPort, httpPort := clustertest.FreePort(b), clustertest.FreePort(b)
	var log itest.LockedBuffer
	p := itest.StartBrokerProc(b, bin, append(itest.EmbeddedArgs(b.TempDir(), natsPort), "--mode", "auto-approve", "--sync", "2m"), httpPort, &log)
	base := "http://127.0.0.1:" + strconv.Itoa(httpPort)
	nc, err := nats.Connect("nats://127.0.0.1:" + strconv.Itoa(natsPort))
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)

	var lat latencies
	var ready sync.WaitGroup
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: *sseClients, DialContext: (&net.Dialer{}).DialContext}}
	var clients sync.WaitGroup
	for i := range *sseClients {
		ready.Add(1)
		clients.Go(func() {
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("%s/v1/events?agent=sse-%d", base, i%agents), nil)
			resp, err := client.Do(req)
			ready.Done()
			if err != nil {
				return
			}
			defer resp.Body.Close()
			sc := bufio.NewScanner(resp.Body)
			sc.Buffer(make([]byte, 64<<10), 1<<20)
			for sc.Scan() {
				if line := sc.Bytes(); bytes.HasPrefix(line, []byte("data: ")) {
					if at, ok := storedAt(line[6:]); ok {
						lat.add(time.Since(at))
					}
				}
			}
		})
	}
	ready.Wait()
	waitMetric(b, base, fmt.Sprintf("assent_event_stream_clients %d", *sseClients))
	b.ResetTimer()
	pace(b, b.N, *sseRate, func(i int) error {
		agent := fmt.Sprintf("sse-%d", i%agents)
		e, err := events.New(events.TypeRequested, "", "agent/"+agent, events.Requested{Tool: "noop"})
		if err != nil {
			return err
		}
		h, body, _ := events.Encode(&e)
		_, err = js.PublishMsgAsync(&nats.Msg{Subject: events.RequestPrefix + agent, Header: nats.Header(h), Data: body})
		return err
	})
	want := 2 * b.N * *sseClients / agents
	lat.wait(want)
	b.StopTimer()
	lat.report(b, want)
	b.ReportMetric(float64(rssKB(b, p.Cmd.Process.Pid))/1024, "broker-RSS-MiB")
	cancel()
	clients.Wait()
}

func benchRawFanOut(b *testing.B, agents int) {
	nc := itest.BenchServer(b, "2m")
	var lat latencies
	var conns []*nats.Conn
	// Spread the subscribers over 50 connections, as browsers would not
	// share one.
	for range 50 {
		c, err := nats.Connect(nc.ConnectedUrl())
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		conns = append(conns, c)
	}
	for i := range *sseClients {
		_, err := conns[i%len(conns)].Subscribe(fmt.Sprintf("raw.events.%d", i%agents), func(m *nats.Msg) {
			sent, _ := strconv.ParseInt(string(m.Data), 10, 64)
			lat.add(time.Since(time.Unix(0, sent)))
		})
		if err != nil {
			b.Fatal(err)
		}
	}
	for _, c := range conns {
		_ = c.Flush()
	}
	b.ResetTimer()
	pace(b, b.N, *sseRate, func(i int) error {
		// Two events per request, as the broker's.
		for range 2 {
			if err := nc.Publish(fmt.Sprintf("raw.events.%d", i%agents), []byte(strconv.FormatInt(time.Now().UnixNano(), 10))); err != nil {
				return err
			}
		}
		return nil
	})
	want := 2 * b.N * *sseClients / agents
	lat.wait(want)
	b.StopTimer()
	lat.report(b, want)
}

// wait waits (up to 30s) until n deliveries are in.
func (l *latencies) wait(n int) {
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		l.mu.Lock()
		got := len(l.d)
		l.mu.Unlock()
		if got >= n {
			return
		}
	}
}

// waitMetric polls base's /metrics until a line equals want.
func waitMetric(b *testing.B, base, want string) {
	b.Helper()
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(50 * time.Millisecond) {
		if r, err := http.Get(base + "/metrics"); err == nil {
			var body bytes.Buffer
			_, _ = body.ReadFrom(r.Body)
			r.Body.Close()
			if strings.Contains(body.String(), want+"\n") {
				return
			}
		}
		if time.Now().After(deadline) {
			b.Fatalf("metric %q never seen", want)
		}
	}
}

// rssKB reads a process's resident set size.
func rssKB(b *testing.B, pid int) int {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			n, _ := strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")))
			return n
		}
	}
	return 0
}

// BenchmarkListPending: GET /v1/approvals?state=pending&limit=100 with 10,000
// pending and 100,000 decided requests on the stream (fewer with -short). The
// baseline reads 100 of the pending requests straight from the stream, a get
// by the request's stream sequence each, the least a page of 100 costs
// without an index (the stream is the only state; there is no bucket entry
// per request to read instead).
func BenchmarkListPending(b *testing.B) {
	pendingN, decidedN := 10_000, 100_000
	if testing.Short() {
		pendingN, decidedN = 1_000, 10_000
	}
	nc := itest.BenchServer(b, "2m")
	// Fill the stream: decided ones in auto-approve mode, then pending ones
	// under a policy that asks a person.
	fill, stop := brokertest.Run(b, nc, broker.Config{Name: "fill", Mode: broker.ModeAutoApprove})
	submitMany(b, fill, decidedN, "decided")
	stop()
	bk, _ := brokertest.Run(b, nc, broker.Config{Name: "list"})
	seqs := submitMany(b, bk, pendingN, "pending")
	api := itest.ServeAPI(b, bk)
	url := api + "/v1/approvals?state=pending&limit=100"
	b.Run("assent", func(b *testing.B) {
		itest.RunLoad(b, 1, func(ctx context.Context, _ int) error {
			r, err := itest.DoHTTP(ctx, http.MethodGet, url, nil)
			if err == nil && (r.Status != http.StatusOK || !bytes.Contains(r.Body, []byte(fmt.Sprintf(`"total":%d`, pendingN)))) {
				err = fmt.Errorf("status %d: %.200s", r.Status, r.Body)
			}
			return err
		})
	})
	b.Run("raw-stream-get-100", func(b *testing.B) {
		js, _ := jetstream.New(nc)
		c, cancel := itest.OpCtx()
		stream, err := js.Stream(c, events.StreamName)
		cancel()
		if err != nil {
			b.Fatal(err)
		}
		itest.RunLoad(b, 1, func(ctx context.Context, i int) error {
			for _, seq := range seqs[(i*100)%len(seqs):][:min(100, len(seqs)-(i*100)%len(seqs))] {
				if _, err := stream.GetMsg(ctx, seq); err != nil {
					return err
				}
			}
			return nil
		})
	})
}

// submitMany submits n requests to b, 64 at a time, and returns the stream
// sequences of their requests.
func submitMany(tb testing.TB, b *broker.Broker, n int, tool string) []uint64 {
	tb.Helper()
	seqs := make([]uint64, n)
	var next atomic.Int64
	var wg sync.WaitGroup
	var failed atomic.Value
	for range 64 {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				rec, err := b.Submit(ctx, "", "bench/list", events.Requested{Agent: "lister", Tool: tool, Session: "s-" + strconv.Itoa(i%100)})
				cancel()
				if err == nil && rec.RequestSeq == 0 {
					err = fmt.Errorf("request %s: no stream sequence in its record", rec.ID)
				}
				if err != nil {
					failed.CompareAndSwap(nil, err)
					return
				}
				seqs[i] = rec.RequestSeq
			}
		})
	}
	wg.Wait()
	if err, _ := failed.Load().(error); err != nil {
		tb.Fatal(err)
	}
	return seqs
}
