package mcpgateway

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"runtime/debug"
	"slices"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/assent-dev/assent/internal/httptls"
	"github.com/assent-dev/assent/pkg/events"
	"github.com/assent-dev/assent/pkg/handler"
)

// Errors that end calls and gateways; branch on them with errors.Is.
var (
	// ErrClientGone: the client closed its connection or its session, or
	// stopped answering pings, while its call waited. The call's request is
	// cancelled, with what happened as the reason.
	ErrClientGone = errors.New("the MCP client went away")
	// ErrClientCancelled: the client cancelled its call
	// (notifications/cancelled) while it waited. The call's request is
	// cancelled, with the client's reason.
	ErrClientCancelled = errors.New("the MCP client cancelled the call")
	// ErrStopped: the gateway stopped while the call waited. The call's
	// request is cancelled.
	ErrStopped = errors.New("the gateway stopped")
	// ErrUpstreamEnded: an upstream server's session ended while the gateway
	// ran (its process exited, say). Run returns it.
	ErrUpstreamEnded = errors.New("upstream MCP server ended")
	// ErrNoBroker: no Assent broker took up a call's request: NATS is
	// unreachable, no broker has run on it, or none stored the request
	// within Config.BrokerWait. The call does not run; its request, if
	// published, is withdrawn.
	ErrNoBroker = errors.New("no Assent broker answers")
	// ErrToolConflict: two upstreams offer a tool under the same name. Give
	// one of them a prefix.
	ErrToolConflict = errors.New("tool offered twice")
)

// MetaKey is the key, in a tool result's _meta, of what Assent decided
// about the call (a Verdict).
const MetaKey = "dev.assent/decision"

// Instructions are what the gateway adds to its servers' instructions: they
// tell the model, through the client, what to expect.
const Instructions = "Calls to these tools are approved through Assent before they run: a call may wait until a person decides, " +
	"and may come back not run, denied, expired or cancelled, with the reason. Do not retry a denied call unchanged; " +
	"tell the user, or ask how to proceed."

// Gateway is an MCP server that offers what its upstream MCP servers offer,
// passed through unchanged, and asks Assent before each tool call: New,
// then Run (or Start, Serve and Handler, then Close).
type Gateway struct {
	cfg    Config
	nc     *nats.Conn
	client *handler.Client
	js     jetstream.JetStream
	log    *zap.Logger

	bg     context.Context // ends with Close: sessions and calls
	stopBg context.CancelFunc
	wg     sync.WaitGroup // background goroutines

	mu      sync.Mutex // guards named, offered
	named   []Upstream // the upstreams, as Start named them
	offered map[string]string

	smu      sync.Mutex // guards sessions, closed
	sessions map[*session]bool
	closed   bool
	inFlight sync.WaitGroup // calls
	once     sync.Once
}

// New returns a gateway that asks through nc, which stays the caller's.
// cfg is checked (after WithDefaults); upstreams are looked at by Start.
func New(nc *nats.Conn, cfg Config, log *zap.Logger) (*Gateway, error) {
	if nc == nil {
		return nil, errors.New("mcpgateway: nil NATS connection")
	}
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if log == nil {
		log = zap.NewNop()
	}
	client, err := handler.NewClient(nc, handler.Config{Agent: cfg.Identity.Agent, DefaultTimeout: cfg.Timeout,
		TrustedKeys: cfg.NATS.TrustedDecisionKeys, Private: cfg.NATS.Private, Logger: log})
	if err != nil {
		return nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	g := &Gateway{cfg: cfg, nc: nc, client: client, js: js, log: log.Named("mcp-gateway"),
		offered: map[string]string{}, sessions: map[*session]bool{}}
	g.bg, g.stopBg = context.WithCancel(context.Background())
	return g, nil
}

// version is the module's version, as the build recorded it.
func version() string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		return bi.Main.Version
	}
	return "(devel)"
}

// probe is the gateway's own client identity, when it looks at its
// upstreams at Start.
const probe = `{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"assent-mcp-gateway","version":"%s"}}`

