package replay

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/assent-dev/assent/pkg/policy"
)

// ErrNoStream: the server, in the connection's account, holds no stream of
// that name.
var ErrNoStream = errors.New("no such stream")

// stallAfter is how long a read waits for the next message while the
// server says there are more, before it gives up.
const stallAfter = 30 * time.Second

// Run replays p over every message the stream holds when it starts, read in
// order with an ordered consumer of its own (deleted when done), and
// returns the report. The stream is read from its first message, so that
// remembered choices and limits stand as they did; with cfg.Until it stops
// once every request of the window is decided. If there is no such stream,
// the error wraps ErrNoStream.
func Run(ctx context.Context, js jetstream.JetStream, stream string, p *policy.Policy, cfg Config) (*Report, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s, err := js.Stream(ctx, stream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, fmt.Errorf("%w: %s", ErrNoStream, stream)
	}
	if err != nil {
		return nil, fmt.Errorf("stream %s: %w", stream, err)
	}
	info := s.CachedInfo()
	if cfg.Retention == 0 {
		cfg.Retention = info.Config.MaxAge
	}
	r := New(p, cfg)
	r.rep.Stream = stream
	last := info.State.LastSeq
	r.last = last
	if info.State.Msgs == 0 {
		return r.Report(), nil
	}
	cons, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
		DeliverPolicy:     jetstream.DeliverAllPolicy,
		InactiveThreshold: 30 * time.Second,
	})
	if err != nil {
		return nil, fmt.Errorf("read stream %s: %w", stream, err)
	}
	defer drop(s, cons)

	var (
		mu       sync.Mutex // r, between the consumer's callback and this goroutine
		finished atomic.Bool
		read     atomic.Uint64
		done     = make(chan struct{})
		once     sync.Once
	)
	finish := func() {
		finished.Store(true)
		once.Do(func() { close(done) })
	}
	cc, err := cons.Consume(func(msg jetstream.Msg) {
		if finished.Load() {
			return
		}
		md, err := msg.Metadata()
		if err != nil {
			return
		}
		seq := md.Sequence.Stream
		if seq > last {
			finish()
			return
		}
		mu.Lock()
		r.Apply(Message{Seq: seq, Subject: msg.Subject(), Header: msg.Headers(), Data: msg.Data(), Time: md.Timestamp})
		stop := r.Done()
		mu.Unlock()
		read.Add(1)
		if seq >= last || md.NumPending == 0 || stop {
			finish()
		}
	}, jetstream.PullMaxMessages(2048), jetstream.ConsumeErrHandler(func(jetstream.ConsumeContext, error) {}))
	if err != nil {
		return nil, fmt.Errorf("read stream %s: %w", stream, err)
	}
	defer func() {
		cc.Stop()
		select {
		case <-cc.Closed():
		case <-time.After(time.Second):
		}
	}()

	tick := time.NewTicker(2 * time.Second)
	defer tick.Stop()
	seen, idle := uint64(0), time.Duration(0)
	for waiting := true; waiting; {
		select {
		case <-done:
			waiting = false
		case <-ctx.Done():
			finished.Store(true)
			return nil, ctx.Err()
		case <-tick.C:
			if n := read.Load(); n != seen {
				seen, idle = n, 0
				continue
			}
			idle += 2 * time.Second
			// Nothing came: the rest may be gone (removed by age), or the
			// server slow to answer, which must not pass for the end.
			ci, err := cons.Info(ctx)
			if err == nil && ci.NumPending == 0 {
				finish()
				waiting = false
				continue
			}
			if idle >= stallAfter {
				finished.Store(true)
				if err != nil {
					return nil, fmt.Errorf("read stream %s: nothing came for %s: %w", stream, stallAfter, err)
				}
				return nil, fmt.Errorf("read stream %s: nothing came for %s though %d messages are there: try again", stream, stallAfter, ci.NumPending)
			}
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if cfg.Progress != nil {
		cfg.Progress(r.progress())
	}
	return r.Report(), nil
}

// drop deletes a read's consumer; left alone it goes after its inactive
// threshold.
func drop(s jetstream.Stream, cons jetstream.Consumer) {
	info := cons.CachedInfo()
	if info == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = s.DeleteConsumer(ctx, info.Name)
}
