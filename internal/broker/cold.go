package broker

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	jsoniter "github.com/json-iterator/go"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/assent-dev/assent/pkg/events"
)

// A pending request's record is large (its request, args and all, its
// approvers, its trace context), and a replica may hold a million of them
// (docs/architecture.md, "Memory"). So the ledger keeps the records of at
// most maxFull pending requests whole, those announced while there is room;
// of the others (cold) it keeps only what judging their answers, cancels and
// expiries in stream order needs without the rest of the request:
// deadlines, level, rule, limit, votes, the digest and trace context, and
// short args. The rest is in the request's pending event, which the
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
	rule, limit    string
	revision       uint64
	// args and digest are the request's args, when short, and its digest:
	// with them an expiry or a cancel is decided without reading the
	// request (decided, when they are kept).
	args      []byte
	digest    [sha256.Size]byte
	level     int32 // escalation level (packed beside decided: a cold state is one of a million)
	decided   bool
	*coldMore // nil while the request has no votes, forgery or trace context
}

// coldArgs is the longest args a cold request keeps.
const coldArgs = 128

// coldMore is what few cold requests have.
type coldMore struct {
	votes                   []events.DecidedBy
	applied                 []uint64
	forgery                 string
	traceParent, traceState string
}

// keepRequest keeps args (a copy) and digest (a request digest) in c, if
// short and well formed.
func (c *cold) keepRequest(args []byte, digest string) {
	if len(args) <= coldArgs && args != nil {
		args = append(make([]byte, 0, len(args)), args...)
	}
	c.keepRequestBytes(args, []byte(digest))
}

// keepRequestBytes is keepRequest with args kept as they are.
func (c *cold) keepRequestBytes(args, digest []byte) {
	const prefix = "sha256:"
	if len(args) > coldArgs || len(digest) != len(prefix)+2*sha256.Size || string(digest[:len(prefix)]) != prefix {
		return
	}
	hexed := digest[len(prefix):]
	if _, err := hex.Decode(c.digest[:], hexed); err != nil || bytes.ContainsAny(hexed, "ABCDEF") {
		return // not lower-case hex: kept as it is, it would not read back the same
	}
	c.args, c.decided = args, true
}

// keepTrace keeps a request's trace context in c.
func (c *cold) keepTrace(parent, state string) {
	if parent == "" {
		return
	}
	if c.coldMore == nil {
		c.coldMore = &coldMore{}
	}
	c.traceParent, c.traceState = parent, state
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
	rec := en.listed()
	rec.Source, rec.RequestSeq, rec.Level, rec.Limit, rec.pendSeq = en.source, en.reqSeq, int(c.level), c.limit, en.pendSeq
	if c.decided {
		rec.Request.Args, rec.RequestDigest = c.args, "sha256:"+hex.EncodeToString(c.digest[:])
	}
	if m := c.coldMore; m != nil {
		rec.Votes, rec.Applied, rec.Forgery = m.votes, m.applied, m.forgery
		rec.TraceParent, rec.TraceState = m.traceParent, m.traceState
	}
	return rec
}

