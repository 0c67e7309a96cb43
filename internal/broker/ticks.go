package broker

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"

	"github.com/assent-dev/assent/pkg/events"
)

// Deadlines reach the broker two ways. Each replica's timers fire at every
// pending request's moment and hand the due requests over in batches, one
// stored message (assent.tick.due) naming many requests, so that expiring ten
// thousand requests a second costs a few stored messages, not ten thousand.
// And for every second in which some request's moment falls, a durable
// JetStream schedule (assent-timer.tick.<unix second>, in ASSENT_TIMERS) fires
// at the end of that second onto assent-timer.at.<second>, whichever replicas
// are running then:
// the replica that takes it looks for pending requests whose moment passed
// and that nothing handed over lately, and hands them over itself. A million pending
// requests cost one schedule per distinct second, not one each.
const (
	// TickPrefix is the subject space of the ticks consumer.
	TickPrefix = "assent.tick."
	// tickDue carries a batch of due request ids, one per line.
	tickDue = TickPrefix + "due"
	// tickAt+<second> is where the durable schedule of a broker before
	// ASSENT_TIMERS fires, in the ASSENT stream.
	tickAt = TickPrefix + "at."
	// timerTick+<second> is the schedule of that second, in ASSENT_TIMERS;
	// timerAt+<second> is where it fires.
	timerSpace = "assent-timer."
	timerTick  = timerSpace + "tick."
	timerAt    = timerSpace + "at."
	// TimerTicks are the subjects of the durable schedules in ASSENT_TIMERS.
	TimerTicks = timerTick + ">"
	// timerTickTTL is how long a fired tick stays in ASSENT_TIMERS.
	timerTickTTL = time.Hour

	consumerTicks      = "assent-broker-ticks"
	consumerTimerTicks = "assent-broker-timer-ticks"

	// inFlight is how long a request handed over may take before a durable
	// tick hands it over again: the ticks consumer's ack wait, after which
	// a batch held by a replica that died comes back anyway.
	inFlight = time.Second
	// maxBatch bounds the ids in one batch.
	maxBatch = 512
	// batchesInFlight bounds the batches being published at once.
	batchesInFlight = 4
	// gatherFor is how long a batch waits for more requests falling due.
	gatherFor = 5 * time.Millisecond
	// expiryWorkers is how many requests of batches a replica expires at
	// once: each waits for two reads of the ledger and a publish, which
	// take tens of milliseconds while a collection runs, and ten thousand
	// a second must go on meanwhile.
	expiryWorkers = 512
)

// tickSecond is the second whose durable tick covers a request due at at:
// the first whole second not before it (schedules have whole-second
// resolution), so the tick fires after the local timers.
func tickSecond(at time.Time) int64 {
	sec := at.Truncate(time.Second)
	if sec.Before(at) {
		sec = sec.Add(time.Second)
	}
	return sec.Unix()
}

// ticks remembers the seconds this replica scheduled a durable tick for, so
// that each costs one stored message however many requests fall in it.
type ticks struct {
	mu      sync.Mutex
	seconds map[int64]*tickCall
}

type tickCall struct {
	done chan struct{}
	err  error
}

func newTicks() *ticks { return &ticks{seconds: make(map[int64]*tickCall)} }

// ensureTick makes sure a durable tick is scheduled for the second that
// covers moment at. Callers asking for the same second share one publish.
func (b *Broker) ensureTick(ctx context.Context, at time.Time) error {
	sec := tickSecond(at)
	t := b.ticks
	for {
		t.mu.Lock()
		c, ok := t.seconds[sec]
		if !ok {
			c = &tickCall{done: make(chan struct{})}
			t.seconds[sec] = c
			t.prune(b.now().Unix())
		}
		t.mu.Unlock()
		if !ok {
			c.err = b.scheduleTick(ctx, sec)
			if c.err != nil {
				t.mu.Lock()
				delete(t.seconds, sec)
				t.mu.Unlock()
			}
			close(c.done)
			return c.err
		}
		select {
		case <-c.done:
		case <-ctx.Done():
			return ctx.Err()
		}
		if c.err == nil {
			return nil
		}
		// That publish failed: try again with a publish of our own.
	}
}

// prune forgets seconds that passed, once there are many. The caller holds mu.
func (t *ticks) prune(now int64) {
	if len(t.seconds) < 4096 {
		return
	}
	for sec, c := range t.seconds {
		select {
		case <-c.done:
			if sec < now {
				delete(t.seconds, sec)
			}
		default:
		}
	}
}

