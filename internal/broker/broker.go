package broker

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"

	"github.com/assent-dev/assent/internal/insights"
	"github.com/assent-dev/assent/pkg/events"
	"github.com/assent-dev/assent/pkg/policy"
)

// Broker runs the approval state machine. Any number of replicas may run against
// the same NATS system; they share the work and agree through JetStream.
type Broker struct {
	cfg    Config
	nc     *nats.Conn
	js     jetstream.JetStream
	log    *zap.Logger
	codec  events.Codec
	source string
	now    func() time.Time
	// signer signs decided events, and trusted names the keys whose
	// signatures are a broker's; both nil when the broker does not sign.
	signer  *events.Signer
	trusted *events.TrustedKeys

	res    *resources
	pol    atomic.Pointer[policy.Policy]
	custom atomic.Bool // a policy file is in force, not the built-in policy
	shadow atomic.Pointer[policy.Policy]
	grants *grants
	// grantsCheck asks whether grants is current (grantsNewer), once for
	// every request judged meanwhile.
	grantsCheck *coalescer[bool]
	presence    *presence
	timers      *timers
	ticks       *ticks // durable ticks scheduled
	metrics     metrics
	records     *hub   // KV updates by request id, for callers waiting on a record
	index       *index // pending and recent decided requests, for listings
	ledger      *ledger
	feed        *feed // new events for subscribers
	// insights folds the stream into what the record says of approvals
	// (insights.go).
	insights *insights.Aggregator
	// tracer makes the broker's spans (trace.go).
	tracer trace.Tracer

	stateReady chan struct{} // closed once the ledger has read the whole stream

	// maxEmit bounds an event the broker publishes (body and headers): the
	// stream's message limit. maxValue bounds a state entry: the server's
	// max_payload, less room for the message's framing.
	maxEmit, maxValue int

	// handOverOutage coalesces the warnings of hand-overs of due requests
	// failing through an outage.
	handOverOutage *outage

	// pubs carries the broker's publishes (publishers.go): its own
	// connection, and while Run runs, extra ones.
	pubs atomic.Pointer[publishers]
	// expiries hands the requests of expiry batches to the expiry workers
	// (startExpiries).
	expiries chan expiryJob

	ready   atomic.Bool
	running atomic.Bool

	// afterCommit, if set (by tests), runs right after an outcome is stored
	// and before its decided event is published; afterPublish right after
	// an outcome decided at ingest is published, before its request message
	// is acknowledged.
	afterCommit, afterPublish func(id string)
	// afterPending, if set, runs right after a request's pending event is
	// stored, before its request message is acknowledged.
	afterPending func(id string)
	// beforeGrant, if set, runs before a decision's remembered choice is
	// stored, by whichever handling stores it.
	beforeGrant func(id string)
}

