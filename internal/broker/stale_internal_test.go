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

// TestDecisionReadFromTheLeader: on a cluster, a stream's direct gets may
// be answered by a replica that does not have a message yet (a follower cut
// off from the others). A replica resolving a publish refused as a second
// decision, or reading a decision its index no longer keeps, must not take
// "not found" from it. Here a mirror that leaves the decision out takes part
// in the stream's direct gets, as such a follower would: it holds one other
// decision (a mirror answers direct gets once it has caught up with
// something), and a replica connected to its node is answered by it about
// half the time. firstDecision still finds the decision every time, through
// the stream's leader.
func TestDecisionReadFromTheLeader(t *testing.T) {
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
	b, ctx := runInternal(t, nc, Config{Name: "a", Replicas: 3, Mode: ModeAutoApprove})
	other := submit(ctx, t, b, events.Requested{Tool: "t", Agent: "a"})
	rec := submit(ctx, t, b, events.Requested{Tool: "t", Agent: "a"})
	if !rec.State.Terminal() || !other.State.Terminal() {
		t.Fatalf("requests %s and %s, want both decided", rec.State, other.State)
	}

	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	mirror, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name:         "STALE_DECISIONS",
		Mirror:       &jetstream.StreamSource{Name: StreamName, FilterSubject: events.DecisionPrefix + other.ID},
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
	b2, ctx := runInternal(t, connect(url), Config{Name: "b", Replicas: 3, Mode: ModeAutoApprove})

	// The stale answer is really given: the stream's own direct get misses
	// the decision now and then.
	missed := false
	for range 200 {
		_, err := b2.res.stream.GetMsg(ctx, 1, jetstream.WithGetMsgSubject(events.DecisionPrefix+rec.ID))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
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
		m, err := b2.firstDecision(ctx, rec.ID)
		if err != nil {
			t.Fatalf("first decision of %s: %v", rec.ID, err)
		}
		if eventID(m.Header, m.Data) != rec.DecisionEventID {
			t.Fatalf("read event %s, want %s", eventID(m.Header, m.Data), rec.DecisionEventID)
		}
		got, err := b2.loadStored(ctx, rec.ID)
		if err != nil || got.State != rec.State || got.Request.Tool != "t" {
			t.Fatalf("loaded %+v (%v), want the decided request", got, err)
		}
	}
	// What is not stored is still not found, after asking the leader.
	if _, err := b2.load(ctx, "0193a5b2-7c1e-7d3a-9f1e-000000000000"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("load of an unknown id: %v, want ErrNotFound", err)
	}
}
