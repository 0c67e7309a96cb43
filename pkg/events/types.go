package events

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// CloudEvent types of the v1 contract.
const (
	TypeRequested = "dev.assent.approval.requested"
	TypePending   = "dev.assent.approval.pending"
	TypeResponded = "dev.assent.approval.responded"
	TypeCancel    = "dev.assent.approval.cancel"
	TypeEscalated = "dev.assent.approval.escalated"
	TypeDecided   = "dev.assent.approval.decided"
	TypeRejected  = "dev.assent.approval.rejected"

	// TypeShadowDisagreement is broker audit: a shadow policy would have
	// decided a request differently from the live one. Never acted on.
	TypeShadowDisagreement = "dev.assent.policy.shadow_disagreement"
)

// ShadowDisagreement is the data of a shadow_disagreement event, published on
// assent.audit.shadow.<request-id>.
type ShadowDisagreement struct {
	RequestID string `json:"request_id"`
	Tool      string `json:"tool"`
	Agent     string `json:"agent,omitempty"`
	// Live and Shadow are "<action> by <rule>" for each policy.
	Live    string `json:"live"`
	Shadow  string `json:"shadow"`
	Summary string `json:"summary"`
}

// Validate reports every problem with d at once.
func (d *ShadowDisagreement) Validate() error { return CheckToken("request_id", d.RequestID) }

// Verdict is an approver's answer.
type Verdict string

// Verdicts an approver may give.
const (
	Approve Verdict = "approve"
	Deny    Verdict = "deny"
)

// Outcome is how a request ended.
type Outcome string

// Outcomes of a request. Exactly one is recorded per request.
const (
	Approved  Outcome = "approved"
	Denied    Outcome = "denied"
	Expired   Outcome = "expired"
	Cancelled Outcome = "cancelled"
)

// Remember scopes: how widely an approver's choice is reused.
const (
	ScopeCall    = "call"
	ScopeSession = "session"
	ScopeAgent   = "agent"
	ScopeUser    = "user"
)

// Duration is a time.Duration that travels as a Go duration string ("90s", "5m").
type Duration time.Duration

// MarshalJSON writes the duration as a string such as "1m30s".
func (d Duration) MarshalJSON() ([]byte, error) {
	return json.Marshal(time.Duration(d).String())
}

// UnmarshalJSON reads a Go duration string. Numbers are rejected: a bare number
// is ambiguous between seconds and nanoseconds.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("duration must be a string such as \"90s\": %w", err)
	}
	if s == "" {
		*d = 0
		return nil
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	*d = Duration(v)
	return nil
}

// Std returns d as a time.Duration.
func (d Duration) Std() time.Duration { return time.Duration(d) }

// Requested is the data of a dev.assent.approval.requested event: an agent asks
// whether it may run Tool with Args. The event id is the request id.
type Requested struct {
	Tool           string            `json:"tool"`
	Args           json.RawMessage   `json:"args,omitempty"`
	Agent          string            `json:"agent,omitempty"`
	Session        string            `json:"session,omitempty"`
	User           string            `json:"user,omitempty"`
	CallID         string            `json:"call_id,omitempty"`
	Hint           string            `json:"hint,omitempty"`
	ResponseSchema json.RawMessage   `json:"response_schema,omitempty"`
	Timeout        Duration          `json:"timeout,omitempty"`
	Labels         map[string]string `json:"labels,omitempty"`
	// InputSchema is the JSON Schema of the tool's arguments (for example
	// an MCP tool's inputSchema), shown to approvers and enforced by the
	// broker with CheckArgs: a request whose own Args break it is denied
	// at once (rule "input-schema"), and an approver's edited args that
	// break it are refused. Validate checks only that it is a JSON object
	// within MaxInputSchemaSize; it is not part of the request digest.
	// Absent from requests by clients before it was added.
	InputSchema json.RawMessage `json:"input_schema,omitempty"`
}

// Remember asks the broker to reuse an answer for later matching requests.
type Remember struct {
	Scope string   `json:"scope"`
	TTL   Duration `json:"ttl,omitempty"`
	// Args optionally narrows the remembered choice to requests whose args
	// contain these keys with these values; string values may be globs
	// (path.Match syntax), e.g. {"path": "/tmp/*"}.
	Args json.RawMessage `json:"args,omitempty"`
}

