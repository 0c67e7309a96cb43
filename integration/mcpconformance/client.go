package mcpconformance

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
)

// Conn is a scripted MCP client written directly on JSON-RPC, so that no
// SDK's typed structs drop a field or hide a difference. It records every
// message in both directions, in the order it sent or received them, and
// answers the server's requests itself: sampling/createMessage with a
// canned assistant message, elicitation/create with a canned accept whose
// content fits the requested schema, roots/list with its roots, ping.
//
// Its methods are safe to call from several goroutines; a script calls
// them in order.
type Conn struct {
	tr transport

	mu      sync.Mutex
	entries []Entry
	changed chan struct{} // closed and replaced when an entry is added
	pending map[string]chan message
	nextID  int64
	roots   []Root
	notes   []string
	closed  bool

	answers sync.WaitGroup // answers to server requests in flight
}

// Root is one of the client's roots.
type Root struct {
	URI  string `json:"uri"`
	Name string `json:"name,omitempty"`
}

// transport carries messages; what it receives it hands to the deliver
// func it was made with.
type transport interface {
	// send writes one message to the server.
	send(ctx context.Context, msg []byte) error
	// close ends the session and waits for the transport's goroutines;
	// safe to call twice.
	close(ctx context.Context) error
	// session is the Mcp-Session-Id, empty over stdio.
	session() string
	// diagnostics is what may explain a failure (a process's stderr).
	diagnostics() string
}

func newConn() *Conn {
	return &Conn{changed: make(chan struct{}), pending: map[string]chan message{}}
}

// SetRoots sets the roots the client answers roots/list with from now on.
func (c *Conn) SetRoots(roots []Root) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.roots = slices.Clone(roots)
}

// Note records something the script found missing or unexpected.
func (c *Conn) Note(format string, args ...any) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.notes = append(c.notes, fmt.Sprintf(format, args...))
}

// Transcript returns what was recorded so far, named name.
func (c *Conn) Transcript(name string) Transcript {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := Transcript{Name: name, Entries: slices.Clone(c.entries), Session: c.tr.session(), Notes: slices.Clone(c.notes)}
	return t.Clone()
}

// Diagnostics is what may explain a failure: a stdio server's stderr.
func (c *Conn) Diagnostics() string { return c.tr.diagnostics() }

// Len is the number of messages recorded so far; Await looks from such an
// index on.
func (c *Conn) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.entries)
}

// Close ends the session (stdio closed and the process gone, HTTP DELETE)
// and waits for the answers in flight. Safe to call twice.
func (c *Conn) Close(ctx context.Context) error {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	err := c.tr.close(ctx)
	c.answers.Wait()
	return err
}

// record adds a message to the transcript and wakes those who wait.
func (c *Conn) record(dir Dir, raw []byte, step string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.entries = append(c.entries, Entry{Dir: dir, Msg: compact(raw), Step: step})
	close(c.changed)
	c.changed = make(chan struct{})
}

// deliver takes one message (or a batch) from the transport.
func (c *Conn) deliver(raw []byte) {
	var batch []json.RawMessage
	if err := json.Unmarshal(raw, &batch); err == nil {
		for _, m := range batch {
			c.deliver(m)
		}
		return
	}
	if !json.Valid(raw) {
		// Kept as a string, so that the transcript stays JSON and the
		// comparison shows it.
		s, _ := json.Marshal(map[string]string{"invalid JSON from the server": string(raw)})
		c.record(Received, s, "")
		return
	}
	c.record(Received, raw, "")
	m, err := parseMessage(raw)
	if err != nil {
		return
	}
	switch m.kind() {
	case kindResponse:
		c.mu.Lock()
		ch := c.pending[m.idKey()]
		delete(c.pending, m.idKey())
		c.mu.Unlock()
		if ch != nil {
			ch <- m
		}
	case kindRequest:
		// Added under the lock Close takes to set closed, so that no
		// answer starts once Close waits for them.
		c.mu.Lock()
		if !c.closed {
			c.answers.Go(func() { c.answer(m) })
		}
		c.mu.Unlock()
	}
}