// Start looks at every upstream once: it starts (or reaches) it, opens a
// session, lists its tools, and ends the session. An upstream that cannot
// be reached is an error, as are two upstreams offering a tool under the
// same name (wrapping ErrToolConflict). Each client's session later opens
// sessions of its own with every upstream.
func (g *Gateway) Start(ctx context.Context) error {
	var errs []error
	var named []Upstream
	offered := map[string]string{}
	for _, cfg := range g.cfg.Upstreams {
		l, err := dial(ctx, cfg, g.log)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		lctx, stop := context.WithCancel(ctx)
		go l.run(lctx, func(jsonrpc.Message) {})
		err = l.initialize(lctx, json.RawMessage(fmt.Sprintf(probe, version())))
		if err == nil {
			_ = l.notify(lctx, "notifications/initialized", nil)
			if name := l.serverName(); cfg.AutoName && name != "" && name != cfg.Name && !isNamed(named, g.cfg.Upstreams, name) {
				g.log.Info("upstream named as it names itself", zap.String("upstream", name), zap.String("instead_of", cfg.Name))
				cfg.Name = name
				l.cfg.Name = name
			}
			var items []object
			if l.capable("tools") {
				items, err = l.list(lctx, "tools/list", "tools")
				if err != nil {
					err = fmt.Errorf("upstream %s: list tools: %w", cfg.Name, err)
				}
			}
			for _, t := range items {
				name := cfg.Prefix + t.str("name")
				if other, taken := offered[name]; taken {
					errs = append(errs, fmt.Errorf("%w: %s is offered by upstreams %s and %s: give one of them a prefix", ErrToolConflict, name, other, cfg.Name))
					continue
				}
				offered[name] = cfg.Name
			}
		}
		stop()
		_ = l.close()
		if err != nil {
			errs = append(errs, err)
			continue
		}
		named = append(named, cfg)
	}
	g.mu.Lock()
	g.named, g.offered = named, offered
	g.mu.Unlock()
	return errors.Join(errs...)
}

// isNamed reports whether an upstream is, or is to be, called name.
func isNamed(named, configured []Upstream, name string) bool {
	for _, c := range append(slices.Clone(named), configured...) {
		if c.Name == name {
			return true
		}
	}
	return false
}

// Upstreams lists the names of the upstreams, in the order of the
// configuration.
func (g *Gateway) Upstreams() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	names := make([]string, len(g.named))
	for i, u := range g.named {
		names[i] = u.Name
	}
	return names
}

// Tools lists the tools the gateway offers, by the names clients see, as
// Start found them (a client that can sample or elicit may see more: an
// upstream offers what its client can use).
func (g *Gateway) Tools() map[string]string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return maps.Clone(g.offered)
}

// Serve serves one client over t (stdio, say) until it goes away, which is
// a clean end, or ctx ends, which cancels its calls in flight. When one of
// its upstreams ends, so does the session, with an error wrapping
// ErrUpstreamEnded.
func (g *Gateway) Serve(ctx context.Context, t mcp.Transport) error {
	conn, err := t.Connect(ctx)
	if err != nil {
		return err
	}
	s := g.newSession(conn, events.NewID(), false, true)
	if !g.register(s) {
		_ = conn.Close()
		return ErrStopped
	}
	defer g.unregister(s)
	done := make(chan error, 1)
	go func() { done <- s.run() }()
	select {
	case err := <-done:
		g.log.Debug("client session ended", zap.Error(err))
		if errors.Is(err, ErrUpstreamEnded) {
			return err
		}
		return nil
	case <-ctx.Done():
		s.stop(ErrStopped)
		_ = conn.Close()
		<-done
		return nil
	}
}

// register adds a session, unless the gateway is closing.
func (g *Gateway) register(s *session) bool {
	g.smu.Lock()
	defer g.smu.Unlock()
	if g.closed {
		return false
	}
	g.sessions[s] = true
	return true
}

func (g *Gateway) unregister(s *session) {
	g.smu.Lock()
	defer g.smu.Unlock()
	delete(g.sessions, s)
}

