package broker

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"

	"github.com/assent-dev/assent/pkg/events"
)

// handleTimeout bounds the work on one message once it started, also during
// shutdown.
const handleTimeout = 15 * time.Second

// permanentError marks a message that retrying cannot fix: it is terminated with
// the error as its reason.
type permanentError struct{ err error }

func (e *permanentError) Error() string { return e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }

func permanent(err error) error { return &permanentError{err} }

// retryError asks for redelivery after a delay.
type retryError struct {
	err   error
	delay time.Duration
}

func (e *retryError) Error() string { return e.err.Error() }
func (e *retryError) Unwrap() error { return e.err }

// consume feeds cons's messages to handle on cfg.Workers goroutines until ctx
// ends, then drains: no new messages, in-flight ones finish and are settled.
// ackWait is the consumer's.
func (b *Broker) consume(ctx context.Context, cons jetstream.Consumer, name string, ackWait time.Duration, handle func(context.Context, jetstream.Msg) error) error {
	log := b.log.With(zap.String("consumer", name))
	// work hands messages to the workers; it is never closed, since a
	// delivery may still be sending on it when a drain that overran is
	// stopped. quit ends the workers, and such a delivery, whose message
	// comes back after its ack wait.
	work, quit := make(chan jetstream.Msg), make(chan struct{})
	var wg sync.WaitGroup
	for range b.cfg.Workers {
		wg.Go(func() {
			for {
				var msg jetstream.Msg
				select {
				case msg = <-work:
				case <-quit:
					return
				}
				if scheduledBySomeone(msg.Subject(), msg.Headers()) {
					log.Warn("a schedule, or a message the server stored for one, refused: NATS permissions do not check a schedule's target",
						zap.String("subject", msg.Subject()), zap.String("scheduler", msg.Headers().Get(schedulerHeader)))
					b.settle(log, msg, nil)
					continue
				}
				hctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), handleTimeout)
				stop := keepAlive(msg, ackWait)
				err := handle(hctx, msg)
				stop()
				b.settle(log, msg, err)
				cancel()
			}
		})
	}
	defer wg.Wait()
	defer close(quit)
	cc, err := cons.Consume(func(msg jetstream.Msg) {
		select {
		case work <- msg:
		case <-quit:
		}
	},
		jetstream.PullMaxMessages(2*b.cfg.Workers),
		jetstream.PullExpiry(pullExpiry),
		jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
			if !errors.Is(err, jetstream.ErrNoHeartbeat) {
				log.Debug("consume", zap.Error(err))
			}
		}))
	if err != nil {
		return fmt.Errorf("consume %s: %w", name, err)
	}
	<-ctx.Done()
	cc.Drain()
	select {
	case <-cc.Closed():
	case <-time.After(drainTimeout):
		log.Warn("draining took too long; stopping, and what was not handled is delivered again after its ack wait", zap.Duration("waited", drainTimeout))
		cc.Stop()
	}
	return nil
}

// pullExpiry is how long each pull request of a consumer lasts before the
// client asks again; the server sends a heartbeat every half of it, and the
// client asks again after two heartbeats missed. A consumer's leader that
// crashed takes the pull requests it held with it, and its successor learns
// of none until they are asked again: with nats.go's default of 30 s a
// replica took no message from the new leader for up to 30 s after its
// election (deferred cancels ran out of deliveries meanwhile). With 2 s it
// asks again within 2 s; a pull request every 2 s per consumer costs
// nothing.
const pullExpiry = 2 * time.Second

// drainTimeout bounds a consumer's drain when the broker stops.
var drainTimeout = handleTimeout

// keepAlive tells the server, while a slow handler runs, that msg is still being
// worked on, so the short ack wait redelivers only messages whose replica died.
func keepAlive(msg jetstream.Msg, ackWait time.Duration) (stop func()) {
	every := ackWait / 2
	var t *time.Timer
	var mu sync.Mutex
	stopped := false
	t = time.AfterFunc(every, func() {
		_ = msg.InProgress()
		mu.Lock()
		defer mu.Unlock()
		if !stopped {
			t.Reset(every)
		}
	})
	return func() {
		mu.Lock()
		defer mu.Unlock()
		stopped = true
		t.Stop()
	}
}

