package broker

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/assent-dev/assent/pkg/events"
)

// A pending request's record is large (its request, args and all, its
// approvers, its trace context), and a replica may hold a million of them
// (docs/architecture.md, "Memory"). So the ledger keeps the records of at
// most maxFull pending requests whole, those announced last (hot); of the
// others (cold) it keeps only what judging its answers, cancels and expiries
// in stream order needs without the request itself: deadlines, level, rule,
// limit and votes. The rest is in the request's pending event, which the
// ledger and handlers read back by its stream sequence when they need it
// (whole): an answer or cancel about a cold request, a reader's Get or
// listing, an expiry whose decision carries the request's args.

// maxFullRecords is how many pending requests' records the ledger keeps
// whole (about 1 KiB each, with small args).
var maxFullRecords = 16384

// cold is what the ledger keeps of a pending request whose record it does
// not keep whole.
type cold struct {
	deadline, base int64 // Unix nanoseconds; 0: none
	level          int
	rule, limit    string
	revision       uint64
	*coldMore      // nil while the request has no votes and no forgery
}

// coldMore is what few cold requests have.
type coldMore struct {
	votes   []events.DecidedBy
	applied []uint64
	forgery string
}

// hotEntry is an entry in the order its record was made whole; stamp tells
// a later making whole of the same entry from this one.
type hotEntry struct {
	en    *entry
	stamp uint64
}

func toNanos(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

func fromNanos(n int64) time.Time {
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n).UTC()
}

// record returns en's state, pending: whole if the ledger keeps it so,
// else thin. en is pending (pendSeq != 0).
func (en *entry) record() Record {
	if en.rec != nil {
		return *en.rec
	}
	c := en.cold
	rec := Record{
		ID:           en.id,
		State:        StatePending,
		Request:      events.Requested{Agent: en.agent, Session: en.session},
		Source:       en.source,
		RequestSeq:   en.reqSeq,
		ReceivedAt:   en.reqAt,
		Deadline:     fromNanos(c.deadline),
		BaseDeadline: fromNanos(c.base),
		Level:        c.level,
		Rule:         c.rule,
		Limit:        c.limit,
		revision:     c.revision,
		thin:         true,
		pendSeq:      en.pendSeq,
	}
	if m := c.coldMore; m != nil {
		rec.Votes, rec.Applied, rec.Forgery = m.votes, m.applied, m.forgery
	}
	return rec
}

// keep makes next en's pending state. A whole record is kept whole (and
// counts among the hot ones); of a thin one, what changes.
func (l *ledger) keep(en *entry, next Record) {
	if next.thin {
		c := en.cold
		c.deadline, c.base, c.level, c.revision = toNanos(next.Deadline), toNanos(next.BaseDeadline), next.Level, next.revision
		if len(next.Votes) > 0 || len(next.Applied) > 0 || next.Forgery != "" {
			c.coldMore = &coldMore{votes: next.Votes, applied: next.Applied, forgery: next.Forgery}
		}
		return
	}
	next.thin, next.pendSeq = false, en.pendSeq
	if en.rec != nil {
		*en.rec = next
		return
	}
	en.rec, en.cold = &next, nil
	l.full++
	l.stamp++
	en.stamp = l.stamp
	l.hot = append(l.hot, hotEntry{en, l.stamp})
	for l.full > l.maxFull && len(l.hot) > 0 {
		h := l.hot[0]
		l.hot[0] = hotEntry{}
		l.hot = l.hot[1:]
		if h.en.stamp == h.stamp && h.en.rec != nil && !h.en.pinned && l.open[h.en.id] == h.en {
			l.cool(h.en)
		}
	}
	if cap(l.hot) > 2*max(len(l.hot), 64) {
		l.hot = append([]hotEntry(nil), l.hot...) // let the array shrink
	}
}

// cool keeps en's record thin from now on.
func (l *ledger) cool(en *entry) {
	r := en.rec
	en.cold = &cold{rule: l.intern(r.Rule), limit: l.intern(r.Limit)}
	en.agent, en.session, en.source = l.intern(r.Request.Agent), r.Request.Session, l.intern(r.Source)
	en.rec = nil
	l.full--
	rec := *r
	rec.thin = true
	l.keep(en, rec)
}

// intern returns s, shared with the strings it equals that the ledger
// keeps (agent names, sources, rules: few, and repeated by many requests).
func (l *ledger) intern(s string) string {
	if s == "" {
		return ""
	}
	if v, ok := l.names[s]; ok {
		return v
	}
	if len(l.names) < maxInterned {
		l.names[s] = s
	}
	return s
}

