package broker

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
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
	if err := b.nc.PublishMsg(&nats.Msg{Subject: subj, Header: msg.Header, Data: msg.Data}); err != nil {
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
	reply := &nats.Msg{Subject: m.Reply, Header: nats.Header{}}
	reply.Header.Set(events.LookupStatus, events.LookupUnknown)
	defer func() {
		if err := m.RespondMsg(reply); err != nil {
			b.log.Debug("lookup answer not sent", zap.String("subject", m.Subject), zap.Error(err))
		}
	}()
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
	if rec.Decision == nil || rec.DecisionEventID == "" {
		return
	}
	subj := events.DecisionPrefix + id
	for seq := uint64(1); ; {
		cctx, cancel := callCtx(ctx)
		dm, err := b.res.stream.GetMsg(cctx, seq, jetstream.WithGetMsgSubject(subj))
		cancel()
		if err != nil {
			// Decided but not published yet (or unreadable): pending, for
			// now; the copy or the next lookup brings it.
			return
		}
		seq = dm.Sequence + 1
		e, err := events.Codec{MaxSize: b.maxEmit}.Decode(events.Header(dm.Header), dm.Data)
		if err != nil || e.ID() != rec.DecisionEventID {
			continue
		}
		h := nats.Header{}
		for k, v := range dm.Header {
			h[k] = v
		}
		h.Set(events.LookupStatus, events.LookupDecided)
		h.Set(events.LookupDeadline, rec.Deadline.UTC().Format(time.RFC3339Nano))
		h.Set(events.LookupRequestDigest, rec.RequestDigest)
		reply.Header, reply.Data = h, dm.Data
		return
	}
}