// settle acknowledges msg according to the handler's result.
func (b *Broker) settle(log *zap.Logger, msg jetstream.Msg, err error) {
	var perm *permanentError
	var retry *retryError
	switch {
	case err == nil:
		_ = msg.Ack()
	case errors.As(err, &retry):
		log.Debug("message deferred", zap.String("subject", msg.Subject()), zap.Duration("delay", retry.delay), zap.Error(err))
		_ = msg.NakWithDelay(retry.delay)
	case errors.As(err, &perm):
		b.metrics.rejected()
		log.Info("message rejected", zap.String("subject", msg.Subject()), zap.Error(err))
		_ = msg.TermWithReason(truncate(err.Error(), 256))
	default:
		delay := failedDelay(msg, err)
		log.Warn("message failed; will retry", zap.String("subject", msg.Subject()), zap.Duration("delay", delay), zap.Error(err))
		_ = msg.NakWithDelay(delay)
	}
}

// failedDelay is how long a message whose handling failed with err waits
// before it is delivered again. The server not answering (a call that
// reached its callTimeout while a leader is elected, no responders) is tried
// again in a quarter second (unavailableDelay), so that a message goes on
// within moments of the new leader; after half its deliveries, and for other
// failures, the wait is a second more on each delivery up to 30 s, so that
// the consumer's MaxDeliver spans minutes of an outage before the server
// stops delivering it.
func failedDelay(msg jetstream.Msg, err error) time.Duration {
	n := uint64(1)
	if md, mdErr := msg.Metadata(); mdErr == nil {
		n = md.NumDelivered
	}
	if unavailable(err) && n <= maxDeliver/2 {
		return unavailableDelay
	}
	return min(time.Duration(n)*time.Second, 30*time.Second)
}

func (b *Broker) decode(msg jetstream.Msg) (events.Event, events.Subject, error) {
	sub, err := events.ParseSubject(msg.Subject())
	if err != nil {
		return events.Event{}, sub, permanent(err)
	}
	e, err := b.codec.Decode(events.Header(msg.Headers()), msg.Data())
	if err != nil {
		return events.Event{}, sub, permanent(err)
	}
	return e, sub, nil
}

// handleRequest ingests a requested event from assent.request.<agent>, in a
// span (SpanIngest) under the trace context the event carries.
func (b *Broker) handleRequest(ctx context.Context, msg jetstream.Msg) (err error) {
	e, sub, err := b.decode(msg)
	if err != nil {
		return err
	}
	var rec Record
	ctx, span := b.startSpan(eventContext(ctx, &e), SpanIngest, trace.SpanKindConsumer, e.ID(), attrAgent.String(sub.Agent))
	defer func() { endSpan(span, &rec, err) }()
	o, err := originOf(msg)
	if err != nil {
		return permanent(err)
	}
	req, err := events.DecodeRequested(&e)
	if err == nil && req.Agent != "" && req.Agent != sub.Agent {
		err = fmt.Errorf("%w: agent: %q in data but the subject names %q", events.ErrBadValue, req.Agent, sub.Agent)
	}
	if err != nil {
		if errors.Is(err, events.ErrWrongType) {
			return permanent(err)
		}
		// The envelope is sound, so the agent is waiting on this id: tell it.
		req.Agent = sub.Agent
		if rerr := b.reject(ctx, e.ID(), e.Source(), req, o, err); rerr != nil {
			return rerr
		}
		return permanent(err)
	}
	req.Agent = sub.Agent
	span.SetAttributes(attrTool.String(req.Tool))
	rec, err = b.ingest(ctx, e.ID(), e.Source(), req, o)
	switch {
	case errors.Is(err, ErrIDConflict):
		// The id is another request's: that one keeps it, and this one's
		// agent learns why it gets no decision of its own.
		if rerr := b.rejectConflict(ctx, e.ID(), req, o, err); rerr != nil {
			return rerr
		}
		b.log.Warn("request refused: its id belongs to a different request", zap.String("request_id", e.ID()), zap.String("agent", sub.Agent), zap.Error(err))
		return permanent(err)
	case errors.Is(err, ErrInvalid):
		// Valid as an event, but the policy cannot read it, or its events
		// would not fit the stream: deny it at once.
		if rerr := b.reject(ctx, e.ID(), e.Source(), req, o, err); rerr != nil {
			return rerr
		}
		return permanent(err)
	}
	return err
}

