package broker

import (
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/assent-dev/assent/internal/clustertest"
	"github.com/assent-dev/assent/pkg/events"
)

// TestLoadAsksTheLeaderBeforeNotFound: on a cluster, the state bucket's
// direct gets may be answered by a replica that does not have an entry yet
// (a follower cut off from the others), and an answer or cancel refused as
// naming no request is refused for good. Here a mirror that leaves the
// request out takes part in the bucket's direct gets, as such a follower
// would: it holds one other request (a mirror answers direct gets once it
// has caught up with something), and a replica connected to its node is
// answered by it about half the time. load still finds the request every
// time, through the stream's leader.
func TestLoadAsksTheLeaderBeforeNotFound(t *testing.T) {
	c := clustertest.Start(t, clustertest.Config{})
	connect := func(url string) *nats.Conn {
		t.Helper()
		nc, err := nats.Connect(url)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		return nc
	}
	nc := connect(c.URL())
	b, ctx := runInternal(t, nc, Config{Name: "a", Replicas: 3})
	other := submit(ctx, t, b, events.Requested{Tool: "t", Agent: "a"})
	rec := submit(ctx, t, b, events.Requested{Tool: "t", Agent: "a"})

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
	var node string
	for {
		info, err := mirror.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if info.State.Msgs > 0 && info.Cluster != nil && info.Cluster.Leader != "" {
			node = info.Cluster.Leader
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	var url string
	for _, n := range c.Nodes() {
		if n.Name == node {
			url = n.ClientURL()
		}
	}
	if url == "" {
		t.Fatalf("the mirror is on %q, no node of the cluster", node)
	}
	// A replica connected to the mirror's node.
	b2, ctx := runInternal(t, connect(url), Config{Name: "b", Replicas: 3})

	// The stale answer is really given: the bucket's own get misses the
	// entry now and then.
	missed := false
	for range 200 {
		_, err := b2.res.state.Get(ctx, rec.ID)
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
		got, err := b2.load(ctx, rec.ID)
		if err != nil {
			t.Fatalf("load %s: %v", rec.ID, err)
		}
		if got.ID != rec.ID || got.State != StatePending || got.revision == 0 {
			t.Fatalf("loaded %+v, want the pending request", got)
		}
	}
	// What is not stored is still not found, after asking the leader.
	if _, err := b2.load(ctx, "0193a5b2-7c1e-7d3a-9f1e-000000000000"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("load of an unknown id: %v, want ErrNotFound", err)
	}
}
