// Package gcfloor keeps the garbage collector from collecting a small heap
// more often than a heap of a given size would be collected.
//
// With Go's default GOGC=100 the collector runs each time the heap has
// grown to twice what was live after the last collection. A broker whose
// live heap is small (most of them: a few thousand pending requests, the
// embedded server's buffers) but which allocates fast, as every decision
// does, then collects several times a second, and each collection slows the
// handlers that run meanwhile: the tail of the human path's latency
// (docs/benchmarks.md, "What the embedded server holds at a million"). A
// floor raises the collector's goal to the floor while twice the live heap
// is below it, and leaves Go's own pacing alone once the live heap is
// larger, so that a broker with a million pending requests pays nothing
// for it.
package gcfloor

import (
	"context"
	"runtime/debug"
	"runtime/metrics"
	"sync"
	"time"
)

// every is how often Run looks whether a collection has run since it last
// looked.
const every = 100 * time.Millisecond

// running is held by the Run that sets the collector's percent: the percent
// is the process's, so one Run sets it at a time and any other waits for
// its context doing nothing (tests run several brokers in one process).
var running sync.Mutex

// Run holds the collector's goal at floor bytes at least until ctx ends,
// then restores the GC percent the process had. After each collection it
// sets the percent so that the next goal is floor while the live heap is
// below half of floor, and the percent the process started with once it is
// not. A floor of 0, GOGC=off, or another Run already running leave the
// collector as it is.
func Run(ctx context.Context, floor uint64) {
	if floor == 0 || !running.TryLock() {
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
			if p := Percent(base, samples[1].Value.Uint64(), floor); p != set {
				debug.SetGCPercent(p)
				set = p
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// Percent returns the GC percent that makes the collector's next goal
// floor bytes for a live heap of live bytes, or base if base's own goal is
// as large already (or nothing is known of the heap yet).
func Percent(base int, live, floor uint64) int {
	if live == 0 || floor <= live {
		return base
	}
	// The goal is live × (1 + percent/100).
	p := (floor - live) * 100 / live
	if p <= uint64(base) {
		return base
	}
	return int(min(p, maxPercent))
}

// maxPercent bounds the percent for a nearly empty heap, whose goal is the
// floor whatever the percent above what it takes.
const maxPercent = 1_000_000
