package handler

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/assent-dev/assent/pkg/events"
)

// What the Approver and Channel runtimes share: their settings' defaults,
// their durable consumers, a bounded pool of handlers, message settling, and
// presence.

// defaults fills the runtime settings left unset: 16 handlers at once, a
// 24-hour look back (the broker's longest timeout), and no logging.
func defaults(concurrency *int, lookback *time.Duration, logger **zap.Logger) {
	if *concurrency <= 0 {
		*concurrency = 16
	}
	if *lookback <= 0 {
		*lookback = 24 * time.Hour
	}
	if *logger == nil {
		*logger = zap.NewNop()
	}
}

// checkAgents reports every agent name that is not a subject token.
func checkAgents(agents []string) []error {
	var errs []error
	for _, a := range agents {
		if err := events.CheckToken("agent", a); err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}

// connectRuntime returns the JetStream context of nc and a client to read
// decisions with, which trusts the decision keys trusted (none: it does not
// check signatures).
func connectRuntime(nc *nats.Conn, log *zap.Logger, trusted []string) (jetstream.JetStream, *Client, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, nil, err
	}
	client, err := NewClient(nc, Config{Logger: log, TrustedKeys: trusted})
	if err != nil {
		return nil, nil, err
	}
	return js, client, nil
}

// pendingFilters are the subjects of the pending and escalated events of
// agents (all agents when empty).
func pendingFilters(agents []string) []string {
	if len(agents) == 0 {
		return []string{events.PendingPrefix + "*"}
	}
	out := make([]string, len(agents))
	for i, a := range agents {
		out[i] = events.PendingPrefix + a
	}
	return out
}

// consumerConfig is a runtime's durable consumer: explicit acks, 30 seconds
// to settle a message (handlers keep it with keepAlive), starting at start.
func consumerConfig(name, description string, filters []string, start time.Time, maxAckPending int) jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{
		Durable:        name,
		Description:    description,
		FilterSubjects: filters,
		DeliverPolicy:  jetstream.DeliverByStartTimePolicy,
		OptStartTime:   &start,
		AckPolicy:      jetstream.AckExplicitPolicy,
		AckWait:        30 * time.Second,
		MaxAckPending:  maxAckPending,
	}
}

// pullExpiry is how long each pull request of a runtime's consumers lasts
// before it asks again. A consumer's leader that crashes takes the pull
// requests it held with it, and its successor learns of none until they are
// asked again: with nats.go's default of 30 s an approver or channel took
// no notice for up to 30 s after the election. With 2 s it asks again
// within 2 s (the broker's consumers do the same).
const pullExpiry = 2 * time.Second

// consume starts cons feeding p with handle, with n messages asked for at
// once and a short pull expiry.
func (p *pool) consume(cons jetstream.Consumer, n int, handle func(context.Context, jetstream.Msg)) (jetstream.ConsumeContext, error) {
	return cons.Consume(p.take(handle), jetstream.PullMaxMessages(n), jetstream.PullExpiry(pullExpiry))
}

// pool runs message handlers, at most a fixed number at once.
type pool struct {
	ctx context.Context
	sem chan struct{}
	mu  sync.Mutex // orders the start of a handler (once ctx ended, none) before wait
	wg  sync.WaitGroup
}

func newPool(ctx context.Context, n int) *pool {
	return &pool{ctx: ctx, sem: make(chan struct{}, n)}
}

// take returns a consume callback that runs handle on each message in the
// pool, blocking the consumer while the pool is full.
func (p *pool) take(handle func(context.Context, jetstream.Msg)) func(jetstream.Msg) {
	return func(msg jetstream.Msg) {
		// The consumer may still call this after its Stop, blocked here
		// while the pool was full: once ctx ended, a message is left for
		// redelivery instead of starting a handler that wait would miss.
		select {
		case p.sem <- struct{}{}:
		case <-p.ctx.Done():
			return
		}
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.ctx.Err() != nil {
			<-p.sem
			return
		}
		p.wg.Go(func() {
			defer func() { <-p.sem }()
			handle(p.ctx, msg)
		})
	}
}

// wait waits for the running handlers, once ctx ended: no handler starts
// after it.
func (p *pool) wait() {
	p.mu.Lock()
	p.mu.Unlock() //nolint:staticcheck // a barrier: every take that started a handler has added it
	p.wg.Wait()
}

