package broker

import (
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/assent-dev/assent/internal/testenv"
	"github.com/assent-dev/assent/pkg/events"
)

// TestLoadAsksTheLeaderBeforeNotFound: the state bucket's direct gets may be
// answered by a replica that does not have an entry yet (a follower cut off
// from the others), and an answer or cancel refused as naming no request is
// refused for good. Here a mirror that leaves every entry out takes part in
// the bucket's direct gets, as such a follower would (it holds one other
// request, and a mirror answers direct gets only once it has caught up with
// something), and load still finds the request every time, through the
// stream's leader.
func TestLoadAsksTheLeaderBeforeNotFound(t *testing.T) {
	ns := testenv.Server(t)
	nc := testenv.Conn(t, ns)
	b, ctx := runInternal(t, nc, Config{})
	other, err := b.Submit(ctx, "", "test/t", events.Requested{Tool: "t", Agent: "a"})
	if err != nil {
		t.Fatal(err)
	}
	rec, err := b.Submit(ctx, "", "test/t", events.Requested{Tool: "t", Agent: "a"})
	if err != nil {
		t.Fatal(err)
	}

	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	mirror, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name:         "STALE_STATE",
		Mirror:       &jetstream.StreamSource{Name: "KV_" + StateBucket, FilterSubject: "$KV." + StateBucket + "." + other.ID},
		MirrorDirect: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	for {
		info, err := mirror.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if info.State.Msgs > 0 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	// The stale answer is really given: the bucket's own get misses the
	// entry now and then.
	missed := false
	for range 200 {
		_, err := b.res.state.Get(ctx, rec.ID)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			missed = true
			break
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if !missed {
		t.Fatal("the mirror never answered a direct get; the test shows nothing")
	}
	for range 50 {
		got, err := b.load(ctx, rec.ID)
		if err != nil {
			t.Fatalf("load %s: %v", rec.ID, err)
		}
		if got.ID != rec.ID || got.State != StatePending || got.revision == 0 {
			t.Fatalf("loaded %+v, want the pending request", got)
		}
	}
	// What is not stored is still not found, after asking the leader.
	if _, err := b.load(ctx, "0193a5b2-7c1e-7d3a-9f1e-000000000000"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("load of an unknown id: %v, want ErrNotFound", err)
	}
}
