package chain

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/assent-dev/assent/pkg/events"
)

// Witnessed is a checkpoint a witness kept outside the stream (Witness):
// the stream must still hold what it covers, or have dropped it for age.
type Witnessed struct {
	// Seq is the checkpoint's stream sequence.
	Seq uint64 `json:"seq"`
	// At is when the witness read it.
	At time.Time `json:"witnessed_at"`
	// Event is the checkpoint event, as stored (structured mode).
	Event json.RawMessage `json:"event"`
}

// Options are what Verify checks besides the chain itself.
type Options struct {
	// Keys are the decision keys trusted to sign checkpoints and
	// decisions; nil checks no signature (and says so).
	Keys *events.TrustedKeys
	// Witnessed are a witness's copies of checkpoints.
	Witnessed []Witnessed
	// Now is the time removals for age are judged at; zero: time.Now().
	Now time.Time
	// Progress, if set, is called now and then with the sequence reached.
	Progress func(seq, last uint64)
}

// Report is what Verify found.
type Report struct {
	// First and Last are the stream's first and last sequence.
	First, Last uint64
	// ProvenFrom and ProvenTo are the sequences the checkpoints prove, both
	// ends included; ProvenTo is 0 when none does.
	ProvenFrom, ProvenTo uint64
	// Checkpoints is how many checkpoints were checked.
	Checkpoints int
	// Decisions is how many decided events were read, Signed how many of
	// them a trusted key signed.
	Decisions, Signed int
	// Witnessed is how many witnessed checkpoints were checked.
	Witnessed int
	// Problems are signs of tampering: the record does not prove itself.
	Problems []string
	// Notes say what was not checked, and why.
	Notes []string
}

// OK reports whether the record proved itself.
func (r *Report) OK() bool { return len(r.Problems) == 0 }

func (r *Report) problem(format string, args ...any) {
	if len(r.Problems) < 100 {
		r.Problems = append(r.Problems, fmt.Sprintf(format, args...))
	} else if len(r.Problems) == 100 {
		r.Problems = append(r.Problems, "and more: fix or explain the above first")
	}
}

// stored is a checkpoint read from the stream.
type stored struct {
	seq uint64
	c   events.Checkpoint
	e   events.Event
}

