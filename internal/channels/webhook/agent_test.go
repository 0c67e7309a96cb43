package webhook

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/assent-dev/assent/internal/broker"
	"github.com/assent-dev/assent/internal/brokertest"
	"github.com/assent-dev/assent/internal/testenv"
	"github.com/assent-dev/assent/pkg/events"
)

// TestAgentOfRequestDecidedAtOnce: an endpoint that filters by agent finds the
// agent of a request it never saw asked, also one the broker decided as it
// first saw it. An unknown id has no agent.
func TestAgentOfRequestDecidedAtOnce(t *testing.T) {
	ns := testenv.Server(t)
	nc := testenv.Conn(t, ns)
	b, _ := brokertest.Run(t, nc, broker.Config{Mode: broker.ModeAutoApprove})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rec, err := b.Submit(ctx, "", "agent/coder", events.Requested{Agent: "coder", Tool: "write_file"})
	if err != nil || rec.State != broker.StateApproved {
		t.Fatalf("%s %v", rec.State, err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	c := newAgentCache()
	if agent, err := c.get(ctx, js, rec.ID); err != nil || agent != "coder" {
		t.Fatalf("agent of %s: %q, %v; want coder", rec.ID, agent, err)
	}
	if agent, err := c.get(ctx, js, events.NewID()); err != nil || agent != "" {
		t.Fatalf("agent of an unknown id: %q, %v; want none", agent, err)
	}
}
