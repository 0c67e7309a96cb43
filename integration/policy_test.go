package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/assent-dev/assent/integration/itest"
	"github.com/assent-dev/assent/internal/app"
	"github.com/assent-dev/assent/internal/broker"
	"github.com/assent-dev/assent/internal/httpapi"
	"github.com/assent-dev/assent/internal/testenv"
	"github.com/assent-dev/assent/pkg/events"
	"github.com/assent-dev/assent/pkg/handler"
	"github.com/assent-dev/assent/pkg/policy"
)

const testPolicy = `version: 1
mode: manual
defaults:
  timeout: 1m
principals:
  alice: {roles: [finance]}
  bob:   {roles: [finance]}
  carol: {roles: [finance]}
  dave:  {roles: [engineering]}
rules:
  - name: read-only
    tools: ["read_*"]
    action: allow
  - name: no-prod-drops
    tools: [drop_database]
    when: 'args.env == "production"'
    action: deny
    reason: production databases are never dropped by agents
  - name: reimbursements
    tools: [reimburse]
    when: 'double(args.amount) > 1000.0'
    action: require_approval
    approvers: ["role:finance"]
    quorum: 2
    rememberable: false
  - name: writes
    tools: ["write_*"]
    action: require_approval
    approvers: ["role:finance", dave]
    remember_scopes: [session]
    max_remember: 1h
  - name: nightly
    tools: [rotate_logs]
    action: require_approval
    timeout: 2s
    on_timeout: approve
`

func policyEnv(t *testing.T) *itest.Env {
	t.Helper()
	p := itest.MustPolicy(t, testPolicy, "test.yaml")
	return itest.NewEnv(t, broker.Config{Policy: p})
}

func TestPolicyAllowDenyByRule(t *testing.T) {
	e := policyEnv(t)
	rec := itest.Submit(t, e, events.Requested{Tool: "read_file", Args: json.RawMessage(`{"path":"/x"}`)})
	if rec.State != broker.StateApproved || !rec.Decision.Auto || rec.Decision.Rule != "read-only" {
		t.Fatalf("read: %+v", rec.Decision)
	}
	rec = itest.Submit(t, e, events.Requested{Tool: "drop_database", Args: json.RawMessage(`{"env":"production"}`)})
	if rec.State != broker.StateDenied || rec.Decision.Rule != "no-prod-drops" || !strings.Contains(rec.Decision.Reason, "never dropped") {
		t.Fatalf("drop: %+v", rec.Decision)
	}
	// A condition that cannot be evaluated (no env) fails closed: deny.
	rec = itest.Submit(t, e, events.Requested{Tool: "drop_database", Args: json.RawMessage(`{}`)})
	if rec.State != broker.StateDenied || rec.Decision.Rule != "no-prod-drops" {
		t.Fatalf("drop without env: %+v", rec.Decision)
	}
}

