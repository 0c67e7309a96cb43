package mcpgateway

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.uber.org/zap"
)

// link is one MCP session with an upstream server, on behalf of one client
// session (or of the gateway itself, to look at the server at start): the
// gateway speaks to it in JSON-RPC messages, with ids of its own.
type link struct {
	cfg  Upstream
	conn mcp.Connection
	// stderr is what a stdio server writes on its stderr; nil for a URL.
	stderr *stderrLog
	where  string // the command line, or the URL, for messages

	// init is the server's answer to initialize.
	init object

	next    atomic.Int64
	mu      sync.Mutex
	waiting map[string]chan *jsonrpc.Response // by idKey of the gateway's id
	// calls are the requests forwarded to the server and not answered:
	// by the gateway's id, the progress token and the client's request
	// they came with (for telling which request a message relates to).
	calls map[string]forwarded
	done  chan struct{} // closed when the connection ended
	err   error         // why, once done
}

// forwarded is a request forwarded to an upstream.
type forwarded struct {
	client jsonrpc.ID // the client's id of it
	token  string     // its progress token, or ""
}

// errLinkEnded: the upstream's connection ended before it answered.
var errLinkEnded = errors.New("the upstream's connection ended")

// dial starts or reaches the upstream server of cfg.
func dial(ctx context.Context, cfg Upstream, log *zap.Logger) (*link, error) {
	l := &link{cfg: cfg, waiting: map[string]chan *jsonrpc.Response{}, calls: map[string]forwarded{}, done: make(chan struct{}), where: cfg.URL}
	if cfg.Command == "" {
		c, err := dialHTTP(ctx, cfg.URL, &http.Client{Transport: headers{cfg.Headers, http.DefaultTransport}})
		if err != nil {
			return nil, fmt.Errorf("upstream %s (%s): connect: %w", cfg.Name, cfg.URL, err)
		}
		l.conn = c
		return l, nil
	}
	cmd := exec.Command(cfg.Command, cfg.Args...)
	cmd.Dir = cfg.Dir
	cmd.Env = os.Environ()
	for k, v := range cfg.Env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	// A pipe of our own, not a writer exec copies into, so that the end of
	// the server's stderr is known: EOF once it exits.
	r, w, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("upstream %s: %w", cfg.Name, err)
	}
	cmd.Stderr = w
	l.stderr = readStderr(r, log.With(zap.String("upstream", cfg.Name)))
	l.where = strings.Join(append([]string{cfg.Command}, cfg.Args...), " ")
	conn, err := (&mcp.CommandTransport{Command: cmd}).Connect(ctx)
	// The server has its own copy once started (or none, if it could not
	// be): its stderr ends when it does.
	_ = w.Close()
	if err != nil {
		l.stderr.close()
		return nil, fmt.Errorf("upstream %s (%s): start: %w%s", cfg.Name, l.where, err, l.stderr.tail())
	}
	l.conn = conn
	return l, nil
}

// run reads the upstream's messages until its connection ends: answers to
// the gateway's requests go to their waiters, the rest to handle.
func (l *link) run(ctx context.Context, handle func(jsonrpc.Message)) {
	defer func() {
		l.mu.Lock()
		for _, ch := range l.waiting {
			close(ch)
		}
		l.waiting = map[string]chan *jsonrpc.Response{}
		l.mu.Unlock()
		close(l.done)
	}()
	for {
		m, err := l.conn.Read(ctx)
		if err != nil {
			l.mu.Lock()
			l.err = err
			l.mu.Unlock()
			return
		}
		if resp, ok := m.(*jsonrpc.Response); ok {
			l.mu.Lock()
			ch := l.waiting[idKey(resp.ID)]
			delete(l.waiting, idKey(resp.ID))
			l.mu.Unlock()
			if ch != nil {
				ch <- resp
			}
			continue
		}
		handle(m)
	}
}

// ended is why the link's connection ended, with the server's last words.
func (l *link) ended() error {
	l.stderr.settle()
	l.mu.Lock()
	err := l.err
	l.mu.Unlock()
	return fmt.Errorf("%w: %s: %v%s", ErrUpstreamEnded, l.cfg.Name, err, l.stderr.tail())
}

