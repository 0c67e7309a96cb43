package events

import (
	"fmt"
	"strings"
)

// Subject prefixes of the v1 contract. All of them live in one JetStream stream
// whose subjects are Prefix + ">".
const (
	Prefix         = "assent."
	RequestPrefix  = "assent.request."
	PendingPrefix  = "assent.pending."
	ResponsePrefix = "assent.response."
	CancelPrefix   = "assent.cancel."
	DecisionPrefix = "assent.decision."
	// RejectionPrefix is where the broker tells an agent it refused a request
	// message without deciding it (dev.assent.approval.rejected).
	RejectionPrefix = "assent.rejection."
	// ShadowPrefix is where the broker records shadow-policy disagreements.
	ShadowPrefix   = "assent.audit.shadow."
	AllSubjects    = "assent.>"
	MaxTokenLength = 128
)

// JetStream names the broker provisions, that clients read directly: the stream
// holding every subject above, and the KV bucket holding each request's state
// (key = request id; its stream is "KV_" + StateBucket).
const (
	StreamName  = "ASSENT"
	StateBucket = "assent-requests"
)

// Kind names which part of the contract a subject belongs to.
type Kind int

// Subject kinds.
const (
	KindUnknown Kind = iota
	KindRequest
	KindPending
	KindResponse
	KindCancel
	KindDecision
	KindRejection
)

func (k Kind) String() string {
	switch k {
	case KindRequest:
		return "request"
	case KindPending:
		return "pending"
	case KindResponse:
		return "response"
	case KindCancel:
		return "cancel"
	case KindDecision:
		return "decision"
	case KindRejection:
		return "rejection"
	}
	return "unknown"
}

