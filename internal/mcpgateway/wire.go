package mcpgateway

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
)

// The gateway passes MCP through as JSON-RPC messages, not as the SDK's
// typed requests and results: a field this version of the SDK does not know
// (a tool's execution, a newer capability) reaches the other side unchanged.
// What it reads of a message it reads with the small views below, and what
// it changes (a tool's name behind a prefix, an id mapped) it changes in the
// message's own JSON object.

// JSON-RPC error codes the gateway answers with.
const (
	codeInvalidRequest = -32600
	codeInvalidParams  = -32602
	codeMethodNotFound = -32601
	codeInternal       = -32603
)

// idKey is a request id as a map key: "n:1" and "s:1" differ, as the ids
// 1 and "1" do.
func idKey(id jsonrpc.ID) string {
	switch v := id.Raw().(type) {
	case string:
		return "s:" + v
	case int64:
		return "n:" + strconv.FormatInt(v, 10)
	case float64:
		return "n:" + strconv.FormatFloat(v, 'f', -1, 64)
	}
	return ""
}

// rawIDKey is idKey of an id as it appears in params (a requestId), or "".
func rawIDKey(raw json.RawMessage) string {
	var v any
	if json.Unmarshal(raw, &v) != nil {
		return ""
	}
	id, err := jsonrpc.MakeID(v)
	if err != nil {
		return ""
	}
	return idKey(id)
}

// rawID is id's JSON.
func rawID(id jsonrpc.ID) json.RawMessage {
	b, _ := json.Marshal(id.Raw())
	return b
}

// wireError is a JSON-RPC error answer.
func wireError(code int64, format string, args ...any) *jsonrpc.Error {
	return &jsonrpc.Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// respond is the answer to the request with id: result, or err.
func respond(id jsonrpc.ID, result json.RawMessage, err error) *jsonrpc.Response {
	if err != nil {
		return &jsonrpc.Response{ID: id, Error: err}
	}
	if len(result) == 0 {
		result = json.RawMessage(`{}`)
	}
	return &jsonrpc.Response{ID: id, Result: result}
}

// object is a JSON object whose members are kept as they came, in a map:
// reading or changing one leaves the others' bytes alone.
type object map[string]json.RawMessage

// objectOf reads raw as an object; an absent or null raw is an empty one.
func objectOf(raw json.RawMessage) (object, error) {
	o := object{}
	if len(bytes.TrimSpace(raw)) == 0 || string(bytes.TrimSpace(raw)) == "null" {
		return o, nil
	}
	if err := json.Unmarshal(raw, &o); err != nil {
		return nil, err
	}
	if o == nil {
		o = object{}
	}
	return o, nil
}

// str is member k as a string, or "".
func (o object) str(k string) string {
	var s string
	_ = json.Unmarshal(o[k], &s)
	return s
}

// set sets member k to v's JSON.
func (o object) set(k string, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		return
	}
	o[k] = b
}

// obj is member k as an object (empty if absent or not one).
func (o object) obj(k string) object {
	m, err := objectOf(o[k])
	if err != nil {
		return object{}
	}
	return m
}

// bytes is o's JSON.
func (o object) bytes() json.RawMessage {
	b, _ := json.Marshal(map[string]json.RawMessage(o))
	return b
}

// progressToken is the _meta.progressToken of a request's params, as a key
// (its JSON), or "".
func progressToken(params json.RawMessage) string {
	p, err := objectOf(params)
	if err != nil {
		return ""
	}
	tok := bytes.TrimSpace(p.obj("_meta")["progressToken"])
	if len(tok) == 0 || string(tok) == "null" {
		return ""
	}
	return string(tok)
}

// withParams is req with other params.
func withParams(req *jsonrpc.Request, params json.RawMessage) *jsonrpc.Request {
	return &jsonrpc.Request{ID: req.ID, Method: req.Method, Params: params}
}