// scheduleTick stores the durable schedule of second sec.
func (b *Broker) scheduleTick(ctx context.Context, sec int64) error {
	s := strconv.FormatInt(sec, 10)
	msg := &nats.Msg{Subject: timerTick + s}
	_, err := b.publish(ctx, msg, jetstream.WithScheduleAt(time.Unix(sec, 0)), jetstream.WithScheduleTarget(timerAt+s), jetstream.WithScheduleTTL(timerTickTTL))
	if err != nil {
		return fmt.Errorf("schedule durable tick at %s: %w", time.Unix(sec, 0).UTC().Format(time.RFC3339), err)
	}
	return nil
}

// expiryLoop hands the requests whose timers fired over to the ticks
// consumer, in batches: what falls due within gatherFor of the first joins
// it. A batch that cannot be stored is tried again shortly for the requests
// still pending.
func (b *Broker) expiryLoop(ctx context.Context) error {
	sem := make(chan struct{}, batchesInFlight)
	var wg sync.WaitGroup
	defer wg.Wait()
	gather := time.NewTimer(time.Hour)
	defer gather.Stop()
	for {
		var batch []string
		select {
		case <-ctx.Done():
			return nil
		case ids := <-b.timers.due:
			batch = b.addDue(batch, ids)
		}
		// What falls due a little later joins this batch: batches of
		// a request or two each, ten thousand expiring a second, would
		// hold every handler of the ticks consumer at once.
		gather.Reset(gatherFor)
	more:
		for len(batch) < maxBatch {
			select {
			case ids := <-b.timers.due:
				batch = b.addDue(batch, ids)
			case <-gather.C:
				break more
			case <-ctx.Done():
				return nil
			}
		}
		gather.Stop()
		if len(batch) == 0 {
			continue
		}
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			return nil
		}
		wg.Go(func() {
			defer func() { <-sem }()
			b.handOver(ctx, batch)
		})
	}
}

// addDue adds to batch those of ids not decided meanwhile.
func (b *Broker) addDue(batch, ids []string) []string {
	for _, id := range ids {
		if rec, _, ok := b.index.get(id); !ok || rec.State == StatePending {
			batch = append(batch, id)
		}
	}
	return batch
}

// handOver stores a batch of due request ids for the ticks consumer. The
// expiries (or escalations) are made by whichever replica takes the batch,
// so that every outcome is chosen while handling a stored message, which is
// redelivered should its handling stop half way.
func (b *Broker) handOver(ctx context.Context, ids []string) {
	started := b.now()
	_, err := b.publish(context.WithoutCancel(ctx), &nats.Msg{Subject: tickDue, Data: []byte(strings.Join(ids, "\n"))})
	if err == nil {
		if ended, failures, lasted := b.handOverOutage.ok(b.now()); ended {
			b.log.Info("hand over due requests works again", zap.Int("failures", failures), zap.Duration("after", lasted))
		}
		return
	}
	if ctx.Err() != nil {
		return
	}
	// Each request is tried again in a quarter second, so an outage fails
	// many times a second: say so when it begins and every outageEvery.
	if report, failures := b.handOverOutage.fail(started, b.now()); report {
		b.log.Warn("hand over due requests failed; trying again (said again every 30s while it fails, and when it works)",
			zap.Int("requests", len(ids)), zap.Int("failures", failures), zap.Error(err))
	}
	b.ledger.retry(ids, time.Now().Add(250*time.Millisecond))
}

// handleTick handles a message of the ticks consumer: a batch of due
// requests, which it expires (or escalates), or a durable tick, which it
// answers with a batch of the requests it finds overdue.
func (b *Broker) handleTick(ctx context.Context, msg jetstream.Msg) error {
	o, err := originOf(msg)
	if err != nil {
		return permanent(err)
	}
	subj := msg.Subject()
	switch {
	case subj == tickDue:
		return b.expireBatch(ctx, dueIDs(msg.Data()), o)
	case strings.HasPrefix(subj, timerAt), strings.HasPrefix(subj, tickAt):
		sec, err := strconv.ParseInt(subj[strings.LastIndexByte(subj, '.')+1:], 10, 64)
		if err != nil {
			return permanent(fmt.Errorf("%w: %q", events.ErrBadSubject, subj))
		}
		return b.sweep(ctx, time.Unix(sec, 0))
	}
	return permanent(fmt.Errorf("%w: %q", events.ErrBadSubject, subj))
}

// dueIDs reads a batch: request ids one per line; lines that are not ids are
// left out.
func dueIDs(data []byte) []string {
	seen := make(map[string]bool)
	var ids []string
	for line := range bytes.SplitSeq(data, []byte("\n")) {
		id := string(line)
		if events.ValidToken(id) && !seen[id] {
			seen[id] = true
			ids = append(ids, id)
		}
	}
	return ids
}

