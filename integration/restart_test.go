package integration

import (
	"bytes"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

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
			b1, stop1 := runBroker(t, testenv.Conn(t, ns), broker.Config{Name: "first"})
			ctx := testCtx(t, time.Minute)
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
			js := newJS(t, check)

			// No broker runs while the deadline passes (and the durable schedule,
			// whole-second resolution, fires).
			time.Sleep(time.Until(rec.Deadline.Add(1500 * time.Millisecond)))
			if _, ok := storedDecision(t, js, rec.ID); ok {
				t.Fatal("a decision exists although no broker ran")
			}

			b2, _ := runBroker(t, testenv.Conn(t, ns), broker.Config{Name: "second"})
			restarted := time.Now()
			final := waitRecord(t, b2, rec.ID, func(r broker.Record) bool { return r.State.Terminal() })
			t.Logf("expired %s after the new broker was ready", time.Since(restarted))
			if final.State != broker.StateExpired || final.Decision.Outcome != events.Expired {
				t.Fatalf("after restart the request is %s", final.State)
			}
			if final.Decision.DecidedAt.Before(rec.Deadline) {
				t.Fatalf("expired at %s, before the deadline %s", final.Decision.DecidedAt, rec.Deadline)
			}
			d := waitDecision(t, js, rec.ID)
			if d.Outcome != events.Expired || !d.DecidedAt.Equal(final.Decision.DecidedAt) {
				t.Fatalf("stream holds %+v, record says %+v", d, final.Decision)
			}
			// Both the recovered local timer and the fired durable schedule
			// expire it; still one decision.
			waitBrokerIdle(t, js)
			if n := countDecisions(t, js, rec.ID); n != 1 {
				t.Fatalf("%d decided messages on %s, want 1", n, rec.ID)
			}
		})
	}
}

// proc is a built program of cmd/ running as a child process.
type proc struct {
	cmd  *exec.Cmd
	done chan struct{}
	err  error // what Wait returned, once done is closed
}

// embeddedArgs are the broker's flags for an embedded NATS server with its
// data in dir, listening on natsPort.
func embeddedArgs(dir string, natsPort int) []string {
	return []string{"--data", dir, "--nats-listen", "127.0.0.1:" + strconv.Itoa(natsPort)}
}

// startBrokerProc runs the broker binary with args and HTTP on httpPort, and
// waits until /readyz says so. The process is killed at cleanup if it still
// runs.
func startBrokerProc(t testing.TB, bin string, args []string, httpPort int, log *lockedBuffer) *proc {
	t.Helper()
	return startProc(t, "broker", func() *exec.Cmd {
		return exec.Command(bin, append([]string{
			"--http", "127.0.0.1:" + strconv.Itoa(httpPort),
			"--name", "killme",
			"--log-level", "warn"}, args...)...)
	}, "http://127.0.0.1:"+strconv.Itoa(httpPort), log)
}

// startProc starts the command newCmd makes, with its output to log, and
// waits until base/readyz answers 200. The process is killed at cleanup if
// it still runs.
func startProc(t testing.TB, name string, newCmd func() *exec.Cmd, base string, log *lockedBuffer) *proc {
	t.Helper()
	// A port of the killed process can linger for a moment; try a few times.
	for attempt := 1; ; attempt++ {
		cmd := newCmd()
		cmd.Stdout, cmd.Stderr = log, log
		if err := cmd.Start(); err != nil {
			t.Fatalf("start %s: %v", name, err)
		}
		p := &proc{cmd: cmd, done: make(chan struct{})}
		go func() { p.err = cmd.Wait(); close(p.done) }()
		t.Cleanup(func() { p.kill(t) })
		ready := false
		deadline := time.Now().Add(patience)
		for !ready && time.Now().Before(deadline) {
			select {
			case <-p.done:
				deadline = time.Time{}
				continue
			case <-time.After(50 * time.Millisecond):
			}
			if resp, err := http.Get(base + "/readyz"); err == nil {
				ready = resp.StatusCode == http.StatusOK
				resp.Body.Close()
			}
		}
		if ready {
			return p
		}
		p.kill(t)
		if attempt == 5 {
			t.Fatalf("%s process not ready (attempt %d, exit %v); its output:\n%s", name, attempt, p.err, log.String())
		}
	}
}

