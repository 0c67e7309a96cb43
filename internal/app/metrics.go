package app

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"

	"github.com/assent-dev/assent/internal/broker"
)

// metrics is the process's Prometheus registry: the broker's counters, the
// decision latency histogram, gauges, and the Go runtime and process
// collectors.
type metrics struct {
	reg     *prometheus.Registry
	latency *prometheus.HistogramVec
	late    prometheus.Histogram
}

func newMetrics() *metrics {
	m := &metrics{reg: prometheus.NewRegistry()}
	m.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m.latency = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: "assent", Name: "decision_latency_seconds",
		Help: "Time from a request's arrival to its decision, by outcome and by the channel that decided (auto, timeout, cancel, or the answer's channel).",
		// From automatic decisions (milliseconds) to people (minutes, hours).
		Buckets: []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 14400, 86400},
	}, []string{"outcome", "channel"})
	m.late = prometheus.NewHistogram(prometheus.HistogramOpts{
		Namespace: "assent", Name: "timeout_lateness_seconds",
		Help: "Time from a request's deadline to its timeout's decision, for the timeouts this replica decided.",
		// A local timer lands within milliseconds, another replica's backup
		// timer 400 ms late, the durable tick by the end of the second.
		Buckets: []float64{0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 300},
	})
	m.reg.MustRegister(m.latency, m.late)
	return m
}

// observe records one outcome; it is the broker's Config.Observe.
func (m *metrics) observe(d broker.Decision) {
	m.latency.WithLabelValues(string(d.Outcome), d.Channel).Observe(d.Latency.Seconds())
	if d.Channel == "timeout" {
		m.late.Observe(d.Late.Seconds())
	}
}

// register adds the broker's counters and gauges, and the authentication
// failures counted by authFailures (nil without authentication).
func (m *metrics) register(b *broker.Broker, authFailures func() map[string]int64) {
	counter := func(name, help string, get func(broker.Stats) int64) {
		m.reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: "assent", Name: name, Help: help},
			func() float64 { return float64(get(b.Stats())) }))
	}
	gauge := func(name, help string, get func() float64) {
		m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "assent", Name: name, Help: help}, get))
	}
	counter("requests_total", "Requests this replica stored.", func(s broker.Stats) int64 { return s.Requested })
	counter("approved_total", "Requests this replica decided approved.", func(s broker.Stats) int64 { return s.Approved })
	counter("denied_total", "Requests this replica decided denied.", func(s broker.Stats) int64 { return s.Denied })
	counter("expired_total", "Requests this replica decided expired.", func(s broker.Stats) int64 { return s.Expired })
	counter("cancelled_total", "Requests this replica decided cancelled.", func(s broker.Stats) int64 { return s.Cancelled })
	counter("automatic_decisions_total", "Outcomes no person chose: policy, remembered choice, timeout, invalid request.", func(s broker.Stats) int64 { return s.Auto })
	counter("rejected_messages_total", "Events, answers and cancels refused as invalid, late or forbidden.", func(s broker.Stats) int64 { return s.Rejected })
	counter("forged_decisions_total", "Decided events found on the stream that no broker made; the broker's own could not be published.", func(s broker.Stats) int64 { return s.ForgedDecisions })
	counter("shadow_disagreements_total", "Requests the shadow policy would have decided otherwise.", func(s broker.Stats) int64 { return s.ShadowDisagreements })
	gauge("pending_timers", "Pending requests this replica holds a local timer for.", func() float64 { return float64(b.Stats().Timers) })
	gauge("pending_requests", "Requests pending, as this replica's index knows them.", func() float64 { return float64(b.Pending()) })
	gauge("event_stream_clients", "Clients following GET /v1/events on this replica.", func() float64 { return float64(b.Subscribers()) })
	gauge("ready", "1 while this replica takes work and is connected to NATS (GET /readyz answers 200), else 0.", func() float64 { return bool01(b.Ready()) })
	gauge("nats_connected", "1 while this replica's NATS connection is up, else 0.", func() float64 {
		up, _ := b.Connection()
		return bool01(up)
	})
	m.reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: "assent", Name: "nats_reconnects_total", Help: "Times this replica's NATS connection was made again after it dropped."},
		func() float64 {
			_, n := b.Connection()
			return float64(n)
		}))
	if authFailures != nil {
		desc := prometheus.NewDesc("assent_auth_failures_total", "Failed authentications on the HTTP API, by reason.", []string{"reason"}, nil)
		m.reg.MustRegister(collectorFunc{desc, func(ch chan<- prometheus.Metric) {
			for reason, n := range authFailures() {
				ch <- prometheus.MustNewConstMetric(desc, prometheus.CounterValue, float64(n), reason)
			}
		}})
	}
}

