package broker

import (
	"context"
	"math/rand/v2"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/assent-dev/assent/internal/chain"
	"github.com/assent-dev/assent/pkg/events"
)

// checkpoints stores the chained record's checkpoints (internal/chain):
// every CheckpointInterval, give or take a tenth, a replica reads what the
// stream stored since the last checkpoint and stores the next one, signed
// with the decision key, if the last is still the last on its subject.
// Every replica tries; the first stored wins and the others find their
// publish refused, as for decisions. A replica that finds a checkpoint
// younger than half the interval leaves the round to it.
func (b *Broker) checkpoints(ctx context.Context) error {
	every := b.cfg.CheckpointInterval
	if every <= 0 {
		return nil
	}
	for {
		jitter := time.Duration(rand.Int64N(int64(every)/5+1)) - every/10
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(every + jitter):
		}
		// A round may read a whole interval's messages; it has the
		// interval to do it.
		rctx, cancel := context.WithTimeout(ctx, every)
		err := b.checkpoint(rctx, every/2)
		cancel()
		if err != nil && ctx.Err() == nil {
			b.log.Warn("checkpoint of the chained record not stored; trying again next round", zap.Error(err))
		}
	}
}

// checkpoint stores the next checkpoint, unless one younger than fresh is
// the last and covered the stream then; and goes on while each stops at
// chain.MaxSpan, until ctx ends.
func (b *Broker) checkpoint(ctx context.Context, fresh time.Duration) error {
	s, err := b.js.Stream(ctx, StreamName)
	if err != nil {
		return err
	}
	if last, found, err := chain.LastCheckpoint(ctx, s); err != nil {
		return err
	} else if found && time.Since(last.Event.Time()) < fresh && !chain.Cut(last.Checkpoint) {
		return nil
	}
	for {
		c, after, ok, err := chain.NextCheckpoint(ctx, b.js, StreamName)
		if err != nil || !ok {
			return err
		}
		msg, err := chain.Message(c, b.source, b.signer)
		if err != nil {
			return err
		}
		_, err = b.publish(ctx, msg, jetstream.WithExpectLastSequencePerSubject(after), jetstream.WithMsgID(events.CheckpointID(c.Upto)))
		switch {
		case isWrongLastSeq(err):
			return nil // another replica stored it first
		case err != nil:
			return err
		}
		b.log.Debug("checkpoint stored", zap.Uint64("from", c.From), zap.Uint64("upto", c.Upto), zap.String("head", c.Head))
		if !chain.Cut(c) {
			return nil
		}
	}
}
