package insights

import (
	"encoding/binary"
	"slices"
)

// An hour the stream's clock has left behind by sealAfter is sealed: its
// cells, which will not change, are encoded into two byte strings (its
// cells and its approver cells) of variable-length integers, a fifth to a
// tenth of their size as structs, and summed into a roll that answers a
// query without filters at the cost of a few sums per hour. A query with
// filters decodes the cells in order, one at a time. A message that lands
// in a sealed hour (stored out of order, by more than sealAfter) unseals it;
// it is sealed again with the next hour.

// roll is a sealed hour's cells summed: what a query without filters reads.
type roll struct {
	rules     []ruleRoll
	approvers []approverRoll
	approved  uint32
	unedited  uint32
	unlooked  uint32
	edited    []tally
	disputes  []tally
}

type ruleRoll struct {
	rule             uint32
	decided, expired uint32
	decide           hist
}

type approverRoll struct {
	approver      uint32
	answers, fast uint32
	answer        hist
}

// Bits of a sealed cell's first byte: which counts follow (one bit per
// outcome), whether a cellMore follows, whether it has an approver.
const (
	sealMore     = 1 << outcomes
	sealApprover = 1 << (outcomes + 1)
)

// Bits of a sealed cellMore's first byte: which of its parts follow.
const (
	sealDecide = 1 << iota
	sealAnswer
	sealAnswers
	sealExamined
	sealEdited
	sealDisputes
)

// seal encodes h's cells and sums them, and drops them.
func (h *hour) seal() {
	if h.cells == nil && h.acells == nil {
		return
	}
	h.ncells, h.nacells = len(h.cells), len(h.acells)
	h.sealed = encodeCells(h.cells)
	h.asealed = encodeCells(h.acells)
	q := newAcc()
	for i := range h.cells {
		q.decisions(&h.cells[i])
	}
	for i := range h.acells {
		q.answers(&h.acells[i])
	}
	h.roll = q.roll()
	h.cells, h.acells, h.index = nil, nil, nil
}

// unseal decodes h's cells back, to change them.
func (h *hour) unseal() {
	if h.sealed == nil && h.asealed == nil {
		return
	}
	h.cells, h.acells = make([]cell, 0, h.ncells), make([]cell, 0, h.nacells)
	for c := range decodeCells(h.sealed, nil) {
		h.cells = append(h.cells, c.clone())
	}
	for c := range decodeCells(h.asealed, nil) {
		h.acells = append(h.acells, c.clone())
	}
	h.sealed, h.asealed, h.roll, h.index = nil, nil, nil, nil
}

// each calls fn with each of h's cells (approver cells, if approvers)
// whose key match accepts (nil: all); the cell is fn's only until it
// returns.
func (h *hour) each(approvers bool, match func(key) bool, fn func(*cell)) {
	cells, sealed := h.cells, h.sealed
	if approvers {
		cells, sealed = h.acells, h.asealed
	}
	if sealed == nil {
		for i := range cells {
			if match == nil || match(cells[i].key) {
				fn(&cells[i])
			}
		}
		return
	}
	for c := range decodeCells(sealed, match) {
		fn(c)
	}
}

func encodeCells(cells []cell) []byte {
	if len(cells) == 0 {
		return nil
	}
	var b, rec []byte
	for i := range cells {
		// Each cell is its length and itself, so that a reader skips
		// the cells its filter does not select.
		rec = encodeCell(rec[:0], &cells[i])
		b = binary.AppendUvarint(b, uint64(len(rec)))
		b = append(b, rec...)
	}
	return slices.Clip(b)
}

func encodeCell(b []byte, c *cell) []byte {
	var flags byte
	for i, n := range c.n {
		if n != 0 {
			flags |= 1 << i
		}
	}
	if c.x != nil {
		flags |= sealMore
	}
	if c.approver != 0 {
		flags |= sealApprover
	}
	b = append(b, flags)
	b = binary.AppendUvarint(b, uint64(c.agent))
	b = binary.AppendUvarint(b, uint64(c.tool))
	b = binary.AppendUvarint(b, uint64(c.rule))
	b = binary.AppendUvarint(b, uint64(c.arule))
	if c.approver != 0 {
		b = binary.AppendUvarint(b, uint64(c.approver))
	}
	for _, n := range c.n {
		if n != 0 {
			b = binary.AppendUvarint(b, uint64(n))
		}
	}
	x := c.x
	if x == nil {
		return b
	}
	var more byte
	if len(x.decide) > 0 {
		more |= sealDecide
	}
	if len(x.answer) > 0 {
		more |= sealAnswer
	}
	if x.answers != 0 || x.fast != 0 {
		more |= sealAnswers
	}
	if x.approved != 0 || x.unedited != 0 || x.unlooked != 0 {
		more |= sealExamined
	}
	if len(x.edited) > 0 {
		more |= sealEdited
	}
	if len(x.disputes) > 0 {
		more |= sealDisputes
	}
	b = append(b, more)
	if more&sealDecide != 0 {
		b = appendHist(b, x.decide)
	}
	if more&sealAnswer != 0 {
		b = appendHist(b, x.answer)
	}
	if more&sealAnswers != 0 {
		b = binary.AppendUvarint(b, uint64(x.answers))
		b = binary.AppendUvarint(b, uint64(x.fast))
	}
	if more&sealExamined != 0 {
		b = binary.AppendUvarint(b, uint64(x.approved))
		b = binary.AppendUvarint(b, uint64(x.unedited))
		b = binary.AppendUvarint(b, uint64(x.unlooked))
	}
	if more&sealEdited != 0 {
		b = appendTallies(b, x.edited)
	}
	if more&sealDisputes != 0 {
		b = appendTallies(b, x.disputes)
	}
	return b
}

