package insights

import (
	"hash/maphash"
	"slices"
	"sort"
	"time"
)

// The aggregator folds each decision, as it is read, into the bucket of the
// hour the stream stored it in (docs/insights.md, "Buckets"). An hour holds
// one cell per key (agent, tool, rule, approval rule) that decided something
// in it, and one approver cell per key and principal who answered one of
// those requests; a query sums the cells of its window that its filter
// selects.

// key selects a cell. Names are ids of the aggregator's name table; 0 is
// none. approver is 0 in the hour's cells, a principal in its approver
// cells.
type key struct {
	agent, tool, rule, arule, approver uint32
}

// Indexes of the outcome counts of a cell.
const (
	outApproved = iota
	outDenied
	outExpired
	outCancelled
	outAutoApproved
	outAutoDenied
	outcomes
)

// cell is what one hour says of one key.
type cell struct {
	key
	n [outcomes]uint32
	// x holds what only requests people decided, edited or the shadow
	// policy disputed bring; nil for a cell of automatic decisions only.
	x *cellMore
}

// cellMore is the part of a cell that people's decisions fill.
type cellMore struct {
	// decide is the time from announcement to decision of the requests
	// people decided; answer, in approver cells, from announcement to the
	// approver's answer.
	decide, answer hist
	// answers and fast count the approver's answers, and those given
	// sooner than RubberStampUnder after the request was shown (approver
	// cells).
	answers, fast uint32
	// approved, unedited and unlooked are the counts of Unexamined.
	approved, unedited, unlooked uint32
	// edited counts edits by argument field, disputes disagreements by
	// pair: each entry an id (field name, "live\x00shadow") and a count.
	edited, disputes []tally
}

// tally is a count for one name.
type tally struct{ id, n uint32 }

// addTally adds one to the count of id in ts.
func addTally(ts []tally, id uint32) []tally {
	for i := range ts {
		if ts[i].id == id {
			ts[i].n++
			return ts
		}
	}
	return append(ts, tally{id, 1})
}

func (c *cell) more() *cellMore {
	if c.x == nil {
		c.x = &cellMore{}
	}
	return c.x
}

// hour is the bucket of one hour.
type hour struct {
	start int64 // Unix hours
	// all counts every decision of the hour, for a query without filters.
	all    [outcomes]uint32
	cells  []cell // approver 0
	acells []cell // approver cells
	// index finds a key's cell while the hour is written.
	index map[key]int32
	// Once sealed (seal.go): the cells encoded, how many there are, and
	// their sums.
	sealed, asealed []byte
	ncells, nacells int
	roll            *roll
}

// sealAfter is how far behind the stream's clock an hour is sealed.
const sealAfter = 2 * time.Hour

// cell returns the cell of k, made if need be.
func (h *hour) cell(k key) *cell {
	h.unseal()
	if h.index == nil {
		h.index = make(map[key]int32, len(h.cells)+len(h.acells))
		for i := range h.cells {
			h.index[h.cells[i].key] = int32(i)
		}
		for i := range h.acells {
			h.index[h.acells[i].key] = int32(i)
		}
	}
	cells := &h.cells
	if k.approver != 0 {
		cells = &h.acells
	}
	if i, ok := h.index[k]; ok {
		return &(*cells)[i]
	}
	h.index[k] = int32(len(*cells))
	*cells = append(*cells, cell{key: k})
	return &(*cells)[len(*cells)-1]
}

const hourNanos = int64(time.Hour)

// hourOf returns the Unix hour of t (Unix nanoseconds).
func hourOf(t int64) int64 {
	if t < 0 {
		return (t+1)/hourNanos - 1
	}
	return t / hourNanos
}

// hours are the buckets held, oldest first.
type hours []*hour

// at returns the bucket of Unix hour start, made if need be.
func (hs *hours) at(start int64) *hour {
	s := *hs
	if n := len(s); n > 0 && s[n-1].start == start {
		return s[n-1]
	}
	i := sort.Search(len(s), func(i int) bool { return s[i].start >= start })
	if i < len(s) && s[i].start == start {
		return s[i]
	}
	h := &hour{start: start}
	*hs = slices.Insert(s, i, h)
	return h
}

// window returns the buckets from Unix hour from to Unix hour to, both
// included.
func (hs hours) window(from, to int64) []*hour {
	i := sort.Search(len(hs), func(i int) bool { return hs[i].start >= from })
	j := sort.Search(len(hs), func(i int) bool { return hs[i].start > to })
	if i >= j {
		return nil
	}
	return hs[i:j]
}

// prune drops the buckets before Unix hour first.
func (hs *hours) prune(first int64) {
	s := *hs
	i := sort.Search(len(s), func(i int) bool { return s[i].start >= first })
	if i > 0 {
		clear(s[:i])
		*hs = s[i:]
	}
}

// example is a request id a report may show, with when and under which key
// its decision was stored.
type example struct {
	id string
	at int64 // Unix nanoseconds
	key
}

// examples keeps the last few examples of one kind (an approver's fast
// answers, a disagreement pair's requests) in a ring, newest last.
type examples struct {
	ring []example
	next int
}

// keepExamples is how many examples of each approver's fast answers and of
// each disagreement the aggregator keeps: a report shows the most recent
// MaxExamples of them that its window and filter select.
const keepExamples = 256

func (e *examples) add(x example) {
	if len(e.ring) < keepExamples {
		e.ring = append(e.ring, x)
		return
	}
	e.ring[e.next] = x
	e.next = (e.next + 1) % keepExamples
}

// newest calls yield with the examples newest first until it returns false.
func (e *examples) newest(yield func(*example) bool) {
	n := len(e.ring)
	for i := range n {
		// next is 0 until the ring is full, then the oldest's place.
		j := (e.next - 1 - i + 2*n) % n
		if !yield(&e.ring[j]) {
			return
		}
	}
}

// idset is a set of request ids that holds the last size ids added (as
// hashes: two ids that collide in 64 bits are taken for one).
type idset struct {
	m    map[uint64]int32 // hash → slot in ring
	ring []uint64
	next int
	size int
}

func newIDSet(size int) *idset {
	return &idset{m: make(map[uint64]int32), size: size}
}

func (s *idset) add(h uint64) {
	if s.size <= 0 {
		return
	}
	if len(s.ring) < s.size {
		s.m[h] = int32(len(s.ring))
		s.ring = append(s.ring, h)
		return
	}
	if old := s.ring[s.next]; s.m[old] == int32(s.next) {
		delete(s.m, old)
	}
	s.ring[s.next] = h
	s.m[h] = int32(s.next)
	s.next = (s.next + 1) % s.size
}

func (s *idset) has(h uint64) bool {
	_, ok := s.m[h]
	return ok
}

func (s *idset) remove(h uint64) { delete(s.m, h) }

// seed keys the hashes of request ids and argument values, which are only
// compared within the process.
var seed = maphash.MakeSeed()

func hashString(s string) uint64 { return maphash.String(seed, s) }
func hashBytes(b []byte) uint64  { return maphash.Bytes(seed, b) }
