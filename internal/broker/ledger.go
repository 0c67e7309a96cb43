package broker

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	jsoniter "github.com/json-iterator/go"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/assent-dev/assent/pkg/events"
)

// The ledger is each replica's reading of the ASSENT stream, the one source
// of truth: it applies every stored message in stream order, and so knows
// what the stored messages make of each open request (docs/architecture.md,
// "The stream decides").
//
// A request is open from its request message until its decision is stored.
// While it is open the ledger keeps what its stored events say: the request,
// the pending event's deadline, rule and approvers, the answers, cancels and
// expiry batches that name it. Applying those in order, it works out the
// outcome the first of them to end the request makes (the proposal), the
// same on every replica, since every replica reads the same messages in the
// same order. The proposal is not a decision: it is what the handler of its
// trigger message publishes on assent.decision.<id> with an expected last
// subject sequence of 0. Only a stored decision ends a request, here and
// for every reader, and the first one stored is the decision whatever the
// proposal was (a replica under another policy may have judged the request
// differently before anything else was stored).
//
// Handlers of the message at stream sequence s wait until the ledger has
// applied s (await): then it holds every message stored before s.
type ledger struct {
	b *Broker

	mu   sync.Mutex
	open map[string]*entry
	// waiters are the handlers waiting for the ledger to apply a sequence
	// (await), soonest first; advance wakes those it reaches, and only
	// those. nwait is how many there are, so that applying a message nobody
	// waits for takes no lock.
	waitMu  sync.Mutex
	waiters waiters
	nwait   atomic.Int64
	// raw counts the entries that keep their request message, at most
	// maxRaw (maxRawRequests).
	raw, maxRaw int
	// marker is the stream sequence of the migration marker: decisions
	// stored before it were made by brokers before the stream decided, and
	// their event ids are not derived from their triggers.
	marker uint64

	applied atomic.Uint64
	filling atomic.Bool // a fill runs
	// legacy holds the pending requests of the previous version's state
	// bucket (migrate.go), by id: what their pending events do not say.
	legacy map[string]Record

	// local holds decisions this replica just built, by request id, so
	// that applying them need not decode what it encoded.
	local sync.Map

	// full counts the pending requests whose records are kept whole, at
	// most maxFull (cold.go).
	full, maxFull int
	names         map[string]string
	// young holds the entries opened by a request message that were not
	// announced when last looked at: the only ones sweep reads, so that it
	// does not walk a million pending requests under mu. kept is its
	// length after it was last compacted.
	young []*entry
	kept  int
	// ctx ends when the ledger stops reading, started is when it started
	// (Unix nanoseconds).
	ctx     context.Context
	started int64
}

// entry is an open request. What few requests need (a request message
// kept, answers, expiry batches) is in more, nil for most, so that a
// million pending requests cost little each (cold.go).
type entry struct {
	id     string
	reqSeq uint64
	reqAt  int64 // when the request was stored, in Unix nanoseconds; 0: unknown
	// agent, session and source say what listings need of a request being
	// judged, and of a cold one.
	agent, session, source string
	// pendSeq is the stream sequence of the request's pending event, once
	// stored. From then on rec is the request's state, or, when the ledger
	// keeps it cold, cold is what it keeps of it (cold.go).
	pendSeq uint64
	rec     *Record
	cold    *cold
	// proposal is the outcome the stored messages make, not yet stored as
	// the decision; nil while they make none.
	proposal *Record
	x        *entryMore
	// tm is the request's timer (timers.go).
	tm clock
	// pinned: rec stays whole (a request announced by the previous
	// version, whose pending event does not say all).
	pinned bool
}

// receivedAt returns when en's request was stored.
func (en *entry) receivedAt() time.Time { return fromNanos(en.reqAt) }

// entryMore is what the ledger keeps of few open requests.
type entryMore struct {
	// req is the request message while no pending event carries the
	// request, decoded only when needed (a conflict check, a cancel, the
	// decided record); kept for at most maxRawRequests requests at once, so
	// that a backlog of requests not yet judged does not hold them all in
	// memory. Without it, agent, session and source say what listings need,
	// and the rest is read from the stream by reqSeq.
	req *jetstream.RawStreamMsg
	// triggers are the stream messages applied to the request after its
	// request message (answers, cancels, expiry batches): a decision's
	// event id is derived from one of them, or from the request message.
	triggers []trigger
	// results says what each answer or cancel did: nil for counted.
	results map[uint64]error
	// escalated maps an expiry batch's sequence to the level it reached.
	escalated map[uint64]int
	// early are answers stored before the pending event: they count once
	// it is stored, in their order.
	early []early
	// forged describes messages on the decision subject that a broker
	// signing its decisions did not sign, before the decision.
	forged string
}

// more returns en's entryMore, made if need be.
func (en *entry) more() *entryMore {
	if en.x == nil {
		en.x = &entryMore{}
	}
	return en.x
}

// req returns en's request message, if kept.
func (en *entry) req() *jetstream.RawStreamMsg {
	if en.x == nil {
		return nil
	}
	return en.x.req
}

// early is an answer stored before its request's pending event.
type early struct {
	seq    uint64
	at     time.Time
	change func(*Record) error
}

type trigger struct {
	seq uint64
	at  time.Time
}

