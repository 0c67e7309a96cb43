package broker

import (
	"context"
	"sync"
)

// coalescer shares one call of ask among the callers that arrive while the
// previous call is under way: each caller gets the answer of a call that
// began after it arrived, so the answer is as fresh as a call of its own,
// yet a burst of n callers costs two calls, not n.
type coalescer[T any] struct {
	ask func(context.Context) (T, error)

	mu      sync.Mutex
	next    *round[T] // the round the next caller joins, not begun yet
	running bool      // a goroutine is running rounds
}

type round[T any] struct {
	done chan struct{}
	val  T
	err  error
}

func newCoalescer[T any](ask func(context.Context) (T, error)) *coalescer[T] {
	return &coalescer[T]{ask: ask}
}

// wait returns the answer of a call of ask that began after wait was called.
func (c *coalescer[T]) wait(ctx context.Context) (T, error) {
	c.mu.Lock()
	r := c.next
	if r == nil {
		r = &round[T]{done: make(chan struct{})}
		c.next = r
	}
	if !c.running {
		c.running = true
		go c.run()
	}
	c.mu.Unlock()
	select {
	case <-r.done:
		return r.val, r.err
	case <-ctx.Done():
		var zero T
		return zero, ctx.Err()
	}
}

// run calls ask for each round in turn until no caller waits.
func (c *coalescer[T]) run() {
	for {
		c.mu.Lock()
		r := c.next
		c.next = nil
		if r == nil {
			c.running = false
			c.mu.Unlock()
			return
		}
		c.mu.Unlock()
		// A round outlives any one caller: it answers all of them.
		r.val, r.err = c.ask(context.Background())
		close(r.done)
	}
}
