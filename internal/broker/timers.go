package broker

import (
	"sync"
	"time"
)

// timers holds one in-memory timer per pending request this replica knows of.
// When one fires it sends the request id on due; the broker's expiry loop owns
// the work. They give sub-second precision; the durable schedules cover
// requests whose replica died.
type timers struct {
	mu     sync.Mutex
	m      map[string]*time.Timer
	due    chan string
	done   chan struct{}
	closed bool
}

func newTimers() *timers {
	return &timers{m: make(map[string]*time.Timer), due: make(chan string, 1024), done: make(chan struct{})}
}

// arm sets id's timer to fire at at, replacing any earlier one.
func (t *timers) arm(id string, at time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return
	}
	if old, ok := t.m[id]; ok {
		old.Stop()
	}
	t.m[id] = time.AfterFunc(time.Until(at), func() {
		t.mu.Lock()
		delete(t.m, id)
		t.mu.Unlock()
		select {
		case t.due <- id:
		case <-t.done:
		}
	})
}

// stop forgets id's timer.
func (t *timers) stop(id string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if tm, ok := t.m[id]; ok {
		tm.Stop()
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
		tm.Stop()
		delete(t.m, id)
	}
	close(t.done)
}
