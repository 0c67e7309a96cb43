package gcpace_test

import (
	"context"
	"runtime"
	"runtime/debug"
	"testing"
	"time"

	"github.com/assent-dev/assent/internal/gcpace"
)

func TestPercent(t *testing.T) {
	const MiB = 1 << 20
	floor := gcpace.Pace{Floor: 256 * MiB}
	both := gcpace.Pace{Floor: 256 * MiB, Headroom: 256 * MiB}
	tests := []struct {
		name string
		base int
		live uint64
		pace gcpace.Pace
		want int
	}{
		{"a small heap: the goal is the floor", 100, 64 * MiB, floor, 300},
		{"half the floor: Go's own goal is the floor", 100, 128 * MiB, floor, 100},
		{"a large heap without a headroom: Go's own goal", 100, 700 * MiB, floor, 100},
		{"a higher GOGC whose goal is larger already", 400, 64 * MiB, floor, 400},
		{"a lower GOGC under the floor", 50, 100 * MiB, floor, 156},
		{"nothing known of the heap yet", 100, 0, floor, 100},
		{"a nearly empty heap", 100, 1, floor, 1_000_000},
		{"a small heap with a headroom: the floor wins", 100, 64 * MiB, both, 300},
		{"a heap under the headroom: Go's own goal", 100, 200 * MiB, both, 100},
		{"a million pending: the headroom", 100, 700 * MiB, both, 36},
		{"a heap four times the headroom: a quarter", 100, 2048 * MiB, both, 25},
		{"larger still: a quarter", 100, 4096 * MiB, both, 25},
		{"a GOGC below the headroom's: the process's own", 20, 700 * MiB, both, 20},
		{"a higher GOGC on a large heap: the headroom", 400, 700 * MiB, both, 36},
		{"a headroom without a floor", 100, 700 * MiB, gcpace.Pace{Headroom: 256 * MiB}, 36},
		{"a headroom without a floor, a small heap", 100, 16 * MiB, gcpace.Pace{Headroom: 256 * MiB}, 100},
	}
	for _, tt := range tests {
		if got := gcpace.Percent(tt.base, tt.live, tt.pace); got != tt.want {
			t.Errorf("%s: Percent(%d, %d MiB, %+v) = %d, want %d", tt.name, tt.base, tt.live/MiB, tt.pace, got, tt.want)
		}
	}
}

// percent reads the process's GC percent.
func percent() int {
	p := debug.SetGCPercent(100)
	debug.SetGCPercent(p)
	return p
}

// TestRun: with a floor far above the test's live heap, Run raises the GC
// percent after a collection; with a live heap above the floor and four
// times the headroom, it lowers the percent to a quarter; when Run ends,
// the process's percent is restored. A second Run at the same time leaves
// the percent to the first.
func TestRun(t *testing.T) {
	base := percent()
	const floor, headroom = 256 << 20, 64 << 20
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { gcpace.Run(ctx, gcpace.Pace{Floor: floor, Headroom: headroom}); close(done) }()
	waitFor := func(what string, ok func(int) bool) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			runtime.GC()
			if p := percent(); ok(p) {
				return
			} else if time.Now().After(deadline) {
				t.Fatalf("%s: GC percent %d", what, p)
			}
		}
	}
	waitFor("a small heap under a 256 MiB floor", func(p int) bool { return p > base })
	other, stop := context.WithTimeout(context.Background(), 300*time.Millisecond)
	gcpace.Run(other, gcpace.Pace{Floor: 1}) // returns at once: the first holds the percent
	if other.Err() != nil {
		t.Fatal("a second Run waited for its context instead of returning")
	}
	stop()
	live := make([]byte, 300<<20) // more than the floor and 4 × the headroom
	for i := range live {
		live[i] = 1
	}
	waitFor("a 300 MiB live heap, a 64 MiB headroom", func(p int) bool { return p == min(base, 25) })
	runtime.KeepAlive(live)
	cancel()
	<-done
	if p := percent(); p != base {
		t.Fatalf("GC percent %d after Run, want the process's %d", p, base)
	}
}