// answer replies to a server's request as the script's user would.
func (c *Conn) answer(m message) {
	result, rpcErr := c.reply(m.Method, m.Params)
	out := map[string]any{"jsonrpc": "2.0", "id": m.ID}
	if rpcErr != nil {
		out["error"] = rpcErr
	} else {
		out["result"] = result
	}
	raw, err := json.Marshal(out)
	if err != nil {
		return
	}
	c.record(Sent, raw, "")
	ctx, cancel := context.WithTimeout(context.Background(), answerPatience)
	defer cancel()
	if err := c.tr.send(ctx, raw); err != nil {
		c.Note("answering the server's %s: %v", m.Method, err)
	}
}

// CannedSample is the assistant message the client answers every
// sampling/createMessage with.
var CannedSample = map[string]any{
	"role":       "assistant",
	"content":    map[string]any{"type": "text", "text": "A canned reply from the conformance client."},
	"model":      "conformance-canned-model",
	"stopReason": "endTurn",
}

func (c *Conn) reply(method string, params json.RawMessage) (any, *RPCError) {
	switch method {
	case "ping":
		return map[string]any{}, nil
	case "roots/list":
		c.mu.Lock()
		roots := slices.Clone(c.roots)
		c.mu.Unlock()
		if roots == nil {
			roots = []Root{}
		}
		return map[string]any{"roots": roots}, nil
	case "sampling/createMessage":
		return CannedSample, nil
	case "elicitation/create":
		var p struct {
			Mode            string         `json:"mode"`
			RequestedSchema map[string]any `json:"requestedSchema"`
		}
		if err := json.Unmarshal(params, &p); err != nil {
			return nil, &RPCError{Code: codeInvalidParams, Message: err.Error()}
		}
		if p.Mode == "url" {
			return map[string]any{"action": "decline"}, nil
		}
		return map[string]any{"action": "accept", "content": FillSchema(p.RequestedSchema)}, nil
	}
	return nil, &RPCError{Code: codeMethodNotFound, Message: "Method not found: the conformance client does not handle " + method}
}

// FillSchema makes the content a user would enter in a form with schema (an
// elicitation's requestedSchema): every property gets its default, else the
// first value an enum or oneOf allows, else a fixed value of its type and
// format, so that the same schema always gets the same answer.
func FillSchema(schema map[string]any) map[string]any {
	out := map[string]any{}
	props, _ := schema["properties"].(map[string]any)
	for name, p := range props {
		prop, _ := p.(map[string]any)
		out[name] = fillValue(prop)
	}
	return out
}

func fillValue(p map[string]any) any {
	if d, ok := p["default"]; ok {
		return d
	}
	if v, ok := firstChoice(p); ok {
		return v
	}
	switch p["type"] {
	case "boolean":
		return true
	case "integer", "number":
		if m, ok := p["minimum"]; ok {
			return m
		}
		return 1
	case "array":
		items, _ := p["items"].(map[string]any)
		if v, ok := firstChoice(items); ok {
			return []any{v}
		}
		return []any{}
	}
	switch p["format"] {
	case "email":
		return "ada@example.com"
	case "uri":
		return "https://example.com/ada"
	case "date":
		return "1815-12-10"
	case "date-time":
		return "1815-12-10T00:00:00Z"
	}
	return "Ada Lovelace"
}

// firstChoice is the first value an enum, oneOf or anyOf of consts allows.
func firstChoice(p map[string]any) (any, bool) {
	if e, ok := p["enum"].([]any); ok && len(e) > 0 {
		return e[0], true
	}
	for _, k := range []string{"oneOf", "anyOf"} {
		if alts, ok := p[k].([]any); ok && len(alts) > 0 {
			if alt, ok := alts[0].(map[string]any); ok {
				if v, ok := alt["const"]; ok {
					return v, true
				}
			}
		}
	}
	return nil, false
}

