package broker

import (
	"strings"
	"testing"
	"time"

	"github.com/assent-dev/assent/internal/testenv"
	"github.com/assent-dev/assent/pkg/events"
	"github.com/assent-dev/assent/pkg/policy"
)

// TestColdRecords: replicas that keep at most two pending records whole
// (the rest cold, cold.go) judge every request as they would with all of
// them whole: a quorum counted across replicas, a cancel, an expiry whose
// decision carries the request's long args, and reads that show the whole
// request while it waits.
func TestColdRecords(t *testing.T) {
	ns := testenv.Server(t)
	p, err := policy.Parse([]byte(`version: 1
mode: manual
defaults:
  allow_self_approval: true
principals:
  alice: {roles: [finance]}
  bob: {roles: [finance]}
  mallory: {}
rules:
  - name: two
    tools: [pay]
    action: require_approval
    quorum: 2
    approvers: [alice, bob]
`), "cold.yaml")
	if err != nil {
		t.Fatal(err)
	}
	two := func(b *Broker) { b.ledger.maxFull = 2; b.SetPolicy(p) }
	a, ctx := runInternalLogged(t, testenv.Conn(t, ns), Config{Name: "a"}, testenv.Logger(t), two)
	b, _ := runInternalLogged(t, testenv.Conn(t, ns), Config{Name: "b"}, testenv.Logger(t), two)

	long := `{"note":"` + strings.Repeat("x", 3000) + `"}`
	pay := submit(ctx, t, a, events.Requested{Tool: "pay", Agent: "a1", Session: "s1", Hint: "Pay the invoice?", Args: []byte(`{"amount":12}`), Timeout: events.Duration(time.Minute)})
	stop := submit(ctx, t, a, events.Requested{Tool: "rm", Agent: "a1", Args: []byte(`{"path":"/tmp/x"}`), Timeout: events.Duration(time.Minute)})
	late := submit(ctx, t, a, events.Requested{Tool: "rm", Agent: "a2", Args: []byte(long), Timeout: events.Duration(2 * time.Second)})
	for range 4 { // pushes the three out of the two kept whole
		submit(ctx, t, a, events.Requested{Tool: "ls", Agent: "a3", Timeout: events.Duration(time.Minute)})
	}
	for _, r := range []*Broker{a, b} {
		if err := r.ledger.catchUp(ctx); err != nil {
			t.Fatal(err)
		}
		r.ledger.mu.Lock()
		full, thin := r.ledger.full, r.ledger.open[pay.ID].rec == nil
		r.ledger.mu.Unlock()
		if full > 2 || !thin {
			t.Fatalf("%s keeps %d records whole, the first request's among them: %v", r.cfg.Name, full, !thin)
		}
	}

	// Read while cold: the whole request, from the stream.
	got, err := b.Get(ctx, pay.ID)
	if err != nil || got.Request.Hint != "Pay the invoice?" || string(got.Request.Args) != `{"amount":12}` || got.Quorum != 2 || len(got.Approvers) != 2 {
		t.Fatalf("a cold pending request reads back as %+v (%v)", got, err)
	}
	page, err := b.List(ctx, Filter{Session: "s1"})
	if err != nil || len(page.Records) != 1 || page.Records[0].Request.Hint != "Pay the invoice?" {
		t.Fatalf("listing a cold pending request: %+v (%v)", page.Records, err)
	}

	// A quorum across replicas, each answer applied to a cold record.
	voted, err := b.Respond(ctx, "alice", pay.ID, events.Responded{Decision: events.Approve})
	if err != nil || voted.State != StatePending || len(voted.Votes) != 1 || voted.Request.Tool != "pay" {
		t.Fatalf("first approval: %v, %s with %d votes, tool %q", err, voted.State, len(voted.Votes), voted.Request.Tool)
	}
	for range 3 { // cold again
		submit(ctx, t, a, events.Requested{Tool: "ls", Agent: "a3", Timeout: events.Duration(time.Minute)})
	}
	if _, err := a.Respond(ctx, "mallory", pay.ID, events.Responded{Decision: events.Approve}); err == nil {
		t.Fatal("mallory, not an approver, was counted on a cold record")
	}
	final, err := a.Respond(ctx, "bob", pay.ID, events.Responded{Decision: events.Approve})
	if err != nil || final.State != StateApproved || len(final.Decision.DecidedBy) != 2 || string(final.Decision.Args) != `{"amount":12}` {
		t.Fatalf("second approval: %v, %s by %+v", err, final.State, final.Decision)
	}

	// A cancel of a cold request: decided with the request's args.
	cancelled, err := b.Cancel(ctx, stop.ID, "agent/a1", "not needed")
	if err != nil || cancelled.State != StateCancelled || cancelled.Decision == nil {
		t.Fatalf("cancel: %s (%v)", cancelled.State, err)
	}
	if want, _ := events.ArgsDigest([]byte(`{"path":"/tmp/x"}`)); cancelled.Decision.ArgsDigest != want {
		t.Fatalf("cancelled with args digest %s, want the request's %s", cancelled.Decision.ArgsDigest, want)
	}

	// An expiry of a cold request: its decision carries the request's
	// args, read back from the stream, on every replica.
	expired, err := a.Wait(ctx, late.ID)
	if err != nil || expired.State != StateExpired {
		t.Fatalf("expiry: %s (%v)", expired.State, err)
	}
	for _, r := range []*Broker{a, b} {
		rec, err := r.Get(ctx, late.ID)
		if err != nil || rec.State != StateExpired || string(rec.Decision.Args) != long || string(rec.Request.Args) != long || rec.Request.Agent != "a2" {
			t.Fatalf("%s reads the expired request as %s, args %d bytes, request %d bytes (%v)", r.cfg.Name, rec.State, len(rec.Decision.Args), len(rec.Request.Args), err)
		}
		if rec.Decision.ArgsDigest != expired.Decision.ArgsDigest || rec.DecisionEventID != expired.DecisionEventID {
			t.Fatalf("%s and a disagree on the decision: %s/%s", r.cfg.Name, rec.DecisionEventID, expired.DecisionEventID)
		}
	}
}
