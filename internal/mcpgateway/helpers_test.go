package mcpgateway_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/assent-dev/assent/internal/broker"
	"github.com/assent-dev/assent/internal/brokertest"
	"github.com/assent-dev/assent/internal/envflag"
	"github.com/assent-dev/assent/internal/mcpgateway"
	"github.com/assent-dev/assent/internal/testenv"
	"github.com/assent-dev/assent/internal/worker"
	"github.com/assent-dev/assent/pkg/events"
	"github.com/assent-dev/assent/pkg/handler"
	"github.com/assent-dev/assent/pkg/policy"
)

// patience bounds every wait: long enough that only a hang misses it, even
// with -race on two busy cores.
const patience = 30 * time.Second

// workerEnv, set to a sandbox directory, makes the test binary run
// "agent-worker mcp --sandbox DIR" (the code of cmd/agent-worker) instead of
// the tests: the stdio upstream of these tests.
const workerEnv = "ASSENT_TEST_MCP_WORKER_SANDBOX"

// quitterEnv makes the test binary an MCP server over stdio with one tool,
// quit, which ends the process, saying so on stderr: an upstream that goes
// away.
const quitterEnv = "ASSENT_TEST_MCP_QUITTER"

func TestMain(m *testing.M) {
	if os.Getenv(quitterEnv) != "" {
		s := mcp.NewServer(&mcp.Implementation{Name: "quitter", Version: "v0"}, nil)
		s.AddTool(&mcp.Tool{Name: "quit", InputSchema: map[string]any{"type": "object"}}, func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			fmt.Fprintln(os.Stderr, "quitter: bye")
			os.Exit(0)
			return nil, nil
		})
		_ = s.Run(context.Background(), &mcp.StdioTransport{})
		os.Exit(0)
	}
	if dir := os.Getenv(workerEnv); dir != "" {
		cmd, err := worker.ParseArgs([]string{"mcp", "--sandbox", dir}, envflag.Env{}, os.Stderr)
		if err == nil {
			err = cmd.Execute(context.Background(), nil, os.Stdout, os.Stderr)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// testPolicy is the broker's policy in these tests: listing is allowed at
// once, deleting a file called locked* is denied at once, agents called
// quick-* get one second, everything else waits for anyone, the user too.
const testPolicy = `version: 1
defaults:
  allow_self_approval: true
principals:
  alice: {}
  carol: {}
rules:
  - name: read-only
    tools: ["list_*"]
    action: allow
  - name: keep-locked
    tools: [delete_file]
    when: 'args.path.startsWith("locked")'
    action: deny
    reason: locked files stay
  - name: quick
    agents: ["quick-*"]
    action: require_approval
    timeout: 1s
`

// files is where an upstream's delete_file deletes.
type files interface {
	seed(t testing.TB, names ...string)
	exists(t testing.TB, name string) bool
}

// dir is a sandbox directory: agent-worker's files.
type dir string

func (d dir) seed(t testing.TB, names ...string) {
	t.Helper()
	for _, n := range names {
		if err := os.WriteFile(filepath.Join(string(d), n), []byte(n), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func (d dir) exists(t testing.TB, name string) bool {
	t.Helper()
	_, err := os.Stat(filepath.Join(string(d), name))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	return err == nil
}

// backend is an upstream MCP server for the tests to put the gateway in
// front of, and a way to see what its calls did.
type backend struct {
	name string
	// start starts it for t: the gateway's configuration for it, its files,
	// and a client straight to it (no gateway).
	start func(t testing.TB) (mcpgateway.Upstream, files, *mcp.ClientSession)
}

// workerBackend is agent-worker's file tools over stdio, the test binary
// running them (TestMain), offered with the prefix fs__.
var workerBackend = backend{"stdio", func(t testing.TB) (mcpgateway.Upstream, files, *mcp.ClientSession) {
	t.Helper()
	d := t.TempDir()
	up := mcpgateway.Upstream{Name: "fs", Command: os.Args[0], Env: map[string]string{workerEnv: d}, Prefix: "fs__"}
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), workerEnv+"="+d)
	return up, dir(d), connectClient(t, &mcp.CommandTransport{Command: cmd}, nil)
}}

// notes is an MCP server written here, over streamable HTTP: a set of names
// with list_files and delete_file, and tools the test adds and removes.
type notes struct {
	mu     sync.Mutex
	names  map[string]bool
	server *mcp.Server
}

func (n *notes) seed(t testing.TB, names ...string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, x := range names {
		n.names[x] = true
	}
}

func (n *notes) exists(t testing.TB, name string) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.names[name]
}

// newNotes serves a notes server over streamable HTTP until the test ends.
func newNotes(t testing.TB) (*notes, string) {
	t.Helper()
	n := &notes{names: map[string]bool{}}
	n.server = mcp.NewServer(&mcp.Implementation{Name: "notes", Version: "v1"}, nil)
	yes, no := true, false
	mcp.AddTool(n.server, &mcp.Tool{Name: "list_files", Description: "List the notes.", Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true, OpenWorldHint: &no}},
		func(context.Context, *mcp.CallToolRequest, struct{}) (*mcp.CallToolResult, struct {
			Names []string `json:"names"`
		}, error) {
			n.mu.Lock()
			defer n.mu.Unlock()
			var out struct {
				Names []string `json:"names"`
			}
			for x := range n.names {
				out.Names = append(out.Names, x)
			}
			slices.Sort(out.Names)
			return nil, out, nil
		})
	type pathArg struct {
		Path string `json:"path" jsonschema:"the note to delete"`
	}
	mcp.AddTool(n.server, &mcp.Tool{Name: "delete_file", Title: "Delete a note", Description: "Delete one note.", Annotations: &mcp.ToolAnnotations{DestructiveHint: &yes}},
		func(_ context.Context, _ *mcp.CallToolRequest, a pathArg) (*mcp.CallToolResult, any, error) {
			n.mu.Lock()
			defer n.mu.Unlock()
			if !n.names[a.Path] {
				return nil, nil, fmt.Errorf("no note %q", a.Path)
			}
			delete(n.names, a.Path)
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "deleted " + a.Path}}}, nil, nil
		})
	srv := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return n.server }, nil))
	t.Cleanup(srv.Close)
	return n, srv.URL
}

