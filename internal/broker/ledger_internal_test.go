package broker

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestAwaitWakesOnlyThoseReached checks the ledger's waiters: a handler
// waiting for a sequence returns once the ledger applies it and not
// before, whatever order they came in; one for a sequence already applied
// returns at once; one whose context ends returns its error, and the
// ledger drops it once it reaches its sequence.
func TestAwaitWakesOnlyThoseReached(t *testing.T) {
	l := newLedger(&Broker{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	done := make(map[uint64]chan error)
	for _, seq := range []uint64{5, 2, 9, 3} {
		ch := make(chan error, 1)
		done[seq] = ch
		go func() { ch <- l.await(ctx, seq) }()
	}
	for l.nwait.Load() != 4 {
		time.Sleep(time.Millisecond)
	}
	apply := func(seq uint64) {
		l.mu.Lock()
		l.advance(seq)
		l.mu.Unlock()
	}
	returned := func(seq uint64) bool {
		select {
		case err := <-done[seq]:
			if err != nil {
				t.Fatalf("await %d: %v", seq, err)
			}
			return true
		case <-time.After(50 * time.Millisecond):
			return false
		}
	}
	apply(3)
	for seq, want := range map[uint64]bool{2: true, 3: true, 5: false, 9: false} {
		if got := returned(seq); got != want {
			t.Fatalf("after applying 3, await %d returned: %v, want %v", seq, got, want)
		}
	}
	if n := l.nwait.Load(); n != 2 {
		t.Fatalf("%d waiting after applying 3, want 2", n)
	}
	if err := l.await(ctx, 1); err != nil {
		t.Fatalf("await of a sequence already applied: %v", err)
	}
	short, stop := context.WithCancel(ctx)
	stop()
	if err := l.await(short, 7); !errors.Is(err, context.Canceled) {
		t.Fatalf("await with its context ended: %v, want context.Canceled", err)
	}
	apply(9)
	if !returned(5) || !returned(9) {
		t.Fatal("after applying 9, await 5 and 9 still wait")
	}
	if n := l.nwait.Load(); n != 0 {
		t.Fatalf("%d waiting after applying 9, want none (the ended one dropped too)", n)
	}
}
