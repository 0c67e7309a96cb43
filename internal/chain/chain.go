// Package chain makes the stream's record tamper-evident: a hash chain over
// the stream's sequence, whose head the broker stores every few seconds as
// a signed checkpoint (pkg/events, TypeCheckpoint); Verify walks a stream
// and checks it against its checkpoints, a witness's copies of them, and
// the decisions' signatures (docs/protocol.md, "The chained record").
//
// Each stream sequence is a link, whether it holds a message or not (one
// deleted or expired before its checkpoint was made):
//
//	head(s) = SHA-256("assent-chain-v1" | head(s-1) | seq | 1 | subject | time | headers | SHA-256(data))
//	head(s) = SHA-256("assent-chain-v1" | head(s-1) | seq | 0)                  (no message)
//
// where numbers are 8 bytes big-endian, strings their length (8 bytes)
// then their bytes, time the stored time in Unix nanoseconds, and headers
// the SHA-256 of the headers not named Nats-* (which the server sets or
// reads), sorted by name, each name with its values in order.
package chain

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Head is the chain's head after a sequence.
type Head [sha256.Size]byte

// Start is the head before the chain's first sequence.
var Start = Head(sha256.Sum256([]byte("assent-chain-v1 start")))

// String is h as checkpoints carry it: "sha256:" and 64 hex digits.
func (h Head) String() string { return "sha256:" + hex.EncodeToString(h[:]) }

// Parse reads a head written by String.
func Parse(s string) (Head, error) {
	var h Head
	hexed, ok := strings.CutPrefix(s, "sha256:")
	if !ok || len(hexed) != 2*len(h) || strings.ToLower(hexed) != hexed {
		return h, fmt.Errorf("chain head %q: want sha256: and 64 lower-case hex digits", s)
	}
	if _, err := hex.Decode(h[:], []byte(hexed)); err != nil {
		return h, fmt.Errorf("chain head %q: %w", s, err)
	}
	return h, nil
}

// Msg is a stored message as the chain takes it.
type Msg struct {
	Seq     uint64
	Subject string
	Header  nats.Header
	Data    []byte
	Time    time.Time
}

// Next is the head after seq, given the head before it and the message at
// seq, nil if there is none.
func Next(prev Head, seq uint64, m *Msg) Head {
	h := sha256.New()
	h.Write([]byte("assent-chain-v1"))
	h.Write(prev[:])
	writeUint(h, seq)
	if m == nil {
		h.Write([]byte{0})
		return Head(h.Sum(nil))
	}
	h.Write([]byte{1})
	writeString(h, m.Subject)
	writeUint(h, uint64(m.Time.UnixNano()))
	hd := headerDigest(m.Header)
	h.Write(hd[:])
	d := sha256.Sum256(m.Data)
	h.Write(d[:])
	return Head(h.Sum(nil))
}

func writeUint(h hash.Hash, n uint64) {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], n)
	h.Write(b[:])
}

func writeString(h hash.Hash, s string) {
	writeUint(h, uint64(len(s)))
	h.Write([]byte(s))
}

// headerDigest is the SHA-256 of hd's headers but those the server sets or
// reads (Nats-*), sorted by name.
func headerDigest(hd nats.Header) [sha256.Size]byte {
	names := make([]string, 0, len(hd))
	for k := range hd {
		if !strings.HasPrefix(strings.ToLower(k), "nats-") {
			names = append(names, k)
		}
	}
	slices.Sort(names)
	h := sha256.New()
	for _, k := range names {
		writeString(h, k)
		writeUint(h, uint64(len(hd[k])))
		for _, v := range hd[k] {
			writeString(h, v)
		}
	}
	return [sha256.Size]byte(h.Sum(nil))
}

// Transient reports whether a message with headers h is one the server
// removes on its own: a schedule (Nats-Schedule), which goes when it fires.
// The chain takes such a message as no message, whether it is still there
// or not, so that its going changes nothing. (A message with a time to
// live is not transient: the broker stores none, and one that goes is
// reported as gone.)
func Transient(h nats.Header) bool {
	return h.Get(jetstream.ScheduleHeader) != ""
}

// Walk calls f for each sequence of stream from from to upto, in order:
// with its message, or nil where there is none (or only a Transient one). It reads the stream once,
// through an ordered consumer; f's error stops it.
func Walk(ctx context.Context, js jetstream.JetStream, stream string, from, upto uint64, f func(seq uint64, m *Msg) error) error {
	if from == 0 {
		from = 1
	}
	if upto < from {
		return nil
	}
	cons, err := js.OrderedConsumer(ctx, stream, jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: from})
	if err != nil {
		return fmt.Errorf("read stream %s from %d: %w", stream, from, err)
	}
	next := from
	absentTo := func(end uint64) error {
		for ; next <= end && next <= upto; next++ {
			if err := f(next, nil); err != nil {
				return err
			}
		}
		return nil
	}
	for next <= upto {
		batch, err := cons.Fetch(1000, jetstream.FetchMaxWait(2*time.Second))
		if err != nil {
			return fmt.Errorf("read stream %s at %d: %w", stream, next, err)
		}
		got := 0
		for msg := range batch.Messages() {
			got++
			md, err := msg.Metadata()
			if err != nil {
				return fmt.Errorf("read stream %s at %d: %w", stream, next, err)
			}
			seq := md.Sequence.Stream
			if seq < next {
				continue
			}
			if err := absentTo(seq - 1); err != nil {
				return err
			}
			if seq > upto {
				return nil
			}
			m := &Msg{Seq: seq, Subject: msg.Subject(), Header: msg.Headers(), Data: msg.Data(), Time: md.Timestamp}
			if Transient(m.Header) {
				m = nil
			}
			if err := f(seq, m); err != nil {
				return err
			}
			next = seq + 1
			if md.NumPending == 0 {
				// Nothing after it now: what is left up to upto is gone.
				return absentTo(upto)
			}
		}
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) && !errors.Is(err, context.DeadlineExceeded) {
			return fmt.Errorf("read stream %s at %d: %w", stream, next, err)
		}
		if got == 0 {
			// Nothing came: either the stream holds nothing from next
			// on (the rest is gone), or its leader did not answer in
			// time (a busy or changing leader), which must not pass
			// for messages gone.
			info, err := cons.Info(ctx)
			if err != nil {
				return fmt.Errorf("read stream %s at %d: %w", stream, next, err)
			}
			if info.NumPending > 0 {
				return fmt.Errorf("read stream %s at %d: no message came in time though %d are there: try again", stream, next, info.NumPending)
			}
			return absentTo(upto)
		}
	}
	return nil
}
