package broker

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/assent-dev/assent/internal/recent"
	"github.com/assent-dev/assent/pkg/events"
)

// Event is one event of the stream's contract subjects, as the event feed and
// the audit log give it: where it is in the stream, what it is about, and the
// CloudEvent itself.
type Event struct {
	Seq     uint64    `json:"seq"`
	Time    time.Time `json:"time"` // when the stream stored it
	Subject string    `json:"subject"`
	Type    string    `json:"type"`
	// RequestID is the request the event is about; Agent and Session are
	// that request's, where known.
	RequestID string `json:"request_id,omitempty"`
	Agent     string `json:"agent,omitempty"`
	Session   string `json:"session,omitempty"`
	// Event is the CloudEvent as stored (structured mode JSON), or null for
	// a message that is not one.
	Event json.RawMessage `json:"event"`
	// NotDecision, on a decided event, says why it is not its request's
	// decision: stored after the decision (only the first message on a
	// decision subject is), or not one a broker made.
	NotDecision string `json:"not_decision,omitempty"`

	data map[string]json.RawMessage // the event's data, decoded once for filters
	enc  *encoding                  // e as JSON, made once for all clients
}

type encoding struct {
	once sync.Once
	b    []byte
}

// JSON returns e encoded as JSON; an event from the feed is encoded once,
// however many clients it goes to.
func (e *Event) JSON() []byte {
	encode := func() []byte {
		var buf bytes.Buffer
		enc := json.NewEncoder(&buf)
		enc.SetEscapeHTML(false)
		_ = enc.Encode(e)
		return bytes.TrimRight(buf.Bytes(), "\n")
	}
	if e.enc == nil {
		return encode()
	}
	e.enc.once.Do(func() { e.enc.b = encode() })
	return e.enc.b
}

// ShortType is the last part of the event's type ("decided"), "" for none.
func (e *Event) ShortType() string { return shortType(e.Type) }

// The feed and the audit log read the contract's events and the broker's
// audit records, not its timers. They read the whole stream (a consumer with
// no filter) and skip the timer subjects themselves: a consumer filtered by
// several wildcards costs the server a walk over every subject, and there is
// one per request.
var allSubjects []string // nil: the whole stream

// feedSubject reports whether a message on subject belongs in the feed.
func feedSubject(subject string) bool {
	return !strings.HasPrefix(subject, TimerPrefix) && !strings.HasPrefix(subject, TimeoutPrefix) && !strings.HasPrefix(subject, TickPrefix) &&
		subject != events.CheckpointSubject
}

// EventFilter selects feed events. Empty fields match everything; each list
// matches any of its values.
type EventFilter struct {
	Types     []string // CloudEvent types, or their last part ("decided")
	Agents    []string
	Sessions  []string
	RequestID string
}

func (f *EventFilter) match(e *Event) bool {
	if len(f.Types) > 0 && !slices.ContainsFunc(f.Types, func(t string) bool { return t == e.Type || t == shortType(e.Type) }) {
		return false
	}
	return (len(f.Agents) == 0 || slices.Contains(f.Agents, e.Agent)) &&
		(len(f.Sessions) == 0 || slices.Contains(f.Sessions, e.Session)) &&
		(f.RequestID == "" || f.RequestID == e.RequestID)
}

