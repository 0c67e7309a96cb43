package insights_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/assent-dev/assent/internal/insights"
	"github.com/assent-dev/assent/internal/testenv"
	"github.com/assent-dev/assent/pkg/events"
)

// publish stores an automatic decision of a new request of tool on js.
func publishAuto(t *testing.T, ctx context.Context, js jetstream.JetStream, n int, tool string) {
	t.Helper()
	for i := range n {
		id := events.NewID()
		put := func(subject, typ, eventID string, data any) {
			e, err := events.New(typ, eventID, "test/follow", data)
			if err != nil {
				t.Fatal(err)
			}
			h, body, err := events.Encode(&e)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := js.PublishMsg(ctx, &nats.Msg{Subject: subject, Header: nats.Header(h), Data: body}); err != nil {
				t.Fatalf("publish %d: %v", i, err)
			}
		}
		put(events.RequestPrefix+"a", events.TypeRequested, id, events.Requested{Tool: tool, Agent: "a"})
		put("assent.tick.due", "dev.assent.other", "", map[string]string{}) // read and left out
		put(events.DecisionPrefix+id, events.TypeDecided, "", events.Decided{RequestID: id, Outcome: events.Approved, Auto: true, Rule: "r", DecidedAt: time.Now()})
	}
}

// waitFor polls cond until it holds, failing the test after a while.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not after 30s", what)
		}
	}
}

// TestFollow: a follower reads what the stream held when it started,
// catches up, reads on as it grows, goes on after the server restarts, and
// leaves no consumer behind when it stops.
func TestFollow(t *testing.T) {
	ns := testenv.Server(t)
	nc := testenv.Conn(t, ns)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	stream, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: events.StreamName, Subjects: []string{events.AllSubjects}, Storage: jetstream.FileStorage})
	if err != nil {
		t.Fatal(err)
	}
	publishAuto(t, ctx, js, 200, "before")
	agg, err := insights.New(insights.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if rep := agg.Query(insights.Filter{}, time.Now()); rep.Complete || rep.Progress != 0 {
		t.Fatalf("complete %v, progress %v before reading", rep.Complete, rep.Progress)
	}
	fctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- insights.Follow(fctx, js, events.StreamName, agg, zap.NewNop()) }()
	defer func() {
		stop()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Follow: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Error("Follow did not return after its context ended")
		}
	}()
	count := func(tool string) int {
		return agg.Query(insights.Filter{Tool: tool}, time.Now()).Totals.AutoApproved
	}
	waitFor(t, "caught up", agg.CaughtUp)
	if n, rep := count("before"), agg.Query(insights.Filter{}, time.Now()); n != 200 || !rep.Complete || rep.Progress != 1 || rep.Through != 600 {
		t.Fatalf("caught up with %d of 200 decisions: %+v", n, rep)
	}
	publishAuto(t, ctx, js, 50, "after")
	waitFor(t, "the new decisions", func() bool { return count("after") == 50 })

	ns = ns.Restart(t)
	waitFor(t, "reconnected", nc.IsConnected)
	publishAuto(t, ctx, js, 50, "restarted")
	waitFor(t, "the decisions after the restart", func() bool { return count("restarted") == 50 })
	if n := count("before") + count("after"); n != 250 {
		t.Fatalf("%d decisions from before the restart, want 250: read twice or lost", n)
	}

	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	done <- nil // for the deferred stop
	for info := range stream.ListConsumers(ctx).Info() {
		if len(info.Name) >= len(insights.ConsumerPrefix) && info.Name[:len(insights.ConsumerPrefix)] == insights.ConsumerPrefix {
			t.Fatalf("consumer %s left after the follower stopped", info.Name)
		}
	}
}