// maxInterned bounds the strings intern keeps.
const maxInterned = 4096

// warm returns the whole record of open request id, read from the stream,
// when the ledger keeps it thin: applying an answer or cancel needs the
// whole request. It reads outside l.mu, before the message is applied, and
// retries until it succeeds or the ledger stops, so that every replica
// applies the message to the same record.
func (l *ledger) warm(id string) *Record {
	l.mu.Lock()
	en := l.open[id]
	if en == nil || en.rec != nil || en.cold == nil {
		l.mu.Unlock()
		return nil
	}
	rec := en.record()
	l.mu.Unlock()
	for {
		err := l.b.whole(l.ctx, &rec)
		switch {
		case err == nil:
			return &rec
		case errors.Is(err, jetstream.ErrMsgNotFound), l.ctx.Err() != nil:
			l.b.log.Error("read a pending request's announcement to apply an answer to it", zap.String("request_id", id), zap.Error(err))
			return nil
		}
		l.b.log.Warn("read a pending request's announcement to apply an answer to it; retrying", zap.String("request_id", id), zap.Error(err))
		select {
		case <-l.ctx.Done():
		case <-time.After(unavailableDelay):
		}
	}
}

// current returns en's pending state to apply a message to, and whether it
// is whole: en's own record, or warmed (read for that message) with what
// the ledger applied to en since.
func (en *entry) current(warmed *Record) (Record, bool) {
	rec := en.record()
	if !rec.thin || warmed == nil || warmed.pendSeq != en.pendSeq {
		return rec, !rec.thin
	}
	w := *warmed
	w.Deadline, w.BaseDeadline, w.Level, w.revision = rec.Deadline, rec.BaseDeadline, rec.Level, rec.revision
	w.Votes, w.Applied, w.Forgery = rec.Votes, rec.Applied, rec.Forgery
	w.thin = false
	return w, true
}

// whole makes rec, if thin, whole: it reads the request and its terms from
// the request's pending event in the stream, and decides a proposal made
// while it was thin.
func (b *Broker) whole(ctx context.Context, rec *Record) error {
	if !rec.thin {
		return nil
	}
	m, err := b.getSeq(ctx, rec.pendSeq)
	if err != nil {
		return fmt.Errorf("read the announcement of request %s at stream sequence %d: %w", rec.ID, rec.pendSeq, err)
	}
	var full Record
	if e := b.ledger.decode(m.Header, m.Data); e != nil {
		if p, err := events.DecodePending(e); err == nil && p.RequestID == rec.ID {
			full = pendingRecord(e, p)
		}
	}
	if full.ID == "" {
		return fmt.Errorf("request %s: stream sequence %d is not its announcement", rec.ID, rec.pendSeq)
	}
	if full.Request.Agent == "" {
		full.Request.Agent = rec.Request.Agent
	}
	rec.takeRequest(&full)
	if v := rec.verdict; v != nil {
		id := rec.DecisionEventID
		if err := rec.decide(*v); err != nil {
			return fmt.Errorf("request %s: %w", rec.ID, err)
		}
		rec.DecisionEventID, rec.Decision.RequestSeq, rec.verdict = id, rec.RequestSeq, nil
	}
	return nil
}

// takeRequest makes thin record r whole with what from, a whole record of
// the same request, says of the request and its terms.
func (r *Record) takeRequest(from *Record) {
	r.Request, r.RequestDigest, r.Approvers, r.Quorum = from.Request, from.RequestDigest, from.Approvers, from.Quorum
	r.TraceParent, r.TraceState = from.TraceParent, from.TraceState
	r.thin = false
}

// status is ledger.status with the records it returns whole.
func (b *Broker) status(ctx context.Context, id string, seq uint64, withRequest bool) (status, error) {
	st := b.ledger.status(id, seq, withRequest)
	if err := b.whole(ctx, &st.rec); err != nil {
		return st, err
	}
	if st.prop != nil {
		if err := b.whole(ctx, st.prop); err != nil {
			return st, err
		}
	}
	return st, nil
}

// view is ledger.view with the record it returns whole.
func (b *Broker) view(ctx context.Context, id string) (Record, bool, error) {
	rec, ok := b.ledger.view(id)
	if !ok {
		return rec, false, nil
	}
	return rec, true, b.whole(ctx, &rec)
}
