package app

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/assent-dev/assent/internal/broker"
)

// metricsHandler serves the broker's counters in the Prometheus text format,
// with the Go runtime and process collectors beside them.
func metricsHandler(b *broker.Broker) http.Handler {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	counter := func(name, help string, get func(broker.Stats) int64) {
		reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: "assent", Name: name, Help: help},
			func() float64 { return float64(get(b.Stats())) }))
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
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "assent", Name: "pending_timers", Help: "Pending requests this replica holds a local timer for."},
		func() float64 { return float64(b.Stats().Timers) }))
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
}