// notesBackend is a notes server over streamable HTTP, offered as is.
var notesBackend = backend{"http", func(t testing.TB) (mcpgateway.Upstream, files, *mcp.ClientSession) {
	t.Helper()
	n, url := newNotes(t)
	return mcpgateway.Upstream{Name: "notes", URL: url}, n, connectClient(t, &mcp.StreamableClientTransport{Endpoint: url}, nil)
}}

// connectClient connects an MCP client named after the test, with opts, over
// tr, and closes it when the test ends.
func connectClient(t testing.TB, tr mcp.Transport, opts *mcp.ClientOptions) *mcp.ClientSession {
	t.Helper()
	return connectAs(t, "test-client", tr, opts)
}

// connectAs is connectClient with the client's name.
func connectAs(t testing.TB, name string, tr mcp.Transport, opts *mcp.ClientOptions) *mcp.ClientSession {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: name, Version: "v0"}, opts).Connect(ctx, tr, nil)
	if err != nil {
		t.Fatalf("connect %s: %v", name, err)
	}
	t.Cleanup(func() { _ = cs.Close() })
	return cs
}

// frontend is how the tests' clients reach the gateway.
type frontend struct {
	name string
	// connect connects a client called name to g, with hc as its HTTP
	// client if set (HTTP only), over its transport as wrap makes it if set.
	// disconnect ends the client's side of the connection without waiting
	// for its calls, as a client that quits does.
	connect func(t testing.TB, g *mcpgateway.Gateway, name string, opts *mcp.ClientOptions, hc *http.Client, wrap func(mcp.Transport) mcp.Transport) (cs *mcp.ClientSession, disconnect func())
}

// memoryFrontend serves each client over a pipe, as on stdio.
var memoryFrontend = frontend{"memory", func(t testing.TB, g *mcpgateway.Gateway, name string, opts *mcp.ClientOptions, _ *http.Client, wrap func(mcp.Transport) mcp.Transport) (*mcp.ClientSession, func()) {
	t.Helper()
	server, client := net.Pipe()
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- g.Serve(ctx, &mcp.IOTransport{Reader: server, Writer: server}) }()
	t.Cleanup(func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return connectAs(t, name, wrapped(&mcp.IOTransport{Reader: client, Writer: client}, wrap), opts), func() { _ = client.Close() }
}}

// httpFrontend serves clients over streamable HTTP.
var httpFrontend = frontend{"http", func(t testing.TB, g *mcpgateway.Gateway, name string, opts *mcp.ClientOptions, hc *http.Client, wrap func(mcp.Transport) mcp.Transport) (*mcp.ClientSession, func()) {
	t.Helper()
	srv := httptest.NewServer(g.Handler())
	t.Cleanup(srv.Close)
	cs := connectAs(t, name, wrapped(&mcp.StreamableClientTransport{Endpoint: srv.URL, HTTPClient: hc}, wrap), opts)
	return cs, func() {
		// What a client sends when it ends its session.
		req, err := http.NewRequest(http.MethodDelete, srv.URL, nil)
		if err != nil {
			t.Error(err)
			return
		}
		req.Header.Set("Mcp-Session-Id", cs.ID())
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Errorf("DELETE the session: %v", err)
			return
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusNoContent {
			t.Errorf("DELETE the session: %s", resp.Status)
		}
	}
}}