// TestPolicyQuorum: two finance approvals decide; a deny from an eligible
// principal denies; others are refused as not eligible.
func TestPolicyQuorum(t *testing.T) {
	e := policyEnv(t)
	big := events.Requested{Tool: "reimburse", User: "carol", Args: json.RawMessage(`{"amount":2500}`)}
	rec := itest.Submit(t, e, big)
	if rec.State != broker.StatePending || rec.Rule != "reimbursements" || rec.Quorum != 2 {
		t.Fatalf("pending: %+v", rec)
	}
	url := e.API + "/v1/approvals/" + rec.ID + "/decision"
	itest.WantError(t, itest.Call(t, http.MethodPost, url, itest.DecisionBody{Principal: "dave", Responded: events.Responded{Decision: events.Approve}}), http.StatusForbidden, "not_eligible")
	itest.WantError(t, itest.Call(t, http.MethodPost, url, itest.DecisionBody{Principal: "carol", Responded: events.Responded{Decision: events.Approve}}), http.StatusForbidden, "not_eligible") // self-approval
	itest.WantError(t, itest.Call(t, http.MethodPost, url, itest.DecisionBody{Principal: "alice", Responded: events.Responded{Decision: events.Approve, Args: json.RawMessage(`{"amount":1}`)}}), http.StatusBadRequest, "invalid_request")
	if a := itest.ApprovalOf(t, itest.Call(t, http.MethodPost, url, itest.DecisionBody{Principal: "alice", Responded: events.Responded{Decision: events.Approve}}), http.StatusOK); a.State != broker.StatePending {
		t.Fatalf("after one approval: %s", a.State)
	}
	// The same principal again does not count twice.
	if a := itest.ApprovalOf(t, itest.Call(t, http.MethodPost, url, itest.DecisionBody{Principal: "alice", Responded: events.Responded{Decision: events.Approve}}), http.StatusOK); a.State != broker.StatePending {
		t.Fatalf("after a repeated approval: %s", a.State)
	}
	a := itest.ApprovalOf(t, itest.Call(t, http.MethodPost, url, itest.DecisionBody{Principal: "bob", Responded: events.Responded{Decision: events.Approve}}), http.StatusOK)
	if a.State != broker.StateApproved || len(a.Decision.DecidedBy) != 2 {
		t.Fatalf("after two approvals: %+v", a.Decision)
	}
	if d := itest.WaitDecision(t, e.JS, rec.ID); d.Outcome != events.Approved || itest.CountDecisions(t, e.JS, rec.ID) != 1 {
		t.Fatalf("decision %+v", d)
	}

	// One approval then a deny: denied.
	rec = itest.Submit(t, e, big)
	url = e.API + "/v1/approvals/" + rec.ID + "/decision"
	itest.ApprovalOf(t, itest.Call(t, http.MethodPost, url, itest.DecisionBody{Principal: "alice", Responded: events.Responded{Decision: events.Approve}}), http.StatusOK)
	a = itest.ApprovalOf(t, itest.Call(t, http.MethodPost, url, itest.DecisionBody{Principal: "bob", Responded: events.Responded{Decision: events.Deny, Reason: "duplicate claim"}}), http.StatusOK)
	if a.State != broker.StateDenied || a.Decision.Reason != "duplicate claim" || len(a.Decision.DecidedBy) != 2 {
		t.Fatalf("deny after approval: %+v", a.Decision)
	}
	// Not rememberable: an answer asking to remember is refused.
	rec = itest.Submit(t, e, big)
	url = e.API + "/v1/approvals/" + rec.ID + "/decision"
	itest.WantError(t, itest.Call(t, http.MethodPost, url, itest.DecisionBody{Principal: "alice", Responded: events.Responded{Decision: events.Approve, Remember: &events.Remember{Scope: events.ScopeSession}}}), http.StatusBadRequest, "invalid_request")
}