// event reads a stored message into an Event, filling in the request's agent
// and session from the index (or the bucket) where the subject lacks them.
func (b *Broker) event(ctx context.Context, seq uint64, at time.Time, subject string, data []byte, h events.Header) *Event {
	e := &Event{Seq: seq, Time: at.UTC(), Subject: subject, Event: json.RawMessage("null"), enc: &encoding{}}
	ce, err := events.Codec{MaxSize: b.maxEmit}.Decode(h, data)
	if err == nil {
		e.Type = ce.Type()
		if _, body, err := events.Encode(&ce); err == nil {
			e.Event = body
		}
		_ = json.Unmarshal(ce.Data(), &e.data)
	}
	if sub, err := events.ParseSubject(subject); err == nil {
		e.RequestID, e.Agent = sub.RequestID, sub.Agent
	} else if strings.HasPrefix(subject, events.ShadowPrefix) {
		e.RequestID = subject[len(events.ShadowPrefix):]
	}
	switch {
	case e.Type == events.TypeRequested && err == nil:
		e.RequestID = ce.ID()
		e.Session = e.str("session")
	case e.RequestID == "":
		e.RequestID = e.str("request_id")
		var req struct {
			Session string `json:"session"`
		}
		_ = json.Unmarshal(e.data["request"], &req)
		e.Session = req.Session
	}
	if e.Type == events.TypeDecided && e.RequestID != "" {
		e.NotDecision = b.notDecision(e.RequestID, ce.ID(), seq)
	}
	switch {
	case e.RequestID == "":
	case e.Type == events.TypeRequested:
		b.feed.meta.Put(e.RequestID, [2]string{e.Agent, e.Session})
	case e.Agent == "":
		// Answers, cancels and decisions name only the request: take its
		// agent and session from the request event the feed saw, the index,
		// or the bucket, in that order.
		if m, ok := b.feed.meta.Get(e.RequestID); ok {
			e.Agent, e.Session = m[0], m[1]
		} else if rec, _, ok := b.index.get(e.RequestID); ok {
			e.Agent, e.Session = rec.Request.Agent, rec.Request.Session
		} else if rec, err := b.load(ctx, e.RequestID); err == nil {
			e.Agent, e.Session = rec.Request.Agent, rec.Request.Session
		}
	}
	return e
}

// notDecision says why the decided event id, stored at seq, is not request
// id's decision, as far as this replica's ledger has read: "" while it is
// (or the ledger has not read that far, or no longer keeps the request).
func (b *Broker) notDecision(id, eventID string, seq uint64) string {
	if b.ledger.applied.Load() < seq {
		return ""
	}
	rec, _, ok := b.index.getDecided(id)
	switch {
	case !ok:
		return ""
	case rec.DecisionEventID != eventID:
		return fmt.Sprintf("stored after the decision (event %s at stream sequence %d)", rec.DecisionEventID, rec.revision)
	case rec.forged:
		return rec.Forgery
	}
	return ""
}

// str returns the string field name of the event's data.
func (e *Event) str(name string) string {
	var s string
	_ = json.Unmarshal(e.data[name], &s)
	return s
}

// feed fans the stream's new events out to subscribers: one ordered consumer
// per replica, however many clients listen, and none while nobody listens
// (it starts with the first subscriber and stops feedIdle after the last one
// leaves). Events go into a ring that every subscriber reads from at its own
// position. A subscriber is signalled only for events of the agents it
// follows (or for every event if it follows all), on a channel of one slot:
// events that arrive while it is busy writing are picked up together by its
// next read, so a busy stream costs a subscriber a wake-up and a write per
// batch, not per event.
type feed struct {
	mu   sync.RWMutex // guards the ring and the run's state
	ring []*Event
	n    uint64 // events ever added; event k is ring[k%len(ring)]
	seq  uint64 // the stream sequence of the last event added in this run
	// active is set while a run consumes the stream; start is the first
	// stream sequence the run delivers, and activated is closed when a run
	// becomes active.
	active    bool
	start     uint64
	activated chan struct{}

	// Who to signal, replaced (not changed) when a subscriber joins or
	// leaves, so that publishing reads it without a lock.
	watchers atomic.Pointer[watchers]
	join_    sync.Mutex // serializes joining, leaving and stopping for idleness
	subs     atomic.Int64
	wake     chan struct{}          // a subscriber joined
	idle     time.Duration          // how long the feed runs without subscribers
	meta     *recent.Map[[2]string] // the agent and session of recent requests
}

// watchers are the subscribers to signal: those following every event, and
// those following some agents.
type watchers struct {
	all     []*feedSub
	byAgent map[string][]*feedSub
}

type feedSub struct {
	notify chan struct{}
	agents []string
}

const (
	// feedRing is how many events the feed holds: a subscriber further behind
	// than that is dropped (ErrFellBehind) and resumes from its last event.
	feedRing = 16384
	// feedBatch bounds the events one read hands a subscriber.
	feedBatch = 128
	// feedIdle is how long the feed keeps reading the stream after its last
	// subscriber left: a page that reloads finds it running.
	feedIdle = 30 * time.Second
)

