package mcpconformance

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
)

// Dir says which way a message went.
type Dir int

const (
	// Sent is a message from the client to the server.
	Sent Dir = iota
	// Received is a message from the server to the client.
	Received
)

func (d Dir) String() string {
	if d == Sent {
		return "client→server"
	}
	return "server→client"
}

// Entry is one message of a session as it went over the wire.
type Entry struct {
	Dir Dir
	// Msg is the message's JSON, compacted.
	Msg json.RawMessage
	// Step names the script step that sent a client's request or
	// notification; it is empty for everything else. Requests of two runs
	// are matched by their step, not their id.
	Step string
}

// Transcript is one session's messages in the order the client sent or
// received them.
type Transcript struct {
	// Name says what ran: "direct (stdio)", "gateway", ...
	Name    string
	Entries []Entry
	// Session is the Mcp-Session-Id of a streamable HTTP session; empty over
	// stdio.
	Session string
	// Notes are what the script found missing or unexpected along the way
	// (a tool it expects is not listed, a request the server should have
	// made did not come), for a run against the server itself to fail on.
	Notes []string
}

// Clone returns a deep copy of t, to alter in a test.
func (t Transcript) Clone() Transcript {
	c := t
	c.Entries = make([]Entry, len(t.Entries))
	for i, e := range t.Entries {
		e.Msg = append(json.RawMessage(nil), e.Msg...)
		c.Entries[i] = e
	}
	c.Notes = append([]string(nil), t.Notes...)
	return c
}

// String renders t one message a line, for reading a run.
func (t Transcript) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "transcript %s (%d messages)\n", t.Name, len(t.Entries))
	for i, e := range t.Entries {
		step := ""
		if e.Step != "" {
			step = " [" + e.Step + "]"
		}
		fmt.Fprintf(&b, "#%d %s%s %s\n", i, e.Dir, step, e.Msg)
	}
	for _, n := range t.Notes {
		fmt.Fprintf(&b, "note: %s\n", n)
	}
	return b.String()
}

// RPCError is a JSON-RPC error object.
type RPCError struct {
	Code    int             `json:"code"`
	Message string          `json:"message"`
	Data    json.RawMessage `json:"data,omitempty"`
}

func (e *RPCError) Error() string { return fmt.Sprintf("JSON-RPC error %d: %s", e.Code, e.Message) }

// Standard JSON-RPC error codes the client answers with.
const (
	codeMethodNotFound = -32601
	codeInvalidParams  = -32602
)

// message is the envelope of any JSON-RPC message.
type message struct {
	ID     json.RawMessage `json:"id,omitempty"`
	Method string          `json:"method,omitempty"`
	Params json.RawMessage `json:"params,omitempty"`
	Result json.RawMessage `json:"result,omitempty"`
	Error  *RPCError       `json:"error,omitempty"`
}

// kind is what a message is.
type kind int

const (
	kindInvalid kind = iota
	kindRequest
	kindNotification
	kindResponse
)

func (m message) kind() kind {
	switch {
	case m.Method != "" && hasID(m.ID):
		return kindRequest
	case m.Method != "":
		return kindNotification
	case hasID(m.ID) && (m.Result != nil || m.Error != nil):
		return kindResponse
	}
	return kindInvalid
}

// idKey is the id as a map key: its compact JSON ("1" and "\"1\"" differ).
func (m message) idKey() string { return string(compact(m.ID)) }

func hasID(id json.RawMessage) bool {
	s := string(bytes.TrimSpace(id))
	return s != "" && s != "null"
}

func parseMessage(raw []byte) (message, error) {
	var m message
	if err := json.Unmarshal(raw, &m); err != nil {
		return message{}, err
	}
	return m, nil
}

func compact(raw []byte) json.RawMessage {
	var b bytes.Buffer
	if err := json.Compact(&b, raw); err != nil {
		return append(json.RawMessage(nil), raw...)
	}
	return b.Bytes()
}
