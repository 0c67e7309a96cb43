package itest

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/assent-dev/assent/internal/app"
	"github.com/assent-dev/assent/internal/testenv"
)

// StartApp runs the whole broker process (app.Run) with o until the test ends
// and returns where it listens, learnt through Options.Ready.
func StartApp(t testing.TB, o app.Options) app.Addrs {
	t.Helper()
	ready := make(chan app.Addrs, 1)
	o.Ready = func(a app.Addrs) { ready <- a }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- app.Run(ctx, o, testenv.Logger(t)) }()
	var once sync.Once
	stop := func(wait bool) {
		once.Do(func() {
			cancel()
			if !wait {
				return
			}
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("app.Run: %v", err)
				}
			case <-time.After(Patience):
				t.Errorf("app.Run did not return %s after its context ended", Patience)
			}
		})
	}
	t.Cleanup(func() { stop(true) })
	select {
	case a := <-ready:
		return a
	case err := <-done:
		stop(false)
		t.Fatalf("app.Run returned before it was ready: %v", err)
	case <-time.After(Patience):
		t.Fatalf("app not ready after %s", Patience)
	}
	return app.Addrs{}
}
