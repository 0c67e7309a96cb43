package mcpconformance

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/http/httptrace"
	"strings"
	"sync"
	"time"
)

// DialHTTP speaks MCP's streamable HTTP transport with the server at url:
// each message is a POST (Accept: application/json, text/event-stream)
// whose answer is 202, one JSON message, or an SSE stream of messages;
// the Mcp-Session-Id the server gives with its initialize answer goes with
// every later request, and MCP-Protocol-Version once negotiated. Listen
// opens the GET stream for what the server sends outside any request;
// Close DELETEs the session.
func DialHTTP(url string) *Conn {
	c := newConn()
	ctx, cancel := context.WithCancel(context.Background())
	c.tr = &httpTransport{url: url, client: &http.Client{}, deliver: c.deliver, note: c.Note, ctx: ctx, cancel: cancel, errs: &tailBuffer{max: 16 << 10}}
	return c
}

type httpTransport struct {
	url     string
	client  *http.Client
	deliver func([]byte)
	note    func(format string, args ...any)
	// ctx ends every stream: a stream outlives the step that opened it.
	ctx    context.Context
	cancel context.CancelFunc
	errs   *tailBuffer // what went wrong reading streams

	mu       sync.Mutex
	sid      string
	protocol string
	streams  sync.WaitGroup // the requests in flight and the streams being read
	closed   bool
}

// SetProtocolVersion makes the client send version in MCP-Protocol-Version
// from now on, as it must once initialize negotiated it; over stdio it does
// nothing.
func (c *Conn) SetProtocolVersion(version string) {
	if h, ok := c.tr.(*httpTransport); ok {
		h.mu.Lock()
		h.protocol = version
		h.mu.Unlock()
	}
}

// Listen opens the GET stream on which a streamable HTTP server sends what
// belongs to no request, and returns once the server has answered it; over
// stdio, or when the server offers no such stream (405), it does nothing.
func (c *Conn) Listen(ctx context.Context) error {
	h, ok := c.tr.(*httpTransport)
	if !ok {
		return nil
	}
	req, err := h.request(ctx, http.MethodGet, nil)
	if err != nil {
		return err
	}
	req.Header.Set("Accept", "text/event-stream")
	resp, err := h.do(ctx, req)
	if err != nil {
		return fmt.Errorf("GET stream: %w", err)
	}
	if resp.StatusCode == http.StatusMethodNotAllowed {
		resp.Body.Close()
		return nil
	}
	if resp.StatusCode != http.StatusOK || !isEventStream(resp) {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		resp.Body.Close()
		return fmt.Errorf("GET stream: %s: %s", resp.Status, body)
	}
	h.readSSE(resp)
	return nil
}

// request makes a request whose life is the transport's, not ctx's: a
// response stream goes on after the step that opened it. ctx bounds only
// the wait for the response's headers (do).
func (h *httpTransport) request(_ context.Context, method string, body []byte) (*http.Request, error) {
	var r io.Reader
	if body != nil {
		r = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(h.ctx, method, h.url, r)
	if err != nil {
		return nil, err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.sid != "" {
		req.Header.Set("Mcp-Session-Id", h.sid)
	}
	if h.protocol != "" {
		req.Header.Set("MCP-Protocol-Version", h.protocol)
	}
	return req, nil
}

// do sends req, giving up when ctx ends before the response's headers.
func (h *httpTransport) do(ctx context.Context, req *http.Request) (*http.Response, error) {
	type result struct {
		resp *http.Response
		err  error
	}
	ch := make(chan result, 1)
	if !h.track(func() {
		resp, err := h.client.Do(req)
		ch <- result{resp, err}
	}) {
		return nil, errClosed
	}
	select {
	case r := <-ch:
		return r.resp, r.err
	case <-ctx.Done():
		// Given up on: its response, when it comes (at the latest when
		// close ends every request), is dropped.
		if !h.track(func() {
			if r := <-ch; r.resp != nil {
				r.resp.Body.Close()
			}
		}) {
			// Closing: close ends every request, this one too.
			if r := <-ch; r.resp != nil {
				r.resp.Body.Close()
			}
		}
		return nil, context.Cause(ctx)
	}
}

// send POSTs msg and returns once the request is written, not when the
// server answers: a server may hold the answer's headers until the answer
// is ready (a JSON answer to a slow call), and the client must be free to
// send meanwhile (the cancellation of that call). The answer is read in a
// goroutine close waits for: 202, one JSON message, or an SSE stream; what
// goes wrong there is noted on the Conn.
func (h *httpTransport) send(ctx context.Context, msg []byte) error {
	req, err := h.request(ctx, http.MethodPost, msg)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	wrote := make(chan error, 1)
	failed := make(chan error, 1)
	req = req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{
		// Called again when net/http retries on a fresh connection:
		// the first call is the one waited for.
		WroteRequest: func(i httptrace.WroteRequestInfo) {
			select {
			case wrote <- i.Err:
			default:
			}
		},
	}))
	what := "a response"
	if m, err := parseMessage(msg); err == nil && m.Method != "" {
		what = m.Method
	}
	started := h.track(func() {
		resp, err := h.client.Do(req)
		if err != nil {
			failed <- err
			if h.ctx.Err() == nil {
				h.note("POST %s: %v", what, err)
			}
			return
		}
		if err := h.answer(resp); err != nil {
			h.note("POST %s: %v", what, err)
		}
	})
	if !started {
		return fmt.Errorf("POST %s: %w", what, errClosed)
	}
	select {
	case err := <-wrote:
		if err != nil {
			return fmt.Errorf("POST %s: %w", what, err)
		}
		return nil
	case err := <-failed:
		return fmt.Errorf("POST %s: %w", what, err)
	case <-ctx.Done():
		return fmt.Errorf("POST %s: %w", what, context.Cause(ctx))
	}
}

