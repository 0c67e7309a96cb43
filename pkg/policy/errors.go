package policy

import (
	"errors"
	"fmt"
)

// ErrInvalid is matched (with errors.Is) by every problem Parse reports; each
// problem also matches the more specific sentinel below that describes it.
var ErrInvalid = errors.New("invalid policy")

// Problems Parse reports. Each matches ErrInvalid too.
var (
	ErrSyntax          = invalid("YAML syntax error")
	ErrVersion         = invalid("unsupported policy version")
	ErrUnknownField    = invalid("unknown field")
	ErrMissingField    = invalid("missing required field")
	ErrBadValue        = invalid("bad value")
	ErrBadType         = invalid("wrong YAML type")
	ErrBadName         = invalid("bad name")
	ErrDuplicate       = invalid("duplicate name")
	ErrBadGlob         = invalid("bad glob pattern")
	ErrBadDuration     = invalid("bad duration")
	ErrBadCEL          = invalid("CEL expression does not compile")
	ErrNotBool         = invalid("CEL condition is not a bool")
	ErrQuorum          = invalid("bad quorum")
	ErrUnknownApprover = invalid("unknown approver")
)

// Conditions found while evaluating a request or an answer.
var (
	// ErrCondition wraps a CEL runtime error of a rule condition or a limit sum.
	ErrCondition = errors.New("condition failed")
	// ErrInput is returned by InputFrom for a request it cannot read.
	ErrInput = errors.New("bad request input")
	// ErrNotEligible: the principal is not among the approvers of the request.
	ErrNotEligible = errors.New("not an eligible approver")
	// ErrSelfApproval: the principal is the request's user and the rule forbids
	// self-approval.
	ErrSelfApproval = errors.New("self-approval is not allowed")
	// ErrNotRememberable: the rule's answers may not be remembered, or not in the
	// scope asked for.
	ErrNotRememberable = errors.New("answer may not be remembered")
	// ErrBadGrant: a remembered choice is malformed (bad scope, TTL, id, pattern,
	// or a scope the request has no value for).
	ErrBadGrant = errors.New("bad remembered choice")
)

// sentinel is an error that also matches ErrInvalid.
type sentinel struct{ msg string }

func invalid(msg string) error { return &sentinel{msg} }

func (s *sentinel) Error() string        { return s.msg }
func (s *sentinel) Is(target error) bool { return target == ErrInvalid }

// Error is one problem in a policy file, at a line, in a place named by Path
// ("rules[2] (big-reimbursements)", "defaults", "principals.alice"). Err is the
// sentinel describing the kind of problem, for errors.Is. Parse joins every
// Error it finds with errors.Join, in line order.
type Error struct {
	File string
	Line int
	Path string
	Msg  string
	Err  error
}

// Error formats the problem as "file:line: path: message".
func (e *Error) Error() string {
	s := fmt.Sprintf("%s:%d: ", e.File, e.Line)
	if e.Path != "" {
		s += e.Path + ": "
	}
	return s + e.Msg
}

// Unwrap returns the sentinel.
func (e *Error) Unwrap() error { return e.Err }
