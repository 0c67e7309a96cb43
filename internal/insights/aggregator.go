package insights

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unique"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/assent-dev/assent/pkg/events"
)

// Config says how much an Aggregator keeps.
type Config struct {
	// Keep is how long the aggregator keeps what it folded, counted back
	// from the stored time of the newest message it read: set it to the
	// stream's retention (MaxAge). Default DefaultKeep.
	Keep time.Duration
	// MaxOpen bounds the undecided requests whose facts the aggregator
	// keeps until their decision (tool, agent, rule, announcement, a
	// summary of their args, the answers so far). Past it, the oldest is
	// evicted, and its decision is folded without those facts
	// (docs/insights.md, "Memory"). Default DefaultMaxOpen.
	MaxOpen int
	// Trusted, if set, are the keys of brokers that sign their decisions:
	// then a decided event none of them signed is not a decision, as for
	// the broker's own readers. Nil: the first decided event stored on a
	// request's decision subject is its decision.
	Trusted *events.TrustedKeys
}

// Defaults of Config.
const (
	DefaultKeep    = DefaultWindow + 24*time.Hour
	DefaultMaxOpen = 200_000
)

// WithDefaults returns c with every unset field at its default.
func (c Config) WithDefaults() Config {
	if c.Keep == 0 {
		c.Keep = DefaultKeep
	}
	if c.MaxOpen == 0 {
		c.MaxOpen = DefaultMaxOpen
	}
	return c
}

// Validate reports every problem with c at once. Call it on WithDefaults'
// result.
func (c Config) Validate() error {
	var errs []error
	if c.Keep < time.Hour || c.Keep > 10*366*24*time.Hour {
		errs = append(errs, fmt.Errorf("keep %s: want 1h to 10 years", c.Keep))
	}
	if c.MaxOpen < 1 {
		errs = append(errs, fmt.Errorf("max open %d: want at least 1", c.MaxOpen))
	}
	return errors.Join(errs...)
}

// Aggregator folds the stored messages of the ASSENT stream, read in stream
// order, into hourly buckets and daily groups, and answers Query and
// History from them. It is safe for concurrent use: one goroutine adds (the
// follower, Follow) while others query.
type Aggregator struct {
	cfg   Config
	names *names

	// mu guards what Add writes and Query reads: open requests, buckets,
	// examples.
	mu sync.RWMutex
	// open holds the requests read and not yet decided; queue the same in
	// the order they were opened (with entries decided since, skipped),
	// for eviction.
	open  map[string]*entry
	queue []*entry
	qhead int
	// evicted are the requests evicted while open: their decision is
	// folded without their facts. recent are requests decided lately: a
	// later message about one of them starts no request, and a later
	// message on its decision subject is not its decision.
	evicted, recent *idset
	// evictedUpTo is the highest request sequence evicted: requests are
	// opened and evicted in stream order, so a decision naming a request
	// at or below it, not open and not decided, is an evicted one's (a
	// backlog larger than MaxOpen evicts more than evicted remembers).
	evictedUpTo uint64
	first       uint64 // the sequence of the first message added
	clock       int64  // the newest stored time read (Unix nanoseconds)
	clockHour   int64
	clockDay    int32
	hours       hours
	// stamps keeps each approver's last fast answers, disputed each
	// disagreement pair's last requests, unlooked the last approvals given
	// without an edit or a look at the detail (under id 0).
	stamps, disputed, unlooked map[uint32]*examples
	stats                      Stats

	// gmu guards the groups, which History reads for every request
	// announced: it is held only for moments.
	gmu   sync.RWMutex
	pairs map[pairKey]*pair

	through    atomic.Uint64
	start, end atomic.Uint64
	caught     atomic.Bool
}

// Stats counts what an Aggregator holds.
type Stats struct {
	// Open requests, and those evicted while open since the start.
	Open, Evicted int
	// DecidedWithoutFacts counts decisions folded without their request's
	// facts (evicted, or requested before the first message read).
	DecidedWithoutFacts int
	// Hours held, and of them Sealed; their Cells and ApproverCells.
	Hours, Sealed, Cells, ApproverCells int
	// Pairs ((tool, agent)) and their group-days held.
	Pairs, GroupDays int
}

