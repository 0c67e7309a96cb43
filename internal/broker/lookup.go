package broker

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"

	"github.com/assent-dev/assent/pkg/events"
)

// Broker lookups (events.BrokerLookupPrefix) tell whether a request exists,
// whose it is and where it stands, to processes that serve every agent and
// so cannot ask on an agent's own lookup subject: the approver bot's inbound
// webhooks (does this id name a request?) and outbound ones (whose request
// is it?). They used to read the request state bucket, which the broker no
// longer writes. The answer carries headers only, never the request's args
// or its decided event: whoever needs the decision reads it from the stream.

// serveRequestLookups answers assent-broker.lookup.<id> until ctx ends. The
// replicas share lookupQueue, so one answers each lookup.
func (b *Broker) serveRequestLookups(ctx context.Context) error {
	sub, err := b.nc.QueueSubscribe(events.BrokerLookupPrefix+"*", lookupQueue, func(m *nats.Msg) {
		lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		b.lookupRequest(lctx, m)
	})
	if err != nil {
		return err
	}
	<-ctx.Done()
	return sub.Drain()
}

// lookupRequest answers one broker lookup: unknown when no request has the
// id, else pending or decided with the request's agent, deadline and request
// digest; "error" when the broker could not read the request (the asker
// tries again later).
func (b *Broker) lookupRequest(ctx context.Context, m *nats.Msg) {
	if m.Reply == "" {
		return
	}
	reply, send := b.lookupReply(m)
	defer send()
	id := strings.TrimPrefix(m.Subject, events.BrokerLookupPrefix)
	if !events.ValidToken(id) {
		return
	}
	rec, err := b.load(ctx, id)
	if err != nil {
		if !errors.Is(err, ErrNotFound) {
			b.log.Warn("request lookup: read request", zap.String("request_id", id), zap.Error(err))
			reply.Header.Set(events.LookupStatus, "error")
		}
		return
	}
	status := events.LookupPending
	if rec.State.Terminal() {
		status = events.LookupDecided
	}
	reply.Header.Set(events.LookupStatus, status)
	reply.Header.Set(events.LookupAgent, rec.Request.Agent)
	reply.Header.Set(events.LookupDeadline, rec.Deadline.UTC().Format(time.RFC3339Nano))
	reply.Header.Set(events.LookupRequestDigest, rec.RequestDigest)
}
