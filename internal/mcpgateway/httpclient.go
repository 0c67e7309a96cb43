package mcpgateway

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
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
)

// httpConn is the client side of MCP's streamable HTTP transport, for an
// upstream reached by URL: each message the gateway sends is a POST, whose
// answer is the server's reply as JSON or as a stream of server-sent
// events (the reply, and what the server sends meanwhile about that
// request); once the session is open, a GET holds a stream for what the
// server sends unprompted. It is an mcp.Connection, and tells for each
// message the server sent on a request's stream which request that was.
type httpConn struct {
	url string
	hc  *http.Client

	ctx    context.Context // ends with Close: every stream
	cancel context.CancelFunc
	in     chan jsonrpc.Message
	once   sync.Once

	mu       sync.Mutex
	session  string // Mcp-Session-Id, once the server gave one
	version  string // the protocol version agreed, once known
	initID   string // idKey of the initialize request in flight
	listen   bool   // the GET stream was started
	related  map[*jsonrpc.Request]jsonrpc.ID
	failure  error
	finished chan struct{}
}

// maxHTTPMessage bounds one message read from an upstream over HTTP.
const maxHTTPMessage = 32 << 20

// dialHTTP returns a connection to the MCP endpoint url; nothing is sent
// until the first message.
func dialHTTP(_ context.Context, url string, hc *http.Client) (*httpConn, error) {
	c := &httpConn{url: url, hc: hc, in: make(chan jsonrpc.Message, 64), related: map[*jsonrpc.Request]jsonrpc.ID{}, finished: make(chan struct{})}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	return c, nil
}

func (c *httpConn) SessionID() string { return "" }

// Read returns the next message the server sent.
func (c *httpConn) Read(ctx context.Context) (jsonrpc.Message, error) {
	select {
	case m := <-c.in:
		return m, nil
	case <-c.finished:
		c.mu.Lock()
		defer c.mu.Unlock()
		return nil, c.failure
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// relatedOf is the request m came about (it arrived on that request's
// stream), if any; asked once per message.
func (c *httpConn) relatedOf(m *jsonrpc.Request) jsonrpc.ID {
	c.mu.Lock()
	defer c.mu.Unlock()
	id := c.related[m]
	delete(c.related, m)
	return id
}

// fail ends the connection with err.
func (c *httpConn) fail(err error) {
	c.once.Do(func() {
		c.mu.Lock()
		c.failure = err
		c.mu.Unlock()
		close(c.finished)
		c.cancel()
	})
}

// deliver hands m to Read, noting the request it relates to.
func (c *httpConn) deliver(m jsonrpc.Message, about jsonrpc.ID) {
	if r, ok := m.(*jsonrpc.Request); ok && about.IsValid() {
		c.mu.Lock()
		c.related[r] = about
		c.mu.Unlock()
	}
	if resp, ok := m.(*jsonrpc.Response); ok {
		c.noteInitialized(resp)
	}
	select {
	case c.in <- m:
	case <-c.ctx.Done():
	}
}

// noteInitialized learns the protocol version from the answer to
// initialize.
func (c *httpConn) noteInitialized(resp *jsonrpc.Response) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.initID == "" || idKey(resp.ID) != c.initID {
		return
	}
	c.initID = ""
	if res, err := objectOf(resp.Result); err == nil {
		c.version = res.str("protocolVersion")
	}
}

// Write sends m in a POST; its reply, if any, comes back through Read. A
// request is posted in the background (its reply may take minutes, and
// its stream is the request's); what goes wrong with it comes back as its
// answer, an error saying why.
func (c *httpConn) Write(_ context.Context, m jsonrpc.Message) error {
	data, err := jsonrpc.EncodeMessage(m)
	if err != nil {
		return err
	}
	req, _ := m.(*jsonrpc.Request)
	if req == nil || !req.IsCall() {
		return c.post(data, req, jsonrpc.ID{})
	}
	if req.Method == "initialize" {
		c.mu.Lock()
		c.initID = idKey(req.ID)
		c.mu.Unlock()
	}
	go func() {
		if err := c.post(data, req, req.ID); err != nil && c.ctx.Err() == nil {
			c.deliver(&jsonrpc.Response{ID: req.ID, Error: wireError(codeInternal, "%v", err)}, jsonrpc.ID{})
		}
	}()
	return nil
}

// post sends one message, and hands over what comes back; call is the id
// of a request, else invalid.
func (c *httpConn) post(data []byte, req *jsonrpc.Request, call jsonrpc.ID) error {
	hr, err := http.NewRequestWithContext(c.ctx, http.MethodPost, c.url, bytes.NewReader(data))
	if err != nil {
		return err
	}
	hr.Header.Set("Content-Type", "application/json")
	hr.Header.Set("Accept", "application/json, text/event-stream")
	c.headers(hr)
	resp, err := c.hc.Do(hr)
	if err != nil {
		return fmt.Errorf("POST %s: %w", c.url, err)
	}
	defer resp.Body.Close()
	if s := resp.Header.Get("Mcp-Session-Id"); s != "" {
		c.mu.Lock()
		if c.session == "" {
			c.session = s
		}
		c.mu.Unlock()
	}
	if req != nil && req.Method == "notifications/initialized" {
		c.startListening()
	}
	switch {
	case resp.StatusCode == http.StatusAccepted:
		return nil
	case resp.StatusCode == http.StatusNotFound && c.sessionID() != "":
		err := fmt.Errorf("%s ended the MCP session (HTTP 404)", c.url)
		c.fail(err)
		return err
	case resp.StatusCode/100 != 2:
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("POST %s: HTTP %s: %s", c.url, resp.Status, strings.TrimSpace(string(body)))
	}
	mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	if mt == "text/event-stream" {
		if _, err := c.readEvents(resp.Body, call); err != nil {
			return fmt.Errorf("the reply stream from %s broke: %w", c.url, err)
		}
		return nil
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxHTTPMessage))
	if err != nil {
		return fmt.Errorf("read the reply of %s: %w", c.url, err)
	}
	if len(bytes.TrimSpace(body)) == 0 {
		return nil
	}
	msgs, err := decodeBody(body)
	if err != nil {
		return fmt.Errorf("the reply of %s: %w", c.url, err)
	}
	for _, msg := range msgs {
		c.deliver(msg, call)
	}
	return nil
}

