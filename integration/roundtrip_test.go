package integration

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/assent-dev/assent/integration/itest"
	"github.com/assent-dev/assent/internal/broker"
	"github.com/assent-dev/assent/internal/testenv"
	"github.com/assent-dev/assent/pkg/events"
	"github.com/assent-dev/assent/pkg/handler"
)

// answerer is one way for an approver to answer: before the request exists
// (an approver runtime waiting for pending requests) or after it is pending.
type answerer struct {
	name    string
	channel string // the channel decided_by records
	before  func(t *testing.T, e *itest.Env, agent, principal string, r events.Responded)
	after   func(t *testing.T, e *itest.Env, id, principal string, r events.Responded)
}

var answerers = []answerer{
	{
		name:    "nats-answer",
		channel: "cli",
		after: func(t *testing.T, e *itest.Env, id, principal string, r events.Responded) {
			r.Channel = "cli"
			itest.AnswerNATS(t, e.JS, principal, id, r)
		},
	},
	{
		name:    "approver-runtime",
		channel: "sdk",
		before: func(t *testing.T, e *itest.Env, agent, principal string, r events.Responded) {
			itest.RunApprover(t, e.NC, principal, agent, func(_ context.Context, req handler.Request) (handler.Response, error) {
				if req.Deadline.IsZero() || req.Agent != agent {
					return handler.Response{}, handler.Permanent(errors.New("unexpected request"))
				}
				return handler.Response{Decision: r.Decision, Reason: r.Reason, Args: r.Args, Payload: r.Payload}, nil
			})
		},
	},
	{
		name:    "http",
		channel: "http",
		after: func(t *testing.T, e *itest.Env, id, principal string, r events.Responded) {
			a := itest.ApprovalOf(t, itest.Call(t, http.MethodPost, e.API+"/v1/approvals/"+id+"/decision", itest.DecisionBody{Principal: principal, Responded: r}), http.StatusOK)
			if a.ID != id || a.State == broker.StatePending || a.Decision == nil {
				t.Fatalf("decision answered with %+v", a)
			}
		},
	},
}

