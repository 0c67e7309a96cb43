package broker

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/assent-dev/assent/pkg/events"
	"github.com/assent-dev/assent/pkg/policy"
)

// maxCASAttempts bounds the read-modify-write loop; contention on one request is
// at most a handful of racing answers, so this is never reached in practice.
const maxCASAttempts = 64

// errNotDue means a timeout fired before the (possibly extended) deadline.
var errNotDue = errors.New("deadline not reached")

// load reads the record of id.
func (b *Broker) load(ctx context.Context, id string) (Record, error) {
	entry, err := b.res.state.Get(ctx, id)
	if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
		return Record{}, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	if err != nil {
		return Record{}, fmt.Errorf("read state of %s: %w", id, err)
	}
	return decodeRecord(entry.Value(), entry.Revision())
}

// transition applies change to the pending record of id and stores the result
// with a compare-and-set on the revision it read, retrying on conflict. This is
// the only place an outcome is chosen. A terminal record is returned unchanged
// with its terminalErr (and its decision re-published if that was lost).
func (b *Broker) transition(ctx context.Context, id string, change func(r *Record) error) (Record, error) {
	for range maxCASAttempts {
		rec, err := b.load(ctx, id)
		if err != nil {
			return Record{}, err
		}
		if rec.State.Terminal() {
			if err := b.republish(ctx, &rec); err != nil {
				return rec, errors.Join(rec.terminalErr(), err)
			}
			return rec, rec.terminalErr()
		}
		next := rec
		if err := change(&next); err != nil {
			return rec, err
		}
		val, err := encodeRecord(&next)
		if err != nil {
			return rec, err
		}
		rev, err := b.res.state.Update(ctx, id, val, rec.revision)
		if errors.Is(err, jetstream.ErrKeyExists) {
			continue // someone else wrote first; look again
		}
		if err != nil {
			return rec, fmt.Errorf("store state of %s: %w", id, err)
		}
		next.revision = rev
		if next.State.Terminal() {
			b.decided(ctx, &next)
		}
		return next, nil
	}
	return Record{}, fmt.Errorf("state of %s: too much contention", id)
}

// decided runs after an outcome was stored: publish it, stop timers.
func (b *Broker) decided(ctx context.Context, r *Record) {
	b.timers.stop(r.ID)
	b.metrics.decided(r)
	if err := b.publishDecision(ctx, r); err != nil {
		// The outcome is stored; the triggering message is redelivered or the
		// durable timeout fires, and either publishes it again.
		b.log.Warn("publish decision failed; will be retried", zap.String("request_id", r.ID), zap.Error(err))
		return
	}
	if r.Decision != nil && !r.Decision.Auto {
		b.cancelSchedule(ctx, r.ID)
	}
}

// republishAfter is how old a stored outcome must be before a replica that
// finds it unpublished publishes it: a younger one is still being published by
// the replica that chose it.
const republishAfter = 10 * time.Second

// errPublishPending: a stored outcome is not on the stream yet and is young
// enough that its replica may still publish it; look again later.
var errPublishPending = errors.New("decision stored but not yet published")

// republish makes sure an outcome found already stored is on the stream too,
// for when the replica that chose it died before publishing. It publishes only
// if the stream has no decision for the request and the outcome is older than
// republishAfter: a second publish would be refused by the stream but still
// reach plain NATS subscribers of the decision subject.
//
// If the outcome is too young it returns a retryError wrapping
// errPublishPending, so that a message handler asks for redelivery and looks
// again once the window has passed.
func (b *Broker) republish(ctx context.Context, r *Record) error {
	if r.Decision == nil {
		return nil
	}
	subj, err := events.DecisionSubject(r.ID)
	if err != nil {
		return err
	}
	_, err = b.res.stream.GetLastMsgForSubject(ctx, subj)
	switch {
	case err == nil:
		return nil
	case !errors.Is(err, jetstream.ErrMsgNotFound):
		return fmt.Errorf("look up decision of %s: %w", r.ID, err)
	}
	if age := b.now().Sub(r.Decision.DecidedAt); age < republishAfter {
		return &retryError{fmt.Errorf("%w: %s", errPublishPending, r.ID), republishAfter - age}
	}
	b.log.Warn("publishing a decision its replica did not publish", zap.String("request_id", r.ID))
	return b.publishDecision(ctx, r)
}

