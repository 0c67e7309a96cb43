package insights

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/assent-dev/assent/pkg/events"
)

// MaxWindow bounds the window of a Filter: a report holds every hour of it.
const MaxWindow = 366 * 24 * time.Hour

// MaxCandidates bounds each list of candidates a report holds (the groups
// with the most evidence).
const MaxCandidates = 100

// Window returns the window f selects at now, defaults applied (Until zero
// is now, Since zero is Until minus DefaultWindow), or an error naming every
// problem: Since after Until, or a window longer than MaxWindow.
func (f Filter) Window(now time.Time) (since, until time.Time, err error) {
	since, until = f.window(now)
	var errs []error
	if since.After(until) {
		errs = append(errs, fmt.Errorf("since %s is after until %s", since.Format(time.RFC3339), until.Format(time.RFC3339)))
	} else if until.Sub(since) > MaxWindow {
		errs = append(errs, fmt.Errorf("the window from %s to %s is longer than %s", since.Format(time.RFC3339), until.Format(time.RFC3339), MaxWindow))
	}
	return since, until, errors.Join(errs...)
}

func (f Filter) window(now time.Time) (since, until time.Time) {
	until = f.Until
	if until.IsZero() {
		until = now
	}
	since = f.Since
	if since.IsZero() {
		since = until.Add(-DefaultWindow)
	}
	return since.UTC(), until.UTC()
}

// matcher is a Filter in the aggregator's names.
type matcher struct {
	agent, tool, rule, approver uint32
	// has* say which fields the filter names; none that it names a name
	// the aggregator never read, which nothing matches.
	hasAgent, hasTool, hasRule bool
	none                       bool
}

func (a *Aggregator) matcher(f Filter) matcher {
	var m matcher
	look := func(name string, id *uint32, has *bool) {
		if name == "" {
			return
		}
		if has != nil {
			*has = true
		}
		var ok bool
		if *id, ok = a.names.lookup(name); !ok || *id == 0 {
			m.none = true
		}
	}
	look(f.Agent, &m.agent, &m.hasAgent)
	look(f.Tool, &m.tool, &m.hasTool)
	look(f.Rule, &m.rule, &m.hasRule)
	look(f.Approver, &m.approver, nil)
	return m
}

// all reports whether m selects everything.
func (m *matcher) all() bool {
	return !m.hasAgent && !m.hasTool && !m.hasRule && m.approver == 0 && !m.none
}

// match reports whether m selects the cells of k (its approver aside).
func (m *matcher) match(k key) bool {
	return (!m.hasAgent || k.agent == m.agent) && (!m.hasTool || k.tool == m.tool) &&
		(!m.hasRule || k.rule == m.rule || k.arule == m.rule)
}

// latencyAcc is what a query sums of one rule or one approver.
type latencyAcc struct {
	d                dense
	decided, expired int
	answers, fast    int
}

// acc is what a query sums.
type acc struct {
	rules     map[uint32]*latencyAcc
	approvers map[uint32]*latencyAcc
	unexam    Unexamined
	edited    map[uint32]int
	disputes  map[uint32]int
}

func newAcc() *acc {
	return &acc{rules: map[uint32]*latencyAcc{}, approvers: map[uint32]*latencyAcc{}, edited: map[uint32]int{}, disputes: map[uint32]int{}}
}

func (q *acc) of(m map[uint32]*latencyAcc, id uint32) *latencyAcc {
	l := m[id]
	if l == nil {
		l = &latencyAcc{}
		m[id] = l
	}
	return l
}

// decisions sums what c says of decisions (not of one approver's answers).
func (q *acc) decisions(c *cell) {
	if c.x == nil && c.n[outExpired] == 0 {
		return
	}
	rule := c.arule
	if rule == 0 {
		rule = c.rule
	}
	l := q.of(q.rules, rule)
	l.expired += int(c.n[outExpired])
	x := c.x
	if x == nil {
		return
	}
	l.decided += int(c.n[outApproved] + c.n[outDenied])
	l.d.merge(x.decide)
	q.unexam.Approved += int(x.approved)
	q.unexam.Unedited += int(x.unedited)
	q.unexam.Unlooked += int(x.unlooked)
	for _, t := range x.edited {
		q.edited[t.id] += int(t.n)
	}
	for _, t := range x.disputes {
		q.disputes[t.id] += int(t.n)
	}
}

