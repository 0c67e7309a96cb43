package mcpgateway_test

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/assent-dev/assent/internal/broker"
	"github.com/assent-dev/assent/internal/brokertest"
	"github.com/assent-dev/assent/internal/mcpgateway"
	"github.com/assent-dev/assent/internal/testenv"
	"github.com/assent-dev/assent/pkg/events"
	"github.com/assent-dev/assent/pkg/handler"
)

// running is a gateway in Run, serving a client on pipes (as on stdio) and
// clients over HTTP, with a manual broker behind it.
type running struct {
	f      *fixture // for its helpers: no gateway of its own
	stdio  *mcp.ClientSession
	hang   func() // closes the stdio client's pipes, as a client that quits
	http   *mcp.ClientSession
	cancel context.CancelFunc
	ran    chan error
}

// startRun runs a gateway in front of up until the test ends.
func startRun(t *testing.T, up mcpgateway.Upstream) *running {
	t.Helper()
	ns := testenv.Server(t)
	brokertest.Run(t, testenv.Conn(t, ns), broker.Config{Name: "run"})
	nc := testenv.Conn(t, ns)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	reader, err := handler.NewClient(nc, handler.Config{})
	if err != nil {
		t.Fatal(err)
	}
	g, err := mcpgateway.New(testenv.Conn(t, ns), mcpgateway.Config{Upstreams: []mcpgateway.Upstream{up}, NATS: mcpgateway.NATS{URL: ns.ClientURL()}}, testenv.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{f: &fixture{nc: nc, js: js, reader: reader}, cancel: cancel, ran: make(chan error, 1)}
	go func() { r.ran <- g.Run(ctx, mcpgateway.RunOptions{Stdin: inR, Stdout: outW, HTTP: ln}) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-r.ran:
		case <-time.After(patience):
			t.Error("Run did not return after its context ended")
		}
	})
	r.stdio = connectAs(t, "stdio-client", &mcp.IOTransport{Reader: outR, Writer: inW}, nil)
	r.hang = func() { inW.Close(); outR.Close() }
	r.http = connectAs(t, "http-client", &mcp.StreamableClientTransport{Endpoint: "http://" + ln.Addr().String() + "/mcp"}, nil)
	return r
}

// ended waits for Run to return.
func (r *running) ended(t *testing.T) error {
	t.Helper()
	select {
	case err := <-r.ran:
		r.ran <- err // for the cleanup
		return err
	case <-time.After(patience):
		t.Fatal("Run did not return")
	}
	return nil
}

func TestRun(t *testing.T) {
	worker := func(t *testing.T) mcpgateway.Upstream {
		return mcpgateway.Upstream{Name: "fs", Command: os.Args[0], Env: map[string]string{workerEnv: t.TempDir()}}
	}
	t.Run("stopping withdraws the calls in flight", func(t *testing.T) {
		r := startRun(t, worker(t))
		next := r.f.pendingOf(t, "http-client")
		ch := callAsync(t, t.Context(), r.http, "delete_file", `{"path":"x"}`)
		p := next()
		r.cancel()
		if err := r.ended(t); err != nil {
			t.Errorf("Run after its context ended: %v", err)
		}
		if d := r.f.decision(t, p.RequestID); d.Outcome != events.Cancelled {
			t.Errorf("decision %+v, want cancelled", d)
		}
		if res := await(t, ch); res.err == nil {
			t.Errorf("the call withdrawn returned %+v", res.res)
		}
	})
	t.Run("the stdio client leaves", func(t *testing.T) {
		r := startRun(t, worker(t))
		if _, err := r.stdio.ListTools(t.Context(), nil); err != nil {
			t.Fatal(err)
		}
		r.hang()
		if err := r.ended(t); err != nil {
			t.Errorf("Run after the stdio client left: %v", err)
		}
	})
	t.Run("an upstream ends", func(t *testing.T) {
		r := startRun(t, mcpgateway.Upstream{Name: "quitter", Command: os.Args[0], Env: map[string]string{quitterEnv: "1"}})
		next := r.f.pendingOf(t, "stdio-client")
		ch := callAsync(t, t.Context(), r.stdio, "quit", `{}`)
		r.f.answer(t, "alice", next().RequestID, events.Responded{Decision: events.Approve})
		// The call fails: with a tool error saying why, or, when the
		// gateway closes the session before that is written (the SDK
		// refuses writes once a session closes), with the session's end.
		if res := await(t, ch); res.err == nil && (!res.res.IsError || !strings.Contains(text(t, res.res), "could not reach its server quitter")) {
			t.Errorf("the call that ended its upstream returned %+v", res.res)
		}
		// The error says what the upstream said last.
		if err := r.ended(t); !errors.Is(err, mcpgateway.ErrUpstreamEnded) || !strings.Contains(err.Error(), "its stderr ended with: quitter: bye") {
			t.Errorf("Run after its upstream ended: %v", err)
		}
	})
}
