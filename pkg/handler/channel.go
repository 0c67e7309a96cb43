package handler

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"

	"github.com/assent-dev/assent/pkg/events"
)

// A Channel shows pending requests to people over one transport (Slack, email,
// a chat, a pager) and shows each request's outcome there once it is decided.
// Unlike an Approver, a channel reaches many principals and its people answer
// asynchronously (a click, a link), so it does not block on a request: the
// runtime calls its Notifier for every new or escalated request and for every
// outcome, and the channel answers for whichever principal acted with Answer.
//
// Several processes may run the same channel: each request is notified once
// across all of them (the consumers are durable and named after the channel,
// not the process), and what a notification made (its Ref: a message id, say)
// is kept in the ChannelBucket, so that any process can find it when a
// person acts or the request is decided.
type Channel struct {
	cfg    ChannelConfig
	nc     *nats.Conn
	js     jetstream.JetStream
	n      Notifier
	client *Client
	log    *zap.Logger
	tracer trace.Tracer

	mu       sync.Mutex
	kv       jetstream.KeyValue
	running  sync.Mutex
	reachers func() []string
	// presence asks the announcer to ask reachers again now: a notice
	// found the channel unable to deliver.
	presence chan struct{}
}

// Notifier is what a channel does with the requests the runtime hands it.
type Notifier interface {
	// Notify shows a pending request to the people of n.Approvers that the
	// channel reaches: a new request (Level 0), an escalation (Level > 0,
	// Approvers then the newly notified), or a reminder (Reminder). n.Ref is
	// what the channel returned for this request before, nil the first time.
	// The returned ref is kept for later calls about the request (nil keeps
	// the previous one). An error is retried with backoff until the request
	// ends; one wrapping ErrUndeliverable, every minute, and presence is
	// refreshed at once (ChannelConfig.Reachable).
	Notify(ctx context.Context, n Notice) (ref json.RawMessage, err error)
	// Resolve shows the outcome where the request was shown. It is called
	// at least once per request the channel was notified of (rarely twice:
	// make it idempotent). An error is retried with backoff.
	Resolve(ctx context.Context, o Outcome) error
}

// Notice is a pending request, as a channel shows it.
type Notice struct {
	Request
	// Approvers are who to tell: for a new request, who may answer, as the
	// policy wrote them (principal names and role:<role>); for an
	// escalation, the principals it adds (everyone of earlier levels may
	// still answer). Empty means anyone.
	Approvers []string
	// Rule is the policy rule that asked for approval (kept from the first
	// notice in escalations).
	Rule string
	// Level is the escalation level: 0 for a new request.
	Level int
	// Terms are what answers the broker accepts; nil from older brokers.
	Terms *events.Terms
	// Reminder marks a reminder: the request is still waiting, and its
	// deadline is near.
	Reminder bool
	// Ref is what Notify returned for this request before; nil the first time.
	Ref json.RawMessage
	// Retry says an earlier attempt to show this notice was cut short (an
	// error, a process killed while it went out) and may have gone out all
	// the same: a channel that can find what it showed (a Slack message by
	// its metadata) looks before showing it again.
	Retry bool
	// Pending is when the request went pending (its pending event was
	// stored); zero if unknown.
	Pending time.Time
	// History is what the record said of requests like it when it was
	// announced (events.Pending.History), kept from the first notice in
	// escalations; nil when the broker had not read the record.
	History *events.History
}

// ErrUndeliverable is wrapped by a Notify error that retrying will not cure
// until someone changes the channel's setup: a Slack channel that does not
// exist or the app is not in, a token the service refuses, an address the
// mail server rejects. The runtime then retries the notice every minute
// rather than within seconds and asks Reachable again at once, for the
// channel to leave out the principals it cannot reach.
var ErrUndeliverable = errors.New("the channel cannot deliver")

// Outcome is a decided request, as a channel shows it.
type Outcome struct {
	RequestID string
	Decision  Decision
	// Notice is the last notice of the request, with its Ref.
	Notice Notice
}