// answers sums what the approver cell c says of its approver's answers.
func (q *acc) answers(c *cell) {
	if c.x == nil || c.x.answers == 0 {
		return
	}
	l := q.of(q.approvers, c.approver)
	l.decided += int(c.x.answers)
	l.answers += int(c.x.answers)
	l.fast += int(c.x.fast)
	l.d.merge(c.x.answer)
}

func addCounts(c *Counts, n *[outcomes]uint32) {
	c.Approved += int(n[outApproved])
	c.Denied += int(n[outDenied])
	c.Expired += int(n[outExpired])
	c.Cancelled += int(n[outCancelled])
	c.AutoApproved += int(n[outAutoApproved])
	c.AutoDenied += int(n[outAutoDenied])
}

func addAll(c *Counts, o Counts) {
	c.Approved += o.Approved
	c.Denied += o.Denied
	c.Expired += o.Expired
	c.Cancelled += o.Cancelled
	c.AutoApproved += o.AutoApproved
	c.AutoDenied += o.AutoDenied
}

// Query returns what the record says about the requests f selects, decided
// in f's window at now (docs/insights.md): it sums the buckets of the hours
// the window touches, from the hour Since falls in to the hour before Until
// (the hour Until falls in, unless Until is on the hour), so a window's
// edges are whole hours. A filter Window refuses is taken as near as it
// goes: an empty window for Since after Until, the last MaxWindow of a
// longer one.
func (a *Aggregator) Query(f Filter, now time.Time) Report {
	since, until := f.window(now)
	if since.After(until) {
		since = until
	}
	if until.Sub(since) > MaxWindow {
		since = until.Add(-MaxWindow)
	}
	h0 := hourOf(since.UnixNano())
	h1 := hourOf(until.UnixNano() - 1) // the hour of Until's last instant
	r := Report{Filter: f, Since: time.Unix(h0*3600, 0).UTC(), Until: until}
	if !until.After(since) {
		h1 = h0 - 1
		r.Since = since
	}
	r.Through, r.Complete, r.Progress = a.through.Load(), a.caught.Load(), a.progress()
	r.Hours = make([]HourCounts, max(h1-h0+1, 0))
	for i := range r.Hours {
		r.Hours[i].Hour = time.Unix((h0+int64(i))*3600, 0).UTC()
	}
	m := a.matcher(f)
	q := newAcc()
	from, to := h0*hourNanos, (h1+1)*hourNanos // the examples' window
	a.mu.RLock()
	if !m.none {
		a.sum(q, &m, r.Hours, h0, h1)
	}
	r.RubberStamps = a.rubberStamps(q, &m, from, to)
	r.Disagreements = a.disagreements(q, &m, from, to)
	unlooked := a.unlookedExamples(&m, from, to)
	a.mu.RUnlock()
	for _, h := range r.Hours {
		addAll(&r.Totals, h.Counts)
	}
	r.ByRule = a.latencies(q.rules, true)
	r.ByApprover = a.latencies(q.approvers, false)
	r.Unexamined = q.unexam
	r.Unexamined.Examples = unlooked
	if r.Unexamined.Approved > 0 {
		r.Unexamined.Share = float64(r.Unexamined.Unlooked) / float64(r.Unexamined.Approved)
	}
	for id, n := range q.edited {
		r.EditedFields = append(r.EditedFields, FieldCount{Field: a.names.name(id), Count: n})
	}
	slices.SortFunc(r.EditedFields, func(x, y FieldCount) int {
		return cmp.Or(cmp.Compare(y.Count, x.Count), strings.Compare(x.Field, y.Field))
	})
	if !m.none && h1 >= h0 {
		r.AlwaysApproved, r.AlwaysDenied = a.candidates(&m, dayOf(from), dayOf(to-1))
	}
	return r
}

