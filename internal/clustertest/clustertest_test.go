package clustertest_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap/zaptest"

	"github.com/assent-dev/assent/internal/broker"
	"github.com/assent-dev/assent/internal/clustertest"
	"github.com/assent-dev/assent/pkg/events"
	"github.com/assent-dev/assent/pkg/handler"
)

// TestDeployClusterConfigs reads the sample cluster configuration of
// deploy/nats with nats-server's own parser, starts the three nodes from it
// (on free ports and in temporary stores), and uses it as docs/cluster.md
// says: an R3 stream keeps taking writes while one node is stopped, and the
// node comes back on its ports and store.
func TestDeployClusterConfigs(t *testing.T) {
	files, err := filepath.Glob("../../deploy/nats/cluster-node*.conf")
	if err != nil || len(files) != 3 {
		t.Fatalf("want deploy/nats/cluster-node{1,2,3}.conf, found %v (%v)", files, err)
	}
	c := clustertest.FromConfigs(t, files...)
	for i, n := range c.Nodes() {
		o := n.Options()
		if want := fmt.Sprintf("node%d", i+1); o.ServerName != want {
			t.Errorf("%s: server_name %q", files[i], o.ServerName)
		}
		if !o.SyncAlways {
			t.Errorf("%s: sync_interval is not always", files[i])
		}
		if o.Cluster.Name != "assent" || !o.JetStream {
			t.Errorf("%s: cluster %q, jetstream %v", files[i], o.Cluster.Name, o.JetStream)
		}
	}
	nc := c.Conn(t)
	// A broker on these nodes takes events of its default 1 MiB limit, not
	// a limit lowered to fit nats-server's default max_payload.
	if mp, need := nc.MaxPayload(), broker.NeededMaxPayload(events.DefaultMaxEventSize); int(mp) < need {
		t.Errorf("max_payload %d, the broker needs %d", mp, need)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), clustertest.Patience)
	defer cancel()
	// The meta group may not know all three peers yet right after the
	// start: "no suitable peers for placement" until it does.
	var s jetstream.Stream
	for {
		s, err = js.CreateStream(ctx, jetstream.StreamConfig{Name: "R3", Subjects: []string{"r3.>"}, Replicas: 3})
		var apiErr *jetstream.APIError
		if err == nil || !errors.As(err, &apiErr) || apiErr.ErrorCode != 10005 || ctx.Err() != nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	publish(t, js, "1")
	c.Node(2).Stop()
	// Quorum is two of three: writes go on, once the leaders that were on
	// the stopped node have moved.
	publish(t, js, "2")
	if err := c.Node(2).Restart(ctx); err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 2 || info.Config.Replicas != 3 {
		t.Fatalf("stream after the restart: %d messages, R%d", info.State.Msgs, info.Config.Replicas)
	}
}

// TestKillStreamLeader runs the nodes as nats-server processes and kills
// the one leading an R3 stream with SIGKILL, as a crash would: the stream
// keeps every write acknowledged before, takes writes again once the other
// two elected a leader, and the killed node comes back on its ports and
// store, and current.
func TestKillStreamLeader(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs nats-server")
	}
	c := clustertest.Start(t, clustertest.Config{Binary: clustertest.BuildNATSServer(t)})
	for _, n := range c.Nodes() {
		if n.Server() != nil || !n.Running() {
			t.Fatalf("%s: want a running process, not an in-process server", n.Name)
		}
	}
	js, err := jetstream.New(c.Conn(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*clustertest.Patience)
	defer cancel()
	s, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "R3", Subjects: []string{"r3.>"}, Replicas: 3})
	if err != nil {
		t.Fatal(err)
	}
	publish(t, js, "1")
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	leader := nodeNamed(t, c, info.Cluster.Leader)
	if err := leader.Kill(); err != nil {
		t.Fatal(err)
	}
	if leader.Running() || leader.Kills() != 1 {
		t.Fatalf("%s after Kill: running %v, %d kills", leader.Name, leader.Running(), leader.Kills())
	}
	publish(t, js, "2") // once a new leader is elected
	if info, err = s.Info(ctx); err != nil {
		t.Fatal(err)
	}
	if info.Cluster.Leader == leader.Name || info.Cluster.Leader == "" {
		t.Fatalf("stream leader after the kill: %q", info.Cluster.Leader)
	}
	if err := leader.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	publish(t, js, "3")
	if info, err = s.Info(ctx); err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 3 {
		t.Fatalf("stream after the restart: %d messages, want 3", info.State.Msgs)
	}
}

// nodeNamed returns the node of c named name.
func nodeNamed(t *testing.T, c *clustertest.Cluster, name string) *clustertest.Node {
	t.Helper()
	for _, n := range c.Nodes() {
		if n.Name == name {
			return n
		}
	}
	t.Fatalf("no node named %q", name)
	return nil
}