// New returns a broker that uses nc. A nil logger logs nothing. Call Run to start it.
func New(nc *nats.Conn, cfg Config, log *zap.Logger) (*Broker, error) {
	if nc == nil {
		return nil, errors.New("broker: nil NATS connection")
	}
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("broker config: %w", err)
	}
	if log == nil {
		log = zap.NewNop()
	}
	// The broker publishes events up to the incoming limit plus room for what
	// it adds (a decision's reason, who decided, digests); both must fit the
	// server's max_payload.
	maxPayload := int(nc.MaxPayload())
	if maxPayload > 0 && NeededMaxPayload(cfg.MaxEventSize) > maxPayload {
		limit := maxPayload - eventHeadroom
		if limit < minEventSize {
			return nil, fmt.Errorf("broker: the NATS server's max_payload is %d bytes; the broker needs at least %d (raise max_payload in the server's configuration)", maxPayload, minEventSize+eventHeadroom)
		}
		log.Warn("event size limit lowered to fit the NATS server's max_payload; raise max_payload to accept larger events",
			zap.Int("max_payload", maxPayload), zap.Int("max_event_size", limit), zap.Int("wanted", cfg.MaxEventSize))
		cfg.MaxEventSize = limit
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	b := &Broker{
		cfg:     cfg,
		nc:      nc,
		js:      js,
		log:     log.Named("broker").With(zap.String("replica", cfg.Name)),
		codec:   events.Codec{MaxSize: cfg.MaxEventSize},
		source:  "broker/" + cfg.Name,
		now:     time.Now,
		timers:  newTimers(),
		ticks:   newTicks(),
		records: newHub(),
		index:   newIndex(cfg.KeepDecided),
		feed:    newFeed(),
		tracer:  newTracer(cfg.TracerProvider),

		stateReady: make(chan struct{}),
		expiries:   make(chan expiryJob),
		grants:     newGrants(),
		presence:   &presence{everyone: !cfg.AnnouncedOnly, live: make(map[string]events.Announcement), ready: make(chan struct{})},
		maxEmit:    cfg.MaxEventSize + eventHeadroom,
		maxValue:   maxPayload - 512,

		handOverOutage: newOutage(outageEvery),
	}
	b.ledger = newLedger(b)
	b.pubs.Store(newPublishers(nc, js, 0, log))
	if maxPayload <= 0 {
		b.maxValue = 2*cfg.MaxEventSize + eventHeadroom
	}
	if cfg.DecisionKey != nil {
		// Validate checked both.
		b.signer, _ = events.NewSigner(cfg.DecisionKey)
		b.trusted, _ = events.NewTrustedKeys(append([]string{b.signer.PublicKey()}, cfg.TrustedDecisionKeys...)...)
		b.log.Info("signing decisions", zap.String("decision_key", b.signer.PublicKey()), zap.Strings("trusted_keys", b.trusted.Keys()))
	}
	if b.insights, err = newInsights(cfg, b.trusted); err != nil {
		return nil, fmt.Errorf("broker: %w", err)
	}
	builtin, err := builtinPolicy(cfg)
	if err != nil {
		return nil, fmt.Errorf("broker: built-in policy: %w", err)
	}
	b.pol.Store(builtin)
	if cfg.Policy != nil {
		b.pol.Store(cfg.Policy)
		b.custom.Store(true)
	}
	b.shadow.Store(cfg.Shadow)
	b.grantsCheck = newCoalescer(b.grantsNewer)
	if cfg.feedIdle > 0 {
		b.feed.idle = cfg.feedIdle
	}
	return b, nil
}

// Config returns the effective configuration, defaults applied.
func (b *Broker) Config() Config { return b.cfg }

// Ready reports whether the broker has provisioned its resources, recovered its
// timers, is consuming, and has a NATS connection.
func (b *Broker) Ready() bool { return b.ready.Load() && b.nc.IsConnected() }

// Stats returns counters of this replica's work.
func (b *Broker) Stats() Stats {
	s := b.metrics.snapshot()
	s.Timers = int64(b.timers.len())
	return s
}

// Run provisions JetStream resources, recovers pending requests, and handles
// requests, answers, cancels and timeouts until ctx ends. It then stops taking
// work, finishes what is in flight, and returns. Run may be called only once.
func (b *Broker) Run(ctx context.Context) error {
	if !b.running.CompareAndSwap(false, true) {
		return errors.New("broker: Run called twice")
	}
	go b.timers.run()
	defer b.timers.close()
	// The extra connections live while Run does; before and after, the
	// broker publishes on its own (the publishers New made).
	pubs := newPublishers(b.nc, b.js, publishConns, b.log)
	own := b.pubs.Swap(pubs)
	defer func() {
		b.pubs.Store(own)
		pubs.close()
	}()
	res, err := b.provision(ctx)
	if err != nil {
		return fmt.Errorf("broker: provision: %w", err)
	}
	b.res = res
	if res.legacy {
		b.log.Warn("the ASSENT stream was made by an earlier broker and takes message schedules and per-message TTLs from every client that may publish into it (the server cannot turn them off): an agent could have the server store a decision, which readers take unless it must be signed; run brokers with --decision-key and readers with its public key (docs/security.md#streams-made-by-earlier-brokers)")
	}

	g, gctx := errgroup.WithContext(ctx)
	if err := b.migrate(ctx); err != nil {
		return fmt.Errorf("broker: %w", err)
	}
	g.Go(func() error {
		return b.ledger.run(gctx, func(pending int) {
			b.log.Info("read the stream", zap.Int("pending", pending), zap.Uint64("sequence", b.ledger.applied.Load()), zap.Int("indexed", b.index.size()))
			close(b.stateReady)
		})
	})
	g.Go(func() error { return b.followInsights(gctx) })
	g.Go(func() error { return b.watchGrants(gctx) })
	g.Go(func() error { return b.watchPresence(gctx) })
	g.Go(func() error { return b.serveLookups(gctx) })
	g.Go(func() error { return b.serveRequestLookups(gctx) })
	// Pending requests (and their timers), remembered choices and live
	// approvers must be known before requests are judged.
	for _, ready := range []chan struct{}{b.stateReady, b.grants.ready, b.presence.ready} {
		select {
		case <-ready:
		case <-gctx.Done():
		}
	}
	g.Go(func() error { return b.consume(gctx, res.requests, "requests", b.cfg.AckWait, b.handleRequest) })
	g.Go(func() error { return b.consume(gctx, res.responses, "responses", b.cfg.AckWait, b.handleResponse) })
	g.Go(func() error { return b.consume(gctx, res.cancels, "cancels", b.cfg.AckWait, b.handleCancel) })
	g.Go(func() error {
		return b.consume(gctx, res.timeouts, "timeouts", b.cfg.timeoutAckWait(), b.handleTimeout)
	})
	g.Go(func() error {
		// The expiry workers outlive the ticks consumer's drain.
		stop := b.startExpiries()
		defer stop()
		return b.consume(gctx, res.ticks, "ticks", b.cfg.timeoutAckWait(), b.handleTick)
	})
	g.Go(func() error {
		return b.consume(gctx, res.timerTick, "timer ticks", b.cfg.timeoutAckWait(), b.handleTick)
	})
	g.Go(func() error { return b.expiryLoop(gctx) })
	g.Go(func() error { return b.runFeed(gctx) })
	g.Go(func() error { return b.checkpoints(gctx) })
	b.ready.Store(true)
	b.log.Info("broker running", zap.String("policy", b.Policy().File), zap.String("mode", string(b.Policy().Mode)), zap.Duration("default_timeout", b.cfg.DefaultTimeout))
	err = g.Wait()
	b.ready.Store(false)
	if ctx.Err() != nil && errors.Is(err, context.Canceled) {
		err = nil
	}
	b.log.Info("broker stopped")
	return err
}