// keep makes next en's pending state. A whole record is kept whole (and
// counts among the hot ones); of a thin one, what changes.
func (l *ledger) keep(en *entry, next Record) {
	if next.thin {
		c := en.cold
		c.deadline, c.base, c.level, c.revision = toNanos(next.Deadline), toNanos(next.BaseDeadline), int32(next.Level), next.revision
		if len(next.Votes) > 0 || len(next.Applied) > 0 || next.Forgery != "" {
			if c.coldMore == nil {
				c.coldMore = &coldMore{}
			}
			c.votes, c.applied, c.forgery = next.Votes, next.Applied, next.Forgery
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
	if l.full > l.maxFull && !en.pinned {
		l.cool(en) // no room: kept cold
	}
}

// cool keeps en's record thin from now on.
func (l *ledger) cool(en *entry) {
	r := en.rec
	en.cold = &cold{rule: l.intern(r.Rule), limit: l.intern(r.Limit)}
	en.cold.keepRequest(r.Request.Args, r.RequestDigest)
	en.cold.keepTrace(r.TraceParent, r.TraceState)
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

// internBytes is intern for a string in b.
func (l *ledger) internBytes(b []byte) string {
	if v, ok := l.names[string(b)]; ok {
		return v
	}
	return l.intern(string(b))
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

// status is ledger.status with the records it returns whole where its
// caller needs them so: the request's state, unless the message at seq
// made a proposal (which its caller publishes); a proposal that is to be
// decided once whole (a cold request's expiry whose args it does not keep).
func (b *Broker) status(ctx context.Context, id string, seq uint64, withRequest bool) (status, error) {
	st := b.ledger.status(id, seq, withRequest)
	if st.prop == nil || seq == 0 || st.prop.Trigger != seq {
		if err := b.whole(ctx, &st.rec); err != nil {
			return st, err
		}
	}
	if st.prop != nil && st.prop.verdict != nil {
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

// announced is what the ledger reads of a pending event for a request it
// keeps cold.
// The byte slices are in the event read, not copies.
type announced struct {
	id, agent, digest          []byte
	session                    string
	rule, approvalRule, limit  string
	deadline, base, receivedAt time.Time
	requestSeq                 uint64
	args                       []byte
	traceParent, traceState    string
}

// readAnnounced reads what the ledger keeps of a cold request from a
// stored pending event in one pass, without decoding the request it
// carries; ok is false for anything else (an escalation, another encoding),
// which the ledger decodes whole.
func readAnnounced(h nats.Header, data []byte) (a announced, ok bool) {
	if h.Get("Content-Type") != events.ContentTypeStructured {
		return a, false
	}
	var pending bool
	bad := false
	// token reads a string without escapes in place, without a copy.
	token := func(it *jsoniter.Iterator) []byte {
		b := it.ReadStringAsSlice()
		if bytes.IndexByte(b, '\\') >= 0 {
			bad = true
		}
		return b
	}
	when := func(it *jsoniter.Iterator) time.Time {
		var t time.Time
		if err := t.UnmarshalText(token(it)); err != nil {
			bad = true
		}
		return t.UTC()
	}
	it := jsoniter.ConfigFastest.BorrowIterator(data)
	defer jsoniter.ConfigFastest.ReturnIterator(it)
	it.ReadObjectCB(func(it *jsoniter.Iterator, field string) bool {
		switch field {
		case "type":
			pending = string(token(it)) == events.TypePending
		case events.TraceParentAttribute:
			a.traceParent = it.ReadString()
		case events.TraceStateAttribute:
			a.traceState = it.ReadString()
		case "data":
			it.ReadObjectCB(func(it *jsoniter.Iterator, field string) bool {
				switch field {
				case "request_id":
					a.id = token(it)
				case "deadline":
					a.deadline = when(it)
				case "base_deadline":
					a.base = when(it)
				case "received_at":
					a.receivedAt = when(it)
				case "rule":
					a.rule = it.ReadString()
				case "approval_rule":
					a.approvalRule = it.ReadString()
				case "limit":
					a.limit = it.ReadString()
				case "request_seq":
					a.requestSeq = it.ReadUint64()
				case "request_digest":
					a.digest = token(it)
				case "request":
					it.ReadObjectCB(func(it *jsoniter.Iterator, field string) bool {
						switch field {
						case "agent":
							a.agent = token(it)
						case "session":
							a.session = it.ReadString()
						case "args":
							a.args = it.SkipAndReturnBytes()
						default:
							it.Skip()
						}
						return true
					})
				default:
					it.Skip()
				}
				return true
			})
		default:
			it.Skip()
		}
		return true
	})
	if it.Error != nil || bad || !pending || len(a.id) == 0 || a.deadline.IsZero() || len(a.digest) == 0 {
		return a, false
	}
	return a, true
}

// pendingCold applies the pending event at seq, stored at at, of a request
// the ledger keeps cold from the start (pending, in short): it has no room
// for more whole records. ok is false when the request needs its record
// whole (answers wait for it) and the caller is to apply the event so.
func (l *ledger) pendingCold(seq uint64, at time.Time, a announced) (ok bool) {
	en := l.open[string(a.id)]
	if en != nil && en.x != nil && len(en.x.early) > 0 {
		return false
	}
	if en == nil {
		id := string(a.id)
		if !events.ValidToken(id) {
			return true // not an announcement any replica takes
		}
		if _, _, ok := l.b.index.get(id); ok {
			return true // decided
		}
		en = &entry{id: id, reqSeq: a.requestSeq, reqAt: toNanos(a.receivedAt)}
		if en.reqAt == 0 {
			en.reqAt = toNanos(at)
		}
		l.open[id] = en
	}
	if en.pendSeq != 0 || en.proposal != nil {
		return true // announced again: nothing changes
	}
	rule := a.rule
	if a.approvalRule != "" {
		rule = a.approvalRule
	}
	if len(a.agent) > 0 {
		en.agent = l.internBytes(a.agent)
	}
	if en.session == "" {
		en.session = a.session
	}
	en.pendSeq = seq
	en.cold = &cold{deadline: toNanos(a.deadline), base: toNanos(a.base), rule: l.intern(rule), limit: l.intern(a.limit), revision: seq}
	en.cold.keepRequestBytes(a.args, a.digest)
	en.cold.keepTrace(a.traceParent, a.traceState)
	l.dropRaw(en)
	rec := en.listed()
	l.announced(en, &rec)
	return true
}

// listed is what announced needs of cold entry en's record (its listing and
// its timer): the start of record, without what record adds for deciding
// it.
func (en *entry) listed() Record {
	c := en.cold
	return Record{
		ID:           en.id,
		State:        StatePending,
		Request:      events.Requested{Agent: en.agent, Session: en.session},
		ReceivedAt:   en.receivedAt(),
		Deadline:     fromNanos(c.deadline),
		BaseDeadline: fromNanos(c.base),
		Rule:         c.rule,
		revision:     c.revision,
		thin:         true,
	}
}