// sweep answers the durable tick of second sec: requests whose moment came
// by sec and that were not handed over in the last inFlight are handed over
// now, in stored batches, so that a redelivered tick is not needed to finish
// them.
func (b *Broker) sweep(ctx context.Context, sec time.Time) error {
	ids := b.timers.overdue(sec.Add(time.Nanosecond), b.now().Add(-inFlight), 8*maxBatch)
	if len(ids) == 0 {
		return nil
	}
	b.log.Warn("durable tick found requests past their moment that no timer handed over; handing them over", zap.Int("requests", len(ids)), zap.Time("tick", sec))
	for batch := range slices.Chunk(ids, maxBatch) {
		if _, err := b.publish(ctx, &nats.Msg{Subject: tickDue, Data: []byte(strings.Join(batch, "\n"))}); err != nil {
			return fmt.Errorf("hand over overdue requests: %w", err)
		}
		b.ledger.handed(batch)
	}
	return nil
}

// expireBatch expires (or escalates) the requests of a batch on behalf of its
// message o, on the expiry workers. A request that could not be handled yet
// sends the batch back for redelivery, whose handling skips those done and
// publishes any outcome stored but not yet published.
func (b *Broker) expireBatch(ctx context.Context, ids []string, o origin) error {
	var (
		mu    sync.Mutex
		retry *retryError
		wg    sync.WaitGroup
	)
	later := func(r *retryError) {
		mu.Lock()
		defer mu.Unlock()
		if retry == nil || r.delay > retry.delay {
			retry = r
		}
	}
	done := func(id string, err error) {
		defer wg.Done()
		var r *retryError
		switch {
		case err == nil:
		case errors.As(err, &r):
			later(r)
		default:
			// Permanent for this request alone; the rest of the batch
			// goes on.
			b.log.Error("expire", zap.String("request_id", id), zap.Error(err))
		}
	}
	for _, id := range ids {
		wg.Add(1)
		select {
		case b.expiries <- expiryJob{ctx: ctx, id: id, o: o, done: done}:
		case <-ctx.Done():
			wg.Done()
			later(&retryError{err: fmt.Errorf("expire %s: %w", id, ctx.Err())})
		}
	}
	wg.Wait()
	if retry != nil {
		return retry
	}
	return nil
}

// expiryJob is one request of a batch for the expiry workers; done is
// called with the outcome of expireOne.
type expiryJob struct {
	ctx  context.Context
	id   string
	o    origin
	done func(id string, err error)
}

// startExpiries starts the goroutines that expire the requests of batches,
// and returns a function that stops them once no batch hands them more. The
// same goroutines serve every batch: one per request would grow a new stack
// for each expiry, about a tenth of the broker's CPU while ten thousand
// expire a second.
func (b *Broker) startExpiries() (stop func()) {
	quit := make(chan struct{})
	var wg sync.WaitGroup
	for range expiryWorkers {
		wg.Go(func() {
			for {
				select {
				case j := <-b.expiries:
					j.done(j.id, b.expireOne(j.ctx, j.id, j.o))
				case <-quit:
					return
				}
			}
		})
	}
	return func() {
		close(quit)
		wg.Wait()
	}
}

// expireOne expires request id on behalf of message o: nil once done (or
// the request is gone), a permanentError if retrying cannot mend it, else a
// retryError. A deadline is missed by as long as a retry takes, so it comes
// soon (the state bucket's leader being elected, a connection being
// replaced).
//
// The expiry is a span (SpanExpire) in the request's trace.
func (b *Broker) expireOne(ctx context.Context, id string, o origin) error {
	ctx, span := b.startSpan(b.requestContext(ctx, id), SpanExpire, trace.SpanKindInternal, id)
	rec, err := b.expire(ctx, id, o)
	span.SetAttributes(attrLevel.Int(rec.Level))
	endSpan(span, &rec, err)
	var retry *retryError
	switch {
	case err == nil, errors.Is(err, ErrNotFound):
		return nil
	case errors.Is(err, ErrForgedDecision), errors.Is(err, ErrAlreadyDecided), errors.Is(err, ErrExpired):
		return nil
	case errors.As(err, &retry):
		return err
	case unavailable(err) && o.delivery <= maxDeliver/2:
		return &retryError{err, unavailableDelay}
	}
	return &retryError{err, min(time.Duration(o.delivery)*250*time.Millisecond, 2*time.Second)}
}

// expire handles request id as the expiry batch (or old per-request
// timeout) o names it: publishes the expiry the stored messages make, or
// announces the escalation level reached, or re-arms the timers of a
// request whose moment has not come by o's stored time (clocks of replicas
// and the stream's leader differ a little).
func (b *Broker) expire(ctx context.Context, id string, o origin) (Record, error) {
	rec, st, err := b.settleAt(ctx, id, o)
	switch {
	case err != nil, !st.known:
		return rec, err
	case st.prop != nil:
		return rec, nil // decided by o (published), or by an earlier message
	case st.level > 0:
		if err := b.escalate(ctx, &rec); err != nil {
			return rec, err
		}
	}
	if !st.pending {
		return rec, nil
	}
	return rec, b.arm(ctx, &rec)
}