func bool01(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

func (m *metrics) handler() http.Handler { return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{}) }

// collectorFunc is a collector of one metric family computed on scrape.
type collectorFunc struct {
	desc    *prometheus.Desc
	collect func(chan<- prometheus.Metric)
}

func (c collectorFunc) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }
func (c collectorFunc) Collect(ch chan<- prometheus.Metric) { c.collect(ch) }

// metricsFirst serves GET (and HEAD) /metrics with metrics, and everything
// else with h.
func metricsFirst(metrics, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/metrics" {
			h.ServeHTTP(w, r)
			return
		}
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			metricsError(w, http.StatusMethodNotAllowed, "method_not_allowed", "/metrics takes GET")
			return
		}
		metrics.ServeHTTP(w, r)
	})
}

// metricsToken is the bearer token GET /metrics requires
// (--metrics-token), read from its file at start, and again when the
// file changes or on SIGHUP.
type metricsToken struct {
	path string
	sum  atomic.Pointer[[sha256.Size]byte] // of the token in force

	mu   sync.Mutex
	seen fileStamp // the file when last read
}

// minMetricsToken is the length of the shortest token taken: guessing one
// must be hopeless, and /metrics counts no failures.
const minMetricsToken = 16

// fileStamp tells whether a file changed since it was read.
type fileStamp struct {
	mod  time.Time
	size int64
}

func stampFile(path string) fileStamp {
	fi, err := os.Stat(path)
	if err != nil {
		return fileStamp{}
	}
	return fileStamp{fi.ModTime(), fi.Size()}
}

// loadMetricsToken reads the token in path; the error says what is wrong
// with the file.
func loadMetricsToken(path string) (*metricsToken, error) {
	t := &metricsToken{path: path}
	if err := t.reload(); err != nil {
		return nil, err
	}
	return t, nil
}

// reload reads the file again; a token it refuses leaves the one in force.
func (t *metricsToken) reload() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.seen = stampFile(t.path)
	data, err := os.ReadFile(t.path)
	if err != nil {
		return fmt.Errorf("metrics token file (--metrics-token): %w", err)
	}
	tok := strings.TrimSpace(string(data))
	switch {
	case tok == "":
		return fmt.Errorf("metrics token file %s is empty: put a long random token in it, such as openssl rand -hex 32 makes", t.path)
	case strings.ContainsAny(tok, " \t\r\n"):
		return fmt.Errorf("metrics token file %s holds more than one word: the token is one word, such as openssl rand -hex 32 makes", t.path)
	case len(tok) < minMetricsToken:
		return fmt.Errorf("metrics token file %s holds %d characters: use at least %d, such as openssl rand -hex 32 makes", t.path, len(tok), minMetricsToken)
	}
	sum := sha256.Sum256([]byte(tok))
	t.sum.Store(&sum)
	return nil
}

// reloadOrKeep reloads the token, logging what happened.
func (t *metricsToken) reloadOrKeep(log *zap.Logger) {
	if err := t.reload(); err != nil {
		log.Error("metrics token reload refused; keeping the one in force", zap.Error(err))
		return
	}
	log.Info("metrics token reloaded", zap.String("file", t.path))
}

// watch reloads the token when its file changes, until ctx ends.
func (t *metricsToken) watch(ctx context.Context, log *zap.Logger) {
	tick := time.NewTicker(2 * time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		t.mu.Lock()
		changed := t.seen != stampFile(t.path)
		t.mu.Unlock()
		if changed {
			t.reloadOrKeep(log)
		}
	}
}

// require serves h to requests that carry the token (Authorization: Bearer
// TOKEN), and 401 unauthenticated to the rest. The tokens are compared by
// their SHA-256 sums, in constant time.
func (t *metricsToken) require(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		sum := sha256.Sum256([]byte(strings.TrimSpace(got)))
		if !ok || subtle.ConstantTimeCompare(sum[:], t.sum.Load()[:]) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="assent metrics"`)
			metricsError(w, http.StatusUnauthorized, "unauthenticated", "GET /metrics needs the metrics token: Authorization: Bearer TOKEN (--metrics-token)")
			return
		}
		h.ServeHTTP(w, r)
	})
}

// metricsError writes a JSON error as the API does.
func metricsError(w http.ResponseWriter, status int, code, msg string) {
	body, _ := json.Marshal(map[string]map[string]string{"error": {"code": code, "message": msg}})
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(append(body, '\n'))
}
