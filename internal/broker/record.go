package broker

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/assent-dev/assent/pkg/events"
	"github.com/assent-dev/assent/pkg/policy"
)

// State is where a request stands. Pending is the only state that changes.
type State string

// States of a request.
const (
	StatePending   State = "pending"
	StateApproved  State = "approved"
	StateDenied    State = "denied"
	StateExpired   State = "expired"
	StateCancelled State = "cancelled"
)

// Terminal reports whether s is final.
func (s State) Terminal() bool { return s != StatePending }

// ParseState checks s names a state.
func ParseState(s string) (State, error) {
	switch st := State(s); st {
	case StatePending, StateApproved, StateDenied, StateExpired, StateCancelled:
		return st, nil
	}
	return "", fmt.Errorf("unknown state %q (want pending, approved, denied, expired or cancelled)", s)
}

// Errors the broker's operations return; callers branch on them with errors.Is.
var (
	// ErrNotFound: no request has that id (or it is past retention).
	ErrNotFound = errors.New("no such request")
	// ErrAlreadyDecided: the request was approved, denied or cancelled already.
	ErrAlreadyDecided = errors.New("request already decided")
	// ErrExpired: the request's deadline passed before this answer.
	ErrExpired = errors.New("request expired")
	// ErrNotEligible: the principal may not answer this request.
	ErrNotEligible = errors.New("principal not eligible")
	// ErrInvalid: the input is malformed; the wrapped error says how.
	ErrInvalid = errors.New("invalid input")
	// ErrIDConflict: the request id belongs to a different request (another
	// tool, other args, agent, session, user, call id, labels or schema).
	ErrIDConflict = errors.New("request id already used by a different request")
	// ErrBeforeRequest: an answer or cancel was stored before the request it
	// names, so nobody could have seen that request; it is refused.
	ErrBeforeRequest = errors.New("answer stored before its request")
	// ErrForgedDecision: the stream holds a decided event for the request that
	// this broker did not make. The broker's own decision cannot be published.
	ErrForgedDecision = errors.New("a decision this broker did not make is on the stream")
)

// Record is the stored state of one request, the value of its KV entry.
type Record struct {
	ID      string           `json:"id"`
	State   State            `json:"state"`
	Request events.Requested `json:"request"`
	Source  string           `json:"source,omitempty"`
	// RequestDigest is events.RequestDigest of Request: a request published
	// again with the same id must have the same digest.
	RequestDigest string `json:"request_digest,omitempty"`
	// RequestSeq is the stream sequence of the request message; an answer or
	// cancel stored before it is refused.
	RequestSeq uint64          `json:"request_seq,omitempty"`
	ReceivedAt time.Time       `json:"received_at"`
	Deadline   time.Time       `json:"deadline"`
	Decision   *events.Decided `json:"decision"`
	// Rule is the policy rule the request falls under ("mode:<mode>" when no
	// rule matched); Approvers and Quorum say who must answer. Limit names the
	// limit that held an automatic approval for people to decide.
	Rule      string   `json:"rule,omitempty"`
	Limit     string   `json:"limit,omitempty"`
	Approvers []string `json:"approvers,omitempty"`
	Quorum    int      `json:"quorum,omitempty"`
	// BaseDeadline is the deadline before escalation steps extended it; Level
	// is the escalation level reached.
	BaseDeadline time.Time `json:"base_deadline,omitzero"`
	Level        int       `json:"level,omitempty"`
	// Votes are the approvals given so far, while a quorum is not reached;
	// Applied lists the stream sequences of the answers they came from.
	Votes   []events.DecidedBy `json:"votes,omitempty"`
	Applied []uint64           `json:"applied,omitempty"`
	// DecisionEventID is the id of the decided CloudEvent and Replica the
	// broker that chose the outcome, fixed when it is chosen so that every
	// retry, by any replica, publishes the same event.
	DecisionEventID string `json:"decision_event_id,omitempty"`
	Replica         string `json:"replica,omitempty"`
	// Trigger is the stream sequence of the message (request, answer, cancel
	// or timeout) whose handling chose the outcome. That message is
	// acknowledged only once the decided event is on the stream, so if the
	// broker dies in between, its redelivery publishes the decision.
	Trigger uint64 `json:"trigger,omitempty"`
	// Grant is the remembered choice the deciding answer asked for. It is
	// fixed with the outcome and stored before the decided event is
	// published, so an agent that sees the decision and asks again finds it;
	// a redelivered trigger stores it again if the broker died in between.
	Grant *policy.Grant `json:"grant,omitempty"`
	// Forgery describes a decided event found on the request's decision
	// subject that no broker made, once one is found.
	Forgery string `json:"forgery,omitempty"`
	// TraceParent and TraceState are the request's trace context: that of
	// the span that ingested it, in the trace its requested event carried
	// (docs/tracing.md). The broker's later spans about the request (an
	// answer that carries none, its expiry) join that trace.
	TraceParent string `json:"traceparent,omitempty"`
	TraceState  string `json:"tracestate,omitempty"`

	revision uint64
	// judging: the request is stored and neither waits for answers nor is
	// decided yet.
	judging bool
	// partial: the record lacks the request's content (args, schemas), which
	// is read from the stream at RequestSeq when needed; rebuild, if set, is
	// the change to apply again to the whole request (a cancel made while
	// the ledger kept only a part of it).
	partial bool
	rebuild func(*Record) error
	// thin: a pending record as the ledger keeps it cold (cold.go), without
	// the request's content, approvers or trace context, which whole reads
	// from its pending event at stream sequence pendSeq; verdict, on a
	// thin proposal, is the outcome whole decides it with.
	thin    bool
	pendSeq uint64
	verdict *verdict
	// forged: the decision itself (the first message on the decision
	// subject) is one no broker made.
	forged bool
}