// sum adds the cells of hours h0 to h1 that m selects to q and hours.
func (a *Aggregator) sum(q *acc, m *matcher, hours []HourCounts, h0, h1 int64) {
	all := m.all()
	match := m.match
	if m.approver != 0 {
		// The requests the approver answered: their approver cells.
		match = func(k key) bool { return k.approver == m.approver && m.match(k) }
	}
	var n *Counts
	count := func(c *cell) {
		addCounts(n, &c.n)
		q.decisions(c)
	}
	both := func(c *cell) {
		count(c)
		q.answers(c)
	}
	for _, h := range a.hours.window(h0, h1) {
		n = &hours[h.start-h0].Counts
		switch {
		case m.approver != 0:
			h.each(true, match, both)
		case all && h.roll != nil:
			addCounts(n, &h.all)
			q.addRoll(h.roll)
		case all:
			addCounts(n, &h.all)
			h.each(false, nil, q.decisions)
			h.each(true, nil, q.answers)
		default:
			h.each(false, match, count)
			h.each(true, match, q.answers)
		}
	}
}

// latencies lists ls by name, most decided first.
func (a *Aggregator) latencies(ls map[uint32]*latencyAcc, rules bool) []Latency {
	out := make([]Latency, 0, len(ls))
	for id, l := range ls {
		if l.decided == 0 && l.expired == 0 {
			continue
		}
		lat := Latency{Key: a.names.name(id), Decided: l.decided, P50: events.Duration(l.d.quantile(0.5)), P90: events.Duration(l.d.quantile(0.9))}
		if rules {
			lat.Expired = l.expired
		}
		out = append(out, lat)
	}
	slices.SortFunc(out, func(x, y Latency) int {
		return cmp.Or(cmp.Compare(y.Decided, x.Decided), cmp.Compare(y.Expired, x.Expired), strings.Compare(x.Key, y.Key))
	})
	return out
}

// rubberStamps lists the approvers' answers and fast answers, highest share
// first, with examples of fast ones from the window [from, to) that m
// selects. a.mu is held.
func (a *Aggregator) rubberStamps(q *acc, m *matcher, from, to int64) []RubberStamp {
	var out []RubberStamp
	for id, l := range q.approvers {
		if l.answers == 0 {
			continue
		}
		rs := RubberStamp{Approver: a.names.name(id), Answers: l.answers, Fast: l.fast, Share: float64(l.fast) / float64(l.answers)}
		if e := a.stamps[id]; e != nil && l.fast > 0 {
			e.newest(func(x *example) bool {
				if x.at >= from && x.at < to && m.match(x.key) {
					rs.Examples = append(rs.Examples, x.id)
				}
				return len(rs.Examples) < MaxExamples
			})
		}
		out = append(out, rs)
	}
	slices.SortFunc(out, func(x, y RubberStamp) int {
		return cmp.Or(cmp.Compare(y.Share, x.Share), cmp.Compare(y.Fast, x.Fast), cmp.Compare(y.Answers, x.Answers), strings.Compare(x.Approver, y.Approver))
	})
	return out
}

// unlookedExamples lists the last approvals given without an edit or a
// look at the detail, from the window [from, to) that m selects. a.mu is
// held.
func (a *Aggregator) unlookedExamples(m *matcher, from, to int64) []string {
	var out []string
	if e := a.unlooked[0]; e != nil {
		e.newest(func(x *example) bool {
			if x.at >= from && x.at < to && x.approver == m.approver && m.match(x.key) {
				out = append(out, x.id)
			}
			return len(out) < MaxExamples
		})
	}
	return out
}

// disagreements lists the shadow disagreements q counted, most first, with
// examples from the window [from, to) that m selects. a.mu is held.
func (a *Aggregator) disagreements(q *acc, m *matcher, from, to int64) []Disagreement {
	var out []Disagreement
	for id, n := range q.disputes {
		live, shadow, _ := strings.Cut(a.names.name(id), "\x00")
		d := Disagreement{Live: live, Shadow: shadow, Count: n}
		if e := a.disputed[id]; e != nil {
			e.newest(func(x *example) bool {
				if x.at >= from && x.at < to && x.approver == m.approver && m.match(x.key) {
					d.Examples = append(d.Examples, x.id)
				}
				return len(d.Examples) < MaxExamples
			})
		}
		out = append(out, d)
	}
	slices.SortFunc(out, func(x, y Disagreement) int {
		return cmp.Or(cmp.Compare(y.Count, x.Count), strings.Compare(x.Live, y.Live), strings.Compare(x.Shadow, y.Shadow))
	})
	return out
}

