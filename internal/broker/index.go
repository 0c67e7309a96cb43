package broker

import (
	"cmp"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/btree"

	"github.com/assent-dev/assent/pkg/events"
)

// Index bounds.
const (
	// DefaultKeepDecided is how many decided requests each replica keeps in
	// its index for listings, newest first. Older ones are read from the
	// stream (GET by id, and the audit log).
	DefaultKeepDecided = 10000
	// indexArgsLimit is the largest args (and payload) an index entry keeps;
	// a listing reads a request with larger ones from the ledger or the stream.
	indexArgsLimit = 16 << 10
)

// index is this replica's listing of requests, kept by the ledger: every
// pending request in arrival order, and the most recent decided ones, newest
// first. Listings find their requests in it instead of
// in the ledger or the stream.
//
// A pending request is held compactly, as an item: its id, arrival time,
// revision, agent and session (names held once however many items share
// them); List reads its record from the ledger. A decided one keeps its
// record, large args trimmed. Items sit on shelves (pending, decided, and
// decided with each outcome), each of which orders them by time, by agent and
// by session, and counts them by agent and by agent and session, so that a
// listing seeks to its page and counts its total without a walk.
type index struct {
	mu       sync.RWMutex
	pending  map[string]*item
	decided  map[string]*decidedItem
	names    map[string]*name
	waiting  *shelf           // pending requests, oldest first
	done     *shelf           // decided requests, newest first
	outcomes map[State]*shelf // decided requests by state, newest first
	keep     int
}

// item is one request in the index.
type item struct {
	id string
	// at is when the request arrived while it is pending, when it was
	// decided after that, in Unix nanoseconds (nanos).
	at       int64
	revision uint64
	agent    *name // nil: none
	session  *name // nil: none
}

// decidedItem is a decided request in the index, with its record.
type decidedItem struct {
	item
	indexed
}

// indexed is the record of a request as the index has it, which may lack
// large args (trimmed); List reads those from the stream.
type indexed struct {
	rec     Record
	trimmed bool
}

// name is an agent or session name, held once however many items name it.
type name struct {
	s    string
	refs int // items naming it
}

func (n *name) String() string {
	if n == nil {
		return ""
	}
	return n.s
}

func newIndex(keep int) *index {
	return &index{
		pending:  make(map[string]*item),
		decided:  make(map[string]*decidedItem),
		names:    make(map[string]*name),
		waiting:  newShelf(false),
		done:     newShelf(true),
		outcomes: make(map[State]*shelf),
		keep:     keep,
	}
}