// TestReplicasOnCluster runs two broker replicas as processes on the cluster,
// the second one through a fault proxy: requests are decided while a replica
// is killed and restarted, while a node is down, and after the proxy cut the
// second replica off and let it back.
func TestReplicasOnCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the broker binary")
	}
	c := clustertest.Start(t, clustertest.Config{})
	bin := clustertest.BuildBroker(t)
	proxy := clustertest.NewProxy(t, "node1", c.Node(0).ClientAddr())
	mode := []string{"--mode", "auto-approve", "--log-level", "warn"}
	r1 := clustertest.StartReplica(t, clustertest.ReplicaConfig{Binary: bin, Name: "replica-1", NATSURL: c.URL(), Args: mode})
	r2 := clustertest.StartReplica(t, clustertest.ReplicaConfig{Binary: bin, Name: "replica-2", NATSURL: proxy.URL(), Args: mode})
	defer func() {
		if t.Failed() {
			t.Logf("replica-1:\n%s\nreplica-2:\n%s", r1.Output(), r2.Output())
		}
	}()

	nc := c.Conn(t)
	client, err := handler.NewClient(nc, handler.Config{Agent: "harness"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*clustertest.Patience)
	defer cancel()
	ask := func(what string) {
		t.Helper()
		d, err := client.Request(ctx, handler.Request{Requested: events.Requested{Tool: "probe", Args: json.RawMessage(`{"what":"` + what + `"}`), Timeout: events.Duration(30 * time.Second)}})
		if err != nil || !d.Approved() {
			t.Fatalf("%s: %+v, %v", what, d, err)
		}
	}
	ask("both up")

	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{events.StreamName} {
		s, err := js.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if info, err := s.Info(ctx); err != nil || info.Config.Replicas != 3 || info.Cluster == nil || len(info.Cluster.Replicas) != 2 {
			t.Fatalf("%s: %+v, %v; want R3 with a leader and two replicas", name, info, err)
		}
	}

	if err := r1.Kill(); err != nil {
		t.Fatal(err)
	}
	ask("replica-1 killed") // replica-2, through the proxy, decides
	if err := r1.Start(ctx); err != nil {
		t.Fatal(err)
	}

	c.Node(2).Stop()
	ask("node3 down")
	if err := c.Node(2).Restart(ctx); err != nil {
		t.Fatal(err)
	}

	if err := proxy.Cut(); err != nil {
		t.Fatal(err)
	}
	if err := r1.Kill(); err != nil {
		t.Fatal(err)
	}
	// replica-2 is cut off and replica-1 dead: nobody decides until the
	// proxy lets replica-2 through again.
	time.Sleep(time.Second)
	proxy.Clear()
	ask("replica-2 back through the proxy")
	waitReady(t, r2)
	if err := r1.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if starts, kills := r1.Counts(); starts != 3 || kills != 2 {
		t.Fatalf("replica-1 started %d times, killed %d; want 3 and 2", starts, kills)
	}
	if n := proxy.Counts()["cut"]; n != 1 {
		t.Fatalf("proxy counted %d cuts", n)
	}
	if err := r2.Stop(ctx); err != nil {
		t.Fatal(err)
	}
}

// publish publishes data on r3.a with its own message id. JetStream answers
// nothing to a publish while the stream's leader is being elected, so each
// attempt waits 5s at most and the next one sends the same message again
// (the id makes it one message).
func publish(t *testing.T, js jetstream.JetStream, data string) {
	t.Helper()
	deadline := time.Now().Add(clustertest.Patience)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := js.Publish(ctx, "r3.a", []byte(data), jetstream.WithMsgID("r3-"+data))
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("publish %s: %v", data, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func waitReady(t *testing.T, r *clustertest.Replica) {
	t.Helper()
	deadline := time.Now().Add(clustertest.Patience)
	for {
		resp, err := http.Get(r.HTTP + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not ready after %s", r.Name, clustertest.Patience)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestProvisionWaitsForQuorum: a broker started while the cluster has no
// quorum (two of three nodes down) keeps trying to provision, rather than
// exiting, and becomes ready once the nodes are back.
func TestProvisionWaitsForQuorum(t *testing.T) {
	c := clustertest.Start(t, clustertest.Config{})
	c.Node(1).Stop()
	c.Node(2).Stop()

	b, err := broker.New(c.Conn(t), broker.Config{Name: "early", Replicas: 3}, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- b.Run(ctx)
		close(done)
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("run: %v", err)
		}
	}()

	// Long enough for several provisioning attempts to time out.
	select {
	case err := <-done:
		t.Fatalf("the broker stopped while the cluster had no quorum: %v", err) // done is closed now
	case <-time.After(12 * time.Second):
	}
	rctx, rcancel := context.WithTimeout(context.Background(), clustertest.Patience)
	defer rcancel()
	for _, n := range []int{1, 2} {
		if err := c.Node(n).Restart(rctx); err != nil {
			t.Fatal(err)
		}
	}
	for !b.Ready() {
		select {
		case err := <-done:
			t.Fatalf("the broker stopped: %v", err)
		case <-rctx.Done():
			t.Fatal("the broker was not ready after the nodes came back")
		case <-time.After(50 * time.Millisecond):
		}
	}
}
