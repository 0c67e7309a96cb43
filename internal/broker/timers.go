package broker

import (
	"sync"
	"time"
)

// backupDelay is how long after a request's moment a replica that did not
// arm the request's timer itself (it learnt of the request from the state
// watcher) fires it too, in case the replica that did died or was cut off.
// The one that fires first decides; the others find the request decided.
const backupDelay = 400 * time.Millisecond

// timers holds one in-memory timer per pending request this replica knows of.
// When one fires it sends the request id on due; the broker's expiry loop owns
// the work. They give sub-second precision; the durable schedules cover
// requests when no replica is running.
type timers struct {
	mu     sync.Mutex
	m      map[string]timer
	due    chan string
	done   chan struct{}
	closed bool
}

type timer struct {
	t *time.Timer
	// at is the moment the timer stands for (a backup fires backupDelay
	// after it).
	at time.Time
}

func newTimers() *timers {
	return &timers{m: make(map[string]timer), due: make(chan string, 1024), done: make(chan struct{})}
}

// arm sets id's timer to fire at at, replacing any earlier one.
func (t *timers) arm(id string, at time.Time) { t.set(id, at, false) }

// backup sets id's timer to fire backupDelay after at, unless id's timer
// already stands for at.
func (t *timers) backup(id string, at time.Time) { t.set(id, at, true) }

func (t *timers) set(id string, at time.Time, backup bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return
	}
	if old, ok := t.m[id]; ok {
		if backup && old.at.Equal(at) {
			return
		}
		old.t.Stop()
	}
	fire := at
	if backup {
		fire = at.Add(backupDelay)
	}
	var tm *time.Timer
	tm = time.AfterFunc(time.Until(fire), func() {
		t.mu.Lock()
		if cur, ok := t.m[id]; ok && cur.t == tm {
			delete(t.m, id)
		}
		t.mu.Unlock()
		select {
		case t.due <- id:
		case <-t.done:
		}
	})
	t.m[id] = timer{t: tm, at: at}
}

// stop forgets id's timer.
func (t *timers) stop(id string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if tm, ok := t.m[id]; ok {
		tm.t.Stop()
		delete(t.m, id)
	}
}

// len reports how many timers are armed.
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
	for id, tm := range t.m {
		tm.t.Stop()
		delete(t.m, id)
	}
	close(t.done)
}