// call sends the upstream a request and waits for its answer. f, when
// set, is what the request forwards for a client. When ctx ends first,
// the server is told the request is cancelled, with ctx's cause.
func (l *link) call(ctx context.Context, method string, params json.RawMessage, f *forwarded) (*jsonrpc.Response, error) {
	id, _ := jsonrpc.MakeID(float64(l.next.Add(1)))
	key := idKey(id)
	ch := make(chan *jsonrpc.Response, 1)
	l.mu.Lock()
	select {
	case <-l.done:
		l.mu.Unlock()
		return nil, errLinkEnded
	default:
	}
	l.waiting[key] = ch
	if f != nil {
		l.calls[key] = *f
	}
	l.mu.Unlock()
	defer func() {
		l.mu.Lock()
		delete(l.waiting, key)
		delete(l.calls, key)
		l.mu.Unlock()
	}()
	if err := l.conn.Write(ctx, &jsonrpc.Request{ID: id, Method: method, Params: params}); err != nil {
		return nil, fmt.Errorf("%w: %v", errLinkEnded, err)
	}
	select {
	case resp, ok := <-ch:
		if !ok {
			return nil, errLinkEnded
		}
		return resp, nil
	case <-ctx.Done():
		p := object{}
		p["requestId"] = rawID(id)
		if cause := context.Cause(ctx); cause != nil {
			p.set("reason", cut(cause.Error(), maxCancelReason))
		}
		_ = l.notify(context.WithoutCancel(ctx), "notifications/cancelled", p.bytes())
		return nil, context.Cause(ctx)
	}
}

// notify sends the upstream a notification.
func (l *link) notify(ctx context.Context, method string, params json.RawMessage) error {
	return l.conn.Write(ctx, &jsonrpc.Request{Method: method, Params: params})
}

// reply answers a request the upstream sent.
func (l *link) reply(ctx context.Context, resp *jsonrpc.Response) error {
	return l.conn.Write(ctx, resp)
}

// relatedTo is the client's request a message of the upstream relates to:
// the forwarded request whose progress token it names, else the one
// request forwarded and not yet answered; an invalid id if none is known.
func (l *link) relatedTo(token string) jsonrpc.ID {
	l.mu.Lock()
	defer l.mu.Unlock()
	var only jsonrpc.ID
	n := 0
	for _, f := range l.calls {
		if token != "" && f.token == token {
			return f.client
		}
		only = f.client
		n++
	}
	if token == "" && n == 1 {
		return only
	}
	return jsonrpc.ID{}
}

// close ends the session with the server (a stdio server is stopped) and
// stops reading its stderr.
func (l *link) close() error {
	err := l.conn.Close()
	l.stderr.close()
	return err
}

// initialize opens the MCP session: params are the client's initialize
// params (the gateway's own when it looks at the server alone), so that
// the server sees the client's name, capabilities and protocol version.
func (l *link) initialize(ctx context.Context, params json.RawMessage) error {
	resp, err := l.call(ctx, "initialize", params, nil)
	if err != nil {
		return fmt.Errorf("upstream %s (%s): connect: initialize: %w%s", l.cfg.Name, l.where, err, l.stderr.tail())
	}
	if resp.Error != nil {
		return fmt.Errorf("upstream %s (%s): connect: initialize: %w", l.cfg.Name, l.where, resp.Error)
	}
	init, err := objectOf(resp.Result)
	if err != nil {
		return fmt.Errorf("upstream %s (%s): initialize: the answer is not an object: %w", l.cfg.Name, l.where, err)
	}
	l.init = init
	return nil
}

// serverName is the name the server gives itself (serverInfo.name), as a
// subject token; "" if it gives none.
func (l *link) serverName() string {
	return tokenOf(l.init.obj("serverInfo").str("name"), "")
}

// capable reports whether the server declared capability c (tools,
// resources, prompts, logging, completions, tasks).
func (l *link) capable(c string) bool {
	v := bytes.TrimSpace(l.init.obj("capabilities")[c])
	return len(v) > 0 && string(v) != "null"
}

