package terminal

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	tea "github.com/charmbracelet/bubbletea"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/assent-dev/assent/pkg/events"
	"github.com/assent-dev/assent/pkg/handler"
)

// A feed turns the stream's pending, escalated and decided events into
// messages for the screen. Until it has caught up with the stream it only
// collects (so that the requests decided long ago never flash by), then it
// hands over what is still pending as one snapshot, and after that every
// event as it comes. Its handler never blocks on the screen: a forwarding
// goroutine takes what is queued, so the consumer keeps up while the user
// is in their editor.
type feed struct {
	log   *zap.Logger
	codec events.Codec
	// trusted, if set, are the broker's decision keys.
	trusted *events.TrustedKeys

	mu       sync.Mutex
	live     bool
	replay   map[string]*noticeMsg // pending, while catching up
	decided  map[string]bool       // decided, while catching up
	queue    []tea.Msg
	wake     chan struct{}
	lastFail time.Time
}

// noticeMsg is a pending or escalated event.
type noticeMsg struct {
	notice handler.Notice
	seq    uint64 // stream sequence of the first notice of the request
	// escalation is true for an escalated event: it updates a request
	// rather than adding one.
	escalation bool
	// history is what the record said of requests like it, from the
	// pending event (handler.Notice does not carry it); nil when the
	// broker had not read the record, and in escalations.
	history *events.History
}

// decidedMsg is a request's decision.
type decidedMsg struct {
	id string
	d  handler.Decision
}

// snapshotMsg is every request pending when the feed caught up, oldest
// first.
type snapshotMsg []noticeMsg

// batchMsg is what the feed queued since it last delivered.
type batchMsg []tea.Msg

// feedErrMsg reports trouble reading the stream; the consumer retries.
type feedErrMsg struct{ err error }

func newFeed(log *zap.Logger, codec events.Codec) *feed {
	return &feed{log: log, codec: codec, replay: map[string]*noticeMsg{}, decided: map[string]bool{}, wake: make(chan struct{}, 1)}
}

// consumer opens an ordered consumer on the stream over the pending events
// of agents (all when empty) and every decision, from start on.
func (f *feed) consumer(ctx context.Context, js jetstream.JetStream, agents []string, start time.Time) (jetstream.Consumer, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, setupTimeout)
		defer cancel()
	}
	filters := []string{events.PendingPrefix + "*"}
	if len(agents) > 0 {
		filters = filters[:0]
		for _, a := range agents {
			filters = append(filters, events.PendingPrefix+a)
		}
	}
	filters = append(filters, events.DecisionPrefix+"*")
	return js.OrderedConsumer(ctx, events.StreamName, jetstream.OrderedConsumerConfig{
		FilterSubjects: filters,
		DeliverPolicy:  jetstream.DeliverByStartTimePolicy,
		OptStartTime:   &start,
	})
}

// handle reads one message of the stream.
func (f *feed) handle(msg jetstream.Msg) {
	md, err := msg.Metadata()
	if err != nil {
		f.log.Warn("stream message without metadata", zap.String("subject", msg.Subject()), zap.Error(err))
		return
	}
	m := f.decode(msg, md.Sequence.Stream)
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.live {
		if m != nil {
			f.push(m)
		}
		return
	}
	switch m := m.(type) {
	case *noticeMsg:
		f.collect(m)
	case decidedMsg:
		delete(f.replay, m.id)
		f.decided[m.id] = true
	}
	if md.NumPending == 0 {
		f.goLive()
	}
}