// publishDecision publishes r's decided event exactly once: the stream refuses a
// second message on the decision subject, so a retry that finds one is done.
func (b *Broker) publishDecision(ctx context.Context, r *Record) error {
	if r.Decision == nil {
		return fmt.Errorf("record %s is %s but has no decision", r.ID, r.State)
	}
	e, err := events.New(events.TypeDecided, r.DecisionEventID, b.source, r.Decision)
	if err != nil {
		return err
	}
	e.SetTime(r.Decision.DecidedAt)
	subj, err := events.DecisionSubject(r.ID)
	if err != nil {
		return err
	}
	msg, err := b.encode(subj, &e)
	if err != nil {
		return err
	}
	_, err = b.js.PublishMsg(ctx, msg,
		jetstream.WithMsgID("decided-"+r.ID),
		jetstream.WithExpectLastSequencePerSubject(0))
	if isWrongLastSeq(err) {
		return nil // already published
	}
	return err
}

func isWrongLastSeq(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) &&
		(apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence || apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant)
}

func (b *Broker) encode(subject string, e *events.Event) (*nats.Msg, error) {
	h, body, err := events.Encode(e)
	if err != nil {
		return nil, err
	}
	return &nats.Msg{Subject: subject, Header: nats.Header(h), Data: body}, nil
}

// ingest stores a new request and starts its life: an automatic decision, or a
// pending record with durable and local timers and an announcement to approver
// channels. Ingesting the same id again finishes whatever the first attempt left
// undone and changes nothing else.
func (b *Broker) ingest(ctx context.Context, id, source string, req events.Requested, receivedAt time.Time) (Record, error) {
	rec := Record{
		ID:         id,
		State:      StatePending,
		Request:    req,
		Source:     source,
		ReceivedAt: receivedAt.UTC(),
	}
	switch err := b.evaluate(ctx, &rec, b.now()); {
	case errors.Is(err, errSeen):
		return b.resume(ctx, id)
	case err != nil:
		return Record{}, err
	}
	val, err := encodeRecord(&rec)
	if err != nil {
		return Record{}, err
	}
	rev, err := b.res.state.Create(ctx, id, val)
	switch {
	case errors.Is(err, jetstream.ErrKeyExists):
		return b.resume(ctx, id)
	case err != nil:
		return Record{}, fmt.Errorf("store request %s: %w", id, err)
	default:
		rec.revision = rev
		b.metrics.requested()
		if rec.State.Terminal() {
			b.metrics.decided(&rec)
		}
	}
	if rec.State.Terminal() {
		return rec, b.publishDecision(ctx, &rec)
	}
	return rec, b.await(ctx, &rec)
}

// await starts a pending request's wait: local timer, durable schedule, and
// the announcement to approver channels. Each step is idempotent.
func (b *Broker) await(ctx context.Context, rec *Record) error {
	if err := b.arm(ctx, rec); err != nil {
		return err
	}
	return b.announce(ctx, rec)
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
	if next := a.At(rec.ReceivedAt, b.now()).Next; !next.IsZero() && next.Before(rec.Deadline) {
		return next
	}
	return rec.Deadline
}

// resume finishes what an earlier ingestion of request id may have left
// undone: publishing its decision, or its timers and announcement.
func (b *Broker) resume(ctx context.Context, id string) (Record, error) {
	rec, err := b.load(ctx, id)
	if err != nil {
		return Record{}, err
	}
	if rec.State.Terminal() {
		return rec, b.republish(ctx, &rec)
	}
	return rec, b.await(ctx, &rec)
}

// reject records an invalid request as denied, so its agent learns why at once
// instead of waiting out a timeout.
func (b *Broker) reject(ctx context.Context, id, source string, req events.Requested, receivedAt time.Time, why error) error {
	rec := Record{ID: id, Request: req, Source: source, ReceivedAt: receivedAt.UTC(), Deadline: receivedAt.UTC(), State: StatePending}
	rec.Request.Args = nil
	now := b.now()
	if err := rec.decide(verdict{outcome: events.Denied, reason: "invalid_request: " + truncate(why.Error(), 512), rule: "validation", auto: true, at: now}); err != nil {
		return err
	}
	val, err := encodeRecord(&rec)
	if err != nil {
		return err
	}
	if _, err := b.res.state.Create(ctx, id, val); err != nil {
		if errors.Is(err, jetstream.ErrKeyExists) {
			return nil // the id belongs to an earlier request; leave it alone
		}
		return err
	}
	b.metrics.requested()
	b.metrics.decided(&rec)
	return b.publishDecision(ctx, &rec)
}