// TestPolicyRememberedApproval: an approval remembered for the session decides
// the next matching request automatically, names the grant, stops at its TTL,
// and a revocation through one replica is seen by another at once.
func TestPolicyRememberedApproval(t *testing.T) {
	p := itest.MustPolicy(t, testPolicy, "test.yaml")
	ns := testenv.Server(t)
	b1, _ := itest.RunBroker(t, testenv.Conn(t, ns), broker.Config{Name: "r1", Policy: p})
	b2, _ := itest.RunBroker(t, testenv.Conn(t, ns), broker.Config{Name: "r2", Policy: p})
	e := &itest.Env{NS: ns, NC: testenv.Conn(t, ns), B: b1, API: itest.ServeAPI(t, b1)}
	e.JS = itest.NewJS(t, e.NC)
	api2 := itest.ServeAPI(t, b2)

	write := events.Requested{Tool: "write_file", Session: "s-1", Args: json.RawMessage(`{"path":"/a"}`)}
	rec := itest.Submit(t, e, write)
	if rec.State != broker.StatePending {
		t.Fatalf("first write: %s", rec.State)
	}
	// A TTL over the rule's max_remember is refused.
	url := e.API + "/v1/approvals/" + rec.ID + "/decision"
	itest.WantError(t, itest.Call(t, http.MethodPost, url, itest.DecisionBody{Principal: "dave", Responded: events.Responded{Decision: events.Approve, Remember: &events.Remember{Scope: events.ScopeSession, TTL: events.Duration(2 * time.Hour)}}}), http.StatusBadRequest, "invalid_request")
	itest.ApprovalOf(t, itest.Call(t, http.MethodPost, url, itest.DecisionBody{Principal: "dave", Responded: events.Responded{Decision: events.Approve, Remember: &events.Remember{Scope: events.ScopeSession, TTL: events.Duration(3 * time.Second)}}}), http.StatusOK)

	// Both replicas know the grant.
	var grantID string
	itest.Eventually(t, 10*time.Second, func() (bool, string) {
		g1, g2 := b1.Remembered(), b2.Remembered()
		if len(g1) == 1 && len(g2) == 1 {
			grantID = g1[0].ID
			return true, ""
		}
		return false, "grant not on both replicas"
	})
	next := itest.Submit(t, e, write)
	if next.State != broker.StateApproved || !next.Decision.Auto || next.Decision.Rule != "remembered:"+grantID {
		t.Fatalf("second write: %+v", next.Decision)
	}
	// Another session is not covered.
	if other := itest.Submit(t, e, events.Requested{Tool: "write_file", Session: "s-2"}); other.State != broker.StatePending {
		t.Fatalf("other session: %s", other.State)
	}
	// After the TTL the grant no longer applies.
	time.Sleep(3500 * time.Millisecond)
	if later := itest.Submit(t, e, write); later.State != broker.StatePending {
		t.Fatalf("after TTL: %+v", later.Decision)
	}

	// Remember again, then revoke through replica 2's API: replica 1 stops
	// using it at once.
	rec = itest.Submit(t, e, write)
	itest.ApprovalOf(t, itest.Call(t, http.MethodPost, e.API+"/v1/approvals/"+rec.ID+"/decision", itest.DecisionBody{Principal: "alice", Responded: events.Responded{Decision: events.Approve, Remember: &events.Remember{Scope: events.ScopeSession, TTL: events.Duration(time.Hour)}}}), http.StatusOK)
	itest.Eventually(t, 10*time.Second, func() (bool, string) { return len(b2.Remembered()) == 1, "grant not on replica 2" })
	id := b2.Remembered()[0].ID
	var listed struct{ Remembered []policy.Grant }
	if err := json.Unmarshal(itest.Call(t, http.MethodGet, api2+"/v1/remembered", nil).Body, &listed); err != nil || len(listed.Remembered) != 1 {
		t.Fatalf("GET /v1/remembered: %+v %v", listed, err)
	}
	if r := itest.Call(t, http.MethodDelete, api2+"/v1/remembered/"+id, nil); r.Status != http.StatusOK {
		t.Fatalf("DELETE: %d %s", r.Status, r.Body)
	}
	itest.WantError(t, itest.Call(t, http.MethodDelete, api2+"/v1/remembered/"+id, nil), http.StatusNotFound, "not_found")
	itest.Eventually(t, 10*time.Second, func() (bool, string) { return len(b1.Remembered()) == 0, "replica 1 still holds the revoked grant" })
	if after := itest.Submit(t, e, write); after.State != broker.StatePending {
		t.Fatalf("after revocation: %+v", after.Decision)
	}
}

// TestPolicyTimeoutApproves: a rule whose timeout means approve.
func TestPolicyTimeoutApproves(t *testing.T) {
	e := policyEnv(t)
	rec := itest.Submit(t, e, events.Requested{Tool: "rotate_logs", Timeout: events.Duration(time.Hour)})
	if got := rec.Deadline.Sub(rec.ReceivedAt); got != 2*time.Second {
		t.Fatalf("timeout %s, want the rule's 2s (a request may not lengthen an approve-on-timeout)", got)
	}
	final := itest.WaitState(t, e.B, rec.ID, broker.StateApproved)
	if !final.Decision.Auto || final.Decision.Rule != "nightly" || !strings.HasPrefix(final.Decision.Reason, "timeout") {
		t.Fatalf("decision %+v", final.Decision)
	}
}

