package broker

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

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
	for range 2 { // kept whole: the three after them are not
		submit(ctx, t, a, events.Requested{Tool: "ls", Agent: "a3", Timeout: events.Duration(time.Minute)})
	}
	pay := submit(ctx, t, a, events.Requested{Tool: "pay", Agent: "a1", Session: "s1", Hint: "Pay the invoice?", Args: []byte(`{"amount":12}`), Timeout: events.Duration(time.Minute)})
	stop := submit(ctx, t, a, events.Requested{Tool: "rm", Agent: "a1", Args: []byte(`{"path":"/tmp/x"}`), Timeout: events.Duration(time.Minute)})
	late := submit(ctx, t, a, events.Requested{Tool: "rm", Agent: "a2", Args: []byte(long), Timeout: events.Duration(2 * time.Second)})
	short := submit(ctx, t, a, events.Requested{Tool: "rm", Agent: "a2", Args: []byte(`{"path":"/tmp/y"}`), Timeout: events.Duration(2 * time.Second)})
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
	for _, r := range []*Broker{a, b} { // whole since the answer: cold again
		if err := r.ledger.catchUp(ctx); err != nil {
			t.Fatal(err)
		}
		r.ledger.mu.Lock()
		if en := r.ledger.open[pay.ID]; en.rec != nil {
			r.ledger.cool(en)
		}
		r.ledger.mu.Unlock()
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

	// Expiries of cold requests: their decisions carry the request's args,
	// kept when short and read back from the stream when long, on every
	// replica.
	for _, c := range []struct{ id, args string }{{late.ID, long}, {short.ID, `{"path":"/tmp/y"}`}} {
		expired, err := a.Wait(ctx, c.id)
		if err != nil || expired.State != StateExpired {
			t.Fatalf("expiry: %s (%v)", expired.State, err)
		}
		for _, r := range []*Broker{a, b} {
			rec, err := r.Get(ctx, c.id)
			if err != nil || rec.State != StateExpired || string(rec.Decision.Args) != c.args || string(rec.Request.Args) != c.args || rec.Request.Agent != "a2" || rec.Request.Tool != "rm" {
				t.Fatalf("%s reads the expired request as %s, args %d bytes, request %d bytes (%v)", r.cfg.Name, rec.State, len(rec.Decision.Args), len(rec.Request.Args), err)
			}
			if rec.Decision.ArgsDigest != expired.Decision.ArgsDigest || rec.DecisionEventID != expired.DecisionEventID {
				t.Fatalf("%s and a disagree on the decision: %s/%s", r.cfg.Name, rec.DecisionEventID, expired.DecisionEventID)
			}
		}
	}
}

// TestReadAnnounced: the one-pass read of a pending event that a cold
// request starts from says what decoding the whole event says, and leaves
// an escalation or a broken event to that decoding.
func TestReadAnnounced(t *testing.T) {
	at := time.Date(2026, 11, 26, 12, 0, 0, 123456789, time.UTC)
	var err error
	p := events.Pending{
		RequestID:    events.NewID(),
		Request:      events.Requested{Tool: "pay", Agent: "a1", Session: "s1", Args: []byte(`{"amount":12,"request":{"agent":"x"}}`), Labels: map[string]string{"rule": "x"}},
		Deadline:     at.Add(time.Hour),
		BaseDeadline: at.Add(30 * time.Minute),
		ReceivedAt:   at,
		Rule:         "limit:spend",
		ApprovalRule: "two",
		Limit:        "spend",
		RequestSeq:   42,
		Approvers:    []string{"alice"},
	}
	if p.RequestDigest, err = events.RequestDigest(p.Request); err != nil {
		t.Fatal(err)
	}
	e, err := events.New(events.TypePending, "", "broker/a", p)
	if err != nil {
		t.Fatal(err)
	}
	h, body, err := events.Encode(&e)
	if err != nil {
		t.Fatal(err)
	}
	a, ok := readAnnounced(nats.Header(h), body)
	if !ok {
		t.Fatal("a pending event not read")
	}
	want := announced{id: []byte(p.RequestID), agent: []byte("a1"), session: "s1", rule: "limit:spend", approvalRule: "two", limit: "spend",
		deadline: p.Deadline, base: p.BaseDeadline, receivedAt: at, requestSeq: 42, args: p.Request.Args, digest: []byte(p.RequestDigest)}
	if !reflect.DeepEqual(a, want) {
		t.Fatalf("read %+v, want %+v", a, want)
	}
	full := pendingRecord(&e, p)
	if full.Rule != a.approvalRule || !full.Deadline.Equal(a.deadline) || !full.BaseDeadline.Equal(a.base) || full.Limit != a.limit {
		t.Fatalf("the whole decoding makes %+v", full)
	}

	esc, err := events.New(events.TypeEscalated, "", "broker/a", events.Escalated{RequestID: p.RequestID, Level: 1, Deadline: at})
	if err != nil {
		t.Fatal(err)
	}
	h, body, err = events.Encode(&esc)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := readAnnounced(nats.Header(h), body); ok {
		t.Fatal("an escalation read as an announcement")
	}
	for _, broken := range [][]byte{body[:len(body)/2], []byte(`{"type":"dev.assent.approval.pending","data":{"request_id":"r\"1","deadline":"2026-11-26T12:00:00Z","request_digest":"sha256:00"}}`), []byte(`{"type":"dev.assent.approval.pending","data":{"request_id":"r1","deadline":"soon"}}`)} {
		if a, ok := readAnnounced(nats.Header(h), broken); ok {
			t.Fatalf("%s read as %+v", broken, a)
		}
	}
}

// TestRequestFacts: the one pass over a stored request finds the id eventID
// finds, its source and its request's session, in either encoding.
func TestRequestFacts(t *testing.T) {
	e, err := events.New(events.TypeRequested, "", "agent/a1", events.Requested{Tool: "t", Agent: "a1", Session: "s\u00e9", Args: []byte(`{"id":"not this","session":"nor this"}`)})
	if err != nil {
		t.Fatal(err)
	}
	h, body, err := events.Encode(&e)
	if err != nil {
		t.Fatal(err)
	}
	bin := nats.Header{"ce-id": {"b-1"}, "ce-source": {"agent/b"}}
	for _, c := range []struct {
		name                string
		h                   nats.Header
		body                []byte
		id, session, source string
	}{
		{"structured", nats.Header(h), body, e.ID(), "s\u00e9", "agent/a1"},
		{"binary", bin, []byte(`{"tool":"t","session":"s2"}`), "b-1", "s2", "agent/b"},
		{"numeric id", nats.Header(h), []byte(`{"id":12,"source":"agent/x","data":{}}`), "12", "", "agent/x"},
		{"first id", nats.Header(h), []byte(`{"id":"one","id":"two"}`), "one", "", ""},
	} {
		id, session, source := requestFacts(c.h, c.body)
		if id != c.id || session != c.session || source != c.source || id != eventID(c.h, c.body) {
			t.Errorf("%s: %q %q %q, want %q %q %q (eventID %q)", c.name, id, session, source, c.id, c.session, c.source, eventID(c.h, c.body))
		}
	}
}
