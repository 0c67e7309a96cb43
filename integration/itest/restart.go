package itest

import (
	"bytes"
	"errors"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Proc is a built program of cmd/ running as a child process.
type Proc struct {
	Cmd  *exec.Cmd
	Done chan struct{}
	Err  error // what Wait returned, once done is closed
}

// EmbeddedArgs are the broker's flags for an embedded NATS server with its
// data in dir, listening on natsPort.
func EmbeddedArgs(dir string, natsPort int) []string {
	return []string{"--data", dir, "--nats-listen", "127.0.0.1:" + strconv.Itoa(natsPort)}
}

// StartBrokerProc runs the broker binary with args and HTTP on httpPort, and
// waits until /readyz says so. The process is killed at cleanup if it still
// runs.
func StartBrokerProc(t testing.TB, bin string, args []string, httpPort int, log *LockedBuffer) *Proc {
	t.Helper()
	return StartProc(t, "broker", func() *exec.Cmd {
		return exec.Command(bin, append([]string{
			"--http", "127.0.0.1:" + strconv.Itoa(httpPort),
			"--name", "killme",
			"--log-level", "warn"}, args...)...)
	}, "http://127.0.0.1:"+strconv.Itoa(httpPort), log)
}

// StartProc starts the command newCmd makes, with its output to log, and
// waits until base/readyz answers 200. The process is killed at cleanup if
// it still runs.
func StartProc(t testing.TB, name string, newCmd func() *exec.Cmd, base string, log *LockedBuffer) *Proc {
	t.Helper()
	// A port of the killed process can linger for a moment; try a few times.
	for attempt := 1; ; attempt++ {
		cmd := newCmd()
		cmd.Stdout, cmd.Stderr = log, log
		if err := cmd.Start(); err != nil {
			t.Fatalf("start %s: %v", name, err)
		}
		p := &Proc{Cmd: cmd, Done: make(chan struct{})}
		go func() { p.Err = cmd.Wait(); close(p.Done) }()
		t.Cleanup(func() { p.Kill(t) })
		ready := false
		deadline := time.Now().Add(Patience)
		for !ready && time.Now().Before(deadline) {
			select {
			case <-p.Done:
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
		p.Kill(t)
		if attempt == 5 {
			t.Fatalf("%s process not ready (attempt %d, exit %v); its output:\n%s", name, attempt, p.Err, log.String())
		}
	}
}

// Stop sends SIGTERM and waits for the process to exit, which it must do
// with status 0.
func (p *Proc) Stop(t testing.TB) {
	t.Helper()
	if err := p.Cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatalf("SIGTERM: %v", err)
	}
	select {
	case <-p.Done:
		if p.Err != nil {
			t.Fatalf("process %d after SIGTERM: %v", p.Cmd.Process.Pid, p.Err)
		}
	case <-time.After(Patience):
		t.Fatalf("process %d still running %s after SIGTERM", p.Cmd.Process.Pid, Patience)
	}
}

// Kill sends SIGKILL and waits for the process to be gone.
func (p *Proc) Kill(t testing.TB) {
	t.Helper()
	select {
	case <-p.Done:
		return
	default:
	}
	if err := p.Cmd.Process.Signal(syscall.SIGKILL); err != nil && !errors.Is(err, os.ErrProcessDone) {
		t.Errorf("kill process %d: %v", p.Cmd.Process.Pid, err)
	}
	select {
	case <-p.Done:
	case <-time.After(Patience):
		t.Errorf("process %d still running after SIGKILL", p.Cmd.Process.Pid)
	}
}

// LockedBuffer is a bytes.Buffer safe for the child's two output pipes.
type LockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *LockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *LockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// built holds the programs of cmd/ that binary built, once per test binary,
// in one temporary directory that TestMain removes.
var built struct {
	mu    sync.Mutex
	dir   string
	paths map[string]string
}

// BrokerBinary returns cmd/broker, built.
func BrokerBinary(t testing.TB) string {
	t.Helper()
	return Binary(t, "broker")
}

// Binary builds ./cmd/<name> with the go command (once per test binary) and
// returns its path. It skips the test when go is not on PATH.
func Binary(t testing.TB, name string) string {
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
	root, err := filepath.Abs(RepoRoot())
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