func newFeed() *feed {
	f := &feed{ring: make([]*Event, feedRing), meta: recent.New[[2]string](100_000),
		activated: make(chan struct{}), wake: make(chan struct{}, 1), idle: feedIdle}
	f.watchers.Store(&watchers{byAgent: map[string][]*feedSub{}})
	return f
}

// Subscribers counts the clients following the feed.
func (b *Broker) Subscribers() int { return int(b.feed.subs.Load()) }

// join registers a subscriber for f's agents (all, without an agent filter)
// and returns it with the feed's position now.
func (f *feed) join(flt *EventFilter) (*feedSub, uint64) {
	s := &feedSub{notify: make(chan struct{}, 1), agents: flt.Agents}
	f.change(func(w *watchers) {
		if len(s.agents) == 0 {
			w.all = append(w.all, s)
		}
		for _, a := range s.agents {
			w.byAgent[a] = append(w.byAgent[a], s)
		}
		f.subs.Add(1)
	})
	select {
	case f.wake <- struct{}{}:
	default:
	}
	return s, f.end()
}

func (f *feed) leave(s *feedSub) {
	drop := func(list []*feedSub) []*feedSub {
		return slices.DeleteFunc(list, func(x *feedSub) bool { return x == s })
	}
	f.change(func(w *watchers) {
		w.all = drop(w.all)
		for _, a := range s.agents {
			if w.byAgent[a] = drop(w.byAgent[a]); len(w.byAgent[a]) == 0 {
				delete(w.byAgent, a)
			}
		}
		f.subs.Add(-1)
	})
}

// running waits until a run of the feed consumes the stream, and returns the
// first stream sequence that run delivers.
func (f *feed) running(ctx context.Context) (uint64, error) {
	for {
		f.mu.RLock()
		active, start, ch := f.active, f.start, f.activated
		f.mu.RUnlock()
		if active {
			return start, nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
}

// activate marks a run that delivers from stream sequence start as active,
// unless one is already (a run resumed after a failure continues it).
func (f *feed) activate(start uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.active {
		return
	}
	f.active, f.start = true, start
	close(f.activated)
}

// deactivate ends the active run if nobody subscribes, and reports whether
// it did. The next run then starts at the end of the stream.
func (f *feed) deactivate() bool {
	f.join_.Lock()
	defer f.join_.Unlock()
	if f.subs.Load() > 0 {
		return false
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.active, f.seq = false, 0
	f.activated = make(chan struct{})
	return true
}

// change replaces the watchers with a changed copy.
func (f *feed) change(edit func(*watchers)) {
	f.join_.Lock()
	defer f.join_.Unlock()
	old := f.watchers.Load()
	w := &watchers{all: slices.Clone(old.all), byAgent: make(map[string][]*feedSub, len(old.byAgent))}
	for a, list := range old.byAgent {
		w.byAgent[a] = slices.Clone(list)
	}
	edit(w)
	f.watchers.Store(w)
}

func (f *feed) publish(e *Event) {
	f.mu.Lock()
	f.ring[f.n%uint64(len(f.ring))] = e
	f.n++
	f.seq = e.Seq
	f.mu.Unlock()
	w := f.watchers.Load()
	for _, s := range w.all {
		signal(s)
	}
	for _, s := range w.byAgent[e.Agent] {
		signal(s)
	}
}

func signal(s *feedSub) {
	select {
	case s.notify <- struct{}{}:
	default: // already signalled: its next read takes this event too
	}
}

// read appends to into up to feedBatch events from position pos on that match
// flt and come after stream sequence last, and returns the position after
// what it read. ok is false if events at pos were overwritten.
func (f *feed) read(pos, last uint64, flt *EventFilter, into []*Event) (out []*Event, next uint64, ok bool) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	size := uint64(len(f.ring))
	if f.n > size && pos < f.n-size {
		return into, pos, false
	}
	k := pos
	for ; k < f.n && len(into) < feedBatch; k++ {
		if e := f.ring[k%size]; e.Seq > last && flt.match(e) {
			into = append(into, e)
		}
	}
	return into, k, true
}

// end returns the feed's position now.
func (f *feed) end() uint64 {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.n
}

// runFeed delivers new events to the feed's subscribers until ctx ends. It
// reads the stream only while someone subscribes, and for feedIdle after.
func (b *Broker) runFeed(ctx context.Context) error {
	f := b.feed
	for ctx.Err() == nil {
		if f.subs.Load() == 0 {
			select {
			case <-f.wake:
			case <-ctx.Done():
				return nil
			}
			continue
		}
		info, err := b.res.stream.Info(ctx)
		if err != nil {
			b.retryAfter(ctx, "event feed: stream info", err)
			continue
		}
		start := info.State.LastSeq + 1
		f.mu.RLock()
		if f.seq != 0 {
			start = f.seq + 1 // after a failure, no gap
		}
		f.mu.RUnlock()
		cons, err := b.res.stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
			DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: start,
		})
		if err != nil {
			b.retryAfter(ctx, "event feed: consumer", err)
			continue
		}
		it, err := cons.Messages()
		if err != nil {
			b.retryAfter(ctx, "event feed: messages", err)
			continue
		}
		f.activate(start)
		var idled atomic.Bool
		stop := make(chan struct{})
		go func() {
			defer it.Stop()
			t := time.NewTicker(min(time.Second, f.idle))
			defer t.Stop()
			var since time.Time // when the last subscriber left
			for {
				select {
				case <-stop:
					return
				case <-ctx.Done():
					return
				case now := <-t.C:
					switch {
					case f.subs.Load() > 0:
						since = time.Time{}
					case since.IsZero():
						since = now
					case now.Sub(since) >= f.idle:
						idled.Store(true)
						return
					}
				}
			}
		}()
		for {
			msg, err := it.Next()
			if err != nil {
				if ctx.Err() == nil && !idled.Load() && !errors.Is(err, jetstream.ErrMsgIteratorClosed) {
					b.log.Warn("event feed interrupted; resuming", zap.Error(err))
				}
				break
			}
			md, err := msg.Metadata()
			if err != nil || !feedSubject(msg.Subject()) {
				continue
			}
			f.publish(b.event(ctx, md.Sequence.Stream, md.Timestamp, msg.Subject(), msg.Data(), events.Header(msg.Headers())))
		}
		close(stop)
		it.Stop()
		b.dropConsumer(cons) // the next round reads through a new one
		if idled.Load() && f.deactivate() {
			b.log.Debug("event feed stopped: no subscribers")
		}
	}
	return nil
}