// decodeBody reads one message, or a batch of them.
func decodeBody(body []byte) ([]jsonrpc.Message, error) {
	body = bytes.TrimSpace(body)
	if len(body) > 0 && body[0] == '[' {
		var raws []json.RawMessage
		if err := json.Unmarshal(body, &raws); err != nil {
			return nil, err
		}
		var msgs []jsonrpc.Message
		for _, r := range raws {
			m, err := jsonrpc.DecodeMessage(r)
			if err != nil {
				return nil, err
			}
			msgs = append(msgs, m)
		}
		return msgs, nil
	}
	m, err := jsonrpc.DecodeMessage(body)
	if err != nil {
		return nil, err
	}
	return []jsonrpc.Message{m}, nil
}

// headers adds the session's headers to r.
func (c *httpConn) headers(r *http.Request) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.session != "" {
		r.Header.Set("Mcp-Session-Id", c.session)
	}
	if c.version != "" {
		r.Header.Set("MCP-Protocol-Version", c.version)
	}
}

func (c *httpConn) sessionID() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.session
}

// readEvents reads server-sent events from r until it ends, delivering
// each message; about is the request whose stream it is (invalid for the
// GET stream). It returns the last event id seen, for resuming.
func (c *httpConn) readEvents(r io.Reader, about jsonrpc.ID) (last string, err error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), maxHTTPMessage)
	var data strings.Builder
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			if data.Len() > 0 {
				msgs, err := decodeBody([]byte(data.String()))
				data.Reset()
				if err != nil {
					return last, fmt.Errorf("an event that is no JSON-RPC message: %w", err)
				}
				for _, m := range msgs {
					c.deliver(m, about)
				}
			}
		case strings.HasPrefix(line, "data:"):
			if data.Len() > 0 {
				data.WriteByte('\n')
			}
			data.WriteString(strings.TrimPrefix(strings.TrimPrefix(line, "data:"), " "))
		case strings.HasPrefix(line, "id:"):
			last = strings.TrimSpace(strings.TrimPrefix(line, "id:"))
		}
	}
	return last, sc.Err()
}

// startListening opens the GET stream, once: what the server sends outside
// any request (list changes, resource updates, its own requests) comes on
// it. A server that offers none answers 405; a stream that breaks is
// opened again, resuming after the last event it carried.
func (c *httpConn) startListening() {
	c.mu.Lock()
	if c.listen {
		c.mu.Unlock()
		return
	}
	c.listen = true
	c.mu.Unlock()
	go func() {
		last, delay := "", 250*time.Millisecond
		for c.ctx.Err() == nil {
			hr, err := http.NewRequestWithContext(c.ctx, http.MethodGet, c.url, nil)
			if err != nil {
				return
			}
			hr.Header.Set("Accept", "text/event-stream")
			if last != "" {
				hr.Header.Set("Last-Event-ID", last)
			}
			c.headers(hr)
			resp, err := c.hc.Do(hr)
			switch {
			case err != nil:
			case resp.StatusCode == http.StatusMethodNotAllowed:
				resp.Body.Close()
				return
			case resp.StatusCode == http.StatusNotFound:
				resp.Body.Close()
				c.fail(fmt.Errorf("%s ended the MCP session (HTTP 404)", c.url))
				return
			case resp.StatusCode/100 != 2:
				resp.Body.Close()
			default:
				if l, _ := c.readEvents(resp.Body, jsonrpc.ID{}); l != "" {
					last = l
				}
				resp.Body.Close()
				delay = 250 * time.Millisecond
			}
			select {
			case <-c.ctx.Done():
				return
			case <-time.After(delay):
			}
			delay = min(2*delay, 10*time.Second)
		}
	}()
}

// Close ends the session (a DELETE, as the transport asks of a client
// that is done) and every stream.
func (c *httpConn) Close() error {
	if s := c.sessionID(); s != "" {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if hr, err := http.NewRequestWithContext(ctx, http.MethodDelete, c.url, nil); err == nil {
			c.headers(hr)
			if resp, err := c.hc.Do(hr); err == nil {
				resp.Body.Close()
			}
		}
	}
	c.fail(errors.New("connection closed"))
	return nil
}
