package events

import (
	"fmt"
	"time"
)

// An agent's own requests, as the broker answers for them. An agent asks
// the broker on assent-private.<agent>.list for its pending requests, and
// on assent-private.<agent>.cancel to cancel them all (of one session, if it
// names one), with a NATS request whose body is an AgentQuery (or empty)
// and whose answer is an AgentReply. The subject names the agent, so NATS
// permissions confine a credential to its own (docs/security.md); the
// broker answers for that agent's requests alone. docs/protocol.md, "An
// agent's own requests".
const (
	AgentList   = "list"
	AgentCancel = "cancel"
)

// MaxAgentPage bounds the requests one AgentReply lists.
const MaxAgentPage = 1000

// AgentSubject is assent-private.<agent>.<kind>, kind AgentList or
// AgentCancel.
func AgentSubject(agent, kind string) (string, error) {
	if err := CheckToken("agent", agent); err != nil {
		return "", err
	}
	switch kind {
	case AgentList, AgentCancel:
	default:
		return "", fmt.Errorf("%w: agent subject kind %q (want %s or %s)", ErrBadSubject, kind, AgentList, AgentCancel)
	}
	return PrivatePrefix + agent + "." + kind, nil
}

// AgentQuery is the body of an agent's list or cancel: which of its pending
// requests. Empty, all of them.
type AgentQuery struct {
	// Session narrows to the requests of one session.
	Session string `json:"session,omitempty"`
	// After continues a listing after this request id (the previous
	// reply's last); a cancel ignores it.
	After string `json:"after,omitempty"`
	// Reason is the cancels' reason; a listing ignores it.
	Reason string `json:"reason,omitempty"`
}

// AgentPending is one pending request of an agent, as a listing gives it:
// the request without its args and schemas (the agent sent them), and its
// deadline.
type AgentPending struct {
	ID         string    `json:"id"`
	Tool       string    `json:"tool"`
	Session    string    `json:"session,omitempty"`
	User       string    `json:"user,omitempty"`
	CallID     string    `json:"call_id,omitempty"`
	Hint       string    `json:"hint,omitempty"`
	ReceivedAt time.Time `json:"received_at"`
	Deadline   time.Time `json:"deadline"`
}

// AgentReply is the broker's answer to an agent's list or cancel.
type AgentReply struct {
	// Pending are the agent's pending requests, oldest first, at most
	// MaxAgentPage; More says a listing continues (AgentQuery.After the
	// last one's id).
	Pending []AgentPending `json:"pending,omitempty"`
	More    bool           `json:"more,omitempty"`
	// Cancelled are the ids a cancel cancelled, each recorded as cancelled
	// by agent/<agent>.
	Cancelled []string `json:"cancelled,omitempty"`
	// Error, if set, says why the broker could not answer in full.
	Error string `json:"error,omitempty"`
}