// announce tells approver channels about a pending request.
func (b *Broker) announce(ctx context.Context, r *Record) error {
	subj, err := events.PendingSubject(r.Request.Agent)
	if err != nil {
		return err
	}
	e, err := events.New(events.TypePending, "", b.source, events.Pending{RequestID: r.ID, Request: r.Request, Deadline: r.Deadline, Approvers: r.Approvers, Rule: r.Rule})
	if err != nil {
		return err
	}
	msg, err := b.encode(subj, &e)
	if err != nil {
		return err
	}
	_, err = b.js.PublishMsg(ctx, msg, jetstream.WithMsgID("pending-"+r.ID))
	return err
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

// Respond applies principal's answer to request id. If the request was already
// decided, ErrAlreadyDecided is returned; if its deadline passed, ErrExpired; if
// the answer is malformed (or its payload does not fit the request's schema),
// an error wrapping ErrInvalid. Only the first valid answer decides.
func (b *Broker) Respond(ctx context.Context, principal, id string, resp events.Responded) (Record, error) {
	return b.respond(ctx, principal, id, resp, b.now())
}

// respond applies an answer given at at (for NATS answers, when the stream
// stored it).
func (b *Broker) respond(ctx context.Context, principal, id string, resp events.Responded, at time.Time) (Record, error) {
	if err := events.CheckToken("principal", principal); err != nil {
		return Record{}, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	if !events.ValidToken(id) {
		return Record{}, fmt.Errorf("%w: %q", ErrNotFound, id)
	}
	if err := resp.Validate(); err != nil {
		return Record{}, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	now := b.now()
	if at.After(now) {
		at = now
	}
	var grant *policy.Grant
	rec, err := b.transition(ctx, id, func(r *Record) error {
		if !at.Before(r.Deadline) {
			return errNotDue // handled below: expire it now
		}
		a := b.approvalFor(r)
		in, err := policy.InputFrom(r.Request)
		if err != nil {
			return fmt.Errorf("%w: %w", ErrInvalid, err)
		}
		if err := a.Eligible(principal, in); err != nil {
			return fmt.Errorf("%w: %s may not answer %s: %w", ErrNotEligible, principal, id, err)
		}
		grant = nil
		if resp.Remember != nil {
			g, err := a.NewGrant(events.NewID(), resp.Decision, *resp.Remember, in, principal, now)
			if err != nil {
				return fmt.Errorf("%w: remember: %w", ErrInvalid, err)
			}
			g.RequestID = id
			if len(resp.Remember.Args) > 0 && string(resp.Remember.Args) != "null" {
				g.ArgsPattern = resp.Remember.Args
				if err := g.Validate(); err != nil {
					return fmt.Errorf("%w: remember.args: %w", ErrInvalid, err)
				}
			}
			grant = &g
		}
		vote := events.DecidedBy{Principal: principal, Channel: resp.Channel, Decision: resp.Decision, At: at.UTC()}
		v := verdict{outcome: events.Denied, reason: resp.Reason, payload: resp.Payload, rule: r.Rule, at: now}
		if resp.Decision == events.Deny {
			v.by = append(slices.Clone(r.Votes), vote)
			return r.decide(v)
		}
		if err := events.CheckPayload(r.Request.ResponseSchema, resp.Payload); err != nil {
			return fmt.Errorf("%w: %w", ErrInvalid, err)
		}
		edited := len(resp.Args) > 0 && string(resp.Args) != "null"
		if edited && a.Quorum > 1 {
			return fmt.Errorf("%w: args: edited arguments need a rule with quorum 1 (this one needs %d approvals of the same call)", ErrInvalid, a.Quorum)
		}
		votes := r.Votes
		if !slices.ContainsFunc(votes, func(d events.DecidedBy) bool { return d.Principal == principal }) {
			votes = append(slices.Clone(votes), vote)
		}
		pv := make([]policy.Vote, len(votes))
		for i, d := range votes {
			pv[i] = policy.Vote{Principal: d.Principal, Verdict: d.Decision}
		}
		if t := a.Tally(in, pv); !t.Decided {
			r.Votes = votes // counted; more approvals needed
			return nil
		}
		v.outcome, v.by = events.Approved, votes
		if edited {
			v.args = resp.Args
		}
		return r.decide(v)
	})
	if err == nil && grant != nil && rec.State.Terminal() {
		if gerr := b.remember(ctx, *grant); gerr != nil {
			b.log.Error("decided, but the remembered choice was not stored", zap.String("request_id", id), zap.Error(gerr))
		}
	}
	if errors.Is(err, errNotDue) {
		// The deadline passed before the answer: record the expiry the timers
		// have not recorded yet, and refuse the answer.
		if rec, err = b.expire(ctx, id, now); err != nil {
			return rec, err
		}
		return rec, rec.terminalErr()
	}
	return rec, err
}

// Cancel ends request id as cancelled on behalf of by (the agent or an admin).
// If the request was already decided, ErrAlreadyDecided or ErrExpired is returned.
func (b *Broker) Cancel(ctx context.Context, id, by, reason string) (Record, error) {
	if !events.ValidToken(id) {
		return Record{}, fmt.Errorf("%w: %q", ErrNotFound, id)
	}
	now := b.now()
	if reason == "" {
		reason = "cancelled by " + by
	}
	return b.transition(ctx, id, func(r *Record) error {
		return r.decide(verdict{outcome: events.Cancelled, reason: reason, by: []events.DecidedBy{{Principal: by, At: now.UTC()}}, rule: r.Rule, at: now})
	})
}

// expire moves request id along in time: past its deadline it ends (expired,
// or approved where the rule says a timeout approves); past an escalation step
// it escalates, extending the deadline if the step says so, and tells the
// step's approvers. An early call re-arms the timers; a decided request is left
// as it is.
func (b *Broker) expire(ctx context.Context, id string, now time.Time) (Record, error) {
	escalated := false
	rec, err := b.transition(ctx, id, func(r *Record) error {
		a := b.approvalFor(r)
		if !r.BaseDeadline.IsZero() && len(a.Escalation) > 0 {
			if esc := a.At(r.ReceivedAt, now); esc.Level > r.Level {
				// Extensions of the steps that fired, on top of this request's own deadline.
				extended := esc.Deadline.Sub(r.ReceivedAt.Add(a.Timeout))
				r.Level, r.Deadline = esc.Level, r.BaseDeadline.Add(extended)
				if now.Before(r.Deadline) {
					escalated = true
					return nil
				}
			}
		}
		if now.Before(r.Deadline) {
			return errNotDue
		}
		if a.OnTimeout == events.Approve {
			return r.decide(verdict{outcome: events.Approved, reason: "timeout: rule " + r.Rule + " approves when nobody answers", by: r.Votes, rule: r.Rule, auto: true, at: now})
		}
		return r.decide(verdict{outcome: events.Expired, reason: "timeout: no decision before the deadline", by: r.Votes, rule: r.Rule, auto: true, at: now})
	})
	switch {
	case err == nil && escalated:
		if err := b.escalate(ctx, &rec); err != nil {
			return rec, err
		}
		return rec, b.arm(ctx, &rec)
	case errors.Is(err, errNotDue):
		return rec, b.arm(ctx, &rec)
	case errors.Is(err, errPublishPending):
		return rec, err // a retryError: the timeout message comes back later
	case errors.Is(err, ErrAlreadyDecided), errors.Is(err, ErrExpired):
		return rec, nil
	}
	return rec, err
}

// escalate announces that r reached its escalation level, to the principals
// that level adds.
func (b *Broker) escalate(ctx context.Context, r *Record) error {
	subj, err := events.PendingSubject(r.Request.Agent)
	if err != nil {
		return err
	}
	notify, ok := b.approvalFor(r).Notify(r.Level)
	if !ok {
		notify = nil // anyone
	}
	e, err := events.New(events.TypeEscalated, "", b.source, events.Escalated{RequestID: r.ID, Request: r.Request, Level: r.Level, Approvers: notify, Deadline: r.Deadline})
	if err != nil {
		return err
	}
	msg, err := b.encode(subj, &e)
	if err != nil {
		return err
	}
	b.log.Info("request escalated", zap.String("request_id", r.ID), zap.Int("level", r.Level), zap.Strings("notify", notify), zap.Time("deadline", r.Deadline))
	_, err = b.js.PublishMsg(ctx, msg, jetstream.WithMsgID(fmt.Sprintf("escalated-%s-%d", r.ID, r.Level)))
	return err
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
