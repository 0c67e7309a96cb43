package insights

import (
	"math"
	"time"
)

// Durations (time to decide, time to answer) are counted in fixed
// log-scale bins, the same in every bucket, so that buckets merge by adding
// counts: bin 0 holds durations under a millisecond (and negative ones, from
// clocks that disagree), bin k ≥ 1 those from 2^((k-1)/4) up to 2^(k/4)
// milliseconds, four bins per doubling, and the last bin everything from
// 2^(126/4) ms (about 34 days) up. A quantile is read as the geometric
// middle of its bin: within 9% of the true value.
const bins = 128

// binOf returns the bin of d.
func binOf(d time.Duration) uint8 {
	ms := float64(d) / float64(time.Millisecond)
	if ms < 1 {
		return 0
	}
	k := int(math.Floor(4*math.Log2(ms))) + 1
	return uint8(min(max(k, 1), bins-1))
}

// binValue is what a quantile that falls in bin b reads: the geometric
// middle of the bin, to the millisecond (under 10 s) or to the second.
func binValue(b uint8) time.Duration {
	if b == 0 {
		return 0
	}
	v := time.Duration(math.Exp2((float64(b)-0.5)/4) * float64(time.Millisecond))
	if v < 10*time.Second {
		return v.Round(time.Millisecond)
	}
	return v.Round(time.Second)
}

// hist is a sparse histogram: one word per bin that has counts, the bin in
// the top 8 bits and its count in the low 24 (a count saturates at
// 2^24-1 within one bucket). A bucket usually sees few distinct bins, so
// this costs a few words where a dense histogram would cost 128.
type hist []uint32

const histCount = 1<<24 - 1

// add counts one duration in bin b.
func (h *hist) add(b uint8) {
	for i, w := range *h {
		if uint8(w>>24) == b {
			if w&histCount != histCount {
				(*h)[i] = w + 1
			}
			return
		}
	}
	*h = append(*h, uint32(b)<<24|1)
}

// dense is a histogram summed over buckets.
type dense struct {
	n     [bins]uint64
	total uint64
}

// merge adds h to d.
func (d *dense) merge(h hist) {
	for _, w := range h {
		c := uint64(w & histCount)
		d.n[w>>24] += c
		d.total += c
	}
}

// quantile returns the q-quantile (0 < q ≤ 1) of d: the value of the bin
// that holds the ceil(q·total)-th smallest duration; 0 when d is empty.
func (d *dense) quantile(q float64) time.Duration {
	if d.total == 0 {
		return 0
	}
	rank := uint64(math.Ceil(q * float64(d.total)))
	rank = min(max(rank, 1), d.total)
	var seen uint64
	for b, c := range d.n {
		seen += c
		if seen >= rank {
			return binValue(uint8(b))
		}
	}
	return binValue(bins - 1)
}
