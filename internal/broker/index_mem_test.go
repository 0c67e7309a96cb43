package broker

import (
	"encoding/json"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/assent-dev/assent/pkg/events"
)

// storedPending returns a pending request as the state watcher hands it to
// the index: every string and the args in an allocation of its own, as
// decoding its KV entry leaves them.
func storedPending(id, agent, session string, at time.Time, rev uint64) Record {
	return Record{
		ID:    id,
		State: StatePending,
		Request: events.Requested{
			Tool:    strings.Clone("delete_file"),
			Args:    json.RawMessage(`{"path":"/srv/reports/q3-` + strconv.FormatUint(rev, 10) + `.csv"}`),
			Agent:   strings.Clone(agent),
			Session: strings.Clone(session),
			User:    strings.Clone("carol"),
			Hint:    strings.Clone("Delete the Q3 report?"),
			Timeout: events.Duration(2 * time.Minute),
		},
		Source:        "agent/" + agent,
		RequestDigest: strings.Clone("sha256:8f434346648f6b96df89dda901c5176b10a6d83961dd3c1ac88b59b2dc327aa4"),
		RequestSeq:    rev,
		ReceivedAt:    at,
		Deadline:      at.Add(2 * time.Minute),
		Rule:          strings.Clone("mode:manual"),
		Approvers:     []string{strings.Clone("alice"), strings.Clone("bob")},
		Quorum:        1,
		revision:      rev,
	}
}

// TestIndexHeapPerPending reports the heap a pending request costs the
// index: 200,000 of them from 10 agents, with a session of their own each
// (the worst case: nothing to share) and in sessions of 20 requests. It fails
// only far above the expected figure, to catch a regression.
func TestIndexHeapPerPending(t *testing.T) {
	if testing.Short() {
		t.Skip("puts 200,000 requests")
	}
	const (
		n     = 200_000
		bound = 400 // bytes per request
	)
	for _, tc := range []struct {
		name    string
		session func(i int) string
	}{
		{"unique sessions", func(i int) string { return "s-" + strconv.Itoa(i) }},
		{"sessions of 20", func(i int) string { return "s-" + strconv.Itoa(i/200) + "-" + strconv.Itoa(i%10) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			x := newIndex(DefaultKeepDecided)
			for i := range n {
				agent := fmt.Sprintf("agent-%d", i%10)
				x.put(storedPending(events.NewID(), agent, tc.session(i), start.Add(time.Duration(i)*time.Millisecond), uint64(i+1)))
			}
			runtime.GC()
			runtime.ReadMemStats(&after)
			if got := x.pendingCount(); got != n {
				t.Fatalf("%d pending, want %d", got, n)
			}
			runtime.KeepAlive(x)
			per := float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / n
			t.Logf("%.0f bytes of heap per pending request (%d requests, 10 agents, %s)", per, n, tc.name)
			if per > bound {
				t.Errorf("%.0f bytes of heap per pending request, want at most %d", per, bound)
			}
		})
	}
}

// BenchmarkIndexList lists a page (100) of 1,000,000 pending requests from
// 10 agents in sessions of 1,000, by the filters the HTTP API uses: none,
// state, agent, session, both, and after a request halfway.
func BenchmarkIndexList(b *testing.B) {
	const n = 1_000_000
	x := newIndex(DefaultKeepDecided)
	start := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	ids := make([]string, n)
	for i := range n {
		ids[i] = events.NewID()
		x.put(Record{
			ID:         ids[i],
			State:      StatePending,
			Request:    events.Requested{Tool: "delete_file", Agent: "agent-" + strconv.Itoa(i%10), Session: "s-" + strconv.Itoa(i/10_000) + "-" + strconv.Itoa(i%10)},
			ReceivedAt: start.Add(time.Duration(i) * time.Millisecond),
			revision:   uint64(i + 1),
		})
	}
	for _, bc := range []struct {
		name string
		f    Filter
	}{
		{"none", Filter{}},
		{"pending", Filter{State: StatePending}},
		{"agent", Filter{Agent: "agent-7"}},
		{"session", Filter{Session: "s-50-3"}},
		{"agent+session", Filter{Agent: "agent-3", Session: "s-50-3"}},
		{"session+after", Filter{Session: "s-50-3", After: ids[500_503]}},
		{"after", Filter{After: ids[n/2]}},
		{"agent+after", Filter{Agent: "agent-7", After: ids[n/2+7]}},
	} {
		bc.f.Limit = 100
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				_, _ = x.list(bc.f)
			}
		})
	}
}
