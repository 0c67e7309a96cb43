package app

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

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