// Responded is the data of a dev.assent.approval.responded event: one approver's
// answer to one request. The principal and request id are in the subject.
type Responded struct {
	Decision Verdict         `json:"decision"`
	Reason   string          `json:"reason,omitempty"`
	Args     json.RawMessage `json:"args,omitempty"`
	Payload  json.RawMessage `json:"payload,omitempty"`
	Remember *Remember       `json:"remember,omitempty"`
	Channel  string          `json:"channel,omitempty"`
	// ShownAt is when the channel showed the request to this approver (a
	// page loaded, a message posted, a mail sent, a terminal screen drawn);
	// Detail that the approver opened the request's full detail before
	// answering. Both as the channel reports them, absent where it cannot
	// tell; insights count an answer sooner than 2 s after ShownAt (or the
	// pending event) as given without reading.
	ShownAt time.Time `json:"shown_at,omitzero"`
	Detail  bool      `json:"detail,omitempty"`
}

// Cancel is the data of a dev.assent.approval.cancel event. The request id is in
// the subject.
type Cancel struct {
	Reason string `json:"reason,omitempty"`
}

// Pending is the data of a dev.assent.approval.pending event: the broker tells
// approver channels that a request waits for an answer.
type Pending struct {
	RequestID string    `json:"request_id"`
	Request   Requested `json:"request"`
	Deadline  time.Time `json:"deadline"`
	// Approvers lists the principals or roles that may answer; empty means anyone.
	Approvers []string `json:"approvers,omitempty"`
	Rule      string   `json:"rule,omitempty"`
	// Terms says what answers the broker accepts; absent from brokers
	// before it was added.
	Terms *Terms `json:"terms,omitempty"`

	// What the broker derives a waiting request's state from (absent from
	// brokers before the stream decided): the request message's stream
	// sequence, time and digest, the deadline before escalation extends
	// it, the limit that held an automatic approval (Rule is then
	// "limit:<name>" and ApprovalRule the rule whose approvers answer).
	RequestSeq    uint64    `json:"request_seq,omitempty"`
	ReceivedAt    time.Time `json:"received_at,omitzero"`
	RequestDigest string    `json:"request_digest,omitempty"`
	BaseDeadline  time.Time `json:"base_deadline,omitzero"`
	Limit         string    `json:"limit,omitempty"`
	ApprovalRule  string    `json:"approval_rule,omitempty"`

	// History is what the record said, when the request was announced, of
	// requests like it: the line approvers see beside it. Absent when the
	// broker had not read the record yet, and from brokers before it was
	// added.
	History *History `json:"history,omitempty"`
}

// History counts how people decided requests like one being asked, over a
// window ending when it was asked: those of the same tool and agent, and
// among them those with the very same arguments (Exact). Channels show it
// as one line ("approved 41 of 41 times in 30 days; last denied never"), so
// that an unusual request looks unusual.
type History struct {
	Window   Duration `json:"window"`
	Approved int      `json:"approved"`
	Denied   int      `json:"denied"`
	Expired  int      `json:"expired,omitempty"`
	// Exact counts the decisions of requests with these exact arguments.
	Exact int `json:"exact,omitempty"`
	// Principals are who approved or denied, most frequent first (at most
	// a few).
	Principals []string `json:"principals,omitempty"`
	// LastDenied is when a person last denied one; zero: never in the
	// record.
	LastDenied time.Time `json:"last_denied,omitzero"`
}

// Terms is how a pending request may be answered, under the policy in force
// when the event was made, so that channels offer only what the broker will
// accept. The broker still checks every answer.
type Terms struct {
	// Quorum is how many approvals decide (1: the first).
	Quorum int `json:"quorum,omitempty"`
	// AllowSelfApproval says the request's user may answer it.
	AllowSelfApproval bool `json:"allow_self_approval,omitempty"`
	// Remember, if set, lets an answer be remembered in one of Scopes for
	// at most MaxTTL; absent, answers may not be remembered.
	Remember *RememberTerms `json:"remember,omitempty"`
}

// RememberTerms is what a rule lets an answer remember.
type RememberTerms struct {
	Scopes []string `json:"scopes"`
	MaxTTL Duration `json:"max_ttl"`
}