// ChannelConfig configures a Channel.
type ChannelConfig struct {
	// Channel names the transport ("slack", "email", ...): in decisions, in
	// presence, and in the consumers' names.
	Channel string
	// Principals lists who the channel reaches, announced to brokers (the
	// presence bucket) so that on_no_approver knows them. Reachable, if set,
	// is asked instead each time (a configuration that reloads): every
	// presence refresh, and at once after a Notify error wrapping
	// ErrUndeliverable. A channel that cannot deliver to some principals
	// (its Notify failed for good) leaves them out until it can again, so
	// that brokers stop counting them as reachable.
	Principals []string
	Reachable  func() []string
	// Agents limits the channel to these agents' requests; empty means all.
	Agents []string
	// Remind, if positive, sends a reminder this long before a request's
	// deadline (when the request lives longer than that).
	Remind time.Duration
	// Lookback is how far back a new channel looks for requests still
	// pending. Default 24h.
	Lookback time.Duration
	// Concurrency bounds the notifications in flight. Default 16.
	Concurrency int
	// TrustedKeys are the public keys of the broker's decision keys, as in
	// Config.TrustedKeys. When set, only the first stored decision one of
	// them signed resolves a request; a forged one is logged and skipped.
	// Empty, the first decided event stored on the subject does, and any
	// stored after it is logged and skipped.
	TrustedKeys []string
	// TracerProvider makes the channel's spans (SpanNotify, SpanAnswer,
	// SpanResolve) in each request's trace; nil uses OpenTelemetry's global
	// provider.
	TracerProvider trace.TracerProvider
	// Logger; nil logs nothing.
	Logger *zap.Logger
}

// ChannelBucket keeps, per channel and request, what its notification made.
const ChannelBucket = "assent-channels"

// channelKeep is how long a channel remembers a request: past the longest
// timeout (24h) with room for escalations.
const channelKeep = 72 * time.Hour

// NewChannel returns a channel runtime for n on nc.
func NewChannel(nc *nats.Conn, cfg ChannelConfig, n Notifier) (*Channel, error) {
	if nc == nil || n == nil {
		return nil, errors.New("handler: NewChannel needs a connection and a notifier")
	}
	var errs []error
	if err := events.CheckToken("channel", cfg.Channel); err != nil {
		errs = append(errs, err)
	}
	for _, p := range cfg.Principals {
		if err := events.CheckToken("principal", p); err != nil {
			errs = append(errs, err)
		}
	}
	errs = append(errs, checkAgents(cfg.Agents)...)
	if cfg.Remind < 0 {
		errs = append(errs, fmt.Errorf("remind %s: want a positive duration, or 0 for no reminders", cfg.Remind))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("handler: channel config: %w", err)
	}
	defaults(&cfg.Concurrency, &cfg.Lookback, &cfg.Logger)
	js, client, err := connectRuntime(nc, cfg.Logger, cfg.TrustedKeys)
	if err != nil {
		return nil, err
	}
	c := &Channel{cfg: cfg, nc: nc, js: js, n: n, client: client, tracer: newTracer(cfg.TracerProvider),
		log: cfg.Logger.Named("channel").With(zap.String("channel", cfg.Channel)), presence: make(chan struct{}, 1)}
	c.reachers = func() []string { return cfg.Principals }
	if cfg.Reachable != nil {
		c.reachers = cfg.Reachable
	}
	return c, nil
}

// Name is the channel's name, as decisions record it.
func (c *Channel) Name() string { return c.cfg.Channel }

// bucket opens (or makes) the channel bucket.
func (c *Channel) bucket(ctx context.Context) (jetstream.KeyValue, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.kv != nil {
		return c.kv, nil
	}
	kv, err := c.js.KeyValue(ctx, ChannelBucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		kv, err = c.js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
			Bucket: ChannelBucket, Description: "Assent channels: what each channel showed for each request",
			TTL: channelKeep, Storage: jetstream.FileStorage,
		})
	}
	if err != nil {
		return nil, fmt.Errorf("handler: channel bucket: %w", err)
	}
	c.kv = kv
	return kv, nil
}

// shown is what the bucket keeps per channel and request.
type shown struct {
	Notice noticeJSON `json:"notice"`
	// Sending marks a notice recorded before it goes out (so that a person
	// acting on it at once finds it) and not known to have gone out yet.
	Sending  bool `json:"sending,omitempty"`
	Reminded bool `json:"reminded,omitempty"`
	Resolved bool `json:"resolved,omitempty"`
}

