package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/assent-dev/assent/integration/itest"
	"github.com/assent-dev/assent/internal/broker"
	"github.com/assent-dev/assent/pkg/events"
	"github.com/assent-dev/assent/pkg/handler"
)

// racerResult is what one racing approver saw.
type racerResult struct {
	principal string
	verdict   events.Verdict
	viaHTTP   bool
	status    int    // HTTP only
	code      string // HTTP error code, if any
	err       error
}

// TestRacingApprovers lets 50 approvers answer one request at the same moment,
// half over NATS and half over HTTP, approving and denying: exactly one
// decided event; every HTTP loser gets 409 already_decided; the winner is the
// one named in decided_by, with its verdict. Several rounds, to vary who wins.
func TestRacingApprovers(t *testing.T) {
	e := itest.NewEnv(t, broker.Config{})
	const agent, racers = "contested", 50
	client := itest.NewClient(t, e.NC, agent)
	for round := range 3 {
		t.Run(fmt.Sprintf("round-%d", round), func(t *testing.T) {
			id := events.NewID()
			res := itest.RequestAsync(t, itest.TestCtx(t, time.Minute), client, handler.Request{ID: id, Requested: events.Requested{
				Tool: "transfer", Args: json.RawMessage(`{"amount":100}`), Timeout: events.Duration(time.Minute),
			}})
			itest.WaitState(t, e.B, id, broker.StatePending)

			start := make(chan struct{})
			results := make([]racerResult, racers)
			var wg sync.WaitGroup
			for i := range racers {
				r := &results[i]
				r.viaHTTP = i%2 == 1
				r.verdict = events.Approve
				if i%4 >= 2 {
					r.verdict = events.Deny
				}
				r.principal = fmt.Sprintf("nats-%02d", i)
				if r.viaHTTP {
					r.principal = fmt.Sprintf("http-%02d", i)
				}
				wg.Go(func() {
					<-start
					ctx, cancel := itest.OpCtx()
					defer cancel()
					resp := events.Responded{Decision: r.verdict, Reason: "by " + r.principal}
					if !r.viaHTTP {
						r.err = handler.Answer(ctx, e.JS, r.principal, id, resp)
						return
					}
					r.status, r.code, r.err = postDecision(ctx, e.API, id, r.principal, resp)
				})
			}
			close(start)
			wg.Wait()

			var httpWinner *racerResult
			byPrincipal := map[string]*racerResult{}
			for i := range results {
				r := &results[i]
				byPrincipal[r.principal] = r
				if r.err != nil {
					t.Fatalf("%s: %v", r.principal, r.err)
				}
				if !r.viaHTTP {
					continue
				}
				switch {
				case r.status == http.StatusOK:
					if httpWinner != nil {
						t.Fatalf("two HTTP answers won: %s and %s", httpWinner.principal, r.principal)
					}
					httpWinner = r
				case r.status != http.StatusConflict || r.code != "already_decided":
					t.Fatalf("%s lost with %d %q, want 409 already_decided", r.principal, r.status, r.code)
				}
			}

			d := itest.WaitDecision(t, e.JS, id)
			if len(d.DecidedBy) != 1 {
				t.Fatalf("decided_by %+v, want one principal", d.DecidedBy)
			}
			winner := byPrincipal[d.DecidedBy[0].Principal]
			if winner == nil {
				t.Fatalf("decided_by %+v names no racer", d.DecidedBy)
			}
			if httpWinner != nil && winner != httpWinner {
				t.Fatalf("HTTP told %s it won, decided_by names %s", httpWinner.principal, winner.principal)
			}
			if httpWinner == nil && winner.viaHTTP {
				t.Fatalf("decided_by names %s, but every HTTP answer lost", winner.principal)
			}
			wantOutcome := events.Denied
			if winner.verdict == events.Approve {
				wantOutcome = events.Approved
			}
			if d.Outcome != wantOutcome || d.Reason != "by "+winner.principal || d.DecidedBy[0].Decision != winner.verdict {
				t.Fatalf("decision %+v does not match the winner's answer %+v", d, winner)
			}
			t.Logf("won by %s (%s)", winner.principal, winner.verdict)

			r := itest.Await(t, res)
			if r.Err != nil {
				t.Fatal(r.Err)
			}
			itest.SameDecision(t, d, r.D)
			itest.WaitBrokerIdle(t, e.JS)
			if n := itest.CountDecisions(t, e.JS, id); n != 1 {
				t.Fatalf("%d decided messages, want 1", n)
			}
			if rec := itest.WaitState(t, e.B, id, broker.State(d.Outcome)); !rec.Decision.DecidedAt.Equal(d.DecidedAt) {
				t.Fatalf("record %+v, stream %+v", rec.Decision, d)
			}
		})
	}
}