func newLedger(b *Broker) *ledger {
	return &ledger{b: b, open: make(map[string]*entry), maxRaw: maxRawRequests, maxFull: maxFullRecords, names: make(map[string]string), ctx: context.Background()}
}

// orphanAfter is how long a request stays open with neither a pending
// event nor a decision before the ledger forgets it: a request message
// published again under the id of one decided so long ago that the ledger
// no longer knows it, whose handler finds the old decision.
const orphanAfter = 15 * time.Minute

// run reads the stream from its first message until ctx ends, and closes
// ready once it has applied every message stored when it started.
func (l *ledger) run(ctx context.Context, ready func(pending int)) error {
	b := l.b
	l.ctx, l.started = ctx, time.Now().UnixNano()
	var last uint64
	for {
		cctx, cancel := callCtx(ctx)
		info, err := b.res.stream.Info(cctx)
		cancel()
		if err == nil {
			last = info.State.LastSeq
			break
		}
		if ctx.Err() != nil {
			return nil
		}
		b.log.Warn("read the stream's state before reading it; retrying", zap.Error(err))
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(unavailableDelay):
		}
	}
	// caughtUp reports the start done, once: the ledger has applied every
	// message stored when it started, or read nothing for a second (the
	// last one at start may be gone since: a durable tick's schedule,
	// removed once it fired).
	var caught, busy atomic.Bool
	var got atomic.Uint64 // messages delivered
	var once sync.Once
	caughtUp := func() {
		once.Do(func() {
			l.mu.Lock()
			n := len(l.open)
			l.mu.Unlock()
			caught.Store(true)
			if ready != nil {
				ready(n)
			}
		})
	}
	if last == 0 {
		caughtUp()
	} else {
		// One clock for the whole start, not a wait bounded per message: a
		// whole tick without a message delivered, none being applied.
		go func() {
			tick := time.NewTicker(time.Second)
			defer tick.Stop()
			seen := got.Load()
			for !caught.Load() {
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
				}
				if now := got.Load(); now == seen && !busy.Load() {
					caughtUp()
				} else {
					seen = now
				}
			}
		}()
	}
	sweep := time.NewTicker(time.Minute)
	defer sweep.Stop()
	for ctx.Err() == nil {
		start := l.applied.Load() + 1
		cons, err := b.res.stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
			DeliverPolicy: jetstream.DeliverByStartSequencePolicy,
			OptStartSeq:   start,
		})
		if err != nil {
			if ctx.Err() == nil {
				b.log.Warn("read the stream; retrying", zap.Error(err))
				time.Sleep(unavailableDelay)
			}
			continue
		}
		// Heartbeats every second: an ordered consumer whose node died is
		// made again within about two seconds, not the ten that nats.go's
		// defaults take, while handlers wait for this reading. Consume
		// calls back for each message: an iterator's Next arms a clock per
		// message, which at a start reading millions of them is garbage
		// the size of the rest of the reading.
		cc, err := cons.Consume(func(msg jetstream.Msg) {
			busy.Store(true)
			got.Add(1)
			left := l.apply(msg)
			busy.Store(false)
			if !caught.Load() && (l.applied.Load() >= last || left == 0) {
				caughtUp()
			}
			select {
			case <-sweep.C:
				l.sweep()
			default:
			}
		}, jetstream.PullMaxMessages(1024), jetstream.PullExpiry(pullExpiry), jetstream.PullHeartbeat(pullExpiry/2),
			jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
				b.log.Debug("reading the stream", zap.Error(err))
			}))
		if err != nil {
			if ctx.Err() == nil {
				b.log.Warn("read the stream; retrying", zap.Error(err))
				time.Sleep(unavailableDelay)
			}
			continue
		}
		select {
		case <-ctx.Done():
		case <-cc.Closed():
		}
		cc.Stop()
		// A message being applied finishes first (bounded: a closed
		// connection may not say so).
		select {
		case <-cc.Closed():
		case <-time.After(time.Second):
		}
	}
	return nil
}

// await returns once the ledger has applied stream sequence seq, or ctx
// ends. A wait longer than fillAfter reads the missing messages (fill).
func (l *ledger) await(ctx context.Context, seq uint64) error {
	if l.applied.Load() >= seq {
		return nil
	}
	w := waiter{seq: seq, ch: make(chan struct{})}
	l.waitMu.Lock()
	heap.Push(&l.waiters, w)
	l.nwait.Store(int64(len(l.waiters)))
	l.waitMu.Unlock()
	// Applied meanwhile: advance may have looked before the waiter was
	// there. Otherwise the advance that reaches seq finds it.
	if l.applied.Load() >= seq {
		return nil
	}
	late := time.NewTicker(fillAfter)
	defer late.Stop()
	for {
		select {
		case <-w.ch:
			return nil
		case <-late.C:
			go l.fill(ctx, seq) // again every fillAfter, while it waits
		case <-ctx.Done():
			// The waiter stays until the ledger reaches seq.
			return fmt.Errorf("this replica has not read the stream up to sequence %d yet: %w", seq, ctx.Err())
		}
	}
}

// waiter is a handler waiting in await until the ledger has applied seq.
type waiter struct {
	seq uint64
	ch  chan struct{}
}

// waiters is a heap of waiters, the lowest sequence first.
type waiters []waiter