type noticeJSON struct {
	ID        string           `json:"id"`
	Request   events.Requested `json:"request"`
	Deadline  time.Time        `json:"deadline"`
	Approvers []string         `json:"approvers,omitempty"`
	Rule      string           `json:"rule,omitempty"`
	Level     int              `json:"level,omitempty"`
	Terms     *events.Terms    `json:"terms,omitempty"`
	Ref       json.RawMessage  `json:"ref,omitempty"`
	// Pending is when the request went pending (its pending event was
	// stored), for the reminder's earliest time; zero in older entries.
	Pending time.Time `json:"pending,omitzero"`
	// History is the pending event's history; nil in older entries.
	History *events.History `json:"history,omitempty"`
	// TraceParent and TraceState are the trace context of the span that
	// showed the notice, for the spans of the answers to it.
	TraceParent string `json:"traceparent,omitempty"`
	TraceState  string `json:"tracestate,omitempty"`
}

func (n *Notice) json() noticeJSON {
	return noticeJSON{ID: n.ID, Request: n.Requested, Deadline: n.Deadline, Approvers: n.Approvers, Rule: n.Rule, Level: n.Level, Terms: n.Terms, Ref: n.Ref, Pending: n.Pending,
		History: n.History}
}

func (j *noticeJSON) notice() Notice {
	return Notice{Request: Request{ID: j.ID, Requested: j.Request, Deadline: j.Deadline}, Approvers: j.Approvers, Rule: j.Rule, Level: j.Level, Terms: j.Terms, Ref: j.Ref, Pending: j.Pending,
		History: j.History}
}

func (c *Channel) key(id string) string { return c.cfg.Channel + "." + id }

// load returns what the channel showed for request id, and the entry's
// revision; ok is false if it showed nothing.
func (c *Channel) load(ctx context.Context, id string) (s shown, rev uint64, ok bool, err error) {
	kv, err := c.bucket(ctx)
	if err != nil {
		return s, 0, false, err
	}
	e, err := kv.Get(ctx, c.key(id))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return s, 0, false, nil
	}
	if err != nil {
		return s, 0, false, err
	}
	if err := json.Unmarshal(e.Value(), &s); err != nil {
		return s, 0, false, fmt.Errorf("channel entry %s: %w", e.Key(), err)
	}
	return s, e.Revision(), true, nil
}

// save writes s for its request: a create when rev is 0, else an update of
// revision rev.
func (c *Channel) save(ctx context.Context, s shown, rev uint64) (uint64, error) {
	kv, err := c.bucket(ctx)
	if err != nil {
		return 0, err
	}
	b, _ := json.Marshal(s)
	if rev == 0 {
		return kv.Create(ctx, c.key(s.Notice.ID), b)
	}
	return kv.Update(ctx, c.key(s.Notice.ID), b, rev)
}

// Lookup returns the last notice the channel showed for request id, with its
// Ref; ok is false if it showed none (or has forgotten it, 72 hours on).
// Any process running the channel can look up what another showed.
func (c *Channel) Lookup(ctx context.Context, id string) (n Notice, resolved, ok bool, err error) {
	s, _, ok, err := c.load(ctx, id)
	if err != nil || !ok {
		return Notice{}, false, ok, err
	}
	return s.Notice.notice(), s.Resolved, true, nil
}

// Decision returns request id's decision, if it has one.
func (c *Channel) Decision(ctx context.Context, id string) (Decision, bool, error) {
	return c.client.Decision(ctx, id)
}

// Answer publishes principal's answer to request id through this channel:
// the same path as every other approver's (assent.response.<principal>.<id>).
// The broker decides whether it counts; the outcome reaches Resolve.
//
// The answer is a span (SpanAnswer) in the trace of ctx or, when ctx has
// none, in the request's: under the span that showed the notice.
func (c *Channel) Answer(ctx context.Context, principal, id string, r Response) (err error) {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		if s, _, ok, err := c.load(ctx, id); err == nil && ok {
			ctx = withStoredTrace(ctx, s.Notice.TraceParent, s.Notice.TraceState)
		}
	}
	ctx, span := c.tracer.Start(ctx, SpanAnswer, trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithAttributes(attrRequestID.String(id), attrPrincipal.String(principal), attrChannel.String(c.cfg.Channel),
			attrDecision.String(string(r.Decision))))
	defer func() { endSpan(span, err) }()
	return Answer(ctx, c.js, principal, id, events.Responded{
		Decision: r.Decision, Reason: r.Reason, Args: r.Args, Payload: r.Payload, Remember: r.Remember, Channel: c.cfg.Channel,
		ShownAt: r.ShownAt, Detail: r.Detail,
	})
}

