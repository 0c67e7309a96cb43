package ops

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/assent-dev/assent/integration/itest"
	"github.com/assent-dev/assent/internal/app"
	"github.com/assent-dev/assent/internal/broker"
	"github.com/assent-dev/assent/internal/clustertest"
	"github.com/assent-dev/assent/internal/httpapi"
	"github.com/assent-dev/assent/internal/natsembed"
	"github.com/assent-dev/assent/pkg/events"
	"github.com/assent-dev/assent/pkg/handler"
)

// oldBroker is the last commit whose broker kept request state in the
// assent-requests bucket, before the stream decided
// (docs/stream-decides.md, section 6).
const oldBroker = "a2cd62b"

// migratePolicy gives each kind of request the migration must keep: reads
// are approved at once, deploys wait for anyone, payments for two of ops,
// wires escalate to the CFO after two seconds.
const migratePolicy = `version: 1
defaults:
  on_no_approver: wait
principals:
  alice: {roles: [ops]}
  bob:   {roles: [ops]}
  carol: {roles: [cfo]}
rules:
  - name: reads
    tools: ["read_*"]
    action: allow
  - name: payments
    tools: [pay]
    action: require_approval
    approvers: ["role:ops"]
    quorum: 2
    timeout: 1h
  - name: wires
    tools: [wire]
    action: require_approval
    approvers: ["role:ops"]
    timeout: 1h
    escalation:
      - after: 2s
        approvers: ["role:cfo"]
        extend: 30m
  - name: deploys
    tools: [deploy]
    action: require_approval
    timeout: 1h
`

// overdueTimeout is the timeout of the request whose deadline passes while no
// broker runs: long enough that the old broker is stopped well before it, on
// a busy machine.
const overdueTimeout = 8 * time.Second

// migrated is one request made by the old broker.
type migrated struct {
	name string
	id   string
	req  events.Requested
	// before is the request as the old broker last showed it.
	before httpapi.Approval
}

// TestMigrateFromA2cd62b runs the broker of a2cd62b, which kept each
// request's state in the assent-requests bucket, on a data directory, stops
// it with requests in every state, and starts the current broker on the same
// directory: every pending request is kept, with its deadline, votes and
// escalation level, one whose deadline passed meanwhile expires, and every
// decision reads back by id, once, including one the old broker recorded in
// the bucket but never published (its window between the two writes).
//
// The old broker is stopped once with SIGKILL and once with SIGTERM.
func TestMigrateFromA2cd62b(t *testing.T) {
	old := itest.BrokerAt(t, oldBroker)
	cur := itest.BrokerBinary(t)
	for _, kill := range []bool{true, false} {
		name := "SIGTERM"
		if kill {
			name = "SIGKILL"
		}
		t.Run(name, func(t *testing.T) { testMigrate(t, old, cur, kill) })
	}
}