func (h waiters) Len() int           { return len(h) }
func (h waiters) Less(i, j int) bool { return h[i].seq < h[j].seq }
func (h waiters) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *waiters) Push(x any)        { *h = append(*h, x.(waiter)) }
func (h *waiters) Pop() any {
	old := *h
	w := old[len(old)-1]
	old[len(old)-1] = waiter{}
	*h = old[:len(old)-1]
	return w
}

// catchUp returns once the ledger has applied every message the stream held
// when it was called: a redelivered message's handler calls it so that
// whatever its first handling stored is known before it acts again.
func (l *ledger) catchUp(ctx context.Context) error {
	cctx, cancel := callCtx(ctx)
	defer cancel()
	info, err := l.b.res.stream.Info(cctx)
	if err != nil {
		return fmt.Errorf("read the stream's last sequence: %w", err)
	}
	// Bounded like a call: a message removed before it was read (a durable
	// tick's schedule, once it fired) is skipped by fill, which a failed
	// read may hold up.
	return l.await(cctx, info.State.LastSeq)
}

// apply applies one message the ordered consumer delivers, and returns how
// many the stream holds after it.
func (l *ledger) apply(msg jetstream.Msg) (left uint64) {
	md, err := msg.Metadata()
	if err != nil {
		return 1
	}
	l.applyStored(&jetstream.RawStreamMsg{Subject: msg.Subject(), Sequence: md.Sequence.Stream, Header: msg.Headers(), Data: msg.Data(), Time: md.Timestamp})
	return md.NumPending
}

