package handler

import (
	"bytes"
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

// StreamName is the JetStream stream the broker keeps the contract's events in.
const StreamName = events.StreamName

// Errors Request returns; branch on them with errors.Is.
var (
	// ErrNoDecision: the wait ended without a decision (broker unreachable or
	// too slow). Treat it as "not approved".
	ErrNoDecision = errors.New("no decision")
	// ErrTampered: a decision failed verification (its args do not match its
	// digest, it names another request, or, with Config.TrustedKeys, no
	// trusted key signed it). Client.Decision returns it for a stored decision
	// that a trusted key signed, or without trusted keys for the first stored
	// one; Request logs and ignores such messages and goes on waiting for the
	// real one.
	ErrTampered = errors.New("decision failed verification")
	// ErrIDConflict: the request's id belongs to a different request (another
	// tool, other args, agent, session, user, call id, labels or response
	// schema). The broker keeps the first; this one is never decided. Request
	// returns it as soon as it learns so, and does not cancel anything.
	ErrIDConflict = errors.New("request id already used by a different request")
)

// Request is one approval request. On the agent side, ID is optional (a UUIDv7
// is made) and Deadline is ignored; on the approver side both are set.
type Request struct {
	ID string
	events.Requested
	Deadline time.Time
	// Keep leaves the request pending when the caller stops waiting (ctx
	// ends first): Request then returns ctx's error without publishing a
	// cancel. For an agent that resumes after a restart by asking again with
	// the same ID, which returns the decision made meanwhile, or waits for
	// it. Client.Cancel still withdraws such a request. Agent side only.
	Keep bool `json:"-"`
}

// Decision is the broker's verdict on a request: run only if Approved(), and then
// with Args.
type Decision = events.Decided

// Config configures a Client.
type Config struct {
	// Agent names the agent; requests are published on assent.request.<Agent>.
	// Required unless every Request sets its own Agent.
	Agent string
	// Source is the CloudEvents source; default "agent/<Agent>".
	Source string
	// DefaultTimeout is asked for when a Request sets none. Zero leaves it to
	// the broker's default (its --timeout). Either way the broker clamps it to
	// its policy, and Request waits for the deadline the broker actually set.
	DefaultTimeout time.Duration
	// Grace is how long past the request's timeout the client waits for the
	// broker's expiry decision before giving up with ErrNoDecision. Default 15s.
	Grace time.Duration
	// TrustedKeys are the public keys ("A...") of the broker's decision keys
	// (broker --decision-key; more than one while keys rotate). When set, a
	// decided event counts only if one of them signed it (docs/protocol.md,
	// "Signed decisions"): Request skips any other, logs it and keeps
	// waiting, and Decision reads the first stored one that verifies. Empty,
	// decisions are not checked for a signature and the first one stored
	// decides, so on a NATS server whose permissions let anyone publish on
	// assent.decision.<id>, whoever publishes there first decides.
	TrustedKeys []string
	// Private reads decisions through the agent's own subjects
	// (events.PrivatePrefix) and asks the broker for what it stored, instead
	// of reading the stream: for credentials that keep an agent from reading
	// other agents' decisions (broker creds agent NAME --private). It needs
	// Agent, and a connection whose inbox prefix is "_INBOX_<Agent>"
	// (nats.CustomInboxPrefix), the only inbox such credentials read.
	Private bool
	// TracerProvider makes the span of each Request (SpanRequest), whose
	// trace context the requested event carries to the broker; nil uses
	// OpenTelemetry's global provider (docs/tracing.md).
	TracerProvider trace.TracerProvider
	// Logger; nil logs nothing.
	Logger *zap.Logger
}

// PrivateInbox is the inbox prefix of agent's connection with Config.Private.
func PrivateInbox(agent string) string { return "_INBOX_" + agent }

// Client asks for approvals. It is safe for concurrent use.
type Client struct {
	cfg   Config
	nc    *nats.Conn
	js    jetstream.JetStream
	log   *zap.Logger
	codec events.Codec // reads what the broker publishes: anything the server carries
	// trusted checks decisions' signatures; nil without Config.TrustedKeys.
	trusted *events.TrustedKeys
	// tracer makes the span of each Request.
	tracer trace.Tracer

	mu     sync.Mutex
	stream jetstream.Stream // found on first use
}

// NewClient returns a client on nc. The connection stays the caller's.
func NewClient(nc *nats.Conn, cfg Config) (*Client, error) {
	if nc == nil {
		return nil, errors.New("handler: nil NATS connection")
	}
	if cfg.Agent != "" {
		if err := events.CheckToken("agent", cfg.Agent); err != nil {
			return nil, fmt.Errorf("handler: %w", err)
		}
	}
	if cfg.DefaultTimeout < 0 {
		return nil, errors.New("handler: negative DefaultTimeout")
	}
	if cfg.Private {
		if cfg.Agent == "" {
			return nil, errors.New("handler: Private needs Agent: the agent whose own subjects it reads")
		}
		if want := PrivateInbox(cfg.Agent); nc.Opts.InboxPrefix != want {
			return nil, fmt.Errorf("handler: Private needs a connection with inbox prefix %s: connect with nats.CustomInboxPrefix(%q)", want, want)
		}
	}
	var trusted *events.TrustedKeys
	if len(cfg.TrustedKeys) > 0 {
		var err error
		if trusted, err = events.NewTrustedKeys(cfg.TrustedKeys...); err != nil {
			return nil, fmt.Errorf("handler: %w", err)
		}
	}
	if cfg.Grace <= 0 {
		cfg.Grace = 15 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	return &Client{cfg: cfg, nc: nc, js: js, log: cfg.Logger.Named("assent"), codec: serverCodec(nc), trusted: trusted,
		tracer: newTracer(cfg.TracerProvider)}, nil
}

// Request publishes req and blocks until the broker decides it, then returns the
// decision, whatever its outcome; err is nil for approved, denied, expired and
// cancelled alike. Publishing the same req.ID again is the same request: a
// retry after a crash gets the original decision, even one made while no one
// was waiting. Every decision is checked against the request before it is
// returned: its request id, its args digest, its request digest over the
// whole request and, with Config.TrustedKeys, its signature.
//
// If req.ID is already used by a different request, ErrIDConflict is returned.
// If ctx ends first, Request publishes a cancel for the request (unless
// req.Keep is set) and returns ctx's error. If no decision arrives within the broker's deadline plus
// Config.Grace, ErrNoDecision is returned. In every error case the call must
// not run; the returned Decision then carries only the RequestID, so the caller
// can report or cancel the request it made.
//
// The call is a span (SpanRequest) in the trace of ctx, or the root of a new
// one; the requested event carries its trace context, so the broker's and
// the approvers' spans join that trace.
//
// Request takes a decision only from what the server tells once it stored
// it, never from the stored subject assent.decision.<id> itself, whose plain
// subscribers also see messages the stream refused: the server's copy on
// assent-decided.<id> when it is the first message of its subject
// (Nats-Last-Sequence 0; with Config.TrustedKeys, any that a trusted key
// signed), or the first stored decision, read with a direct get soon after
// publishing, every few seconds while waiting, and once more at the end,
// since that copy is a plain message a reconnect or a stream leader change
// can lose. The deadline it waits for is the broker's, asked on the agent's
// lookup subject (assent-private.<agent>.lookup.<id>); credentials that may
// not ask there wait as long as the request asked for.
func (c *Client) Request(ctx context.Context, req Request) (d Decision, err error) {
	if req.ID == "" {
		req.ID = events.NewID()
	}
	agent := req.Agent
	if agent == "" {
		agent = c.cfg.Agent
	}
	ctx, span := c.tracer.Start(ctx, SpanRequest, trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(attrRequestID.String(req.ID), attrAgent.String(agent), attrTool.String(req.Tool)))
	defer func() {
		if err == nil {
			span.SetAttributes(decisionAttrs(d)...)
		}
		endSpan(span, err)
	}()
	return c.request(ctx, req)
}

// request is Request within its span.
func (c *Client) request(ctx context.Context, req Request) (Decision, error) {
	if req.Agent == "" {
		req.Agent = c.cfg.Agent
	}
	if req.Timeout <= 0 {
		req.Timeout = events.Duration(c.cfg.DefaultTimeout)
	}
	// Until the broker's deadline is known, wait as long as asked, or as long
	// as the broker's default of 5 minutes.
	initialWait := req.Timeout.Std()
	if initialWait <= 0 {
		initialWait = 5 * time.Minute
	}
	if err := req.Validate(); err != nil {
		return Decision{}, err
	}
	if c.cfg.Private && req.Agent != c.cfg.Agent {
		return Decision{}, fmt.Errorf("handler: a Private client asks as agent %s only, not %s", c.cfg.Agent, req.Agent)
	}
	digest, argsDigest, err := events.RequestDigests(req.Requested)
	if err != nil {
		return Decision{}, err
	}
	want := &sent{digest: digest, args: req.Args, argsDigest: argsDigest}
	subj, err := events.RequestSubject(req.Agent)
	if err != nil {
		return Decision{}, err
	}
	// Decisions arrive as the server's copy of what it stored (the stream's
	// RePublish), or with Private as the broker's copy on the agent's own
	// subject.
	decSubj, err := events.DecidedSubject(req.ID)
	if err != nil {
		return Decision{}, err
	}
	rejSubj, err := events.RejectionSubject(req.ID)
	if err != nil {
		return Decision{}, err
	}
	if c.cfg.Private {
		if decSubj, err = events.PrivateSubject(req.Agent, "decided", req.ID); err != nil {
			return Decision{}, err
		}
		if rejSubj, err = events.PrivateSubject(req.Agent, "rejected", req.ID); err != nil {
			return Decision{}, err
		}
	}
	source := c.cfg.Source
	if source == "" {
		source = "agent/" + req.Agent
	}
	e, err := events.New(events.TypeRequested, req.ID, source, req.Requested)
	if err != nil {
		return Decision{}, err
	}
	setEventTrace(ctx, &e)
	h, body, err := events.Encode(&e)
	if err != nil {
		return Decision{}, err
	}
	noDecision := Decision{RequestID: req.ID}

	// Subscribe before publishing so no decision or rejection can slip
	// between the two.
	answers := make(chan *nats.Msg, 4)
	for _, s := range []string{decSubj, rejSubj} {
		sub, err := c.nc.ChanSubscribe(s, answers)
		if err != nil {
			return noDecision, fmt.Errorf("subscribe %s: %w", s, err)
		}
		defer sub.Unsubscribe() //nolint:errcheck // best effort
	}

	// The request's logger, made when there is something to log.
	log := func() *zap.Logger { return c.log.With(zap.String("request_id", req.ID), zap.String("tool", req.Tool)) }
	// withdraw cancels the request when the caller stops waiting, unless
	// the caller keeps it.
	withdraw := func() error {
		if req.Keep {
			return ctx.Err()
		}
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), withdrawTimeout)
		defer cancel()
		if err := c.cancel(cctx, req.Agent, source, req.ID, "requester stopped waiting: "+context.Cause(ctx).Error()); err != nil {
			log().Warn("publish cancel", zap.Error(err))
		}
		return ctx.Err()
	}
	ack, err := c.publish(ctx, &nats.Msg{Subject: subj, Header: nats.Header(h), Data: body}, req.ID, time.Now().Add(initialWait+c.cfg.Grace))
	if err != nil {
		if ctx.Err() != nil {
			// The request may be stored though its acknowledgement never
			// came: withdraw it. A cancel for an id the broker never
			// stores is dropped.
			return noDecision, withdraw()
		}
		return noDecision, fmt.Errorf("publish request: %w", err)
	}
	// look reads the stored decision of this id and, with state, the
	// deadline the broker set; a stored request or rejection with another
	// digest is a conflict.
	look := func(ctx context.Context, state bool) (Decision, bool, time.Time, error) {
		d, ok, st, err := c.look(ctx, req.Agent, req.ID, want, state, log)
		if err != nil || ok {
			return d, ok, time.Time{}, err
		}
		return noDecision, false, st.Deadline, nil
	}
	if ack.Duplicate {
		// A retry, or the id is taken: the decision may already be stored.
		if d, ok, _, err := look(ctx, true); err != nil || ok {
			return d, err
		}
	}

	waitUntil := time.Now().Add(initialWait + c.cfg.Grace)
	wait := time.NewTimer(time.Until(waitUntil))
	defer wait.Stop()
	// newDeadline waits for the broker's deadline, once known, plus
	// Config.Grace.
	newDeadline := func(deadline time.Time) {
		if !deadline.IsZero() {
			waitUntil = deadline.Add(c.cfg.Grace)
			wait.Reset(time.Until(waitUntil))
		}
	}
	// Read the stored decision now and then (lookEvery): the server's copy
	// of it is a plain message, lost in a reconnect or around a stream
	// leader change, and a retry of a request decided longer ago than
	// JetStream's duplicate window gets none. The broker's deadline is
	// asked with the first look and every stateEvery (an escalation moves
	// it).
	recheck := time.NewTimer(firstLook)
	defer recheck.Stop()
	var asked time.Time
	for {
		select {
		case <-recheck.C:
			state := time.Since(asked) >= stateEvery
			d, ok, deadline, err := look(ctx, state)
			if err != nil || ok {
				return d, err
			}
			if state {
				asked = time.Now()
				newDeadline(deadline)
			}
			recheck.Reset(lookEvery)
		case m := <-answers:
			if m.Subject == rejSubj {
				if err := c.rejection(m, req.ID, digest); err != nil {
					return noDecision, err
				}
				continue
			}
			if !c.cfg.Private && !c.first(m.Header) {
				// Stored after another message of its subject: not the
				// decision, which the stream holds. Read it now.
				log().Warn("ignoring a decided event that is not the first on its subject",
					zap.String("sequence", m.Header.Get(events.SequenceHeader)), zap.String("after", m.Header.Get(events.LastSequenceHeader)))
				recheck.Reset(0)
				continue
			}
			d, sc, err := c.verify(m.Header, m.Data, req.ID, want)
			if errors.Is(err, ErrIDConflict) {
				return noDecision, err
			}
			if err != nil {
				log().Warn("ignoring a decision that failed verification", zap.Error(err))
				continue
			}
			linkDecider(ctx, sc)
			return d, nil
		case <-wait.C:
			// Last look, in case the decision's copy was lost, and the
			// deadline once more, in case an escalation moved it.
			d, ok, deadline, err := look(context.WithoutCancel(ctx), true)
			if err != nil || ok {
				return d, err
			}
			if deadline.Add(c.cfg.Grace).After(time.Now()) {
				newDeadline(deadline)
				continue
			}
			return noDecision, fmt.Errorf("%w for %s by %s", ErrNoDecision, req.ID, waitUntil.Format(time.RFC3339))
		case <-ctx.Done():
			return noDecision, withdraw()
		}
	}
}

