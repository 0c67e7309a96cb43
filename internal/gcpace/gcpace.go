// Package gcpace sets how far the heap may grow past what is live before
// the garbage collector runs: no less than a floor while the live heap is
// small, no more than a headroom once it is large.
//
// With Go's default GOGC=100 the collector runs each time the heap has
// grown to twice what was live after the last collection. Both ends of
// that are wrong for a broker:
//
//   - A broker whose live heap is small (most of them: a few thousand
//     pending requests, the embedded server's buffers) but which allocates
//     fast, as every decision does, collects several times a second, and
//     each collection slows the handlers that run meanwhile: the tail of
//     the human path's latency (docs/benchmarks.md, "What the embedded
//     server holds at a million"). The floor raises the goal to the floor
//     while twice the live heap is below it.
//   - A broker with a million pending requests holds about 700 MB live, and
//     doubling it costs 700 MB of memory that holds nothing but garbage
//     waiting to be collected. The headroom caps how far past the live heap
//     the goal is, at least a quarter of the live heap, so that the
//     collector's work stays in proportion to the heap it marks.
//
// Between the two, Go's own pacing applies.
package gcpace

import (
	"context"
	"runtime/debug"
	"runtime/metrics"
	"sync"
	"time"
)

// Pace is what Run holds the collector's goal to, in bytes; 0 turns either
// off.
type Pace struct {
	// Floor is the smallest goal.
	Floor uint64
	// Headroom is the most the goal exceeds the live heap by, when that is
	// more than a quarter of the live heap.
	Headroom uint64
}

// every is how often Run looks whether a collection has run since it last
// looked.
const every = 100 * time.Millisecond

// running is held by the Run that sets the collector's percent: the percent
// is the process's, so one Run sets it at a time and any other waits for
// its context doing nothing (tests run several brokers in one process).
var running sync.Mutex

// Run paces the collector by p until ctx ends, then restores the GC percent
// the process had: after each collection it sets the percent that makes the
// next goal what Percent says. A zero Pace, GOGC=off, or another Run
// already running leave the collector as it is.
func Run(ctx context.Context, p Pace) {
	if p == (Pace{}) || !running.TryLock() {
		return
	}
	defer running.Unlock()
	base := debug.SetGCPercent(100)
	debug.SetGCPercent(base)
	if base < 0 {
		return
	}
	defer debug.SetGCPercent(base)
	samples := []metrics.Sample{{Name: "/gc/cycles/total:gc-cycles"}, {Name: "/gc/heap/live:bytes"}}
	var cycles uint64
	set := base
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		metrics.Read(samples)
		if n := samples[0].Value.Uint64(); n != cycles {
			cycles = n
			if pct := Percent(base, samples[1].Value.Uint64(), p); pct != set {
				debug.SetGCPercent(pct)
				set = pct
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// Percent returns the GC percent whose goal, for a live heap of live bytes,
// is base's goal (live × (1 + base/100)) raised to p.Floor and then lowered
// to live + max(p.Headroom, live/4): base itself when nothing is known of
// the heap yet or p changes nothing. The floor wins over the headroom.
func Percent(base int, live uint64, p Pace) int {
	if live == 0 {
		return base
	}
	own := live * uint64(base) / 100 // what base's goal exceeds live by
	extra := own
	if p.Headroom > 0 {
		extra = min(extra, max(p.Headroom, live/4))
	}
	if p.Floor > live {
		extra = max(extra, p.Floor-live)
	}
	if extra == own {
		return base
	}
	return int(min(extra*100/live, maxPercent))
}

// maxPercent bounds the percent for a nearly empty heap, whose goal is the
// floor whatever the percent above what it takes.
const maxPercent = 1_000_000
