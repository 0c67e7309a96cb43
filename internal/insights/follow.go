package insights

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/assent-dev/assent/pkg/events"
)

// Timing of Follow.
const (
	// callTimeout bounds each call to the server.
	callTimeout = 5 * time.Second
	// retryDelay is how long Follow waits after a failed call, doubled
	// up to maxRetryDelay while the stream's state cannot be read.
	retryDelay    = 500 * time.Millisecond
	maxRetryDelay = 5 * time.Second
	// idleCaughtUp is how long a reading behind the last sequence it was
	// told of may deliver nothing before it counts as caught up: the last
	// message may be gone since (a purge, retention).
	idleCaughtUp = 2 * time.Second
	// pullExpiry and pullHeartbeat: a consumer whose server went away is
	// noticed within two heartbeats and made again by nats.go.
	pullExpiry    = 2 * time.Second
	pullHeartbeat = time.Second
	// readerIdle is the inactive threshold of the reading's consumer: the
	// server deletes it that long after a follower that died stopped
	// pulling.
	readerIdle = 30 * time.Second
	// stallAfter is how long a reading may deliver nothing while the
	// stream holds more before Follow reads on with a new consumer.
	stallAfter = 10 * time.Second
	// dropTimeout bounds deleting the consumer when the reading stops, so
	// that a broker stopping without a server stops at once all the same.
	dropTimeout = time.Second
)

// ConsumerPrefix starts the names of the consumers Follow reads with (one
// per follower, and a new one each time nats.go makes it again).
const ConsumerPrefix = "insights-"

// Follow reads the stream from its first message (or after the last one
// agg has read) in order and adds every message to agg, until ctx ends; it
// returns nil then. It reads with an ordered consumer of its own, which
// nats.go makes again where the last one stopped after a disconnect, a
// server restart or missed heartbeats; should it end all the same, Follow
// makes a new one. It reads every subject and leaves out in the aggregator
// those it has no use for: a consumer filtered by several wildcards makes
// the server walk every subject of the stream (docs/architecture.md, "The
// audit log"), one per request.
//
// Before it reads, it asks for the stream's first and last sequences, so
// that agg's reports say how far it is; agg is caught up (MarkCaughtUp) once
// it has read the last one, or the server says nothing is left, or nothing
// came for idleCaughtUp. Every call to the server has a deadline of
// callTimeout.
func Follow(ctx context.Context, js jetstream.JetStream, stream string, agg *Aggregator, log *zap.Logger) error {
	if log == nil {
		log = zap.NewNop()
	}
	var last uint64
	for delay := retryDelay; ; delay = min(2*delay, maxRetryDelay) {
		cctx, cancel := context.WithTimeout(ctx, callTimeout)
		s, err := js.Stream(cctx, stream)
		cancel()
		if err == nil {
			st := s.CachedInfo().State
			last = st.LastSeq
			agg.Reading(st.FirstSeq, last)
			break
		}
		if ctx.Err() != nil {
			return nil
		}
		log.Warn("read the stream's state before following it; retrying", zap.String("stream", stream), zap.Duration("in", delay), zap.Error(err))
		if !sleep(ctx, delay) {
			return nil
		}
	}
	if last == 0 || agg.Through() >= last {
		agg.MarkCaughtUp()
	}
	var delivered atomic.Uint64
	var busy atomic.Bool
	var watching sync.Once
	var wg sync.WaitGroup
	done := make(chan struct{})
	defer wg.Wait()
	defer close(done)
	for ctx.Err() == nil {
		cctx, cancel := context.WithTimeout(ctx, callTimeout)
		cons, err := js.OrderedConsumer(cctx, stream, jetstream.OrderedConsumerConfig{
			NamePrefix:        ConsumerPrefix + events.NewID(),
			DeliverPolicy:     jetstream.DeliverByStartSequencePolicy,
			OptStartSeq:       agg.Through() + 1,
			InactiveThreshold: readerIdle,
		})
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				log.Warn("follow the stream; retrying", zap.String("stream", stream), zap.Error(err))
				sleep(ctx, retryDelay)
			}
			continue
		}
		cc, err := cons.Consume(func(msg jetstream.Msg) {
			busy.Store(true)
			defer busy.Store(false)
			delivered.Add(1)
			md, err := msg.Metadata()
			if err != nil {
				return
			}
			agg.Add(&jetstream.RawStreamMsg{Subject: msg.Subject(), Sequence: md.Sequence.Stream, Header: msg.Headers(), Data: msg.Data(), Time: md.Timestamp})
			if !agg.CaughtUp() && (md.Sequence.Stream >= last || md.NumPending == 0) {
				agg.MarkCaughtUp()
				log.Info("read the record", zap.Uint64("sequence", md.Sequence.Stream))
			}
		}, jetstream.PullMaxMessages(1024), jetstream.PullExpiry(pullExpiry), jetstream.PullHeartbeat(pullHeartbeat),
			jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
				log.Debug("following the stream", zap.Error(err))
			}))
		if err != nil {
			drop(js, stream, cons, log)
			if ctx.Err() == nil {
				log.Warn("follow the stream; retrying", zap.String("stream", stream), zap.Error(err))
				sleep(ctx, retryDelay)
			}
			continue
		}
		// Nothing delivered for a while counts from the first reading on.
		watching.Do(func() {
			if !agg.CaughtUp() {
				wg.Go(func() { watchIdle(done, agg, &delivered, &busy, log) })
			}
		})
		stalled(ctx, js, stream, agg, cc, &delivered, log)
		cc.Stop()
		// A message being added finishes first (bounded: a closed
		// connection may not say so).
		select {
		case <-cc.Closed():
		case <-time.After(time.Second):
		}
		drop(js, stream, cons, log)
	}
	return nil
}

