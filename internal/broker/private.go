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

// Private reads (events.PrivatePrefix): agents whose credentials keep them
// from reading the stream get their own decisions and rejections as copies
// on their own subjects, and ask the broker for what it stored.

// lookupQueue is the queue group of the replicas answering lookups: one
// answers each.
const lookupQueue = "assent-broker-lookups"

// copyToAgent sends msg, a decided or rejected event just stored, to the
// agent's private subject. It is not stored: an agent that misses it looks
// the request up.
func (b *Broker) copyToAgent(agent, kind, id string, msg *nats.Msg) {
	subj, err := events.PrivateSubject(agent, kind, id)
	if err != nil {
		return
	}
	nc, _ := b.pubs.Load().pick()
	if err := nc.PublishMsg(&nats.Msg{Subject: subj, Header: msg.Header, Data: msg.Data}); err != nil {
		b.log.Debug("private copy not sent; the agent will look it up", zap.String("request_id", id), zap.Error(err))
	}
}

// serveLookups answers assent-private.<agent>.lookup.<id>, and an agent's
// list and cancel of its own requests (assent-private.<agent>.list and
// .cancel, see agents.go), until ctx ends.
func (b *Broker) serveLookups(ctx context.Context) error {
	sub, err := b.nc.QueueSubscribe(events.PrivatePrefix+"*.lookup.*", lookupQueue, func(m *nats.Msg) {
		lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		b.lookup(lctx, m)
	})
	if err != nil {
		return err
	}
	agents, err := b.nc.QueueSubscribe(events.PrivatePrefix+"*.*", lookupQueue, func(m *nats.Msg) {
		actx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		b.answerAgent(actx, m)
	})
	if err != nil {
		_ = sub.Unsubscribe()
		return err
	}
	<-ctx.Done()
	return errors.Join(sub.Drain(), agents.Drain())
}

// lookup answers one lookup: the stored decided event of the agent's request,
// or its deadline and digest while it is pending, or unknown, which is also
// the answer for another agent's request.
func (b *Broker) lookup(ctx context.Context, m *nats.Msg) {
	if m.Reply == "" {
		return
	}
	reply, send := b.lookupReply(m)
	defer send()
	parts := strings.Split(strings.TrimPrefix(m.Subject, events.PrivatePrefix), ".")
	if len(parts) != 3 {
		return
	}
	agent, id := parts[0], parts[2]
	rec, err := b.load(ctx, id)
	if err != nil || rec.Request.Agent != agent {
		if err != nil && !errors.Is(err, ErrNotFound) {
			b.log.Warn("lookup: read request state", zap.String("request_id", id), zap.Error(err))
			reply.Header.Set(events.LookupStatus, "error")
		}
		return
	}
	reply.Header.Set(events.LookupStatus, events.LookupPending)
	reply.Header.Set(events.LookupDeadline, rec.Deadline.UTC().Format(time.RFC3339Nano))
	reply.Header.Set(events.LookupRequestDigest, rec.RequestDigest)
	if !rec.State.Terminal() {
		return
	}
	// The decision is the message the ledger read it from.
	dm, err := b.getSeq(ctx, rec.revision)
	if err != nil {
		return // unreadable for now: pending, until the copy or the next lookup
	}
	h := nats.Header{}
	for k, v := range dm.Header {
		h[k] = v
	}
	h.Set(events.LookupStatus, events.LookupDecided)
	h.Set(events.LookupDeadline, rec.Deadline.UTC().Format(time.RFC3339Nano))
	h.Set(events.LookupRequestDigest, rec.RequestDigest)
	reply.Header, reply.Data = h, dm.Data
}

// lookupReply starts the answer to lookup m, unknown until the caller says
// more, and returns the func that sends it.
func (b *Broker) lookupReply(m *nats.Msg) (*nats.Msg, func()) {
	reply := &nats.Msg{Subject: m.Reply, Header: nats.Header{}}
	reply.Header.Set(events.LookupStatus, events.LookupUnknown)
	return reply, func() {
		if err := m.RespondMsg(reply); err != nil {
			b.log.Debug("lookup answer not sent", zap.String("subject", m.Subject), zap.Error(err))
		}
	}
}