// Response is the server's answer to one of the client's requests.
type Response struct {
	ID     json.RawMessage
	Result json.RawMessage
	Error  *RPCError
}

// Err is the response's error, if it is one.
func (r Response) Err() error {
	if r.Error != nil {
		return r.Error
	}
	return nil
}

// Decode decodes the result into v.
func (r Response) Decode(v any) error {
	if r.Error != nil {
		return r.Error
	}
	return json.Unmarshal(r.Result, v)
}

// Pending is a request sent whose response may come.
type Pending struct {
	ID     int64
	Method string
	ch     chan message
}

// Start sends a request as step, and returns at once.
func (c *Conn) Start(ctx context.Context, step, method string, params any) (*Pending, error) {
	c.mu.Lock()
	c.nextID++
	id := c.nextID
	ch := make(chan message, 1)
	c.pending[strconv.FormatInt(id, 10)] = ch
	c.mu.Unlock()
	raw, err := envelope(map[string]any{"jsonrpc": "2.0", "id": id, "method": method}, params)
	if err != nil {
		return nil, err
	}
	c.record(Sent, raw, step)
	if err := c.tr.send(ctx, raw); err != nil {
		return nil, fmt.Errorf("send %s: %w", method, err)
	}
	return &Pending{ID: id, Method: method, ch: ch}, nil
}

// Wait waits for p's response until ctx ends.
func (p *Pending) Wait(ctx context.Context) (Response, error) {
	select {
	case m := <-p.ch:
		return Response{ID: m.ID, Result: m.Result, Error: m.Error}, nil
	case <-ctx.Done():
		return Response{}, fmt.Errorf("no response to %s (id %d): %w", p.Method, p.ID, context.Cause(ctx))
	}
}

// Call sends a request as step and waits for its response until ctx ends.
// A JSON-RPC error is a Response with Error set, not an error.
func (c *Conn) Call(ctx context.Context, step, method string, params any) (Response, error) {
	p, err := c.Start(ctx, step, method, params)
	if err != nil {
		return Response{}, err
	}
	return p.Wait(ctx)
}

// Notify sends a notification as step.
func (c *Conn) Notify(ctx context.Context, step, method string, params any) error {
	raw, err := envelope(map[string]any{"jsonrpc": "2.0", "method": method}, params)
	if err != nil {
		return err
	}
	c.record(Sent, raw, step)
	return c.tr.send(ctx, raw)
}

// envelope is the message out with params, left out when they are nil (a
// nil map too: "params": null is no valid message).
func envelope(out map[string]any, params any) ([]byte, error) {
	if params != nil {
		p, err := json.Marshal(params)
		if err != nil {
			return nil, err
		}
		if string(p) != "null" {
			out["params"] = json.RawMessage(p)
		}
	}
	return json.Marshal(out)
}

// ErrNotSeen is returned by Await when no message matched before ctx ended.
var ErrNotSeen = errors.New("no such message")

// Await waits until a message at index from or later satisfies match, and
// returns its index; ErrNotSeen when ctx ends first.
func (c *Conn) Await(ctx context.Context, from int, match func(Entry) bool) (int, error) {
	for {
		c.mu.Lock()
		for i := from; i < len(c.entries); i++ {
			if match(c.entries[i]) {
				c.mu.Unlock()
				return i, nil
			}
		}
		from = len(c.entries)
		changed := c.changed
		c.mu.Unlock()
		select {
		case <-changed:
		case <-ctx.Done():
			return -1, ErrNotSeen
		}
	}
}

// ReceivedMethod matches a message from the server with method (a request or a
// notification) for which more, if given, holds of its params.
func ReceivedMethod(method string, more func(params map[string]any) bool) func(Entry) bool {
	return func(e Entry) bool {
		if e.Dir != Received {
			return false
		}
		m, err := parseMessage(e.Msg)
		if err != nil || m.Method != method {
			return false
		}
		if more == nil {
			return true
		}
		var p map[string]any
		_ = json.Unmarshal(m.Params, &p)
		return more(p)
	}
}
