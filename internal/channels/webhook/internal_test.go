package webhook

import (
	"fmt"
	"testing"
	"time"
)

func TestRetryDelay(t *testing.T) {
	for _, c := range []struct {
		attempt  uint64
		min, max time.Duration
	}{
		{1, 800 * time.Millisecond, 1200 * time.Millisecond},
		{2, 1600 * time.Millisecond, 2400 * time.Millisecond},
		{3, 3200 * time.Millisecond, 4800 * time.Millisecond},
		{9, 204800 * time.Millisecond, 5 * time.Minute}, // 256s ± 20%, capped
		{10, 4 * time.Minute, 5 * time.Minute},
		{1000, 4 * time.Minute, 5 * time.Minute},
		{0, 800 * time.Millisecond, 1200 * time.Millisecond}, // no metadata: as a first attempt
	} {
		for _, r := range []float64{0, 0.5, 0.999999} {
			if d := retryDelay(c.attempt, r); d < c.min || d > c.max {
				t.Errorf("retryDelay(%d, %v) = %s, want within [%s, %s]", c.attempt, r, d, c.min, c.max)
			}
		}
	}
	if retryDelay(3, 0) == retryDelay(3, 0.9) {
		t.Error("no jitter")
	}
}

func TestSeenSet(t *testing.T) {
	s := newSeenSet(3)
	now := time.Now()
	if !s.add("a", now) || s.add("a", now.Add(time.Minute)) {
		t.Fatal("a second add of a key within the window must report a replay")
	}
	if !s.add("a", now.Add(2*Tolerance+time.Second)) {
		t.Fatal("a key must be forgotten after the window")
	}
	s.remove("a")
	if !s.add("a", now.Add(2*Tolerance+2*time.Second)) {
		t.Fatal("a removed key must be accepted again")
	}
	// Bounded: past its size, the oldest keys go first.
	s = newSeenSet(3)
	for i := range 10 {
		s.add(fmt.Sprint(i), now)
	}
	if len(s.at) > 3 || len(s.order) > 3 {
		t.Fatalf("set holds %d keys (%d in order), want at most 3", len(s.at), len(s.order))
	}
	if s.add("9", now) {
		t.Fatal("the newest key was evicted")
	}
}

func TestEventType(t *testing.T) {
	for in, want := range map[string]string{
		"pending":                               "dev.assent.approval.pending",
		"dev.assent.approval.decided":           "dev.assent.approval.decided",
		" cancel ":                              "dev.assent.approval.cancel",
		"rejected":                              "dev.assent.approval.rejected",
		"decision":                              "",
		"dev.assent.policy.shadow_disagreement": "",
		"":                                      "",
	} {
		got, ok := eventType(in)
		if ok != (want != "") || ok && got != want {
			t.Errorf("eventType(%q) = %q, %v; want %q", in, got, ok, want)
		}
	}
}

func TestRedactURL(t *testing.T) {
	for in, want := range map[string]string{
		"https://user:pw@example.com/hook?token=s3cret#x": "https://example.com/hook?...",
		"http://127.0.0.1:8080/in":                        "http://127.0.0.1:8080/in",
	} {
		if got := redactURL(in); got != want {
			t.Errorf("redactURL(%q) = %q, want %q", in, got, want)
		}
	}
}
