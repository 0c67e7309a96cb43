package integration

import (
	"fmt"
	"net/http"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/assent-dev/assent/integration/itest"
	"github.com/assent-dev/assent/internal/broker"
	"github.com/assent-dev/assent/internal/clustertest"
	"github.com/assent-dev/assent/internal/testenv"
	"github.com/assent-dev/assent/pkg/events"
)

// TestBrokerRestartWhilePending stops the only broker while a request is
// pending, lets its deadline pass with no broker running, and starts a new
// broker on the same NATS: the request is expired at once, and it has exactly
// one decision. The second case restarts the NATS server too.
func TestBrokerRestartWhilePending(t *testing.T) {
	for _, restartNATS := range []bool{false, true} {
		t.Run(fmt.Sprintf("restart-nats=%v", restartNATS), func(t *testing.T) {
			ns := testenv.Server(t)
			b1, stop1 := itest.RunBroker(t, testenv.Conn(t, ns), broker.Config{Name: "first"})
			ctx := itest.TestCtx(t, time.Minute)
			rec, err := b1.Submit(ctx, "", "test/restart", events.Requested{Tool: "rm", Agent: "restarter", Timeout: events.Duration(time.Second)})
			if err != nil {
				t.Fatal(err)
			}
			if rec.State != broker.StatePending {
				t.Fatalf("state %s", rec.State)
			}
			stop1()
			if restartNATS {
				ns = ns.Restart(t)
			}
			check := testenv.Conn(t, ns)
			js := itest.NewJS(t, check)

			// No broker runs while the deadline passes (and the durable schedule,
			// whole-second resolution, fires).
			time.Sleep(time.Until(rec.Deadline.Add(1500 * time.Millisecond)))
			if _, ok := itest.StoredDecision(t, js, rec.ID); ok {
				t.Fatal("a decision exists although no broker ran")
			}

			b2, _ := itest.RunBroker(t, testenv.Conn(t, ns), broker.Config{Name: "second"})
			restarted := time.Now()
			final := itest.WaitRecord(t, b2, rec.ID, func(r broker.Record) bool { return r.State.Terminal() })
			t.Logf("expired %s after the new broker was ready", time.Since(restarted))
			if final.State != broker.StateExpired || final.Decision.Outcome != events.Expired {
				t.Fatalf("after restart the request is %s", final.State)
			}
			if final.Decision.DecidedAt.Before(rec.Deadline) {
				t.Fatalf("expired at %s, before the deadline %s", final.Decision.DecidedAt, rec.Deadline)
			}
			d := itest.WaitDecision(t, js, rec.ID)
			if d.Outcome != events.Expired || !d.DecidedAt.Equal(final.Decision.DecidedAt) {
				t.Fatalf("stream holds %+v, record says %+v", d, final.Decision)
			}
			// Both the recovered local timer and the fired durable schedule
			// expire it; still one decision.
			itest.WaitBrokerIdle(t, js)
			if n := itest.CountDecisions(t, js, rec.ID); n != 1 {
				t.Fatalf("%d decided messages on %s, want 1", n, rec.ID)
			}
		})
	}
}

// TestBrokerKill9 runs the real broker binary, creates a request with a 3s
// timeout and an approval acknowledged over HTTP, kills the process with
// SIGKILL, and restarts it on the same data directory and ports: the
// acknowledged approval is still there, and the pending request is expired on
// time with exactly one decision.
func TestBrokerKill9(t *testing.T) {
	bin := itest.BrokerBinary(t)
	dir := filepath.Join(t.TempDir(), "data")
	natsPort, httpPort := clustertest.FreePort(t), clustertest.FreePort(t)
	api := "http://127.0.0.1:" + strconv.Itoa(httpPort)
	var out itest.LockedBuffer
	defer func() {
		if t.Failed() {
			t.Logf("broker output:\n%s", out.String())
		}
	}()

	p := itest.StartBrokerProc(t, bin, itest.EmbeddedArgs(dir, natsPort), httpPort, &out)
	approved := itest.ApprovalOf(t, itest.Call(t, http.MethodPost, api+"/v1/approvals", map[string]any{
		"agent": "killer", "tool": "deploy", "args": map[string]any{"env": "staging"}, "timeout": "5m",
	}), http.StatusCreated)
	ack := itest.ApprovalOf(t, itest.Call(t, http.MethodPost, api+"/v1/approvals/"+approved.ID+"/decision", itest.DecisionBody{Principal: "alice", Responded: events.Responded{Decision: events.Approve, Reason: "ship it"}}), http.StatusOK)
	if ack.State != broker.StateApproved {
		t.Fatalf("approval answered with %+v", ack)
	}
	pending := itest.ApprovalOf(t, itest.Call(t, http.MethodPost, api+"/v1/approvals", map[string]any{
		"agent": "killer", "tool": "rm", "args": map[string]any{"path": "/srv"}, "timeout": "3s",
	}), http.StatusCreated)
	if pending.State != broker.StatePending || pending.Deadline.Sub(pending.ReceivedAt) != 3*time.Second {
		t.Fatalf("created %+v", pending)
	}

	p.Kill(t)
	t.Logf("killed %s before the deadline", time.Until(pending.Deadline))
	itest.StartBrokerProc(t, bin, itest.EmbeddedArgs(dir, natsPort), httpPort, &out)

	// The acknowledged approval survived.
	got := itest.ApprovalOf(t, itest.Call(t, http.MethodGet, api+"/v1/approvals/"+approved.ID, nil), http.StatusOK)
	if got.State != broker.StateApproved || got.Decision == nil || got.Decision.DecidedBy[0].Principal != "alice" || !got.Decision.DecidedAt.Equal(ack.Decision.DecidedAt) {
		t.Fatalf("after the restart the acknowledged approval reads %+v", got)
	}

	// The pending request ends expired, on time.
	var final struct {
		State    broker.State    `json:"state"`
		Decision *events.Decided `json:"decision"`
	}
	itest.Eventually(t, itest.Patience, func() (bool, string) {
		r := itest.Call(t, http.MethodGet, api+"/v1/approvals/"+pending.ID+"?wait=5s", nil)
		a := itest.ApprovalOf(t, r, http.StatusOK)
		final.State, final.Decision = a.State, a.Decision
		return a.State != broker.StatePending, "still pending"
	})
	if final.State != broker.StateExpired {
		t.Fatalf("after the restart the request ended %s (%+v)", final.State, final.Decision)
	}
	late := final.Decision.DecidedAt.Sub(pending.Deadline)
	t.Logf("expired %s after its deadline", late)
	if late < 0 || late > 10*time.Second {
		t.Fatalf("expired %s after the deadline, want within [0, 10s]", late)
	}

	nc, err := nats.Connect("nats://127.0.0.1:" + strconv.Itoa(natsPort))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js := itest.NewJS(t, nc)
	for _, id := range []string{approved.ID, pending.ID} {
		d := itest.WaitDecision(t, js, id)
		if id == pending.ID && d.Outcome != events.Expired || id == approved.ID && d.Outcome != events.Approved {
			t.Fatalf("stream holds %+v for %s", d, id)
		}
	}
	// A message the killed process had not acknowledged yet comes back only
	// after the consumer's 30s AckWait; everything else must be settled.
	itest.WaitIdle(t, js, true, itest.BrokerConsumers...)
	for _, id := range []string{approved.ID, pending.ID} {
		if n := itest.CountDecisions(t, js, id); n != 1 {
			t.Fatalf("%d decided messages on %s, want 1", n, id)
		}
	}
}