// applyStored applies the stored message msg, unless it was applied already
// (read both by the ordered consumer and by fill).
func (l *ledger) applyStored(msg *jetstream.RawStreamMsg) {
	seq, at, subj := msg.Sequence, msg.Time.UTC(), msg.Subject
	var warmed *Record
	if seq > l.applied.Load() && (strings.HasPrefix(subj, events.ResponsePrefix) || strings.HasPrefix(subj, events.CancelPrefix)) {
		if sub, err := events.ParseSubject(subj); err == nil {
			warmed = l.warm(sub.RequestID)
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if seq <= l.applied.Load() {
		return
	}
	switch {
	case scheduledBySomeone(subj, nats.Header(msg.Header)) && !strings.HasPrefix(subj, events.DecisionPrefix):
		// Stored for someone's schedule, not by its publisher: as the
		// handlers, the ledger takes none (decisions go on: a decision
		// stored first is read as it always was, a forgery for a
		// broker that signs).
	case strings.HasPrefix(subj, events.RequestPrefix):
		l.applyRequest(seq, at, msg)
	case strings.HasPrefix(subj, events.PendingPrefix):
		l.applyPending(seq, at, msg)
	case strings.HasPrefix(subj, events.ResponsePrefix):
		l.applyAnswer(seq, at, msg, warmed)
	case strings.HasPrefix(subj, events.CancelPrefix):
		l.applyCancel(seq, at, msg, warmed)
	case subj == tickDue:
		for _, id := range dueIDs(msg.Data) {
			l.applyDue(seq, at, id)
		}
	case strings.HasPrefix(subj, TimeoutPrefix):
		l.applyDue(seq, at, subj[len(TimeoutPrefix):])
	case strings.HasPrefix(subj, events.DecisionPrefix):
		l.applyDecision(seq, at, subj, msg.Header, msg.Data)
	case subj == MigratedSubject:
		if l.marker == 0 {
			l.marker = seq
		}
	}
	l.advance(seq)
}

// advance records that everything up to seq is applied, and wakes those
// waiting for it. l.mu is held.
func (l *ledger) advance(seq uint64) {
	l.applied.Store(seq)
	if l.nwait.Load() == 0 {
		return
	}
	l.waitMu.Lock()
	defer l.waitMu.Unlock()
	for len(l.waiters) > 0 && l.waiters[0].seq <= seq {
		close(heap.Pop(&l.waiters).(waiter).ch)
	}
	l.nwait.Store(int64(len(l.waiters)))
}

// fillAfter is how long a handler waits for the ordered consumer to bring
// its message before it reads the missing messages itself (fill).
const fillAfter = 500 * time.Millisecond

// fill reads the messages from the last applied up to upTo one by one from
// the stream (its leader, on a cluster) and applies them, while the ordered
// consumer is not delivering: its node died, and making it again waits for
// JetStream's meta leader, which may have died with it (an election takes
// seconds). Handlers waiting for their messages go on meanwhile. One fill
// runs at a time.
func (l *ledger) fill(ctx context.Context, upTo uint64) {
	if !l.filling.CompareAndSwap(false, true) {
		return
	}
	defer l.filling.Store(false)
	for seq := l.applied.Load() + 1; seq <= upTo && ctx.Err() == nil; seq = l.applied.Load() + 1 {
		m, err := l.b.getSeq(ctx, seq)
		switch {
		case err == nil:
			l.applyStored(m)
		case errors.Is(err, jetstream.ErrMsgNotFound):
			// Removed (retention, a purge): nothing to apply.
			l.mu.Lock()
			if seq > l.applied.Load() {
				l.advance(seq)
			}
			l.mu.Unlock()
		default:
			l.b.log.Debug("read the stream by sequence while its reading is held up", zap.Uint64("seq", seq), zap.Error(err))
			return
		}
	}
}

// decode decodes a stored message's event, nil if it is not one.
func (l *ledger) decode(h nats.Header, data []byte) *events.Event {
	e, err := events.Codec{MaxSize: l.b.maxEmit}.Decode(events.Header(h), data)
	if err != nil {
		return nil
	}
	return &e
}

// decodeIncoming decodes an event a client published (an answer, a cancel)
// as the broker's handlers do, with the same limits: an event they refuse
// counts for nothing here either.
func (l *ledger) decodeIncoming(h nats.Header, data []byte) *events.Event {
	e, err := l.b.codec.Decode(events.Header(h), data)
	if err != nil {
		return nil
	}
	return &e
}

// eventID reads the id of the event in a message without decoding the
// rest, "" if it has none: every replica reads the id of every request and
// decision on the stream.
func eventID(h nats.Header, data []byte) string {
	if id := h.Get("ce-id"); id != "" {
		return id
	}
	return jsoniter.Get(data, "id").ToString()
}

func (l *ledger) applyRequest(seq uint64, at time.Time, msg *jetstream.RawStreamMsg) {
	id, session, source := requestFacts(msg.Header, msg.Data)
	if !events.ValidToken(id) {
		return
	}
	if _, ok := l.open[id]; ok {
		return // a later copy: its handler compares it with this one
	}
	if _, _, ok := l.b.index.get(id); ok {
		return // decided
	}
	en := &entry{
		id: id, reqSeq: seq, reqAt: toNanos(at),
		agent: l.intern(strings.TrimPrefix(msg.Subject, events.RequestPrefix)),
	}
	en.session, en.source = session, l.intern(source)
	if l.raw < l.maxRaw {
		en.more().req = msg
		l.raw++
	}
	l.open[id] = en
	l.young = append(l.young, en)
	if len(l.young) >= 2*l.kept+youngSlack {
		l.compactYoung(0)
	}
}

// youngSlack is how many entries young grows by past twice what it kept
// before it is compacted again.
const youngSlack = 4096

// compactYoung drops from young the entries announced, decided or
// forgotten since, and forgets those still unannounced that were opened
// before cutoff (Unix nanoseconds; 0: none). l.mu is held.
func (l *ledger) compactYoung(cutoff int64) {
	kept := l.young[:0]
	for _, en := range l.young {
		if en.pendSeq != 0 || en.proposal != nil || l.open[en.id] != en {
			continue
		}
		// Open since it was stored, or since the ledger started, for
		// one read from the stream at the start.
		if max(en.reqAt, l.started) < cutoff {
			l.forget(en)
			continue
		}
		kept = append(kept, en)
	}
	clear(l.young[len(kept):])
	l.young, l.kept = kept, len(kept)
}

// maxRawRequests bounds the request messages the ledger keeps for requests
// being judged (entry.req): about 1 KiB each.
const maxRawRequests = 16384

// dropRaw forgets en's request message. l.mu is held.
func (l *ledger) dropRaw(en *entry) {
	if en.req() != nil {
		en.x.req = nil
		l.raw--
	}
}

// forget removes open request en. l.mu is held.
func (l *ledger) forget(en *entry) {
	l.b.timers.stop(en)
	l.dropRaw(en)
	if en.rec != nil && en.pendSeq != 0 {
		l.full--
	}
	delete(l.open, en.id)
}

// requestFacts reads the id (as eventID does) and source of a stored
// requested event and the session of its request, in one pass and without
// decoding the rest.
func requestFacts(h nats.Header, data []byte) (id, session, source string) {
	if src := h.Get("ce-source"); src != "" {
		// Binary mode: the body is the data.
		return h.Get("ce-id"), jsoniter.Get(data, "session").ToString(), src
	}
	id = h.Get("ce-id") // as eventID: the header's, else the body's first
	seenID := id != ""
	it := jsoniter.ConfigFastest.BorrowIterator(data)
	defer jsoniter.ConfigFastest.ReturnIterator(it)
	it.ReadObjectCB(func(it *jsoniter.Iterator, field string) bool {
		switch field {
		case "id":
			switch {
			case seenID:
				it.Skip()
			case it.WhatIsNext() == jsoniter.StringValue:
				id, seenID = it.ReadString(), true
			default:
				id, seenID = it.ReadAny().ToString(), true
			}
		case "source":
			source = it.ReadString()
		case "data":
			it.ReadObjectCB(func(it *jsoniter.Iterator, field string) bool {
				if field == "session" {
					session = it.ReadString()
				} else {
					it.Skip()
				}
				return true
			})
		default:
			it.Skip()
		}
		return true
	})
	return id, session, source
}

func (l *ledger) applyPending(seq uint64, at time.Time, msg *jetstream.RawStreamMsg) {
	if l.full >= l.maxFull && len(l.legacy) == 0 {
		// No room for another whole record: read only what a cold one
		// keeps, which costs a fraction of decoding the event.
		if a, ok := readAnnounced(msg.Header, msg.Data); ok && l.pendingCold(seq, at, a) {
			return
		}
	}
	e := l.decode(msg.Header, msg.Data)
	if e == nil {
		return
	}
	switch e.Type() {
	case events.TypePending:
		p, err := events.DecodePending(e)
		if err != nil || !events.ValidToken(p.RequestID) {
			return
		}
		l.pending(seq, at, e, p)
	case events.TypeEscalated:
		esc, err := events.DecodeEscalated(e)
		if err != nil {
			return
		}
		if en := l.open[esc.RequestID]; en != nil && en.pendSeq != 0 {
			if rec := en.record(); esc.Level > rec.Level {
				rec.Level, rec.Deadline, rec.revision = esc.Level, esc.Deadline.UTC(), seq
				l.keep(en, rec)
				l.b.index.put(rec)
				l.b.timers.backup(en, l.b.wakeAt(&rec))
				l.b.records.deliver(en.id)
			}
		}
	}
}

// pending applies a request's pending event: the request now waits for
// answers, with the deadline, rule and approvers it names.
func (l *ledger) pending(seq uint64, at time.Time, e *events.Event, p events.Pending) {
	en := l.open[p.RequestID]
	if en == nil {
		if _, _, ok := l.b.index.get(p.RequestID); ok {
			return // decided
		}
		// The request message is gone (retention), or was stored before
		// what this replica reads: the pending event says what it held.
		en = &entry{id: p.RequestID, reqSeq: p.RequestSeq, reqAt: toNanos(p.ReceivedAt)}
		if en.reqAt == 0 {
			en.reqAt = toNanos(at)
		}
		l.open[p.RequestID] = en
	}
	if en.pendSeq != 0 || en.proposal != nil {
		return // announced again: nothing changes
	}
	full := pendingRecord(e, p)
	rec := &full
	rec.RequestSeq, rec.ReceivedAt, rec.revision = en.reqSeq, en.receivedAt(), seq
	if old, ok := l.legacy[p.RequestID]; ok && p.RequestSeq == 0 {
		// Announced by the previous version: its state entry says the rest.
		rec.RequestSeq, rec.ReceivedAt, rec.RequestDigest = old.RequestSeq, old.ReceivedAt, old.RequestDigest
		rec.Deadline, rec.BaseDeadline, rec.Level = old.Deadline, old.BaseDeadline, old.Level
		rec.Rule, rec.Limit, rec.Approvers, rec.Quorum = old.Rule, old.Limit, old.Approvers, old.Quorum
		rec.Source, rec.TraceParent, rec.TraceState = old.Source, old.TraceParent, old.TraceState
		rec.Votes, rec.Applied = old.Votes, old.Applied // the answers it counted, not to be counted again
		en.reqSeq, en.reqAt = old.RequestSeq, toNanos(old.ReceivedAt)
		en.pinned = true
		delete(l.legacy, p.RequestID)
	}
	if p.Request.Agent == "" {
		rec.Request.Agent = en.agent
	}
	rec.Source = en.source
	if rec.RequestDigest == "" {
		rec.RequestDigest, _ = events.RequestDigest(rec.Request)
	}
	en.pendSeq, rec.pendSeq = seq, seq
	l.keep(en, *rec)
	l.dropRaw(en)
	if en.x != nil {
		for _, a := range en.x.early {
			l.result(en, a.seq, a.at, a.change, rec)
		}
		en.x.early = nil
	}
	l.announced(en, rec)
}

// announced lists rec, a request that now waits for answers, and arms its
// timer.
func (l *ledger) announced(en *entry, rec *Record) {
	l.b.index.put(*rec)
	if l.b.ready.Load() && !en.tm.armed {
		// Another replica took it: fire a little after it would,
		// should that one be gone by then.
		l.b.timers.backup(en, l.b.wakeAt(rec))
	} else {
		l.b.timers.arm(en, l.b.wakeAt(rec))
	}
	l.b.records.deliver(rec.ID)
}

// pendingRecord is the record a request's pending event e (with data p)
// announces, but for what the ledger knows of the request message itself
// (its sequence, arrival and source).
func pendingRecord(e *events.Event, p events.Pending) Record {
	rec := Record{
		ID:            p.RequestID,
		State:         StatePending,
		Request:       p.Request,
		RequestDigest: p.RequestDigest,
		Deadline:      p.Deadline.UTC(),
		Rule:          p.Rule,
		Limit:         p.Limit,
		Approvers:     p.Approvers,
		BaseDeadline:  p.BaseDeadline.UTC(),
	}
	if p.ApprovalRule != "" {
		rec.Rule = p.ApprovalRule
	}
	if p.Terms != nil {
		rec.Quorum = p.Terms.Quorum
	}
	if rec.RequestDigest == "" {
		rec.RequestDigest, _ = events.RequestDigest(rec.Request)
	}
	if tp, ok := e.Extensions()[events.TraceParentAttribute].(string); ok {
		rec.TraceParent = tp
		rec.TraceState, _ = e.Extensions()[events.TraceStateAttribute].(string)
	}
	return rec
}

// errNotWaiting refuses an answer stored before its request's pending
// event: nobody could have been asked yet.
var errNotWaiting = errors.New("the request is not waiting for answers yet")

func (l *ledger) applyAnswer(seq uint64, at time.Time, msg *jetstream.RawStreamMsg, warmed *Record) {
	sub, err := events.ParseSubject(msg.Subject)
	if err != nil {
		return
	}
	en := l.open[sub.RequestID]
	if en == nil {
		return
	}
	en.more().triggers = append(en.more().triggers, trigger{seq, at})
	var resp events.Responded
	if e := l.decodeIncoming(msg.Header, msg.Data); e != nil {
		resp, err = events.DecodeResponded(e)
	} else {
		err = fmt.Errorf("%w: not an event", events.ErrMalformed)
	}
	if err == nil {
		err = checkAnswer(sub.Principal, sub.RequestID, resp)
	}
	change := func(r *Record) error {
		if err != nil {
			return err
		}
		return l.b.answerChange(sub.Principal, sub.RequestID, resp, seq, at)(r)
	}
	if en.pendSeq == 0 && en.proposal == nil {
		// The request is being judged: the answer counts once it waits
		// for answers, if it does.
		en.more().early = append(en.more().early, early{seq, at, change})
		return
	}
	l.result(en, seq, at, change, warmed)
}

func (l *ledger) applyCancel(seq uint64, at time.Time, msg *jetstream.RawStreamMsg, warmed *Record) {
	sub, err := events.ParseSubject(msg.Subject)
	if err != nil {
		return
	}
	en := l.open[sub.RequestID]
	if en == nil {
		return
	}
	en.more().triggers = append(en.more().triggers, trigger{seq, at})
	e := l.decodeIncoming(msg.Header, msg.Data)
	if e == nil {
		en.result(seq, fmt.Errorf("%w: not an event the broker takes", events.ErrMalformed))
		return
	}
	c, err := events.DecodeCancel(e)
	by := e.Source()
	if err == nil {
		err = checkCancel(by, c)
	}
	if err != nil {
		en.result(seq, err)
		return
	}
	change := l.b.cancelChange(by, sub.Agent, c, at)
	if en.pendSeq == 0 && en.proposal == nil {
		// Cancelled before it waits for anyone (or while it is being
		// judged): the cancel ends it, unless a decision is stored first.
		rec, _ := l.requestRecord(en)
		if err := change(&rec); err != nil {
			en.result(seq, err)
			return
		}
		if rec.partial {
			rec.rebuild = change // with the request read from the stream
		}
		l.propose(en, rec, seq, at)
		en.result(seq, nil)
		return
	}
	l.result(en, seq, at, change, warmed)
}

// result applies change, made by the answer or cancel at seq stored at at,
// to en's request and records what it did. The change applies to a copy;
// one that ends the request becomes its proposal. warmed is en's whole
// record read for it, if the ledger keeps en cold (warm).
func (l *ledger) result(en *entry, seq uint64, at time.Time, change func(*Record) error, warmed *Record) {
	if en.proposal != nil {
		en.result(seq, en.proposal.terminalErr())
		return
	}
	if en.pendSeq == 0 {
		en.result(seq, fmt.Errorf("%w: %s: %w", ErrNotFound, en.id, errNotWaiting))
		return
	}
	next, whole := en.current(warmed)
	switch {
	case slices.Contains(next.Applied, seq):
		en.result(seq, nil) // counted already
		return
	case seq < next.RequestSeq:
		en.result(seq, fmt.Errorf("%w: %s: the answer is at stream sequence %d, the request at %d, so nobody could have seen the request", ErrBeforeRequest, en.id, seq, next.RequestSeq))
		return
	}
	if l.b.escalateAt(&next, at) {
		l.changed(en, next, seq)
	}
	if !at.Before(next.Deadline) {
		l.expire(en, next, seq, at)
		en.result(seq, en.proposal.terminalErr())
		return
	}
	if !whole {
		// Its pending event could not be read (warm): gone from the stream.
		en.result(seq, fmt.Errorf("%w: %s: its announcement is no longer in the stream", ErrNotFound, en.id))
		return
	}
	if err := change(&next); err != nil {
		en.result(seq, err)
		return
	}
	if next.State.Terminal() {
		if err := l.b.decisionFits(&next); err != nil {
			en.result(seq, err) // never stored, so nobody learns of it
			return
		}
		l.propose(en, next, seq, at)
	} else {
		l.changed(en, next, seq)
	}
	en.result(seq, nil)
}

func (en *entry) result(seq uint64, err error) {
	x := en.more()
	if x.results == nil {
		x.results = make(map[uint64]error)
	}
	x.results[seq] = err
}

// changed stores a pending request's new state (a vote counted, a level
// reached).
func (l *ledger) changed(en *entry, next Record, seq uint64) {
	next.revision = seq
	l.keep(en, next)
	l.b.index.put(next)
	l.b.records.deliver(en.id)
}

// propose makes next, ended by the message at seq stored at at, en's
// proposal.
func (l *ledger) propose(en *entry, next Record, seq uint64, at time.Time) {
	next.Trigger, next.revision = seq, seq
	next.DecisionEventID = decisionID(en.id, seq, at)
	if next.Decision != nil {
		next.Decision.RequestSeq = next.RequestSeq
		next.Decision.Trail = next.trail()
	}
	if next.Grant != nil {
		next.Grant.ID = decisionID(en.id+"/grant", seq, at)
	}
	en.proposal = &next
}

// expire proposes that en's request ends by the message at seq, stored at
// at, at or after its deadline.
func (l *ledger) expire(en *entry, next Record, seq uint64, at time.Time) {
	v := l.b.timeoutVerdict(&next, at)
	if next.thin && next.RequestDigest == "" {
		// Decided once whole: the decision carries the request's args.
		next.State, next.verdict = State(v.outcome), &v
	} else if err := next.decide(v); err != nil {
		l.b.log.Error("expire", zap.String("request_id", en.id), zap.Error(err))
		return
	}
	l.propose(en, next, seq, at)
}

// applyDue applies an expiry batch that names id, stored at at.
func (l *ledger) applyDue(seq uint64, at time.Time, id string) {
	en := l.open[id]
	if en == nil || en.pendSeq == 0 || en.proposal != nil {
		return
	}
	en.more().triggers = append(en.more().triggers, trigger{seq, at})
	next := en.record()
	if l.b.escalateAt(&next, at) && at.Before(next.Deadline) {
		x := en.more()
		if x.escalated == nil {
			x.escalated = make(map[uint64]int)
		}
		x.escalated[seq] = next.Level
		l.changed(en, next, seq)
		return
	}
	if !at.Before(next.Deadline) {
		l.expire(en, next, seq, at)
	}
}

// adoptOrphan applies first, the decision of request id, to an entry the
// ledger opened for a copy of the request stored after it: the decision
// was older than what the index keeps when the copy came.
func (l *ledger) adoptOrphan(id string, first *jetstream.RawStreamMsg) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if en := l.open[id]; en != nil && en.reqSeq > first.Sequence {
		l.applyDecision(first.Sequence, first.Time, first.Subject, first.Header, first.Data)
	}
}

func (l *ledger) applyDecision(seq uint64, at time.Time, subj string, h nats.Header, data []byte) {
	id := subj[len(events.DecisionPrefix):]
	b := l.b
	if d, _, ok := b.index.getDecided(id); ok {
		// A message after the decision is never the decision.
		b.index.noteForgery(id, fmt.Sprintf("stream sequence %d, stored after the decision (%s)", seq, describeStored(seq, l.decode(h, data), nil)))
		if d.Forgery == "" {
			b.metrics.nForged.Add(1)
			b.log.Error("the stream holds a second message on a decision subject; readers keep the first", zap.String("request_id", id), zap.Uint64("seq", seq))
		}
		return
	}
	en := l.open[id]
	var rec Record
	if v, ok := l.local.LoadAndDelete(id); ok && v.(Record).DecisionEventID == eventID(h, data) {
		rec = v.(Record)
	} else {
		e := l.decode(h, data)
		var d events.Decided
		var err error
		if e == nil {
			err = fmt.Errorf("%w: not an event", events.ErrMalformed)
		} else if d, err = events.DecodeDecided(e); err == nil && b.trusted != nil {
			_, err = b.trusted.Verify(e)
		}
		if err != nil || d.RequestID != id {
			what := describeStored(seq, e, err)
			if err == nil {
				what = describeStored(seq, e, fmt.Errorf("it names request %q", d.RequestID))
			}
			if b.trusted != nil || e == nil || err != nil && d.RequestID != id {
				// Not a decision readers take: signed brokers' readers
				// skip it, and so does everyone for one that is not a
				// decided event about this request.
				l.forgedBefore(en, id, what)
				return
			}
		}
		if en != nil && en.pendSeq != 0 {
			rec = en.record()
			if p := en.proposal; rec.thin && p != nil && !p.thin {
				rec.takeRequest(p)
			} else if rec.thin {
				// The rest is in the stream: readers read it there.
				rec.thin, rec.pendSeq, rec.partial = false, 0, true
			}
		} else if en != nil {
			rec, _ = l.requestRecord(en)
		} else {
			rec = Record{ID: id, RequestSeq: d.RequestSeq}
		}
		rec.State, rec.Decision, rec.DecisionEventID = State(d.Outcome), &d, e.ID()
		if d.RequestDigest != "" {
			rec.RequestDigest = d.RequestDigest
		}
		if rec.Decision.Args == nil {
			rec.Decision.Args = rec.Request.Args
		}
		if en != nil && b.trusted == nil && seq > l.marker && l.marker != 0 && !en.madeBy(rec.DecisionEventID) {
			rec.Forgery = describeStored(seq, e, errors.New("its id is not one a broker derives from the messages about this request"))
			rec.forged = true
			b.metrics.nForged.Add(1)
			b.log.Error("the stream holds a decision no broker made; readers take it as the decision", zap.String("request_id", id), zap.String("found", rec.Forgery))
		}
		if en != nil && en.proposal != nil && en.proposal.DecisionEventID == rec.DecisionEventID {
			rec.Trigger, rec.Grant = en.proposal.Trigger, en.proposal.Grant
		}
	}
	if en != nil && en.x != nil && en.x.forged != "" && rec.Forgery == "" {
		rec.Forgery = en.x.forged
	}
	rec.revision, rec.judging = seq, false
	if rec.thin {
		// Decided from what a cold request keeps: readers read the rest
		// from the stream.
		rec.thin, rec.partial = false, true
	}
	if rec.ReceivedAt.IsZero() && en != nil {
		rec.ReceivedAt = en.receivedAt()
	}
	if en != nil {
		l.forget(en)
	}
	if g := rec.Grant; g != nil && !rec.forged && rec.Decision != nil && !rec.Decision.Auto {
		// Its grant is stored after it: judging counts it meanwhile, once
		// the bucket shows no revocation (grantReader).
		b.grants.decide(g.Key(), *g, at, b.now())
	}
	b.index.put(rec)
	b.records.deliver(id)
}

// forgedBefore notes a message on id's decision subject that is not its
// decision, stored before any that is.
func (l *ledger) forgedBefore(en *entry, id, what string) {
	if en == nil || en.x != nil && en.x.forged != "" {
		return
	}
	en.more().forged = what
	l.b.metrics.nForged.Add(1)
	l.b.log.Error("the stream holds a decided event no trusted key signed; readers that check signatures skip it", zap.String("request_id", id), zap.String("found", what))
	if en.pendSeq != 0 {
		rec := en.record()
		rec.Forgery = what
		l.keep(en, rec)
		l.b.records.deliver(id)
	}
}

// madeBy reports whether event id is derived from one of the messages
// applied to en.
func (en *entry) madeBy(id string) bool {
	if decisionID(en.id, en.reqSeq, en.receivedAt()) == id {
		return true
	}
	if en.x == nil {
		return false
	}
	for _, t := range en.x.triggers {
		if decisionID(en.id, t.seq, t.at) == id {
			return true
		}
	}
	return false
}

// describeStored names a message found on a decision subject, for logs and
// the record's Forgery.
func describeStored(seq uint64, e *events.Event, err error) string {
	if e == nil {
		return fmt.Sprintf("stream sequence %d (not a decided event)", seq)
	}
	found := fmt.Sprintf("stream sequence %d (event %q from %q)", seq, e.ID(), e.Source())
	if err != nil {
		found += ": " + err.Error()
	}
	return found
}

// requestRecord builds the record of an open request from its request
// message.
func (l *ledger) requestRecord(en *entry) (Record, error) {
	rec := Record{ID: en.id, State: StatePending, RequestSeq: en.reqSeq, ReceivedAt: en.receivedAt(), judging: true,
		Request: events.Requested{Agent: en.agent, Session: en.session}, Source: en.source}
	if en.req() == nil {
		rec.partial = true // the rest is in the stream, at RequestSeq
		return rec, nil
	}
	e := l.decode(en.x.req.Header, en.x.req.Data)
	if e == nil {
		return rec, nil
	}
	req, err := events.DecodeRequested(e)
	if err != nil {
		return rec, nil
	}
	req.Agent = en.agent
	rec.Request = req
	rec.RequestDigest, _ = events.RequestDigest(req)
	rec.Deadline = rec.ReceivedAt.Add(l.b.cfg.clamp(req.Timeout.Std())).UTC()
	return rec, nil
}

// sweep forgets requests open for orphanAfter with neither a pending event
// nor a decision.
func (l *ledger) sweep() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.compactYoung(time.Now().Add(-orphanAfter).UnixNano())
}