// Escalated is the data of a dev.assent.approval.escalated event: a request moved
// to the next level of its escalation ladder.
type Escalated struct {
	RequestID string    `json:"request_id"`
	Request   Requested `json:"request"`
	Level     int       `json:"level"`
	Approvers []string  `json:"approvers,omitempty"`
	Deadline  time.Time `json:"deadline"`
	Terms     *Terms    `json:"terms,omitempty"`
}

// DecidedBy records one principal's part in a decision.
type DecidedBy struct {
	Principal string    `json:"principal"`
	Channel   string    `json:"channel,omitempty"`
	Decision  Verdict   `json:"decision,omitempty"`
	At        time.Time `json:"at"`
}

// Decided is the data of a dev.assent.approval.decided event, the one and only
// outcome of a request. A worker executes Args, never the arguments it asked with.
type Decided struct {
	RequestID  string          `json:"request_id"`
	Outcome    Outcome         `json:"outcome"`
	Reason     string          `json:"reason,omitempty"`
	Args       json.RawMessage `json:"args,omitempty"`
	Edited     bool            `json:"edited,omitempty"`
	ArgsDigest string          `json:"args_digest,omitempty"`
	Payload    json.RawMessage `json:"payload,omitempty"`
	DecidedBy  []DecidedBy     `json:"decided_by,omitempty"`
	Rule       string          `json:"rule,omitempty"`
	// ApprovalRule is the rule (or mode:<mode>) whose approvers answered,
	// where it differs from Rule: a request a limit held for approval has
	// Rule "limit:<name>" and the approval rule here.
	ApprovalRule string    `json:"approval_rule,omitempty"`
	Auto         bool      `json:"auto,omitempty"`
	DecidedAt    time.Time `json:"decided_at"`
	// RequestDigest binds the decision to the whole request it decides (see
	// RequestDigest), so an agent that reused a request id can tell the
	// decision is not about its request.
	RequestDigest string `json:"request_digest,omitempty"`
	// RequestSeq is the stream sequence of the request message decided,
	// absent from brokers before it was added; a reader that no longer has
	// the request finds it there.
	RequestSeq uint64 `json:"request_seq,omitempty"`
	// Trail lists, in order, the stream sequences of the other messages
	// about the request that this decision followed: its pending event, the
	// answers counted, and what ended it (an answer, a cancel, the broker's
	// record of its deadline). With RequestSeq it links the decision to the
	// request's stored history: a reader of the record finds each there,
	// and one missing was deleted (broker audit verify). Absent from
	// automatic decisions, which follow the request alone, and from brokers
	// before it was added.
	Trail []uint64 `json:"trail,omitempty"`
}

// Rejection codes: why the broker refused a request without deciding it.
const (
	// RejectIDConflict: the request id is taken by a different request.
	RejectIDConflict = "id_conflict"
)

// Rejected is the data of a dev.assent.approval.rejected event, published by
// the broker on assent.rejection.<request-id> when it refuses a request
// message without deciding it, so that the agent learns why. A rejection is
// not a decision: the request id may have one decision, about another request.
type Rejected struct {
	RequestID string `json:"request_id"`
	Code      string `json:"code"`
	Reason    string `json:"reason,omitempty"`
	// RequestDigest is the digest of the refused request, so its sender can
	// tell the rejection is about its own message.
	RequestDigest string `json:"request_digest,omitempty"`
}

// Validate reports every problem with r at once.
func (r *Rejected) Validate() error {
	var errs []error
	if err := CheckToken("request_id", r.RequestID); err != nil {
		errs = append(errs, err)
	}
	if r.Code == "" {
		errs = append(errs, fieldErr("code", ErrMissingField))
	}
	return errors.Join(errs...)
}

// Approved reports whether the guarded call may run.
func (d Decided) Approved() bool { return d.Outcome == Approved }

// Valid reports whether o is one of the four outcomes.
func (o Outcome) Valid() bool {
	switch o {
	case Approved, Denied, Expired, Cancelled:
		return true
	}
	return false
}

// isJSONObject reports whether raw holds a JSON object (after leading white space).
func isJSONObject(raw json.RawMessage) bool {
	t := bytes.TrimLeft(raw, " \t\r\n")
	return len(t) > 0 && t[0] == '{' && json.Valid(raw)
}