// Verify reads stream whole and checks its chained record: each
// checkpoint's head against the chain the stream's messages make, each
// checkpoint against the one before, the checkpoints' and decisions'
// signatures (with o.Keys), that nothing younger than the stream's age
// limit was removed from its start, and that the stream still holds what a
// witness saw.
func Verify(ctx context.Context, js jetstream.JetStream, stream string, o Options) (*Report, error) {
	if o.Now.IsZero() {
		o.Now = time.Now()
	}
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return nil, fmt.Errorf("stream %s: %w", stream, err)
	}
	info := s.CachedInfo()
	r := &Report{First: info.State.FirstSeq, Last: info.State.LastSeq}
	if r.Last == 0 {
		r.Notes = append(r.Notes, "the stream is empty")
		return r, nil
	}

	// The checkpoints first: they say where the chain starts and what it
	// must be at.
	var cps []stored
	err = Walk(ctx, js, stream, r.First, r.Last, func(seq uint64, m *Msg) error {
		if m == nil || m.Subject != events.CheckpointSubject {
			return nil
		}
		e, err := events.Decode(events.Header(m.Header), m.Data)
		if err != nil {
			r.problem("stream sequence %d: a message on %s that is not an event: %v", seq, events.CheckpointSubject, err)
			return nil
		}
		c, err := events.DecodeCheckpoint(&e)
		if err != nil {
			r.problem("stream sequence %d: a malformed checkpoint: %v", seq, err)
			return nil
		}
		cps = append(cps, stored{seq: seq, c: c, e: e})
		return nil
	})
	if err != nil {
		return nil, err
	}
	r.checkCheckpoints(cps, o.Keys)
	if len(cps) == 0 {
		r.Notes = append(r.Notes, "the stream holds no checkpoint: nothing proves it (a broker stores one every --checkpoint-interval)")
	}

	// Where the chain can start: at the first checkpoint whose range the
	// stream still holds whole (or at the stream's start, for a chain that
	// starts there).
	startAt := -1
	for i, cp := range cps {
		if cp.c.From >= r.First {
			startAt = i
			break
		}
	}
	r.checkRemovals(cps, info.Config.MaxAge, o.Now)

	var witnessed []stored
	for _, w := range o.Witnessed {
		e, err := events.Decode(nil, w.Event)
		if err != nil {
			r.problem("a witnessed checkpoint (stream sequence %d) is not an event: %v", w.Seq, err)
			continue
		}
		c, err := events.DecodeCheckpoint(&e)
		if err != nil {
			r.problem("a witnessed checkpoint (stream sequence %d): %v", w.Seq, err)
			continue
		}
		witnessed = append(witnessed, stored{seq: w.Seq, c: c, e: e})
	}

	// The chain, from the start found, and what it must be at: the
	// checkpoints, and what a witness kept that the stream does not hold
	// as it was kept.
	want := map[uint64][]stored{} // upto -> checkpoints claiming a head there
	for _, cp := range cps {
		want[cp.c.Upto] = append(want[cp.c.Upto], cp)
	}
	for _, w := range witnessed {
		if !slices.ContainsFunc(want[w.c.Upto], func(cp stored) bool { return cp.seq == w.seq && cp.c == w.c }) {
			want[w.c.Upto] = append(want[w.c.Upto], w)
		}
	}
	if o.Keys == nil {
		r.Notes = append(r.Notes, "no trusted decision key given: the decisions' signatures were not checked")
	}
	recomputed := map[uint64]bool{} // the sequences whose head was compared
	if startAt >= 0 {
		first := cps[startAt]
		head, err := Parse(first.c.Prev)
		if err != nil {
			return nil, err
		}
		r.ProvenFrom = first.c.From
		// present counts the messages read; before, its value at each
		// checkpoint's start, to say how many of a range are gone.
		var present uint64
		before := map[uint64]uint64{}
		for _, cps := range want {
			for _, cp := range cps {
				before[cp.c.From] = 0
			}
		}
		gone := map[uint64]bool{} // the sequences walked that hold no message
		err = Walk(ctx, js, stream, first.c.From, r.Last, func(seq uint64, m *Msg) error {
			head = Next(head, seq, m)
			if m != nil {
				present++
			} else {
				gone[seq] = true
			}
			if _, ok := before[seq+1]; ok {
				before[seq+1] = present
			}
			recomputed[seq] = true
			for _, cp := range want[seq] {
				if cp.c.Head == head.String() {
					r.ProvenTo = max(r.ProvenTo, seq)
					continue
				}
				what := "a message in it was replaced, or the stream was made again"
				if held := present - before[cp.c.From]; cp.c.From >= first.c.From && held < cp.c.Messages {
					what = fmt.Sprintf("%d of the %d messages it counted are gone: deleted", cp.c.Messages-held, cp.c.Messages)
				}
				r.problem("the checkpoint at stream sequence %d does not match sequences %d to %d: %s (the chain there is %s, the checkpoint says %s)",
					cp.seq, cp.c.From, cp.c.Upto, what, head, cp.c.Head)
			}
			if m != nil && strings.HasPrefix(m.Subject, events.DecisionPrefix) {
				r.checkDecision(m, o.Keys, first.c.From, gone)
			}
			if o.Progress != nil && seq%10000 == 0 {
				o.Progress(seq, r.Last)
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
	} else if len(cps) > 0 {
		r.Notes = append(r.Notes, fmt.Sprintf("no checkpoint's range is whole in the stream (it starts at %d): the chain cannot be recomputed", r.First))
	}
	if r.ProvenTo == 0 {
		r.ProvenFrom = 0
	} else if r.ProvenTo < r.Last {
		r.Notes = append(r.Notes, fmt.Sprintf("stream sequences %d to %d come after the last checkpoint: the next one will cover them", r.ProvenTo+1, r.Last))
	}
	r.checkWitnessed(witnessed, recomputed, o.Keys, info.Config.MaxAge, o.Now)
	return r, nil
}

// checkCheckpoints checks each checkpoint's signature and that it follows
// the one before.
func (r *Report) checkCheckpoints(cps []stored, keys *events.TrustedKeys) {
	r.Checkpoints = len(cps)
	if keys == nil && len(cps) > 0 {
		r.Notes = append(r.Notes, "no trusted decision key given: the checkpoints' signatures were not checked, so a holder of the broker's NATS credentials could have forged them")
	}
	for i, cp := range cps {
		if keys != nil {
			if _, err := keys.VerifyCheckpoint(&cp.e); err != nil {
				r.problem("the checkpoint at stream sequence %d: %v", cp.seq, err)
			}
		}
		if cp.seq <= cp.c.Upto {
			r.problem("the checkpoint at stream sequence %d covers up to %d, after itself", cp.seq, cp.c.Upto)
		}
		if i == 0 {
			continue
		}
		prev := cps[i-1].c
		if cp.c.From != prev.Upto+1 || cp.c.Prev != prev.Head {
			r.problem("the checkpoint at stream sequence %d (from %d, prev %s) does not follow the one at %d (upto %d, head %s): one was removed or forged",
				cp.seq, cp.c.From, cp.c.Prev, cps[i-1].seq, prev.Upto, prev.Head)
		}
	}
}

// checkRemovals checks that what is gone from the stream's start went for
// age, by the times the checkpoints still there give: a checkpoint whose
// whole range is gone says when its last message was stored, and one whose
// range starts after the stream's first sequence says when the message
// just before its range was (PrevTime). Messages go in order, so if that
// one went for age, so did all before it.
func (r *Report) checkRemovals(cps []stored, maxAge time.Duration, now time.Time) {
	if r.First <= 1 {
		return
	}
	for _, cp := range cps {
		c := cp.c
		switch {
		case c.Upto < r.First:
			r.youngRemoval(c.From, c.Upto, c.LastTime, "", maxAge, now)
		case c.From > 1 && c.From-1 < r.First && c.PrevTime != "":
			r.youngRemoval(1, c.From-1, c.PrevTime, "", maxAge, now)
		}
	}
}

// ageSlack allows for the server's clock and the verifier's to differ.
const ageSlack = time.Minute

// youngRemoval reports the sequences from to upto, which the stream no
// longer holds, if the last of them was stored (lastTime) less than maxAge
// ago.
func (r *Report) youngRemoval(from, upto uint64, lastTime, who string, maxAge time.Duration, now time.Time) {
	last, _ := time.Parse(time.RFC3339Nano, lastTime)
	if maxAge > 0 && now.Sub(last) > maxAge-ageSlack {
		return
	}
	limit := "the stream keeps every message (no age limit)"
	if maxAge > 0 {
		limit = fmt.Sprintf("the stream keeps messages for %s", maxAge)
	}
	r.problem("stream sequences %d to %d%s (the last stored at %s) are gone, although %s: they were deleted or purged",
		from, upto, who, lastTime, limit)
}

// checkWitnessed checks what a witness saw against the stream.
func (r *Report) checkWitnessed(ws []stored, recomputed map[uint64]bool, keys *events.TrustedKeys, maxAge time.Duration, now time.Time) {
	r.Witnessed = len(ws)
	for _, w := range ws {
		if keys != nil {
			if _, err := keys.VerifyCheckpoint(&w.e); err != nil {
				r.problem("the witnessed checkpoint at stream sequence %d: %v", w.seq, err)
				continue
			}
		}
		switch {
		case w.c.Upto > r.Last:
			r.problem("a witness saw the chain reach stream sequence %d (checkpoint at %d, last message stored %s), but the stream ends at %d: it was cut short",
				w.c.Upto, w.seq, w.c.LastTime, r.Last)
		case w.c.Upto < r.First:
			r.youngRemoval(w.c.From, w.c.Upto, w.c.LastTime, " (as a witness saw them)", maxAge, now)
		case !recomputed[w.c.Upto]:
			r.Notes = append(r.Notes, fmt.Sprintf("the witnessed checkpoint up to %d could not be checked: the chain is not recomputed there", w.c.Upto))
		}
	}
}

// checkDecision checks m, if a decided event: that a trusted key signed
// it, and that the messages it says it followed (its request, its trail)
// are still there, as far as the walk from start has seen (gone).
func (r *Report) checkDecision(m *Msg, keys *events.TrustedKeys, start uint64, gone map[uint64]bool) {
	e, err := events.Decode(events.Header(m.Header), m.Data)
	if err != nil || e.Type() != events.TypeDecided {
		return
	}
	r.Decisions++
	id := strings.TrimPrefix(m.Subject, events.DecisionPrefix)
	if d, err := events.DecodeDecided(&e); err == nil {
		for _, s := range append([]uint64{d.RequestSeq}, d.Trail...) {
			switch {
			case s == 0 || s < start:
			case s >= m.Seq:
				r.problem("the decision stored at stream sequence %d for request %s says it followed stream sequence %d, after itself", m.Seq, id, s)
			case gone[s]:
				r.problem("the decision stored at stream sequence %d for request %s followed stream sequence %d, which is gone: deleted", m.Seq, id, s)
			}
		}
	}
	if keys == nil {
		return
	}
	if _, err := keys.Verify(&e); err != nil {
		r.problem("the decision stored at stream sequence %d for request %s: %v", m.Seq, id, err)
		return
	}
	r.Signed++
}
