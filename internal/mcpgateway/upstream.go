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
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.uber.org/zap"
)

// upstream is a connected upstream server.
type upstream struct {
	cfg     Upstream
	session *mcp.ClientSession
	// changed is signalled when the server says its tools changed.
	changed chan struct{}
	// stderr is what a stdio server writes on its stderr; nil for a URL.
	stderr *stderrLog
}

// close ends the session with u (a stdio server is stopped) and stops
// reading its stderr.
func (u *upstream) close() error {
	err := u.session.Close()
	u.stderr.close()
	return err
}

// offer is a tool the gateway offers: whose it is, and the JSON the
// upstream listed it as (to tell a change from a repeat).
type offer struct {
	upstream *upstream
	raw      []byte
}

// connect starts or reaches the upstream server of cfg and opens an MCP
// session with it.
func connect(ctx context.Context, cfg Upstream, log *zap.Logger) (*upstream, error) {
	u := &upstream{cfg: cfg, changed: make(chan struct{}, 1)}
	client := mcp.NewClient(&mcp.Implementation{Name: "assent-mcp-gateway", Version: version()}, &mcp.ClientOptions{
		ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) {
			select { // one pending refresh covers any number of changes
			case u.changed <- struct{}{}:
			default:
			}
		},
	})
	var t mcp.Transport
	var stderr *os.File // the server's end of its stderr pipe
	where := cfg.URL
	if cfg.Command != "" {
		cmd := exec.Command(cfg.Command, cfg.Args...)
		cmd.Dir = cfg.Dir
		cmd.Env = os.Environ()
		for k, v := range cfg.Env {
			cmd.Env = append(cmd.Env, k+"="+v)
		}
		// A pipe of our own, not a writer exec copies into, so that the
		// end of the server's stderr is known: EOF once it exits.
		r, w, err := os.Pipe()
		if err != nil {
			return nil, fmt.Errorf("upstream %s: %w", cfg.Name, err)
		}
		cmd.Stderr, stderr = w, w
		u.stderr = readStderr(r, log.With(zap.String("upstream", cfg.Name)))
		t = &mcp.CommandTransport{Command: cmd}
		where = strings.Join(append([]string{cfg.Command}, cfg.Args...), " ")
	} else {
		t = &mcp.StreamableClientTransport{Endpoint: cfg.URL, HTTPClient: &http.Client{Transport: headers{cfg.Headers, http.DefaultTransport}}}
	}
	cs, err := client.Connect(ctx, t, nil)
	if stderr != nil {
		// The server has its own copy once started (or none, if it could
		// not be): its stderr ends when it does.
		_ = stderr.Close()
	}
	if err != nil {
		err = fmt.Errorf("upstream %s (%s): connect: %w", cfg.Name, where, err)
		if u.stderr != nil {
			// The SDK has stopped the server.
			u.stderr.close()
			err = fmt.Errorf("%w%s", err, u.stderr.tail())
		}
		return nil, err
	}
	u.session = cs
	return u, nil
}

// serverName is the name the server gives itself (serverInfo.name), as a
// subject token; "" if it gives none.
func (u *upstream) serverName() string {
	if r := u.session.InitializeResult(); r != nil && r.ServerInfo != nil {
		return tokenOf(r.ServerInfo.Name, "")
	}
	return ""
}

// sync offers u's tools as u lists them now: new and changed ones are
// offered, gone ones withdrawn. A tool whose name another upstream offers
// already is an error wrapping ErrToolConflict when strict (at start), else
// it is left out with a warning.
func (g *Gateway) sync(ctx context.Context, u *upstream, strict bool) error {
	var tools []*mcp.Tool
	for t, err := range u.session.Tools(ctx, nil) {
		if err != nil {
			return fmt.Errorf("upstream %s: list tools: %w", u.cfg.Name, err)
		}
		tools = append(tools, t)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	var errs []error
	want := map[string]bool{}
	for _, t := range tools {
		name := u.cfg.Prefix + t.Name
		if o, taken := g.offered[name]; taken && o.upstream != u {
			err := fmt.Errorf("%w: %s is offered by upstreams %s and %s: give one of them a prefix", ErrToolConflict, name, o.upstream.cfg.Name, u.cfg.Name)
			if strict {
				errs = append(errs, err)
			} else {
				g.log.Warn("tool left out", zap.Error(err))
			}
			continue
		}
		want[name] = true
		raw, _ := json.Marshal(t)
		if o, ok := g.offered[name]; ok && bytes.Equal(o.raw, raw) {
			continue
		}
		if err := g.add(name, u, t); err != nil {
			g.log.Warn("tool left out", zap.String("upstream", u.cfg.Name), zap.String("tool", t.Name), zap.Error(err))
			delete(want, name)
			continue
		}
		g.offered[name] = offer{upstream: u, raw: raw}
	}
	var gone []string
	for name, o := range g.offered {
		if o.upstream == u && !want[name] {
			gone = append(gone, name)
			delete(g.offered, name)
		}
	}
	g.server.RemoveTools(gone...)
	return errors.Join(errs...)
}

// add offers t of u as name: the upstream's tool, renamed only. The SDK
// panics on a tool it cannot offer (an input schema that is not an object);
// that is an error here, the upstream's data being no reason to stop.
func (g *Gateway) add(name string, u *upstream, t *mcp.Tool) (err error) {
	if s, ok := t.InputSchema.(map[string]any); !ok || s["type"] != "object" {
		return fmt.Errorf("input schema %v: MCP wants a JSON Schema of type object", t.InputSchema)
	}
	offered := *t
	offered.Name = name
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%v", r)
		}
	}()
	g.server.AddTool(&offered, func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return g.call(ctx, req, u, t)
	})
	return nil
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
