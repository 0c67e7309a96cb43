package handler

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"

	"github.com/assent-dev/assent/pkg/events"
)

// Handler answers one pending request. It runs with a context that ends at the
// request's deadline or as soon as the request is decided elsewhere.
//
// Return ErrSkip to leave the request to other approvers. Any other error is
// retried later, unless wrapped with Permanent.
type Handler func(ctx context.Context, req Request) (Response, error)

// Response is an approver's answer.
type Response struct {
	Decision events.Verdict
	Reason   string
	// Args, if set on an approval, replaces the request's arguments.
	Args json.RawMessage
	// Payload is a structured answer, checked against the request's response_schema.
	Payload  json.RawMessage
	Remember *events.Remember
	// ShownAt is when the channel showed the request to the approver, and
	// Detail that the approver opened its full detail before answering
	// (events.Responded); zero and false where the channel cannot tell.
	ShownAt time.Time
	Detail  bool
}

// ErrSkip tells the runtime not to answer this request.
var ErrSkip = errors.New("skip request")

// Permanent marks a handler error that retrying cannot fix; the runtime stops
// offering that request to this approver.
func Permanent(err error) error { return &permanentError{err} }

type permanentError struct{ err error }

func (e *permanentError) Error() string { return e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }

// ApproverConfig configures an Approver.
type ApproverConfig struct {
	// Principal is who answers; answers go to assent.response.<Principal>.<id>.
	Principal string
	// Channel names the transport in decisions ("slack", "email", "cli", ...).
	Channel string
	// Agents limits the requests offered to those of these agents; empty means all.
	Agents []string
	// Durable names the consumer that remembers this approver's progress.
	// Default "approver-<Principal>-<Channel>".
	Durable string
	// Concurrency bounds how many requests the handler sees at once. Default 16.
	Concurrency int
	// Lookback is how far back a new approver looks for requests still pending.
	// Default 24h (the broker's default maximum timeout).
	Lookback time.Duration
	// TrustedKeys are the public keys of the broker's decision keys, as in
	// Config.TrustedKeys. When set, only a decision one of them signed
	// counts as the request's: a forged one neither withdraws a request
	// from the handler nor hides it. Empty, any message on the decision
	// subject does.
	TrustedKeys []string
	// TracerProvider makes the span of each request handled
	// (SpanApprove), in the request's trace; the answer carries it. Nil
	// uses OpenTelemetry's global provider.
	TracerProvider trace.TracerProvider
	// Logger; nil logs nothing.
	Logger *zap.Logger
}

// Approver feeds pending requests to a Handler and publishes its answers.
type Approver struct {
	cfg     ApproverConfig
	nc      *nats.Conn
	js      jetstream.JetStream
	h       Handler
	log     *zap.Logger
	client  *Client
	tracer  trace.Tracer
	running sync.Mutex
}

// NewApprover returns an approver runtime for h on nc.
func NewApprover(nc *nats.Conn, cfg ApproverConfig, h Handler) (*Approver, error) {
	if nc == nil || h == nil {
		return nil, errors.New("handler: NewApprover needs a connection and a handler")
	}
	var errs []error
	if err := events.CheckToken("principal", cfg.Principal); err != nil {
		errs = append(errs, err)
	}
	if cfg.Channel == "" {
		cfg.Channel = "sdk"
	}
	if err := events.CheckToken("channel", cfg.Channel); err != nil {
		errs = append(errs, err)
	}
	errs = append(errs, checkAgents(cfg.Agents)...)
	if cfg.Durable == "" {
		cfg.Durable = "approver-" + cfg.Principal + "-" + cfg.Channel
	}
	if err := events.CheckToken("durable", cfg.Durable); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("handler: approver config: %w", err)
	}
	defaults(&cfg.Concurrency, &cfg.Lookback, &cfg.Logger)
	js, client, err := connectRuntime(nc, cfg.Logger, cfg.TrustedKeys)
	if err != nil {
		return nil, err
	}
	return &Approver{cfg: cfg, nc: nc, js: js, h: h, client: client, tracer: newTracer(cfg.TracerProvider),
		log: cfg.Logger.Named("approver").With(zap.String("principal", cfg.Principal), zap.String("channel", cfg.Channel))}, nil
}

// Run offers pending requests to the handler until ctx ends, then waits for
// running handlers to return.
func (a *Approver) Run(ctx context.Context) error {
	if !a.running.TryLock() {
		return errors.New("handler: Approver.Run is already running")
	}
	defer a.running.Unlock()
	start := time.Now().Add(-a.cfg.Lookback)
	cfg := consumerConfig(a.cfg.Durable, "Assent approver "+a.cfg.Principal+" via "+a.cfg.Channel,
		pendingFilters(a.cfg.Agents), start, 4*a.cfg.Concurrency)
	cfg.MaxDeliver = 10
	cons, err := Durable(ctx, a.js, cfg)
	if err != nil {
		return fmt.Errorf("handler: approver consumer: %w", err)
	}
	p := newPool(ctx, a.cfg.Concurrency)
	p.wg.Go(func() {
		Announce(ctx, a.js, a.log, a.cfg.Channel, func() []string { return []string{a.cfg.Principal} })
	})
	cc, err := p.consume(cons, 2*a.cfg.Concurrency, a.handle)
	if err != nil {
		return fmt.Errorf("handler: consume pending: %w", err)
	}
	<-ctx.Done()
	cc.Stop()
	<-cc.Closed()
	p.wait()
	return nil
}