// maxPairs bounds the (tool, agent) pairs whose groups the aggregator
// keeps: decisions of pairs past it count in the buckets only.
const maxPairs = 1 << 16

// New returns an aggregator with cfg (defaults applied).
func New(cfg Config) (*Aggregator, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("insights config: %w", err)
	}
	return &Aggregator{
		cfg:      cfg,
		names:    newNames(),
		open:     make(map[string]*entry),
		evicted:  newIDSet(cfg.MaxOpen),
		recent:   newIDSet(recentDecided),
		stamps:   make(map[uint32]*examples),
		disputed: make(map[uint32]*examples),
		unlooked: make(map[uint32]*examples),
		pairs:    make(map[pairKey]*pair),
	}, nil
}

// recentDecided is how many decided request ids the aggregator remembers,
// to tell a later copy of a request, or a later message on its decision
// subject, from a new one.
const recentDecided = 1 << 16

// entry is what the aggregator keeps of an open request.
type entry struct {
	id          string
	tool, agent uint32
	rule, arule uint32
	// announced is when its pending event was stored (Unix nanoseconds; 0:
	// not announced).
	announced int64
	digest    uint64 // of its args (digestKey), from its pending event
	args      []argVal
	hasArgs   bool
	answers   []answer
	shadow    uint32 // the disagreement pair of its shadow audit, 0 if none
	// seq is the stream sequence of its request message (0: opened by
	// its pending event).
	seq uint64
	// done: decided or evicted (the queue still holds it).
	done bool
	// thin: folded without its facts.
	thin bool
}

// answer is one answer to an open request.
type answer struct {
	principal uint32
	detail    bool
	at, shown int64 // stored; shown by the channel (0: not said)
}

// maxAnswers bounds the answers kept per open request.
const maxAnswers = 16

// Add folds one stored message of the stream into the aggregator. Messages
// must come in stream order; one whose sequence is not above the last added
// is ignored (read twice). Messages on subjects the aggregator has no use
// for only advance it.
func (a *Aggregator) Add(msg *jetstream.RawStreamMsg) {
	seq := msg.Sequence
	if seq <= a.through.Load() {
		return
	}
	at := msg.Time.UnixNano()
	apply := a.read(msg, at)
	a.mu.Lock()
	defer a.mu.Unlock()
	if seq <= a.through.Load() {
		return
	}
	if a.first == 0 {
		a.first = seq
	}
	a.tick(at)
	if apply != nil {
		apply()
	}
	a.through.Store(seq)
}

// read decodes msg, without the lock, into what applying it does with the
// lock held; nil for nothing.
func (a *Aggregator) read(msg *jetstream.RawStreamMsg, at int64) func() {
	subj, h := msg.Subject, msg.Header
	switch {
	case strings.HasPrefix(subj, events.DecisionPrefix):
		// Read whatever stored it: a schedule's message on a decision
		// subject is read as the broker's readers read it.
		if d, ok := readDecision(subj[len(events.DecisionPrefix):], h, msg.Data, a.cfg.Trusted); ok {
			return func() { a.decision(&d, at) }
		}
	case scheduled(h):
	case strings.HasPrefix(subj, events.RequestPrefix):
		// assent.request.<agent>: the broker takes no other.
		if agent := subj[len(events.RequestPrefix):]; events.ValidToken(agent) {
			if r, ok := readRequest(h, msg.Data); ok {
				seq := msg.Sequence
				return func() { a.request(r, agent, seq) }
			}
		}
	case strings.HasPrefix(subj, events.PendingPrefix):
		if p, ok := readPending(h, msg.Data); ok {
			if p.agent == "" {
				p.agent = subj[len(events.PendingPrefix):]
			}
			vals := a.values(p.args)
			return func() { a.pending(&p, vals, at) }
		}
	case strings.HasPrefix(subj, events.ResponsePrefix):
		if m, ok := readAnswer(subj, h, msg.Data); ok {
			return func() { a.answer(&m, at) }
		}
	case strings.HasPrefix(subj, events.ShadowPrefix):
		if s, ok := readShadow(h, msg.Data); ok {
			return func() { a.shadow(&s, at) }
		}
	}
	return nil
}