// candidates returns the groups people decided the same way at least
// MinEvidence times on days from to to (Unix days), and never the other
// way on those days, that m selects: always approved, always denied.
func (a *Aggregator) candidates(m *matcher, from, to int32) (approved, denied []Candidate) {
	a.gmu.RLock()
	defer a.gmu.RUnlock()
	for _, p := range a.pairs {
		if m.hasAgent && p.agent != m.agent || m.hasTool && p.tool != m.tool {
			continue
		}
		var yes, no int
		p.of(m.approver, from, to, func(g *groupDay) {
			if m.rules(g) {
				yes, no = yes+int(g.approved), no+int(g.denied)
			}
		})
		switch {
		case yes >= MinEvidence && no == 0:
			approved = append(approved, a.candidate(p, m, from, to, true, yes))
		case no >= MinEvidence && yes == 0:
			denied = append(denied, a.candidate(p, m, from, to, false, no))
		}
	}
	order := func(cs []Candidate) []Candidate {
		slices.SortFunc(cs, func(x, y Candidate) int {
			return cmp.Or(cmp.Compare(y.Count, x.Count), y.Last.Compare(x.Last), strings.Compare(x.Tool, y.Tool), strings.Compare(x.Agent, y.Agent))
		})
		return cs[:min(len(cs), MaxCandidates)]
	}
	return order(approved), order(denied)
}

// rules reports whether m selects the rules of group-day g.
func (m *matcher) rules(g *groupDay) bool {
	return !m.hasRule || g.rule == m.rule || g.arule == m.rule
}

// candidate describes pair p as a candidate of count decisions the way
// approved says, on the days from to to that m selects. a.gmu is held.
func (a *Aggregator) candidate(p *pair, m *matcher, from, to int32, approved bool, count int) Candidate {
	c := Candidate{Tool: a.names.name(p.tool), Agent: a.names.name(p.agent), Count: count}
	var (
		first, last, other int64
		withArgs           uint32
		fields             []fieldPat
		principals         []vote
		ex                 []dayExample
	)
	// The other way, in all the days held.
	p.of(m.approver, 1, 0, func(g *groupDay) {
		if !m.rules(g) {
			return
		}
		if approved {
			other = max(other, g.lastDenied)
		} else {
			other = max(other, g.lastApproved)
		}
	})
	p.of(m.approver, from, to, func(g *groupDay) {
		if !m.rules(g) {
			return
		}
		if first == 0 || g.first < first {
			first = g.first
		}
		last = max(last, g.last)
		withArgs += g.withArgs
		for i := range g.fields {
			gf := &g.fields[i]
			j := slices.IndexFunc(fields, func(f fieldPat) bool { return f.field == gf.field })
			if j < 0 {
				fields = append(fields, fieldPat{field: gf.field})
				j = len(fields) - 1
			}
			fields[j].merge(gf)
		}
		for _, v := range g.votes() {
			n := v.approved
			if !approved {
				n = v.denied
			}
			if n == 0 {
				continue
			}
			if i := slices.IndexFunc(principals, func(w vote) bool { return w.id == v.id }); i >= 0 {
				principals[i].approved += n
			} else {
				principals = append(principals, vote{id: v.id, approved: n})
			}
		}
		// Each day's last few.
		g.lastExamples(func(e dayExample) bool {
			if e.approved() == approved {
				ex = append(ex, e)
			}
			return true
		})
	})
	c.First, c.Last = time.Unix(0, first).UTC(), time.Unix(0, last).UTC()
	if other != 0 {
		c.LastOther = time.Unix(0, other).UTC()
	}
	slices.SortFunc(principals, func(x, y vote) int {
		return cmp.Or(cmp.Compare(y.approved, x.approved), strings.Compare(a.names.name(x.id), a.names.name(y.id)))
	})
	for _, v := range principals {
		c.Principals = append(c.Principals, a.names.name(v.id))
	}
	for i := range fields {
		c.Args = append(c.Args, fields[i].pattern(a.names.name(fields[i].field), withArgs))
	}
	slices.SortFunc(c.Args, func(x, y ArgPattern) int { return strings.Compare(x.Field, y.Field) })
	slices.SortFunc(ex, func(x, y dayExample) int { return cmp.Or(cmp.Compare(y.when(), x.when()), strings.Compare(x.id, y.id)) })
	for _, e := range ex[:min(len(ex), MaxExamples)] {
		c.Examples = append(c.Examples, e.id)
	}
	return c
}
