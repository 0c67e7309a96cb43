package insights

import (
	"encoding/json"
	"slices"
	"sort"
	"strings"
	"time"
	"unique"

	"github.com/assent-dev/assent/pkg/events"
)

// Groups are what candidates (Report.AlwaysApproved, AlwaysDenied) and
// History read: per (tool, agent), per day and rule, the decisions people
// made and what the arguments of those requests looked like
// (docs/insights.md, "Groups").

type pairKey struct{ tool, agent uint32 }

// pair is what the aggregator keeps of one (tool, agent): its group-days
// of all requests (approver 0), and those of each approver's.
type pair struct {
	pairKey
	all, by days
	// lastDenied is the last denial by people in all.
	lastDenied int64
}

// days are group-days, oldest first.
type days []*groupDay

// groupDay is one pair's requests decided on one day (UTC) under one rule:
// all of them (approver 0), or those one approver answered. A report with
// an approver filter reads only that approver's, so that what it shows (the
// argument values, the examples) comes from requests the approver answered.
// While one approver alone answered a day's requests, the day of all of
// them is that approver's too; it gets one of its own (split) once another
// answers.
type groupDay struct {
	day         int32 // Unix days
	rule, arule uint32
	approver    uint32
	split       bool
	// approved and denied count the decisions people made, expired the
	// requests that expired waiting for them.
	approved, denied, expired uint32
	// withArgs counts the decisions by people whose requests' args were
	// read: fields seen fewer times were missing from some (Optional).
	withArgs    uint32
	first, last int64 // Unix nanoseconds of the first and last decision by people
	// lastApproved and lastDenied are the last approval and denial by
	// people (Unix nanoseconds; 0: none).
	lastApproved, lastDenied int64
	// principals count the decisions each principal took part in; nil in
	// an approver's group-day where it alone answered each.
	principals []vote
	fields     []fieldPat
	// digests count the decisions by people per args digest, for
	// History's Exact (all requests only): at most maxDigests distinct
	// digests a day.
	digests []digestCount
	// examples are the day's last dayExamples decisions by people, in a
	// ring indexed by their count.
	examples [dayExamples]dayExample
}

// vote counts the decisions one principal took part in.
type vote struct{ id, approved, denied uint32 }

// digestCount counts the decisions of one args digest (its first 4 bytes:
// two digests of one group-day that share them are counted as one).
type digestCount struct{ digest, n uint32 }

// dayExample is a request people decided: at is when, in Unix nanoseconds,
// shifted left by one, with the lowest bit set for an approval.
type dayExample struct {
	id string
	at int64
}

func (e dayExample) approved() bool { return e.at&1 == 1 }
func (e dayExample) when() int64    { return e.at >> 1 }

// Bounds of a group-day: the distinct args digests it counts, the fields it
// describes, and the example ids it keeps (the day's last ones).
const (
	maxDigests  = 64
	maxDayField = 32
	dayExamples = 4
)

// dayOf returns the Unix day of t (Unix nanoseconds).
func dayOf(t int64) int32 {
	const day = 24 * hourNanos
	if t < 0 {
		return int32((t+1)/day - 1)
	}
	return int32(t / day)
}

// day returns p's group-day of day, rules and approver, made if need be.
func (p *pair) day(day int32, rule, arule, approver uint32) *groupDay {
	ds := &p.all
	if approver != 0 {
		ds = &p.by
	}
	for i := len(*ds) - 1; i >= 0; i-- {
		g := (*ds)[i]
		if g.day < day {
			break
		}
		if g.day == day && g.rule == rule && g.arule == arule && g.approver == approver {
			return g
		}
	}
	return p.add(&groupDay{day: day, rule: rule, arule: arule, approver: approver})
}

// add adds g to p's group-days.
func (p *pair) add(g *groupDay) *groupDay {
	ds := &p.all
	if g.approver != 0 {
		ds = &p.by
	}
	i := len(*ds)
	for i > 0 && (*ds)[i-1].day > g.day {
		i--
	}
	*ds = slices.Insert(*ds, i, g)
	return g
}

// window returns the group-days of days from to to.
func (ds days) window(from, to int32) days {
	i := sort.Search(len(ds), func(i int) bool { return ds[i].day >= from })
	j := sort.Search(len(ds), func(i int) bool { return ds[i].day > to })
	return ds[i:max(i, j)]
}

// of calls fn with the group-days of days from to to (from > to: of all
// days) that hold the decisions approver (0: everyone's) took part in.
func (p *pair) of(approver uint32, from, to int32, fn func(*groupDay)) {
	lists := []days{p.all}
	if approver != 0 {
		lists = append(lists, p.by)
	}
	for _, ds := range lists {
		if from <= to {
			ds = ds.window(from, to)
		}
		for _, g := range ds {
			if g.of(approver) {
				fn(g)
			}
		}
	}
}

// sole returns the principal who alone took part in every decision of g.
func (g *groupDay) sole() (uint32, bool) {
	if len(g.principals) == 1 && g.principals[0].approved+g.principals[0].denied == g.approved+g.denied {
		return g.principals[0].id, true
	}
	return 0, false
}

