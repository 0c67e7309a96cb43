package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
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
	// Progress, if set, is called every ProgressEvery (default 5s) while
	// the run lasts, with how many requests have ended so far, of n.
	Progress      func(ended, n int, elapsed time.Duration)
	ProgressEvery time.Duration
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
	if c.ProgressEvery <= 0 {
		c.ProgressEvery = 5 * time.Second
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

// LoadResult is what Load or AnswerLoad measured.
type LoadResult struct {
	// Target names what was measured: "assent", "raw-jetstream" or
	// "raw-jetstream-stored" (the baselines); empty if the caller did not
	// say. Load and AnswerLoad leave
	// it to the caller.
	Target string
	// Sent counts requests started (N, unless ctx ended first).
	Sent        int
	Concurrency int
	// Decided counts requests that got a decision, whatever its outcome.
	Decided int
	// Outcomes counts decided requests by outcome.
	Outcomes map[events.Outcome]int
	// Errors counts requests that ended without a decision; ErrorKinds
	// splits them: "no_decision", "tampered", "interrupted", "other", and
	// for AnswerLoad "unanswered" and "answer_failed".
	Errors     int
	ErrorKinds map[string]int
	// FirstError is the first error seen, as an example.
	FirstError string
	// Elapsed is the wall time of the whole run.
	Elapsed time.Duration
	// Throughput is decided requests per second of Elapsed.
	Throughput float64
	// Latency is request to decision, over decided requests only.
	Latency Latency
	// Answered says the run was AnswerLoad's: an approver answered each
	// request, and Answer and Pending are set.
	Answered bool
	// Answer is the time from publishing the approval to the agent
	// receiving the decision; Pending from asking to the approver seeing
	// the request's pending notice. Over decided requests only.
	Answer, Pending Latency
}

// MarshalJSON writes times as milliseconds and seconds, for scripts.
func (r LoadResult) MarshalJSON() ([]byte, error) {
	type latency struct {
		Min  float64 `json:"min"`
		Mean float64 `json:"mean"`
		P50  float64 `json:"p50"`
		P95  float64 `json:"p95"`
		P99  float64 `json:"p99"`
		Max  float64 `json:"max"`
	}
	ms := func(d time.Duration) float64 { return math.Round(float64(d)/float64(time.Microsecond)) / 1000 }
	inMS := func(l Latency) *latency {
		return &latency{ms(l.Min), ms(l.Mean), ms(l.P50), ms(l.P95), ms(l.P99), ms(l.Max)}
	}
	var answer, pending *latency
	if r.Answered {
		answer, pending = inMS(r.Answer), inMS(r.Pending)
	}
	return json.Marshal(struct {
		Target      string                 `json:"target,omitempty"`
		Sent        int                    `json:"sent"`
		Concurrency int                    `json:"concurrency"`
		Decided     int                    `json:"decided"`
		Outcomes    map[events.Outcome]int `json:"outcomes"`
		Errors      int                    `json:"errors"`
		ErrorKinds  map[string]int         `json:"error_kinds,omitempty"`
		FirstError  string                 `json:"first_error,omitempty"`
		Elapsed     float64                `json:"elapsed_seconds"`
		Throughput  float64                `json:"decided_per_second"`
		Latency     *latency               `json:"latency_ms"`
		Answer      *latency               `json:"answer_ms,omitempty"`
		Pending     *latency               `json:"pending_ms,omitempty"`
	}{
		r.Target, r.Sent, r.Concurrency, r.Decided, r.Outcomes, r.Errors, r.ErrorKinds, r.FirstError,
		r.Elapsed.Seconds(), math.Round(r.Throughput*10) / 10,
		inMS(r.Latency), answer, pending,
	})
}

// loadStats is one load goroutine's tally, merged at the end.
type loadStats struct {
	sent      int
	latencies []time.Duration
	answers   []time.Duration // AnswerLoad only
	pendings  []time.Duration // AnswerLoad only
	outcomes  map[events.Outcome]int
	errKinds  map[string]int
	firstErr  error
}

// decided counts a decision that took lat from the request.
func (st *loadStats) decided(lat time.Duration, o events.Outcome) {
	st.latencies = append(st.latencies, lat)
	st.outcomes[o]++
}

// fail counts a request that ended without a decision.
func (st *loadStats) fail(kind string, err error) {
	st.errKinds[kind]++
	if st.firstErr == nil {
		st.firstErr = err
	}
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
	return drive(ctx, cfg, func(ctx context.Context, i int, st *loadStats) {
		t0 := time.Now()
		d, err := req.Request(ctx, cfg.request(i))
		if err != nil {
			st.fail(errorKind(ctx, err), err)
			return
		}
		st.decided(time.Since(t0), d.Outcome)
	})
}

// request returns the i-th request of a run.
func (c LoadConfig) request(i int) handler.Request {
	args := c.Args
	if args == nil {
		args = json.RawMessage(`{"i":` + strconv.Itoa(i) + `}`)
	}
	return handler.Request{Requested: events.Requested{
		Tool:    c.Tool,
		Args:    args,
		Session: c.Session,
		CallID:  strconv.Itoa(i),
		Timeout: events.Duration(c.Timeout),
	}}
}

// drive calls one for requests 1 to cfg.N from cfg.Concurrency goroutines,
// each with its own tally, and merges the tallies. It reports progress to
// cfg.Progress, if set, every cfg.ProgressEvery. If ctx ends, no more
// requests start; the result so far comes with ctx's error.
func drive(ctx context.Context, cfg LoadConfig, one func(ctx context.Context, i int, st *loadStats)) (LoadResult, error) {
	workers := min(cfg.Concurrency, cfg.N)
	stats := make([]loadStats, workers)
	var next, done atomic.Int64
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
				st.sent++
				one(ctx, i, st)
				done.Add(1)
			}
		})
	}
	finished := make(chan struct{})
	var pg sync.WaitGroup
	if cfg.Progress != nil {
		pg.Go(func() {
			t := time.NewTicker(cfg.ProgressEvery)
			defer t.Stop()
			for {
				select {
				case <-finished:
					return
				case <-t.C:
					cfg.Progress(int(done.Load()), cfg.N, time.Since(start))
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	close(finished)
	pg.Wait()

	res := LoadResult{Concurrency: workers, Outcomes: map[events.Outcome]int{}, ErrorKinds: map[string]int{}, Elapsed: elapsed}
	var all, answers, pendings []time.Duration
	for _, st := range stats {
		res.Sent += st.sent
		all = append(all, st.latencies...)
		answers = append(answers, st.answers...)
		pendings = append(pendings, st.pendings...)
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
	res.Answer = summarise(answers)
	res.Pending = summarise(pendings)
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
