package clustertest

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// BuildBroker builds ./cmd/broker of this module into a directory of t's and
// returns its path. Builds after the first reuse the go command's cache. It
// skips the test when go is not on PATH.
func BuildBroker(t testing.TB) string {
	t.Helper()
	return goBuild(t, "./cmd/broker", "broker")
}

// BuildNATSServer builds nats-server, at the version this module requires,
// into a directory of t's and returns its path, for a cluster whose nodes
// are processes (Config.Binary). It skips the test when go is not on PATH.
func BuildNATSServer(t testing.TB) string {
	t.Helper()
	return goBuild(t, "github.com/nats-io/nats-server/v2", "nats-server")
}

// goBuild builds pkg inside this module as name in a directory of t's.
func goBuild(t testing.TB, pkg, name string) string {
	t.Helper()
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("go is not on PATH; cannot build %s", pkg)
	}
	out, err := exec.Command(gobin, "env", "GOMOD").Output()
	if err != nil {
		t.Fatalf("go env GOMOD: %v", err)
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == os.DevNull {
		t.Fatal("not inside the module: go env GOMOD is empty")
	}
	path := filepath.Join(t.TempDir(), name)
	cmd := exec.Command(gobin, "build", "-o", path, pkg)
	cmd.Dir = filepath.Dir(gomod)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build %s: %v\n%s", pkg, err, out)
	}
	return path
}

// ReplicaConfig configures one broker replica process.
type ReplicaConfig struct {
	// Binary is the built cmd/broker (BuildBroker). Required.
	Binary string
	// Name is the replica's --name. Required.
	Name string
	// NATSURL is the replica's --nats-url: Cluster.URL(), or a proxy's URL.
	// Required.
	NATSURL string
	// Replicas is --replicas, the stream's and buckets' replication.
	// Default 3.
	Replicas int
	// HTTPPort is where its HTTP API listens (--http 127.0.0.1:<port>), the
	// same across restarts. Default: a free port.
	HTTPPort int
	// Args are more flags: --policy FILE, --log-level, --workers, ...
	Args []string
	// LogDir receives the replica's output, appended to <Name>.log across
	// restarts. Default: a directory of the test's.
	LogDir string
}

// Replica is a broker replica running as a child process, which can be
// killed and started again with the same flags. Its methods may be called
// from any goroutine.
type Replica struct {
	Name string
	// HTTP is the base URL of its HTTP API, http://127.0.0.1:<port>.
	HTTP string
	// LogFile holds its output.
	LogFile string

	args []string
	bin  string

	mu     sync.Mutex
	cur    *process // nil when not running
	starts int
	kills  int
}

// process is one run of a replica.
type process struct {
	cmd  *exec.Cmd
	log  *os.File
	done chan struct{}
	err  error // what Wait returned, once done is closed
}

// StartReplica starts a replica with cfg and waits until its /readyz says
// it is ready. It is killed (SIGKILL) when the test ends if it still runs.
func StartReplica(t testing.TB, cfg ReplicaConfig) *Replica {
	t.Helper()
	r := NewReplica(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), Patience)
	defer cancel()
	if err := r.Start(ctx); err != nil {
		t.Fatal(err)
	}
	return r
}

// NewReplica prepares a replica with cfg without starting it; Start starts
// it. It is killed when the test ends if it runs then.
func NewReplica(t testing.TB, cfg ReplicaConfig) *Replica {
	t.Helper()
	var errs []error
	if cfg.Binary == "" {
		errs = append(errs, errors.New("binary: required (BuildBroker)"))
	}
	if cfg.Name == "" {
		errs = append(errs, errors.New("name: required"))
	}
	if cfg.NATSURL == "" {
		errs = append(errs, errors.New("NATS URL: required"))
	}
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("replica config: %v", err)
	}
	if cfg.Replicas == 0 {
		cfg.Replicas = 3
	}
	if cfg.HTTPPort == 0 {
		cfg.HTTPPort = FreePort(t)
	}
	if cfg.LogDir == "" {
		cfg.LogDir = t.TempDir()
	}
	httpAddr := "127.0.0.1:" + strconv.Itoa(cfg.HTTPPort)
	r := &Replica{
		Name:    cfg.Name,
		HTTP:    "http://" + httpAddr,
		LogFile: filepath.Join(cfg.LogDir, cfg.Name+".log"),
		bin:     cfg.Binary,
		args: append([]string{
			"--nats-url", cfg.NATSURL,
			"--replicas", strconv.Itoa(cfg.Replicas),
			"--http", httpAddr,
			"--name", cfg.Name,
		}, cfg.Args...),
	}
	t.Cleanup(func() { _ = r.Kill() })
	return r
}

