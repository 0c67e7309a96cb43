package mcpgateway

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"runtime/debug"
	"sync"

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

// instructions tell the model, through the client, what to expect.
const instructions = "Calls to these tools are approved through Assent before they run: a call may wait until a person decides, " +
	"and may come back not run, denied, expired or cancelled, with the reason. Do not retry a denied call unchanged; " +
	"tell the user, or ask how to proceed."

// Gateway is an MCP server that offers the tools of its upstream MCP servers
// unchanged and asks Assent before each call: New, then Run (or Start,
// Serve and Handler, then Close).
type Gateway struct {
	cfg    Config
	nc     *nats.Conn
	client *handler.Client
	js     jetstream.JetStream
	log    *zap.Logger
	server *mcp.Server

	bg     context.Context // ends with Close: refreshes and watches
	stopBg context.CancelFunc
	wg     sync.WaitGroup // background goroutines
	ended  chan error     // upstream sessions that ended

	mu        sync.Mutex // guards upstreams, offered
	upstreams []*upstream
	offered   map[string]offer // by the name clients see

	smu      sync.Mutex // guards clients, closed
	clients  map[*mcp.ServerSession]*clientState
	closed   bool
	inFlight sync.WaitGroup // calls
	once     sync.Once
}

// clientState is what the gateway keeps of one client session.
type clientState struct {
	// session is the id made for a session its transport names none (stdio).
	session string
	// served: the session is Serve's, which forgets it when it ends; others
	// (HTTP) are forgotten when they have no call left.
	served bool
	calls  map[*int]tracked
}

// tracked is a call in flight.
type tracked struct {
	cancel context.CancelCauseFunc
	// rpc is the key (rpcKey) of the call's JSON-RPC id, when known: a
	// notifications/cancelled names the call by it.
	rpc string
}

// New returns a gateway that asks through nc, which stays the caller's.
// cfg is checked (after WithDefaults); upstreams are connected by Start.
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
		ended: make(chan error, len(cfg.Upstreams)), offered: map[string]offer{}, clients: map[*mcp.ServerSession]*clientState{}}
	g.bg, g.stopBg = context.WithCancel(context.Background())
	g.server = mcp.NewServer(&mcp.Implementation{Name: "assent-mcp-gateway", Title: "Assent MCP gateway", Version: version()},
		&mcp.ServerOptions{Instructions: instructions, Capabilities: &mcp.ServerCapabilities{Tools: &mcp.ToolCapabilities{ListChanged: true}}})
	g.server.AddReceivingMiddleware(sessionsOnly)
	return g, nil
}

// sessionsOnly refuses server/discover, the start of the sessionless MCP
// protocol (2026-07-28), so that clients fall back to the initialize
// handshake and a session: the gateway asks its client's user during a call
// and withdraws the question when the call is decided elsewhere, which the
// sessionless protocol has no way to do.
func sessionsOnly(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		if method == "server/discover" {
			return nil, &jsonrpc.Error{Code: jsonrpc.CodeMethodNotFound, Message: "server/discover: this server speaks MCP with sessions (initialize)"}
		}
		return next(ctx, method, req)
	}
}

// version is the module's version, as the build recorded it.
func version() string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		return bi.Main.Version
	}
	return "(devel)"
}

// Start connects to every upstream and offers their tools. If two of them
// offer a tool under the same name, an error wrapping ErrToolConflict is
// returned. Upstreams that change their tools later are followed until
// Close.
func (g *Gateway) Start(ctx context.Context) error {
	var errs []error
	for _, cfg := range g.cfg.Upstreams {
		u, err := connect(ctx, cfg, g.log)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		g.mu.Lock()
		if name := u.serverName(); cfg.AutoName && name != "" && name != cfg.Name && !g.named(name) {
			g.log.Info("upstream named as it names itself", zap.String("upstream", name), zap.String("instead_of", cfg.Name))
			u.cfg.Name = name
		}
		g.upstreams = append(g.upstreams, u)
		g.mu.Unlock()
		if err := g.sync(ctx, u, true); err != nil {
			errs = append(errs, err)
		}
		g.wg.Go(func() { g.follow(u) })
	}
	return errors.Join(errs...)
}

// named reports whether an upstream is, or is to be, called name; g.mu is
// held.
func (g *Gateway) named(name string) bool {
	for _, u := range g.upstreams {
		if u.cfg.Name == name {
			return true
		}
	}
	for _, c := range g.cfg.Upstreams {
		if c.Name == name {
			return true
		}
	}
	return false
}

// Upstreams lists the names of the upstreams connected, in the order of
// the configuration.
func (g *Gateway) Upstreams() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	names := make([]string, len(g.upstreams))
	for i, u := range g.upstreams {
		names[i] = u.cfg.Name
	}
	return names
}

// follow offers u's tools anew each time u says they changed, and reports
// u's end, until Close.
func (g *Gateway) follow(u *upstream) {
	ended := make(chan error, 1)
	go func() { ended <- u.session.Wait() }() // returns when Close closes the session, at the latest
	for {
		select {
		case <-u.changed:
			if err := g.sync(g.bg, u, false); err != nil && g.bg.Err() == nil {
				g.log.Warn("list the tools of an upstream again", zap.String("upstream", u.cfg.Name), zap.Error(err))
			}
		case err := <-ended:
			if g.bg.Err() == nil {
				u.stderr.settle()
				g.ended <- fmt.Errorf("%w: %s: %v%s", ErrUpstreamEnded, u.cfg.Name, err, u.stderr.tail())
			}
			return
		case <-g.bg.Done():
			<-ended
			return
		}
	}
}