// takeNotice reads the notice of a pending or escalated message, and returns
// ctx carrying the event's trace context (that of the broker's span that
// announced it). When there is no notice to act on (malformed, another type,
// past its deadline) it settles msg and returns false.
func takeNotice(ctx context.Context, codec events.Codec, msg jetstream.Msg) (context.Context, Notice, bool) {
	e, err := codec.Decode(events.Header(msg.Headers()), msg.Data())
	if err != nil {
		_ = msg.TermWithReason("malformed: " + err.Error())
		return ctx, Notice{}, false
	}
	n, ok, err := NoticeOf(&e)
	switch {
	case err != nil:
		_ = msg.TermWithReason("malformed: " + err.Error())
		return ctx, Notice{}, false
	case !ok, !time.Now().Before(n.Deadline):
		_ = msg.Ack()
		return ctx, Notice{}, false
	}
	return withEventTrace(ctx, &e), n, true
}

// Durable returns the durable consumer cfg names on the Assent stream, made
// if missing, for programs that follow the stream as the runtimes do. One
// that exists keeps where it started (the server refuses to change that) and
// takes the rest of cfg, such as new filters.
func Durable(ctx context.Context, js jetstream.JetStream, cfg jetstream.ConsumerConfig) (jetstream.Consumer, error) {
	for range 2 {
		cons, err := js.Consumer(ctx, StreamName, cfg.Durable)
		if err == nil {
			old := cons.CachedInfo().Config
			cfg.DeliverPolicy, cfg.OptStartTime, cfg.OptStartSeq = old.DeliverPolicy, old.OptStartTime, old.OptStartSeq
			return js.UpdateConsumer(ctx, StreamName, cfg)
		}
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			return nil, fmt.Errorf("stream %s not found: start a broker on this NATS server first (it creates the stream)", StreamName)
		}
		if !errors.Is(err, jetstream.ErrConsumerNotFound) {
			return nil, err
		}
		cons, err = js.CreateConsumer(ctx, StreamName, cfg)
		if !errors.Is(err, jetstream.ErrConsumerExists) {
			return cons, err
		}
		// Another process made it first: take that one.
	}
	return nil, fmt.Errorf("consumer %s: made and removed while starting", cfg.Durable)
}

// retry asks for msg again after a delay that doubles with each delivery,
// from a second up to a minute.
func retry(msg jetstream.Msg) {
	d := time.Second
	if md, err := msg.Metadata(); err == nil {
		for i := uint64(1); i < md.NumDelivered && d < time.Minute; i++ {
			d *= 2
		}
	}
	_ = msg.NakWithDelay(min(d, time.Minute))
}

// keepAlive tells the server msg is still being handled until the returned
// function is called.
func keepAlive(msg jetstream.Msg) func() {
	stop := make(chan struct{})
	go func() {
		t := time.NewTicker(10 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				_ = msg.InProgress()
			case <-stop:
				return
			}
		}
	}()
	return func() { close(stop) }
}

// Announce tells brokers, every events.PresenceRefresh until ctx ends, that
// channel reaches the principals who() returns, then withdraws the
// announcements. A broker that finds no reachable approver for a request can
// then fail fast instead of letting it wait out its timeout. The Approver and
// Channel runtimes announce themselves; programs that answer otherwise (a
// terminal) call it.
func Announce(ctx context.Context, js jetstream.JetStream, log *zap.Logger, channel string, who func() []string) {
	announce(ctx, js, log, channel, who, nil)
}

// announce is Announce, which also asks who again whenever again receives.
func announce(ctx context.Context, js jetstream.JetStream, log *zap.Logger, channel string, who func() []string, again <-chan struct{}) {
	var kv jetstream.KeyValue
	warned := false
	announced := map[string]bool{}
	put := func() {
		if kv == nil {
			// The bucket appears when a broker first starts; keep trying.
			b, err := js.KeyValue(ctx, events.PresenceBucket)
			if err != nil {
				if !warned && ctx.Err() == nil {
					log.Warn("cannot announce presence yet; brokers without an open HTTP API treat these principals as unreachable", zap.Error(err))
					warned = true
				}
				return
			}
			kv = b
		}
		now := who()
		for p := range announced {
			if !slices.Contains(now, p) {
				if key, err := events.PresenceKey(p, channel); err == nil {
					_ = kv.Delete(ctx, key)
				}
				delete(announced, p)
			}
		}
		for _, p := range now {
			key, err := events.PresenceKey(p, channel)
			if err != nil {
				continue
			}
			val, _ := json.Marshal(events.Announcement{Principal: p, Channel: channel, At: time.Now().UTC()})
			if _, err := kv.Put(ctx, key, val); err != nil {
				if ctx.Err() == nil {
					log.Warn("announce presence", zap.String("principal", p), zap.Error(err))
				}
				continue
			}
			announced[p] = true
		}
	}
	put()
	t := time.NewTicker(events.PresenceRefresh)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			if kv != nil {
				dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
				for p := range announced {
					if key, err := events.PresenceKey(p, channel); err == nil {
						_ = kv.Delete(dctx, key)
					}
				}
				cancel()
			}
			return
		case <-t.C:
			put()
		case <-again:
			put()
		}
	}
}