// list asks for every page of a list method (tools/list, prompts/list,
// resources/list, resources/templates/list) and returns the items under
// key, in the server's order.
func (l *link) list(ctx context.Context, method, key string) ([]object, error) {
	var items []object
	cursor := ""
	for page := 0; ; page++ {
		p := object{}
		if cursor != "" {
			p.set("cursor", cursor)
		}
		resp, err := l.call(ctx, method, p.bytes(), nil)
		if err != nil {
			return nil, err
		}
		if resp.Error != nil {
			return nil, resp.Error
		}
		res, err := objectOf(resp.Result)
		if err != nil {
			return nil, err
		}
		var got []object
		if err := json.Unmarshal(res[key], &got); err != nil && len(res[key]) > 0 {
			return nil, fmt.Errorf("%s: %s: %w", method, key, err)
		}
		items = append(items, got...)
		cursor = res.str("nextCursor")
		if cursor == "" || page > 1000 {
			return items, nil
		}
	}
}

// headers is an HTTP transport that adds an upstream's headers to each
// request.
type headers struct {
	h    map[string]string
	next http.RoundTripper
}

func (h headers) RoundTrip(r *http.Request) (*http.Response, error) {
	if len(h.h) == 0 {
		return h.next.RoundTrip(r)
	}
	r = r.Clone(r.Context())
	for k, v := range h.h {
		r.Header.Set(k, v)
	}
	return h.next.RoundTrip(r)
}

// stderrLog logs what a stdio upstream writes on its stderr, a line at a
// time at warn level (a server says there what went wrong, and stdout is the
// protocol's), and keeps the last lines for the error when the server fails
// to start or exits.
type stderrLog struct {
	r    *os.File
	log  *zap.Logger
	done chan struct{} // closed when r is read to its end

	mu   sync.Mutex
	last []string // the last stderrLines lines
}

// Bounds of what stderrLog keeps.
const (
	stderrLines    = 20
	stderrLineSize = 512
	// stderrWait bounds the wait for the rest of a server's stderr once
	// it stopped: a child of its own may keep the pipe open.
	stderrWait = time.Second
)

// readStderr reads r, a stdio server's stderr, until its end.
func readStderr(r *os.File, log *zap.Logger) *stderrLog {
	l := &stderrLog{r: r, log: log, done: make(chan struct{})}
	go func() {
		defer close(l.done)
		sc := bufio.NewScanner(r)
		sc.Buffer(make([]byte, 4096), 64*1024)
		sc.Split(scanLines)
		for sc.Scan() {
			if line := strings.TrimSpace(sc.Text()); line != "" {
				l.add(line)
			}
		}
	}()
	return l
}

// scanLines is bufio.ScanLines that also ends a line at 4096 bytes: a line
// that never ends is logged in pieces.
func scanLines(data []byte, atEOF bool) (int, []byte, error) {
	if i := bytes.IndexByte(data, '\n'); i < 0 && len(data) >= 4096 {
		return 4096, data[:4096], nil
	}
	return bufio.ScanLines(data, atEOF)
}

func (l *stderrLog) add(line string) {
	l.log.Warn("upstream stderr", zap.String("line", line))
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.last) == stderrLines {
		l.last = l.last[1:]
	}
	l.last = append(l.last, cut(line, stderrLineSize))
}

// settle waits stderrWait at most for the rest of the stderr of a server
// that stopped. It is safe to call on nil.
func (l *stderrLog) settle() {
	if l == nil {
		return
	}
	select {
	case <-l.done:
	case <-time.After(stderrWait):
	}
}

// close settles, then stops reading. It is safe to call twice, and on nil.
func (l *stderrLog) close() {
	if l == nil {
		return
	}
	l.settle()
	_ = l.r.Close() // ends a read that waits still
	<-l.done
}

// tail is the last lines of the server's stderr, for an error message, on
// one line as commands print errors: "; its stderr ended with: a | b"; ""
// if it wrote none.
func (l *stderrLog) tail() string {
	if l == nil {
		return ""
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.last) == 0 {
		return ""
	}
	return "; its stderr ended with: " + strings.Join(l.last, " | ")
}
