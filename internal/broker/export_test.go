package broker

import (
	"context"
	"os"
	"strconv"
	"time"

	"github.com/assent-dev/assent/pkg/policy"
)

// ASSENT_TEST_MAX_FULL sets how many pending records the ledger keeps whole
// in these tests: 0 runs every test with every pending request cold
// (docs/testing.md).
func init() {
	if v, ok := os.LookupEnv("ASSENT_TEST_MAX_FULL"); ok {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			panic("ASSENT_TEST_MAX_FULL: want a count, got " + v)
		}
		maxFullRecords = n
	}
}

// SetCommitHook makes b call fn right after it builds a decision and before
// it publishes it: a crash there leaves the trigger stored and no decision.
func (b *Broker) SetCommitHook(fn func(id string)) { b.afterCommit = fn }

// SetPublishHook makes b call fn right after its decision is stored and
// before the grant it asks for and the acknowledgement of its trigger.
func (b *Broker) SetPublishHook(fn func(id string)) { b.afterPublish = fn }

// CloseConnections closes every connection b uses, its own and those it
// made to publish on: what the server sees when the process dies.
func (b *Broker) CloseConnections() {
	for _, c := range b.pubs.Load().conns {
		c.nc.Close()
	}
}

// SetGrantHook makes b call fn before it stores the remembered choice a
// decision asks for, in every handling that stores it.
func (b *Broker) SetGrantHook(fn func(id string)) { b.beforeGrant = fn }

// SetPendingHook makes b call fn right after a pending event is stored and
// before the request message is acknowledged.
func (b *Broker) SetPendingHook(fn func(id string)) { b.afterPending = fn }

// Published reports whether b has read a decision of request id that it
// takes as the decision (one a trusted key signed, for a broker that
// signs).
func (b *Broker) Published(ctx context.Context, id string) (bool, error) {
	if err := b.ledger.catchUp(ctx); err != nil {
		return false, err
	}
	rec, err := b.load(ctx, id)
	if err != nil {
		return false, err
	}
	return rec.State.Terminal(), nil
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

// Remember stores gr as the handling of its answer does (the second
// handling of one answer runs it again).
func (b *Broker) Remember(ctx context.Context, gr policy.Grant) error { return b.remember(ctx, gr) }
