package mcpgateway

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"go.uber.org/zap"
)

// httpServer serves clients over MCP's streamable HTTP transport: a POST
// carries a client's message; the reply to a request comes as a stream of
// server-sent events, which carries before it what the gateway (or an
// upstream) sends about that request: progress, a question for the user,
// a sampling request. A GET holds a stream for the rest. The session's id
// is in Mcp-Session-Id from initialize on; DELETE ends it.
type httpServer struct {
	g *Gateway

	mu       sync.Mutex
	sessions map[string]*httpSession
	janitor  sync.Once
}

// maxHTTPBody bounds a client's POST.
const maxHTTPBody = 4 << 20

// keepAlive is how often an idle stream carries a comment, so that proxies
// on the way keep it open.
const keepAlive = 25 * time.Second

func newHTTPServer(g *Gateway) *httpServer {
	return &httpServer{g: g, sessions: map[string]*httpSession{}}
}

// httpSession is a client's session over HTTP: an mcp.Connection for the
// gateway's session, whose writes go to the streams the client holds open.
type httpSession struct {
	id       string
	in       chan jsonrpc.Message
	closed   chan struct{}
	once     sync.Once
	session  *session
	finished chan struct{}

	seen    time.Time // the last request
	streams int       // open responses

	mu      sync.Mutex
	open    map[string]*sseStream // by idKey of the request whose POST it answers
	listen  *sseStream            // the GET stream
	backlog [][]byte              // for the GET stream, until there is one
}

// sseStream is one open response carrying events: writers send on out
// until gone is closed, once the response ended; stop asks a GET stream to
// end (the client opened another).
type sseStream struct {
	out  chan []byte
	gone chan struct{}
	stop chan struct{}
}

func newStream() *sseStream {
	return &sseStream{out: make(chan []byte, 16), gone: make(chan struct{}), stop: make(chan struct{})}
}

// maxBacklog bounds what waits for a client to open its GET stream.
const maxBacklog = 1024

func (h *httpServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !sameOrigin(r) {
		http.Error(w, "Forbidden: the Origin header names another host", http.StatusForbidden)
		return
	}
	switch r.Method {
	case http.MethodPost:
		h.post(w, r)
	case http.MethodGet:
		h.get(w, r)
	case http.MethodDelete:
		h.delete(w, r)
	default:
		w.Header().Set("Allow", "GET, POST, DELETE")
		http.Error(w, "Method Not Allowed", http.StatusMethodNotAllowed)
	}
}

// sameOrigin reports whether a browser's request comes from a page of the
// gateway's own host (or from no page): a page elsewhere must not drive a
// local gateway (DNS rebinding).
func sameOrigin(r *http.Request) bool {
	o := r.Header.Get("Origin")
	if o == "" {
		return true
	}
	u, err := url.Parse(o)
	return err == nil && strings.EqualFold(u.Host, r.Host)
}

// session is the session the request names; it answers 404 or 400 itself
// when there is none.
func (h *httpServer) session(w http.ResponseWriter, r *http.Request) *httpSession {
	id := r.Header.Get("Mcp-Session-Id")
	if id == "" {
		http.Error(w, "Bad Request: no Mcp-Session-Id: initialize first", http.StatusBadRequest)
		return nil
	}
	h.mu.Lock()
	hs := h.sessions[id]
	h.mu.Unlock()
	if hs == nil {
		http.Error(w, "Not Found: no such session (it ended, or the gateway restarted): initialize again", http.StatusNotFound)
		return nil
	}
	hs.touch()
	return hs
}

// touch notes a request of the client's.
func (hs *httpSession) touch() {
	hs.mu.Lock()
	hs.seen = time.Now()
	hs.mu.Unlock()
}

// opened notes a response that stays open (+1) or ended (-1).
func (hs *httpSession) opened(n int) {
	hs.mu.Lock()
	hs.streams += n
	hs.seen = time.Now()
	hs.mu.Unlock()
}

// idle reports whether the session had no request and no open response
// for d.
func (hs *httpSession) idle(now time.Time, d time.Duration) bool {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	return hs.streams == 0 && now.Sub(hs.seen) > d
}

