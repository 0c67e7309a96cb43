package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/assent-dev/assent/integration/itest"
	"github.com/assent-dev/assent/internal/broker"
	"github.com/assent-dev/assent/internal/testenv"
	"github.com/assent-dev/assent/pkg/events"
)

// TestDecisionPublishedOnceOnTheWire: "exactly one decided event per request,
// ever" holds for readers of assent-decided.<id>, where the stream republishes
// what it stores (the SDK's Client.Request and any non-Go agent listen
// there), not only for the stream. Late answers, duplicate requests and fired
// timers must not broadcast the decision again. A plain subscriber of
// assent.decision.<id> (older SDKs) also gets the publishes the stream
// refused: the HTTP answer and the responses consumer both publish the
// decision (docs/stream-decides.md, "The same message handled twice"), so it
// may see it twice, but every message there must be the stored decision,
// byte for byte.
func TestDecisionPublishedOnceOnTheWire(t *testing.T) {
	e := itest.NewEnv(t, broker.Config{})
	rec, err := e.B.Submit(itest.TestCtx(t, itest.Patience), "", "agent/wire", events.Requested{Tool: "rm", Agent: "wire", Timeout: events.Duration(time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	subj, _ := events.DecisionSubject(rec.ID)
	var mu sync.Mutex
	var plain, republished []*nats.Msg
	for _, s := range []struct {
		subject string
		into    *[]*nats.Msg
	}{{subj, &plain}, {events.DecidedPrefix + rec.ID, &republished}} {
		sub, err := e.NC.Subscribe(s.subject, func(m *nats.Msg) {
			mu.Lock()
			defer mu.Unlock()
			*s.into = append(*s.into, m)
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = sub.Unsubscribe() })
	}
	if err := e.NC.Flush(); err != nil {
		t.Fatal(err)
	}

	itest.ApprovalOf(t, itest.Call(t, http.MethodPost, e.API+"/v1/approvals/"+rec.ID+"/decision", itest.DecisionBody{Principal: "alice", Responded: events.Responded{Decision: events.Approve}}), http.StatusOK)
	itest.WaitDecision(t, e.JS, rec.ID)
	// Five late answers over HTTP, five over NATS, and the request again.
	for range 5 {
		itest.WantError(t, itest.Call(t, http.MethodPost, e.API+"/v1/approvals/"+rec.ID+"/decision", itest.DecisionBody{Principal: "bob", Responded: events.Responded{Decision: events.Deny}}), http.StatusConflict, "already_decided")
		itest.AnswerNATS(t, e.JS, "carol", rec.ID, events.Responded{Decision: events.Deny})
	}
	reqSubj, _ := events.RequestSubject("wire")
	itest.MustPublish(t, e.JS, reqSubj, itest.RawEvent(rec.ID, events.TypeRequested, "agent/wire", `{"tool":"rm"}`), "")
	itest.WaitBrokerIdle(t, e.JS)
	if err := e.NC.Flush(); err != nil {
		t.Fatal(err)
	}
	if n := itest.CountDecisions(t, e.JS, rec.ID); n != 1 {
		t.Fatalf("the stream holds %d decided messages, want 1", n)
	}
	ctx, cancel := itest.OpCtx()
	defer cancel()
	stored, err := itest.StreamOf(t, e.JS).GetMsg(ctx, 1, jetstream.WithGetMsgSubject(subj))
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(republished) != 1 {
		t.Fatalf("a NATS subscriber of %s%s received %d decided events for one decision, want 1", events.DecidedPrefix, rec.ID, len(republished))
	}
	if last := republished[0].Header.Get(events.LastSequenceHeader); last != "0" || !bytes.Equal(republished[0].Data, stored.Data) {
		t.Errorf("the republished decision (%s %s) is not the one stored first:\n%s\nstored:\n%s", events.LastSequenceHeader, last, republished[0].Data, stored.Data)
	}
	t.Logf("a plain subscriber of %s received %d decided events for one decision", subj, len(plain))
	for i, m := range plain {
		if !bytes.Equal(m.Data, stored.Data) {
			t.Errorf("a plain subscriber of %s received, as message %d, a decision that is not the one stored:\n%s\nstored:\n%s", subj, i+1, m.Data, stored.Data)
		}
	}
}

// TestHTTPAnswerToMalformedID: an id that cannot exist is "not found" for
// every route, as GET already says (404 not_found), not an internal error.
func TestHTTPAnswerToMalformedID(t *testing.T) {
	e := itest.NewEnv(t, broker.Config{})
	for _, id := range []string{"no such id", "a*b", "a>b"} {
		base := e.API + "/v1/approvals/" + url.PathEscape(id)
		itest.WantError(t, itest.Call(t, http.MethodGet, base, nil), http.StatusNotFound, "not_found")
		itest.WantError(t, itest.Call(t, http.MethodPost, base+"/decision", itest.DecisionBody{Principal: "alice", Responded: events.Responded{Decision: events.Approve}}), http.StatusNotFound, "not_found")
		itest.WantError(t, itest.Call(t, http.MethodPost, base+"/cancel", nil), http.StatusNotFound, "not_found")
	}
}

// TestHTTPCreateJustUnderBodyLimit: a body the gateway accepts (under its
// 1 MiB limit) becomes an event a little over the broker's 1 MiB event limit,
// which the request consumer terminates without storing anything. The POST must
// get a prompt 4xx, not hang until the client gives up.
func TestHTTPCreateJustUnderBodyLimit(t *testing.T) {
	e := itest.NewEnv(t, broker.Config{})
	prefix, suffix := `{"agent":"big","tool":"rm","args":{"blob":"`, `"}}`
	body := prefix + strings.Repeat("x", events.DefaultMaxEventSize-len(prefix)-len(suffix)-16) + suffix
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := itest.DoHTTP(ctx, http.MethodPost, e.API+"/v1/approvals", body)
	if errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("POST /v1/approvals with a %d-byte body (under the %d-byte limit) got no answer in 10s", len(body), events.DefaultMaxEventSize)
	}
	if err != nil {
		t.Fatal(err)
	}
	if r.Status == http.StatusCreated {
		return // stored after all: fine
	}
	if r.Status != http.StatusRequestEntityTooLarge && r.Status != http.StatusBadRequest {
		t.Fatalf("status %d: %s", r.Status, r.Body)
	}
}

// TestLongPollSeesEveryDecision: GET /v1/approvals/{id}?wait= returns as soon
// as the request is decided. Many long polls are open while their requests
// are decided at once; none may sit out its whole wait and report "pending"
// for a request that was decided at the start of it. (Broker.Wait wakes on the
// KV update's core NATS message and then re-reads the entry; the read can
// still return the previous revision, and no further wake-up comes.)
func TestLongPollSeesEveryDecision(t *testing.T) {
	e := itest.NewEnv(t, broker.Config{})
	const n, rounds = 200, 3
	for round := range rounds {
		ids := make([]string, n)
		var wg sync.WaitGroup
		for i := range ids {
			wg.Go(func() {
				ctx, cancel := itest.OpCtx()
				defer cancel()
				rec, err := e.B.Submit(ctx, "", "agent/poller", events.Requested{Tool: "rm", Agent: "poller", Timeout: events.Duration(time.Minute)})
				if err != nil {
					t.Error(err)
				}
				ids[i] = rec.ID
			})
		}
		wg.Wait()
		if t.Failed() {
			t.FailNow()
		}
		states := make([]broker.State, n)
		// When each poll returned and each answer was applied: a poll
		// misses only if it returned "pending" well after its request was
		// decided (on two busy cores the answers can take longer than a
		// poll's wait, and such a poll rightly says "pending").
		returned, decided := make([]time.Time, n), make([]time.Time, n)
		var polls sync.WaitGroup
		for i, id := range ids {
			polls.Go(func() {
				defer func() { returned[i] = time.Now() }()
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				r, err := itest.DoHTTP(ctx, http.MethodGet, e.API+"/v1/approvals/"+id+"?wait=5s", nil)
				if err != nil || r.Status != http.StatusOK {
					t.Errorf("GET %s: %v %d %s", id, err, r.Status, r.Body)
					return
				}
				var a struct{ State broker.State }
				if err := json.Unmarshal(r.Body, &a); err != nil {
					t.Error(err)
				}
				states[i] = a.State
			})
		}
		// Give the polls a moment to start waiting; answered either way.
		time.Sleep(200 * time.Millisecond)
		for i, id := range ids {
			wg.Go(func() {
				ctx, cancel := itest.OpCtx()
				defer cancel()
				if _, err := e.B.Respond(ctx, "alice", id, events.Responded{Decision: events.Approve}); err != nil {
					t.Error(err)
				}
				decided[i] = time.Now()
			})
		}
		wg.Wait()
		polls.Wait()
		missed := 0
		for i, st := range states {
			if st == broker.StatePending && returned[i].Sub(decided[i]) > time.Second {
				missed++
				if rec, err := e.B.Get(itest.TestCtx(t, itest.Patience), ids[i]); err != nil || rec.State != broker.StateApproved {
					t.Fatalf("request %s: %+v, %v", ids[i], rec, err)
				}
			}
		}
		if missed > 0 {
			t.Fatalf("round %d: %d of %d long polls (?wait=5s) returned \"pending\" after the full wait, although their requests were approved at its start", round, missed, n)
		}
	}
}

// TestBrokerRunReturnsNilOnShutdown: Run returns nil when its context ends
// (STYLE: a clean stop is not an error; app.Run and every test helper treat a
// non-nil result as a failure). Started and stopped many times, because the
// outcome depends on goroutine scheduling: the state watcher is created with
// Run's context, so on shutdown its Updates channel closes at about the same
// moment the errgroup's context ends, and the loop that reads it reports
// "state watcher stopped" whenever it sees the closed channel first.
func TestBrokerRunReturnsNilOnShutdown(t *testing.T) {
	ns := testenv.Server(t)
	nc := testenv.Conn(t, ns)
	for cycle := range 80 {
		b, err := broker.New(nc, broker.Config{Name: "cycler"}, nil)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- b.Run(ctx) }()
		itest.Eventually(t, itest.Patience, func() (bool, string) { return b.Ready(), "broker not ready" })
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("cycle %d: Run returned %q after its context was cancelled, want nil", cycle, err)
			}
		case <-time.After(itest.Patience):
			t.Fatalf("cycle %d: Run did not return after its context was cancelled", cycle)
		}
	}
}
