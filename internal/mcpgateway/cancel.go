package mcpgateway

import "fmt"

// A client cancels a call with notifications/cancelled, naming the call's
// JSON-RPC id, or by going away (stdio closed, HTTP DELETE, no answer to
// pings). Either way the call's request is withdrawn, with why as its
// reason; a call forwarded to an upstream is cancelled there too.

// maxCancelReason bounds the client's reason kept for the record.
const maxCancelReason = 1024

// cancelled is the cause of a call the client cancelled with reason.
func cancelled(reason string) error {
	if reason == "" {
		return fmt.Errorf("%w (no reason given)", ErrClientCancelled)
	}
	return fmt.Errorf("%w: %s", ErrClientCancelled, cut(reason, maxCancelReason))
}

// errDisconnected is the cause of the calls of a client whose connection
// failed.
var errDisconnected = fmt.Errorf("%w: client disconnected", ErrClientGone)