// Run notifies and resolves until ctx ends, then waits for the calls in
// flight to return.
func (c *Channel) Run(ctx context.Context) error {
	if !c.running.TryLock() {
		return errors.New("handler: Channel.Run is already running")
	}
	defer c.running.Unlock()
	if _, err := c.bucket(ctx); err != nil {
		if ctx.Err() != nil {
			return nil // stopped before it started
		}
		return err
	}
	start := time.Now().Add(-c.cfg.Lookback)
	name := "channel-" + c.cfg.Channel
	notify, err := Durable(ctx, c.js, consumerConfig(name+"-notify", "Assent channel "+c.cfg.Channel+": notifications",
		pendingFilters(c.cfg.Agents), start,
		100_000)) // a request waiting for its reminder stays unacknowledged
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("handler: channel consumer: %w", err)
	}
	resolve, err := Durable(ctx, c.js, consumerConfig(name+"-resolve", "Assent channel "+c.cfg.Channel+": outcomes",
		[]string{events.DecisionPrefix + "*"}, start, 4*c.cfg.Concurrency))
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("handler: channel consumer: %w", err)
	}
	p := newPool(ctx, c.cfg.Concurrency)
	p.wg.Go(func() { announce(ctx, c.js, c.log, c.cfg.Channel, c.reachers, c.presence) })
	nc, err := p.consume(notify, 2*c.cfg.Concurrency, c.handleNotice)
	if err != nil {
		return fmt.Errorf("handler: consume pending: %w", err)
	}
	rc, err := p.consume(resolve, 2*c.cfg.Concurrency, c.handleOutcome)
	if err != nil {
		nc.Stop()
		return fmt.Errorf("handler: consume decisions: %w", err)
	}
	<-ctx.Done()
	nc.Stop()
	rc.Stop()
	<-nc.Closed()
	<-rc.Closed()
	p.wait()
	return nil
}

// NoticeOf reads a pending or escalated event as a Notice; ok is false for
// other types.
func NoticeOf(e *events.Event) (n Notice, ok bool, err error) {
	switch e.Type() {
	case events.TypePending:
		p, err := events.DecodePending(e)
		return Notice{Request: Request{ID: p.RequestID, Requested: p.Request, Deadline: p.Deadline}, Approvers: p.Approvers, Rule: p.Rule, Terms: p.Terms,
			History: p.History}, err == nil, err
	case events.TypeEscalated:
		p, err := events.DecodeEscalated(e)
		return Notice{Request: Request{ID: p.RequestID, Requested: p.Request, Deadline: p.Deadline}, Approvers: p.Approvers, Level: p.Level, Terms: p.Terms}, err == nil, err
	}
	return Notice{}, false, nil
}

// handleNotice notifies the channel of one pending or escalated event, once
// across processes and restarts, then holds the message back until its
// reminder is due.
func (c *Channel) handleNotice(ctx context.Context, msg jetstream.Msg) {
	ctx, n, ok := takeNotice(ctx, c.client.codec, msg)
	if !ok {
		return
	}
	log := c.log.With(zap.String("request_id", n.ID), zap.Int("level", n.Level))
	defer keepAlive(msg)()
	if d, decided, err := c.client.Decision(ctx, n.ID); err != nil {
		retry(msg)
		return
	} else if decided {
		c.resolveNow(ctx, n.ID, d, log)
		_ = msg.Ack()
		return
	}
	s, rev, found, err := c.load(ctx, n.ID)
	if err != nil {
		log.Warn("read channel entry; will retry", zap.Error(err))
		retry(msg)
		return
	}
	switch {
	case found && s.Notice.Level > n.Level:
		// A later escalation was shown already: this notice is stale.
		_ = msg.Ack()
		return
	case found && s.Notice.Level == n.Level && !s.Sending:
		// Shown before (a redelivery after a restart): only the reminder
		// may be left to do.
		c.remind(ctx, msg, s, rev, log)
		return
	}
	n.Pending = s.Notice.Pending
	if found {
		// An escalation (it names the rule only in the first notice), or a
		// notice whose sending was cut short.
		n.Ref = s.Notice.Ref
		n.Retry = s.Sending
		if n.Rule == "" {
			n.Rule = s.Notice.Rule
		}
		if n.History == nil {
			n.History = s.Notice.History
		}
	} else if md, err := msg.Metadata(); err == nil {
		n.Pending = md.Timestamp
	}
	ctx, span := c.startNotify(ctx, n)
	var spanErr error
	defer func() { endSpan(span, spanErr) }()
	tp, ts := storedTrace(ctx)
	// Record the notice before it goes out: a person may act on it at once,
	// on any process running the channel.
	j := n.json()
	j.TraceParent, j.TraceState = tp, ts
	if rev, err = c.save(ctx, shown{Notice: j, Sending: true}, rev); err != nil {
		log.Warn("record notice; will retry", zap.Error(err))
		retry(msg)
		spanErr = err
		return
	}
	ref, err := c.n.Notify(ctx, n)
	if err != nil {
		c.notifyFailed(ctx, msg, err, log)
		spanErr = err
		return
	}
	if ref != nil {
		n.Ref = ref
	}
	// The notification went out: record that even while stopping, or the
	// notice would stay marked as going out and never be resolved.
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	next := shown{Notice: n.json()}
	next.Notice.TraceParent, next.Notice.TraceState = tp, ts
	rev, err = c.save(sctx, next, rev)
	cancel()
	if err != nil {
		// The bucket is unreachable: the notification went out either way.
		log.Warn("record notification", zap.Error(err))
		_ = msg.Ack()
		return
	}
	// A decision may have come while the notification went out, when the
	// outcome consumer left it to this one (resolve): check once more.
	if d, decided, err := c.client.Decision(ctx, n.ID); err == nil && decided {
		c.resolveNow(ctx, n.ID, d, log)
		_ = msg.Ack()
		return
	}
	c.remind(ctx, msg, next, rev, log)
}

