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
// response_schema, or its edited args its input_schema), an error wrapping
// ErrInvalid. Only the first valid answer decides.
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
	if !now.Before(rec.Deadline) && !rec.Deadline.IsZero() {
		return rec, fmt.Errorf("%w: %s expired at %s", ErrExpired, id, rec.Deadline.Format(time.RFC3339))
	}
	trial := rec
	if err := b.answerChange(principal, id, resp, 0, now)(&trial); err != nil {
		return rec, err
	}
	if trial.State.Terminal() {
		if err := b.decisionFits(&trial); err != nil {
			return rec, err
		}
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
	rec, err = b.respond(ctx, principal, id, resp, origin{seq: seq, answer: true})
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
// that is decided. A request this replica has not read is looked for again
// once it has read what the stream holds: an approver who saw it listed by
// another replica a moment ago may answer it here.
func (b *Broker) loadPending(ctx context.Context, id string) (Record, error) {
	rec, err := b.loadJudged(ctx, id)
	if errors.Is(err, ErrNotFound) {
		if cerr := b.ledger.catchUp(ctx); cerr != nil {
			return Record{}, fmt.Errorf("%w (and this replica could not read the stream to the end: %w)", err, cerr)
		}
		rec, err = b.loadJudged(ctx, id)
	}
	if err != nil {
		return Record{}, err
	}
	return rec, rec.terminalErr()
}

// loadJudged reads the record of id once its request is judged (it waits
// for answers, or is decided), or ctx ends.
func (b *Broker) loadJudged(ctx context.Context, id string) (Record, error) {
	ch, stop := b.records.wait(id)
	defer stop()
	for {
		rec, err := b.load(ctx, id)
		if err != nil || !rec.judging {
			return rec, err
		}
		select {
		case <-ch:
		case <-time.After(judgingDelay):
		case <-ctx.Done():
			return rec, fmt.Errorf("request %s is stored but not judged yet: %w", id, ctx.Err())
		}
	}
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
	return b.settleAnswer(ctx, id, o)
}

// settleAnswer handles the answer or cancel o about request id (settleAt) and
// maps what it found to the result (settled). The HTTP gateway's call
// (o.delivery 0) waits for a request still being judged; the consumer hands
// the message back instead.
func (b *Broker) settleAnswer(ctx context.Context, id string, o origin) (Record, error) {
	for {
		rec, st, err := b.settleAt(ctx, id, o)
		rec, err = settled(id, rec, st, o, err)
		if o.delivery > 0 || !errors.Is(err, errJudging) {
			return rec, err
		}
		if _, err := b.loadJudged(ctx, id); err != nil {
			return rec, err
		}
	}
}

// settled maps what settleAt found for the answer or cancel o to its
// result: the request's record, and nil if o counted or decided it, else
// why not.
func settled(id string, rec Record, st status, o origin, err error) (Record, error) {
	switch {
	case err != nil:
		return rec, err
	case !st.known && rec.Trigger == o.seq && o.seq != 0:
		return rec, nil // decided by o, handled before
	case !st.known:
		return rec, rec.terminalErr()
	case st.prop != nil && st.prop.Trigger == o.seq:
		if st.result != nil {
			return rec, st.result // an expiry: the answer came too late
		}
		if rec.DecisionEventID != st.prop.DecisionEventID {
			return rec, rec.terminalErr() // another decision was stored first
		}
		return rec, nil
	case st.counted:
		return st.rec, st.result
	case !st.pending && st.prop == nil:
		// Stored while its request was being judged: it counts once the
		// request waits for answers.
		return rec, &retryError{fmt.Errorf("%w: %s", errJudging, id), judgingDelay}
	}
	return rec, fmt.Errorf("%w: %s", ErrNotFound, id)
}

// errJudging: an answer or cancel came while its request was being judged.
var errJudging = errors.New("the request is being judged")

// judgingDelay is how long an answer stored while its request was being
// judged waits before it is looked at again.
const judgingDelay = 100 * time.Millisecond

// answerChange returns the change principal's answer, stored at stream
// sequence seq at time at (0 and now for a trial before it is stored),
// makes to a pending record; a remembered choice it asks for goes into the
// record with the outcome it decides. The deadline is the caller's to
// check.
func (b *Broker) answerChange(principal, id string, resp events.Responded, seq uint64, at time.Time) func(r *Record) error {
	return func(r *Record) error {
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
			g, err := a.NewGrant(decisionID(id+"/grant", seq, at), resp.Decision, *resp.Remember, in, principal, at)
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
		v := verdict{outcome: events.Denied, reason: resp.Reason, payload: resp.Payload, rule: r.Rule, at: at, digest: in.ArgsDigest}
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
		if edited {
			// The edit runs in place of the request's args, so it must
			// fit the tool as the request's own had to.
			if err := events.CheckArgs(r.Request.InputSchema, resp.Args); err != nil {
				return fmt.Errorf("%w: %w", ErrInvalid, err)
			}
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
			if seq != 0 {
				r.Applied = append(slices.Clone(r.Applied), seq)
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
	rec, err = b.cancel(ctx, id, by, c, origin{seq: seq, answer: true})
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
	return b.settleAnswer(ctx, id, o)
}

// cancelChange returns the change a cancel by by (from agent, on
// assent.cancel.<agent>.<id>; "" from anyone allowed), stored at at, makes
// to an open request.
func (b *Broker) cancelChange(by, agent string, c events.Cancel, at time.Time) func(r *Record) error {
	reason := c.Reason
	if reason == "" {
		reason = "cancelled by " + by
	}
	return func(r *Record) error {
		if agent != "" && agent != r.Request.Agent {
			return fmt.Errorf("%w: agent %s cancels a request of agent %s", ErrNotEligible, agent, r.Request.Agent)
		}
		return r.decide(verdict{outcome: events.Cancelled, reason: reason, by: []events.DecidedBy{{Principal: by, At: at.UTC()}}, rule: r.Rule, at: at})
	}
}

// escalateAt moves r to the escalation level its rule reaches by at,
// extending its deadline if the steps say so, and reports whether the level
// rose. Steps count against the request's own deadline, extended by the
// steps before them: one due at or after it never fires.
func (b *Broker) escalateAt(r *Record, at time.Time) bool {
	a := b.approvalFor(r)
	if r.BaseDeadline.IsZero() || len(a.Escalation) == 0 {
		return false
	}
	esc := a.At(r.ReceivedAt, r.BaseDeadline, at)
	if esc.Level <= r.Level {
		return false
	}
	r.Level, r.Deadline = esc.Level, esc.Deadline.UTC()
	return true
}

// timeoutVerdict is the outcome of r once its deadline passed, as its rule
// says: expired, or approved where a timeout approves.
func (b *Broker) timeoutVerdict(r *Record, at time.Time) verdict {
	if b.approvalFor(r).OnTimeout == events.Approve {
		return verdict{outcome: events.Approved, reason: "timeout: rule " + r.Rule + " approves when nobody answers", by: r.Votes, rule: r.Rule, auto: true, at: at}
	}
	return verdict{outcome: events.Expired, reason: "timeout: no decision before the deadline", by: r.Votes, rule: r.Rule, auto: true, at: at}
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