// handleResponse applies an answer from assent.response.<principal>.<id>, in
// a span (SpanAnswer) under the trace context the answer carries, or else the
// request's.
func (b *Broker) handleResponse(ctx context.Context, msg jetstream.Msg) (err error) {
	e, sub, err := b.decode(msg)
	if err != nil {
		return err
	}
	resp, err := events.DecodeResponded(&e)
	if err != nil {
		return permanent(err)
	}
	var rec Record
	ctx, span := b.startSpan(b.requestContext(eventContext(ctx, &e), sub.RequestID), SpanAnswer, trace.SpanKindConsumer, sub.RequestID,
		attrPrincipal.String(sub.Principal), attrDecision.String(string(resp.Decision)))
	defer func() { endSpan(span, &rec, err) }()
	o, err := originOf(msg)
	if err != nil {
		return permanent(err)
	}
	o.answer = true
	// The answer counts as given when the stream stored it, so an approver who
	// answered in time is not refused because the broker was slow or down.
	rec, err = b.respond(ctx, sub.Principal, sub.RequestID, resp, o)
	if err == nil {
		b.log.Info("answer applied", zap.String("request_id", rec.ID), zap.String("state", string(rec.State)), zap.String("principal", sub.Principal))
	}
	return b.refusal(ctx, msg, sub.RequestID, err)
}

// handleCancel applies assent.cancel.<id>, and assent.cancel.<agent>.<id>,
// which cancels only a request of that agent, in a span (SpanCancel) as
// handleResponse does.
func (b *Broker) handleCancel(ctx context.Context, msg jetstream.Msg) (err error) {
	e, sub, err := b.decode(msg)
	if err != nil {
		return err
	}
	c, err := events.DecodeCancel(&e)
	if err != nil {
		return permanent(err)
	}
	var rec Record
	ctx, span := b.startSpan(b.requestContext(eventContext(ctx, &e), sub.RequestID), SpanCancel, trace.SpanKindConsumer, sub.RequestID,
		attrPrincipal.String(e.Source()))
	defer func() { endSpan(span, &rec, err) }()
	o, err := originOf(msg)
	if err != nil {
		return permanent(err)
	}
	o.answer = true
	o.agent = sub.Agent
	rec, err = b.cancel(ctx, sub.RequestID, e.Source(), c, o)
	return b.refusal(ctx, msg, sub.RequestID, err)
}

// refusal maps the result of applying an answer or cancel to how its message
// is settled: one about a request unknown when it was stored (its request
// stored after it, or never), decided, expired, forbidden or malformed is
// terminated, since the ledger has read everything stored before it and
// nothing stored later changes that; anything else is transient.
func (b *Broker) refusal(ctx context.Context, msg jetstream.Msg, id string, err error) error {
	var retry *retryError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &retry):
		return err
	case errors.Is(err, ErrAlreadyDecided), errors.Is(err, ErrNotFound), errors.Is(err, ErrExpired), errors.Is(err, ErrNotEligible), errors.Is(err, ErrInvalid),
		errors.Is(err, ErrBeforeRequest), errors.Is(err, ErrForgedDecision):
		return permanent(err)
	}
	return err
}

// handleTimeout expires a request whose durable schedule or local timer fired.
func (b *Broker) handleTimeout(ctx context.Context, msg jetstream.Msg) error {
	id := msg.Subject()[len(TimeoutPrefix):]
	if !events.ValidToken(id) {
		return permanent(fmt.Errorf("%w: %q", events.ErrBadSubject, msg.Subject()))
	}
	o, err := originOf(msg)
	if err != nil {
		return permanent(err)
	}
	return b.expireOne(ctx, id, o)
}

// schedulerHeader is the header the server sets on a message it stores
// when a schedule fires, naming the schedule's subject.
const schedulerHeader = "Nats-Scheduler"

// scheduledBySomeone reports whether a message on subject with headers h
// was stored by the server for a schedule (or is a schedule) other than
// the broker's own durable ticks. The server checks a publisher's
// permissions on the schedule's subject, not on its target, so an agent
// that may publish its requests into a stream that takes schedules (one an
// earlier broker made) could otherwise have the server store an answer in
// any principal's name, a cancel, or a batch of expiries. The broker takes
// none of them. ASSENT_TIMERS holds the broker's alone: only the broker
// may publish there, and a schedule elsewhere cannot target it.
func scheduledBySomeone(subject string, h nats.Header) bool {
	if h.Get(schedulerHeader) == "" && h.Get(jetstream.ScheduleHeader) == "" {
		return false
	}
	if strings.HasPrefix(subject, timerSpace) {
		return false
	}
	return !strings.HasPrefix(subject, TimerPrefix) && !strings.HasPrefix(h.Get(schedulerHeader), TimerPrefix)
}
