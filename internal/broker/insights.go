package broker

import (
	"context"
	"fmt"

	"github.com/assent-dev/assent/internal/insights"
	"github.com/assent-dev/assent/pkg/events"
)

// Every replica keeps an insights aggregator up to date with the stream
// (docs/insights.md): a follower of its own reads the stream from its first
// message in the background, apart from the ledger, so that reading a long
// record delays neither readiness nor the handling of requests.

// newInsights returns the aggregator of a broker with cfg, which keeps what
// the stream keeps, and takes as decisions what its readers take (trusted:
// the keys of brokers that sign, nil if they do not).
func newInsights(cfg Config, trusted *events.TrustedKeys) (*insights.Aggregator, error) {
	return insights.New(insights.Config{Keep: cfg.Retention, Trusted: trusted})
}

// followInsights feeds the aggregator from the stream until ctx ends.
func (b *Broker) followInsights(ctx context.Context) error {
	return insights.Follow(ctx, b.js, StreamName, b.insights, b.log.Named("insights"))
}

// Insights returns what the record says about the requests f selects
// (docs/insights.md). It answers from the aggregator every replica keeps up
// to date as the stream grows; Report.Complete is false while the replica is
// still reading the stream from its start. A filter whose window is invalid
// (Since after Until, longer than insights.MaxWindow) gets an error wrapping
// ErrInvalid.
func (b *Broker) Insights(ctx context.Context, f insights.Filter) (insights.Report, error) {
	if err := ctx.Err(); err != nil {
		return insights.Report{}, err
	}
	now := b.now()
	if _, _, err := f.Window(now); err != nil {
		return insights.Report{}, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	return b.insights.Query(f, now), nil
}

// history is what the record says of requests like r, for its pending
// event; nil until this replica's aggregator has read the whole record
// once.
func (b *Broker) history(r *Record) *events.History {
	if !b.insights.CaughtUp() {
		return nil
	}
	digest, err := events.ArgsDigest(r.Request.Args)
	if err != nil {
		return nil
	}
	return b.insights.History(r.Request.Tool, r.Request.Agent, digest, b.now())
}

// History is what the record says now of requests like rec (same tool and
// agent, and among them the same args): the line approvers see beside a
// pending request. Nil until this replica's aggregator has read the whole
// record once.
func (b *Broker) History(rec Record) *events.History { return b.history(&rec) }
