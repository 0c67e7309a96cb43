package integration

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/assent-dev/assent/integration/itest"
	"github.com/assent-dev/assent/internal/broker"
	"github.com/assent-dev/assent/pkg/events"
	"github.com/assent-dev/assent/pkg/handler"
)

// countRecords counts the broker's records of agent.
func countRecords(t *testing.T, b *broker.Broker, agent string) int {
	t.Helper()
	ctx, cancel := itest.OpCtx()
	defer cancel()
	page, err := b.List(ctx, broker.Filter{Agent: agent, Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	if page.Total != len(page.Records) {
		t.Fatalf("listed %d of %d records", len(page.Records), page.Total)
	}
	return page.Total
}

// TestDuplicateRequestSDK: the same request id asked for by several SDK calls
// at once is one request with one decision that every caller gets; asking
// again after the decision (the same client, or a fresh one as after a crash)
// returns the original decision at once.
func TestDuplicateRequestSDK(t *testing.T) {
	e := itest.NewEnv(t, broker.Config{})
	const agent = "dup-sdk"
	client := itest.NewClient(t, e.NC, agent)
	id := events.NewID()
	req := handler.Request{ID: id, Requested: events.Requested{Tool: "rm", Args: json.RawMessage(`{"path":"/a"}`), Timeout: events.Duration(time.Minute)}}

	const callers = 8
	results := make([]<-chan itest.Result, callers)
	for i := range results {
		results[i] = itest.RequestAsync(t, itest.TestCtx(t, time.Minute), client, req)
	}
	itest.WaitState(t, e.B, id, broker.StatePending)
	itest.AnswerNATS(t, e.JS, "alice", id, events.Responded{Decision: events.Deny, Reason: "no"})
	var first events.Decided
	for i, ch := range results {
		r := itest.Await(t, ch)
		if r.Err != nil {
			t.Fatalf("caller %d: %v", i, r.Err)
		}
		if r.D.Outcome != events.Denied || r.D.Reason != "no" {
			t.Fatalf("caller %d got %+v", i, r.D)
		}
		if i == 0 {
			first = r.D
		}
		itest.SameDecision(t, first, r.D)
	}

	// Retries after the decision: sequentially, from the same client and from
	// a new one, each with a Timeout far beyond the test's patience, so only
	// the stored decision can answer them in time.
	for i, c := range []*handler.Client{client, itest.NewClient(t, e.NC, agent), client} {
		ctx, cancel := context.WithTimeout(context.Background(), itest.Patience)
		d, err := c.Request(ctx, req)
		cancel()
		if err != nil {
			t.Fatalf("retry %d: %v", i, err)
		}
		itest.SameDecision(t, first, d)
	}
	// The retries leave the record as it was.
	rec := itest.WaitState(t, e.B, id, broker.StateDenied)
	if !rec.Decision.DecidedAt.Equal(first.DecidedAt) {
		t.Fatalf("record %+v", rec.Decision)
	}
	itest.WaitBrokerIdle(t, e.JS)
	if n := countRecords(t, e.B, agent); n != 1 {
		t.Fatalf("%d records for agent %s, want 1", n, agent)
	}
	if n := itest.CountDecisions(t, e.JS, id); n != 1 {
		t.Fatalf("%d decided messages, want 1", n)
	}
}

// TestDuplicateRequestRawNATS publishes the same request twice straight to
// NATS, with and without Nats-Msg-Id, once with different contents after the
// first is stored, and again after the decision: one request, one decision,
// the first contents.
func TestDuplicateRequestRawNATS(t *testing.T) {
	e := itest.NewEnv(t, broker.Config{})
	for _, withMsgID := range []bool{true, false} {
		name := "without-msg-id"
		if withMsgID {
			name = "with-msg-id"
		}
		t.Run(name, func(t *testing.T) {
			agent := "dup-raw-" + name
			subj, err := events.RequestSubject(agent)
			if err != nil {
				t.Fatal(err)
			}
			id := events.NewID()
			msgID := ""
			if withMsgID {
				msgID = id
			}
			body := itest.RawEvent(id, events.TypeRequested, "agent/"+agent, `{"tool":"rm","args":{"path":"/first"},"timeout":"1m"}`)
			itest.MustPublish(t, e.JS, subj, body, msgID)
			itest.MustPublish(t, e.JS, subj, body, msgID)
			// Same id, different contents, once the first is stored: still
			// the first request. (Published together without Nats-Msg-Id,
			// the broker's workers race and the one stored first wins.)
			rec := itest.WaitState(t, e.B, id, broker.StatePending)
			itest.MustPublish(t, e.JS, subj, itest.RawEvent(id, events.TypeRequested, "agent/"+agent, `{"tool":"format_disk","args":{"disk":"/dev/sda"},"timeout":"1h"}`), msgID)
			itest.WaitIdle(t, e.JS, false, "assent-broker-requests")
			rec2 := itest.WaitState(t, e.B, id, broker.StatePending)
			if rec2.Request.Tool != "rm" || !itest.SameJSON(rec2.Request.Args, json.RawMessage(`{"path":"/first"}`)) || !rec2.Deadline.Equal(rec.Deadline) || rec2.Revision() != rec.Revision() {
				t.Fatalf("after duplicates the record is %+v, first read %+v", rec2, rec)
			}

			itest.AnswerNATS(t, e.JS, "alice", id, events.Responded{Decision: events.Approve})
			d := itest.WaitDecision(t, e.JS, id)
			if d.Outcome != events.Approved || !itest.SameJSON(d.Args, json.RawMessage(`{"path":"/first"}`)) {
				t.Fatalf("decision %+v", d)
			}
			// Published again after the decision: nothing changes.
			itest.MustPublish(t, e.JS, subj, body, msgID)
			itest.MustPublish(t, e.JS, subj, body, "")
			itest.WaitBrokerIdle(t, e.JS)
			final := itest.WaitState(t, e.B, id, broker.StateApproved)
			if !final.Decision.DecidedAt.Equal(d.DecidedAt) {
				t.Fatalf("decision changed: %+v then %+v", d, final.Decision)
			}
			if n := countRecords(t, e.B, agent); n != 1 {
				t.Fatalf("%d records for agent %s, want 1", n, agent)
			}
			if n := itest.CountDecisions(t, e.JS, id); n != 1 {
				t.Fatalf("%d decided messages, want 1", n)
			}
		})
	}
}

// TestDuplicateRequestConcurrentRaw fires the same request id from many
// publishers at once, without Nats-Msg-Id, so every copy reaches the broker's
// workers together.
func TestDuplicateRequestConcurrentRaw(t *testing.T) {
	e := itest.NewEnv(t, broker.Config{})
	const agent = "dup-storm"
	subj, _ := events.RequestSubject(agent)
	id := events.NewID()
	body := itest.RawEvent(id, events.TypeRequested, "agent/"+agent, `{"tool":"rm","args":{"n":1},"timeout":"1m"}`)
	var wg sync.WaitGroup
	errs := make(chan error, 32)
	for range 32 {
		wg.Go(func() {
			ctx, cancel := itest.OpCtx()
			defer cancel()
			if err := itest.PublishCtx(ctx, e.JS, subj, body); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("publish: %v", err)
	}
	itest.WaitState(t, e.B, id, broker.StatePending)
	rec, err := e.B.Respond(itest.TestCtx(t, itest.Patience), "alice", id, events.Responded{Decision: events.Approve})
	if err != nil {
		t.Fatal(err)
	}
	itest.WaitBrokerIdle(t, e.JS)
	final := itest.WaitState(t, e.B, id, broker.StateApproved)
	if !final.Decision.DecidedAt.Equal(rec.Decision.DecidedAt) {
		t.Fatalf("decision changed: %+v then %+v", rec.Decision, final.Decision)
	}
	if n := itest.CountDecisions(t, e.JS, id); n != 1 {
		t.Fatalf("%d decided messages, want 1", n)
	}
	if n := countRecords(t, e.B, agent); n != 1 {
		t.Fatalf("%d records, want 1", n)
	}
}