func appendHist(b []byte, h hist) []byte {
	b = binary.AppendUvarint(b, uint64(len(h)))
	for _, w := range h {
		b = append(b, byte(w>>24))
		b = binary.AppendUvarint(b, uint64(w&histCount))
	}
	return b
}

func appendTallies(b []byte, ts []tally) []byte {
	b = binary.AppendUvarint(b, uint64(len(ts)))
	for _, t := range ts {
		b = binary.AppendUvarint(b, uint64(t.id))
		b = binary.AppendUvarint(b, uint64(t.n))
	}
	return b
}

// decodeCells yields the cells encoded in b whose key match accepts (nil:
// all), in one cell it reuses.
func decodeCells(b []byte, match func(key) bool) func(yield func(*cell) bool) {
	return func(yield func(*cell) bool) {
		var c cell
		var x cellMore
		d := decoder{b: b}
		for d.i < len(d.b) {
			n := int(d.u32())
			end := d.i + n
			flags := d.b[d.i]
			d.i++
			c = cell{key: key{agent: d.u32(), tool: d.u32(), rule: d.u32(), arule: d.u32()}}
			if flags&sealApprover != 0 {
				c.approver = d.u32()
			}
			if match != nil && !match(c.key) {
				d.i = end
				continue
			}
			for i := range c.n {
				if flags&(1<<i) != 0 {
					c.n[i] = d.u32()
				}
			}
			if flags&sealMore != 0 {
				d.more(&x)
				c.x = &x
			}
			if !yield(&c) {
				return
			}
		}
	}
}

// decoder reads what encodeCells wrote, which the aggregator wrote itself.
type decoder struct {
	b []byte
	i int
}

func (d *decoder) u32() uint32 {
	if b := d.b[d.i]; b < 0x80 {
		d.i++
		return uint32(b)
	}
	v, n := binary.Uvarint(d.b[d.i:])
	d.i += n
	return uint32(v)
}

// more reads a cellMore into x, reusing its slices.
func (d *decoder) more(x *cellMore) {
	flags := d.b[d.i]
	d.i++
	*x = cellMore{decide: x.decide[:0], answer: x.answer[:0], edited: x.edited[:0], disputes: x.disputes[:0]}
	if flags&sealDecide != 0 {
		x.decide = d.hist(x.decide)
	}
	if flags&sealAnswer != 0 {
		x.answer = d.hist(x.answer)
	}
	if flags&sealAnswers != 0 {
		x.answers, x.fast = d.u32(), d.u32()
	}
	if flags&sealExamined != 0 {
		x.approved, x.unedited, x.unlooked = d.u32(), d.u32(), d.u32()
	}
	if flags&sealEdited != 0 {
		x.edited = d.tallies(x.edited)
	}
	if flags&sealDisputes != 0 {
		x.disputes = d.tallies(x.disputes)
	}
}

func (d *decoder) hist(h hist) hist {
	for range d.u32() {
		bin := d.b[d.i]
		d.i++
		h = append(h, uint32(bin)<<24|d.u32())
	}
	return h
}

func (d *decoder) tallies(ts []tally) []tally {
	for range d.u32() {
		ts = append(ts, tally{d.u32(), d.u32()})
	}
	return ts
}

// clone returns c with a cellMore of its own.
func (c *cell) clone() cell {
	out := *c
	if c.x != nil {
		x := *c.x
		x.decide, x.answer = slices.Clone(x.decide), slices.Clone(x.answer)
		x.edited, x.disputes = slices.Clone(x.edited), slices.Clone(x.disputes)
		out.x = &x
	}
	return out
}

// roll sums what q holds into a roll.
func (q *acc) roll() *roll {
	r := &roll{approved: uint32(q.unexam.Approved), unedited: uint32(q.unexam.Unedited), unlooked: uint32(q.unexam.Unlooked)}
	for id, l := range q.rules {
		r.rules = append(r.rules, ruleRoll{rule: id, decided: uint32(l.decided), expired: uint32(l.expired), decide: l.d.sparse()})
	}
	for id, l := range q.approvers {
		r.approvers = append(r.approvers, approverRoll{approver: id, answers: uint32(l.answers), fast: uint32(l.fast), answer: l.d.sparse()})
	}
	for id, n := range q.edited {
		r.edited = append(r.edited, tally{id, uint32(n)})
	}
	for id, n := range q.disputes {
		r.disputes = append(r.disputes, tally{id, uint32(n)})
	}
	return r
}

// addRoll adds a sealed hour's roll to q.
func (q *acc) addRoll(r *roll) {
	for i := range r.rules {
		rr := &r.rules[i]
		l := q.of(q.rules, rr.rule)
		l.decided += int(rr.decided)
		l.expired += int(rr.expired)
		l.d.merge(rr.decide)
	}
	for i := range r.approvers {
		ar := &r.approvers[i]
		l := q.of(q.approvers, ar.approver)
		l.decided += int(ar.answers)
		l.answers += int(ar.answers)
		l.fast += int(ar.fast)
		l.d.merge(ar.answer)
	}
	q.unexam.Approved += int(r.approved)
	q.unexam.Unedited += int(r.unedited)
	q.unexam.Unlooked += int(r.unlooked)
	for _, t := range r.edited {
		q.edited[t.id] += int(t.n)
	}
	for _, t := range r.disputes {
		q.disputes[t.id] += int(t.n)
	}
}

// sparse returns d as a hist (counts past the word's 24 bits saturate).
func (d *dense) sparse() hist {
	var h hist
	for b, n := range d.n {
		if n > 0 {
			h = append(h, uint32(b)<<24|uint32(min(n, histCount)))
		}
	}
	return h
}