// sweep ends the sessions idle for Config.SessionIdle, looking every tenth
// of it, until the gateway closes.
func (h *httpServer) sweep() {
	d := h.g.cfg.SessionIdle
	tick := time.NewTicker(max(d/10, 10*time.Millisecond))
	defer tick.Stop()
	for {
		select {
		case <-h.g.bg.Done():
			return
		case now := <-tick.C:
			h.mu.Lock()
			var idle []*httpSession
			for _, hs := range h.sessions {
				if hs.idle(now, d) {
					idle = append(idle, hs)
				}
			}
			h.mu.Unlock()
			for _, hs := range idle {
				h.g.log.Info("client session idle: ending it", zap.String("mcp_session", hs.id), zap.Duration("idle", d))
				hs.session.stop(fmt.Errorf("%w: idle for %s", ErrClientGone, d))
				_ = hs.Close()
			}
		}
	}
}

func (h *httpServer) post(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxHTTPBody))
	if err != nil {
		status := http.StatusBadRequest
		if mbe := (*http.MaxBytesError)(nil); errors.As(err, &mbe) {
			status = http.StatusRequestEntityTooLarge
		}
		http.Error(w, "read the request: "+err.Error(), status)
		return
	}
	msgs, err := decodeBody(body)
	if err != nil || len(msgs) == 0 {
		writeJSONError(w, http.StatusBadRequest, codeParseError, fmt.Sprintf("not a JSON-RPC message: %v", err))
		return
	}
	var hs *httpSession
	if r.Header.Get("Mcp-Session-Id") == "" {
		init, ok := msgs[0].(*jsonrpc.Request)
		if !ok || init.Method != "initialize" || len(msgs) > 1 {
			http.Error(w, "Bad Request: no Mcp-Session-Id: the first message of a session is initialize, alone", http.StatusBadRequest)
			return
		}
		if hs = h.open(); hs == nil {
			http.Error(w, "Service Unavailable: the gateway is stopping", http.StatusServiceUnavailable)
			return
		}
	} else if hs = h.session(w, r); hs == nil {
		return
	}
	// The stream of this POST answers its requests.
	var calls []string
	s := newStream()
	for _, m := range msgs {
		if req, ok := m.(*jsonrpc.Request); ok && req.IsCall() {
			calls = append(calls, idKey(req.ID))
		}
	}
	hs.mu.Lock()
	for _, k := range calls {
		hs.open[k] = s
	}
	hs.mu.Unlock()
	defer func() {
		hs.mu.Lock()
		for _, k := range calls {
			if hs.open[k] == s {
				delete(hs.open, k)
			}
		}
		hs.mu.Unlock()
		close(s.gone)
	}()
	for _, m := range msgs {
		select {
		case hs.in <- m:
		case <-hs.closed:
			http.Error(w, "Not Found: the session ended", http.StatusNotFound)
			return
		}
	}
	w.Header().Set("Mcp-Session-Id", hs.id)
	if len(calls) == 0 {
		w.WriteHeader(http.StatusAccepted)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	flush(w)
	hs.opened(1)
	defer hs.opened(-1)
	answered := 0
	tick := time.NewTicker(keepAlive)
	defer tick.Stop()
	for answered < len(calls) {
		select {
		case ev := <-s.out:
			if ev == nil { // an answer: the last event about its request
				answered++
				continue
			}
			if _, err := w.Write(ev); err != nil {
				return
			}
			flush(w)
		case <-tick.C:
			if _, err := io.WriteString(w, ": keep-alive\n\n"); err != nil {
				return
			}
			flush(w)
		case <-r.Context().Done():
			// The client stopped reading; what comes later about its
			// requests goes to its GET stream.
			return
		case <-hs.closed:
			return
		}
	}
}

// codeParseError is JSON-RPC's parse error.
const codeParseError = -32700

// writeJSONError answers an HTTP request with a JSON-RPC error.
func writeJSONError(w http.ResponseWriter, status int, code int64, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"jsonrpc": "2.0", "id": nil, "error": map[string]any{"code": code, "message": msg}})
}

func flush(w http.ResponseWriter) {
	if f, ok := w.(http.Flusher); ok {
		f.Flush()
	}
}

// open makes a session and starts serving it; nil once the gateway is
// closing.
func (h *httpServer) open() *httpSession {
	hs := &httpSession{id: rand.Text(), in: make(chan jsonrpc.Message, 16), closed: make(chan struct{}),
		open: map[string]*sseStream{}, finished: make(chan struct{}), seen: time.Now()}
	s := h.g.newSession(hs, hs.id, true, false)
	if !h.g.register(s) {
		return nil
	}
	h.janitor.Do(func() { h.g.wg.Go(h.sweep) })
	hs.session = s
	h.mu.Lock()
	h.sessions[hs.id] = hs
	h.mu.Unlock()
	go func() {
		defer close(hs.finished)
		defer h.g.unregister(s)
		if err := s.run(); err != nil {
			h.g.log.Info("client session ended", zap.String("mcp_session", hs.id), zap.Error(err))
		}
		h.mu.Lock()
		delete(h.sessions, hs.id)
		h.mu.Unlock()
	}()
	return hs
}

