package webhook

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/assent-dev/assent/pkg/events"
)

// lookupTimeout bounds a broker lookup whose context has no deadline.
const lookupTimeout = 5 * time.Second

// lookupRequest asks the brokers what they stored of request id, whatever
// agent asked it (events.BrokerLookupSubject): its status (events.LookupPending,
// LookupDecided or LookupUnknown) and, when stored, its agent.
func lookupRequest(ctx context.Context, nc *nats.Conn, id string) (status, agent string, err error) {
	subj, err := events.BrokerLookupSubject(id)
	if err != nil {
		return events.LookupUnknown, "", nil // no request has such an id
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, lookupTimeout)
		defer cancel()
	}
	m, err := nc.RequestWithContext(ctx, subj, nil)
	switch {
	case errors.Is(err, nats.ErrNoResponders):
		return "", "", fmt.Errorf("no broker answers %s: is one running?", subj)
	case err != nil:
		return "", "", fmt.Errorf("ask the broker about request %s (%s; the bot's credentials must allow it): %w", id, subj, err)
	}
	switch status = m.Header.Get(events.LookupStatus); status {
	case events.LookupPending, events.LookupDecided:
		return status, m.Header.Get(events.LookupAgent), nil
	case events.LookupUnknown:
		return status, "", nil
	default:
		return "", "", fmt.Errorf("ask the broker about request %s: it answered %q", id, status)
	}
}