// Handler serves clients over streamable HTTP. A client that ends its
// session (HTTP DELETE) cancels its calls in flight.
func (g *Gateway) Handler() http.Handler { return newHTTPServer(g) }

// closeWait bounds how long Close waits for the sessions to end.
const closeWait = 10 * time.Second

// Close cancels the calls in flight (their requests are withdrawn) and
// waits for them, then ends every session and its upstreams. It is safe to
// call twice.
func (g *Gateway) Close() error {
	g.once.Do(func() {
		g.smu.Lock()
		g.closed = true
		sessions := make([]*session, 0, len(g.sessions))
		for s := range g.sessions {
			sessions = append(sessions, s)
		}
		g.smu.Unlock()
		for _, s := range sessions {
			s.stop(ErrStopped)
		}
		g.inFlight.Wait()
		for _, s := range sessions {
			_ = s.conn.Close()
		}
		g.stopBg()
		// Every session ends once its context does; one that does not
		// within closeWait (a client or server that stopped reading, say)
		// is left behind with a warning rather than holding Close.
		deadline := time.Now().Add(closeWait)
		for _, s := range sessions {
			select {
			case <-s.finished:
			case <-time.After(time.Until(deadline)):
				g.log.Warn("a client session did not end in time; closing without it", zap.String("mcp_session", s.id), zap.Duration("waited", closeWait))
			}
		}
		g.wg.Wait()
	})
	return nil
}

// RunOptions say how Run serves clients.
type RunOptions struct {
	// Stdin and Stdout, when set, serve one client over them (stdio);
	// Run returns once that client goes away.
	Stdin  io.ReadCloser
	Stdout io.WriteCloser
	// HTTP, when set, serves clients over streamable HTTP at /mcp on it.
	// Run closes it.
	HTTP net.Listener
	// TLS, when set, serves HTTP over TLS with it only (httptls.Certs).
	TLS *tls.Config
}

// Run starts the gateway, serves clients as o says until ctx ends, the stdio
// client goes away, or an upstream of the stdio client ends (an error
// wrapping ErrUpstreamEnded), then closes the gateway. An upstream of an
// HTTP client that ends ends that client's session only.
func (g *Gateway) Run(ctx context.Context, o RunOptions) error {
	defer g.Close() //nolint:errcheck // closing upstreams at the end: logged below when it matters
	if err := g.Start(ctx); err != nil {
		return err
	}
	ctx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	var wg sync.WaitGroup
	if o.Stdin != nil {
		wg.Go(func() {
			if err := g.Serve(ctx, &mcp.IOTransport{Reader: o.Stdin, Writer: o.Stdout}); err != nil {
				if errors.Is(err, ErrUpstreamEnded) {
					stop(err)
					return
				}
				stop(fmt.Errorf("serve stdio: %w", err))
				return
			}
			stop(ErrClientGone)
		})
	}
	var srv *http.Server
	if o.HTTP != nil {
		mux := http.NewServeMux()
		mux.Handle("/mcp", g.Handler())
		srv = &http.Server{Handler: mux}
		serve := func() error { return srv.Serve(o.HTTP) }
		if o.TLS != nil {
			srv.TLSConfig, srv.ErrorLog = o.TLS, httptls.ErrorLog(g.log.Named("http"))
			serve = func() error { return srv.ServeTLS(o.HTTP, "", "") } // the certificate comes from TLSConfig
		}
		wg.Go(func() {
			if err := serve(); !errors.Is(err, http.ErrServerClosed) {
				stop(fmt.Errorf("serve HTTP: %w", err))
			}
		})
	}
	<-ctx.Done()
	// Calls in flight end first (their requests withdrawn), then the
	// connections they would have answered on.
	err := g.Close()
	if srv != nil {
		_ = srv.Close()
	}
	wg.Wait()
	switch cause := context.Cause(ctx); {
	case errors.Is(cause, ErrUpstreamEnded):
		return cause
	case errors.Is(cause, ErrClientGone), errors.Is(cause, context.Canceled), errors.Is(cause, context.DeadlineExceeded):
		return err // the stdio client is done, or we were told to stop: a clean end
	default:
		return errors.Join(cause, err)
	}
}