func (h *httpServer) get(w http.ResponseWriter, r *http.Request) {
	if !strings.Contains(r.Header.Get("Accept"), "text/event-stream") {
		http.Error(w, "Not Acceptable: the GET stream is text/event-stream", http.StatusNotAcceptable)
		return
	}
	hs := h.session(w, r)
	if hs == nil {
		return
	}
	s := newStream()
	hs.mu.Lock()
	old := hs.listen
	hs.listen = s
	backlog := hs.backlog
	hs.backlog = nil
	hs.mu.Unlock()
	if old != nil {
		close(old.stop) // the client opened another: this one ends
	}
	defer func() {
		hs.mu.Lock()
		if hs.listen == s {
			hs.listen = nil
		}
		hs.mu.Unlock()
		close(s.gone)
	}()
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.Header().Set("Mcp-Session-Id", hs.id)
	w.WriteHeader(http.StatusOK)
	hs.opened(1)
	defer hs.opened(-1)
	for _, ev := range backlog {
		if _, err := w.Write(ev); err != nil {
			return
		}
	}
	flush(w)
	tick := time.NewTicker(keepAlive)
	defer tick.Stop()
	for {
		select {
		case <-s.stop:
			return
		case ev := <-s.out:
			if _, err := w.Write(ev); err != nil {
				return
			}
			flush(w)
		case <-tick.C:
			if _, err := io.WriteString(w, ": keep-alive\n\n"); err != nil {
				return
			}
			flush(w)
		case <-r.Context().Done():
			return
		case <-hs.closed:
			return
		}
	}
}

func (h *httpServer) delete(w http.ResponseWriter, r *http.Request) {
	hs := h.session(w, r)
	if hs == nil {
		return
	}
	hs.session.stop(fmt.Errorf("%w: the client ended its session", ErrClientGone))
	_ = hs.Close()
	<-hs.finished
	w.WriteHeader(http.StatusNoContent)
}

// The mcp.Connection of the gateway's session.

func (hs *httpSession) SessionID() string { return hs.id }

func (hs *httpSession) Read(ctx context.Context) (jsonrpc.Message, error) {
	select {
	case m := <-hs.in:
		return m, nil
	case <-hs.closed:
		return nil, io.EOF
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// Write sends m on the stream of the request it answers or is about (the
// relatedKey of ctx), else on the GET stream, else keeps it until the
// client opens one.
func (hs *httpSession) Write(ctx context.Context, m jsonrpc.Message) error {
	data, err := jsonrpc.EncodeMessage(m)
	if err != nil {
		return err
	}
	ev := []byte("event: message\ndata: " + string(data) + "\n\n")
	var about jsonrpc.ID
	resp, isAnswer := m.(*jsonrpc.Response)
	if isAnswer {
		about = resp.ID
	} else if id, ok := ctx.Value(relatedKey{}).(jsonrpc.ID); ok {
		about = id
	}
	hs.mu.Lock()
	var s *sseStream
	if about.IsValid() {
		s = hs.open[idKey(about)]
	}
	if s == nil {
		s = hs.listen
	}
	if s == nil {
		if len(hs.backlog) == maxBacklog {
			hs.backlog = hs.backlog[1:]
		}
		hs.backlog = append(hs.backlog, ev)
		hs.mu.Unlock()
		return nil
	}
	hs.mu.Unlock()
	for _, e := range [][]byte{ev, nil} {
		if e == nil && (!isAnswer || s == hs.listenOf()) {
			break
		}
		select {
		case s.out <- e:
		case <-s.gone:
			if e != nil {
				// The stream ended meanwhile: the GET stream takes it.
				return hs.Write(context.WithoutCancel(context.Background()), m)
			}
		case <-hs.closed:
			return io.ErrClosedPipe
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

func (hs *httpSession) listenOf() *sseStream {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	return hs.listen
}

func (hs *httpSession) Close() error {
	hs.once.Do(func() { close(hs.closed) })
	return nil
}