// values interns the fields and values of args.
func (a *Aggregator) values(args []argIn) []argVal {
	if len(args) == 0 {
		return nil
	}
	out := make([]argVal, len(args))
	for i, v := range args {
		out[i] = argVal{field: a.names.id(v.field), kind: v.kind, text: v.text, num: v.num, hash: v.hash}
		if v.json != "" {
			out[i].kept, out[i].json = true, unique.Make(v.json)
		}
	}
	return out
}

// tick moves the aggregator's clock to at, if later: hours left behind are
// sealed, and what is older than Keep is dropped.
func (a *Aggregator) tick(at int64) {
	if at <= a.clock {
		return
	}
	a.clock = at
	if hr := hourOf(at); hr > a.clockHour {
		a.clockHour = hr
		sealed := hourOf(at - int64(sealAfter))
		for _, h := range a.hours {
			if h.start < sealed {
				h.seal()
			}
		}
		a.hours.prune(hourOf(at - int64(a.cfg.Keep)))
	}
	if d := dayOf(at); d > a.clockDay {
		a.clockDay = d
		first := dayOf(at - int64(a.cfg.Keep))
		a.gmu.Lock()
		for k, p := range a.pairs {
			if p.prune(first) {
				delete(a.pairs, k)
			}
		}
		a.gmu.Unlock()
	}
}

// opened adds en to the open requests, evicting the oldest if there are
// MaxOpen already.
func (a *Aggregator) opened(en *entry) {
	for len(a.open) >= a.cfg.MaxOpen && a.qhead < len(a.queue) {
		old := a.queue[a.qhead]
		a.queue[a.qhead] = nil
		a.qhead++
		if old.done {
			continue
		}
		old.done = true
		delete(a.open, old.id)
		a.evicted.add(hashString(old.id))
		a.evictedUpTo = max(a.evictedUpTo, old.seq)
		a.stats.Evicted++
	}
	a.open[en.id] = en
	a.queue = append(a.queue, en)
	// Entries decided since they were queued are dropped from the queue
	// once they are most of it.
	if live := len(a.queue) - a.qhead; live > 2*len(a.open)+1024 || a.qhead > live {
		kept := make([]*entry, 0, len(a.open)+len(a.open)/2)
		for _, e := range a.queue[a.qhead:] {
			if !e.done {
				kept = append(kept, e)
			}
		}
		a.queue, a.qhead = kept, 0
	}
}

// close removes open request en.
func (a *Aggregator) close(en *entry) {
	en.done = true
	delete(a.open, en.id)
}

func (a *Aggregator) request(r requestMsg, agent string, seq uint64) {
	if _, ok := a.open[r.id]; ok {
		return // a copy: the first one stands
	}
	if a.recent.has(hashString(r.id)) {
		return // a copy of a request decided already
	}
	a.opened(&entry{id: r.id, seq: seq, tool: a.names.id(r.tool), agent: a.names.id(agent)})
}

func (a *Aggregator) pending(p *pendingMsg, vals []argVal, at int64) {
	en := a.open[p.id]
	if en == nil {
		h := hashString(p.id)
		if a.recent.has(h) {
			return
		}
		// Its request message came before the first one read, or was
		// evicted: the pending event says what it held.
		a.evicted.remove(h)
		en = &entry{id: p.id}
		a.opened(en)
	}
	if en.announced != 0 {
		return // announced again: the first one stands
	}
	en.announced = at
	en.tool, en.agent = a.names.id(p.tool), a.names.id(p.agent)
	en.rule, en.arule = a.names.id(p.rule), a.names.id(p.arule)
	en.args, en.hasArgs, en.digest = vals, p.hasArgs, p.digest
}