// How often Request reads what is stored of its request while it waits:
// the decision firstLook after publishing and every lookEvery after, the
// broker's deadline with the first look and every stateEvery after. The
// server's copy of a decision (assent-decided.<id>) usually comes first; a
// look finds one whose copy was lost (about one in a thousand under
// constant stream leader changes: docs/stream-decides.md, section 1) within
// seconds rather than at the deadline.
const (
	firstLook  = time.Second
	lookEvery  = 2 * time.Second
	stateEvery = 30 * time.Second
)

// opTimeout bounds the wait for the answer to one publish or read: JetStream
// answers nothing to a request it cannot serve at that moment (its stream's
// leader being elected, the connection lost with the answer in flight).
const opTimeout = 5 * time.Second

// withdrawTimeout bounds how long Request keeps trying to publish the cancel
// of a request its caller stopped waiting for (a stream leader being elected
// answers nothing for a few seconds).
const withdrawTimeout = 15 * time.Second

// publish publishes msg (a request or a cancel) with id as Nats-Msg-Id until the
// stream acknowledges it, ctx ends, or until passes. Each attempt waits
// opTimeout at most, and the next one sends the same message again: the
// stream stores it once.
func (c *Client) publish(ctx context.Context, msg *nats.Msg, id string, until time.Time) (*jetstream.PubAck, error) {
	for {
		pctx, cancel := context.WithTimeout(ctx, opTimeout)
		ack, err := c.js.PublishMsg(pctx, msg, jetstream.WithMsgID(id))
		cancel()
		var apiErr *jetstream.APIError
		retry := errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) ||
			errors.Is(err, nats.ErrNoResponders) || errors.Is(err, jetstream.ErrNoStreamResponse) ||
			errors.As(err, &apiErr) && apiErr.Code == 503
		if err == nil || !retry || ctx.Err() != nil || time.Now().After(until) {
			return ack, err
		}
		c.log.Debug("publish again", zap.String("msg_id", id), zap.Error(err))
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// rejection reads a rejected event for request id; it returns ErrIDConflict
// if the rejection is about this request (digest), nil for one about another
// message under the same id.
func (c *Client) rejection(m *nats.Msg, id, digest string) error {
	e, err := c.codec.Decode(events.Header(m.Header), m.Data)
	if err != nil {
		return nil
	}
	r, err := events.DecodeRejected(&e)
	if err != nil || r.RequestID != id || r.RequestDigest != digest {
		return nil
	}
	if r.Code == events.RejectIDConflict {
		return fmt.Errorf("%w: %s", ErrIDConflict, r.Reason)
	}
	return fmt.Errorf("request %s rejected (%s): %s", id, r.Code, r.Reason)
}

// Decision reads the stored decision for request id, if there is one: the
// first decided event on its subject (the broker publishes one only where none
// exists, so anything after it is not the decision). With Config.TrustedKeys
// it is the first one that a trusted key signed: the others before it are
// logged and skipped, and ok is false if none is signed.
func (c *Client) Decision(ctx context.Context, id string) (Decision, bool, error) {
	return c.decision(ctx, id, nil)
}

// decision is Decision that also checks the decision is about the request
// want, when want is set; the span of ctx, Request's, then links to the
// broker's span that decided.
func (c *Client) decision(ctx context.Context, id string, want *sent) (Decision, bool, error) {
	if c.cfg.Private {
		return c.privateDecision(ctx, id, want)
	}
	d, sc, _, ok, err := c.firstStored(ctx, id)
	if err != nil || !ok {
		return Decision{}, false, err
	}
	if err := check(d, id, want); err != nil {
		return Decision{}, false, err
	}
	if want != nil {
		linkDecider(ctx, sc)
	}
	return d, true, nil
}

// firstStored reads the decided event that decides request id: the first
// message stored on assent.decision.<id> (a get of the first by subject, not
// the last: a message stored after the decision is not the decision) or,
// with trusted keys, the first there that a trusted key signed. It returns
// that message's stream sequence too; ok is false when the stream holds no
// decision of id (yet: a stream replica behind its leader may answer so for
// a moment). Without trusted keys, a first message that is not a decided
// event is an error wrapping ErrTampered, with its sequence.
func (c *Client) firstStored(ctx context.Context, id string) (d Decision, sc trace.SpanContext, seq uint64, ok bool, err error) {
	subj, err := events.DecisionSubject(id)
	if err != nil {
		return Decision{}, sc, 0, false, err
	}
	stream, err := c.getStream(ctx)
	if err != nil {
		return Decision{}, sc, 0, false, err
	}
	m, err := firstAccepted(ctx, stream, subj, func(m *jetstream.RawStreamMsg) (bool, error) {
		var err error
		d, sc, err = c.readTraced(m.Header, m.Data)
		if err != nil && c.trusted != nil {
			c.log.Warn("skipping a stored decided event that no trusted key signed",
				zap.String("request_id", id), zap.Uint64("seq", m.Sequence), zap.Error(err))
			return true, nil
		}
		return false, err
	})
	switch {
	case m == nil:
		return Decision{}, sc, 0, false, err
	case err != nil:
		return Decision{}, sc, m.Sequence, false, err
	}
	return d, sc, m.Sequence, true, nil
}

// firstAccepted returns the first message stored on subj that accept does
// not skip, with the error accept returns for it; nil when the stream holds
// none (yet).
func firstAccepted(ctx context.Context, stream jetstream.Stream, subj string, accept func(*jetstream.RawStreamMsg) (skip bool, err error)) (*jetstream.RawStreamMsg, error) {
	for next := uint64(1); ; {
		m, err := stream.GetMsg(ctx, next, jetstream.WithGetMsgSubject(subj))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return nil, nil
		}
		if err != nil {
			return nil, err
		}
		skip, err := accept(m)
		if !skip {
			return m, err
		}
		next = m.Sequence + 1
	}
}