// Tools lists the tools the gateway offers, by the names clients see.
func (g *Gateway) Tools() map[string]string {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := make(map[string]string, len(g.offered))
	for name, o := range g.offered {
		out[name] = o.upstream.cfg.Name
	}
	return out
}

// Serve serves one client over t (stdio, say) until it goes away, which is
// a clean end, or ctx ends, which cancels its calls in flight.
func (g *Gateway) Serve(ctx context.Context, t mcp.Transport) error {
	st := &clientState{session: events.NewID(), served: true, calls: map[*int]tracked{}}
	ss, err := g.server.Connect(ctx, &noting{Transport: t, g: g, st: st}, nil)
	if err != nil {
		return err
	}
	g.smu.Lock()
	if early := g.clients[ss]; early != nil { // a call came before Connect returned
		maps.Copy(st.calls, early.calls)
	}
	g.clients[ss] = st
	g.smu.Unlock()
	defer func() {
		g.smu.Lock()
		delete(g.clients, ss)
		g.smu.Unlock()
	}()
	waited := make(chan error, 1)
	go func() { waited <- ss.Wait() }()
	select {
	case err := <-waited:
		// The client closing its side is how a session ends; the SDK
		// reports even that as an error ("server is closing: EOF").
		g.log.Debug("client session ended", zap.Error(err))
		return nil
	case <-ctx.Done():
		g.cancel(func(s *mcp.ServerSession) bool { return s == ss }, ErrStopped)
		_ = ss.Close()
		<-waited
		return nil
	}
}

// Handler serves clients over streamable HTTP. A client that ends its
// session (HTTP DELETE) cancels its calls in flight.
func (g *Gateway) Handler() http.Handler {
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return g.server }, nil)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.Header.Get("Mcp-Session-Id")
		switch {
		case r.Method == http.MethodDelete && id != "":
			// The SDK closes the session only once its calls return: end
			// them first.
			g.cancel(func(s *mcp.ServerSession) bool { return s.ID() == id }, fmt.Errorf("%w: the client ended its session", ErrClientGone))
		case r.Method == http.MethodPost:
			if !g.noteHTTP(w, r, id) {
				return
			}
		}
		h.ServeHTTP(w, r)
	})
}

// track registers a call of ss, whose JSON-RPC id has the key rpc (or ""):
// the returned context ends when ctx does, when ss goes away, when the client
// cancels the call, or when the gateway stops; done unregisters it. ok is
// false once the gateway is closed.
func (g *Gateway) track(ctx context.Context, ss *mcp.ServerSession, rpc string) (_ context.Context, done func(), ok bool) {
	ctx, cancel := context.WithCancelCause(ctx)
	key := new(int)
	g.smu.Lock()
	defer g.smu.Unlock()
	if g.closed {
		cancel(ErrStopped)
		return ctx, func() {}, false
	}
	st := g.state(ss)
	st.calls[key] = tracked{cancel: cancel, rpc: rpc}
	g.inFlight.Add(1)
	return ctx, func() {
		cancel(nil)
		g.smu.Lock()
		delete(st.calls, key)
		switch cur := g.clients[ss]; {
		case cur != nil && cur != st: // Serve registered the session after the call began, and took it over
			delete(cur.calls, key)
		case cur == st && len(st.calls) == 0 && !st.served:
			delete(g.clients, ss)
		}
		g.smu.Unlock()
		g.inFlight.Done()
	}, true
}

// state is ss's state, made on first use; g.smu is held.
func (g *Gateway) state(ss *mcp.ServerSession) *clientState {
	st := g.clients[ss]
	if st == nil {
		st = &clientState{calls: map[*int]tracked{}}
		g.clients[ss] = st
	}
	return st
}

// sessionOf is the session id a call of ss asks under: the configured one,
// else the MCP session id, else the one Serve made for ss.
func (g *Gateway) sessionOf(ss *mcp.ServerSession) string {
	if s := g.cfg.Identity.Session; s != "" {
		return s
	}
	if id := ss.ID(); id != "" {
		return id
	}
	g.smu.Lock()
	defer g.smu.Unlock()
	return g.state(ss).session
}

// cancel ends the calls in flight of the sessions that match, with cause.
func (g *Gateway) cancel(match func(*mcp.ServerSession) bool, cause error) {
	g.smu.Lock()
	defer g.smu.Unlock()
	for ss, st := range g.clients {
		if match(ss) {
			for _, c := range st.calls {
				c.cancel(cause)
			}
		}
	}
}

// Close cancels the calls in flight (their requests are withdrawn) and
// waits for them, then closes the upstreams. It is safe to call twice.
func (g *Gateway) Close() error {
	var err error
	g.once.Do(func() {
		g.smu.Lock()
		g.closed = true
		g.smu.Unlock()
		g.cancel(func(*mcp.ServerSession) bool { return true }, ErrStopped)
		g.inFlight.Wait()
		g.stopBg()
		g.mu.Lock()
		ups := g.upstreams
		g.mu.Unlock()
		var errs []error
		for _, u := range ups {
			if e := u.close(); e != nil && !errors.Is(e, io.EOF) {
				errs = append(errs, fmt.Errorf("close upstream %s: %w", u.cfg.Name, e))
			}
		}
		g.wg.Wait()
		err = errors.Join(errs...)
	})
	return err
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
// client goes away, or an upstream ends (an error wrapping
// ErrUpstreamEnded), then closes the gateway.
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
	select {
	case err := <-g.ended:
		stop(err)
	case <-ctx.Done():
	}
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