func (b *Broker) retryAfter(ctx context.Context, what string, err error) {
	if ctx.Err() != nil {
		return
	}
	b.log.Warn(what+"; retrying", zap.Error(err))
	select {
	case <-ctx.Done():
	case <-time.After(time.Second):
	}
}

// ErrFellBehind: an event subscriber did not keep up and was dropped; it may
// subscribe again after its last event.
var ErrFellBehind = errors.New("event subscriber fell behind")

// Live, as Subscribe's after, follows the events stored from now on.
const Live = ^uint64(0)

// LastSeq returns the stream sequence of the last event stored: a
// subscription after it follows what is stored from this moment on, which a
// caller can say has begun before Subscribe is called.
func (b *Broker) LastSeq(ctx context.Context) (uint64, error) {
	info, err := b.res.stream.Info(ctx)
	if err != nil {
		return 0, fmt.Errorf("stream info: %w", err)
	}
	return info.State.LastSeq, nil
}

// Subscribe calls deliver with the events matching f stored after stream
// sequence after (0: from the stream's start; Live: from now on), in stream order, with no gap and no
// duplicate, until ctx ends or deliver returns an error. Events after a
// resumption point still in the stream come first, then the live ones. Each
// call of deliver gets what is ready at once, at least one event, so a
// writer can send them together. It returns ErrFellBehind if the caller fell
// more than the feed's ring behind the live events.
func (b *Broker) Subscribe(ctx context.Context, after uint64, f EventFilter, deliver func([]*Event) error) error {
	if after == Live {
		// From now on: after what the stream holds now.
		info, err := b.res.stream.Info(ctx)
		if err != nil {
			return fmt.Errorf("stream info: %w", err)
		}
		after = info.State.LastSeq
	}
	sub, pos := b.feed.join(&f)
	defer b.feed.leave(sub)
	start, err := b.feed.running(ctx)
	if err != nil {
		return err
	}
	// What was stored before the subscription, or before the feed's run
	// began if it began after: the live feed has the rest (and whatever it
	// holds up to that sequence is skipped).
	info, err := b.res.stream.Info(ctx)
	if err != nil {
		return fmt.Errorf("stream info: %w", err)
	}
	upto := max(info.State.LastSeq, start-1)
	last := after
	if after < upto {
		var batch []*Event
		if err := b.scan(ctx, after+1, time.Time{}, upto, allSubjects, func(e *Event) (bool, error) {
			last = e.Seq
			if f.match(e) {
				if batch = append(batch, e); len(batch) == feedBatch {
					err := deliver(batch)
					batch = nil
					return err == nil, err
				}
			}
			return true, nil
		}); err != nil {
			return err
		}
		if len(batch) > 0 {
			if err := deliver(batch); err != nil {
				return err
			}
		}
	}
	last = max(last, upto)
	batch := make([]*Event, 0, feedBatch)
	for {
		var ok bool
		batch, pos, ok = b.feed.read(pos, last, &f, batch[:0])
		if !ok {
			return ErrFellBehind
		}
		if len(batch) > 0 {
			last = batch[len(batch)-1].Seq
			if err := deliver(batch); err != nil {
				return err
			}
		}
		if pos < b.feed.end() {
			continue // more than one batch was waiting
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-sub.notify:
		}
	}
}

