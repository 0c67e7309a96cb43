package mcpgateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.uber.org/zap"
)

// upstream is a connected upstream server.
type upstream struct {
	cfg     Upstream
	session *mcp.ClientSession
	// changed is signalled when the server says its tools changed.
	changed chan struct{}
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
	where := cfg.URL
	if cfg.Command != "" {
		cmd := exec.Command(cfg.Command, cfg.Args...)
		cmd.Dir = cfg.Dir
		cmd.Env = os.Environ()
		for k, v := range cfg.Env {
			cmd.Env = append(cmd.Env, k+"="+v)
		}
		cmd.Stderr = &lineLog{log: log.With(zap.String("upstream", cfg.Name))}
		t = &mcp.CommandTransport{Command: cmd}
		where = strings.Join(append([]string{cfg.Command}, cfg.Args...), " ")
	} else {
		t = &mcp.StreamableClientTransport{Endpoint: cfg.URL, HTTPClient: &http.Client{Transport: headers{cfg.Headers, http.DefaultTransport}}}
	}
	cs, err := client.Connect(ctx, t, nil)
	if err != nil {
		return nil, fmt.Errorf("upstream %s (%s): connect: %w", cfg.Name, where, err)
	}
	u.session = cs
	return u, nil
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

// lineLog logs what a stdio upstream writes on its stderr, a line at a time.
type lineLog struct {
	log     *zap.Logger
	partial []byte
}

func (l *lineLog) Write(p []byte) (int, error) {
	l.partial = append(l.partial, p...)
	for {
		i := bytes.IndexByte(l.partial, '\n')
		if i < 0 {
			break
		}
		if line := strings.TrimSpace(string(l.partial[:i])); line != "" {
			l.log.Info("upstream stderr", zap.String("line", line))
		}
		l.partial = l.partial[i+1:]
	}
	if len(l.partial) > 4096 { // a line that never ends is logged in pieces
		l.log.Info("upstream stderr", zap.String("line", string(l.partial)))
		l.partial = nil
	}
	return len(p), nil
}