func (a *Aggregator) answer(m *answerMsg, at int64) {
	en := a.open[m.id]
	if en == nil || len(en.answers) >= maxAnswers {
		return
	}
	an := answer{principal: a.names.id(m.principal), at: at, detail: m.detail}
	if !m.shown.IsZero() {
		an.shown = m.shown.UnixNano()
	}
	en.answers = append(en.answers, an)
}

func (a *Aggregator) shadow(s *shadowMsg, at int64) {
	pairID := a.names.id(s.live + "\x00" + s.shadow)
	if en := a.open[s.id]; en != nil {
		en.shadow = pairID
		return
	}
	// No open request (a decision stored first, or its request before the
	// first message read): counted when stored, under its tool and agent.
	k := key{agent: a.names.id(s.agent), tool: a.names.id(s.tool)}
	c := a.hours.at(hourOf(at)).cell(k)
	c.more().disputes = addTally(c.more().disputes, pairID)
	a.exampleOf(a.disputed, pairID, example{id: s.id, at: at, key: k})
}

// decision applies the decided event d, stored at at: the first one of its
// request is its decision, folded into the buckets and groups.
func (a *Aggregator) decision(d *decisionMsg, at int64) {
	h := hashString(d.id)
	en := a.open[d.id]
	switch {
	case en != nil:
		a.close(en)
	case a.recent.has(h):
		return // stored after the decision: not a decision
	case a.evicted.has(h):
		a.evicted.remove(h)
		en = &entry{id: d.id, thin: true}
	case d.requestSeq != 0 && d.requestSeq >= a.first && d.requestSeq <= a.evictedUpTo:
		en = &entry{id: d.id, thin: true} // evicted, and forgotten since
	case d.requestSeq != 0 && d.requestSeq < a.first:
		en = &entry{id: d.id, thin: true} // requested before what was read
	default:
		return // about no request read: not a decision
	}
	if en.thin {
		a.stats.DecidedWithoutFacts++
	}
	a.recent.add(h)
	a.fold(en, d, at)
}

// facts is what a decision adds to each cell it counts in.
type facts struct {
	out              int
	people, approved bool
	// decideBin is the bin of the time from announcement to decision,
	// when timed (a decision by people of a request announced).
	decideBin uint8
	timed     bool
	unedited  bool
	unlooked  bool
	edits     []uint32 // fields an edit changed
	dispute   uint32   // the shadow disagreement pair, 0 if none
	key       key
	at        int64 // when the decision was stored
}

// voter is one principal's answer that a decision counts.
type voter struct {
	principal uint32
	at, shown int64
	detail    bool
}