// stalled returns when ctx ends, when the reading cc ends, or when it
// stalls: nothing delivered for stallAfter while the stream holds messages
// past what agg has read. Under load a server can let an ordered consumer
// go (missed heartbeats, a reset that timed out) without nats.go closing
// the reading; Follow then reads on with a new consumer.
func stalled(ctx context.Context, js jetstream.JetStream, stream string, agg *Aggregator, cc jetstream.ConsumeContext, delivered *atomic.Uint64, log *zap.Logger) {
	t := time.NewTicker(stallAfter)
	defer t.Stop()
	seen := delivered.Load()
	for {
		select {
		case <-ctx.Done():
			return
		case <-cc.Closed():
			log.Warn("the stream's reading ended; reading on from where it stopped", zap.Uint64("through", agg.Through()))
			return
		case <-t.C:
		}
		now := delivered.Load()
		if now != seen {
			seen = now
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, callTimeout)
		s, err := js.Stream(cctx, stream)
		cancel()
		if err == nil && s.CachedInfo().State.LastSeq > agg.Through() {
			log.Warn("the stream's reading stalled; reading on from where it stopped with a new consumer", zap.Uint64("through", agg.Through()), zap.Uint64("last", s.CachedInfo().State.LastSeq))
			return
		}
	}
}

// watchIdle marks agg caught up once nothing was delivered for
// idleCaughtUp, none being added, until done is closed or agg is caught up.
func watchIdle(done <-chan struct{}, agg *Aggregator, delivered *atomic.Uint64, busy *atomic.Bool, log *zap.Logger) {
	t := time.NewTicker(idleCaughtUp)
	defer t.Stop()
	seen := delivered.Load()
	for !agg.CaughtUp() {
		select {
		case <-done:
			return
		case <-t.C:
		}
		now := delivered.Load()
		if now == seen && !busy.Load() {
			agg.MarkCaughtUp()
			log.Info("read the record (nothing more came)", zap.Uint64("sequence", agg.Through()))
			return
		}
		seen = now
	}
}

// drop deletes the reading's consumer, which would otherwise stay until
// its inactive threshold.
func drop(js jetstream.JetStream, stream string, cons jetstream.Consumer, log *zap.Logger) {
	info := cons.CachedInfo()
	if info == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), dropTimeout)
	defer cancel()
	if err := js.DeleteConsumer(ctx, stream, info.Name); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
		log.Debug("delete the reading's consumer; it expires by itself", zap.String("consumer", info.Name), zap.Error(err))
	}
}

// sleep waits d, or until ctx ends; it reports whether ctx is still live.
func sleep(ctx context.Context, d time.Duration) bool {
	select {
	case <-ctx.Done():
		return false
	case <-time.After(d):
		return true
	}
}