// FirstDecision returns the stream sequence of the message that decides
// request id, by the rule every reader of decisions follows: the first
// message stored on assent.decision.<id>, or, with trusted keys, the first
// there that one of them signed. found is false while the stream (or the
// replica of it that answered) holds none. A reader of the stream's
// decision subjects (a consumer) acts on a message only if its sequence is
// this one: a later message on the subject was stored by a client that
// published without the broker's expected sequence, and is not a decision.
func FirstDecision(ctx context.Context, stream jetstream.Stream, id string, trusted *events.TrustedKeys) (seq uint64, found bool, err error) {
	subj, err := events.DecisionSubject(id)
	if err != nil {
		return 0, false, err
	}
	m, err := firstAccepted(ctx, stream, subj, func(m *jetstream.RawStreamMsg) (bool, error) {
		if trusted == nil {
			return false, nil
		}
		e, err := events.Codec{MaxSize: 1 << 30}.Decode(events.Header(m.Header), m.Data) // stored: its size was checked
		if err == nil {
			_, err = trusted.Verify(&e)
		}
		return err != nil, nil
	})
	if m == nil || err != nil {
		return 0, false, err
	}
	return m.Sequence, true, nil
}

// first reports whether h, the headers of the server's copy of a stored
// decided event (assent-decided.<id>), show it may be the decision: the
// first message stored on its subject (Nats-Last-Sequence 0) or, with
// trusted keys, any, since a broker that signs publishes its decision after
// a forgery it finds there (verify then checks the signature). A message
// stored later was not refused only because it was published without the
// broker's expected sequence: a client without permissions, not the broker.
func (c *Client) first(h nats.Header) bool {
	return c.trusted != nil || h.Get(events.LastSequenceHeader) == "0"
}