// wrapped is tr as wrap makes it, or tr without wrap.
func wrapped(tr mcp.Transport, wrap func(mcp.Transport) mcp.Transport) mcp.Transport {
	if wrap == nil {
		return tr
	}
	return wrap(tr)
}

// reasonTransport is a client transport whose notifications/cancelled give
// reason, as the TypeScript SDK's do (abort(reason), or its own timeout);
// the Go SDK's give their context's error.
type reasonTransport struct {
	mcp.Transport
	reason string
}

func (r reasonTransport) Connect(ctx context.Context) (mcp.Connection, error) {
	c, err := r.Transport.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return &reasonConn{Connection: c, reason: r.reason}, nil
}

type reasonConn struct {
	mcp.Connection
	reason string
}

func (c *reasonConn) Write(ctx context.Context, m jsonrpc.Message) error {
	if req, ok := m.(*jsonrpc.Request); ok && req.Method == "notifications/cancelled" {
		var p map[string]any
		if err := json.Unmarshal(req.Params, &p); err != nil {
			return err
		}
		p["reason"] = c.reason
		raw, err := json.Marshal(p)
		if err != nil {
			return err
		}
		req.Params = raw
	}
	return c.Connection.Write(ctx, m)
}

// rewriteTransport is a client transport that replaces old with new in the
// answers the client sends (a client that answers what it was not asked).
type rewriteTransport struct {
	mcp.Transport
	old, new string
}

func (r rewriteTransport) Connect(ctx context.Context) (mcp.Connection, error) {
	c, err := r.Transport.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return &rewriteConn{Connection: c, old: r.old, new: r.new}, nil
}

type rewriteConn struct {
	mcp.Connection
	old, new string
}

func (c *rewriteConn) Write(ctx context.Context, m jsonrpc.Message) error {
	if resp, ok := m.(*jsonrpc.Response); ok && resp.Result != nil {
		resp.Result = json.RawMessage(strings.ReplaceAll(string(resp.Result), c.old, c.new))
	}
	return c.Connection.Write(ctx, m)
}

// fixture is a NATS server with a broker under testPolicy, a gateway in
// front of one backend, and what the tests check with.
type fixture struct {
	b      *broker.Broker
	nc     *nats.Conn
	js     jetstream.JetStream
	reader *handler.Client
	gw     *mcpgateway.Gateway
	files  files
	direct *mcp.ClientSession // straight to the upstream
	prefix string             // of the upstream's tools
	server string             // the upstream's name
	front  frontend
}