// provision creates or updates the JetStream resources. While the cluster
// cannot answer (its leaders being elected, a node restarting, the connection
// being replaced) it tries again until ctx ends; an answer that refuses the
// configuration is returned at once.
func (b *Broker) provision(ctx context.Context) (*resources, error) {
	delay := 250 * time.Millisecond
	for {
		res, err := provision(ctx, b.js, b.cfg)
		if err == nil || !unavailable(err) || ctx.Err() != nil {
			return res, err
		}
		b.log.Warn("JetStream not answering while provisioning; trying again", zap.Duration("in", delay), zap.Error(err))
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(delay):
		}
		delay = min(2*delay, 5*time.Second)
	}
}

// unavailable reports whether err says JetStream could not answer at that
// moment (no answer, a 5xx: no leader, a raft group busy; or too few peers
// online to place the replicas), rather than that it refused what was asked.
func unavailable(err error) bool {
	var apiErr *jetstream.APIError
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) ||
		errors.Is(err, nats.ErrNoResponders) || errors.Is(err, jetstream.ErrNoStreamResponse) ||
		errors.Is(err, nats.ErrDisconnected) ||
		errors.As(err, &apiErr) && (apiErr.Code >= 500 || apiErr.ErrorCode == errNoPeers)
}

// errNoPeers is JetStream's "no suitable peers for placement": too few
// servers online for the replicas asked for.
const errNoPeers = 10005

// follow feeds every entry of kv (per opts) to apply until ctx ends, and
// calls caughtUp once the first watcher has delivered the bucket's current
// contents. A watcher that fails or closes while the broker runs is replaced.
func (b *Broker) follow(ctx context.Context, kv jetstream.KeyValue, what string, apply func(jetstream.KeyValueEntry), caughtUp func(), opts ...jetstream.WatchOpt) {
	for ctx.Err() == nil {
		w, err := kv.WatchAll(ctx, opts...)
		if err != nil {
			if ctx.Err() == nil {
				b.log.Warn("watch "+what+"; retrying", zap.Error(err))
				select {
				case <-ctx.Done():
				case <-time.After(time.Second):
				}
			}
			continue
		}
		for entry := range w.Updates() {
			switch {
			case entry != nil:
				apply(entry)
			case caughtUp != nil:
				caughtUp()
				caughtUp = nil
			}
		}
		_ = w.Stop()
		if ctx.Err() == nil {
			b.log.Warn(what + " watcher closed; starting a new one")
		}
	}
}