// TestBrokerKill9WithRequestInFlight crashes the broker (on an external NATS
// server, as in production) while a request has been handed to it but not yet
// handled: the process is frozen (SIGSTOP), a request with a 3s timeout is
// published and delivered to it, then the process is killed (SIGKILL) and
// restarted. Invariant 3 (every request decided by its deadline, across
// restarts) wants the request expired at its deadline, not whenever JetStream
// gives up waiting for the dead process's acknowledgement (the requests
// consumer's AckWait, 30s): by then the SDK has long returned ErrNoDecision.
func TestBrokerKill9WithRequestInFlight(t *testing.T) {
	bin := itest.BrokerBinary(t)
	// NATS runs here, apart from the broker: freezing the broker must not
	// freeze JetStream.
	ns := testenv.Server(t)
	args := []string{"--nats-url", ns.ClientURL()}
	httpPort := clustertest.FreePort(t)
	var out itest.LockedBuffer
	defer func() {
		if t.Failed() {
			t.Logf("broker output:\n%s", out.String())
		}
	}()
	p := itest.StartBrokerProc(t, bin, args, httpPort, &out)
	js := itest.NewJS(t, testenv.Conn(t, ns))

	if err := p.Cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	id := events.NewID()
	subj, _ := events.RequestSubject("inflight")
	itest.MustPublish(t, js, subj, itest.RawEvent(id, events.TypeRequested, "agent/inflight", `{"tool":"rm","timeout":"3s"}`), id)
	published := time.Now()
	// The frozen broker's pull request takes the message: delivered, unacked.
	waitAckPending := func() bool {
		deadline := time.Now().Add(itest.Patience)
		for time.Now().Before(deadline) {
			ctx, cancel := itest.OpCtx()
			cons, err := js.Consumer(ctx, broker.StreamName, "assent-broker-requests")
			if err == nil {
				info, err := cons.Info(ctx)
				if err == nil && info.NumAckPending == 1 {
					cancel()
					return true
				}
			}
			cancel()
			time.Sleep(20 * time.Millisecond)
		}
		return false
	}
	if !waitAckPending() {
		t.Skip("the frozen broker had no pull request outstanding; the message was not handed to it")
	}
	p.Kill(t)
	itest.StartBrokerProc(t, bin, args, httpPort, &out)

	deadline := published.Add(3 * time.Second)
	bound := deadline.Add(8 * time.Second)
	for {
		if d, ok := itest.StoredDecision(t, js, id); ok {
			late := d.DecidedAt.Sub(deadline)
			t.Logf("decided %s %s after the deadline", d.Outcome, late)
			if d.Outcome != events.Expired || late > 8*time.Second {
				t.Fatalf("decided %s %s after the deadline: %+v", d.Outcome, late, d)
			}
			break
		}
		if time.Now().After(bound) {
			ctx, cancel := itest.OpCtx()
			defer cancel()
			cons, err := js.Consumer(ctx, broker.StreamName, "assent-broker-requests")
			if err != nil {
				t.Fatal(err)
			}
			info, err := cons.Info(ctx)
			if err != nil {
				t.Fatal(err)
			}
			t.Fatalf("no decision 8s after the deadline of a 3s request: the message handed to the killed broker waits out the consumer's AckWait (%s) before the new broker sees it (requests consumer: %d awaiting ack, %d pending)",
				info.Config.AckWait, info.NumAckPending, info.NumPending)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if n := itest.CountDecisions(t, js, id); n != 1 {
		t.Fatalf("%d decided messages, want 1", n)
	}
}