// stored is what the broker tells of a request besides its decision: the
// deadline it set and the digest of the request it stored under the id;
// zero while it has not stored the request.
type stored struct {
	Deadline      time.Time
	RequestDigest string
}

// look reads what is stored of request id, which agent asked and Request
// published as want: its decision (as Decision reads it) and, with state,
// the deadline the broker set, from the broker's lookup. A decision, a
// stored request or a stored rejection that shows the id belongs to another
// request is ErrIDConflict, and a rejection of want ends the wait too.
// Reads that fail are logged at debug level and leave their part zero: the
// next look tries again.
func (c *Client) look(ctx context.Context, agent, id string, want *sent, state bool, log func() *zap.Logger) (Decision, bool, stored, error) {
	conflict := func(st stored) error {
		if st.RequestDigest == "" || st.RequestDigest == want.digest {
			return nil
		}
		return fmt.Errorf("%w: %s is stored with request digest %s, this request is %s", ErrIDConflict, id, st.RequestDigest, want.digest)
	}
	if c.cfg.Private {
		// One lookup tells both.
		lctx, cancel := context.WithTimeout(ctx, opTimeout)
		defer cancel()
		m, err := c.lookup(lctx, agent, id)
		if err != nil {
			log().Debug("look up the request", zap.Error(err))
			return Decision{}, false, stored{}, nil
		}
		st := storedOf(m)
		if err := conflict(st); err != nil {
			return Decision{}, false, stored{}, err
		}
		d, ok, err := c.lookedUpDecision(lctx, m, id, want)
		if err != nil && !errors.Is(err, ErrIDConflict) {
			log().Debug("read the looked up decision", zap.Error(err))
			return Decision{}, false, st, nil
		}
		return d, ok, st, err
	}
	dctx, cancel := context.WithTimeout(ctx, opTimeout)
	d, ok, err := c.decision(dctx, id, want)
	cancel()
	switch {
	case errors.Is(err, ErrIDConflict):
		return Decision{}, false, stored{}, err
	case err != nil:
		log().Debug("read the stored decision", zap.Error(err))
	case ok:
		return d, true, stored{}, nil
	}
	if !state {
		return Decision{}, false, stored{}, nil
	}
	var st stored
	lctx, cancel := context.WithTimeout(ctx, opTimeout)
	m, err := c.lookup(lctx, agent, id)
	cancel()
	if err != nil {
		log().Debug("look up the request", zap.Error(err))
	} else if st = storedOf(m); conflict(st) != nil {
		return Decision{}, false, stored{}, conflict(st)
	}
	rctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	if err := c.storedRejection(rctx, id, want.digest, log); err != nil {
		return Decision{}, false, stored{}, err
	}
	return Decision{}, false, st, nil
}