// remind sends the reminder of a shown notice when it is due, or holds the
// message back until then; it acknowledges the message once nothing is left.
func (c *Channel) remind(ctx context.Context, msg jetstream.Msg, s shown, rev uint64, log *zap.Logger) {
	if c.cfg.Remind <= 0 || s.Reminded || s.Resolved {
		_ = msg.Ack()
		return
	}
	n := s.Notice.notice()
	at, ok := remindAt(n.Pending, n.Deadline, c.cfg.Remind)
	if !ok {
		_ = msg.Ack() // too short a request for a reminder
		return
	}
	if wait := time.Until(at); wait > 0 {
		_ = msg.NakWithDelay(wait)
		return
	}
	if !time.Now().Before(n.Deadline) {
		_ = msg.Ack()
		return
	}
	if _, decided, err := c.client.Decision(ctx, n.ID); err != nil {
		retry(msg)
		return
	} else if decided {
		_ = msg.Ack() // the outcome consumer resolves it
		return
	}
	n.Reminder = true
	ctx, span := c.startNotify(withStoredTrace(ctx, s.Notice.TraceParent, s.Notice.TraceState), n)
	ref, err := c.n.Notify(ctx, n)
	endSpan(span, err)
	if err != nil {
		c.notifyFailed(ctx, msg, err, log)
		return
	}
	if ref != nil {
		s.Notice.Ref = ref
	}
	s.Reminded = true
	if _, err := c.save(ctx, s, rev); err != nil {
		log.Warn("record reminder", zap.Error(err))
	}
	_ = msg.Ack()
}

// remindAt returns when a request that went pending at pending, with its
// deadline, is reminded of, remind before its deadline; ok is false if it is
// not: a reminder never goes out before half of the request's time has gone,
// so that a request shorter than twice remind gets none (and a reminder
// never follows its notice at once). Without pending (an entry older than
// the field) the deadline alone decides.
func remindAt(pending, deadline time.Time, remind time.Duration) (at time.Time, ok bool) {
	at = deadline.Add(-remind)
	if !pending.IsZero() && at.Before(pending.Add(deadline.Sub(pending)/2)) {
		return time.Time{}, false
	}
	return at, true
}

// notifyFailed retries a notice whose Notify failed: within seconds, or,
// when the channel cannot deliver (ErrUndeliverable), every minute, with
// presence refreshed at once.
func (c *Channel) notifyFailed(ctx context.Context, msg jetstream.Msg, err error, log *zap.Logger) {
	if ctx.Err() != nil {
		retry(msg)
		return
	}
	if errors.Is(err, ErrUndeliverable) {
		log.Error("the channel cannot deliver; will retry every minute", zap.Error(err))
		select {
		case c.presence <- struct{}{}:
		default:
		}
		_ = msg.NakWithDelay(undeliverableRetry)
		return
	}
	log.Warn("notify failed; will retry", zap.Error(err))
	retry(msg)
}

// undeliverableRetry is how often a notice the channel cannot deliver is
// tried again.
const undeliverableRetry = time.Minute

