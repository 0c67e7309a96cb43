package broker

import (
	"strings"
	"sync/atomic"
	"time"

	"github.com/assent-dev/assent/pkg/events"
)

// Stats counts what this replica did since it started.
type Stats struct {
	Requested int64 `json:"requested"`
	Approved  int64 `json:"approved"`
	Denied    int64 `json:"denied"`
	Expired   int64 `json:"expired"`
	Cancelled int64 `json:"cancelled"`
	// Auto counts outcomes no person chose (mode, timeout, invalid request).
	Auto int64 `json:"auto"`
	// Rejected counts answers, cancels and events refused as invalid or late.
	Rejected int64 `json:"rejected"`
	// ShadowDisagreements counts requests the shadow policy would have decided
	// otherwise.
	ShadowDisagreements int64 `json:"shadow_disagreements"`
	// ForgedDecisions counts decided events found on the stream that this
	// broker did not make (its own could then not be published).
	ForgedDecisions int64 `json:"forged_decisions"`
	// Timers counts the pending requests this replica holds a local timer for.
	Timers int64 `json:"timers"`
}

type metrics struct {
	nRequested, nApproved, nDenied, nExpired, nCancelled, nAuto, nRejected, nShadow, nForged atomic.Int64
}

func (m *metrics) requested() { m.nRequested.Add(1) }
func (m *metrics) rejected()  { m.nRejected.Add(1) }

// decided counts one outcome.
func (m *metrics) decided(r *Record) {
	if r.Decision == nil {
		return
	}
	if r.Decision.Auto {
		m.nAuto.Add(1)
	}
	switch r.Decision.Outcome {
	case events.Approved:
		m.nApproved.Add(1)
	case events.Denied:
		m.nDenied.Add(1)
	case events.Expired:
		m.nExpired.Add(1)
	case events.Cancelled:
		m.nCancelled.Add(1)
	}
}

func (m *metrics) snapshot() Stats {
	return Stats{
		Requested: m.nRequested.Load(), Approved: m.nApproved.Load(), Denied: m.nDenied.Load(),
		Expired: m.nExpired.Load(), Cancelled: m.nCancelled.Load(), Auto: m.nAuto.Load(), Rejected: m.nRejected.Load(),
		ShadowDisagreements: m.nShadow.Load(), ForgedDecisions: m.nForged.Load(),
	}
}

// Decision describes a stored outcome, for Config.Observe.
type Decision struct {
	Outcome events.Outcome
	// Channel is where the deciding answer came from ("http", "slack", ...),
	// "auto" for a policy or a remembered choice, "timeout" for an expiry
	// or a timeout that approves, "cancel" for a cancel.
	Channel string
	// Latency is from the request's arrival to the decision.
	Latency time.Duration
	// Late is, for channel "timeout", how long after the request's deadline
	// the outcome was stored; zero for every other channel.
	Late time.Duration
}

// observe tells Config.Observe about r's outcome.
func (b *Broker) observe(r *Record) {
	if b.cfg.Observe == nil || r.Decision == nil {
		return
	}
	d := r.Decision
	channel := "auto"
	switch {
	case d.Outcome == events.Cancelled:
		channel = "cancel"
	case d.Auto && strings.HasPrefix(d.Reason, "timeout"):
		channel = "timeout"
	case !d.Auto && len(d.DecidedBy) > 0:
		channel = d.DecidedBy[len(d.DecidedBy)-1].Channel
		if channel == "" {
			channel = "unknown"
		}
	}
	var late time.Duration
	if channel == "timeout" {
		late = max(d.DecidedAt.Sub(r.Deadline), 0)
	}
	b.cfg.Observe(Decision{Outcome: d.Outcome, Channel: channel, Latency: d.DecidedAt.Sub(r.ReceivedAt), Late: late})
}

// Connection reports this replica's NATS connection: whether it is connected
// now, and how many times it has reconnected since it was made.
func (b *Broker) Connection() (connected bool, reconnects uint64) {
	return b.nc.IsConnected(), b.nc.Stats().Reconnects
}
