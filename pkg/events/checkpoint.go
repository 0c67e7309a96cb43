package events

import (
	"encoding/base64"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// The stream's record proves itself: every stored message is a link of a
// hash chain over the stream's sequence (docs/protocol.md, "The chained
// record"), and the broker stores the chain's head every few seconds as a
// checkpoint, signed with its decision key. A message deleted, or a stream
// rewritten, no longer matches the checkpoints after it; a stream cut
// short loses its newest checkpoints, which a witness outside the broker's
// reach keeps.

// TypeCheckpoint is a checkpoint of the chained record, published by the
// broker on CheckpointSubject.
const TypeCheckpoint = "dev.assent.audit.checkpoint"

// CheckpointSubject is where the broker stores checkpoints: one subject, so
// that the last one is a direct get away and each is written only if the
// one before it is still the last (Nats-Expected-Last-Subject-Sequence).
const CheckpointSubject = "assent.audit.checkpoint"

// Checkpoint is the data of a checkpoint: the chain's head over the
// stream's sequences From to Upto.
type Checkpoint struct {
	// From and Upto are the first and the last stream sequence the chain
	// covers since the checkpoint before (From is its Upto plus one, or the
	// chain's start).
	From uint64 `json:"from"`
	Upto uint64 `json:"upto"`
	// Prev is the chain's head at From - 1, as the checkpoint before gave
	// it ("sha256:" and 64 hex digits), or that of no message at all for
	// the chain's start (ChainStart).
	Prev string `json:"prev"`
	// Head is the chain's head at Upto.
	Head string `json:"head"`
	// Messages is how many sequences from From to Upto hold a message (the
	// others were deleted, or expired, before the checkpoint was made).
	Messages uint64 `json:"messages"`
	// LastTime is when the last message it covers was stored (RFC 3339,
	// UTC, as Go's time.RFC3339Nano writes it), and PrevTime the LastTime of
	// the checkpoint before ("" at the chain's start): a reader can tell
	// messages removed by the stream's age limit from messages removed
	// early, even once the checkpoint before is gone too.
	LastTime string `json:"last_time"`
	PrevTime string `json:"prev_time,omitempty"`
}

// Validate reports every problem with c at once.
func (c *Checkpoint) Validate() error {
	var errs []string
	if c.From == 0 || c.Upto < c.From {
		errs = append(errs, fmt.Sprintf("from %d, upto %d: want 1 <= from <= upto", c.From, c.Upto))
	}
	for name, h := range map[string]string{"prev": c.Prev, "head": c.Head} {
		if !validDigest(h) {
			errs = append(errs, fmt.Sprintf("%s %q: want sha256: and 64 lower-case hex digits", name, truncate(h, 80)))
		}
	}
	if c.Messages > c.Upto-c.From+1 {
		errs = append(errs, fmt.Sprintf("messages %d: more than the %d sequences covered", c.Messages, c.Upto-c.From+1))
	}
	for name, v := range map[string]string{"last_time": c.LastTime, "prev_time": c.PrevTime} {
		if v == "" && name == "prev_time" {
			continue
		}
		if t, err := time.Parse(time.RFC3339Nano, v); err != nil || t.UTC().Format(time.RFC3339Nano) != v {
			errs = append(errs, fmt.Sprintf("%s %q: want UTC RFC 3339, as in 2025-01-02T03:04:05.25Z", name, truncate(v, 60)))
		}
	}
	if len(errs) > 0 {
		return fieldErr("data", fmt.Errorf("%w: %s", ErrBadValue, strings.Join(errs, "; ")))
	}
	return nil
}

func validDigest(s string) bool {
	hexed, ok := strings.CutPrefix(s, "sha256:")
	if !ok || len(hexed) != 64 {
		return false
	}
	for _, r := range hexed {
		if !('0' <= r && r <= '9' || 'a' <= r && r <= 'f') {
			return false
		}
	}
	return true
}

// DecodeCheckpoint returns the data of a checkpoint event.
func DecodeCheckpoint(e *Event) (Checkpoint, error) { return DecodeData[Checkpoint](e, TypeCheckpoint) }

// CheckpointID is the event id of the checkpoint up to sequence upto: every
// replica that makes it makes the same one.
func CheckpointID(upto uint64) string { return "checkpoint-" + strconv.FormatUint(upto, 10) }

// CanonicalCheckpoint is the text a checkpoint's signature covers: nine
// lines joined by a line feed, with none after the last.
func CanonicalCheckpoint(eventID string, c Checkpoint) []byte {
	return []byte(strings.Join([]string{
		"assent-checkpoint-v1", eventID,
		strconv.FormatUint(c.From, 10), strconv.FormatUint(c.Upto, 10),
		c.Prev, c.Head, strconv.FormatUint(c.Messages, 10), c.LastTime, c.PrevTime,
	}, "\n"))
}

// SignCheckpoint signs e, a checkpoint event, and sets its
// SignatureAttribute.
func (s *Signer) SignCheckpoint(e *Event) error {
	c, err := DecodeCheckpoint(e)
	if err != nil {
		return err
	}
	sig, err := s.key.Sign(CanonicalCheckpoint(e.ID(), c))
	if err != nil {
		return fmt.Errorf("sign checkpoint: %w", err)
	}
	return e.Context.SetExtension(SignatureAttribute, signatureVersion+"."+s.public+"."+base64.RawURLEncoding.EncodeToString(sig))
}

// VerifyCheckpoint reads the data of e, a checkpoint event, and checks that
// a trusted key signed it; its errors are Verify's.
func (t *TrustedKeys) VerifyCheckpoint(e *Event) (Checkpoint, error) {
	key, sig, err := parseSignature(e)
	if err != nil {
		return Checkpoint{}, err
	}
	verifier, ok := t.keys[key]
	if !ok {
		return Checkpoint{}, fieldErr(SignatureAttribute, fmt.Errorf("%w: %s", ErrUntrustedKey, key))
	}
	c, err := DecodeCheckpoint(e)
	if err != nil {
		return Checkpoint{}, err
	}
	if err := verifier.Verify(CanonicalCheckpoint(e.ID(), c), sig); err != nil {
		return Checkpoint{}, fieldErr(SignatureAttribute, fmt.Errorf("%w: does not verify with %s", ErrBadSignature, key))
	}
	return c, nil
}