// scanIdle is how long the server keeps a scan's consumer without reads: a
// scan deletes its consumer when it ends, so this only bounds what a broker
// that died mid-scan leaves behind.
const scanIdle = 30 * time.Second

// dropConsumer deletes the server's consumer behind the ordered consumer of a
// finished read. Left to expire (after five minutes, by default), each read
// would hold one of the stream's consumers (the server allows 1,000 by
// default), and a burst of audit queries or resumed subscriptions would then
// get every new consumer refused, the broker's and the channels' included.
func (b *Broker) dropConsumer(cons jetstream.Consumer) {
	info := cons.CachedInfo()
	if info == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := b.res.stream.DeleteConsumer(ctx, info.Name); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
		b.log.Debug("delete a read's consumer; it expires by itself", zap.String("consumer", info.Name), zap.Error(err))
	}
}

// scan reads the stored events on subjects (nil: every feed subject) with
// sequences from first to last
// (0: to the end of the stream as it is when the scan starts), in order, until
// visit says stop. With since set, it starts at the first event stored at or
// after since, if that comes after first.
func (b *Broker) scan(ctx context.Context, first uint64, since time.Time, last uint64, subjects []string, visit func(*Event) (bool, error)) error {
	if last == 0 {
		info, err := b.res.stream.Info(ctx)
		if err != nil {
			return fmt.Errorf("stream info: %w", err)
		}
		last = info.State.LastSeq
	}
	if first > last {
		return nil
	}
	cc := jetstream.OrderedConsumerConfig{FilterSubjects: subjects, DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: max(first, 1)}
	if !since.IsZero() && first <= 1 {
		cc.DeliverPolicy, cc.OptStartSeq, cc.OptStartTime = jetstream.DeliverByStartTimePolicy, 0, &since
	}
	cc.InactiveThreshold = scanIdle
	cons, err := b.res.stream.OrderedConsumer(ctx, cc)
	if err != nil {
		return fmt.Errorf("read the stream: %w", err)
	}
	defer b.dropConsumer(cons)
	for {
		batch, err := cons.Fetch(256, jetstream.FetchMaxWait(time.Second))
		if err != nil {
			return fmt.Errorf("read the stream: %w", err)
		}
		got := 0
		for msg := range batch.Messages() {
			got++
			md, err := msg.Metadata()
			if err != nil {
				continue
			}
			if md.Sequence.Stream > last {
				return nil
			}
			if !feedSubject(msg.Subject()) {
				if md.Sequence.Stream == last || md.NumPending == 0 {
					return nil
				}
				continue
			}
			more, err := visit(b.event(ctx, md.Sequence.Stream, md.Timestamp, msg.Subject(), msg.Data(), events.Header(msg.Headers())))
			if err != nil || !more {
				return err
			}
			if md.Sequence.Stream == last || md.NumPending == 0 {
				return nil
			}
		}
		if err := batch.Error(); err != nil && !errors.Is(err, jetstream.ErrNoMessages) {
			return fmt.Errorf("read the stream: %w", err)
		}
		if got == 0 {
			return nil // nothing more on these subjects up to the end
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
}
