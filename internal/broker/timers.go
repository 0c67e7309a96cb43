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
// One goroutine and one runtime timer serve every request, and a request's
// timer is part of its ledger entry (clock): a million pending requests
// cost a place in two trees each, not a runtime timer, an object and a map
// entry each. The ledger finds a request's entry by id, so whoever arms,
// retries or stops a timer holds the ledger's lock (ledger.arm and the
// like), then mu.
type timers struct {
	mu     sync.Mutex
	queue  *btree.BTreeG[*entry] // not fired yet, by fire time
	byAt   *btree.BTreeG[*entry] // all armed, by moment
	due    chan []string
	wake   chan struct{}
	done   chan struct{}
	closed bool
}

// clock is a request's timer, in its entry. Its fields change under
// timers.mu; armed only while the ledger's lock is held too, so that the
// ledger may read it under its own.
type clock struct {
	// at is the moment the timer stands for, fire when it fires (a backup
	// fires backupDelay after at; a retry sooner), both in Unix nanoseconds.
	at, fire int64
	// handed is when its request was last handed over (it fired, or a
	// durable tick found it), 0 for never.
	handed int64
	// armed: in byAt. queued: it waits in queue to fire.
	armed, queued bool
}

func byFire(a, b *entry) bool {
	if a.tm.fire != b.tm.fire {
		return a.tm.fire < b.tm.fire
	}
	return a.id < b.id
}

func byMoment(a, b *entry) bool {
	if a.tm.at != b.tm.at {
		return a.tm.at < b.tm.at
	}
	return a.id < b.id
}

func newTimers() *timers {
	t := &timers{
		queue: btree.NewG(32, byFire),
		byAt:  btree.NewG(32, byMoment),
		due:   make(chan []string, 64),
		wake:  make(chan struct{}, 1),
		done:  make(chan struct{}),
	}
	return t
}

// arm sets en's timer to fire at at, replacing any earlier one.
func (t *timers) arm(en *entry, at time.Time) { t.set(en, at.UnixNano(), 0) }

// backup sets en's timer to fire backupDelay after at, unless en's timer
// already stands for at.
func (t *timers) backup(en *entry, at time.Time) { t.set(en, at.UnixNano(), backupDelay) }

func (t *timers) set(en *entry, at int64, delay time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return
	}
	if en.tm.armed {
		if delay > 0 && en.tm.at == at {
			return
		}
		t.forget(en)
	}
	en.tm = clock{at: at}
	t.schedule(en, at+int64(delay))
}

// retry fires en again at fire, keeping its moment: its expiry was not
// handed over.
func (t *timers) retry(en *entry, fire time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if en.tm.armed && !t.closed {
		t.forget(en)
		en.tm = clock{at: en.tm.at}
		t.schedule(en, fire.UnixNano())
	}
}

// schedule adds en, to fire at fire. The caller holds mu.
func (t *timers) schedule(en *entry, fire int64) {
	en.tm.fire, en.tm.queued, en.tm.armed = fire, true, true
	t.byAt.ReplaceOrInsert(en)
	t.queue.ReplaceOrInsert(en)
	if first, _ := t.queue.Min(); first == en {
		select {
		case t.wake <- struct{}{}:
		default:
		}
	}
}

// forget drops en from the trees. The caller holds mu.
func (t *timers) forget(en *entry) {
	if en.tm.queued {
		t.queue.Delete(en)
	}
	t.byAt.Delete(en)
	en.tm.armed, en.tm.queued = false, false
}

// stop forgets en's timer.
func (t *timers) stop(en *entry) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if en.tm.armed {
		t.forget(en)
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
			en, ok := t.queue.Min()
			if !ok || en.tm.fire > now {
				break
			}
			t.queue.DeleteMin()
			en.tm.queued, en.tm.handed = false, now
			fired = append(fired, en.id)
		}
		next := time.Hour
		if en, ok := t.queue.Min(); ok {
			next = max(time.Duration(en.tm.fire-now), 0)
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
	t.byAt.Ascend(func(en *entry) bool {
		if en.tm.at >= b || len(ids) == limit {
			return false
		}
		if en.tm.handed < s {
			ids = append(ids, en.id)
		}
		return true
	})
	return ids
}

// handed notes that en was handed over at now (Unix nanoseconds).
func (t *timers) handed(en *entry, now int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if en.tm.armed {
		en.tm.handed = now
	}
}

// len reports how many requests have timers.
func (t *timers) len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.byAt.Len()
}

// close stops every timer; safe to call twice.
func (t *timers) close() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return
	}
	t.closed = true
	t.queue.Clear(false)
	t.byAt.Clear(false)
	close(t.done)
}

// timersOf calls f, with the ledger's lock held, on the entry of each of
// ids the ledger holds open: a timer is reached through its entry, and a
// request decided meanwhile has none.
func (l *ledger) timersOf(f func(*entry), ids ...string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, id := range ids {
		if en := l.open[id]; en != nil {
			f(en)
		}
	}
}

// arm sets the timer of open request id to fire at at.
func (l *ledger) arm(id string, at time.Time) {
	l.timersOf(func(en *entry) { l.b.timers.arm(en, at) }, id)
}

// disarm stops the timer of request id.
func (l *ledger) disarm(id string) { l.timersOf(l.b.timers.stop, id) }

// retry fires the timers of ids again at fire, keeping their moments.
func (l *ledger) retry(ids []string, fire time.Time) {
	l.timersOf(func(en *entry) { l.b.timers.retry(en, fire) }, ids...)
}

// handed notes that the requests ids were handed over now.
func (l *ledger) handed(ids []string) {
	now := time.Now().UnixNano()
	l.timersOf(func(en *entry) { l.b.timers.handed(en, now) }, ids...)
}