// status is what the ledger knows of a request at the moment a handler
// asks.
type status struct {
	known   bool   // open: requested or pending
	reqSeq  uint64 // its first request message
	pending bool
	rec     Record  // its state (pending), or what its request says
	result  error   // what the answer or cancel asked about did
	counted bool    // that answer or cancel was applied
	prop    *Record // the outcome the stored messages make, if any
	level   int     // the level the expiry batch asked about reached, 0 if none
}

// status returns what the ledger knows of open request id, with the result
// of the message at seq (0: none). The record of a request still being
// judged is read from its request message only withRequest.
func (l *ledger) status(id string, seq uint64, withRequest bool) status {
	l.mu.Lock()
	defer l.mu.Unlock()
	en := l.open[id]
	if en == nil {
		return status{}
	}
	st := status{known: true, reqSeq: en.reqSeq, pending: en.pendSeq != 0}
	if en.x != nil {
		st.level = en.x.escalated[seq]
	}
	if st.pending {
		st.rec = en.record()
	} else if withRequest {
		st.rec, _ = l.requestRecord(en)
	}
	if en.x != nil {
		if err, ok := en.x.results[seq]; ok {
			st.result, st.counted = err, true
		}
	}
	if en.proposal != nil {
		p := *en.proposal
		st.prop = &p
	}
	return st
}

// view returns the state of open request id as readers see it: pending
// until its decision is stored.
func (l *ledger) view(id string) (Record, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	en := l.open[id]
	if en == nil {
		return Record{}, false
	}
	if en.pendSeq != 0 {
		return en.record(), true
	}
	rec, _ := l.requestRecord(en)
	rec.revision = en.reqSeq
	return rec, true
}

// traceOf returns the trace context (traceparent, tracestate) of open
// request id, without building its record: every expiry asks for it.
func (l *ledger) traceOf(id string) (parent, state string, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	en := l.open[id]
	switch {
	case en == nil:
		return "", "", false
	case en.pendSeq != 0 && en.rec != nil:
		return en.rec.TraceParent, en.rec.TraceState, true
	case en.pendSeq != 0 && en.cold != nil:
		if c := en.cold.coldMore; c != nil {
			return c.traceParent, c.traceState, true
		}
		return "", "", true
	}
	rec, _ := l.requestRecord(en)
	return rec.TraceParent, rec.TraceState, true
}

// openCount counts the open requests.
func (l *ledger) openCount() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.open)
}
