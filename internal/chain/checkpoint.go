package chain

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/assent-dev/assent/pkg/events"
)

// Last is the last checkpoint of stream: its data, event, and stream
// sequence; found is false while the stream has none.
type Last struct {
	Seq        uint64
	Checkpoint events.Checkpoint
	Event      *events.Event
}

// LastCheckpoint reads stream's last checkpoint.
func LastCheckpoint(ctx context.Context, s jetstream.Stream) (last Last, found bool, err error) {
	msg, err := s.GetLastMsgForSubject(ctx, events.CheckpointSubject)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return Last{}, false, nil
	}
	if err != nil {
		return Last{}, false, fmt.Errorf("read the last checkpoint: %w", err)
	}
	e, err := events.Decode(msg.Header, msg.Data)
	if err != nil {
		return Last{}, false, fmt.Errorf("the last checkpoint (stream sequence %d): %w", msg.Sequence, err)
	}
	c, err := events.DecodeCheckpoint(&e)
	if err != nil {
		return Last{}, false, fmt.Errorf("the last checkpoint (stream sequence %d): %w", msg.Sequence, err)
	}
	return Last{Seq: msg.Sequence, Checkpoint: c, Event: &e}, true, nil
}

// MaxSpan is the most sequences one checkpoint covers, so that a round
// after a long time without one (an upgrade onto a stream of a month, a
// broker that was down) reads a bounded part of the stream: the next
// checkpoints cover the rest, one round each, and Cut tells a maker to go on.
var MaxSpan uint64 = 100_000

// Cut reports whether c stopped at MaxSpan, before the stream's end.
func Cut(c events.Checkpoint) bool { return c.Upto-c.From+1 >= MaxSpan }

// NextCheckpoint makes the checkpoint that follows stream's last one, up to
// the stream's last message now, or MaxSpan sequences; after is the stream
// sequence of the last one (0 if none), which the new one must follow on
// its subject. ok is false when nothing but the last checkpoint itself was
// stored since.
func NextCheckpoint(ctx context.Context, js jetstream.JetStream, stream string) (c events.Checkpoint, after uint64, ok bool, err error) {
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return c, 0, false, fmt.Errorf("stream %s: %w", stream, err)
	}
	state := s.CachedInfo().State
	last, found, err := LastCheckpoint(ctx, s)
	if err != nil {
		return c, 0, false, err
	}
	prev, from := Start, state.FirstSeq
	if found {
		if prev, err = Parse(last.Checkpoint.Head); err != nil {
			return c, 0, false, err
		}
		from, after = last.Checkpoint.Upto+1, last.Seq
	}
	c.PrevTime = last.Checkpoint.LastTime
	if from == 0 {
		from = 1
	}
	upto := state.LastSeq
	if upto < from || found && upto == last.Seq && from == last.Seq {
		return c, after, false, nil
	}
	upto = min(upto, from+MaxSpan-1)
	c.From, c.Upto, c.Prev = from, upto, prev.String()
	head := prev
	var lastTime time.Time
	err = Walk(ctx, js, stream, from, upto, func(seq uint64, m *Msg) error {
		head = Next(head, seq, m)
		if m != nil {
			c.Messages++
			lastTime = m.Time
		}
		return nil
	})
	if err != nil {
		return c, after, false, err
	}
	c.Head = head.String()
	if lastTime.IsZero() {
		lastTime = state.LastTime
	}
	c.LastTime = lastTime.UTC().Format(time.RFC3339Nano)
	return c, after, true, nil
}

// Message is the message that stores c: a checkpoint event from source,
// signed by signer if set, with the id every replica gives it.
func Message(c events.Checkpoint, source string, signer *events.Signer) (*nats.Msg, error) {
	e, err := events.New(events.TypeCheckpoint, events.CheckpointID(c.Upto), source, c)
	if err != nil {
		return nil, err
	}
	if signer != nil {
		if err := signer.SignCheckpoint(&e); err != nil {
			return nil, err
		}
	}
	h, body, err := events.Encode(&e)
	if err != nil {
		return nil, err
	}
	return &nats.Msg{Subject: events.CheckpointSubject, Header: nats.Header(h), Data: body}, nil
}