// postDecision posts an answer over HTTP from a goroutine that is not the
// test's, returning the status and the error code, if any.
func postDecision(ctx context.Context, api, id, principal string, r events.Responded) (int, string, error) {
	resp, err := itest.DoHTTP(ctx, http.MethodPost, api+"/v1/approvals/"+id+"/decision", itest.DecisionBody{Principal: principal, Responded: r})
	if err != nil || resp.Status == http.StatusOK {
		return resp.Status, "", err
	}
	var e struct {
		Error struct{ Code, Message string } `json:"error"`
	}
	if err := json.Unmarshal(resp.Body, &e); err != nil || e.Error.Code == "" || e.Error.Message == "" {
		return resp.Status, "", fmt.Errorf("status %d with a body not in the error shape: %s", resp.Status, strings.TrimSpace(string(resp.Body)))
	}
	return resp.Status, e.Error.Code, nil
}

// TestLateAnswer answers a request after it expired: HTTP says 410 expired
// (for a decision and for a cancel); a NATS answer changes nothing.
func TestLateAnswer(t *testing.T) {
	e := itest.NewEnv(t, broker.Config{})
	client := itest.NewClient(t, e.NC, "slowpoke")
	id := events.NewID()
	r := itest.Await(t, itest.RequestAsync(t, itest.TestCtx(t, time.Minute), client, handler.Request{ID: id, Requested: events.Requested{
		Tool: "rm", Timeout: events.Duration(time.Second),
	}}))
	if r.Err != nil || r.D.Outcome != events.Expired {
		t.Fatalf("Request: %+v, %v; want expired", r.D, r.Err)
	}
	url := e.API + "/v1/approvals/" + id
	for _, v := range []events.Verdict{events.Approve, events.Deny} {
		itest.WantError(t, itest.Call(t, http.MethodPost, url+"/decision", itest.DecisionBody{Principal: "alice", Responded: events.Responded{Decision: v}}), http.StatusGone, "expired")
	}
	itest.WantError(t, itest.Call(t, http.MethodPost, url+"/cancel", map[string]string{"reason": "too late"}), http.StatusGone, "expired")
	itest.AnswerNATS(t, e.JS, "bob", id, events.Responded{Decision: events.Approve, Reason: "sorry, was at lunch"})
	itest.AnswerNATS(t, e.JS, "carol", id, events.Responded{Decision: events.Deny})

	itest.WaitBrokerIdle(t, e.JS)
	a := itest.ApprovalOf(t, itest.Call(t, http.MethodGet, url, nil), http.StatusOK)
	if a.State != broker.StateExpired || a.Decision == nil || a.Decision.Outcome != events.Expired || !a.Decision.DecidedAt.Equal(r.D.DecidedAt) || len(a.Decision.DecidedBy) != 0 {
		t.Fatalf("after late answers the request reads %+v", a)
	}
	d := itest.WaitDecision(t, e.JS, id)
	itest.SameDecision(t, r.D, d)
	if n := itest.CountDecisions(t, e.JS, id); n != 1 {
		t.Fatalf("%d decided messages, want 1", n)
	}
}