// put records rec, unless the index holds a newer revision of it.
func (x *index) put(rec Record) {
	var d *decidedItem
	if rec.State != StatePending && rec.Decision != nil {
		d = &decidedItem{indexed: indexed{rec: rec, trimmed: rec.partial}}
		if len(rec.Request.Args) > indexArgsLimit {
			d.rec.Request.Args, d.trimmed = nil, true
		}
		if dec := rec.Decision; len(dec.Args) > indexArgsLimit || len(dec.Payload) > indexArgsLimit {
			trimmed := *dec
			trimmed.Args, trimmed.Payload = nil, nil
			d.rec.Decision, d.trimmed = &trimmed, true
		}
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	if old, pending := x.find(rec.ID); old != nil {
		switch {
		case old.revision > rec.revision:
			return
		case old.revision == rec.revision && pending && rec.State == StatePending:
			// The same revision of a pending request (List reads those
			// from the ledger): nothing changes.
			return
		}
		x.drop(old, pending)
	}
	switch {
	case rec.State == StatePending:
		it := &item{
			id:       rec.ID,
			at:       nanos(rec.ReceivedAt),
			revision: rec.revision,
			agent:    x.intern(rec.Request.Agent),
			session:  x.intern(rec.Request.Session),
		}
		x.pending[it.id] = it
		x.waiting.add(it)
	case d != nil:
		d.item = item{id: rec.ID, at: nanos(rec.Decision.DecidedAt), revision: rec.revision}
		if x.done.byTime.Len() >= x.keep {
			oldest, _ := x.done.byTime.Max()
			if before(&d.item, oldest) {
				return // older than everything kept
			}
			x.drop(oldest, false)
		}
		d.agent, d.session = x.intern(rec.Request.Agent), x.intern(rec.Request.Session)
		x.decided[rec.ID] = d
		x.done.add(&d.item)
		x.outcome(rec.State).add(&d.item)
	}
}

// find returns the item of id, and whether it is pending; nil if the index
// does not hold id.
func (x *index) find(id string) (*item, bool) {
	if it, ok := x.pending[id]; ok {
		return it, true
	}
	if d, ok := x.decided[id]; ok {
		return &d.item, false
	}
	return nil, false
}

// outcome returns the shelf of decided requests in state s.
func (x *index) outcome(s State) *shelf {
	sh, ok := x.outcomes[s]
	if !ok {
		sh = newShelf(true)
		x.outcomes[s] = sh
	}
	return sh
}

// remove forgets id.
func (x *index) remove(id string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if it, pending := x.find(id); it != nil {
		x.drop(it, pending)
	}
}

func (x *index) drop(it *item, pending bool) {
	if pending {
		x.waiting.remove(it)
		delete(x.pending, it.id)
	} else {
		x.done.remove(it)
		x.outcomes[x.decided[it.id].rec.State].remove(it)
		delete(x.decided, it.id)
	}
	x.release(it.agent)
	x.release(it.session)
}

// intern returns the name s, nil for "", and counts one more item naming it.
func (x *index) intern(s string) *name {
	if s == "" {
		return nil
	}
	n, ok := x.names[s]
	if !ok {
		n = &name{s: s}
		x.names[s] = n
	}
	n.refs++
	return n
}

// release counts one item less naming n, and forgets n after the last.
func (x *index) release(n *name) {
	if n == nil {
		return
	}
	if n.refs--; n.refs == 0 {
		delete(x.names, n.s)
	}
}

// get returns the indexed record of id and whether it was trimmed. That of a
// pending request holds only its id, state, agent, session, arrival time and
// revision, and is always trimmed.
func (x *index) get(id string) (Record, bool, bool) {
	x.mu.RLock()
	defer x.mu.RUnlock()
	if it, ok := x.pending[id]; ok {
		return it.record(), true, true
	}
	if d, ok := x.decided[id]; ok {
		return d.rec, d.trimmed, true
	}
	return Record{}, false, false
}

// record returns what the index knows of pending request it.
func (it *item) record() Record {
	return Record{
		ID:         it.id,
		State:      StatePending,
		Request:    events.Requested{Agent: it.agent.String(), Session: it.session.String()},
		ReceivedAt: time.Unix(0, it.at).UTC(),
		revision:   it.revision,
	}
}

// getDecided returns the record of decided request id as the index keeps
// it, and whether it was trimmed.
func (x *index) getDecided(id string) (Record, bool, bool) {
	x.mu.RLock()
	defer x.mu.RUnlock()
	if d, ok := x.decided[id]; ok {
		return d.rec, d.trimmed, true
	}
	return Record{}, false, false
}

// noteForgery records on decided request id a message found on its
// decision subject after its decision, unless one is noted already.
func (x *index) noteForgery(id, what string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if d, ok := x.decided[id]; ok && d.rec.Forgery == "" {
		d.rec.Forgery = what
	}
}

// pendingCount reports how many requests are pending.
func (x *index) pendingCount() int {
	x.mu.RLock()
	defer x.mu.RUnlock()
	return len(x.pending)
}

// size counts the indexed requests.
func (x *index) size() int {
	x.mu.RLock()
	defer x.mu.RUnlock()
	return len(x.pending) + len(x.decided)
}

// list returns the ids of up to f.Limit requests matching f in listing order
// (pending: oldest first; decided: newest first), after the request f.After
// names, and how many match in all. An After the index does not hold starts
// from the first; one it holds that does not match f ends the listing, except
// in a listing of pending requests one decided since, which goes on from where
// it arrived.
func (x *index) list(f Filter) (ids []string, total int) {
	x.mu.RLock()
	defer x.mu.RUnlock()
	var q query
	if f.Agent != "" {
		if q.agent = x.names[f.Agent]; q.agent == nil {
			return nil, 0
		}
	}
	if f.Session != "" {
		if q.session = x.names[f.Session]; q.session == nil {
			return nil, 0
		}
	}
	var shelves []*shelf
	if (f.State == "" && !f.Decided) || f.State == StatePending {
		shelves = append(shelves, x.waiting)
	}
	switch {
	case f.State == StatePending:
	case f.State == "":
		shelves = append(shelves, x.done)
	case x.outcomes[f.State] != nil:
		shelves = append(shelves, x.outcomes[f.State])
	}

	limit, from := max(f.Limit, 0), -1
	var after *item
	if f.After != "" {
		if it, pending := x.find(f.After); it != nil {
			on := x.waiting
			if !pending {
				on = x.done
				if f.State != "" {
					on = x.outcomes[x.decided[it.id].rec.State]
				}
			}
			after, from = it, slices.Index(shelves, on)
			if from < 0 && f.State == StatePending {
				// Decided since the previous page listed it as pending:
				// go on from where it stood among the pending.
				d := x.decided[it.id]
				after, from = &item{id: it.id, at: nanos(d.rec.ReceivedAt), agent: it.agent, session: it.session}, 0
			}
			if from < 0 || !q.matches(it) {
				limit = 0
			}
		}
	}
	found := make([]*item, 0, min(limit, 128))
	for i, sh := range shelves {
		start, n := (*item)(nil), limit-len(found)
		switch {
		case i < from:
			n = 0 // the page starts on a later shelf
		case i == from:
			start = after
		}
		var count int
		found, count = sh.list(q, start, n, found)
		total += count
	}
	ids = make([]string, len(found))
	for i, it := range found {
		ids[i] = it.id
	}
	return ids, total
}

// query is a listing's filter by agent and session, nil for any.
type query struct{ agent, session *name }

func (q query) matches(it *item) bool {
	return (q.agent == nil || it.agent == q.agent) && (q.session == nil || it.session == q.session)
}

// shelf holds one kind of request (pending, decided, or decided with one
// outcome) in the orders listings read them in, and counts them. Its trees
// hold the newest first, in each agent and session: requests come in time
// order, and a btree whose items go in at its left end packs its nodes full,
// while at its right end it leaves them half empty.
type shelf struct {
	byTime    *btree.BTreeG[*item] // by time
	byAgent   *btree.BTreeG[*item] // those with an agent, by agent, then time
	bySession *btree.BTreeG[*item] // those with a session, by session, agent, time
	// counts has the items of each agent under {agent, nil}, and of each
	// session and agent (nil: none) under {agent, session}.
	counts map[pair]int
	newest bool // listed newest first, else oldest first
}

type pair struct{ agent, session *name }

func newShelf(newest bool) *shelf {
	return &shelf{
		byTime:    btree.NewG(32, newer),
		byAgent:   btree.NewG(32, byAgent),
		bySession: btree.NewG(32, bySession),
		counts:    make(map[pair]int),
		newest:    newest,
	}
}

func (sh *shelf) add(it *item) {
	sh.byTime.ReplaceOrInsert(it)
	if it.agent != nil {
		sh.byAgent.ReplaceOrInsert(it)
		sh.counts[pair{it.agent, nil}]++
	}
	if it.session != nil {
		sh.bySession.ReplaceOrInsert(it)
		sh.counts[pair{it.agent, it.session}]++
	}
}

func (sh *shelf) remove(it *item) {
	sh.byTime.Delete(it)
	if it.agent != nil {
		sh.byAgent.Delete(it)
		sh.uncount(pair{it.agent, nil})
	}
	if it.session != nil {
		sh.bySession.Delete(it)
		sh.uncount(pair{it.agent, it.session})
	}
}

func (sh *shelf) uncount(p pair) {
	if n := sh.counts[p] - 1; n > 0 {
		sh.counts[p] = n
	} else {
		delete(sh.counts, p)
	}
}

// list appends to out up to n items that match q in listing order, from the
// one after start (nil: from the first), and counts the items that match q.
func (sh *shelf) list(q query, start *item, n int, out []*item) ([]*item, int) {
	switch {
	case q.agent == nil && q.session == nil:
		all := func(*item) bool { return true }
		return sh.walk(sh.byTime, sh.from(start, nil, nil), start, n, out, all), sh.byTime.Len()
	case q.session == nil:
		return sh.walk(sh.byAgent, sh.from(start, q.agent, nil), start, n, out, q.matches), sh.counts[pair{q.agent, nil}]
	case q.agent != nil:
		return sh.walk(sh.bySession, sh.from(start, q.agent, q.session), start, n, out, q.matches), sh.counts[pair{q.agent, q.session}]
	}
	// A session alone: the pages of each of its agents, merged.
	base, total := len(out), 0
	for _, agent := range sh.agentsIn(q.session) {
		run := query{agent: agent, session: q.session}
		out = sh.walk(sh.bySession, sh.from(start, agent, q.session), start, n, out, run.exactly)
		total += sh.counts[pair{agent, q.session}]
	}
	page := out[base:]
	slices.SortFunc(page, func(a, b *item) int {
		if sh.newest {
			return cmpTime(b, a)
		}
		return cmpTime(a, b)
	})
	return out[:base+min(n, len(page))], total
}

// exactly reports whether it has q's agent (nil: none) and session.
func (q query) exactly(it *item) bool { return it.agent == q.agent && it.session == q.session }

// from returns where a walk of the items of agent and session (nil: any)
// starts in listing order: at start, or before the first.
func (sh *shelf) from(start *item, agent, session *name) *item {
	switch {
	case start != nil:
		return &item{id: start.id, at: start.at, agent: agent, session: session}
	case sh.newest:
		return &item{at: math.MaxInt64, agent: agent, session: session}
	}
	return &item{at: math.MinInt64, agent: agent, session: session}
}

// walk appends to out up to n items of t from pivot on in listing order,
// leaving out skip, while in holds.
func (sh *shelf) walk(t *btree.BTreeG[*item], pivot, skip *item, n int, out []*item, in func(*item) bool) []*item {
	if n <= 0 {
		return out
	}
	visit := func(it *item) bool {
		if !in(it) {
			return false
		}
		if it != skip {
			out = append(out, it)
			n--
		}
		return n > 0
	}
	if sh.newest {
		t.AscendGreaterOrEqual(pivot, visit)
	} else {
		t.DescendLessOrEqual(pivot, visit)
	}
	return out
}

// agentsIn returns the agents (nil: none) of the items in session.
func (sh *shelf) agentsIn(session *name) []*name {
	var agents []*name
	pivot := &item{session: session, at: math.MaxInt64}
	for {
		var next *item
		sh.bySession.AscendGreaterOrEqual(pivot, func(it *item) bool {
			next = it
			return false
		})
		if next == nil || next.session != session {
			return agents
		}
		agents = append(agents, next.agent)
		pivot = &item{session: session, agent: next.agent, at: math.MinInt64}
	}
}

// Orders of items. cmpTime orders by time, then id: oldest first. Names
// compare by their text, nil as "".
func cmpTime(a, b *item) int {
	if c := cmp.Compare(a.at, b.at); c != 0 {
		return c
	}
	return strings.Compare(a.id, b.id)
}

func before(a, b *item) bool { return cmpTime(a, b) < 0 }

func newer(a, b *item) bool { return cmpTime(a, b) > 0 }

func byAgent(a, b *item) bool {
	if a.agent != b.agent {
		return a.agent.String() < b.agent.String()
	}
	return newer(a, b)
}

func bySession(a, b *item) bool {
	if a.session != b.session {
		return a.session.String() < b.session.String()
	}
	return byAgent(a, b)
}

// nanos returns t in Unix nanoseconds, kept clear of the bounds listings
// seek from: times before 1678 or after 2262 (never a request's) collapse to
// the nearest that fits.
func nanos(t time.Time) int64 {
	switch {
	case t.Before(earliest):
		return math.MinInt64 + 1
	case t.After(latest):
		return math.MaxInt64 - 1
	}
	return t.UnixNano()
}

var earliest, latest = time.Unix(0, math.MinInt64+1), time.Unix(0, math.MaxInt64-1)