// maxRejections bounds how many stored rejections of one id a look reads:
// one per request message the broker refused under that id.
const maxRejections = 16

// storedRejection reads the rejections stored for id, for one of the
// request with digest (what rejection returns for it); nil if there is
// none, or if they cannot be read now (logged).
func (c *Client) storedRejection(ctx context.Context, id, digest string, log func() *zap.Logger) error {
	subj, err := events.RejectionSubject(id)
	if err != nil {
		return err
	}
	stream, err := c.getStream(ctx)
	if err != nil {
		log().Debug("read stored rejections", zap.Error(err))
		return nil
	}
	for next, n := uint64(1), 0; n < maxRejections; n++ {
		m, err := stream.GetMsg(ctx, next, jetstream.WithGetMsgSubject(subj))
		if err != nil {
			if !errors.Is(err, jetstream.ErrMsgNotFound) {
				log().Debug("read stored rejections", zap.Error(err))
			}
			return nil
		}
		if err := c.rejection(&nats.Msg{Header: m.Header, Data: m.Data}, id, digest); err != nil {
			return err
		}
		next = m.Sequence + 1
	}
	return nil
}

func (c *Client) getStream(ctx context.Context) (jetstream.Stream, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stream == nil {
		s, err := c.js.Stream(ctx, StreamName)
		if err != nil {
			return nil, fmt.Errorf("stream %s: %w", StreamName, err)
		}
		c.stream = s
	}
	return c.stream, nil
}