// TestPolicyCommands runs policy check and policy test on the example files
// and on a broken one.
func TestPolicyCommands(t *testing.T) {
	root := filepath.Join("..", "examples", "policies")
	files, err := filepath.Glob(filepath.Join(root, "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("example policies: %v", err)
	}
	for _, f := range files {
		var out bytes.Buffer
		if !app.PolicyCheck(&out, f) {
			t.Errorf("%s: %s", f, out.String())
		}
	}
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(bad, []byte("version: 1\nmode: sometimes\nrules:\n  - name: x\n    action: allow\n    quorum: 0\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if app.PolicyCheck(&out, bad) || !strings.Contains(out.String(), "bad.yaml:2:") || !strings.Contains(out.String(), "bad.yaml:6:") {
		t.Fatalf("bad policy: %s", out.String())
	}
	req := filepath.Join(t.TempDir(), "req.json")
	if err := os.WriteFile(req, []byte(`{"tool":"reimburse","user":"carol","args":{"amount":2500}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	if err := app.PolicyTest(&out, filepath.Join(root, "reimbursements.yaml"), req, time.Now()); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "decision: require_approval") || !strings.Contains(out.String(), "big-reimbursements") {
		t.Fatalf("policy test: %s", out.String())
	}
}

// TestPolicyReload: a changed policy file takes effect; a broken one is
// refused and the old policy stays.
func TestPolicyReload(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "policy.yaml")
	write := func(s string) {
		t.Helper()
		if err := os.WriteFile(file, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("version: 1\nmode: auto-deny\n")
	reload := make(chan struct{}, 1)
	addrs := itest.StartApp(t, app.Options{NATSListen: "127.0.0.1:0", DataDir: t.TempDir(), HTTPListen: "127.0.0.1:0", PolicyFile: file, Reload: reload})
	create := func() httpapi.Approval {
		return itest.ApprovalOf(t, itest.Call(t, http.MethodPost, addrs.HTTP+"/v1/approvals", map[string]any{"agent": "r", "tool": "x"}), http.StatusCreated)
	}
	if a := create(); a.State != broker.StateDenied {
		t.Fatalf("auto-deny: %s", a.State)
	}
	write("version: 1\nmode: auto-approve\n")
	reload <- struct{}{}
	itest.Eventually(t, 10*time.Second, func() (bool, string) { return create().State == broker.StateApproved, "new policy not in force" })
	write("version: 1\nmode: nonsense\n")
	reload <- struct{}{}
	time.Sleep(200 * time.Millisecond)
	if a := create(); a.State != broker.StateApproved {
		t.Fatalf("a broken reload replaced the policy: %s", a.State)
	}
}

// TestNoApproverFailsFast: with no open gateway, a request whose eligible
// approvers have no live channel is denied at once (on_no_approver: deny), or
// waits (on_no_approver: wait); once an approver runtime announces itself, the
// request waits for it and it decides.
func TestNoApproverFailsFast(t *testing.T) {
	p := itest.MustPolicy(t, `version: 1
principals:
  alice: {roles: [ops]}
rules:
  - name: deploys
    tools: [deploy]
    action: require_approval
    approvers: ["role:ops"]
  - name: patient
    tools: [backup]
    action: require_approval
    approvers: ["role:ops"]
    on_no_approver: wait
`, "fast.yaml")
	ns := testenv.Server(t)
	b, _ := itest.RunBroker(t, testenv.Conn(t, ns), broker.Config{Name: "fast", Policy: p, AnnouncedOnly: true})
	e := &itest.Env{NS: ns, NC: testenv.Conn(t, ns), B: b}
	start := time.Now()
	rec := itest.Submit(t, e, events.Requested{Agent: "ci", Tool: "deploy", Timeout: events.Duration(time.Hour)})
	if rec.State != broker.StateDenied || rec.Decision.Reason != policy.ReasonNoApprover || !rec.Decision.Auto {
		t.Fatalf("no approver: %+v", rec.Decision)
	}
	if waited := time.Since(start); waited > 10*time.Second {
		t.Fatalf("took %s to fail", waited)
	}
	if rec := itest.Submit(t, e, events.Requested{Agent: "ci", Tool: "backup", Timeout: events.Duration(time.Hour)}); rec.State != broker.StatePending {
		t.Fatalf("on_no_approver wait: %s", rec.State)
	}

	itest.RunApprover(t, testenv.Conn(t, ns), "alice", "ci", func(_ context.Context, req handler.Request) (handler.Response, error) {
		if req.Tool != "deploy" {
			return handler.Response{}, handler.ErrSkip
		}
		return handler.Response{Decision: events.Approve, Reason: "go"}, nil
	})
	// Announced: the next deploy waits for alice, who approves.
	var d broker.Record
	itest.Eventually(t, 20*time.Second, func() (bool, string) {
		d = itest.Submit(t, e, events.Requested{Agent: "ci", Tool: "deploy", Timeout: events.Duration(time.Hour)})
		return d.State == broker.StatePending, "alice's channel not seen yet: " + string(d.State)
	})
	final := itest.WaitState(t, b, d.ID, broker.StateApproved)
	if final.Decision.DecidedBy[0].Principal != "alice" {
		t.Fatalf("decided by %+v", final.Decision.DecidedBy)
	}
}

// TestPresenceAfterNATSRestart: the presence bucket lives in memory, so a
// NATS restart loses it. The broker makes it again and follows it, the
// running channels announce themselves in it again, and a channel that starts
// after the restart is seen: requests for its principal wait for it rather
// than fail for want of an approver.
func TestPresenceAfterNATSRestart(t *testing.T) {
	p := itest.MustPolicy(t, `version: 1
principals:
  alice: {roles: [ops]}
  bob:   {roles: [dba]}
rules:
  - name: deploys
    tools: [deploy]
    action: require_approval
    approvers: ["role:ops"]
  - name: migrations
    tools: [migrate]
    action: require_approval
    approvers: ["role:dba"]
`, "presence.yaml")
	ns := testenv.Server(t)
	b, _ := itest.RunBroker(t, testenv.Conn(t, ns), broker.Config{Name: "presence", Policy: p, AnnouncedOnly: true})
	e := &itest.Env{NS: ns, NC: testenv.Conn(t, ns), B: b}
	skip := func(context.Context, handler.Request) (handler.Response, error) {
		return handler.Response{}, handler.ErrSkip
	}
	itest.RunApprover(t, testenv.Conn(t, ns), "alice", "ci", skip)
	itest.Eventually(t, itest.Patience, func() (bool, string) {
		rec := itest.Submit(t, e, events.Requested{Agent: "ci", Tool: "deploy", Timeout: events.Duration(time.Hour)})
		return rec.State == broker.StatePending, "alice's channel not seen: " + string(rec.State)
	})

	restarted := time.Now()
	ns = ns.Restart(t)
	js := itest.NewJS(t, testenv.Conn(t, ns))
	// alice's channel announces itself again, in a bucket made anew: within
	// the broker's check and the channel's refresh (5s and 10s).
	itest.Eventually(t, 2*itest.Patience, func() (bool, string) {
		kv, err := js.KeyValue(context.Background(), events.PresenceBucket)
		if err != nil {
			return false, "presence bucket: " + err.Error()
		}
		key, _ := events.PresenceKey("alice", "sdk")
		entry, err := kv.Get(context.Background(), key)
		if err != nil {
			return false, "alice's announcement: " + err.Error()
		}
		var a events.Announcement
		_ = json.Unmarshal(entry.Value(), &a)
		return a.At.After(restarted), "alice's announcement is from before the restart"
	})
	// bob's channel, started now, is seen by the broker.
	itest.RunApprover(t, testenv.Conn(t, ns), "bob", "ci", skip)
	itest.Eventually(t, itest.Patience, func() (bool, string) {
		rec := itest.Submit(t, e, events.Requested{Agent: "ci", Tool: "migrate", Timeout: events.Duration(time.Hour)})
		return rec.State == broker.StatePending, "bob's channel not seen after the restart: " + string(rec.State)
	})
}

// TestLimitAcrossReplicas: "auto-approve while the session's sum of
// args.amount stays under 5000", with requests racing through two replicas:
// the approved total never passes the limit, and the rest need a person.
func TestLimitAcrossReplicas(t *testing.T) {
	p := itest.MustPolicy(t, `version: 1
rules:
  - name: payments
    tools: [pay]
    action: allow
limits:
  - name: session-spend
    tools: [pay]
    per: session
    sum: args.amount
    max: 5000
    over: require_approval
`, "limits.yaml")
	ns := testenv.Server(t)
	b1, _ := itest.RunBroker(t, testenv.Conn(t, ns), broker.Config{Name: "l1", Policy: p})
	b2, _ := itest.RunBroker(t, testenv.Conn(t, ns), broker.Config{Name: "l2", Policy: p})
	const n, amount = 40, 300
	states := make([]broker.State, n)
	var wg sync.WaitGroup
	for i := range n {
		b := b1
		if i%2 == 1 {
			b = b2
		}
		wg.Go(func() {
			ctx, cancel := itest.OpCtx()
			defer cancel()
			rec, err := b.Submit(ctx, "", "agent/payer", events.Requested{Agent: "payer", Tool: "pay", Session: "s-1", Args: json.RawMessage(fmt.Sprintf(`{"amount":%d}`, amount))})
			if err != nil {
				t.Error(err)
				return
			}
			states[i] = rec.State
		})
	}
	wg.Wait()
	approved, pending := 0, 0
	for _, st := range states {
		switch st {
		case broker.StateApproved:
			approved++
		case broker.StatePending:
			pending++
		}
	}
	if approved*amount > 5000 || approved != 5000/amount || pending != n-approved {
		t.Fatalf("approved %d (total %d), pending %d of %d; want %d approved", approved, approved*amount, pending, n, 5000/amount)
	}
	// Another session has its own total.
	rec, err := b1.Submit(itest.TestCtx(t, itest.Patience), "", "agent/payer", events.Requested{Agent: "payer", Tool: "pay", Session: "s-2", Args: json.RawMessage(`{"amount":4000}`)})
	if err != nil || rec.State != broker.StateApproved {
		t.Fatalf("other session: %+v %v", rec.State, err)
	}
}

// TestShadowPolicy: the shadow policy's disagreement is recorded as an audit
// event and counted, and never acted on.
func TestShadowPolicy(t *testing.T) {
	live := itest.MustPolicy(t, "version: 1\nrules:\n  - name: reads\n    tools: [\"read_*\"]\n    action: allow\n", "live.yaml")
	shadow := itest.MustPolicy(t, "version: 1\nrules:\n  - name: no-secrets\n    tools: [read_secret]\n    action: deny\n  - name: reads\n    tools: [\"read_*\"]\n    action: allow\n", "shadow.yaml")
	e := itest.NewEnv(t, broker.Config{Policy: live, Shadow: shadow})
	same := itest.Submit(t, e, events.Requested{Tool: "read_file"})
	rec := itest.Submit(t, e, events.Requested{Tool: "read_secret"})
	if rec.State != broker.StateApproved || rec.Decision.Rule != "reads" {
		t.Fatalf("the shadow was acted on: %+v", rec.Decision)
	}
	s := itest.StreamOf(t, e.JS)
	m, err := s.GetLastMsgForSubject(itest.TestCtx(t, itest.Patience), events.ShadowPrefix+rec.ID)
	if err != nil {
		t.Fatalf("no audit event: %v", err)
	}
	ev, err := events.Decode(events.Header(m.Header), m.Data)
	if err != nil {
		t.Fatal(err)
	}
	d, err := events.DecodeData[events.ShadowDisagreement](&ev, events.TypeShadowDisagreement)
	if err != nil || d.Live != "allow by reads" || d.Shadow != "deny by no-secrets" {
		t.Fatalf("audit event %+v, %v", d, err)
	}
	if _, err := s.GetLastMsgForSubject(itest.TestCtx(t, itest.Patience), events.ShadowPrefix+same.ID); err == nil {
		t.Fatal("an agreement was recorded as a disagreement")
	}
	if n := e.B.Stats().ShadowDisagreements; n != 1 {
		t.Fatalf("counted %d disagreements, want 1", n)
	}
}

// TestEscalation: after its step's delay a pending request escalates: the
// step's approvers are told with an escalated event, the deadline is extended,
// and the request ends at the extended deadline.
func TestEscalation(t *testing.T) {
	p := itest.MustPolicy(t, `version: 1
principals:
  alice: {roles: [ops]}
  erin:  {roles: [cfo]}
rules:
  - name: wires
    tools: [wire]
    action: require_approval
    approvers: ["role:ops"]
    timeout: 3s
    escalation:
      - after: 1s
        approvers: ["role:cfo"]
        extend: 2s
`, "esc.yaml")
	e := itest.NewEnv(t, broker.Config{Policy: p})
	escalated := itest.Subscribe(t, e.NC, events.PendingPrefix+"bank")
	rec := itest.Submit(t, e, events.Requested{Agent: "bank", Tool: "wire"})
	if got := rec.Deadline.Sub(rec.ReceivedAt); got != 3*time.Second {
		t.Fatalf("initial timeout %s", got)
	}
	var esc events.Escalated
	for esc.Level == 0 {
		select {
		case m := <-escalated:
			ev, err := events.Decode(events.Header(m.Header), m.Data)
			if err != nil {
				t.Fatal(err)
			}
			if ev.Type() != events.TypeEscalated {
				continue
			}
			if esc, err = events.DecodeEscalated(&ev); err != nil {
				t.Fatal(err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("no escalated event")
		}
	}
	if esc.RequestID != rec.ID || esc.Level != 1 || len(esc.Approvers) != 1 || esc.Approvers[0] != "erin" || !esc.Deadline.Equal(rec.Deadline.Add(2*time.Second)) {
		t.Fatalf("escalated %+v (deadline was %s)", esc, rec.Deadline)
	}
	if esc.Terms == nil || esc.Terms.Quorum != 1 {
		t.Fatalf("escalated terms %+v, want a quorum of 1", esc.Terms)
	}
	cur, err := e.B.Get(itest.TestCtx(t, itest.Patience), rec.ID)
	if err != nil || cur.Level != 1 || !cur.Deadline.Equal(esc.Deadline) {
		t.Fatalf("record after escalation: %+v %v", cur, err)
	}
	final := itest.WaitState(t, e.B, rec.ID, broker.StateExpired)
	if final.Decision.DecidedAt.Before(esc.Deadline) {
		t.Fatalf("expired at %s, before the extended deadline %s", final.Decision.DecidedAt, esc.Deadline)
	}
}

// TestPendingTerms: pending events tell channels what answers the broker
// accepts: the quorum, self-approval, and what may be remembered.
func TestPendingTerms(t *testing.T) {
	p := itest.MustPolicy(t, `version: 1
rules:
  - name: file-changes
    tools: [write_file]
    action: require_approval
    quorum: 2
    allow_self_approval: true
    remember_scopes: [call, session]
    max_remember: 1h
  - name: deletions
    tools: [delete_file]
    action: require_approval
    rememberable: false
`, "terms.yaml")
	e := itest.NewEnv(t, broker.Config{Policy: p})
	pending := itest.Subscribe(t, e.NC, events.PendingPrefix+"coder")
	terms := func(tool string) *events.Terms {
		t.Helper()
		rec := itest.Submit(t, e, events.Requested{Agent: "coder", Tool: tool})
		for {
			select {
			case m := <-pending:
				p, err := itest.DecodePending(t, m.Header, m.Data)
				if err != nil {
					t.Fatal(err)
				}
				if p.RequestID == rec.ID {
					return p.Terms
				}
			case <-time.After(itest.Patience):
				t.Fatalf("no pending event for %s", tool)
			}
		}
	}
	w := terms("write_file")
	if w == nil || w.Quorum != 2 || !w.AllowSelfApproval || w.Remember == nil ||
		!slices.Equal(w.Remember.Scopes, []string{"call", "session"}) || time.Duration(w.Remember.MaxTTL) != time.Hour {
		t.Fatalf("write_file terms %+v (remember %+v)", w, w.Remember)
	}
	if d := terms("delete_file"); d == nil || d.Quorum != 1 || d.AllowSelfApproval || d.Remember != nil {
		t.Fatalf("delete_file terms %+v", d)
	}
}

// TestRememberedDenialAndArgsPattern: remember on a denial stores a remembered
// denial; an args pattern narrows a remembered approval; a count limit with a
// window is a rate limit on automatic approvals.
func TestRememberedDenialAndArgsPattern(t *testing.T) {
	e := policyEnv(t)
	deny := itest.Submit(t, e, events.Requested{Tool: "write_secret", Session: "s-9"})
	itest.ApprovalOf(t, itest.Call(t, http.MethodPost, e.API+"/v1/approvals/"+deny.ID+"/decision", itest.DecisionBody{Principal: "alice", Responded: events.Responded{Decision: events.Deny, Reason: "never", Remember: &events.Remember{Scope: events.ScopeSession, TTL: events.Duration(time.Hour)}}}), http.StatusOK)
	if again := itest.Submit(t, e, events.Requested{Tool: "write_secret", Session: "s-9"}); again.State != broker.StateDenied || !again.Decision.Auto || !strings.HasPrefix(again.Decision.Rule, "remembered:") {
		t.Fatalf("remembered denial: %+v", again.Decision)
	}

	first := itest.Submit(t, e, events.Requested{Tool: "write_file", Session: "s-10", Args: json.RawMessage(`{"path":"/tmp/a"}`)})
	itest.ApprovalOf(t, itest.Call(t, http.MethodPost, e.API+"/v1/approvals/"+first.ID+"/decision", itest.DecisionBody{Principal: "alice", Responded: events.Responded{Decision: events.Approve, Remember: &events.Remember{Scope: events.ScopeSession, TTL: events.Duration(time.Hour), Args: json.RawMessage(`{"path":"/tmp/*"}`)}}}), http.StatusOK)
	if in := itest.Submit(t, e, events.Requested{Tool: "write_file", Session: "s-10", Args: json.RawMessage(`{"path":"/tmp/b"}`)}); in.State != broker.StateApproved {
		t.Fatalf("inside the pattern: %s", in.State)
	}
	if out := itest.Submit(t, e, events.Requested{Tool: "write_file", Session: "s-10", Args: json.RawMessage(`{"path":"/etc/passwd"}`)}); out.State != broker.StatePending {
		t.Fatalf("outside the pattern: %s", out.State)
	}
}

func TestRateLimit(t *testing.T) {
	p := itest.MustPolicy(t, `version: 1
mode: auto-approve
limits:
  - name: per-agent-rate
    per: agent
    max: 3
    window: 2s
    over: deny
`, "rate.yaml")
	e := itest.NewEnv(t, broker.Config{Policy: p})
	states := func() (out []broker.State) {
		for range 5 {
			out = append(out, itest.Submit(t, e, events.Requested{Agent: "fast", Tool: "x"}).State)
		}
		return out
	}
	want := []broker.State{broker.StateApproved, broker.StateApproved, broker.StateApproved, broker.StateDenied, broker.StateDenied}
	if got := states(); !slices.Equal(got, want) {
		t.Fatalf("first window: %v", got)
	}
	time.Sleep(2100 * time.Millisecond)
	if got := states(); !slices.Equal(got, want) {
		t.Fatalf("next window: %v", got)
	}
}

// TestBadPolicyStopsStart: a broken policy file stops the process at start
// with the file, line and reason.
func TestBadPolicyStopsStart(t *testing.T) {
	file := filepath.Join(t.TempDir(), "broken.yaml")
	if err := os.WriteFile(file, []byte("version: 1\nrules:\n  - name: x\n    tools: [a]\n    action: maybe\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	err := app.Run(itest.TestCtx(t, itest.Patience), app.Options{NATSListen: "127.0.0.1:0", DataDir: t.TempDir(), PolicyFile: file}, testenv.Logger(t))
	if err == nil || !strings.Contains(err.Error(), "broken.yaml:5:") || !strings.Contains(err.Error(), "maybe") {
		t.Fatalf("start with a broken policy: %v", err)
	}
}

// TestRememberedCommands lists and revokes remembered choices the way
// `broker remembered` does, against a running broker.
func TestRememberedCommands(t *testing.T) {
	a := itest.StartApp(t, app.Options{NATSListen: "127.0.0.1:0", DataDir: t.TempDir(), HTTPListen: "127.0.0.1:0"})
	var out bytes.Buffer
	if err := app.RememberedList(itest.TestCtx(t, itest.Patience), &out, app.API{URL: a.HTTP}); err != nil || !strings.Contains(out.String(), "no remembered choices") {
		t.Fatalf("empty list: %q %v", out.String(), err)
	}
	rec := itest.ApprovalOf(t, itest.Call(t, http.MethodPost, a.HTTP+"/v1/approvals", map[string]any{"agent": "cmd", "tool": "deploy", "session": "s-1"}), http.StatusCreated)
	itest.ApprovalOf(t, itest.Call(t, http.MethodPost, a.HTTP+"/v1/approvals/"+rec.ID+"/decision", itest.DecisionBody{Principal: "alice", Responded: events.Responded{Decision: events.Approve, Remember: &events.Remember{Scope: events.ScopeSession, TTL: events.Duration(time.Hour)}}}), http.StatusOK)
	var listed struct{ Remembered []policy.Grant }
	itest.Eventually(t, 10*time.Second, func() (bool, string) {
		_ = json.Unmarshal(itest.Call(t, http.MethodGet, a.HTTP+"/v1/remembered", nil).Body, &listed)
		return len(listed.Remembered) == 1, "grant not listed"
	})
	out.Reset()
	if err := app.RememberedList(itest.TestCtx(t, itest.Patience), &out, app.API{URL: a.HTTP}); err != nil || !strings.Contains(out.String(), listed.Remembered[0].ID) || !strings.Contains(out.String(), "session=s-1") {
		t.Fatalf("list: %q %v", out.String(), err)
	}
	out.Reset()
	if err := app.RememberedRevoke(itest.TestCtx(t, itest.Patience), &out, app.API{URL: a.HTTP}, listed.Remembered[0].ID); err != nil || !strings.HasPrefix(out.String(), "revoked "+listed.Remembered[0].ID) {
		t.Fatalf("revoke: %q %v", out.String(), err)
	}
	if err := app.RememberedRevoke(itest.TestCtx(t, itest.Patience), &out, app.API{URL: a.HTTP}, listed.Remembered[0].ID); err == nil || !strings.Contains(err.Error(), "not_found") {
		t.Fatalf("revoke twice: %v", err)
	}
}