// Get returns the record of request id, or ErrNotFound. It reads once this
// replica has read what the stream held when it was called, so a decision
// another replica stored before the call (and its agent may have seen) is
// there; a request stored but not yet judged is not found yet.
func (b *Broker) Get(ctx context.Context, id string) (Record, error) {
	if err := events.CheckToken("request id", id); err != nil {
		return Record{}, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	if err := b.ledger.catchUp(ctx); err != nil {
		b.log.Debug("read a request without catching up with the stream", zap.String("request_id", id), zap.Error(err))
	}
	rec, err := b.load(ctx, id)
	if err == nil && rec.judging {
		return Record{}, fmt.Errorf("%w: %s (stored, not yet judged)", ErrNotFound, id)
	}
	return rec, err
}

// Wait returns the record of request id once it is decided, or its current
// state when ctx ends first (with ctx's error).
func (b *Broker) Wait(ctx context.Context, id string) (Record, error) {
	if err := events.CheckToken("request id", id); err != nil {
		return Record{}, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	ch, cancel := b.records.wait(id)
	defer cancel()
	for {
		rec, err := b.load(context.WithoutCancel(ctx), id)
		if err != nil && !errors.Is(err, ErrNotFound) {
			return rec, err
		}
		if err == nil && rec.State.Terminal() {
			return rec, nil
		}
		select {
		case <-ch:
		case <-time.After(time.Second): // in case a wake-up was lost (watcher replaced)
		case <-ctx.Done():
			if err != nil {
				return rec, err
			}
			return rec, ctx.Err()
		}
	}
}

// Submit publishes a request to the stream, as an agent would on NATS, and
// returns once a broker replica has stored it. The request goes through the same
// consumer as every other; publishing the same id again is the same request.
// The requested event carries the trace context of ctx, if any.
func (b *Broker) Submit(ctx context.Context, id, source string, req events.Requested) (Record, error) {
	if id == "" {
		id = events.NewID()
	}
	if err := events.CheckToken("id", id); err != nil {
		return Record{}, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	if req.Agent == "" {
		return Record{}, fmt.Errorf("%w: agent: %w (it names the subject %s<agent>)", ErrInvalid, events.ErrMissingField, events.RequestPrefix)
	}
	if err := req.Validate(); err != nil {
		return Record{}, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	digest, err := events.RequestDigest(req)
	if err != nil {
		return Record{}, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	// A retry by id is the same request, and gets its record; another request
	// under that id is refused before it is published.
	if rec, err := b.load(ctx, id); err == nil {
		return rec, conflict(&rec, req, digest)
	} else if !errors.Is(err, ErrNotFound) {
		return Record{}, err
	}
	subj, err := events.RequestSubject(req.Agent)
	if err != nil {
		return Record{}, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	e, err := events.New(events.TypeRequested, id, source, req)
	if err != nil {
		return Record{}, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	setEventTrace(ctx, &e)
	h, body, err := events.Encode(&e)
	if err != nil {
		return Record{}, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	msg := &nats.Msg{Subject: subj, Header: nats.Header(h), Data: body}
	if size := len(msg.Data) + headerSize(msg.Header); size > b.cfg.MaxEventSize {
		return Record{}, fmt.Errorf("%w: %w: the event would be %d bytes, limit %d", ErrInvalid, events.ErrTooLarge, size, b.cfg.MaxEventSize)
	}
	ch, cancel := b.records.wait(id)
	defer cancel()
	if _, err := b.js.PublishMsg(ctx, msg, jetstream.WithMsgID(id)); err != nil {
		return Record{}, fmt.Errorf("publish request: %w", err)
	}
	for {
		rec, err := b.load(ctx, id)
		if err == nil && !rec.judging {
			return rec, conflict(&rec, req, digest)
		}
		if err != nil && !errors.Is(err, ErrNotFound) {
			return rec, err
		}
		select {
		case <-ch:
		case <-time.After(250 * time.Millisecond): // a replica on another connection
		case <-ctx.Done():
			return Record{}, fmt.Errorf("request %s published but not yet stored by a broker: %w", id, ctx.Err())
		}
	}
}

// Room the broker leaves for itself in the events it publishes.
const (
	// eventHeadroom is what an event the broker publishes may add to the
	// request or answer it carries: a decision's reason, who decided, its
	// digests, the pending event's approvers.
	eventHeadroom = 64 << 10
	// publishHeaderRoom is room for the headers that publish options add
	// (expected sequence, message id).
	publishHeaderRoom = 256
	// minEventSize is the least useful incoming limit.
	minEventSize = 1024
)

// NeededMaxPayload is the least max_payload a NATS server must have for a
// broker to take events of up to maxEventSize bytes: room for what the
// broker adds to the events it publishes. With less, the broker lowers its
// limit to fit and logs a warning.
func NeededMaxPayload(maxEventSize int) int { return maxEventSize + eventHeadroom }

// wireHeaderSize is the size of h as NATS sends it: "NATS/1.0\r\n", a
// "Key: Value\r\n" line per value, and a closing "\r\n"; zero without headers.
func wireHeaderSize(h nats.Header) int {
	if len(h) == 0 {
		return 0
	}
	n := len("NATS/1.0\r\n") + 2
	for k, vs := range h {
		for _, v := range vs {
			n += len(k) + 2 + len(v) + 2
		}
	}
	return n
}

func headerSize(h nats.Header) int {
	n := 0
	for k, vs := range h {
		for _, v := range vs {
			n += len(k) + len(v)
		}
	}
	return n
}

// Filter selects records for List. Empty fields match everything.
type Filter struct {
	State State
	// Decided, with no State, matches every decided request (any outcome).
	Decided bool
	Agent   string
	Session string
	// After continues a listing after the request with this id (the last
	// one of the previous page).
	After string
	Limit int // default 100
}

// Page is one page of a listing.
type Page struct {
	Records []Record
	// Total counts the requests that match the filter, on every page.
	Total int
	// Next is the Filter.After of the next page, "" on the last. A page can
	// hold fewer records than its limit and still have a next one: a
	// request gone from the bucket since the index listed it is left out.
	Next string
}

// List returns up to f.Limit records matching f: pending ones oldest first,
// then decided ones newest first. This replica's index says which and how
// many: pending requests all, decided ones the most recent
// Config.KeepDecided (older ones by id with Get, or from the audit log). The
// index keeps the records of decided requests; a page's pending ones are read
// from the bucket, a few at a time.
func (b *Broker) List(ctx context.Context, f Filter) (Page, error) {
	// loads bounds the bucket reads of one listing in flight at once.
	const loads = 8
	if f.Limit <= 0 {
		f.Limit = 100
	}
	ids, total := b.index.list(f)
	var next string
	if len(ids) == f.Limit {
		next = ids[len(ids)-1]
	}
	// The index holds a pending request's id, agent and session only, and
	// a decided one without its large args: read those from the bucket, a
	// few at a time. One gone from the bucket since is left out, and so is
	// one decided since, on a listing of the pending: the bucket is ahead of
	// the index, and a page of pending requests shows none decided.
	recs, have := make([]Record, len(ids)), make([]bool, len(ids))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(loads)
	for i, id := range ids {
		if rec, trimmed, ok := b.index.get(id); ok && !trimmed {
			recs[i], have[i] = rec, true
			continue
		}
		g.Go(func() error {
			rec, err := b.load(gctx, id)
			switch {
			case errors.Is(err, ErrNotFound):
				return nil
			case err != nil:
				return err
			case f.State == StatePending && rec.State != StatePending:
				return nil
			}
			recs[i], have[i] = rec, true
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return Page{Total: total}, err
	}
	page := Page{Records: recs[:0], Total: total, Next: next}
	for i := range recs {
		if have[i] {
			page.Records = append(page.Records, recs[i])
		}
	}
	return page, nil
}

// Pending reports how many requests are pending.
func (b *Broker) Pending() int { return b.index.pendingCount() }

// hub wakes callers waiting for changes to a request's state.
type hub struct {
	mu      sync.Mutex
	waiters map[string]map[chan struct{}]struct{}
}

func newHub() *hub { return &hub{waiters: make(map[string]map[chan struct{}]struct{})} }

// wait returns a channel signalled whenever id's state changes, and a func to
// stop waiting.
func (h *hub) wait(id string) (<-chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	h.mu.Lock()
	if h.waiters[id] == nil {
		h.waiters[id] = make(map[chan struct{}]struct{})
	}
	h.waiters[id][ch] = struct{}{}
	h.mu.Unlock()
	return ch, func() {
		h.mu.Lock()
		delete(h.waiters[id], ch)
		if len(h.waiters[id]) == 0 {
			delete(h.waiters, id)
		}
		h.mu.Unlock()
	}
}

func (h *hub) deliver(id string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for ch := range h.waiters[id] {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}