// handle offers one pending event to the handler and settles the message.
func (a *Approver) handle(ctx context.Context, msg jetstream.Msg) {
	ctx, n, ok := takeNotice(ctx, a.client.codec, msg)
	if !ok {
		return
	}
	req := n.Request
	ctx, span := a.tracer.Start(ctx, SpanApprove, trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(attrRequestID.String(req.ID), attrAgent.String(req.Agent), attrTool.String(req.Tool),
			attrPrincipal.String(a.cfg.Principal), attrChannel.String(a.cfg.Channel), attrLevel.Int(n.Level)))
	var spanErr error
	defer func() { endSpan(span, spanErr) }()
	log := a.log.With(zap.String("request_id", req.ID), zap.String("tool", req.Tool))
	hctx, cancel := context.WithDeadline(ctx, req.Deadline)
	defer cancel()
	// Stop the handler as soon as the request is decided elsewhere, as the
	// server tells once it stored the decision (never from the stored
	// subject, whose plain subscribers also see what the stream refused).
	// The subscription is in place on the server (flushed) before the
	// stored decision is looked up, so that a decision is either found or
	// seen, unless its copy is lost: the handler then runs on, and the
	// broker refuses its answer as too late.
	decSubj, _ := events.DecidedSubject(req.ID)
	sub, err := a.nc.Subscribe(decSubj, func(m *nats.Msg) {
		switch {
		case !a.client.first(m.Header):
			log.Warn("ignoring a decided event that is not the first on its subject")
		case !a.client.authentic(m.Header, m.Data):
			log.Warn("ignoring a decided event that no trusted key signed")
		default:
			cancel()
		}
	})
	if err == nil {
		defer sub.Unsubscribe() //nolint:errcheck // best effort
		fctx, fcancel := context.WithTimeout(ctx, opTimeout)
		_ = a.nc.FlushWithContext(fctx) // best effort: without it a decision may only be found below
		fcancel()
	}
	if _, decided, err := a.client.Decision(ctx, req.ID); err == nil && decided {
		_ = msg.Ack()
		return
	}
	// Keep the message ours while a person thinks.
	defer keepAlive(msg)()

	resp, err := a.h(hctx, req)
	var perm *permanentError
	switch {
	case errors.Is(err, ErrSkip):
		_ = msg.Ack()
		return
	case hctx.Err() != nil && ctx.Err() == nil:
		_ = msg.Ack() // decided elsewhere or deadline passed: nothing to answer
		return
	case errors.As(err, &perm):
		log.Warn("handler failed permanently", zap.Error(err))
		_ = msg.TermWithReason(err.Error())
		spanErr = err
		return
	case err != nil:
		log.Warn("handler failed; will retry", zap.Error(err))
		_ = msg.NakWithDelay(5 * time.Second)
		spanErr = err
		return
	}
	span.SetAttributes(attrDecision.String(string(resp.Decision)))
	if err := a.answer(ctx, req.ID, resp); err != nil {
		log.Warn("publish answer failed; will retry", zap.Error(err))
		_ = msg.NakWithDelay(time.Second)
		spanErr = err
		return
	}
	_ = msg.Ack()
}

// answer publishes a responded event.
func (a *Approver) answer(ctx context.Context, id string, r Response) error {
	return Answer(ctx, a.js, a.cfg.Principal, id, events.Responded{
		Decision: r.Decision, Reason: r.Reason, Args: r.Args, Payload: r.Payload, Remember: r.Remember, Channel: a.cfg.Channel,
		ShownAt: r.ShownAt, Detail: r.Detail,
	})
}

// Answer publishes one approver's answer to request id on
// assent.response.<principal>.<id>, for programs that do not run an Approver.
// The broker decides whether it counts; watch the decision to learn the outcome.
// The answer carries the trace context of ctx, if any: pass the context of
// the pending event (its trace) so that the broker's span joins the request's
// trace.
func Answer(ctx context.Context, js jetstream.JetStream, principal, id string, r events.Responded) error {
	if err := r.Validate(); err != nil {
		return err
	}
	subj, err := events.ResponseSubject(principal, id)
	if err != nil {
		return err
	}
	e, err := events.New(events.TypeResponded, "", "approver/"+principal, r)
	if err != nil {
		return err
	}
	setEventTrace(ctx, &e)
	h, body, err := events.Encode(&e)
	if err != nil {
		return err
	}
	_, err = js.PublishMsg(ctx, &nats.Msg{Subject: subj, Header: nats.Header(h), Data: body}, jetstream.WithMsgID(e.ID()))
	return err
}