// of reports whether g holds the decisions approver (0: everyone's) took
// part in: its own group-day, or a day of all that it alone answered.
func (g *groupDay) of(approver uint32) bool {
	if g.approver == approver {
		return true
	}
	if approver == 0 || g.approver != 0 || g.split {
		return false
	}
	p, ok := g.sole()
	return ok && p == approver
}

// copyFor returns a copy of g, a day of all that approver alone answered,
// as approver's own.
func (g *groupDay) copyFor(approver uint32) *groupDay {
	c := &groupDay{day: g.day, rule: g.rule, arule: g.arule, approver: approver,
		approved: g.approved, denied: g.denied, withArgs: g.withArgs,
		first: g.first, last: g.last, lastApproved: g.lastApproved, lastDenied: g.lastDenied,
		fields: slices.Clone(g.fields), examples: g.examples}
	for i := range c.fields {
		c.fields[i].values = slices.Clone(c.fields[i].values)
	}
	return c
}

// prune drops p's group-days before day first, and reports whether p
// holds none.
func (p *pair) prune(first int32) bool {
	for _, ds := range []*days{&p.all, &p.by} {
		i := sort.Search(len(*ds), func(i int) bool { return (*ds)[i].day >= first })
		if i > 0 {
			clear((*ds)[:i])
			*ds = (*ds)[i:]
		}
	}
	p.lastDenied = 0
	for _, g := range p.all {
		p.lastDenied = max(p.lastDenied, g.lastDenied)
	}
	return len(p.all) == 0 && len(p.by) == 0
}

// decided counts a decision by people (approved or denied) of request id at
// at, by voters, whose request had args (when hasArgs: the args were read)
// with digest (0: unknown).
func (g *groupDay) decided(id string, at int64, approved bool, voters []uint32, args []argVal, hasArgs bool, digest uint64) {
	if g.approver != 0 && g.principals == nil {
		if len(voters) == 1 {
			voters = nil // the approver alone, as votes() says
		} else {
			g.principals = g.votes() // from now on, counted one by one
		}
	}
	if approved {
		g.approved++
		g.lastApproved = max(g.lastApproved, at)
	} else {
		g.denied++
		g.lastDenied = max(g.lastDenied, at)
	}
	if g.first == 0 || at < g.first {
		g.first = at
	}
	g.last = max(g.last, at)
	for _, p := range voters {
		i := slices.IndexFunc(g.principals, func(v vote) bool { return v.id == p })
		if i < 0 {
			g.principals = append(g.principals, vote{id: p})
			i = len(g.principals) - 1
		}
		if approved {
			g.principals[i].approved++
		} else {
			g.principals[i].denied++
		}
	}
	if hasArgs {
		g.withArgs++
		for i := range args {
			v := &args[i]
			j := slices.IndexFunc(g.fields, func(f fieldPat) bool { return f.field == v.field })
			if j < 0 {
				if len(g.fields) == maxDayField {
					continue
				}
				g.fields = append(g.fields, fieldPat{field: v.field})
				j = len(g.fields) - 1
			}
			g.fields[j].add(v)
		}
	}
	if d := uint32(digest >> 32); d != 0 && g.approver == 0 {
		if i := slices.IndexFunc(g.digests, func(c digestCount) bool { return c.digest == d }); i >= 0 {
			g.digests[i].n++
		} else if len(g.digests) < maxDigests {
			g.digests = append(g.digests, digestCount{d, 1})
		}
	}
	n := g.approved + g.denied
	ex := dayExample{id: id, at: at << 1}
	if approved {
		ex.at |= 1
	}
	g.examples[(n-1)%dayExamples] = ex
}

// votes returns the decisions each principal took part in.
func (g *groupDay) votes() []vote {
	if g.principals == nil && g.approver != 0 {
		// It alone answered every one so far.
		return []vote{{id: g.approver, approved: g.approved, denied: g.denied}}
	}
	return g.principals
}

// lastExamples calls yield with g's examples, newest first.
func (g *groupDay) lastExamples(yield func(dayExample) bool) {
	n := int(g.approved + g.denied)
	for i := range min(n, dayExamples) {
		if !yield(g.examples[(n-1-i)%dayExamples]) {
			return
		}
	}
}

// argVal is one top-level field of a request's args, as the aggregator
// keeps it while the request is open.
type argVal struct {
	field uint32
	kind  uint8
	kept  bool // json holds the value
	json  unique.Handle[string]
	text  string
	num   float64
	hash  uint64
}

// fieldPat is what one group-day saw of one field.
type fieldPat struct {
	field  uint32
	seen   uint32
	kinds  uint8
	varied bool
	// values are the distinct values seen, as JSON, at most MaxValues; nil
	// once varied.
	values []unique.Handle[string]
	// prefix is the common prefix of the string values (kinds has
	// kindString), lo and hi the range of the numbers (kindNumber).
	prefix string
	lo, hi float64
	// dots: some string value held "..".
	dots bool
}

func (f *fieldPat) add(v *argVal) {
	f.seen++
	f.note(v.kind, v.text, v.num, v.num)
	if f.varied {
		return
	}
	if !v.kept {
		f.varied, f.values = true, nil
		return
	}
	f.value(v.json)
}

