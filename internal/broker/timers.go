package broker

import (
	"sync"
	"time"

	"github.com/google/btree"
)

// backupDelay is how long after a request's moment a replica that did not
// arm the request's timer itself (it learnt of the request from the state
// watcher) fires it too, in case the replica that did died or was cut off.
// The one that fires first decides; the others find the request decided.
const backupDelay = 400 * time.Millisecond

// timers knows the next moment of every pending request this replica knows
// of (its deadline or next escalation step) and sends the ids of requests on
// due when their moments come, those that come together in one slice; the broker's expiry loop owns the work. A fired
// request stays known until it is stopped (decided, or gone), so that the
// durable ticks can find requests whose moment passed long ago and that are
// still pending (overdue).
//
// One goroutine and one runtime timer serve every request: a million pending
// requests cost a map entry and a place in two trees each, not a runtime
// timer each.
type timers struct {
	mu     sync.Mutex
	m      map[string]*timer
	queue  *btree.BTreeG[*timer] // not fired yet, by fire time
	byAt   *btree.BTreeG[*timer] // all, by moment
	due    chan []string
	wake   chan struct{}
	done   chan struct{}
	closed bool
}

type timer struct {
	id string
	// at is the moment the timer stands for, fire when it fires (a backup
	// fires backupDelay after at; a retry sooner), both in Unix nanoseconds.
	at, fire int64
	// queued: it waits in queue to fire. handed is when its request was
	// last handed over (it fired, or a durable tick found it), 0 for never.
	queued bool
	handed int64
}

func byFire(a, b *timer) bool {
	if a.fire != b.fire {
		return a.fire < b.fire
	}
	return a.id < b.id
}

func byMoment(a, b *timer) bool {
	if a.at != b.at {
		return a.at < b.at
	}
	return a.id < b.id
}

func newTimers() *timers {
	t := &timers{
		m:     make(map[string]*timer),
		queue: btree.NewG(32, byFire),
		byAt:  btree.NewG(32, byMoment),
		due:   make(chan []string, 64),
		wake:  make(chan struct{}, 1),
		done:  make(chan struct{}),
	}
	return t
}

// arm sets id's timer to fire at at, replacing any earlier one.
func (t *timers) arm(id string, at time.Time) { t.set(id, at.UnixNano(), 0) }

// backup sets id's timer to fire backupDelay after at, unless id's timer
// already stands for at.
func (t *timers) backup(id string, at time.Time) { t.set(id, at.UnixNano(), backupDelay) }

func (t *timers) set(id string, at int64, delay time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return
	}
	old, ok := t.m[id]
	if ok {
		if delay > 0 && old.at == at {
			return
		}
		t.forget(old)
	}
	t.schedule(&timer{id: id, at: at}, at+int64(delay))
}

// retry fires id again at fire, keeping its moment: its expiry was not
// handed over.
func (t *timers) retry(id string, fire time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if tm, ok := t.m[id]; ok && !t.closed {
		t.forget(tm)
		t.schedule(&timer{id: id, at: tm.at}, fire.UnixNano())
	}
}

// schedule adds tm, to fire at fire. The caller holds mu.
func (t *timers) schedule(tm *timer, fire int64) {
	tm.fire, tm.queued = fire, true
	t.m[tm.id] = tm
	t.byAt.ReplaceOrInsert(tm)
	t.queue.ReplaceOrInsert(tm)
	if first, _ := t.queue.Min(); first == tm {
		select {
		case t.wake <- struct{}{}:
		default:
		}
	}
}

// forget drops tm from the trees and the map. The caller holds mu.
func (t *timers) forget(tm *timer) {
	if tm.queued {
		t.queue.Delete(tm)
	}
	t.byAt.Delete(tm)
	delete(t.m, tm.id)
}

// stop forgets id's timer.
func (t *timers) stop(id string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if tm, ok := t.m[id]; ok {
		t.forget(tm)
	}
}

// run fires timers as they fall due until close. The broker runs it.
func (t *timers) run() {
	clock := time.NewTimer(time.Hour)
	defer clock.Stop()
	for {
		var fired []string
		t.mu.Lock()
		now := time.Now().UnixNano()
		for len(fired) < maxBatch {
			tm, ok := t.queue.Min()
			if !ok || tm.fire > now {
				break
			}
			t.queue.DeleteMin()
			tm.queued, tm.handed = false, now
			fired = append(fired, tm.id)
		}
		next := time.Hour
		if tm, ok := t.queue.Min(); ok {
			next = max(time.Duration(tm.fire-now), 0)
		}
		t.mu.Unlock()
		if len(fired) > 0 {
			select {
			case t.due <- fired:
			case <-t.done:
				return
			}
			continue
		}
		clock.Reset(next)
		select {
		case <-clock.C:
		case <-t.wake:
			clock.Stop()
		case <-t.done:
			return
		}
	}
}

// overdue returns up to limit requests whose moment is before before and
// that were not handed over since since: their timer did not fire, or it
// fired long ago and they are still pending.
func (t *timers) overdue(before, since time.Time, limit int) []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	var ids []string
	b, s := before.UnixNano(), since.UnixNano()
	t.byAt.Ascend(func(tm *timer) bool {
		if tm.at >= b || len(ids) == limit {
			return false
		}
		if tm.handed < s {
			ids = append(ids, tm.id)
		}
		return true
	})
	return ids
}

// handed notes that ids were handed over now.
func (t *timers) handed(ids []string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := time.Now().UnixNano()
	for _, id := range ids {
		if tm, ok := t.m[id]; ok {
			tm.handed = now
		}
	}
}

// known reports whether id has a timer.
func (t *timers) known(id string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	_, ok := t.m[id]
	return ok
}

// len reports how many requests have timers.
func (t *timers) len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.m)
}

// close stops every timer; safe to call twice.
func (t *timers) close() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return
	}
	t.closed = true
	t.m = make(map[string]*timer)
	t.queue.Clear(false)
	t.byAt.Clear(false)
	close(t.done)
}
