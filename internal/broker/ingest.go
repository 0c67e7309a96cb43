package broker

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/assent-dev/assent/pkg/events"
)

// ingest starts the life of a new request, the request message o: an
// automatic decision, or a pending record with durable and local timers and
// an announcement to approver channels. Ingesting the same request again
// finishes whatever the first attempt left undone and changes nothing else;
// a different request under the same id is refused with ErrIDConflict.
//
// An automatic decision stores no state entry: its decided event, published
// only where the request's decision subject holds none, is the one decision
// (decideNow), and load reads it back from the stream.
func (b *Broker) ingest(ctx context.Context, id, source string, req events.Requested, o origin) (Record, error) {
	digest, err := events.RequestDigest(req)
	if err != nil {
		return Record{}, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	if _, _, known := b.index.get(id); known || o.delivery > 1 {
		// Handled before, here or elsewhere: finish what that left undone.
		switch rec, err := b.load(ctx, id); {
		case err == nil:
			return b.resume(ctx, &rec, req, digest, o)
		case !errors.Is(err, ErrNotFound):
			return Record{}, err
		}
	}
	rec := Record{
		ID:            id,
		State:         StatePending,
		Request:       req,
		RequestDigest: digest,
		RequestSeq:    o.seq,
		Source:        source,
		ReceivedAt:    o.at.UTC(),
	}
	switch err := b.evaluate(ctx, &rec, b.now()); {
	case errors.Is(err, errSeen):
		return b.resumeID(ctx, id, req, digest, o)
	case err != nil:
		return Record{}, err
	}
	if rec.State.Terminal() {
		rec.Trigger, rec.Replica = o.seq, b.cfg.Name
		return rec, b.decideNow(ctx, &rec, o)
	}
	// Build what is published next before storing anything: a request whose
	// events would not fit the stream is refused, not stored.
	msg, err := b.pendingMsg(&rec)
	if err != nil {
		return Record{}, err
	}
	val, err := b.encodeRecord(&rec)
	if err != nil {
		return Record{}, err
	}
	rev, err := b.res.state.Create(ctx, id, val)
	switch {
	case errors.Is(err, jetstream.ErrKeyExists):
		return b.resumeID(ctx, id, req, digest, o)
	case err != nil:
		return Record{}, fmt.Errorf("store request %s: %w", id, err)
	}
	rec.revision = rev
	// The id may have been decided at once, with no state entry: by an
	// earlier message under this id, or, by a hair, a racing one.
	if decided, err := b.decidedBefore(ctx, &rec); err != nil || decided {
		return rec, err
	}
	b.index.put(rec)
	b.metrics.requested()
	return rec, b.await(ctx, &rec, msg)
}

// decideNow publishes the automatic decision the policy made for rec at
// ingest, and stores nothing else: the decided event, stored only where the
// request's decision subject holds none, is the request's one decision. If
// the subject holds a broker's decision already (an earlier delivery of this
// message, or the same request published again), that one stands and nothing
// is published; if that decision is about another request under the same
// id, ErrIDConflict is returned. It reads the subject before publishing, and
// so costs a read and one stored message where deciding through a state
// entry cost two stored messages (docs/architecture.md).
func (b *Broker) decideNow(ctx context.Context, rec *Record, o origin) error {
	msg, err := b.decisionMsg(rec)
	if err != nil {
		return err
	}
	msg.Header.Set(requestSeqHeader, strconv.FormatUint(o.seq, 10))
	// Look first: a publish the stream refuses still reaches the agent's
	// plain subscription to the decision subject, so a request asked again
	// (after the duplicate window, or redelivered after a crash) must not put
	// a second, perhaps different, decision on the wire.
	switch found, ours, err := b.decisionOf(ctx, rec.ID); {
	case err != nil:
		return err
	case ours:
		return b.decidedAlready(rec, &found)
	}
	if b.afterCommit != nil {
		b.afterCommit(rec.ID)
	}
	var last uint64
	for range maxCASAttempts {
		_, err := b.js.PublishMsg(ctx, msg, jetstream.WithExpectLastSequencePerSubject(last))
		if err == nil {
			b.index.put(*rec)
			b.metrics.requested()
			b.metrics.decided(rec)
			b.observe(rec)
			b.copyToAgent(rec.Request.Agent, "decided", rec.ID, msg)
			b.records.deliver(rec.ID)
			if b.afterPublish != nil {
				b.afterPublish(rec.ID)
			}
			return nil
		}
		if !isWrongLastSeq(err) {
			return err
		}
		found, ours, err := b.decisionOf(ctx, rec.ID)
		switch {
		case err != nil:
			return err
		case ours:
			return b.decidedAlready(rec, &found)
		}
		b.metrics.nForged.Add(1)
		if b.signer == nil {
			// Readers take the subject's first message, which is not a
			// broker's decision.
			b.log.Error("the stream holds a message on this request's decision subject that is not the broker's decision; its own cannot be published",
				zap.String("request_id", rec.ID), zap.String("found", found.forgery))
			return fmt.Errorf("%w: request %s: %s", ErrForgedDecision, rec.ID, found.forgery)
		}
		// Readers skip what no trusted key signed; publish after it.
		b.log.Error("the stream holds a decided event no trusted key signed; the broker's own signed decision follows it",
			zap.String("request_id", rec.ID), zap.String("found", found.forgery))
		last = found.last
	}
	return fmt.Errorf("decision of %s: its subject changed %d times while publishing", rec.ID, maxCASAttempts)
}

// decidedAlready reports on an automatic decision that found its request
// decided: nil for a decision about this very request (its own earlier
// publish, an earlier delivery, or the request published again), and
// ErrIDConflict for one about another request under the same id.
func (b *Broker) decidedAlready(rec *Record, found *onSubject) error {
	if err := conflictWith(found.decided, rec.ID, rec.RequestDigest); err != nil {
		return err
	}
	b.log.Debug("request decided already; that decision stands", zap.String("request_id", rec.ID), zap.String("outcome", string(found.decided.Outcome)))
	return nil
}

// decisionOf reads request id's decision subject (firstOnSubject) and says
// whether what it holds first is a broker's decision (brokers). If not, and
// the subject is not empty, found.forgery describes what is there.
func (b *Broker) decisionOf(ctx context.Context, id string) (found onSubject, ours bool, err error) {
	if found, err = b.firstOnSubject(ctx, id); err != nil {
		return found, false, err
	}
	if ours, _, err = b.brokers(ctx, id, &found); err != nil || ours {
		return found, ours, err
	}
	if found.decided != nil {
		found.forgery = describeDecision(found.msg, &events.Event{}, errors.New("a decided event no broker decided at once"))
	}
	return found, false, nil
}

// decidedBefore looks, for a pending record just created, whether its
// request id was decided at once without a state entry (decideNow): by an
// earlier message under this id, or by one racing this. The decision stands:
// a decision about this request is written into the state instead of
// waiting; for another request, the entry just created is taken back and
// ErrIDConflict returned.
func (b *Broker) decidedBefore(ctx context.Context, rec *Record) (bool, error) {
	found, ours, err := b.decisionOf(ctx, rec.ID)
	if err != nil || !ours {
		return false, err // nothing, or not a broker's: the broker's decision comes later
	}
	if err := conflictWith(found.decided, rec.ID, rec.RequestDigest); err != nil {
		if err := b.res.state.Delete(ctx, rec.ID, jetstream.LastRevision(rec.revision)); err != nil {
			b.log.Warn("could not take back the state of a request whose id was decided as another", zap.String("request_id", rec.ID), zap.Error(err))
		}
		return true, err
	}
	next := *rec
	next.adopt(&found)
	val, err := b.encodeRecord(&next)
	if err != nil {
		return true, err
	}
	rev, err := b.res.state.Update(ctx, rec.ID, val, rec.revision)
	if err != nil {
		return true, fmt.Errorf("store the earlier decision of %s: %w", rec.ID, err)
	}
	next.revision = rev
	*rec = next
	b.index.put(next)
	return true, nil
}

// resume handles a request message whose id is stored already: a redelivery
// or a retry finishes what an earlier ingestion may have left undone
// (publishing its decision, or its timers and announcement); a different
// request under that id is refused with ErrIDConflict.
func (b *Broker) resumeID(ctx context.Context, id string, req events.Requested, digest string, o origin) (Record, error) {
	rec, err := b.load(ctx, id)
	if err != nil {
		return Record{}, err
	}
	return b.resume(ctx, &rec, req, digest, o)
}

// resume is resumeID for the record rec, read already.
func (b *Broker) resume(ctx context.Context, rec *Record, req events.Requested, digest string, o origin) (Record, error) {
	if err := conflict(rec, req, digest); err != nil {
		return *rec, err
	}
	if rec.State.Terminal() {
		if rec.Trigger == o.seq {
			return *rec, b.complete(ctx, rec, o)
		}
		return *rec, nil // decided by another message, which sees to its publishing
	}
	return *rec, b.await(ctx, rec, nil)
}

// conflict returns ErrIDConflict, naming what differs, if req (with digest) is
// not the request rec stores.
func conflict(rec *Record, req events.Requested, digest string) error {
	if rec.RequestDigest == "" || rec.RequestDigest == digest {
		return nil
	}
	return fmt.Errorf("%w: %s is a request for %q by %s; this one differs in %s", ErrIDConflict, rec.ID, truncate(rec.Request.Tool, 60), rec.Request.Agent, strings.Join(events.DiffRequests(rec.Request, req), ", "))
}

// reject records an invalid request as denied, so its agent learns why at once
// instead of waiting out a timeout.
func (b *Broker) reject(ctx context.Context, id, source string, req events.Requested, o origin, why error) error {
	at := o.at.UTC()
	rec := Record{ID: id, Request: req, Source: source, RequestSeq: o.seq, ReceivedAt: at, Deadline: at, State: StatePending}
	rec.Request.Args, rec.Request.ResponseSchema, rec.Request.InputSchema = nil, nil, nil
	if err := rec.decide(verdict{outcome: events.Denied, reason: "invalid_request: " + truncate(why.Error(), 512), rule: "validation", auto: true, at: b.now()}); err != nil {
		return err
	}
	rec.Trigger, rec.Replica = o.seq, b.cfg.Name
	msg, err := b.decisionMsg(&rec)
	if err != nil {
		return err
	}
	val, err := b.encodeRecord(&rec)
	if err != nil {
		return err
	}
	if _, err := b.res.state.Create(ctx, id, val); err != nil {
		if !errors.Is(err, jetstream.ErrKeyExists) {
			return err
		}
		// The id is taken: by this very message, stored before a crash, or
		// by an earlier request, which is left alone.
		prev, err := b.load(ctx, id)
		if err != nil || prev.Trigger != o.seq {
			return err
		}
		return b.complete(ctx, &prev, o)
	}
	b.metrics.requested()
	return b.decided(ctx, &rec, msg, o)
}

// rejectConflict tells the agent that published request message o with id why
// it was refused: the id belongs to a different request.
func (b *Broker) rejectConflict(ctx context.Context, id string, req events.Requested, o origin, why error) error {
	digest, _ := events.RequestDigest(req)
	e, err := events.New(events.TypeRejected, "", b.source, events.Rejected{RequestID: id, Code: events.RejectIDConflict, Reason: truncate(why.Error(), 1024), RequestDigest: digest})
	if err != nil {
		return err
	}
	subj, err := events.RejectionSubject(id)
	if err != nil {
		return err
	}
	msg, err := b.encode(subj, &e)
	if err != nil {
		return err
	}
	if _, err = b.js.PublishMsg(ctx, msg, jetstream.WithMsgID(fmt.Sprintf("rejected-%d", o.seq))); err != nil {
		return err
	}
	b.copyToAgent(req.Agent, "rejected", id, msg)
	return nil
}

// await starts a pending request's wait: local timer, durable schedule, and
// the announcement to approver channels (pending, or built here when nil).
// Each step is idempotent.
func (b *Broker) await(ctx context.Context, rec *Record, pending *nats.Msg) error {
	if err := b.arm(ctx, rec); err != nil {
		return err
	}
	if pending == nil {
		var err error
		if pending, err = b.pendingMsg(rec); err != nil {
			return err
		}
	}
	_, err := b.js.PublishMsg(ctx, pending, jetstream.WithMsgID("pending-"+rec.ID))
	return err
}

// pendingMsg builds the announcement of a pending request to approver channels.
func (b *Broker) pendingMsg(r *Record) (*nats.Msg, error) {
	subj, err := events.PendingSubject(r.Request.Agent)
	if err != nil {
		return nil, err
	}
	rule, _ := r.rules(r.Rule)
	e, err := events.New(events.TypePending, "", b.source, events.Pending{RequestID: r.ID, Request: r.Request, Deadline: r.Deadline, Approvers: r.Approvers, Rule: rule, Terms: b.terms(r)})
	if err != nil {
		return nil, err
	}
	return b.encode(subj, &e)
}

// arm sets the local timer and the durable schedule of a pending request to
// its next moment: the next escalation step, or its deadline.
func (b *Broker) arm(ctx context.Context, rec *Record) error {
	at := b.wakeAt(rec)
	b.timers.arm(rec.ID, at)
	return b.schedule(ctx, rec.ID, at)
}

// wakeAt returns when a pending request next needs the broker.
func (b *Broker) wakeAt(rec *Record) time.Time {
	a := b.approvalFor(rec)
	if len(a.Escalation) == 0 || rec.BaseDeadline.IsZero() {
		return rec.Deadline
	}
	if next := a.At(rec.ReceivedAt, rec.BaseDeadline, b.now()).Next; !next.IsZero() && next.Before(rec.Deadline) {
		return next
	}
	return rec.Deadline
}

// schedule makes the deadline durable: JetStream stores a message on
// assent.timeout.<id> at the deadline (rounded up to a whole second, the
// schedule's resolution) even if no broker is running then.
func (b *Broker) schedule(ctx context.Context, id string, deadline time.Time) error {
	at := deadline.Truncate(time.Second)
	if at.Before(deadline) {
		at = at.Add(time.Second)
	}
	msg := &nats.Msg{Subject: TimerPrefix + id, Data: []byte(id)}
	_, err := b.js.PublishMsg(ctx, msg, jetstream.WithScheduleAt(at), jetstream.WithScheduleTarget(TimeoutPrefix+id))
	if err != nil {
		return fmt.Errorf("schedule deadline of %s: %w", id, err)
	}
	return nil
}

// cancelSchedule removes a decided request's pending schedule. Best effort: a
// schedule that fires anyway finds the request decided and does nothing.
func (b *Broker) cancelSchedule(ctx context.Context, id string) {
	if err := b.res.stream.Purge(ctx, jetstream.WithPurgeSubject(TimerPrefix+id)); err != nil {
		b.log.Debug("purge schedule", zap.String("request_id", id), zap.Error(err))
	}
}
