// Package testenv starts real NATS servers and connections for tests: an
// embedded server per test on a free port with storage in t.TempDir().
package testenv

import (
	"net"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/assent-dev/assent/internal/natsembed"
)

// NATS is an embedded server started for a test, with what it takes to
// restart it in the same place.
type NATS struct {
	*server.Server
	Dir  string
	Port int
	op   *natsembed.Operator
}

// Server starts an embedded JetStream server for t with storage in a new
// t.TempDir() and shuts it down when the test ends.
func Server(t testing.TB) *NATS {
	t.Helper()
	return start(t, t.TempDir(), -1, nil)
}

// OperatorServer is Server in operator mode: clients connect with
// credentials signed by op's accounts, bound by their permissions.
func OperatorServer(t testing.TB, op *natsembed.Operator) *NATS {
	t.Helper()
	return start(t, t.TempDir(), -1, op)
}

func start(t testing.TB, dir string, port int, op *natsembed.Operator) *NATS {
	t.Helper()
	s, err := natsembed.Start(natsembed.Config{Port: port, StoreDir: dir, Sync: "1m", Operator: op}, nil)
	if err != nil {
		t.Fatalf("start nats: %v", err)
	}
	n := &NATS{Server: s, Dir: dir, Port: s.Addr().(*net.TCPAddr).Port, op: op}
	t.Cleanup(n.Stop)
	return n
}

// Stop shuts the server down and waits; safe to call more than once.
func (n *NATS) Stop() {
	n.Shutdown()
	n.WaitForShutdown()
}

// Restart stops the server and starts a new one on the same port and store
// directory; connections made with Conn reconnect to it.
func (n *NATS) Restart(t testing.TB) *NATS {
	t.Helper()
	n.Stop()
	return start(t, n.Dir, n.Port, n.op)
}

// Conn connects to s and closes the connection when the test ends. The
// connection reconnects forever, so tests can restart the server under it.
func Conn(t testing.TB, s *NATS) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(s.ClientURL(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond), nats.Timeout(5*time.Second))
	if err != nil {
		t.Fatalf("connect nats: %v", err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// Logger returns a zap logger that writes through t.
func Logger(t testing.TB) *zap.Logger {
	return zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel))
}

// Program returns the path of the first of names on PATH. Without one the
// test is skipped, except in CI (CI=true), whose .ci/run installs it with the
// Debian package pkg.
func Program(t testing.TB, pkg string, names ...string) string {
	t.Helper()
	for _, name := range names {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("no %s on PATH; .ci/run installs it (apt-get install -y %s)", names[0], pkg)
	}
	t.Skipf("no %s on PATH (apt-get install -y %s); this test needs it", names[0], pkg)
	return ""
}