// Args returns the flags the replica runs with.
func (r *Replica) Args() []string { return append([]string(nil), r.args...) }

// Start starts the replica (if it does not run) and waits until /readyz
// answers 200. Its HTTP port may linger after a kill, so a process that
// exits before it is ready is started again until ctx ends.
func (r *Replica) Start(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cur != nil {
		return nil
	}
	for {
		p, err := r.spawn()
		if err != nil {
			return err
		}
		err = r.waitReady(ctx, p)
		if err == nil {
			r.cur = p
			r.starts++
			return nil
		}
		p.kill()
		if ctx.Err() != nil {
			// The log goes with the test's directory: say what it shows.
			return fmt.Errorf("replica %s not ready: %w; the last lines of its log (%s):\n%s", r.Name, err, r.LogFile, Tail(r.Output(), readyTail))
		}
		select {
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// readyTail is how many lines of its log a replica that did not get ready
// reports.
const readyTail = 60

// Tail returns the last n lines of s.
func Tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func (r *Replica) spawn() (*process, error) {
	f, err := os.OpenFile(r.LogFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(f, "=== clustertest: start %s %s\n", r.Name, time.Now().UTC().Format(time.RFC3339Nano))
	cmd := exec.Command(r.bin, r.args...)
	cmd.Stdout, cmd.Stderr = f, f
	dieWithParent(cmd)
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("start replica %s: %w", r.Name, err)
	}
	p := &process{cmd: cmd, log: f, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		f.Close()
		close(p.done)
	}()
	return p, nil
}

// waitReady polls /readyz until it answers 200, the process exits or ctx ends.
func (r *Replica) waitReady(ctx context.Context, p *process) error {
	client := &http.Client{Timeout: 2 * time.Second}
	for {
		select {
		case <-p.done:
			return fmt.Errorf("exited before it was ready: %v", p.err)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, r.HTTP+"/readyz", nil)
		resp, err := client.Do(req)
		if err != nil {
			continue
		}
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			return nil
		}
	}
}

// Kill sends SIGKILL and waits until the process is gone. Killing a replica
// that does not run does nothing.
func (r *Replica) Kill() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	p := r.cur
	r.cur = nil
	if p == nil {
		return nil
	}
	r.kills++
	return p.kill()
}

// Restart kills the replica (SIGKILL) and starts it again with the same flags.
func (r *Replica) Restart(ctx context.Context) error {
	if err := r.Kill(); err != nil {
		return err
	}
	return r.Start(ctx)
}

// Stop sends SIGTERM and waits for a clean exit (status 0).
func (r *Replica) Stop(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	p := r.cur
	r.cur = nil
	if p == nil {
		return nil
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		return err
	}
	select {
	case <-p.done:
		if p.err != nil {
			return fmt.Errorf("replica %s after SIGTERM: %w", r.Name, p.err)
		}
		return nil
	case <-ctx.Done():
		_ = p.kill()
		return fmt.Errorf("replica %s still running after SIGTERM: %w", r.Name, ctx.Err())
	}
}

// Running reports whether the replica's process runs.
func (r *Replica) Running() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cur == nil {
		return false
	}
	select {
	case <-r.cur.done:
		return false
	default:
		return true
	}
}

// Counts reports how often the replica was started and killed.
func (r *Replica) Counts() (starts, kills int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.starts, r.kills
}

// Output returns what the replica wrote so far, across its runs.
func (r *Replica) Output() string {
	b, err := os.ReadFile(r.LogFile)
	if err != nil {
		return fmt.Sprintf("(read %s: %v)", r.LogFile, err)
	}
	return string(b)
}

func (p *process) kill() error {
	select {
	case <-p.done:
		return nil
	default:
	}
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("kill process %d: %w", p.cmd.Process.Pid, err)
	}
	select {
	case <-p.done:
		return nil
	case <-time.After(Patience):
		return fmt.Errorf("process %d still running %s after SIGKILL", p.cmd.Process.Pid, Patience)
	}
}
