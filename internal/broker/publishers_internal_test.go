package broker

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/assent-dev/assent/internal/testenv"
)

// TestPublishersSkipConnectionsDown checks that publishes go out on every
// connection in turn, skip one that is down while another is up, and go
// out on some connection while all are down (to fail, and be tried again).
func TestPublishersSkipConnectionsDown(t *testing.T) {
	ns := testenv.Server(t)
	nc := testenv.Conn(t, ns)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	p := newPublishers(nc, js, 2, testenv.Logger(t))
	defer p.close()
	if len(p.conns) != 3 {
		t.Fatalf("%d connections, want 3", len(p.conns))
	}
	picked := func() map[*nats.Conn]int {
		seen := map[*nats.Conn]int{}
		for range 30 {
			c, _ := p.pick()
			seen[c]++
		}
		return seen
	}
	for deadline := time.Now().Add(5 * time.Second); len(picked()) != 3; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("publishes went out on %d of 3 connections", len(picked()))
		}
	}
	down := p.conns[1].nc
	down.Close()
	for deadline := time.Now().Add(5 * time.Second); picked()[down] > 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("publishes still go out on a closed connection while two others are up")
		}
	}
	p.conns[2].nc.Close()
	nc.Close()
	if seen := picked(); len(seen) == 0 {
		t.Fatal("no connection picked while all are down")
	}
}