// TestRoundTrip asks through the SDK (Client.Request blocks until the
// decision) and answers through each approver path: approve, deny with a
// reason, approve with edited arguments.
func TestRoundTrip(t *testing.T) {
	e := itest.NewEnv(t, broker.Config{})
	agentConn := e.NC
	origArgs := json.RawMessage(`{"path":"/srv/reports/q3.csv","force":true}`)
	editArgs := json.RawMessage(`{"path":"/srv/reports/q3-draft.csv"}`)

	verdicts := []struct {
		name  string
		resp  events.Responded
		check func(t *testing.T, d handler.Decision)
	}{
		{
			name: "approve",
			resp: events.Responded{Decision: events.Approve, Reason: "fine"},
			check: func(t *testing.T, d handler.Decision) {
				if !d.Approved() || d.Outcome != events.Approved || d.Edited || !itest.SameJSON(d.Args, origArgs) {
					t.Fatalf("decision %+v: want approved with the request's own args", d)
				}
			},
		},
		{
			name: "deny-with-reason",
			resp: events.Responded{Decision: events.Deny, Reason: "touches production: ask ops first"},
			check: func(t *testing.T, d handler.Decision) {
				if d.Approved() || d.Outcome != events.Denied || d.Reason != "touches production: ask ops first" {
					t.Fatalf("decision %+v: want denied with the approver's reason", d)
				}
			},
		},
		{
			name: "approve-edited-args",
			resp: events.Responded{Decision: events.Approve, Reason: "only the draft", Args: editArgs},
			check: func(t *testing.T, d handler.Decision) {
				if !d.Approved() || !d.Edited || !itest.SameJSON(d.Args, editArgs) || d.Reason != "only the draft" {
					t.Fatalf("decision %+v: want approved with the edited args", d)
				}
				want, err := events.ArgsDigest(editArgs)
				if err != nil {
					t.Fatal(err)
				}
				if d.ArgsDigest != want {
					t.Fatalf("args_digest %s, want the edit's %s", d.ArgsDigest, want)
				}
				if err := d.VerifyArgs(); err != nil {
					t.Fatalf("VerifyArgs: %v", err)
				}
			},
		},
	}

	for i, a := range answerers {
		for j, v := range verdicts {
			t.Run(a.name+"/"+v.name, func(t *testing.T) {
				agent := "rt-" + string(rune('a'+i)) + string(rune('a'+j))
				principal := "alice-" + a.name
				if a.before != nil {
					a.before(t, e, agent, principal, v.resp)
				}
				client := itest.NewClient(t, agentConn, agent)
				id := events.NewID()
				res := itest.RequestAsync(t, itest.TestCtx(t, time.Minute), client, handler.Request{ID: id, Requested: events.Requested{
					Tool: "delete_file", Args: origArgs, Session: "s-1", User: "carol", Hint: "Delete the Q3 report?",
					Timeout: events.Duration(time.Minute),
				}})
				if a.after != nil {
					itest.WaitState(t, e.B, id, broker.StatePending)
					a.after(t, e, id, principal, v.resp)
				}
				r := itest.Await(t, res)
				if r.Err != nil {
					t.Fatalf("Request: %v", r.Err)
				}
				d := r.D
				if d.RequestID != id {
					t.Fatalf("decision for %s, want %s", d.RequestID, id)
				}
				if err := d.VerifyArgs(); err != nil {
					t.Fatalf("VerifyArgs: %v", err)
				}
				v.check(t, d)
				if d.Auto || len(d.DecidedBy) != 1 || d.DecidedBy[0].Principal != principal || d.DecidedBy[0].Channel != a.channel || d.DecidedBy[0].Decision != v.resp.Decision {
					t.Fatalf("decided_by %+v auto=%v: want one manual answer by %s via %s", d.DecidedBy, d.Auto, principal, a.channel)
				}
				stored := itest.WaitDecision(t, e.JS, id)
				if !stored.DecidedAt.Equal(d.DecidedAt) || stored.Outcome != d.Outcome || stored.ArgsDigest != d.ArgsDigest {
					t.Fatalf("worker got %+v, stream holds %+v", d, stored)
				}
				rec := itest.WaitState(t, e.B, id, broker.State(d.Outcome))
				if rec.Request.Agent != agent || rec.Request.Tool != "delete_file" {
					t.Fatalf("record %+v", rec)
				}
			})
		}
	}

	itest.WaitBrokerIdle(t, e.JS)
	for id, n := range itest.DecisionCounts(t, e.JS) {
		if n != 1 {
			t.Errorf("request %s has %d decided messages, want 1", id, n)
		}
	}
}

// TestRoundTripExpires: nobody answers, the request ends expired at (not
// before) its deadline, and the waiting worker learns it.
func TestRoundTripExpires(t *testing.T) {
	e := itest.NewEnv(t, broker.Config{})
	client := itest.NewClient(t, e.NC, "expirer")
	id := events.NewID()
	res := itest.RequestAsync(t, itest.TestCtx(t, time.Minute), client, handler.Request{ID: id, Requested: events.Requested{
		Tool: "rm", Args: json.RawMessage(`{"path":"/tmp/x"}`), Timeout: events.Duration(time.Second),
	}})
	pending := itest.WaitRecord(t, e.B, id, func(broker.Record) bool { return true })
	r := itest.Await(t, res)
	if r.Err != nil {
		t.Fatalf("Request: %v", r.Err)
	}
	d := r.D
	if d.Outcome != events.Expired || d.Approved() || d.Rule != "mode:manual" || !strings.HasPrefix(d.Reason, "timeout") || !d.Auto || len(d.DecidedBy) != 0 {
		t.Fatalf("decision %+v: want an automatic expiry", d)
	}
	if got := pending.Deadline.Sub(pending.ReceivedAt); got != time.Second {
		t.Fatalf("deadline %s after receipt, want the requested 1s", got)
	}
	if d.DecidedAt.Before(pending.Deadline) {
		t.Fatalf("expired at %s, before the deadline %s", d.DecidedAt, pending.Deadline)
	}
	if err := d.VerifyArgs(); err != nil {
		t.Fatal(err)
	}
	rec := itest.WaitState(t, e.B, id, broker.StateExpired)
	if !rec.Decision.DecidedAt.Equal(d.DecidedAt) {
		t.Fatalf("record decided at %s, worker told %s", rec.Decision.DecidedAt, d.DecidedAt)
	}
	itest.WaitBrokerIdle(t, e.JS)
	if n := itest.CountDecisions(t, e.JS, id); n != 1 {
		t.Fatalf("%d decided messages, want 1", n)
	}
}

