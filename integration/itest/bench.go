package itest

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/assent-dev/assent/internal/natsembed"
)

// BenchServer starts an embedded server with file storage and the given fsync
// policy for a benchmark.
func BenchServer(b *testing.B, sync string) *nats.Conn {
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

// RunLoad calls one b.N times from conc goroutines and reports throughput and
// latency percentiles.
func RunLoad(b *testing.B, conc int, one func(ctx context.Context, i int) error) {
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