// newFixture starts it all for t, the gateway configured by cfg (its
// upstream and NATS filled in) in front of be, reached through fe.
func newFixture(t testing.TB, be backend, fe frontend, cfg mcpgateway.Config) *fixture {
	t.Helper()
	ns := testenv.Server(t)
	pol, err := policy.Parse([]byte(testPolicy), "policy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := brokertest.Run(t, testenv.Conn(t, ns), broker.Config{Name: "mcp", Policy: pol})
	nc := testenv.Conn(t, ns)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	reader, err := handler.NewClient(nc, handler.Config{Logger: testenv.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	up, fl, direct := be.start(t)
	cfg.Upstreams = append(cfg.Upstreams, up)
	cfg.NATS.URL = ns.ClientURL()
	gw := runGateway(t, testenv.Conn(t, ns), cfg)
	return &fixture{b: b, nc: nc, js: js, reader: reader, gw: gw, files: fl, direct: direct, prefix: up.Prefix, server: up.Name, front: fe}
}

// client connects a client called name (so asking as agent name) to the
// gateway.
func (f *fixture) client(t testing.TB, name string, opts *mcp.ClientOptions) *mcp.ClientSession {
	t.Helper()
	cs, _ := f.front.connect(t, f.gw, name, opts, nil, nil)
	return cs
}

// pendingOf watches the pending requests of agent; each call of the
// returned func waits for the next one.
func (f *fixture) pendingOf(t testing.TB, agent string) func() events.Pending {
	t.Helper()
	subj, err := events.PendingSubject(agent)
	if err != nil {
		t.Fatal(err)
	}
	sub, err := f.nc.SubscribeSync(subj)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := f.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return func() events.Pending {
		t.Helper()
		for {
			m, err := sub.NextMsg(patience)
			if err != nil {
				t.Fatalf("no pending request of %s: %v", agent, err)
			}
			e, err := events.Decode(events.Header(m.Header), m.Data)
			if err != nil {
				t.Fatal(err)
			}
			if e.Type() == events.TypePending {
				p, err := events.DecodePending(&e)
				if err != nil {
					t.Fatal(err)
				}
				return p
			}
		}
	}
}

// deleteWaiting makes files, and has cs, whose client asks as agent, delete
// the first of them with ctx; it returns once the request waits for
// people, with the call's result to come.
func (f *fixture) deleteWaiting(t testing.TB, ctx context.Context, cs *mcp.ClientSession, agent string, files ...string) (<-chan result, events.Pending) {
	t.Helper()
	next := f.pendingOf(t, agent)
	f.files.seed(t, files...)
	ch := callAsync(t, ctx, cs, f.prefix+"delete_file", `{"path":"`+files[0]+`"}`)
	return ch, next()
}

// answer publishes principal's answer to request id.
func (f *fixture) answer(t testing.TB, principal, id string, r events.Responded) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	if err := handler.Answer(ctx, f.js, principal, id, r); err != nil {
		t.Fatalf("answer %s as %s: %v", id, principal, err)
	}
}

// decision waits for the decision of request id: the first message stored on
// its subject, read or republished on assent-decided.<id> (a plain
// subscriber of assent.decision.<id> also gets publishes the stream refused).
func (f *fixture) decision(t testing.TB, id string) events.Decided {
	t.Helper()
	if err := events.CheckToken("request id", id); err != nil {
		t.Fatal(err)
	}
	sub, err := f.nc.SubscribeSync(events.DecidedPrefix + id)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe() //nolint:errcheck // test
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	if d, ok, err := f.reader.Decision(ctx, id); err != nil || ok {
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	m, err := sub.NextMsg(patience)
	for err == nil && m.Header.Get(events.LastSequenceHeader) != "0" {
		m, err = sub.NextMsg(patience) // stored after the decision
	}
	if err != nil {
		t.Fatalf("no decision for %s: %v", id, err)
	}
	e, err := events.Decode(events.Header(m.Header), m.Data)
	if err != nil {
		t.Fatal(err)
	}
	d, err := events.DecodeDecided(&e)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// result is what a CallTool returned.
type result struct {
	res *mcp.CallToolResult
	err error
}

// callAsync calls tool with args through cs in a goroutine the test waits for
// at cleanup.
func callAsync(t testing.TB, ctx context.Context, cs *mcp.ClientSession, tool, args string) <-chan result {
	t.Helper()
	return testenv.Go(t, func() result {
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: json.RawMessage(args)})
		return result{res, err}
	})
}

// await waits for a callAsync.
func await(t testing.TB, ch <-chan result) result {
	t.Helper()
	return testenv.Await(t, ch, patience, "the call")
}

// call calls tool and waits for its result, which must not be a protocol
// error.
func call(t testing.TB, cs *mcp.ClientSession, tool, args string) *mcp.CallToolResult {
	t.Helper()
	r := await(t, callAsync(t, t.Context(), cs, tool, args))
	if r.err != nil {
		t.Fatalf("call %s: %v", tool, r.err)
	}
	return r.res
}

// verdict reads what the gateway said of the decision from res's _meta.
func verdict(t testing.TB, res *mcp.CallToolResult) mcpgateway.Verdict {
	t.Helper()
	raw, err := json.Marshal(res.Meta[mcpgateway.MetaKey])
	if err != nil {
		t.Fatal(err)
	}
	var v mcpgateway.Verdict
	if err := json.Unmarshal(raw, &v); err != nil || v.RequestID == "" {
		t.Fatalf("no verdict in _meta %v: %v", res.Meta, err)
	}
	return v
}

// text is the text of res's first content.
func text(t testing.TB, res *mcp.CallToolResult) string {
	t.Helper()
	if len(res.Content) == 0 {
		t.Fatalf("no content in %+v", res)
	}
	tc, ok := res.Content[0].(*mcp.TextContent)
	if !ok {
		t.Fatalf("content %T, want text", res.Content[0])
	}
	return tc.Text
}

// upstreamTool is the upstream's tool name, as a client of it reads it.
func (f *fixture) upstreamTool(t testing.TB, name string) *mcp.Tool {
	t.Helper()
	for tool, err := range f.direct.Tools(t.Context(), nil) {
		if err != nil {
			t.Fatal(err)
		}
		if tool.Name == name {
			return tool
		}
	}
	t.Fatalf("the upstream has no tool %s", name)
	return nil
}

// runGateway starts a gateway on nc with cfg, closed when the test ends.
func runGateway(t testing.TB, nc *nats.Conn, cfg mcpgateway.Config) *mcpgateway.Gateway {
	t.Helper()
	gw, err := mcpgateway.New(nc, cfg, testenv.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := gw.Close(); err != nil {
			t.Errorf("close the gateway: %v", err)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	if err := gw.Start(ctx); err != nil {
		t.Fatal(err)
	}
	return gw
}