// decode reads a pending, escalated or decided event; nil for anything else,
// which is logged.
func (f *feed) decode(msg jetstream.Msg, seq uint64) tea.Msg {
	log := f.log.With(zap.String("subject", msg.Subject()), zap.Uint64("seq", seq))
	e, err := f.codec.Decode(events.Header(msg.Headers()), msg.Data())
	if err != nil {
		log.Warn("ignoring a malformed event", zap.Error(err))
		return nil
	}
	switch e.Type() {
	case events.TypePending, events.TypeEscalated:
		n, _, err := handler.NoticeOf(&e)
		if err != nil {
			log.Warn("ignoring a malformed "+e.Type()+" event", zap.Error(err))
			return nil
		}
		m := &noticeMsg{seq: seq, escalation: e.Type() == events.TypeEscalated, notice: n}
		if !m.escalation {
			if p, err := events.DecodePending(&e); err == nil {
				m.history = p.History
			}
		}
		return m
	case events.TypeDecided:
		d, err := events.DecodeDecided(&e)
		if err != nil {
			log.Warn("ignoring a malformed decided event", zap.Error(err))
			return nil
		}
		id := strings.TrimPrefix(msg.Subject(), events.DecisionPrefix)
		if d.RequestID != id {
			log.Warn("ignoring a decision about another request", zap.String("request_id", d.RequestID))
			return nil
		}
		if err := d.VerifyArgs(); err != nil {
			log.Warn("ignoring a decision that fails verification", zap.Error(err))
			return nil
		}
		if f.trusted != nil {
			if _, err := f.trusted.Verify(&e); err != nil {
				log.Warn("ignoring a decision no trusted key signed", zap.String("source", e.Source()), zap.Error(err))
				return nil
			}
		}
		return decidedMsg{id: id, d: d}
	}
	return nil
}

// collect adds or updates a request while catching up.
func (f *feed) collect(m *noticeMsg) {
	id := m.notice.ID
	if f.decided[id] {
		return
	}
	if old, ok := f.replay[id]; ok {
		merge(&old.notice, m)
		if m.history != nil {
			old.history = m.history
		}
		return
	}
	f.replay[id] = m
}

// merge applies a later notice of a request to its notice: an escalation
// moves the deadline and level, and names whom it notified.
func merge(n *handler.Notice, m *noticeMsg) {
	if m.notice.Level < n.Level {
		return // stale
	}
	n.Deadline, n.Level = m.notice.Deadline, m.notice.Level
	if m.notice.Terms != nil {
		n.Terms = m.notice.Terms
	}
	if m.notice.Rule != "" {
		n.Rule = m.notice.Rule
	}
	if !m.escalation {
		n.Approvers = m.notice.Approvers
	}
}

// caughtUp marks the feed live when the stream held nothing to replay.
func (f *feed) caughtUp() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.live {
		f.goLive()
	}
}

// goLive hands over the snapshot; from now on events pass through.
func (f *feed) goLive() {
	snap := make(snapshotMsg, 0, len(f.replay))
	for _, m := range f.replay {
		snap = append(snap, *m)
	}
	sort.Slice(snap, func(i, j int) bool { return snap[i].seq < snap[j].seq })
	f.live, f.replay, f.decided = true, nil, nil
	f.push(snap)
}

// fail reports a consumer error; the ordered consumer recovers by itself, so
// repeats within a few seconds are not reported again.
func (f *feed) fail(err error) {
	f.log.Warn("reading the stream", zap.Error(err))
	f.mu.Lock()
	defer f.mu.Unlock()
	if time.Since(f.lastFail) < 5*time.Second {
		return
	}
	f.lastFail = time.Now()
	f.push(feedErrMsg{fmt.Errorf("reading the stream: %w", err)})
}

// push queues m for the screen. Call with f.mu held.
func (f *feed) push(m tea.Msg) {
	f.queue = append(f.queue, m)
	select {
	case f.wake <- struct{}{}:
	default:
	}
}

// forward delivers what is queued, in order, until ctx ends.
func (f *feed) forward(ctx context.Context, send func(tea.Msg)) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-f.wake:
		}
		f.mu.Lock()
		q := f.queue
		f.queue = nil
		f.mu.Unlock()
		if len(q) > 0 {
			send(batchMsg(q))
		}
	}
}
