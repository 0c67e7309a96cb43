// Package testenv starts real NATS servers and connections for tests: an
// embedded server per test on a free port with storage in t.TempDir(). It
// also holds the small checks the HTTP fuzz targets share.
package testenv

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
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

// InProcessConn connects to s in process, as the broker binary does to its
// embedded server: no sockets, so that a fuzz input costs less. The
// connection is closed when the test ends.
func InProcessConn(t testing.TB, s *NATS) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect("", nats.InProcessServer(s.Server))
	if err != nil {
		t.Fatalf("connect nats in process: %v", err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// Tap records the subjects of the messages published on some subjects, for
// a test to read between its steps.
type Tap struct {
	nc  *nats.Conn
	got chan *nats.Msg
}

// NewTap subscribes, on a connection of its own to s, to each of subjects.
func NewTap(t testing.TB, s *NATS, subjects ...string) *Tap {
	t.Helper()
	tp := &Tap{nc: InProcessConn(t, s), got: make(chan *nats.Msg, 4096)}
	for _, subj := range subjects {
		if _, err := tp.nc.ChanSubscribe(subj, tp.got); err != nil {
			t.Fatalf("subscribe %s: %v", subj, err)
		}
	}
	return tp
}

// Drain returns the subjects of what the tap received since the last call,
// after a round trip to the server so that whatever was published before is
// in.
func (tp *Tap) Drain(t testing.TB) []string {
	t.Helper()
	if err := tp.nc.Flush(); err != nil {
		t.Fatalf("flush: %v", err)
	}
	var subjects []string
	for {
		select {
		case m := <-tp.got:
			subjects = append(subjects, m.Subject)
		default:
			return subjects
		}
	}
}

// StrictJSON decodes data into v, refusing unknown fields and anything after
// the value.
func StrictJSON(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if dec.More() {
		return errors.New("more after the value")
	}
	return nil
}

// Next waits up to d for one more message and returns its subject.
func (tp *Tap) Next(d time.Duration) (string, bool) {
	select {
	case m := <-tp.got:
		return m.Subject, true
	case <-time.After(d):
		return "", false
	}
}

// ValidHeaderValue reports whether net/http's server accepts v as a header
// value: no control characters but tab.
func ValidHeaderValue(v string) bool {
	for i := 0; i < len(v); i++ {
		if c := v[i]; c < ' ' && c != '\t' || c == 0x7f {
			return false
		}
	}
	return true
}

// ValidHeaderName reports whether net/http's server accepts k as a header
// name: a token.
func ValidHeaderName(k string) bool {
	for i := 0; i < len(k); i++ {
		if c := k[i]; c <= ' ' || c >= 0x7f || strings.IndexByte(`"(),/:;<=>?@[\]{}`, c) >= 0 {
			return false
		}
	}
	return true
}

// WireRequest makes the request net/http's server would hand a handler for
// these parts, by writing it out as HTTP/1.1 and reading it back: false if
// the server would answer it itself (a line break in the method or target, a
// header value it refuses) or not read it at all. A header with an empty
// value is left out; Content-Length is the body's.
func WireRequest(method, target, host string, header [][2]string, body []byte) (*http.Request, bool) {
	if strings.ContainsAny(method+target, "\r\n") {
		return nil, false
	}
	var raw bytes.Buffer
	fmt.Fprintf(&raw, "%s %s HTTP/1.1\r\nHost: %s\r\n", method, target, host)
	for _, h := range header {
		if h[1] == "" {
			continue
		}
		if !ValidHeaderValue(h[1]) {
			return nil, false
		}
		fmt.Fprintf(&raw, "%s: %s\r\n", h[0], h[1])
	}
	fmt.Fprintf(&raw, "Content-Length: %d\r\n\r\n", len(body))
	raw.Write(body)
	r, err := http.ReadRequest(bufio.NewReader(&raw))
	if err != nil {
		return nil, false
	}
	return r, true
}

// Go runs f in a goroutine that the test waits for when it ends, and returns
// a channel that gets f's result.
func Go[T any](t testing.TB, f func() T) <-chan T {
	t.Helper()
	ch := make(chan T, 1)
	var wg sync.WaitGroup
	wg.Go(func() { ch <- f() })
	t.Cleanup(wg.Wait)
	return ch
}

// Await returns what ch gets, failing the test if nothing comes within
// patience; what names the awaited call in the failure.
func Await[T any](t testing.TB, ch <-chan T, patience time.Duration, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(patience):
		t.Fatalf("%s did not return within %s", what, patience)
	}
	var zero T
	return zero
}