// applied reports whether the message at stream sequence seq was applied to r
// already: it decided r, or it is one of its votes.
func (r *Record) applied(seq uint64) bool {
	return seq != 0 && (r.Trigger == seq || slices.Contains(r.Applied, seq))
}

// Revision is the KV revision the record was read at.
func (r *Record) Revision() uint64 { return r.revision }

// terminalErr maps a decided record to the error an answer to it gets.
func (r *Record) terminalErr() error {
	switch r.State {
	case StateExpired:
		return fmt.Errorf("%w: %s expired at %s", ErrExpired, r.ID, r.Deadline.Format(time.RFC3339))
	case StatePending:
		return nil
	}
	if r.forged {
		return fmt.Errorf("%w: request %s: %s", ErrForgedDecision, r.ID, r.Forgery)
	}
	return fmt.Errorf("%w: %s is %s", ErrAlreadyDecided, r.ID, r.State)
}

// verdict describes an outcome about to be recorded.
type verdict struct {
	outcome events.Outcome
	reason  string
	args    json.RawMessage // nil: the request's own
	payload json.RawMessage
	by      []events.DecidedBy
	// digest, if set, is the digest of the request's own args, already
	// computed; it spares computing it again when args is nil.
	digest string
	rule   string
	auto   bool
	at     time.Time
}

// rules returns the decision's rule and approval rule for a record whose
// approvers follow rule r.Rule: a request a limit held for approval names the
// limit, and the rule beside it.
func (r *Record) rules(rule string) (string, string) {
	if held := "limit:" + r.Limit; r.Limit != "" && rule != held {
		return held, rule
	}
	return rule, ""
}

// decide moves a pending record to its terminal state.
func (r *Record) decide(v verdict) error {
	args := r.Request.Args
	edited := false
	if v.args != nil {
		orig, err := events.CanonicalArgs(r.Request.Args)
		if err != nil {
			return err
		}
		edit, err := events.CanonicalArgs(v.args)
		if err != nil {
			return err
		}
		args, edited = edit, string(orig) != string(edit)
	}
	if len(bytes.TrimSpace(args)) == 0 || string(bytes.TrimSpace(args)) == "null" {
		args = json.RawMessage("{}")
	}
	digest := v.digest
	if digest == "" || v.args != nil {
		var err error
		if digest, err = events.ArgsDigest(args); err != nil {
			return err
		}
	}
	r.State = State(v.outcome)
	r.DecisionEventID = events.NewID()
	rule, approvalRule := r.rules(v.rule)
	r.Decision = &events.Decided{
		RequestID:     r.ID,
		Outcome:       v.outcome,
		Reason:        v.reason,
		Args:          args,
		Edited:        edited,
		ArgsDigest:    digest,
		Payload:       v.payload,
		DecidedBy:     v.by,
		Rule:          rule,
		ApprovalRule:  approvalRule,
		Auto:          v.auto,
		DecidedAt:     v.at.UTC(),
		RequestDigest: r.RequestDigest,
	}
	return nil
}

// encodeRecord writes r as the value of its KV entry: JSON without HTML
// escaping, and the decision's args left out unless an approver edited them
// (they are the request's, stored once; decodeRecord puts them back).
func encodeRecord(r *Record) ([]byte, error) {
	stored := *r
	if r.Decision != nil && !r.Decision.Edited {
		d := *r.Decision
		d.Args = nil
		stored.Decision = &d
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(&stored); err != nil {
		return nil, err
	}
	return bytes.TrimRight(buf.Bytes(), "\n"), nil
}

func decodeRecord(b []byte, rev uint64) (Record, error) {
	var r Record
	if err := json.Unmarshal(b, &r); err != nil {
		return Record{}, fmt.Errorf("corrupt state entry: %w", err)
	}
	if r.Decision != nil && !r.Decision.Edited && len(r.Decision.Args) == 0 {
		r.Decision.Args = r.Request.Args
		if t := bytes.TrimSpace(r.Decision.Args); len(t) == 0 || string(t) == "null" {
			r.Decision.Args = json.RawMessage("{}")
		}
	}
	r.revision = rev
	return r, nil
}

// trail is what r's decision followed, besides its request: its pending
// event, the answers counted and its trigger, in stream order, each once
// (events.Decided.Trail).
func (r *Record) trail() []uint64 {
	var seqs []uint64
	for _, s := range append([]uint64{r.pendSeq, r.Trigger}, r.Applied...) {
		if s != 0 && s != r.RequestSeq && !slices.Contains(seqs, s) {
			seqs = append(seqs, s)
		}
	}
	slices.Sort(seqs)
	return seqs
}