// ValidToken reports whether s may stand as one subject token: 1 to 128
// characters of [A-Za-z0-9_-].
func ValidToken(s string) bool {
	if len(s) == 0 || len(s) > MaxTokenLength {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// CheckToken returns an error wrapping ErrBadToken, naming what, when s is not a
// valid subject token.
func CheckToken(what, s string) error {
	if ValidToken(s) {
		return nil
	}
	if s == "" {
		return fieldErr(what, fmt.Errorf("%w: empty", ErrBadToken))
	}
	return fieldErr(what, fmt.Errorf("%w: %q (want 1-%d characters of A-Z a-z 0-9 _ -)", ErrBadToken, truncate(s, 40), MaxTokenLength))
}

// RequestSubject is where agent publishes its requests.
func RequestSubject(agent string) (string, error) {
	if err := CheckToken("agent", agent); err != nil {
		return "", err
	}
	return RequestPrefix + agent, nil
}

// PendingSubject is where the broker announces agent's waiting requests.
func PendingSubject(agent string) (string, error) {
	if err := CheckToken("agent", agent); err != nil {
		return "", err
	}
	return PendingPrefix + agent, nil
}

// ResponseSubject is where principal answers request id.
func ResponseSubject(principal, id string) (string, error) {
	if err := CheckToken("principal", principal); err != nil {
		return "", err
	}
	if err := CheckToken("request id", id); err != nil {
		return "", err
	}
	return ResponsePrefix + principal + "." + id, nil
}

// CancelSubject is where request id is cancelled, by anyone the broker lets
// cancel it.
func CancelSubject(id string) (string, error) {
	if err := CheckToken("request id", id); err != nil {
		return "", err
	}
	return CancelPrefix + id, nil
}

// AgentCancelSubject is where agent cancels its own request id: the broker
// refuses it for a request of another agent, and NATS permissions can let an
// agent publish on assent.cancel.<itself>.> alone.
func AgentCancelSubject(agent, id string) (string, error) {
	if err := CheckToken("agent", agent); err != nil {
		return "", err
	}
	if err := CheckToken("request id", id); err != nil {
		return "", err
	}
	return CancelPrefix + agent + "." + id, nil
}

// DecisionSubject is where the broker publishes the decision for request id, and
// where it stays readable afterwards.
func DecisionSubject(id string) (string, error) {
	if err := CheckToken("request id", id); err != nil {
		return "", err
	}
	return DecisionPrefix + id, nil
}

// DecidedPrefix is where the server republishes each message stored on
// assent.decision.<id>, as assent-decided.<id>, after storing it (the
// stream's RePublish). It is outside the stream's subjects: nobody publishes
// there, and readers learn of a decision only from what was stored
// (docs/protocol.md, "Reading a decision").
const DecidedPrefix = "assent-decided."

// Headers the server adds to a republished message. LastSequenceHeader is
// the stream sequence of the message stored on the same subject before this
// one: "0" for the first, which alone is a request's decision.
const (
	SequenceHeader     = "Nats-Sequence"
	LastSequenceHeader = "Nats-Last-Sequence"
)

// DecidedSubject is where the server republishes request id's stored
// decision.
func DecidedSubject(id string) (string, error) {
	if err := CheckToken("request id", id); err != nil {
		return "", err
	}
	return DecidedPrefix + id, nil
}

// RejectionSubject is where the broker publishes why it refused a request
// message with id without deciding it.
func RejectionSubject(id string) (string, error) {
	if err := CheckToken("request id", id); err != nil {
		return "", err
	}
	return RejectionPrefix + id, nil
}

// Subject is a parsed contract subject. Which fields are set depends on Kind.
type Subject struct {
	Kind      Kind
	Agent     string // request, pending; cancel when an agent cancels its own
	Principal string // response
	RequestID string // response, cancel, decision, rejection
}

// ParseSubject splits a contract subject into its parts. Errors wrap ErrBadSubject
// or ErrBadToken.
func ParseSubject(s string) (Subject, error) {
	if !strings.HasPrefix(s, Prefix) {
		return Subject{}, fmt.Errorf("%w: %q is not under %q", ErrBadSubject, truncate(s, 60), Prefix)
	}
	parts := strings.Split(s[len(Prefix):], ".")
	want := func(n int) error {
		if len(parts) != n+1 {
			return fmt.Errorf("%w: %q has %d tokens after %q, want %d", ErrBadSubject, truncate(s, 60), len(parts)-1, Prefix+parts[0], n)
		}
		return nil
	}
	var sub Subject
	switch parts[0] {
	case "request", "pending":
		if err := want(1); err != nil {
			return Subject{}, err
		}
		sub.Kind, sub.Agent = KindRequest, parts[1]
		if parts[0] == "pending" {
			sub.Kind = KindPending
		}
		return sub, CheckToken("agent", sub.Agent)
	case "response":
		if err := want(2); err != nil {
			return Subject{}, err
		}
		sub.Kind, sub.Principal, sub.RequestID = KindResponse, parts[1], parts[2]
		if err := CheckToken("principal", sub.Principal); err != nil {
			return Subject{}, err
		}
		return sub, CheckToken("request id", sub.RequestID)
	case "cancel":
		if len(parts) == 3 { // assent.cancel.<agent>.<id>
			sub.Kind, sub.Agent, sub.RequestID = KindCancel, parts[1], parts[2]
			if err := CheckToken("agent", sub.Agent); err != nil {
				return Subject{}, err
			}
			return sub, CheckToken("request id", sub.RequestID)
		}
		if err := want(1); err != nil {
			return Subject{}, err
		}
		sub.Kind, sub.RequestID = KindCancel, parts[1]
		return sub, CheckToken("request id", sub.RequestID)
	case "decision", "rejection":
		if err := want(1); err != nil {
			return Subject{}, err
		}
		sub.Kind, sub.RequestID = KindDecision, parts[1]
		if parts[0] == "rejection" {
			sub.Kind = KindRejection
		}
		return sub, CheckToken("request id", sub.RequestID)
	}
	return Subject{}, fmt.Errorf("%w: unknown kind %q", ErrBadSubject, truncate(parts[0], 40))
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

// Private reads. An agent whose credentials keep it from reading other
// agents' decisions (broker creds agent NAME --private) reads its own
// through subjects under PrivatePrefix, which are not stored: the broker
// sends a copy of each decision and rejection to
// assent-private.<agent>.decided.<id> and .rejected.<id>, and answers a
// request on assent-private.<agent>.lookup.<id> with what it stored of the
// agent's request id. docs/protocol.md, "Private reads".
const PrivatePrefix = "assent-private."

// Headers of a lookup's answer: LookupStatus is LookupDecided (the body and
// other headers are the stored decided event), LookupPending or
// LookupUnknown (no request id of this agent); LookupDeadline (RFC 3339) and
// LookupRequestDigest are set for a stored request.
const (
	LookupStatus        = "Assent-Lookup"
	LookupDeadline      = "Assent-Deadline"
	LookupRequestDigest = "Assent-Request-Digest"

	LookupDecided = "decided"
	LookupPending = "pending"
	LookupUnknown = "unknown"
)

// PrivateSubject is assent-private.<agent>.<kind>.<id>, kind one of
// "decided", "rejected" and "lookup".
func PrivateSubject(agent, kind, id string) (string, error) {
	if err := CheckToken("agent", agent); err != nil {
		return "", err
	}
	if err := CheckToken("request id", id); err != nil {
		return "", err
	}
	switch kind {
	case "decided", "rejected", "lookup":
	default:
		return "", fmt.Errorf("%w: private subject kind %q (want decided, rejected or lookup)", ErrBadSubject, kind)
	}
	return PrivatePrefix + agent + "." + kind + "." + id, nil
}