// TestRoundTripCancelOnContextEnd: the worker gives up (its context ends), the
// SDK publishes a cancel, and the request's one decision is "cancelled".
func TestRoundTripCancelOnContextEnd(t *testing.T) {
	e := itest.NewEnv(t, broker.Config{})
	client := itest.NewClient(t, e.NC, "quitter")
	id := events.NewID()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	res := itest.RequestAsync(t, ctx, client, handler.Request{ID: id, Requested: events.Requested{
		Tool: "deploy", Args: json.RawMessage(`{"env":"prod"}`), Timeout: events.Duration(time.Minute),
	}})
	itest.WaitState(t, e.B, id, broker.StatePending)
	cancel()
	r := itest.Await(t, res)
	if !errors.Is(r.Err, context.Canceled) {
		t.Fatalf("Request returned %+v, %v; want context.Canceled", r.D, r.Err)
	}
	d := itest.WaitDecision(t, e.JS, id)
	if d.Outcome != events.Cancelled || d.Approved() || d.Rule != "mode:manual" {
		t.Fatalf("decision %+v: want cancelled", d)
	}
	if len(d.DecidedBy) != 1 || d.DecidedBy[0].Principal != "agent/quitter" || !strings.Contains(d.Reason, "stopped waiting") {
		t.Fatalf("decision %+v: want cancelled by agent/quitter because it stopped waiting", d)
	}
	itest.WaitState(t, e.B, id, broker.StateCancelled)

	// A late approval changes nothing.
	itest.WantError(t, itest.Call(t, http.MethodPost, e.API+"/v1/approvals/"+id+"/decision", itest.DecisionBody{Principal: "alice", Responded: events.Responded{Decision: events.Approve}}), http.StatusConflict, "already_decided")
	itest.AnswerNATS(t, e.JS, "bob", id, events.Responded{Decision: events.Approve})
	itest.WaitBrokerIdle(t, e.JS)
	if rec := itest.WaitState(t, e.B, id, broker.StateCancelled); rec.Decision.Outcome != events.Cancelled {
		t.Fatalf("record %+v", rec)
	}
	if n := itest.CountDecisions(t, e.JS, id); n != 1 {
		t.Fatalf("%d decided messages, want 1", n)
	}
}