// Cancel asks the broker to end request id as cancelled. With Config.Agent
// set it is published on assent.cancel.<agent>.<id>, which cancels only that
// agent's request (and which NATS permissions can confine an agent to).
// The cancel carries the trace context of ctx, if any.
func (c *Client) Cancel(ctx context.Context, id, reason string) error {
	source := c.cfg.Source
	if source == "" && c.cfg.Agent != "" {
		source = "agent/" + c.cfg.Agent
	}
	if source == "" {
		source = "agent/unknown"
	}
	return c.cancel(ctx, c.cfg.Agent, source, id, reason)
}

// cancel publishes the cancel of request id, as agent's when agent is set.
func (c *Client) cancel(ctx context.Context, agent, source, id, reason string) error {
	subj, err := events.CancelSubject(id)
	if agent != "" {
		subj, err = events.AgentCancelSubject(agent, id)
	}
	if err != nil {
		return err
	}
	e, err := events.New(events.TypeCancel, "", source, events.Cancel{Reason: reason})
	if err != nil {
		return err
	}
	setEventTrace(ctx, &e)
	h, body, err := events.Encode(&e)
	if err != nil {
		return err
	}
	// Published under its event id, so a retry after a lost acknowledgement
	// stores it once; retries stop when ctx ends too.
	_, err = c.publish(ctx, &nats.Msg{Subject: subj, Header: nats.Header(h), Data: body}, e.ID(), time.Now().Add(withdrawTimeout))
	return err
}