// note widens f's prefix and range by a value of kind, with text (a
// string's) and range lo to hi (a number's).
func (f *fieldPat) note(kind uint8, text string, lo, hi float64) {
	if kind&kindString != 0 {
		f.dots = f.dots || strings.Contains(text, "..")
		if f.kinds&kindString == 0 {
			f.prefix = text
		} else {
			f.prefix = commonPrefix(f.prefix, text)
		}
	}
	if kind&kindNumber != 0 {
		if f.kinds&kindNumber == 0 {
			f.lo, f.hi = lo, hi
		} else {
			f.lo, f.hi = min(f.lo, lo), max(f.hi, hi)
		}
	}
	f.kinds |= kind
}

// value adds one distinct value, or makes f varied past MaxValues.
func (f *fieldPat) value(v unique.Handle[string]) {
	if slices.Contains(f.values, v) {
		return
	}
	if len(f.values) == MaxValues {
		f.varied, f.values = true, nil
		return
	}
	f.values = append(f.values, v)
}

// merge adds what o saw to f (of the same field).
func (f *fieldPat) merge(o *fieldPat) {
	f.seen += o.seen
	f.dots = f.dots || o.dots
	if o.kinds != 0 {
		f.note(o.kinds, o.prefix, o.lo, o.hi)
	}
	if f.varied {
		return
	}
	if o.varied {
		f.varied, f.values = true, nil
		return
	}
	for _, v := range o.values {
		if f.value(v); f.varied {
			return
		}
	}
}

// pattern is f as a report shows it, seen in a group of n decisions with
// args read.
func (f *fieldPat) pattern(name string, n uint32) ArgPattern {
	p := ArgPattern{Field: name, Optional: f.seen < n}
	if !f.varied {
		p.Values = make([]json.RawMessage, len(f.values))
		for i, v := range f.values {
			p.Values[i] = json.RawMessage(v.Value())
		}
		return p
	}
	p.Varied = true
	switch f.kinds {
	case kindString:
		p.Prefix, p.DotDot = f.prefix, f.dots
	case kindNumber:
		lo, hi := f.lo, f.hi
		p.Min, p.Max = &lo, &hi
	}
	return p
}

// commonPrefix returns the longest common prefix of a and b, cut back to
// whole characters.
func commonPrefix(a, b string) string {
	n := min(len(a), len(b))
	i := 0
	for i < n && a[i] == b[i] {
		i++
	}
	return wholeRunes(a[:i])
}

// HistoryWindow is the window of History.
const HistoryWindow = DefaultWindow

// maxHistoryPrincipals is how many principals History names.
const maxHistoryPrincipals = 3

// History says how people decided requests of tool by agent in the
// HistoryWindow before now (whole days: from the day the window starts in,
// UTC, to now's), and how many of them had the args whose digest
// (events.ArgsDigest) is argsDigest. It returns nil until the aggregator has
// read the stream up to its end once (CaughtUp): a history read from part
// of the record would say less than the record does. It takes only the
// groups' read lock, and costs one look at each of the pair's group-days of
// the window.
func (a *Aggregator) History(tool, agent, argsDigest string, now time.Time) *events.History {
	if !a.caught.Load() {
		return nil
	}
	h := &events.History{Window: events.Duration(HistoryWindow)}
	t, ok := a.names.lookup(tool)
	if !ok {
		return h
	}
	g, ok := a.names.lookup(agent)
	if !ok {
		return h
	}
	digest := uint32(digestKey(argsDigest) >> 32)
	from, to := dayOf(now.Add(-HistoryWindow).UnixNano()), dayOf(now.UnixNano())
	var principals []vote
	a.gmu.RLock()
	p := a.pairs[pairKey{t, g}]
	if p == nil {
		a.gmu.RUnlock()
		return h
	}
	lastDenied := p.lastDenied
	for _, d := range p.all.window(from, to) {
		h.Approved += int(d.approved)
		h.Denied += int(d.denied)
		h.Expired += int(d.expired)
		if digest != 0 {
			for _, c := range d.digests {
				if c.digest == digest {
					h.Exact += int(c.n)
				}
			}
		}
		for _, v := range d.principals {
			if i := slices.IndexFunc(principals, func(w vote) bool { return w.id == v.id }); i >= 0 {
				principals[i].approved += v.approved + v.denied
			} else {
				principals = append(principals, vote{id: v.id, approved: v.approved + v.denied})
			}
		}
	}
	a.gmu.RUnlock()
	if lastDenied != 0 {
		h.LastDenied = time.Unix(0, lastDenied).UTC()
	}
	slices.SortFunc(principals, func(x, y vote) int {
		if x.approved != y.approved {
			return int(y.approved) - int(x.approved)
		}
		return strings.Compare(a.names.name(x.id), a.names.name(y.id))
	})
	for _, v := range principals {
		// Principals are subject tokens, which the pending event checks.
		if name := a.names.name(v.id); events.ValidToken(name) && len(h.Principals) < maxHistoryPrincipals {
			h.Principals = append(h.Principals, name)
		}
	}
	return h
}