// testMigrate is the scenario of TestMigrateFromA2cd62b, the old broker
// stopped by SIGKILL if kill is set, else by SIGTERM.
func testMigrate(t *testing.T, oldBin, curBin string, kill bool) {
	dir := filepath.Join(t.TempDir(), "data")
	policyFile := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(policyFile, []byte(migratePolicy), 0o600); err != nil {
		t.Fatal(err)
	}
	natsPort, httpPort := clustertest.FreePort(t), clustertest.FreePort(t)
	api := "http://127.0.0.1:" + strconv.Itoa(httpPort)
	natsURL := "nats://127.0.0.1:" + strconv.Itoa(natsPort)
	args := append(itest.EmbeddedArgs(dir, natsPort), "--policy", policyFile)
	var oldOut, newOut itest.LockedBuffer
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("output of the broker of %s:\n%s", oldBroker, itest.Tail(oldOut.String(), 40))
			t.Logf("output of the current broker:\n%s", itest.Tail(newOut.String(), 40))
		}
	})
	ctx := itest.TestCtx(t, 5*time.Minute)

	// 1. The old broker makes requests in every state.
	oldProc := itest.StartBrokerProc(t, oldBin, args, httpPort, &oldOut)
	// The broker of a2cd62b answered /readyz 200 up to 10 ms before its API
	// let requests through (fixed since: 3b39a64); wait for the API itself.
	for deadline := time.Now().Add(itest.Patience); ; time.Sleep(10 * time.Millisecond) {
		if r := itest.Call(t, http.MethodGet, api+"/v1/approvals?limit=1", nil); r.Status != http.StatusServiceUnavailable {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the broker of %s answered /readyz but not its API within %s", oldBroker, itest.Patience)
		}
	}
	reqs := map[string]*migrated{}
	create := func(name string, req events.Requested) *migrated {
		t.Helper()
		m := &migrated{name: name, id: events.NewID(), req: req}
		body := struct {
			ID string `json:"id"`
			events.Requested
		}{m.id, req}
		m.before = itest.ApprovalOf(t, itest.Call(t, http.MethodPost, api+"/v1/approvals", body), http.StatusCreated)
		reqs[name] = m
		return m
	}
	answer := func(m *migrated, principal string, v events.Verdict) httpapi.Approval {
		t.Helper()
		return itest.ApprovalOf(t, itest.Call(t, http.MethodPost, api+"/v1/approvals/"+m.id+"/decision",
			itest.DecisionBody{Principal: principal, Responded: events.Responded{Decision: v, Reason: "by " + principal}}), http.StatusOK)
	}
	get := func(m *migrated) httpapi.Approval {
		t.Helper()
		return itest.ApprovalOf(t, itest.Call(t, http.MethodGet, api+"/v1/approvals/"+m.id, nil), http.StatusOK)
	}
	numbered := func(n int) json.RawMessage { return json.RawMessage(fmt.Sprintf(`{"n":%d}`, n)) }

	escalated := create("escalated", events.Requested{Agent: "migrant", Tool: "wire", Args: numbered(1)})
	if auto := create("auto", events.Requested{Agent: "migrant", Tool: "read_config", Args: numbered(2)}); auto.before.State != broker.StateApproved || auto.before.Decision == nil || !auto.before.Decision.Auto {
		t.Fatalf("the old broker did not approve the read at once: %+v", auto.before)
	}
	denied := create("denied", events.Requested{Agent: "migrant", Tool: "deploy", Args: numbered(3)})
	if a := answer(denied, "alice", events.Deny); a.State != broker.StateDenied {
		t.Fatalf("the old broker answered a deny with %+v", a)
	}
	lost := create("lost", events.Requested{Agent: "migrant", Tool: "deploy", Args: numbered(4)})
	if a := answer(lost, "alice", events.Approve); a.State != broker.StateApproved {
		t.Fatalf("the old broker answered an approval with %+v", a)
	}
	quorum := create("quorum", events.Requested{Agent: "migrant", Tool: "pay", Args: numbered(5)})
	if a := answer(quorum, "alice", events.Approve); a.State != broker.StatePending || len(a.Votes) != 1 {
		t.Fatalf("the old broker answered the first of two approvals with %+v", a)
	}

	// The plain pending request comes from an agent that waits for it across
	// the upgrade, reconnecting to the new broker's NATS on the same port.
	agentNC, err := nats.Connect(natsURL, nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(agentNC.Close)
	plain := &migrated{name: "plain", id: events.NewID(), req: events.Requested{Agent: "migrant", Tool: "deploy", Args: numbered(6)}}
	reqs[plain.name] = plain
	agentCtx, stopAgent := context.WithCancel(ctx)
	waiting := itest.RequestAsync(t, agentCtx, itest.NewClient(t, agentNC, "migrant"), handler.Request{ID: plain.id, Requested: plain.req, Keep: true})
	// Before the cleanup that waits for it: a failed test does not wait
	// for the request's context to end.
	t.Cleanup(stopAgent)
	itest.Eventually(t, itest.Patience, func() (bool, string) {
		r := itest.Call(t, http.MethodGet, api+"/v1/approvals/"+plain.id, nil)
		return r.Status == http.StatusOK, fmt.Sprintf("the agent's request is not at the old broker: %d %s", r.Status, r.Body)
	})

	itest.Eventually(t, itest.Patience, func() (bool, string) {
		a := get(escalated)
		return a.Level == 1, fmt.Sprintf("the old broker has not escalated the wire: level %d, %s", a.Level, a.State)
	})

	// Last, so that the old broker is stopped before its deadline.
	overdue := create("overdue", events.Requested{Agent: "migrant", Tool: "deploy", Args: numbered(7), Timeout: events.Duration(overdueTimeout)})
	for _, m := range reqs {
		m.before = get(m)
	}
	if kill {
		oldProc.Kill(t)
	} else {
		oldProc.Stop(t)
	}
	if left := time.Until(overdue.before.Deadline); overdue.before.State != broker.StatePending || left <= 0 {
		t.Fatalf("the old broker was stopped too late: the overdue request is %s, its deadline %s ago (the machine is too slow for %s)", overdue.before.State, -left, overdueTimeout)
	}
	for _, m := range []*migrated{escalated, quorum, plain, overdue} {
		if m.before.State != broker.StatePending {
			t.Fatalf("request %s (%s) is %s at the old broker, want pending", m.name, m.id, m.before.State)
		}
	}

	// 2. With NATS alone: the old design's window between storing an
	// outcome and publishing it. The bucket says lost was approved; its
	// decided event is purged from the stream.
	bucketSays := purgeDecision(t, dir, lost.id, overdue.id)

	if wait := time.Until(overdue.before.Deadline); wait > 0 {
		t.Logf("waiting %s for the overdue request's deadline to pass with no broker running", wait.Round(time.Millisecond))
		time.Sleep(wait + 500*time.Millisecond)
	}

	// 3. The current broker on the same data directory.
	itest.StartBrokerProc(t, curBin, args, httpPort, &newOut)
	started := time.Now()
	nc, err := nats.Connect(natsURL, nats.MaxReconnects(-1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js := itest.NewJS(t, nc)
	client := itest.NewClient(t, nc, "migrant")

	t.Run("pending requests are listed with their deadlines and votes", func(t *testing.T) {
		r := itest.Call(t, http.MethodGet, api+"/v1/approvals?state=pending&agent=migrant&limit=1000", nil)
		var list struct {
			Approvals []httpapi.Approval `json:"approvals"`
		}
		if r.Status != http.StatusOK {
			t.Fatalf("list: %d %s", r.Status, r.Body)
		}
		if err := json.Unmarshal(r.Body, &list); err != nil {
			t.Fatalf("list: %v: %s", err, r.Body)
		}
		listed := map[string]httpapi.Approval{}
		for _, a := range list.Approvals {
			listed[a.ID] = a
		}
		for _, m := range []*migrated{escalated, quorum, plain, overdue} {
			a, ok := listed[m.id]
			switch {
			case !ok && m == overdue:
				// Expired already: checked below.
			case !ok:
				t.Errorf("pending request %s (%s) is not listed pending", m.name, m.id)
			case !a.Deadline.Equal(m.before.Deadline):
				t.Errorf("request %s: deadline %s, the old broker's %s", m.name, a.Deadline.Format(time.RFC3339Nano), m.before.Deadline.Format(time.RFC3339Nano))
			}
		}
		if a, ok := listed[quorum.id]; ok && !sameVotes(a.Votes, quorum.before.Votes) {
			t.Errorf("the quorum request lists votes %+v, the old broker recorded %+v", a.Votes, quorum.before.Votes)
		}
		for _, m := range []string{"auto", "denied", "lost"} {
			if _, ok := listed[reqs[m].id]; ok {
				t.Errorf("decided request %s is listed pending", m)
			}
		}
	})

	t.Run("the escalated request keeps its level", func(t *testing.T) {
		a := get(escalated)
		if a.State != broker.StatePending || a.Level != escalated.before.Level || !a.Deadline.Equal(escalated.before.Deadline) {
			t.Errorf("the escalated request reads %s, level %d, deadline %s; the old broker had it pending at level %d, deadline %s",
				a.State, a.Level, a.Deadline.Format(time.RFC3339Nano), escalated.before.Level, escalated.before.Deadline.Format(time.RFC3339Nano))
		}
	})

	t.Run("the overdue request expires at start", func(t *testing.T) {
		var a httpapi.Approval
		itest.Eventually(t, itest.Patience, func() (bool, string) {
			a = get(overdue)
			return a.State.Terminal(), fmt.Sprintf("the request whose deadline passed while no broker ran is still %s %s after the broker started",
				a.State, time.Since(started).Round(time.Millisecond))
		})
		t.Logf("expired %s after the broker was ready", time.Since(started).Round(time.Millisecond))
		if a.State != broker.StateExpired || a.Decision == nil || a.Decision.DecidedAt.Before(overdue.before.Deadline) {
			t.Errorf("the overdue request ended %s with %+v; want expired after its deadline %s", a.State, a.Decision, overdue.before.Deadline.Format(time.RFC3339Nano))
		}
	})

	t.Run("the decision the old broker did not publish is published", func(t *testing.T) {
		var got decisionEvent
		deadline := time.Now().Add(itest.Patience)
		for {
			var ok bool
			if got, ok = firstDecision(t, js, lost.id); ok {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("assent.decision.%s holds no message %s after the broker started: the decision recorded in the bucket (%s) and never published is not published at start",
					lost.id, time.Since(started).Round(time.Second), describe(*bucketSays.Decision))
			}
			time.Sleep(100 * time.Millisecond)
		}
		if got.eventID != bucketSays.DecisionEventID || !sameDecision(got.decided, *bucketSays.Decision) {
			t.Errorf("the published decision is event %s, %s; the bucket recorded event %s, %s",
				got.eventID, describe(got.decided), bucketSays.DecisionEventID, describe(*bucketSays.Decision))
		}
	})

	t.Run("a second approval decides the quorum request", func(t *testing.T) {
		a := answer(quorum, "bob", events.Approve)
		if a.State != broker.StateApproved || a.Decision == nil {
			t.Fatalf("the second approval left the request %s (%+v)", a.State, a.Decision)
		}
		if by := principals(a.Decision.DecidedBy); !slices.Equal(by, []string{"alice", "bob"}) {
			t.Errorf("the quorum request was decided by %v, want alice (before the upgrade) and bob", by)
		}
	})

	t.Run("the plain pending request is approved and its agents get the decision", func(t *testing.T) {
		retryCtx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		retry := itest.RequestAsync(t, retryCtx, client, handler.Request{ID: plain.id, Requested: plain.req, Keep: true})
		a := answer(plain, "carol", events.Approve)
		if a.State != broker.StateApproved {
			t.Fatalf("carol's approval left the request %s", a.State)
		}
		// The agent that waited across the upgrade rereads the stored state
		// every 30 s; its subscription, renewed on reconnecting, is quicker.
		for what, ch := range map[string]<-chan itest.Result{
			"the agent that waited across the upgrade": waiting,
			"the agent that asked again by id":         retry,
		} {
			select {
			case r := <-ch:
				if r.Err != nil || !r.D.Approved() || r.D.RequestID != plain.id || !sameDecision(r.D, *a.Decision) {
					t.Errorf("%s got %s, %v; the broker decided %s", what, describe(r.D), r.Err, describe(*a.Decision))
				}
			case <-time.After(time.Minute):
				t.Errorf("%s got no decision a minute after the approval", what)
			}
		}
	})

	var decided []*migrated
	for _, name := range []string{"auto", "denied", "lost", "quorum", "plain", "overdue"} {
		decided = append(decided, reqs[name])
	}
	t.Run("a retry by id reads the one decision", func(t *testing.T) {
		for _, m := range decided {
			t.Run(m.name, func(t *testing.T) {
				// The decision is the first message on its subject; without
				// one, each way of reading is still tried against what the
				// old broker reported.
				first, ok := firstDecision(t, js, m.id)
				want := first.decided
				switch b := m.before.Decision; {
				case !ok && b == nil:
					t.Fatalf("assent.decision.%s holds no message", m.id)
				case !ok:
					t.Errorf("assent.decision.%s holds no message; the old broker reported %s", m.id, describe(*b))
					want = *b
				case b != nil && !sameDecision(want, *b):
					t.Errorf("the stream holds %s; the old broker reported %s", describe(want), describe(*b))
				}
				if n := itest.CountDecisions(t, js, m.id); n != 1 {
					t.Errorf("assent.decision.%s holds %d messages, want 1", m.id, n)
				}
				if a := get(m); a.Decision == nil || !sameDecision(*a.Decision, want) {
					t.Errorf("GET /v1/approvals/%s reads %s %+v; want %s", m.id, a.State, a.Decision, describe(want))
				}
				rctx, cancel := context.WithTimeout(ctx, 15*time.Second)
				defer cancel()
				if d, ok, err := client.Decision(rctx, m.id); err != nil || !ok || !sameDecision(d, want) {
					t.Errorf("Client.Decision: %s, found %v, error %v; want %s", describe(d), ok, err, describe(want))
				}
				if d, err := client.Request(rctx, handler.Request{ID: m.id, Requested: m.req, Keep: true}); err != nil || !sameDecision(d, want) {
					t.Errorf("Client.Request again with the id: %s, error %v; want %s", describe(d), err, describe(want))
				}
			})
		}
	})

	t.Run("broker audit shows one decision each", func(t *testing.T) {
		for _, m := range decided {
			code, out, _ := runCLI(t, "audit", "--request", m.id, "--type", "decided", "--http", api)
			if code != app.ExitOK {
				t.Errorf("broker audit --request %s: exit %d", m.id, code)
				continue
			}
			if n := countLines(out); n != 1 {
				t.Errorf("broker audit --request %s --type decided: %d decisions for request %s, want 1", m.id, n, m.name)
			}
		}
	})
}

// purgeDecision runs NATS alone on the data directory dir and purges the
// decided event of request lost from the stream, as if the old broker had
// died between storing its outcome in the bucket and publishing it. It
// returns lost's record, which still says it is decided. overdue must still
// be pending, with no decision.
func purgeDecision(t *testing.T, dir, lost, overdue string) oldRecord {
	t.Helper()
	ns, err := natsembed.Start(natsembed.Config{Port: -1, StoreDir: dir}, nil)
	if err != nil {
		t.Fatalf("start NATS alone on the data directory: %v", err)
	}
	defer func() {
		ns.Shutdown()
		ns.WaitForShutdown()
	}()
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js := itest.NewJS(t, nc)
	ctx, cancel := itest.OpCtx()
	defer cancel()
	kv, err := js.KeyValue(ctx, events.StateBucket)
	if err != nil {
		t.Fatalf("the old broker's bucket %s: %v", events.StateBucket, err)
	}
	record := func(id string) oldRecord {
		t.Helper()
		e, err := kv.Get(ctx, id)
		if err != nil {
			t.Fatalf("the bucket's entry for %s: %v", id, err)
		}
		var rec oldRecord
		if err := json.Unmarshal(e.Value(), &rec); err != nil {
			t.Fatalf("the bucket's entry for %s: %v", id, err)
		}
		return rec
	}
	if rec := record(overdue); rec.State != broker.StatePending {
		t.Fatalf("the old broker left the overdue request %s, want pending", rec.State)
	}
	if _, ok := firstDecision(t, js, overdue); ok {
		t.Fatal("the old broker published a decision for the overdue request before it stopped")
	}
	rec := record(lost)
	if rec.State != broker.StateApproved || rec.Decision == nil || rec.DecisionEventID == "" {
		t.Fatalf("the bucket records %s for the approved request, with decision %+v, event %q", rec.State, rec.Decision, rec.DecisionEventID)
	}
	stored, ok := firstDecision(t, js, lost)
	if !ok || stored.eventID != rec.DecisionEventID {
		t.Fatalf("before the purge, assent.decision.%s holds %+v (found: %v); the bucket says event %s", lost, stored, ok, rec.DecisionEventID)
	}
	subj, err := events.DecisionSubject(lost)
	if err != nil {
		t.Fatal(err)
	}
	if err := itest.StreamOf(t, js).Purge(ctx, jetstream.WithPurgeSubject(subj)); err != nil {
		t.Fatalf("purge %s: %v", subj, err)
	}
	if _, ok := firstDecision(t, js, lost); ok {
		t.Fatalf("%s still holds a message after the purge", subj)
	}
	return rec
}

// oldRecord is what the test reads of a request's entry in the old broker's
// bucket (the JSON of broker.Record at a2cd62b).
type oldRecord struct {
	State           broker.State    `json:"state"`
	Decision        *events.Decided `json:"decision"`
	DecisionEventID string          `json:"decision_event_id"`
}

// decisionEvent is a decided event as stored: its CloudEvent id and data.
type decisionEvent struct {
	eventID string
	decided events.Decided
}

// firstDecision reads the first message on assent.decision.<id>, the
// request's decision, if there is one.
func firstDecision(t *testing.T, js jetstream.JetStream, id string) (decisionEvent, bool) {
	t.Helper()
	subj, err := events.DecisionSubject(id)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := itest.OpCtx()
	defer cancel()
	m, err := itest.StreamOf(t, js).GetMsg(ctx, 1, jetstream.WithGetMsgSubject(subj))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return decisionEvent{}, false
	}
	if err != nil {
		t.Fatalf("read %s: %v", subj, err)
	}
	e, err := events.Codec{MaxSize: 2 << 20}.Decode(events.Header(m.Header), m.Data)
	if err != nil {
		t.Fatalf("decode %s: %v", subj, err)
	}
	d, err := events.DecodeDecided(&e)
	if err != nil {
		t.Fatalf("decode %s: %v", subj, err)
	}
	return decisionEvent{eventID: e.ID(), decided: d}, true
}

// sameDecision reports whether a and b are the same decision, in the fields
// an agent acts on and an auditor reads.
func sameDecision(a, b events.Decided) bool {
	return a.RequestID == b.RequestID && a.Outcome == b.Outcome && a.Reason == b.Reason && a.Rule == b.Rule &&
		a.Auto == b.Auto && a.ArgsDigest == b.ArgsDigest && a.DecidedAt.Equal(b.DecidedAt) &&
		slices.Equal(principals(a.DecidedBy), principals(b.DecidedBy))
}

// sameVotes reports whether a and b are the same approvals.
func sameVotes(a, b []events.DecidedBy) bool {
	return slices.EqualFunc(a, b, func(x, y events.DecidedBy) bool {
		return x.Principal == y.Principal && x.Decision == y.Decision && x.At.Equal(y.At)
	})
}

func principals(by []events.DecidedBy) []string {
	var out []string
	for _, b := range by {
		out = append(out, b.Principal)
	}
	slices.Sort(out)
	return out
}

func describe(d events.Decided) string {
	if d.Outcome == "" {
		return "no decision"
	}
	return fmt.Sprintf("%s %s by %v at %s (rule %s, %q)", d.RequestID, d.Outcome, principals(d.DecidedBy), d.DecidedAt.Format(time.RFC3339Nano), d.Rule, d.Reason)
}

func countLines(s string) int {
	n := 0
	sc := bufio.NewScanner(strings.NewReader(s))
	sc.Buffer(nil, 8<<20)
	for sc.Scan() {
		if strings.TrimSpace(sc.Text()) != "" {
			n++
		}
	}
	return n
}
