package broker

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/assent-dev/assent/pkg/events"
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
)

// Record is the stored state of one request, the value of its KV entry.
type Record struct {
	ID         string           `json:"id"`
	State      State            `json:"state"`
	Request    events.Requested `json:"request"`
	Source     string           `json:"source,omitempty"`
	ReceivedAt time.Time        `json:"received_at"`
	Deadline   time.Time        `json:"deadline"`
	Decision   *events.Decided  `json:"decision"`
	// Rule is the policy rule the request falls under ("mode:<mode>" when no
	// rule matched); Approvers and Quorum say who must answer.
	Rule      string   `json:"rule,omitempty"`
	Approvers []string `json:"approvers,omitempty"`
	Quorum    int      `json:"quorum,omitempty"`
	// BaseDeadline is the deadline before escalation steps extended it; Level
	// is the escalation level reached.
	BaseDeadline time.Time `json:"base_deadline,omitzero"`
	Level        int       `json:"level,omitempty"`
	// Votes are the approvals given so far, while a quorum is not reached.
	Votes []events.DecidedBy `json:"votes,omitempty"`
	// DecisionEventID is the id of the decided CloudEvent, fixed when the outcome
	// is chosen so that every retry publishes the same event.
	DecisionEventID string `json:"decision_event_id,omitempty"`

	revision uint64
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
	if len(args) == 0 {
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
	r.Decision = &events.Decided{
		RequestID:  r.ID,
		Outcome:    v.outcome,
		Reason:     v.reason,
		Args:       args,
		Edited:     edited,
		ArgsDigest: digest,
		Payload:    v.payload,
		DecidedBy:  v.by,
		Rule:       v.rule,
		Auto:       v.auto,
		DecidedAt:  v.at.UTC(),
	}
	return nil
}

func encodeRecord(r *Record) ([]byte, error) { return json.Marshal(r) }

func decodeRecord(b []byte, rev uint64) (Record, error) {
	var r Record
	if err := json.Unmarshal(b, &r); err != nil {
		return Record{}, fmt.Errorf("corrupt state entry: %w", err)
	}
	r.revision = rev
	return r, nil
}
