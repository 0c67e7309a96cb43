package broker

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"

	"github.com/assent-dev/assent/pkg/events"
	"github.com/assent-dev/assent/pkg/policy"
)

// Respond applies principal's answer to request id, as the HTTP gateway
// receives it. The answer is first recorded on the stream, as an answer over
// NATS is, then applied; so it is in the audit trail, and if this broker dies
// before the decision is published, the broker's consumer finishes the job.
//
// If the request was already decided, ErrAlreadyDecided is returned; if its
// deadline passed, ErrExpired; if the principal may not answer, ErrNotEligible;
// if the answer is malformed (or its payload does not fit the request's
// schema), an error wrapping ErrInvalid. Only the first valid answer decides.
//
// The recorded answer carries the trace context of ctx or, when ctx has
// none, the request's; applying it is a span (SpanAnswer) under it.
func (b *Broker) Respond(ctx context.Context, principal, id string, resp events.Responded) (Record, error) {
	if err := checkAnswer(principal, id, resp); err != nil {
		return Record{}, err
	}
	// Refuse what cannot apply before recording it.
	rec, err := b.loadPending(ctx, id)
	if err != nil {
		return rec, err
	}
	if !trace.SpanContextFromContext(ctx).IsValid() {
		ctx = rec.traceContext(ctx)
	}
	now := b.now()
	trial := rec
	if err := b.answerChange(principal, id, resp, origin{at: now}, now)(&trial); err != nil && !errors.Is(err, errNotDue) {
		return rec, err
	}
	subj, err := events.ResponseSubject(principal, id)
	if err != nil {
		return Record{}, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	seq, err := b.record(ctx, subj, events.TypeResponded, "approver/"+principal, resp)
	if err != nil {
		return rec, err
	}
	ctx, span := b.startSpan(ctx, SpanAnswer, trace.SpanKindInternal, id, attrPrincipal.String(principal), attrDecision.String(string(resp.Decision)))
	rec, err = b.respond(ctx, principal, id, resp, origin{seq: seq, at: now, answer: true})
	endSpan(span, &rec, err)
	return rec, err
}

// checkAnswer validates an answer's parts.
func checkAnswer(principal, id string, resp events.Responded) error {
	if err := events.CheckToken("principal", principal); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	if !events.ValidToken(id) {
		return fmt.Errorf("%w: %q", ErrNotFound, id)
	}
	if err := resp.Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	return nil
}

// loadPending reads the record of id, and refuses (with its terminalErr) one
// that is decided.
func (b *Broker) loadPending(ctx context.Context, id string) (Record, error) {
	rec, err := b.load(ctx, id)
	if err != nil {
		return Record{}, err
	}
	return rec, rec.terminalErr()
}

// record publishes an event the gateway received onto the stream, where the
// broker's consumers will find it too, carrying the trace context of ctx,
// and returns its stream sequence.
func (b *Broker) record(ctx context.Context, subject, typ, source string, data any) (uint64, error) {
	e, err := events.New(typ, "", source, data)
	if err != nil {
		return 0, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	setEventTrace(ctx, &e)
	msg, err := b.encode(subject, &e)
	if err != nil {
		return 0, err
	}
	ack, err := b.js.PublishMsg(ctx, msg, jetstream.WithMsgID(e.ID()))
	if err != nil {
		return 0, fmt.Errorf("record %s: %w", shortType(typ), err)
	}
	return ack.Sequence, nil
}

// respond applies the answer message o.
func (b *Broker) respond(ctx context.Context, principal, id string, resp events.Responded, o origin) (Record, error) {
	if err := checkAnswer(principal, id, resp); err != nil {
		return Record{}, err
	}
	now := b.now()
	if o.at.IsZero() || o.at.After(now) {
		o.at = now
	}
	rec, _, err := b.transition(ctx, id, o, b.answerChange(principal, id, resp, o, now))
	if errors.Is(err, errNotDue) {
		// The deadline passed before the answer: record the expiry the timers
		// have not recorded yet, and refuse the answer.
		if rec, err = b.expire(ctx, id, now, o); err != nil {
			return rec, err
		}
		return rec, rec.terminalErr()
	}
	return rec, err
}

// answerChange returns the change principal's answer, given at o.at, makes to
// a pending record; a remembered choice it asks for goes into the record with
// the outcome it decides.
func (b *Broker) answerChange(principal, id string, resp events.Responded, o origin, now time.Time) func(r *Record) error {
	return func(r *Record) error {
		if !o.at.Before(r.Deadline) {
			return errNotDue // handled by the caller: expire it now
		}
		a := b.approvalFor(r)
		in, err := policy.InputFrom(r.Request)
		if err != nil {
			return fmt.Errorf("%w: %w", ErrInvalid, err)
		}
		if err := a.Eligible(principal, in); err != nil {
			return fmt.Errorf("%w: %s may not answer %s: %w", ErrNotEligible, principal, id, err)
		}
		var grant *policy.Grant
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
		vote := events.DecidedBy{Principal: principal, Channel: resp.Channel, Decision: resp.Decision, At: o.at.UTC()}
		v := verdict{outcome: events.Denied, reason: resp.Reason, payload: resp.Payload, rule: r.Rule, at: now}
		if resp.Decision == events.Deny {
			v.by = append(slices.Clone(r.Votes), vote)
			r.Grant = grant
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
			if o.seq != 0 {
				r.Applied = append(slices.Clone(r.Applied), o.seq)
			}
			return nil
		}
		v.outcome, v.by = events.Approved, votes
		if edited {
			v.args = resp.Args
		}
		r.Grant = grant
		return r.decide(v)
	}
}

// Cancel ends request id as cancelled on behalf of by (the agent or an admin),
// as the HTTP gateway receives it: recorded on the stream as a cancel event
// whose source is by, then applied. If the request was already decided,
// ErrAlreadyDecided or ErrExpired is returned.
func (b *Broker) Cancel(ctx context.Context, id, by, reason string) (Record, error) {
	if !events.ValidToken(id) {
		return Record{}, fmt.Errorf("%w: %q", ErrNotFound, id)
	}
	c := events.Cancel{Reason: reason}
	if err := checkCancel(by, c); err != nil {
		return Record{}, err
	}
	rec, err := b.loadPending(ctx, id)
	if err != nil {
		return rec, err
	}
	if !trace.SpanContextFromContext(ctx).IsValid() {
		ctx = rec.traceContext(ctx)
	}
	subj, err := events.CancelSubject(id)
	if err != nil {
		return Record{}, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	seq, err := b.record(ctx, subj, events.TypeCancel, by, c)
	if err != nil {
		return rec, err
	}
	ctx, span := b.startSpan(ctx, SpanCancel, trace.SpanKindInternal, id, attrPrincipal.String(by))
	rec, err = b.cancel(ctx, id, by, c, origin{seq: seq, at: b.now(), answer: true})
	endSpan(span, &rec, err)
	return rec, err
}

// checkCancel validates who cancels (a principal, or an event source such as
// agent/<name>) and the cancel's data.
func checkCancel(by string, c events.Cancel) error {
	var errs []error
	switch {
	case by == "":
		errs = append(errs, fmt.Errorf("by: %w", events.ErrMissingField))
	case len(by) > 256:
		errs = append(errs, fmt.Errorf("by: %w: longer than 256 bytes", events.ErrBadValue))
	default:
		if err := events.CheckIdentifier("by", by); err != nil {
			errs = append(errs, err)
		}
	}
	if err := c.Validate(); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	return nil
}

// cancel applies the cancel message o.
func (b *Broker) cancel(ctx context.Context, id, by string, c events.Cancel, o origin) (Record, error) {
	if err := checkCancel(by, c); err != nil {
		return Record{}, err
	}
	now := b.now()
	if o.at.IsZero() || o.at.After(now) {
		o.at = now
	}
	reason := c.Reason
	if reason == "" {
		reason = "cancelled by " + by
	}
	rec, _, err := b.transition(ctx, id, o, func(r *Record) error {
		if o.agent != "" && o.agent != r.Request.Agent {
			return fmt.Errorf("%w: agent %s cancels a request of agent %s", ErrNotEligible, o.agent, r.Request.Agent)
		}
		return r.decide(verdict{outcome: events.Cancelled, reason: reason, by: []events.DecidedBy{{Principal: by, At: o.at.UTC()}}, rule: r.Rule, at: now})
	})
	return rec, err
}

// expire moves request id along in time, on behalf of message o: past its
// deadline it ends (expired, or approved where the rule says a timeout
// approves); past an escalation step it escalates, extending the deadline if
// the step says so, and tells the step's approvers. An early call re-arms the
// timers; a decided request is left as it is.
func (b *Broker) expire(ctx context.Context, id string, now time.Time, o origin) (Record, error) {
	escalated := false
	rec, stored, err := b.transition(ctx, id, o, func(r *Record) error {
		escalated = false
		a := b.approvalFor(r)
		if !r.BaseDeadline.IsZero() && len(a.Escalation) > 0 {
			// Steps count against the request's own deadline, extended by
			// the steps before them: one due at or after it never fires.
			if esc := a.At(r.ReceivedAt, r.BaseDeadline, now); esc.Level > r.Level {
				r.Level, r.Deadline = esc.Level, esc.Deadline
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
	case err == nil && stored && escalated:
		if err := b.escalate(ctx, &rec); err != nil {
			return rec, err
		}
		return rec, b.arm(ctx, &rec)
	case errors.Is(err, errNotDue):
		return rec, b.arm(ctx, &rec)
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
	e, err := events.New(events.TypeEscalated, "", b.source, events.Escalated{RequestID: r.ID, Request: r.Request, Level: r.Level, Approvers: notify, Deadline: r.Deadline, Terms: b.terms(r)})
	if err != nil {
		return err
	}
	setEventTrace(ctx, &e)
	msg, err := b.encode(subj, &e)
	if err != nil {
		return err
	}
	b.log.Info("request escalated", zap.String("request_id", r.ID), zap.Int("level", r.Level), zap.Strings("notify", notify), zap.Time("deadline", r.Deadline))
	_, err = b.publish(ctx, msg, jetstream.WithMsgID(fmt.Sprintf("escalated-%s-%d", r.ID, r.Level)))
	return err
}