// fold counts the decision d of en, stored at at.
func (a *Aggregator) fold(en *entry, d *decisionMsg, at int64) {
	f := facts{out: outcomeOf(d), at: at, dispute: en.shadow}
	f.people = !d.auto && (d.outcome == events.Approved || d.outcome == events.Denied)
	f.approved = d.outcome == events.Approved
	rule, arule := en.rule, en.arule
	if d.rule != "" || d.arule != "" {
		rule, arule = a.names.id(d.rule), a.names.id(d.arule)
	}
	f.key = key{agent: en.agent, tool: en.tool, rule: rule, arule: arule}
	voters := a.voters(en, d, at)
	if f.people && en.announced != 0 {
		decided := at
		if !d.decidedAt.IsZero() {
			decided = d.decidedAt.UnixNano()
		}
		f.decideBin, f.timed = binOf(time.Duration(decided-en.announced)), true
	}
	if f.people && f.approved && !d.edited {
		f.unedited = true
		f.unlooked = !en.thin
		for _, v := range voters {
			if v.detail {
				f.unlooked = false
			}
		}
	}
	if d.edited && en.hasArgs {
		f.edits = a.editedFields(en.args, d.args)
	}
	h := a.hours.at(hourOf(at))
	h.all[f.out]++
	h.cell(f.key).count(&f)
	for _, v := range voters {
		k := f.key
		k.approver = v.principal
		c := h.cell(k)
		c.count(&f)
		x := c.more()
		x.answers++
		if en.announced != 0 {
			x.answer.add(binOf(time.Duration(v.at - en.announced)))
		}
		shown := v.shown
		if shown == 0 {
			shown = en.announced
		}
		if shown != 0 && v.at-shown < int64(RubberStampUnder) {
			x.fast++
			a.exampleOf(a.stamps, v.principal, example{id: en.id, at: at, key: k})
		}
	}
	if f.unlooked {
		// An example for all, and one for each approver's reports.
		a.exampleOf(a.unlooked, 0, example{id: en.id, at: at, key: f.key})
		for _, v := range voters {
			k := f.key
			k.approver = v.principal
			a.exampleOf(a.unlooked, 0, example{id: en.id, at: at, key: k})
		}
	}
	if f.dispute != 0 {
		// An example for all, and one for each approver's reports.
		a.exampleOf(a.disputed, f.dispute, example{id: en.id, at: at, key: f.key})
		for _, v := range voters {
			k := f.key
			k.approver = v.principal
			a.exampleOf(a.disputed, f.dispute, example{id: en.id, at: at, key: k})
		}
	}
	if !en.thin && (f.people || f.out == outExpired) {
		a.group(en, d, &f, voters)
	}
}

// count adds the decision f to c.
func (c *cell) count(f *facts) {
	c.n[f.out]++
	if !f.people && len(f.edits) == 0 && f.dispute == 0 {
		return
	}
	x := c.more()
	if f.timed {
		x.decide.add(f.decideBin)
	}
	if f.people && f.approved {
		x.approved++
		if f.unedited {
			x.unedited++
		}
		if f.unlooked {
			x.unlooked++
		}
	}
	for _, e := range f.edits {
		x.edited = addTally(x.edited, e)
	}
	if f.dispute != 0 {
		x.disputes = addTally(x.disputes, f.dispute)
	}
}

// outcomeOf returns the count d adds to.
func outcomeOf(d *decisionMsg) int {
	switch {
	case d.outcome == events.Expired:
		return outExpired
	case d.outcome == events.Cancelled:
		return outCancelled
	case d.outcome == events.Approved && d.auto:
		return outAutoApproved
	case d.outcome == events.Approved:
		return outApproved
	case d.auto:
		return outAutoDenied
	}
	return outDenied
}

// voters returns the principals whose answers d counts (those in its
// decided_by with a verdict: a cancel names who cancelled, without one),
// each with what their answer said: the answer stored at the time
// decided_by gives, else their last one read.
func (a *Aggregator) voters(en *entry, d *decisionMsg, at int64) []voter {
	var out []voter
	for _, by := range d.by {
		if by.Decision != events.Approve && by.Decision != events.Deny {
			continue
		}
		p := a.names.id(by.Principal)
		if p == 0 || containsVoter(out, p) {
			continue
		}
		v := voter{principal: p, at: by.At.UnixNano()}
		if by.At.IsZero() {
			v.at = at
		}
		match := -1
		for i, an := range en.answers {
			if an.principal != p {
				continue
			}
			match = i
			if an.at == v.at {
				break
			}
		}
		if match >= 0 {
			an := en.answers[match]
			v.at, v.shown, v.detail = an.at, an.shown, an.detail
		}
		out = append(out, v)
	}
	return out
}

func containsVoter(vs []voter, p uint32) bool {
	for _, v := range vs {
		if v.principal == p {
			return true
		}
	}
	return false
}

// editedFields returns the top-level fields whose values differ between
// the request's args and an edit's (in either, not both, included).
func (a *Aggregator) editedFields(asked []argVal, edit []argIn) []uint32 {
	var out []uint32
	for _, e := range edit {
		id := a.names.id(e.field)
		same := false
		for _, v := range asked {
			if v.field == id {
				same = v.hash == e.hash
				break
			}
		}
		if !same {
			out = append(out, id)
		}
	}
	for _, v := range asked {
		found := false
		for _, e := range edit {
			if a.names.id(e.field) == v.field {
				found = true
				break
			}
		}
		if !found {
			out = append(out, v.field)
		}
	}
	return out
}