// TestRoundTripStructuredAnswer: a request with a response_schema accepts
// only an approval whose payload fits; a misfit gets HTTP 400 (or, over NATS,
// is dropped) and leaves the request pending.
func TestRoundTripStructuredAnswer(t *testing.T) {
	e := itest.NewEnv(t, broker.Config{})
	client := itest.NewClient(t, e.NC, "sizer")
	schema := json.RawMessage(`{"type":"object","properties":{"size_gb":{"type":"integer","minimum":1,"maximum":64}},"required":["size_gb"],"additionalProperties":false}`)
	id := events.NewID()
	res := itest.RequestAsync(t, itest.TestCtx(t, time.Minute), client, handler.Request{ID: id, Requested: events.Requested{
		Tool: "resize_disk", Args: json.RawMessage(`{"vm":"db-1"}`), Hint: "How big?", ResponseSchema: schema,
		Timeout: events.Duration(time.Minute),
	}})
	itest.WaitState(t, e.B, id, broker.StatePending)
	url := e.API + "/v1/approvals/" + id

	for _, bad := range []json.RawMessage{nil, json.RawMessage(`{"size_gb":"big"}`), json.RawMessage(`{"size_gb":0}`), json.RawMessage(`{"size_gb":8,"extra":1}`), json.RawMessage(`[8]`)} {
		r := itest.Call(t, http.MethodPost, url+"/decision", itest.DecisionBody{Principal: "alice", Responded: events.Responded{Decision: events.Approve, Payload: bad}})
		itest.WantError(t, r, http.StatusBadRequest, "invalid_request")
	}
	itest.AnswerNATS(t, e.JS, "mallory", id, events.Responded{Decision: events.Approve, Payload: json.RawMessage(`{"size_gb":1000}`)})
	itest.WaitBrokerIdle(t, e.JS)
	a := itest.ApprovalOf(t, itest.Call(t, http.MethodGet, url, nil), http.StatusOK)
	if a.State != broker.StatePending || a.Decision != nil {
		t.Fatalf("after misfit answers the request is %s with decision %+v, want pending and none", a.State, a.Decision)
	}
	if _, ok := itest.StoredDecision(t, e.JS, id); ok {
		t.Fatal("a misfit answer produced a decided event")
	}

	good := json.RawMessage(`{"size_gb":16}`)
	a = itest.ApprovalOf(t, itest.Call(t, http.MethodPost, url+"/decision", itest.DecisionBody{Principal: "alice", Responded: events.Responded{Decision: events.Approve, Payload: good}}), http.StatusOK)
	if a.State != broker.StateApproved || a.Decision == nil || !itest.SameJSON(a.Decision.Payload, good) {
		t.Fatalf("approval %+v", a)
	}
	r := itest.Await(t, res)
	if r.Err != nil {
		t.Fatal(r.Err)
	}
	if !r.D.Approved() || !itest.SameJSON(r.D.Payload, good) || r.D.DecidedBy[0].Principal != "alice" {
		t.Fatalf("worker got %+v", r.D)
	}
	if n := itest.CountDecisions(t, e.JS, id); n != 1 {
		t.Fatalf("%d decided messages, want 1", n)
	}
}

// TestRoundTripCancelWhilePublishing: a context that ends while the request's
// publish awaits its acknowledgement (the request is stored, the agent does
// not know it yet) still withdraws the request. Each round cancels the moment
// the server hands the request to subscribers, which is around when it is
// stored; no request may stay pending.
func TestRoundTripCancelWhilePublishing(t *testing.T) {
	e := itest.NewEnv(t, broker.Config{})
	client := itest.NewClient(t, e.NC, "hasty")
	watch := testenv.Conn(t, e.NS)
	const rounds = 30
	ids := make([]string, rounds)
	for i := range rounds {
		ctx, cancel := context.WithCancel(context.Background())
		sub, err := watch.Subscribe(events.RequestPrefix+"hasty", func(*nats.Msg) { cancel() })
		if err != nil {
			t.Fatal(err)
		}
		if err := watch.Flush(); err != nil {
			t.Fatal(err)
		}
		ids[i] = events.NewID()
		_, err = client.Request(ctx, handler.Request{ID: ids[i], Requested: events.Requested{Tool: "deploy", Timeout: events.Duration(10 * time.Minute)}})
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("round %d: Request returned %v, want context.Canceled", i, err)
		}
		_ = sub.Unsubscribe()
		cancel()
	}
	itest.WaitBrokerIdle(t, e.JS)
	pending := 0
	for _, id := range ids {
		if rec, err := e.B.Get(itest.TestCtx(t, itest.Patience), id); err == nil && rec.State == broker.StatePending {
			pending++
		}
	}
	if pending > 0 {
		t.Fatalf("%d of %d requests withdrawn while their publish was in flight are still pending", pending, rounds)
	}
}