// verify reads a decided event (readTraced) and checks it decides request
// id (check). It returns the trace context the event carries too.
func (c *Client) verify(h nats.Header, body []byte, id string, want *sent) (Decision, trace.SpanContext, error) {
	d, sc, err := c.readTraced(h, body)
	if err != nil {
		return Decision{}, sc, err
	}
	if err := check(d, id, want); err != nil {
		return Decision{}, sc, err
	}
	return d, sc, nil
}

// read decodes a decided event and, with trusted keys, checks that one of
// them signed it. An error wraps ErrTampered: with trusted keys, the event is
// not the broker's.
func (c *Client) read(h nats.Header, body []byte) (Decision, error) {
	d, _, err := c.readTraced(h, body)
	return d, err
}

// readTraced is read that also returns the trace context the event carries:
// that of the broker's span that decided.
func (c *Client) readTraced(h nats.Header, body []byte) (Decision, trace.SpanContext, error) {
	e, err := c.codec.Decode(events.Header(h), body)
	if err != nil {
		return Decision{}, trace.SpanContext{}, fmt.Errorf("%w: %w", ErrTampered, err)
	}
	sc := eventTrace(&e)
	var d Decision
	if c.trusted != nil {
		d, err = c.trusted.Verify(&e)
	} else {
		d, err = events.DecodeDecided(&e)
	}
	if err != nil {
		return Decision{}, sc, fmt.Errorf("%w: %w", ErrTampered, err)
	}
	return d, sc, nil
}

// authentic reports whether a decided event is one the client accepts as
// the broker's: any message at all without trusted keys (first says whether
// it is the first stored), else a decided event that a trusted key signed.
func (c *Client) authentic(h nats.Header, body []byte) bool {
	if c.trusted == nil {
		return true
	}
	_, err := c.read(h, body)
	return err == nil
}

// sent is the request a decision must decide, as Request published it.
type sent struct {
	digest     string          // events.RequestDigest of the request
	args       json.RawMessage // its args
	argsDigest string          // events.ArgsDigest of args
}

// check checks that d belongs to id, that its args match their digest and,
// when want is set, that it decides that request (ErrIDConflict if it
// decides another one).
func check(d Decision, id string, want *sent) error {
	if d.RequestID != id {
		return fmt.Errorf("%w: decision names request %s, want %s", ErrTampered, d.RequestID, id)
	}
	var err error
	if want != nil && len(want.args) > 0 && bytes.Equal(d.Args, want.args) {
		// The args asked with, byte for byte: their digest is known.
		err = d.VerifyArgsDigest(want.argsDigest)
	} else {
		err = d.VerifyArgs()
	}
	if err != nil {
		return fmt.Errorf("%w: %w", ErrTampered, err)
	}
	if want == nil {
		return nil
	}
	if err := d.VerifyRequestDigest(want.digest); err != nil {
		if errors.Is(err, events.ErrRequestMismatch) {
			return fmt.Errorf("%w: %s: %w", ErrIDConflict, id, err)
		}
		return fmt.Errorf("%w: %w", ErrTampered, err)
	}
	return nil
}

// serverCodec decodes events up to the largest message the NATS server
// carries: the broker publishes events somewhat larger than the ones it takes
// in (a decision adds to its request's args), and the server has bounded them
// already.
func serverCodec(nc *nats.Conn) events.Codec {
	return events.Codec{MaxSize: max(int(nc.MaxPayload()), events.DefaultMaxEventSize)}
}

