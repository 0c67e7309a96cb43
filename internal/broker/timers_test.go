package broker

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/assent-dev/assent/pkg/events"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// TestTimersFireInOrder arms timers out of order, replaces, retries and stops
// some, and checks what fires, in what order, and what overdue reports.
func TestTimersFireInOrder(t *testing.T) {
	tm := newTimers()
	go tm.run()
	defer tm.close()
	base := time.Now().Add(50 * time.Millisecond)
	r := make(map[string]*entry)
	for i := 9; i >= 0; i-- {
		id := fmt.Sprint("r", i)
		r[id] = &entry{id: id}
		tm.arm(r[id], base.Add(time.Duration(i)*10*time.Millisecond))
	}
	tm.stop(r["r3"])                                  // decided
	tm.arm(r["r5"], base.Add(time.Hour))              // moved on (an escalation step)
	tm.backup(r["r7"], base.Add(70*time.Millisecond)) // the same moment: left as armed
	tm.retry(r["r9"], base.Add(-time.Second))         // fires at once
	tm.retry(r["r3"], base)                           // stopped: stays stopped
	if n := tm.len(); n != 9 {
		t.Fatalf("%d timers, want 9", n)
	}
	var got []string
	for len(got) < 8 {
		select {
		case ids := <-tm.due:
			got = append(got, ids...)
		case <-time.After(5 * time.Second):
			t.Fatalf("fired %v, then nothing", got)
		}
	}
	want := []string{"r9", "r0", "r1", "r2", "r4", "r6", "r7", "r8"}
	if !slices.Equal(got, want) {
		t.Fatalf("fired %v, want %v", got, want)
	}
	// Fired timers stay known until stopped: all eight are past their
	// moment, none handed over in the last hour counts as in flight.
	if over := tm.overdue(time.Now(), time.Now().Add(-time.Hour), 100); len(over) != 0 {
		t.Fatalf("overdue %v, want none: every one fired within the hour", over)
	}
	// r9's moment is still to come (it fired early, on retry).
	soon := time.Now().Add(time.Second)
	over := tm.overdue(soon, soon, 100)
	slices.Sort(over)
	if want := []string{"r0", "r1", "r2", "r4", "r6", "r7", "r8", "r9"}; !slices.Equal(over, want) {
		t.Fatalf("overdue %v, want %v", over, want)
	}
	if over := tm.overdue(soon, soon, 3); len(over) != 3 {
		t.Fatalf("overdue with limit 3: %v", over)
	}
	for _, id := range want {
		tm.stop(r[id])
	}
	if n := tm.len(); n != 1 {
		t.Fatalf("%d timers, want only r5", n)
	}
}

// TestTimersBackupFiresLater checks that a backup timer fires backupDelay
// after its moment, and that arming it for real replaces it.
func TestTimersBackupFiresLater(t *testing.T) {
	tm := newTimers()
	go tm.run()
	defer tm.close()
	at := time.Now().Add(20 * time.Millisecond)
	a, b := &entry{id: "a"}, &entry{id: "b"}
	tm.backup(b, at)
	tm.backup(a, at)
	tm.arm(a, at)
	// a fires at its moment, b backupDelay later (together, on a machine
	// slow enough to wake the timers that late).
	var got []string
	for len(got) < 2 {
		select {
		case ids := <-tm.due:
			got = append(got, ids...)
		case <-time.After(5 * time.Second):
			t.Fatalf("fired %v, then nothing", got)
		}
	}
	if late := time.Since(at); !slices.Equal(got, []string{"a", "b"}) || late < backupDelay {
		t.Fatalf("fired %v by %s after their moment, want a, then b after %s", got, late, backupDelay)
	}
}

// TestTimersLiveInEntries checks that a timer belongs to its ledger entry:
// armed through the ledger only for a request it holds open, retried and
// handed over by id, and gone when the ledger forgets the request.
func TestTimersLiveInEntries(t *testing.T) {
	b := &Broker{timers: newTimers()}
	l := newLedger(b)
	defer b.timers.close()
	a := &entry{id: "a"}
	l.open["a"] = a
	at := time.Now().Add(time.Hour)
	l.arm("a", at)
	l.arm("gone", at) // decided meanwhile: the ledger holds it no more
	if n := b.timers.len(); n != 1 || !a.tm.armed || a.tm.at != at.UnixNano() {
		t.Fatalf("%d timers, a armed %v at %d; want only a's, at %d", n, a.tm.armed, a.tm.at, at.UnixNano())
	}
	fire := time.Now().Add(time.Minute)
	l.retry([]string{"a", "gone"}, fire)
	if a.tm.fire != fire.UnixNano() || a.tm.at != at.UnixNano() {
		t.Fatalf("retried a fires at %d for %d, want %d for %d", a.tm.fire, a.tm.at, fire.UnixNano(), at.UnixNano())
	}
	l.handed([]string{"a"})
	if a.tm.handed == 0 {
		t.Fatal("a handed over, not noted")
	}
	if over := b.timers.overdue(at.Add(time.Second), time.Now().Add(-time.Second), 10); len(over) != 0 {
		t.Fatalf("overdue %v right after a was handed over", over)
	}
	l.mu.Lock()
	l.forget(a)
	l.mu.Unlock()
	if n := b.timers.len(); n != 0 || a.tm.armed {
		t.Fatalf("%d timers after the ledger forgot a (armed %v), want none", n, a.tm.armed)
	}
	l.disarm("a") // nothing left to stop
}

// TestSweepForgetsOnlyOrphans checks the ledger's sweep: a request open for
// orphanAfter with neither a pending event nor a decision is forgotten, a
// newer one and an announced one are not, and the entries the sweep reads
// (young) are only those not announced, however many requests came.
func TestSweepForgetsOnlyOrphans(t *testing.T) {
	b := &Broker{timers: newTimers(), index: newIndex(0)}
	defer b.timers.close()
	l := newLedger(b)
	now := time.Now()
	l.started = now.Add(-2 * orphanAfter).UnixNano()
	request := func(id string, at time.Time) *entry {
		t.Helper()
		msg := &jetstream.RawStreamMsg{Subject: events.RequestPrefix + "a1", Data: []byte(`{}`),
			Header: nats.Header{"ce-source": {"agent/a1"}, "ce-id": {id}}}
		l.applyRequest(1, at, msg)
		en := l.open[id]
		if en == nil {
			t.Fatalf("request %s not opened", id)
		}
		return en
	}
	old := now.Add(-orphanAfter - time.Minute)
	request("orphan", old)
	request("young", now)
	request("announced", old).pendSeq = 2
	for i := range 3 * youngSlack {
		request(fmt.Sprintf("r%d", i), now).pendSeq = 3
	}
	if len(l.young) > youngSlack+3 {
		t.Fatalf("young holds %d entries after %d announced requests; want them dropped as it grows", len(l.young), 3*youngSlack)
	}
	l.sweep()
	for id, want := range map[string]bool{"orphan": false, "young": true, "announced": true, "r0": true} {
		if _, ok := l.open[id]; ok != want {
			t.Errorf("after the sweep %s open: %v, want %v", id, ok, want)
		}
	}
	if len(l.young) != 1 || l.young[0].id != "young" {
		t.Errorf("after the sweep young holds %d entries, want only the unannounced one", len(l.young))
	}
}
