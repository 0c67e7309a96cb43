package gcfloor_test

import (
	"context"
	"runtime"
	"runtime/debug"
	"testing"
	"time"

	"github.com/assent-dev/assent/internal/gcfloor"
)

func TestPercent(t *testing.T) {
	const MiB = 1 << 20
	tests := []struct {
		name        string
		base        int
		live, floor uint64
		want        int
	}{
		{"a small heap: the goal is the floor", 100, 64 * MiB, 256 * MiB, 300},
		{"half the floor: Go's own goal is the floor", 100, 128 * MiB, 256 * MiB, 100},
		{"a large heap: Go's own goal", 100, 700 * MiB, 256 * MiB, 100},
		{"a higher GOGC whose goal is larger already", 400, 64 * MiB, 256 * MiB, 400},
		{"a lower GOGC under the floor", 50, 100 * MiB, 256 * MiB, 156},
		{"nothing known of the heap yet", 100, 0, 256 * MiB, 100},
		{"a nearly empty heap", 100, 1, 256 * MiB, 1_000_000},
	}
	for _, tt := range tests {
		if got := gcfloor.Percent(tt.base, tt.live, tt.floor); got != tt.want {
			t.Errorf("%s: Percent(%d, %d, %d) = %d, want %d", tt.name, tt.base, tt.live, tt.floor, got, tt.want)
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
// percent after a collection; with a live heap above half the floor, it
// goes back to the process's own; when Run ends, the process's percent is
// restored. A second Run at the same time leaves the percent to the first.
func TestRun(t *testing.T) {
	base := percent()
	const floor = 512 << 20
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { gcfloor.Run(ctx, floor); close(done) }()
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
	waitFor("a small heap under a 512 MiB floor", func(p int) bool { return p > base })
	other, stop := context.WithTimeout(context.Background(), 300*time.Millisecond)
	gcfloor.Run(other, 1) // returns at once: the first holds the percent
	if other.Err() != nil {
		t.Fatal("a second Run waited for its context instead of returning")
	}
	stop()
	live := make([]byte, 300<<20) // more than half the floor, live
	for i := range live {
		live[i] = 1
	}
	waitFor("a 300 MiB live heap under a 512 MiB floor", func(p int) bool { return p == base })
	runtime.KeepAlive(live)
	cancel()
	<-done
	if p := percent(); p != base {
		t.Fatalf("GC percent %d after Run, want the process's %d", p, base)
	}
}
