package broker

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/assent-dev/assent/internal/testenv"
	"github.com/assent-dev/assent/pkg/events"
)

// TestRequestsBeyondTheRawBound: a replica keeps the request messages of at
// most maxRaw requests being judged; those beyond are read from the stream
// when needed. With none kept: a decision made at once lists with its agent
// and session and reads back whole, and a cancel stored before its request
// waits for anyone decides it with the request's own args.
func TestRequestsBeyondTheRawBound(t *testing.T) {
	ns := testenv.Server(t)
	nc := testenv.Conn(t, ns)
	none := func(b *Broker) { b.ledger.maxRaw = 0 }
	a, ctx := runInternalLogged(t, nc, Config{Name: "a", Mode: ModeAutoApprove}, testenv.Logger(t), none)
	b, _ := runInternalLogged(t, testenv.Conn(t, ns), Config{Name: "b", Mode: ModeAutoApprove}, testenv.Logger(t), none)

	rec := submit(ctx, t, a, events.Requested{Agent: "a", Session: "s1", Tool: "ls", Args: []byte(`{"dir":"/srv"}`)})
	if rec.State != StateApproved {
		t.Fatalf("state %s", rec.State)
	}
	// b did not decide it, and kept no part of the request but its agent and
	// session: the listing finds it by session, and reads the rest.
	if _, err := b.Get(ctx, rec.ID); err != nil {
		t.Fatal(err)
	}
	page, err := b.List(ctx, Filter{Session: "s1"})
	if err != nil || len(page.Records) != 1 || page.Records[0].Request.Agent != "a" || string(page.Records[0].Request.Args) != `{"dir":"/srv"}` {
		t.Fatalf("listing by session: %+v (%v)", page.Records, err)
	}

	// A cancel published right behind its request, racing its judgment:
	// whichever decides, the decision carries the request's own args.
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	id := events.NewID()
	req := events.Requested{Agent: "a", Tool: "rm", Args: []byte(`{"path":"/tmp/x"}`), Timeout: events.Duration(time.Minute)}
	re, err := events.New(events.TypeRequested, id, "agent/a", req)
	if err != nil {
		t.Fatal(err)
	}
	ce, err := events.New(events.TypeCancel, "", "agent/a", events.Cancel{Reason: "stop"})
	if err != nil {
		t.Fatal(err)
	}
	for subj, e := range map[string]*events.Event{events.RequestPrefix + "a": &re, events.CancelPrefix + id: &ce} {
		h, body, err := events.Encode(e)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := js.PublishMsg(ctx, &nats.Msg{Subject: subj, Header: nats.Header(h), Data: body}); err != nil {
			t.Fatal(err)
		}
	}
	got, err := a.Wait(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := events.ArgsDigest(req.Args)
	if got.Decision == nil || got.Decision.ArgsDigest != want {
		t.Fatalf("decided %s with args digest %s, want the request's %s", got.State, got.Decision.ArgsDigest, want)
	}
}