// handleOutcome shows a decision where the channel showed its request. The
// consumer delivers only stored messages, but a subject may hold more than
// one (a client without permissions publishing without the broker's
// expected sequence): only the one that decides, the first on its subject
// or with trusted keys the first that a trusted key signed, is shown.
func (c *Channel) handleOutcome(ctx context.Context, msg jetstream.Msg) {
	id := strings.TrimPrefix(msg.Subject(), events.DecisionPrefix)
	d, sc, err := c.client.readTraced(nats.Header(msg.Headers()), msg.Data())
	if err != nil {
		if c.client.trusted != nil {
			c.log.Warn("ignoring a decided event that no trusted key signed", zap.String("request_id", id), zap.Error(err))
		}
		_ = msg.Ack() // not a decision; the broker reports forgeries
		return
	}
	if d.RequestID != "" && d.RequestID != id {
		_ = msg.Ack()
		return
	}
	defer keepAlive(msg)()
	md, err := msg.Metadata()
	if err != nil {
		_ = msg.Ack() // not from a consumer: nothing to show
		return
	}
	switch _, _, first, found, err := c.client.firstStored(ctx, id); {
	case err != nil && !errors.Is(err, ErrTampered), err == nil && !found:
		// Unreadable now, or read from a stream replica that has not
		// stored the message yet: try again.
		if ctx.Err() == nil {
			c.log.Debug("read the first decision; will retry", zap.String("request_id", id), zap.Error(err))
		}
		retry(msg)
		return
	case first != md.Sequence.Stream:
		c.log.Warn("ignoring a decided event that is not the first on its subject", zap.String("request_id", id),
			zap.Uint64("seq", md.Sequence.Stream), zap.Uint64("first", first))
		_ = msg.Ack()
		return
	}
	ctx, span := c.tracer.Start(trace.ContextWithRemoteSpanContext(ctx, sc), SpanResolve, trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(attrRequestID.String(id), attrChannel.String(c.cfg.Channel), attrOutcome.String(string(d.Outcome))))
	err = c.resolve(ctx, id, d)
	endSpan(span, err)
	if err != nil {
		if ctx.Err() == nil {
			c.log.Warn("resolve failed; will retry", zap.String("request_id", id), zap.Error(err))
		}
		retry(msg)
		return
	}
	_ = msg.Ack()
}

// resolveNow resolves request id at once, logging a failure: the outcome
// consumer retries it.
func (c *Channel) resolveNow(ctx context.Context, id string, d Decision, log *zap.Logger) {
	if err := c.resolve(ctx, id, d); err != nil && ctx.Err() == nil {
		log.Warn("resolve", zap.Error(err))
	}
}

// resolve calls Resolve for a request the channel showed and has not
// resolved, and records that it did.
func (c *Channel) resolve(ctx context.Context, id string, d Decision) error {
	s, rev, found, err := c.load(ctx, id)
	if err != nil || !found || s.Resolved || s.Sending {
		// Not shown, shown resolved already, or still going out: the
		// notification's own check after sending resolves that one.
		return err
	}
	if err := c.n.Resolve(ctx, Outcome{RequestID: id, Decision: d, Notice: s.Notice.notice()}); err != nil {
		return err
	}
	s.Resolved = true
	if _, err := c.save(ctx, s, rev); err != nil && !errors.Is(err, jetstream.ErrKeyExists) && !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
		return err
	}
	return nil
}

// startNotify starts the span of showing notice n, in the trace of ctx.
func (c *Channel) startNotify(ctx context.Context, n Notice) (context.Context, trace.Span) {
	return c.tracer.Start(ctx, SpanNotify, trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(attrRequestID.String(n.ID), attrAgent.String(n.Agent), attrTool.String(n.Tool),
			attrChannel.String(c.cfg.Channel), attrLevel.Int(n.Level), attrReminder.Bool(n.Reminder)))
}

// storedTrace returns the traceparent and tracestate of the span in ctx, to
// store; empty when it has none.
func storedTrace(ctx context.Context) (traceparent, tracestate string) {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return "", ""
	}
	m := propagation.MapCarrier{}
	traceContext.Inject(ctx, m)
	return m[events.TraceParentAttribute], m[events.TraceStateAttribute]
}

// withStoredTrace returns ctx carrying the trace context that storedTrace
// returned; ctx as it is when that is empty or malformed.
func withStoredTrace(ctx context.Context, traceparent, tracestate string) context.Context {
	if traceparent == "" {
		return ctx
	}
	return traceContext.Extract(ctx, propagation.MapCarrier{events.TraceParentAttribute: traceparent, events.TraceStateAttribute: tracestate})
}