// answer reads the server's answer to a POST.
func (h *httpTransport) answer(resp *http.Response) error {
	defer resp.Body.Close()
	if sid := resp.Header.Get("Mcp-Session-Id"); sid != "" {
		h.mu.Lock()
		if h.sid == "" {
			h.sid = sid
		}
		h.mu.Unlock()
	}
	switch {
	case resp.StatusCode == http.StatusAccepted:
		_, _ = io.Copy(io.Discard, resp.Body)
		return nil
	case resp.StatusCode/100 == 2 && isEventStream(resp):
		h.readEvents(resp)
		return nil
	}
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return fmt.Errorf("%s: %w", resp.Status, err)
	}
	if m, perr := parseMessage(body); perr == nil && m.kind() == kindResponse {
		// A JSON answer, or an HTTP error that carries the JSON-RPC
		// error of the request: either is the server's answer.
		h.deliver(body)
		return nil
	}
	if resp.StatusCode/100 == 2 && json.Valid(body) {
		h.deliver(body)
		return nil
	}
	return fmt.Errorf("%s: %s", resp.Status, bytes.TrimSpace(body))
}

func isEventStream(resp *http.Response) bool {
	mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	return mt == "text/event-stream"
}

// readSSE reads resp's event stream (readEvents) in a goroutine close
// waits for.
func (h *httpTransport) readSSE(resp *http.Response) {
	if !h.track(func() {
		defer resp.Body.Close()
		h.readEvents(resp)
	}) {
		resp.Body.Close()
	}
}

// errClosed is returned for what is sent once the session is closed.
var errClosed = errors.New("the session is closed")

// track runs f in a goroutine close waits for, unless close has begun:
// then it returns false and f does not run.
func (h *httpTransport) track(f func()) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return false
	}
	h.streams.Go(f)
	return true
}

// readEvents hands the data of every event on resp's stream to deliver,
// until the stream ends.
func (h *httpTransport) readEvents(resp *http.Response) {
	r := bufio.NewReaderSize(resp.Body, 1<<20)
	var data []string
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			if h.ctx.Err() == nil && err != io.EOF {
				fmt.Fprintf(h.errs, "SSE stream %s: %v\n", resp.Request.Method, err)
			}
			return
		}
		line = strings.TrimRight(line, "\r\n")
		switch {
		case line == "":
			// An event ends. Events without data (a priming event that
			// carries only an id, a retry hint) are no message.
			if d := strings.Join(data, "\n"); strings.TrimSpace(d) != "" {
				h.deliver([]byte(d))
			}
			data = nil
		case strings.HasPrefix(line, "data:"):
			data = append(data, strings.TrimPrefix(strings.TrimPrefix(line, "data:"), " "))
		}
		// "id:", "event:", "retry:" and ":" comments carry no message.
	}
}

func (h *httpTransport) close(ctx context.Context) error {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return nil
	}
	h.closed = true
	sid := h.sid
	h.mu.Unlock()
	var err error
	if sid != "" {
		dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		req, rerr := http.NewRequestWithContext(dctx, http.MethodDelete, h.url, nil)
		if rerr == nil {
			req.Header.Set("Mcp-Session-Id", sid)
			h.mu.Lock()
			if h.protocol != "" {
				req.Header.Set("MCP-Protocol-Version", h.protocol)
			}
			h.mu.Unlock()
			resp, derr := h.client.Do(req)
			if derr != nil {
				err = fmt.Errorf("DELETE session: %w", derr)
			} else {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode/100 != 2 && resp.StatusCode != http.StatusMethodNotAllowed {
					err = fmt.Errorf("DELETE session: %s", resp.Status)
				}
			}
		}
		cancel()
	}
	h.cancel()
	h.streams.Wait()
	h.client.CloseIdleConnections()
	return err
}

func (h *httpTransport) session() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.sid
}

func (h *httpTransport) diagnostics() string {
	return "HTTP streams:\n" + h.errs.String()
}
