package broker

import (
	"context"
	"time"

	"github.com/assent-dev/assent/pkg/policy"
)

// SetCommitHook makes b call fn right after it stores an outcome and before it
// publishes the decided event: the window a crash test aims at.
func (b *Broker) SetCommitHook(fn func(id string)) { b.afterCommit = fn }

// SetPublishHook makes b call fn right after it publishes an outcome decided
// at once and before it acknowledges the request message.
func (b *Broker) SetPublishHook(fn func(id string)) { b.afterPublish = fn }

// Published reports whether the decision the state records for request id
// is on the stream, as the redelivery of its trigger finds out.
func (b *Broker) Published(ctx context.Context, id string) (bool, error) {
	rec, err := b.load(ctx, id)
	if err != nil {
		return false, err
	}
	return b.published(ctx, &rec)
}

// ForgetLocalGrants empties this replica's copy of the remembered choices, as
// a watcher that fell behind would leave it; the bucket keeps them.
func (b *Broker) ForgetLocalGrants() {
	for _, gr := range b.grants.list() {
		b.grants.remove(gr.Key())
	}
	b.grants.applied.Store(0)
}

// KeepLocalGrant puts gr into this replica's copy only, as a watcher that has
// not yet seen its revocation would keep it.
func (b *Broker) KeepLocalGrant(gr policy.Grant) {
	b.grants.put(gr.Key(), gr)
	b.grants.applied.Store(0)
}

// ConsumerRequests names the durable consumer the replicas take requests from.
const ConsumerRequests = consumerRequests

// WithFeedIdle returns c with the event feed stopping d after its last
// subscriber left.
func WithFeedIdle(c Config, d time.Duration) Config {
	c.feedIdle = d
	return c
}

// Knows reports whether b's index holds request id.
func (b *Broker) Knows(id string) bool {
	_, _, ok := b.index.get(id)
	return ok
}