// exampleOf keeps ex among the examples of id in m.
func (a *Aggregator) exampleOf(m map[uint32]*examples, id uint32, ex example) {
	e := m[id]
	if e == nil {
		e = &examples{}
		m[id] = e
	}
	e.add(ex)
}

// group counts the decision by people (or expiry) f of en in its pair's
// group of the day.
func (a *Aggregator) group(en *entry, d *decisionMsg, f *facts, voters []voter) {
	a.gmu.Lock()
	defer a.gmu.Unlock()
	pk := pairKey{en.tool, en.agent}
	p := a.pairs[pk]
	if p == nil {
		if len(a.pairs) >= maxPairs {
			return
		}
		p = &pair{pairKey: pk}
		a.pairs[pk] = p
	}
	day := dayOf(f.at)
	g := p.day(day, f.key.rule, f.key.arule, 0)
	if !f.people {
		g.expired++
		return
	}
	ids := make([]uint32, len(voters))
	for i, v := range voters {
		ids[i] = v.principal
	}
	digest := en.digest
	if digest == 0 && !d.edited {
		digest = d.digest
	}
	if !f.approved {
		p.lastDenied = max(p.lastDenied, f.at)
	}
	if !g.split {
		sole, ok := g.sole()
		if g.approved+g.denied == 0 && len(ids) <= 1 || ok && len(ids) == 1 && ids[0] == sole {
			// One approver alone so far: the day of all is its day.
			g.decided(en.id, f.at, f.approved, ids, en.args, en.hasArgs, digest)
			return
		}
		if ok {
			p.add(g.copyFor(sole))
		}
		g.split = true
	}
	g.decided(en.id, f.at, f.approved, ids, en.args, en.hasArgs, digest)
	// And in each approver's group of the day.
	for _, v := range ids {
		p.day(day, f.key.rule, f.key.arule, v).decided(en.id, f.at, f.approved, ids, en.args, en.hasArgs, 0)
	}
}

// Through returns the stream sequence of the last message added.
func (a *Aggregator) Through() uint64 { return a.through.Load() }

// Reading tells the aggregator the stream's first and last sequences when
// its reading started, from which Report.Progress says how far it is.
func (a *Aggregator) Reading(first, last uint64) {
	a.start.Store(first)
	a.end.Store(last)
}

// MarkCaughtUp records that the aggregator has read the stream up to its
// end once: reports are Complete from then on, and History answers.
func (a *Aggregator) MarkCaughtUp() { a.caught.Store(true) }

// CaughtUp reports whether the aggregator has read the stream up to its end
// once.
func (a *Aggregator) CaughtUp() bool { return a.caught.Load() }

// progress returns how far the reading from the start has come, 0 to 1.
func (a *Aggregator) progress() float64 {
	if a.caught.Load() {
		return 1
	}
	first, last, through := a.start.Load(), a.end.Load(), a.through.Load()
	if last == 0 || through < first || last < first {
		return 0
	}
	return min(float64(through-first+1)/float64(last-first+1), 1)
}

// Stats returns what a holds.
func (a *Aggregator) Stats() Stats {
	a.mu.RLock()
	s := a.stats
	s.Open = len(a.open)
	s.Hours = len(a.hours)
	for _, h := range a.hours {
		if h.sealed != nil || h.asealed != nil {
			s.Cells += h.ncells
			s.ApproverCells += h.nacells
			s.Sealed++
		} else {
			s.Cells += len(h.cells)
			s.ApproverCells += len(h.acells)
		}
	}
	a.mu.RUnlock()
	a.gmu.RLock()
	s.Pairs = len(a.pairs)
	for _, p := range a.pairs {
		s.GroupDays += len(p.all) + len(p.by)
	}
	a.gmu.RUnlock()
	return s
}
