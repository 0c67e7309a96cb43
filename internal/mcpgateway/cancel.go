package mcpgateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Why a call ended before its decision is the reason its request is
// cancelled with. The SDK ends a call's context alike for a client's
// notifications/cancelled and for a connection that closed, and keeps the
// client's reason to itself; so the gateway reads what its clients send
// before the SDK does, and ends the call first, with the cause:
//
//   - notifications/cancelled: ErrClientCancelled and the client's reason
//     (a client's own timeout is such a cancellation, with its reason);
//   - a stdio connection that fails (the client closed it): ErrClientGone,
//     client disconnected;
//   - an HTTP session deleted: ErrClientGone (Handler).
//
// A call names its JSON-RPC id by the rpcHeader of its RequestExtra, which
// only the gateway sets: noting on stdio, noteHTTP over HTTP.

// rpcHeader carries the key of a tools/call's JSON-RPC id to the call.
const rpcHeader = "X-Assent-Mcp-Call"

// maxCancelReason bounds the client's reason kept for the record.
const maxCancelReason = 1024

// rpcOf is the key of req's JSON-RPC id, as the gateway noted it; "" if
// unknown.
func rpcOf(req *mcp.CallToolRequest) string {
	if req.Extra == nil {
		return ""
	}
	return req.Extra.Header.Get(rpcHeader)
}

// rpcKey is the key of a JSON-RPC id: the same for the id of a call as
// jsonrpc.ID.Raw returns it (int64 or string) and as a notification's
// requestId decodes (float64 or string); "" for anything else.
func rpcKey(id any) string {
	switch v := id.(type) {
	case string:
		return "s:" + v
	case int64:
		return "n:" + strconv.FormatInt(v, 10)
	case float64:
		return "n:" + strconv.FormatFloat(v, 'f', -1, 64)
	}
	return ""
}

// cancelled is the cause of a call the client cancelled with reason.
func cancelled(reason string) error {
	if reason == "" {
		return fmt.Errorf("%w (no reason given)", ErrClientCancelled)
	}
	return fmt.Errorf("%w: %s", ErrClientCancelled, cut(reason, maxCancelReason))
}

// errDisconnected is the cause of the calls of a stdio client whose
// connection failed.
var errDisconnected = fmt.Errorf("%w: client disconnected", ErrClientGone)

// cancelRPC ends the call of st whose JSON-RPC id has the key rpc, with
// cause.
func (g *Gateway) cancelRPC(st *clientState, rpc string, cause error) {
	if rpc == "" {
		return
	}
	g.smu.Lock()
	defer g.smu.Unlock()
	for _, c := range st.calls {
		if c.rpc == rpc {
			c.cancel(cause)
		}
	}
}

// cancelState ends every call of st with cause.
func (g *Gateway) cancelState(st *clientState, cause error) {
	g.smu.Lock()
	defer g.smu.Unlock()
	for _, c := range st.calls {
		c.cancel(cause)
	}
}

// noting is a transport whose connections tell the gateway what the client
// does to its calls (see above). Its connections hide the SDK's own
// connection type, so the SDK does not learn the negotiated protocol version
// from them: it then takes JSON-RPC batches on stdio in any version.
type noting struct {
	mcp.Transport
	g  *Gateway
	st *clientState
}

func (n *noting) Connect(ctx context.Context) (mcp.Connection, error) {
	c, err := n.Transport.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return &notingConn{Connection: c, g: n.g, st: n.st}, nil
}

type notingConn struct {
	mcp.Connection
	g  *Gateway
	st *clientState
}

func (c *notingConn) Read(ctx context.Context) (jsonrpc.Message, error) {
	m, err := c.Connection.Read(ctx)
	if err != nil {
		// The SDK ends every call once a read fails.
		c.g.cancelState(c.st, errDisconnected)
		return m, err
	}
	req, ok := m.(*jsonrpc.Request)
	if !ok {
		return m, nil
	}
	switch req.Method {
	case "tools/call":
		if req.IsCall() {
			req.Extra = &mcp.RequestExtra{Header: http.Header{rpcHeader: {rpcKey(req.ID.Raw())}}}
		}
	case "notifications/cancelled":
		var p mcp.CancelledParams
		if json.Unmarshal(req.Params, &p) == nil {
			c.g.cancelRPC(c.st, rpcKey(p.RequestID), cancelled(p.Reason))
		}
	}
	return m, nil
}

func (c *notingConn) Write(ctx context.Context, m jsonrpc.Message) error {
	err := c.Connection.Write(ctx, m)
	if err != nil && ctx.Err() == nil {
		// The SDK ends every call once a write fails.
		c.g.cancelState(c.st, errDisconnected)
	}
	return err
}

// noteHTTP reads what a client POSTs to session id before the SDK does: a
// tools/call's JSON-RPC id, for the call (rpcHeader), and a
// notifications/cancelled, which ends the call it names with the client's
// reason. The body is left for the SDK as it came.
// The body is bounded as the SDK bounds it; a body over the bound is
// answered 413 here, and false returned.
func (g *Gateway) noteHTTP(w http.ResponseWriter, r *http.Request, id string) bool {
	r.Header.Del(rpcHeader) // the gateway's alone
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, mcp.DefaultMaxRequestBodyBytes))
	_ = r.Body.Close()
	if err != nil {
		status := http.StatusBadRequest
		if mbe := (*http.MaxBytesError)(nil); errors.As(err, &mbe) {
			status = http.StatusRequestEntityTooLarge
		}
		http.Error(w, "read the request: "+err.Error(), status)
		return false
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	type message struct {
		ID     any    `json:"id"`
		Method string `json:"method"`
		Params struct {
			RequestID any    `json:"requestId"`
			Reason    string `json:"reason"`
		} `json:"params"`
	}
	var msgs []message
	if b := bytes.TrimSpace(body); len(b) > 0 && b[0] == '[' {
		_ = json.Unmarshal(b, &msgs) // a batch; the SDK answers what is wrong with it
	} else {
		var m message
		if json.Unmarshal(b, &m) == nil {
			msgs = append(msgs, m)
		}
	}
	var calls []string
	for _, m := range msgs {
		switch m.Method {
		case "tools/call":
			if m.ID != nil {
				calls = append(calls, rpcKey(m.ID))
			}
		case "notifications/cancelled":
			if id == "" {
				continue
			}
			g.smu.Lock()
			var st *clientState
			for ss, s := range g.clients {
				if ss.ID() == id {
					st = s
				}
			}
			g.smu.Unlock()
			if st != nil {
				g.cancelRPC(st, rpcKey(m.Params.RequestID), cancelled(m.Params.Reason))
			}
		}
	}
	if len(calls) == 1 { // the header is the POST's: it names one call only
		r.Header.Set(rpcHeader, calls[0])
	}
	return true
}