// lookup asks the broker what it stored of agent's request id, on the
// agent's own subject (assent-private.<agent>.lookup.<id>), which agent
// credentials, private or not, may ask for their own agent alone.
func (c *Client) lookup(ctx context.Context, agent, id string) (*nats.Msg, error) {
	subj, err := events.PrivateSubject(agent, "lookup", id)
	if err != nil {
		return nil, err
	}
	m, err := c.nc.RequestWithContext(ctx, subj, nil)
	if err != nil {
		return nil, fmt.Errorf("look up %s: %w", id, err)
	}
	switch st := m.Header.Get(events.LookupStatus); st {
	case events.LookupDecided, events.LookupPending, events.LookupUnknown:
		return m, nil
	default:
		return nil, fmt.Errorf("look up %s: the broker answered %q", id, st)
	}
}

// storedOf reads a lookup's deadline and request digest.
func storedOf(m *nats.Msg) stored {
	var st stored
	st.Deadline, _ = time.Parse(time.RFC3339Nano, m.Header.Get(events.LookupDeadline))
	st.RequestDigest = m.Header.Get(events.LookupRequestDigest)
	return st
}

// privateDecision is decision through a lookup (Config.Private).
func (c *Client) privateDecision(ctx context.Context, id string, want *sent) (Decision, bool, error) {
	m, err := c.lookup(ctx, c.cfg.Agent, id)
	if err != nil {
		return Decision{}, false, err
	}
	return c.lookedUpDecision(ctx, m, id, want)
}

// lookedUpDecision reads the decided event in m, a lookup's answer, if it
// holds one.
func (c *Client) lookedUpDecision(ctx context.Context, m *nats.Msg, id string, want *sent) (Decision, bool, error) {
	if m.Header.Get(events.LookupStatus) != events.LookupDecided {
		return Decision{}, false, nil
	}
	h := nats.Header{}
	for k, v := range m.Header {
		if k != events.LookupStatus && k != events.LookupDeadline && k != events.LookupRequestDigest {
			h[k] = v
		}
	}
	d, sc, err := c.readTraced(h, m.Data)
	if err != nil && c.trusted != nil {
		c.log.Warn("the broker's answer holds a decided event no trusted key signed", zap.String("request_id", id), zap.Error(err))
		return Decision{}, false, nil
	}
	if err == nil {
		err = check(d, id, want)
	}
	if err != nil {
		return Decision{}, false, err
	}
	if want != nil {
		linkDecider(ctx, sc)
	}
	return d, true, nil
}

// Pending lists the pending requests of this client's agent (Config.Agent),
// of session if it is not "", oldest first, as the broker holds them: what
// the agent is waiting for, without their args. It asks the broker on the
// agent's own subject (events.AgentSubject), which agent credentials, private
// ones too, may use for their own agent alone, so it reads no other agent's
// requests.
func (c *Client) Pending(ctx context.Context, session string) ([]events.AgentPending, error) {
	out := []events.AgentPending{}
	q := events.AgentQuery{Session: session}
	for {
		r, err := c.askAgent(ctx, events.AgentList, q)
		if err != nil {
			return out, err
		}
		out = append(out, r.Pending...)
		if !r.More || len(r.Pending) == 0 {
			return out, nil
		}
		q.After = r.Pending[len(r.Pending)-1].ID
	}
}

// CancelAll cancels every pending request of this client's agent
// (Config.Agent), of session if it is not "", and returns the ids it
// cancelled. The broker records each cancel as the agent's (agent/<agent>),
// with reason. A request decided meanwhile is left as it is. If the broker
// could not cancel them all, the ids it did cancel are returned with the
// error.
func (c *Client) CancelAll(ctx context.Context, session, reason string) ([]string, error) {
	r, err := c.askAgent(ctx, events.AgentCancel, events.AgentQuery{Session: session, Reason: reason})
	return r.Cancelled, err
}

// askAgent asks the broker about this client's agent's own requests.
func (c *Client) askAgent(ctx context.Context, kind string, q events.AgentQuery) (events.AgentReply, error) {
	var r events.AgentReply
	if c.cfg.Agent == "" {
		return r, errors.New("handler: listing or cancelling an agent's requests needs Config.Agent")
	}
	subj, err := events.AgentSubject(c.cfg.Agent, kind)
	if err != nil {
		return r, err
	}
	body, err := json.Marshal(q)
	if err != nil {
		return r, err
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, withdrawTimeout)
		defer cancel()
	}
	m, err := c.nc.RequestWithContext(ctx, subj, body)
	if err != nil {
		return r, fmt.Errorf("handler: ask the broker (%s): %w", subj, err)
	}
	if err := json.Unmarshal(m.Data, &r); err != nil {
		return r, fmt.Errorf("handler: the broker's answer on %s: %w", subj, err)
	}
	if r.Error != "" {
		return r, fmt.Errorf("handler: the broker on %s: %s", subj, r.Error)
	}
	return r, nil
}
