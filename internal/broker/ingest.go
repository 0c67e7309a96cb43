package broker

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/trace"

	"github.com/assent-dev/assent/pkg/events"
)

// ingest stores a new request, the request message o, and starts its life: an
// automatic decision, or a pending record with durable and local timers and an
// announcement to approver channels. Ingesting the same request again finishes
// whatever the first attempt left undone and changes nothing else; a
// different request under the same id is refused with ErrIDConflict.
func (b *Broker) ingest(ctx context.Context, id, source string, req events.Requested, o origin) (Record, error) {
	digest, argsDigest, err := events.RequestDigests(req)
	if err != nil {
		return Record{}, fmt.Errorf("%w: %w", ErrInvalid, err)
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
	rec.setTrace(ctx)
	ectx, span := b.startSpan(ctx, SpanEvaluate, trace.SpanKindInternal, id)
	err = b.evaluate(ectx, &rec, argsDigest, b.now())
	endSpan(span, &rec, err)
	switch {
	case errors.Is(err, errSeen):
		return b.resume(ctx, id, req, digest, o)
	case err != nil:
		return Record{}, err
	}
	// Build what is published next before storing anything: a request whose
	// events would not fit the stream is refused, not stored.
	var msg *nats.Msg
	if rec.State.Terminal() {
		rec.Trigger, rec.Replica = o.seq, b.cfg.Name
		msg, err = b.decisionMsg(ctx, &rec)
	} else {
		msg, err = b.pendingMsg(ctx, &rec)
	}
	if err != nil {
		return Record{}, err
	}
	val, err := b.encodeRecord(&rec)
	if err != nil {
		return Record{}, err
	}
	cctx, cancel := callCtx(ctx)
	rev, err := b.res.state.Create(cctx, id, val)
	cancel()
	switch {
	case errors.Is(err, jetstream.ErrKeyExists):
		return b.resume(ctx, id, req, digest, o)
	case err != nil:
		return Record{}, fmt.Errorf("store request %s: %w", id, err)
	}
	rec.revision = rev
	b.index.put(rec)
	b.note(rec)
	b.metrics.requested()
	if rec.State.Terminal() {
		return rec, b.decided(ctx, &rec, msg, o)
	}
	return rec, b.await(ctx, &rec, msg)
}

// resume handles a request message whose id is stored already: a redelivery
// or a retry finishes what an earlier ingestion may have left undone
// (publishing its decision, or its timers and announcement); a different
// request under that id is refused with ErrIDConflict.
func (b *Broker) resume(ctx context.Context, id string, req events.Requested, digest string, o origin) (Record, error) {
	rec, err := b.load(ctx, id)
	if err != nil {
		return Record{}, err
	}
	if err := conflict(&rec, req, digest); err != nil {
		return rec, err
	}
	if rec.State.Terminal() {
		if rec.Trigger == o.seq {
			return rec, b.complete(ctx, &rec, o)
		}
		return rec, nil // decided by another message, which sees to its publishing
	}
	return rec, b.await(ctx, &rec, nil)
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
	rec.setTrace(ctx)
	rec.Request.Args, rec.Request.ResponseSchema, rec.Request.InputSchema = nil, nil, nil
	if err := rec.decide(verdict{outcome: events.Denied, reason: "invalid_request: " + truncate(why.Error(), 512), rule: "validation", auto: true, at: b.now()}); err != nil {
		return err
	}
	rec.Trigger, rec.Replica = o.seq, b.cfg.Name
	msg, err := b.decisionMsg(ctx, &rec)
	if err != nil {
		return err
	}
	val, err := b.encodeRecord(&rec)
	if err != nil {
		return err
	}
	cctx, cancel := callCtx(ctx)
	_, err = b.res.state.Create(cctx, id, val)
	cancel()
	if err != nil {
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
	setEventTrace(ctx, &e)
	subj, err := events.RejectionSubject(id)
	if err != nil {
		return err
	}
	msg, err := b.encode(subj, &e)
	if err != nil {
		return err
	}
	if _, err = b.publish(ctx, msg, jetstream.WithMsgID(fmt.Sprintf("rejected-%d", o.seq))); err != nil {
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
		if pending, err = b.pendingMsg(ctx, rec); err != nil {
			return err
		}
	}
	_, err := b.publish(ctx, pending, jetstream.WithMsgID("pending-"+rec.ID))
	return err
}

// pendingMsg builds the announcement of a pending request to approver
// channels, carrying the trace context of ctx.
func (b *Broker) pendingMsg(ctx context.Context, r *Record) (*nats.Msg, error) {
	subj, err := events.PendingSubject(r.Request.Agent)
	if err != nil {
		return nil, err
	}
	rule, _ := r.rules(r.Rule)
	e, err := events.New(events.TypePending, "", b.source, events.Pending{RequestID: r.ID, Request: r.Request, Deadline: r.Deadline, Approvers: r.Approvers, Rule: rule, Terms: b.terms(r)})
	if err != nil {
		return nil, err
	}
	setEventTrace(ctx, &e)
	return b.encode(subj, &e)
}

// arm sets the local timer of a pending request to its next moment (the next
// escalation step, or its deadline) and makes sure the durable tick that
// covers that moment is scheduled.
func (b *Broker) arm(ctx context.Context, rec *Record) error {
	at := b.wakeAt(rec)
	b.timers.arm(rec.ID, at)
	return b.ensureTick(ctx, at)
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