// stop sends SIGTERM and waits for the process to exit, which it must do
// with status 0.
func (p *proc) stop(t testing.TB) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatalf("SIGTERM: %v", err)
	}
	select {
	case <-p.done:
		if p.err != nil {
			t.Fatalf("process %d after SIGTERM: %v", p.cmd.Process.Pid, p.err)
		}
	case <-time.After(patience):
		t.Fatalf("process %d still running %s after SIGTERM", p.cmd.Process.Pid, patience)
	}
}

// kill sends SIGKILL and waits for the process to be gone.
func (p *proc) kill(t testing.TB) {
	t.Helper()
	select {
	case <-p.done:
		return
	default:
	}
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil && !errors.Is(err, os.ErrProcessDone) {
		t.Errorf("kill process %d: %v", p.cmd.Process.Pid, err)
	}
	select {
	case <-p.done:
	case <-time.After(patience):
		t.Errorf("process %d still running after SIGKILL", p.cmd.Process.Pid)
	}
}

// lockedBuffer is a bytes.Buffer safe for the child's two output pipes.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// TestBrokerKill9 runs the real broker binary, creates a request with a 3s
// timeout and an approval acknowledged over HTTP, kills the process with
// SIGKILL, and restarts it on the same data directory and ports: the
// acknowledged approval is still there, and the pending request is expired on
// time with exactly one decision.
func TestBrokerKill9(t *testing.T) {
	bin := brokerBinary(t)
	dir := filepath.Join(t.TempDir(), "data")
	natsPort, httpPort := clustertest.FreePort(t), clustertest.FreePort(t)
	api := "http://127.0.0.1:" + strconv.Itoa(httpPort)
	var out lockedBuffer
	defer func() {
		if t.Failed() {
			t.Logf("broker output:\n%s", out.String())
		}
	}()

	p := startBrokerProc(t, bin, embeddedArgs(dir, natsPort), httpPort, &out)
	approved := approvalOf(t, call(t, http.MethodPost, api+"/v1/approvals", map[string]any{
		"agent": "killer", "tool": "deploy", "args": map[string]any{"env": "staging"}, "timeout": "5m",
	}), http.StatusCreated)
	ack := approvalOf(t, call(t, http.MethodPost, api+"/v1/approvals/"+approved.ID+"/decision", decisionBody{"alice", events.Responded{Decision: events.Approve, Reason: "ship it"}}), http.StatusOK)
	if ack.State != broker.StateApproved {
		t.Fatalf("approval answered with %+v", ack)
	}
	pending := approvalOf(t, call(t, http.MethodPost, api+"/v1/approvals", map[string]any{
		"agent": "killer", "tool": "rm", "args": map[string]any{"path": "/srv"}, "timeout": "3s",
	}), http.StatusCreated)
	if pending.State != broker.StatePending || pending.Deadline.Sub(pending.ReceivedAt) != 3*time.Second {
		t.Fatalf("created %+v", pending)
	}

	p.kill(t)
	t.Logf("killed %s before the deadline", time.Until(pending.Deadline))
	startBrokerProc(t, bin, embeddedArgs(dir, natsPort), httpPort, &out)

	// The acknowledged approval survived.
	got := approvalOf(t, call(t, http.MethodGet, api+"/v1/approvals/"+approved.ID, nil), http.StatusOK)
	if got.State != broker.StateApproved || got.Decision == nil || got.Decision.DecidedBy[0].Principal != "alice" || !got.Decision.DecidedAt.Equal(ack.Decision.DecidedAt) {
		t.Fatalf("after the restart the acknowledged approval reads %+v", got)
	}

	// The pending request ends expired, on time.
	var final struct {
		State    broker.State    `json:"state"`
		Decision *events.Decided `json:"decision"`
	}
	eventually(t, patience, func() (bool, string) {
		r := call(t, http.MethodGet, api+"/v1/approvals/"+pending.ID+"?wait=5s", nil)
		a := approvalOf(t, r, http.StatusOK)
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
	js := newJS(t, nc)
	for _, id := range []string{approved.ID, pending.ID} {
		d := waitDecision(t, js, id)
		if id == pending.ID && d.Outcome != events.Expired || id == approved.ID && d.Outcome != events.Approved {
			t.Fatalf("stream holds %+v for %s", d, id)
		}
	}
	// A message the killed process had not acknowledged yet comes back only
	// after the consumer's 30s AckWait; everything else must be settled.
	waitIdle(t, js, true, brokerConsumers...)
	for _, id := range []string{approved.ID, pending.ID} {
		if n := countDecisions(t, js, id); n != 1 {
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
	bin := brokerBinary(t)
	// NATS runs here, apart from the broker: freezing the broker must not
	// freeze JetStream.
	ns := testenv.Server(t)
	args := []string{"--nats-url", ns.ClientURL()}
	httpPort := clustertest.FreePort(t)
	var out lockedBuffer
	defer func() {
		if t.Failed() {
			t.Logf("broker output:\n%s", out.String())
		}
	}()
	p := startBrokerProc(t, bin, args, httpPort, &out)
	js := newJS(t, testenv.Conn(t, ns))

	if err := p.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	id := events.NewID()
	subj, _ := events.RequestSubject("inflight")
	mustPublish(t, js, subj, rawEvent(id, events.TypeRequested, "agent/inflight", `{"tool":"rm","timeout":"3s"}`), id)
	published := time.Now()
	// The frozen broker's pull request takes the message: delivered, unacked.
	waitAckPending := func() bool {
		deadline := time.Now().Add(patience)
		for time.Now().Before(deadline) {
			ctx, cancel := opCtx()
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
	p.kill(t)
	startBrokerProc(t, bin, args, httpPort, &out)

	deadline := published.Add(3 * time.Second)
	bound := deadline.Add(8 * time.Second)
	for {
		if d, ok := storedDecision(t, js, id); ok {
			late := d.DecidedAt.Sub(deadline)
			t.Logf("decided %s %s after the deadline", d.Outcome, late)
			if d.Outcome != events.Expired || late > 8*time.Second {
				t.Fatalf("decided %s %s after the deadline: %+v", d.Outcome, late, d)
			}
			break
		}
		if time.Now().After(bound) {
			ctx, cancel := opCtx()
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
	if n := countDecisions(t, js, id); n != 1 {
		t.Fatalf("%d decided messages, want 1", n)
	}
}

// built holds the programs of cmd/ that binary built, once per test binary,
// in one temporary directory that TestMain removes.
var built struct {
	mu    sync.Mutex
	dir   string
	paths map[string]string
}

// brokerBinary returns cmd/broker, built.
func brokerBinary(t testing.TB) string {
	t.Helper()
	return binary(t, "broker")
}

// binary builds ./cmd/<name> with the go command (once per test binary) and
// returns its path. It skips the test when go is not on PATH.
func binary(t testing.TB, name string) string {
	t.Helper()
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("go is not on PATH; cannot build cmd/" + name)
	}
	built.mu.Lock()
	defer built.mu.Unlock()
	if p, ok := built.paths[name]; ok {
		return p
	}
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("module root not found at %s: %v", root, err)
	}
	if built.dir == "" {
		if built.dir, err = os.MkdirTemp("", "assent-itest-bin-"); err != nil {
			t.Fatal(err)
		}
		built.paths = map[string]string{}
	}
	path := filepath.Join(built.dir, name)
	cmd := exec.Command(gobin, "build", "-o", path, "./cmd/"+name)
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/%s: %v\n%s", name, err, out)
	}
	built.paths[name] = path
	return path
}
