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
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

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

// feedSubjects are the subjects the feed and the audit log read: the
// contract's events and the broker's audit records, not its timers.
var feedSubjects = []string{
	events.RequestPrefix + "*", events.PendingPrefix + "*", events.ResponsePrefix + "*.*",
	events.CancelPrefix + "*", events.DecisionPrefix + "*", events.RejectionPrefix + "*",
	events.ShadowPrefix + "*",
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
	if e.RequestID != "" && (e.Agent == "" || e.Session == "") {
		if rec, _, ok := b.index.get(e.RequestID); ok {
			e.Agent, e.Session = rec.Request.Agent, rec.Request.Session
		} else if rec, err := b.load(ctx, e.RequestID); err == nil {
			e.Agent, e.Session = rec.Request.Agent, rec.Request.Session
		}
	}
	return e
}

// str returns the string field name of the event's data.
func (e *Event) str(name string) string {
	var s string
	_ = json.Unmarshal(e.data[name], &s)
	return s
}

// feed fans the stream's new events out to subscribers: one ordered consumer
// per replica, however many clients listen.
type feed struct {
	mu     sync.Mutex
	subs   map[*subscriber]struct{}
	seq    uint64 // the last sequence delivered
	notify chan struct{}
}

type subscriber struct {
	filter EventFilter
	ch     chan *Event
	lost   chan struct{} // closed when the subscriber fell behind and was dropped
}

// subscriberBuffer is how many events a subscriber may lag behind before it is
// dropped (it then resumes from its last event id).
const subscriberBuffer = 1024

func newFeed() *feed { return &feed{subs: make(map[*subscriber]struct{})} }

func (f *feed) add(s *subscriber) {
	f.mu.Lock()
	f.subs[s] = struct{}{}
	f.mu.Unlock()
}

func (f *feed) remove(s *subscriber) {
	f.mu.Lock()
	delete(f.subs, s)
	f.mu.Unlock()
}

// Subscribers counts the clients following the feed.
func (b *Broker) Subscribers() int {
	b.feed.mu.Lock()
	defer b.feed.mu.Unlock()
	return len(b.feed.subs)
}

func (f *feed) publish(e *Event) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.seq = e.Seq
	for s := range f.subs {
		if !s.filter.match(e) {
			continue
		}
		select {
		case s.ch <- e:
		default:
			delete(f.subs, s)
			close(s.lost)
		}
	}
}

// runFeed delivers new events to the feed's subscribers until ctx ends.
func (b *Broker) runFeed(ctx context.Context) error {
	for ctx.Err() == nil {
		info, err := b.res.stream.Info(ctx)
		if err != nil {
			b.retryAfter(ctx, "event feed: stream info", err)
			continue
		}
		start := info.State.LastSeq + 1
		b.feed.mu.Lock()
		if b.feed.seq != 0 {
			start = b.feed.seq + 1 // after a failure, no gap
		}
		b.feed.mu.Unlock()
		cons, err := b.res.stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
			FilterSubjects: feedSubjects, DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: start,
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
		go func() { <-ctx.Done(); it.Stop() }()
		for {
			msg, err := it.Next()
			if err != nil {
				if ctx.Err() == nil && !errors.Is(err, jetstream.ErrMsgIteratorClosed) {
					b.log.Warn("event feed interrupted; resuming", zap.Error(err))
				}
				break
			}
			md, err := msg.Metadata()
			if err != nil {
				continue
			}
			b.feed.publish(b.event(ctx, md.Sequence.Stream, md.Timestamp, msg.Subject(), msg.Data(), events.Header(msg.Headers())))
		}
		it.Stop()
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

// Subscribe calls deliver with every event matching f stored after stream
// sequence after (0: from now on), in stream order, with no gap and no
// duplicate, until ctx ends or deliver returns an error. Events after a
// resumption point still in the stream come first, then the live ones. It
// returns ErrFellBehind if the caller did not keep up with the live events.
func (b *Broker) Subscribe(ctx context.Context, after uint64, f EventFilter, deliver func(*Event) error) error {
	s := &subscriber{filter: f, ch: make(chan *Event, subscriberBuffer), lost: make(chan struct{})}
	b.feed.add(s)
	defer b.feed.remove(s)
	last := after
	if after > 0 {
		// What was stored before the subscription: everything up to the
		// stream's last sequence now; the live feed has the rest.
		info, err := b.res.stream.Info(ctx)
		if err != nil {
			return fmt.Errorf("stream info: %w", err)
		}
		if err := b.scan(ctx, after+1, time.Time{}, info.State.LastSeq, feedSubjects, func(e *Event) (bool, error) {
			if f.match(e) {
				if err := deliver(e); err != nil {
					return false, err
				}
			}
			last = e.Seq
			return true, nil
		}); err != nil {
			return err
		}
		last = max(last, info.State.LastSeq)
	}
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-s.lost:
			return ErrFellBehind
		case e := <-s.ch:
			if e.Seq <= last {
				continue
			}
			last = e.Seq
			if err := deliver(e); err != nil {
				return err
			}
		}
	}
}

// scan reads the stored events on subjects with sequences from first to last
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
	cons, err := b.res.stream.OrderedConsumer(ctx, cc)
	if err != nil {
		return fmt.Errorf("read the stream: %w", err)
	}
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
