package events

import "errors"

// ErrInvalid is wrapped by every validation and decode error of this package.
var ErrInvalid = errors.New("invalid event")

// Specific conditions, each also matching ErrInvalid with errors.Is.
var (
	ErrTooLarge        = invalid("event too large")
	ErrMalformed       = invalid("malformed event")
	ErrWrongType       = invalid("unexpected event type")
	ErrMissingField    = invalid("missing required field")
	ErrMissingTool     = invalid("missing tool")
	ErrBadToken        = invalid("bad subject token")
	ErrArgsNotObject   = invalid("args must be a JSON object")
	ErrUnknownDecision = invalid("unknown decision")
	ErrBadSubject      = invalid("bad subject")
	ErrBadValue        = invalid("bad field value")
	// ErrBadText: text that cannot travel unchanged or be shown as what it
	// is. Invalid UTF-8 or a lone UTF-16 surrogate escape in JSON (see
	// CheckJSONText), or a control or format character in an identifier.
	ErrBadText = invalid("invalid text")
)

// sentinel is an error that also matches ErrInvalid.
type sentinel struct{ msg string }

func invalid(msg string) error { return &sentinel{msg} }

func (s *sentinel) Error() string        { return s.msg }
func (s *sentinel) Is(target error) bool { return target == ErrInvalid }

// FieldError names the field a problem was found in.
type FieldError struct {
	Field string
	Err   error
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Err.Error() }
func (e *FieldError) Unwrap() error { return e.Err }

func fieldErr(field string, err error) error { return &FieldError{Field: field, Err: err} }
