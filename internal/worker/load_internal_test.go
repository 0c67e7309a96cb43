package worker

import (
	"testing"
	"time"
)

func TestSummarise(t *testing.T) {
	var ds []time.Duration
	for i := 100; i >= 1; i-- {
		ds = append(ds, time.Duration(i)*time.Millisecond)
	}
	l := summarise(ds)
	want := Latency{Min: time.Millisecond, Mean: 50500 * time.Microsecond, P50: 50 * time.Millisecond, P95: 95 * time.Millisecond, P99: 99 * time.Millisecond, Max: 100 * time.Millisecond}
	if l != want {
		t.Fatalf("summarise = %+v, want %+v", l, want)
	}
	if l := summarise(nil); l != (Latency{}) {
		t.Fatalf("summarise(nil) = %+v", l)
	}
	if p := percentile([]time.Duration{7}, 99); p != 7 {
		t.Fatalf("percentile of one = %v", p)
	}
}
