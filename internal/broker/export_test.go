package broker

import "context"

// SetCommitHook makes b call fn right after it stores an outcome and before it
// publishes the decided event: the window a crash test aims at.
func (b *Broker) SetCommitHook(fn func(id string)) { b.afterCommit = fn }

// Published reports whether the decision the state records for request id
// is on the stream, as the redelivery of its trigger finds out.
func (b *Broker) Published(ctx context.Context, id string) (bool, error) {
	rec, err := b.load(ctx, id)
	if err != nil {
		return false, err
	}
	return b.published(ctx, &rec)
}
