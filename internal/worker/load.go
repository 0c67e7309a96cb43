package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/assent-dev/assent/pkg/events"
	"github.com/assent-dev/assent/pkg/handler"
)

// LoadConfig configures Load.
type LoadConfig struct {
	// N is how many requests to send. Required.
	N int
	// Concurrency is how many requests are in flight at once. Default 64.
	Concurrency int
	// Tool names the requests' tool. Default "load_test".
	Tool string
	// Timeout is asked for each request. Default 30s.
	Timeout time.Duration
	// Session groups the run's requests. Default: a new id.
	Session string
	// Args, if set, is sent with every request; otherwise each gets {"i": n}.
	Args json.RawMessage
}

// WithDefaults returns c with unset fields at their defaults.
func (c LoadConfig) WithDefaults() LoadConfig {
	if c.Concurrency == 0 {
		c.Concurrency = 64
	}
	if c.Tool == "" {
		c.Tool = "load_test"
	}
	if c.Timeout == 0 {
		c.Timeout = 30 * time.Second
	}
	if c.Session == "" {
		c.Session = events.NewID()
	}
	return c
}

// Validate reports every problem with c at once. Call it on WithDefaults' result.
func (c LoadConfig) Validate() error {
	var errs []error
	if c.N < 1 {
		errs = append(errs, fmt.Errorf("n %d: want at least 1 request", c.N))
	}
	if c.Concurrency < 1 || c.Concurrency > 100000 {
		errs = append(errs, fmt.Errorf("concurrency %d: want 1..100000", c.Concurrency))
	}
	if c.Timeout <= 0 || c.Timeout > events.MaxTimeout {
		errs = append(errs, fmt.Errorf("timeout %s: want more than 0 and at most %s", c.Timeout, events.MaxTimeout))
	}
	req := events.Requested{Tool: c.Tool, Args: c.Args, Session: c.Session}
	if err := req.Validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Latency summarises request-to-decision times of decided requests.
type Latency struct {
	Min, Mean, P50, P95, P99, Max time.Duration
}

// LoadResult is what Load measured.
type LoadResult struct {
	// Sent counts requests started (N, unless ctx ended first).
	Sent        int
	Concurrency int
	// Decided counts requests that got a decision, whatever its outcome.
	Decided int
	// Outcomes counts decided requests by outcome.
	Outcomes map[events.Outcome]int
	// Errors counts requests that ended without a decision; ErrorKinds
	// splits them: "no_decision", "tampered", "interrupted", "other".
	Errors     int
	ErrorKinds map[string]int
	// FirstError is the first error seen, as an example.
	FirstError string
	// Elapsed is the wall time of the whole run.
	Elapsed time.Duration
	// Throughput is decided requests per second of Elapsed.
	Throughput float64
	// Latency is over decided requests only.
	Latency Latency
}

// MarshalJSON writes times as milliseconds and seconds, for scripts.
func (r LoadResult) MarshalJSON() ([]byte, error) {
	ms := func(d time.Duration) float64 { return math.Round(float64(d)/float64(time.Microsecond)) / 1000 }
	type latency struct {
		Min  float64 `json:"min"`
		Mean float64 `json:"mean"`
		P50  float64 `json:"p50"`
		P95  float64 `json:"p95"`
		P99  float64 `json:"p99"`
		Max  float64 `json:"max"`
	}
	return json.Marshal(struct {
		Sent        int                    `json:"sent"`
		Concurrency int                    `json:"concurrency"`
		Decided     int                    `json:"decided"`
		Outcomes    map[events.Outcome]int `json:"outcomes"`
		Errors      int                    `json:"errors"`
		ErrorKinds  map[string]int         `json:"error_kinds,omitempty"`
		FirstError  string                 `json:"first_error,omitempty"`
		Elapsed     float64                `json:"elapsed_seconds"`
		Throughput  float64                `json:"decided_per_second"`
		Latency     latency                `json:"latency_ms"`
	}{
		r.Sent, r.Concurrency, r.Decided, r.Outcomes, r.Errors, r.ErrorKinds, r.FirstError,
		r.Elapsed.Seconds(), math.Round(r.Throughput*10) / 10,
		latency{ms(r.Latency.Min), ms(r.Latency.Mean), ms(r.Latency.P50), ms(r.Latency.P95), ms(r.Latency.P99), ms(r.Latency.Max)},
	})
}

// loadStats is one load goroutine's tally, merged at the end.
type loadStats struct {
	sent      int
	latencies []time.Duration
	outcomes  map[events.Outcome]int
	errKinds  map[string]int
	firstErr  error
}

// Load sends cfg.N requests through req, cfg.Concurrency at a time, and
// measures how long each takes to be decided. Point it at a broker in
// auto-approve mode: in manual mode every request waits for its timeout.
//
// Requests that end without a decision are counted, not fatal. If ctx ends,
// no more requests start, those in flight are cancelled, and the result so
// far is returned with ctx's error. A bad cfg gives an error and no requests.
func Load(ctx context.Context, req Requester, cfg LoadConfig) (LoadResult, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return LoadResult{}, fmt.Errorf("load config: %w", err)
	}
	workers := min(cfg.Concurrency, cfg.N)
	stats := make([]loadStats, workers)
	var next atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for w := range workers {
		st := &stats[w]
		st.outcomes = map[events.Outcome]int{}
		st.errKinds = map[string]int{}
		wg.Go(func() {
			for ctx.Err() == nil {
				i := int(next.Add(1))
				if i > cfg.N {
					return
				}
				args := cfg.Args
				if args == nil {
					args = json.RawMessage(`{"i":` + fmt.Sprint(i) + `}`)
				}
				st.sent++
				t0 := time.Now()
				d, err := req.Request(ctx, handler.Request{Requested: events.Requested{
					Tool:    cfg.Tool,
					Args:    args,
					Session: cfg.Session,
					CallID:  fmt.Sprint(i),
					Timeout: events.Duration(cfg.Timeout),
				}})
				if err != nil {
					st.errKinds[errorKind(ctx, err)]++
					if st.firstErr == nil {
						st.firstErr = err
					}
					continue
				}
				st.latencies = append(st.latencies, time.Since(t0))
				st.outcomes[d.Outcome]++
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)

	res := LoadResult{Concurrency: workers, Outcomes: map[events.Outcome]int{}, ErrorKinds: map[string]int{}, Elapsed: elapsed}
	var all []time.Duration
	for _, st := range stats {
		res.Sent += st.sent
		all = append(all, st.latencies...)
		for o, n := range st.outcomes {
			res.Outcomes[o] += n
		}
		for k, n := range st.errKinds {
			res.ErrorKinds[k] += n
			res.Errors += n
		}
		if st.firstErr != nil && res.FirstError == "" {
			res.FirstError = st.firstErr.Error()
		}
	}
	res.Decided = len(all)
	if elapsed > 0 {
		res.Throughput = float64(res.Decided) / elapsed.Seconds()
	}
	res.Latency = summarise(all)
	if err := ctx.Err(); err != nil {
		return res, fmt.Errorf("load stopped after %d of %d requests: %w", res.Sent, cfg.N, err)
	}
	return res, nil
}

func errorKind(ctx context.Context, err error) string {
	switch {
	case errors.Is(err, handler.ErrNoDecision):
		return "no_decision"
	case errors.Is(err, handler.ErrTampered):
		return "tampered"
	case ctx.Err() != nil:
		return "interrupted"
	}
	return "other"
}

// summarise sorts ds and returns its order statistics (nearest rank).
func summarise(ds []time.Duration) Latency {
	if len(ds) == 0 {
		return Latency{}
	}
	slices.Sort(ds)
	var sum time.Duration
	for _, d := range ds {
		sum += d
	}
	return Latency{
		Min:  ds[0],
		Mean: sum / time.Duration(len(ds)),
		P50:  percentile(ds, 50),
		P95:  percentile(ds, 95),
		P99:  percentile(ds, 99),
		Max:  ds[len(ds)-1],
	}
}

// percentile returns the nearest-rank p-th percentile of sorted ds.
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	rank := int(math.Ceil(p / 100 * float64(len(sorted))))
	return sorted[min(max(rank, 1), len(sorted))-1]
}
