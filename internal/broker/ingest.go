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

// ingest starts the life of the request message o: an automatic decision,
// or a pending request with durable and local timers and an announcement to
// approver channels. Handling the same message again finishes whatever the
// first handling left undone and changes nothing else; a later message with
// the id of another request is refused with ErrIDConflict, and a copy of a
// request already stored goes on from where that one stands.
func (b *Broker) ingest(ctx context.Context, id, source string, req events.Requested, o origin) (Record, error) {
	digest, argsDigest, err := events.RequestDigests(req)
	if err != nil {
		return Record{}, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	if err := b.ledger.await(ctx, o.seq); err != nil {
		return Record{}, err
	}
	if o.delivery > 1 {
		// What the first handling stored must be known before judging again.
		if err := b.ledger.catchUp(ctx); err != nil {
			return Record{}, err
		}
	}
	st, err := b.status(ctx, id, 0, false)
	if err != nil {
		return Record{}, err
	}
	switch {
	case !st.known:
		// Decided: by this message, or by an earlier one with its id.
		rec, err := b.load(ctx, id)
		if err != nil {
			if errors.Is(err, ErrNotFound) {
				return Record{}, fmt.Errorf("request %s at stream sequence %d: read by this replica but neither open nor decided", id, o.seq)
			}
			return Record{}, err
		}
		return rec, conflict(&rec, req, digest)
	case st.reqSeq != o.seq:
		st, err := b.status(ctx, id, 0, true)
		if err != nil {
			return Record{}, err
		}
		return b.resume(ctx, st, req, digest)
	case st.pending:
		return b.awaitOrAdopt(ctx, &st.rec, nil, req, digest)
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
	if err != nil {
		return Record{}, err
	}
	if rec.State.Terminal() {
		rec.Trigger, rec.Replica = o.seq, b.cfg.Name
		rec.DecisionEventID = decisionID(id, o.seq, o.at)
		rec.Decision.RequestSeq = o.seq
		b.metrics.requested()
		return b.fix(ctx, &rec)
	}
	msg, err := b.pendingMsg(ctx, &rec)
	if err != nil {
		return Record{}, err
	}
	b.metrics.requested()
	return b.awaitOrAdopt(ctx, &rec, msg, req, digest)
}

// awaitOrAdopt starts rec's wait (await); if its request turns out to have
// a decision, it returns that one's record instead, refusing req (with
// digest) if it is another request under the id.
func (b *Broker) awaitOrAdopt(ctx context.Context, rec *Record, pending *nats.Msg, req events.Requested, digest string) (Record, error) {
	err := b.await(ctx, rec, pending)
	if !errors.Is(err, errDecidedFirst) {
		return *rec, err
	}
	b.ledger.disarm(rec.ID)
	first, err := b.firstDecision(ctx, rec.ID)
	if errors.Is(err, ErrNotFound) {
		// Refused while a decision was in flight that was not stored.
		return *rec, &retryError{fmt.Errorf("%w: %s, but none is stored", errDecidedFirst, rec.ID), unavailableDelay}
	}
	if err != nil {
		return *rec, err
	}
	got, err := b.adopt(ctx, rec.ID, first)
	if err != nil {
		return got, err
	}
	return got, conflict(&got, req, digest)
}

// resume handles a request message whose id an earlier one took, as the
// ledger has it in st: a copy of that request goes on from where it stands
// (its announcement made again, while it waits); a different request is
// refused with ErrIDConflict.
func (b *Broker) resume(ctx context.Context, st status, req events.Requested, digest string) (Record, error) {
	rec := st.rec
	if rec.partial {
		full, err := b.requestAt(ctx, rec.ID, rec.RequestSeq)
		if err != nil {
			return rec, err
		}
		rec = full
	}
	if err := conflict(&rec, req, digest); err != nil {
		return rec, err
	}
	if !st.pending {
		return rec, nil // its own handling sees to it
	}
	return b.awaitOrAdopt(ctx, &rec, nil, req, digest)
}

// conflict returns ErrIDConflict, naming what differs, if req (with digest) is
// not the request rec stores.
func conflict(rec *Record, req events.Requested, digest string) error {
	if rec.RequestDigest == "" || rec.RequestDigest == digest {
		return nil
	}
	return fmt.Errorf("%w: %s is a request for %q by %s; this one differs in %s", ErrIDConflict, rec.ID, truncate(rec.Request.Tool, 60), rec.Request.Agent, strings.Join(events.DiffRequests(rec.Request, req), ", "))
}

// reject decides an invalid request denied, so its agent learns why at once
// instead of waiting out a timeout.
func (b *Broker) reject(ctx context.Context, id, source string, req events.Requested, o origin, why error) error {
	if err := b.ledger.await(ctx, o.seq); err != nil {
		return err
	}
	if st := b.ledger.status(id, 0, false); !st.known || st.reqSeq != o.seq {
		return nil // decided already, or the id is another request's
	}
	at := o.at.UTC()
	rec := Record{ID: id, Request: req, Source: source, RequestSeq: o.seq, ReceivedAt: at, Deadline: at, State: StatePending}
	rec.setTrace(ctx)
	rec.Request.Args, rec.Request.ResponseSchema, rec.Request.InputSchema = nil, nil, nil
	if err := rec.decide(verdict{outcome: events.Denied, reason: "invalid_request: " + truncate(why.Error(), 512), rule: "validation", auto: true, at: b.now()}); err != nil {
		return err
	}
	rec.Trigger, rec.Replica = o.seq, b.cfg.Name
	rec.DecisionEventID = decisionID(id, o.seq, o.at)
	rec.Decision.RequestSeq = o.seq
	b.metrics.requested()
	_, err := b.fix(ctx, &rec)
	return err
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
	// Stored only while the request has no decision: a copy of a request
	// decided long ago is never announced again.
	_, err := b.publish(ctx, pending, jetstream.WithMsgID("pending-"+rec.ID),
		jetstream.WithExpectLastSequenceForSubject(0, events.DecisionPrefix+rec.ID))
	if isWrongLastSeq(err) {
		return fmt.Errorf("%w: %s", errDecidedFirst, rec.ID)
	}
	if err == nil && b.afterPending != nil {
		b.afterPending(rec.ID)
	}
	return err
}

// errDecidedFirst: a request's pending event was refused, its decision
// being stored already (or in flight).
var errDecidedFirst = errors.New("the request has a decision")

// pendingMsg builds the announcement of a pending request to approver
// channels, carrying the trace context of ctx.
func (b *Broker) pendingMsg(ctx context.Context, r *Record) (*nats.Msg, error) {
	subj, err := events.PendingSubject(r.Request.Agent)
	if err != nil {
		return nil, err
	}
	rule, _ := r.rules(r.Rule)
	p := events.Pending{RequestID: r.ID, Request: r.Request, Deadline: r.Deadline, Approvers: r.Approvers, Rule: rule, Terms: b.terms(r),
		RequestSeq: r.RequestSeq, ReceivedAt: r.ReceivedAt, RequestDigest: r.RequestDigest, BaseDeadline: r.BaseDeadline, Limit: r.Limit}
	if rule != r.Rule {
		p.ApprovalRule = r.Rule
	}
	p.History = b.history(r)
	e, err := events.New(events.TypePending, "", b.source, p)
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
	b.ledger.arm(rec.ID, at)
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
