package events

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// Limits on free-text fields, so one event cannot carry unbounded strings in
// places that end up in logs and UIs. Args and payloads are bounded only by the
// event size limit; response schemas also by MaxSchemaSize, MaxSchemaDepth and
// MaxSchemaObjects, input schemas by MaxInputSchemaSize.
const (
	MaxToolLength  = 256
	MaxTextLength  = 4096
	MaxLabels      = 64
	MaxLabelLength = 256
	MaxTimeout     = 30 * 24 * time.Hour
	// MaxInputSchemaSize bounds requested.input_schema in bytes: as much
	// as a response schema may take, a small part of an event.
	MaxInputSchemaSize = MaxSchemaSize
	maxTokenlikeLen    = 256
)

// Validate reports every problem with r at once.
func (r *Requested) Validate() error {
	var errs []error
	switch {
	case r.Tool == "":
		errs = append(errs, fieldErr("tool", ErrMissingTool))
	case len(r.Tool) > MaxToolLength:
		errs = append(errs, fieldErr("tool", fmt.Errorf("%w: longer than %d bytes", ErrBadValue, MaxToolLength)))
	}
	if err := CheckIdentifier("tool", r.Tool); err != nil {
		errs = append(errs, err)
	}
	if len(r.Args) > 0 && !isJSONNull(r.Args) {
		if !isJSONObject(r.Args) {
			errs = append(errs, fieldErr("args", ErrArgsNotObject))
		} else if err := CheckJSONText(r.Args); err != nil {
			errs = append(errs, fieldErr("args", err))
		}
	}
	if r.Agent != "" {
		if err := CheckToken("agent", r.Agent); err != nil {
			errs = append(errs, err)
		}
	}
	for _, f := range []struct{ name, v string }{{"session", r.Session}, {"user", r.User}, {"call_id", r.CallID}} {
		if len(f.v) > maxTokenlikeLen {
			errs = append(errs, fieldErr(f.name, fmt.Errorf("%w: longer than %d bytes", ErrBadValue, maxTokenlikeLen)))
		}
		if err := CheckIdentifier(f.name, f.v); err != nil {
			errs = append(errs, err)
		}
	}
	if len(r.Hint) > MaxTextLength {
		errs = append(errs, fieldErr("hint", fmt.Errorf("%w: longer than %d bytes", ErrBadValue, MaxTextLength)))
	}
	// A schema is compiled here, once per request, so that one which can
	// never accept an answer is refused now rather than failing every
	// answer. Requests without a schema skip this.
	if len(r.ResponseSchema) > 0 && !isJSONNull(r.ResponseSchema) {
		if !isJSONObject(r.ResponseSchema) {
			errs = append(errs, fieldErr("response_schema", fmt.Errorf("%w: must be a JSON Schema object", ErrBadValue)))
		} else if _, err := CompileSchema(r.ResponseSchema); err != nil {
			errs = append(errs, err) // names response_schema; ErrBadText or ErrSchema
		}
	}
	// The input schema is not compiled here: it needs to be an object of
	// bounded size. The broker checks args against it (CheckArgs), and
	// decides a request whose schema does not compile there, so that
	// channels and older peers keep reading such requests.
	if len(r.InputSchema) > 0 && !isJSONNull(r.InputSchema) {
		switch {
		case len(r.InputSchema) > MaxInputSchemaSize:
			errs = append(errs, fieldErr("input_schema", fmt.Errorf("%w: %d bytes, limit %d", ErrBadValue, len(r.InputSchema), MaxInputSchemaSize)))
		case !isJSONObject(r.InputSchema):
			errs = append(errs, fieldErr("input_schema", fmt.Errorf("%w: must be a JSON Schema object", ErrBadValue)))
		default:
			if err := CheckJSONText(r.InputSchema); err != nil {
				errs = append(errs, fieldErr("input_schema", err))
			}
		}
	}
	if r.Timeout < 0 || r.Timeout.Std() > MaxTimeout {
		errs = append(errs, fieldErr("timeout", fmt.Errorf("%w: %s is outside 0..%s", ErrBadValue, r.Timeout.Std(), MaxTimeout)))
	}
	if len(r.Labels) > MaxLabels {
		errs = append(errs, fieldErr("labels", fmt.Errorf("%w: more than %d labels", ErrBadValue, MaxLabels)))
	}
	for k, v := range r.Labels {
		if k == "" || len(k) > MaxLabelLength || len(v) > MaxLabelLength {
			errs = append(errs, fieldErr("labels", fmt.Errorf("%w: label %q: keys must be 1-%d bytes and values at most %d", ErrBadValue, truncate(k, 40), MaxLabelLength, MaxLabelLength)))
		}
		if p := identifierProblem(k); p != "" {
			errs = append(errs, fieldErr("labels", fmt.Errorf("%w: label %q: key: %s", ErrBadText, truncate(k, 40), p)))
		}
		if p := identifierProblem(v); p != "" {
			errs = append(errs, fieldErr("labels", fmt.Errorf("%w: label %q: value: %s", ErrBadText, truncate(k, 40), p)))
		}
	}
	return errors.Join(errs...)
}

// Validate reports every problem with r at once.
func (r *Responded) Validate() error {
	var errs []error
	switch r.Decision {
	case Approve, Deny:
	case "":
		errs = append(errs, fieldErr("decision", fmt.Errorf("%w (want %q or %q)", ErrMissingField, Approve, Deny)))
	default:
		errs = append(errs, fieldErr("decision", fmt.Errorf("%w: %q (want %q or %q)", ErrUnknownDecision, truncate(string(r.Decision), 40), Approve, Deny)))
	}
	if len(r.Reason) > MaxTextLength {
		errs = append(errs, fieldErr("reason", fmt.Errorf("%w: longer than %d bytes", ErrBadValue, MaxTextLength)))
	}
	if len(r.Args) > 0 && !isJSONNull(r.Args) {
		if !isJSONObject(r.Args) {
			errs = append(errs, fieldErr("args", ErrArgsNotObject))
		} else if r.Decision == Deny {
			errs = append(errs, fieldErr("args", fmt.Errorf("%w: edited args only go with %q", ErrBadValue, Approve)))
		} else if err := CheckJSONText(r.Args); err != nil {
			errs = append(errs, fieldErr("args", err))
		}
	}
	if len(r.Payload) > 0 {
		if !json.Valid(r.Payload) {
			errs = append(errs, fieldErr("payload", fmt.Errorf("%w: not valid JSON", ErrBadValue)))
		} else if err := CheckJSONText(r.Payload); err != nil {
			errs = append(errs, fieldErr("payload", err))
		}
	}
	if r.Remember != nil {
		switch r.Remember.Scope {
		case ScopeCall, ScopeSession, ScopeAgent, ScopeUser:
		default:
			errs = append(errs, fieldErr("remember.scope", fmt.Errorf("%w: %q (want call, session, agent or user)", ErrBadValue, truncate(r.Remember.Scope, 40))))
		}
		if r.Remember.TTL < 0 {
			errs = append(errs, fieldErr("remember.ttl", fmt.Errorf("%w: negative", ErrBadValue)))
		}
		if len(r.Remember.Args) > 0 && !isJSONNull(r.Remember.Args) {
			if !isJSONObject(r.Remember.Args) {
				errs = append(errs, fieldErr("remember.args", ErrArgsNotObject))
			} else if err := CheckJSONText(r.Remember.Args); err != nil {
				errs = append(errs, fieldErr("remember.args", err))
			}
		}
	}
	if r.Channel != "" && !ValidToken(r.Channel) {
		errs = append(errs, CheckToken("channel", r.Channel))
	}
	return errors.Join(errs...)
}

// Validate reports every problem with c at once.
func (c *Cancel) Validate() error {
	if len(c.Reason) > MaxTextLength {
		return fieldErr("reason", fmt.Errorf("%w: longer than %d bytes", ErrBadValue, MaxTextLength))
	}
	return nil
}

// Validate reports every problem with d at once.
func (d *Decided) Validate() error {
	var errs []error
	if err := CheckToken("request_id", d.RequestID); err != nil {
		errs = append(errs, err)
	}
	if !d.Outcome.Valid() {
		errs = append(errs, fieldErr("outcome", fmt.Errorf("%w: %q", ErrBadValue, truncate(string(d.Outcome), 40))))
	}
	if len(d.Args) > 0 && !isJSONObject(d.Args) && !isJSONNull(d.Args) {
		errs = append(errs, fieldErr("args", ErrArgsNotObject))
	}
	if d.DecidedAt.IsZero() {
		errs = append(errs, fieldErr("decided_at", ErrMissingField))
	}
	return errors.Join(errs...)
}

// Validate reports every problem with p at once.
func (p *Pending) Validate() error {
	var errs []error
	if err := CheckToken("request_id", p.RequestID); err != nil {
		errs = append(errs, err)
	}
	if err := p.Request.Validate(); err != nil {
		errs = append(errs, fieldErr("request", err))
	}
	if p.History != nil {
		if err := p.History.Validate(); err != nil {
			errs = append(errs, fieldErr("history", err))
		}
	}
	return errors.Join(errs...)
}

// Bounds of a pending event's History. They are wide on purpose: a channel
// that refuses a pending event cannot show its request at all, so they
// refuse only what no broker would write, not a window or a list longer
// than today's.
const (
	// MaxHistoryWindow bounds History.Window: a year and a day.
	MaxHistoryWindow = 366 * 24 * time.Hour
	// MaxHistoryPrincipals bounds the names in History.Principals (the
	// broker writes a few).
	MaxHistoryPrincipals = 32
)

// Validate reports every problem with h at once: a window that is not
// positive or longer than MaxHistoryWindow, a negative count, more than
// MaxHistoryPrincipals principals, or one that is not a principal's name
// (a subject token). Counts are not checked against each other.
func (h *History) Validate() error {
	var errs []error
	if h.Window <= 0 || h.Window.Std() > MaxHistoryWindow {
		errs = append(errs, fieldErr("window", fmt.Errorf("%w: %s is outside (0, %s]", ErrBadValue, h.Window.Std(), MaxHistoryWindow)))
	}
	for _, c := range []struct {
		name string
		n    int
	}{{"approved", h.Approved}, {"denied", h.Denied}, {"expired", h.Expired}, {"exact", h.Exact}} {
		if c.n < 0 {
			errs = append(errs, fieldErr(c.name, fmt.Errorf("%w: negative", ErrBadValue)))
		}
	}
	if len(h.Principals) > MaxHistoryPrincipals {
		errs = append(errs, fieldErr("principals", fmt.Errorf("%w: %d names, at most %d", ErrBadValue, len(h.Principals), MaxHistoryPrincipals)))
	}
	for _, p := range h.Principals {
		if err := CheckToken("principals", p); err != nil {
			errs = append(errs, err)
			break // one is enough to say what is wrong
		}
	}
	return errors.Join(errs...)
}

// MaxShownSkew is how far after an answer a responded event's ShownAt may
// lie and still be believed (the channel's clock running ahead).
const MaxShownSkew = time.Minute

// Viewed returns how long r's request was in view before r was given at
// answered (when the stream stored it, say): answered minus ShownAt, and 0
// when ShownAt lies after answered by at most MaxShownSkew. ok is false
// when ShownAt is absent, or lies further after answered: a clock that
// cannot be believed, so the reader takes the answer as one that does not
// say when it was shown. Validate accepts any ShownAt: an answer is never
// refused for what its channel's clock says.
func (r *Responded) Viewed(answered time.Time) (d time.Duration, ok bool) {
	if r.ShownAt.IsZero() {
		return 0, false
	}
	d = answered.Sub(r.ShownAt)
	switch {
	case d >= 0:
		return d, true
	case -d <= MaxShownSkew:
		return 0, true
	}
	return 0, false
}

// Validate reports every problem with e at once.
func (e *Escalated) Validate() error {
	var errs []error
	if err := CheckToken("request_id", e.RequestID); err != nil {
		errs = append(errs, err)
	}
	if e.Level < 0 {
		errs = append(errs, fieldErr("level", fmt.Errorf("%w: negative", ErrBadValue)))
	}
	return errors.Join(errs...)
}

func isJSONNull(raw json.RawMessage) bool {
	return string(TrimJSONSpace(raw)) == "null"
}

// TrimJSONSpace returns b without the whitespace JSON allows around a value
// (space, tab, line feed, carriage return). bytes.TrimSpace trims more (a
// form feed, U+0085, U+00A0), which JSON does not allow, so "\fnull" would
// pass for null.
func TrimJSONSpace(b []byte) []byte { return bytes.Trim(b, " \t\n\r") }

// EmptyJSON reports whether raw is empty or null, JSON whitespace aside:
// args that say nothing, which CanonicalArgs makes {}.
func EmptyJSON(raw json.RawMessage) bool {
	t := TrimJSONSpace(raw)
	return len(t) == 0 || string(t) == "null"
}

// CanonicalArgs returns args as compact JSON with object keys sorted, numbers as
// written and no HTML escaping. Empty or null args become {}. It is the form that
// ArgsDigest hashes. Args that are not JSON wrap ErrMalformed, args that are not
// an object ErrArgsNotObject, and args holding invalid UTF-8 or a lone surrogate
// escape ErrBadText (see CheckJSONText): they are refused, never rewritten, so
// that every implementation computes the same digest or none.
func CanonicalArgs(args json.RawMessage) (json.RawMessage, error) {
	if EmptyJSON(args) {
		return json.RawMessage("{}"), nil
	}
	if !json.Valid(args) {
		return nil, fieldErr("args", fmt.Errorf("%w: not valid JSON", ErrMalformed))
	}
	if err := CheckJSONText(args); err != nil {
		return nil, fieldErr("args", err)
	}
	dec := json.NewDecoder(bytes.NewReader(args))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, fieldErr("args", fmt.Errorf("%w: %v", ErrMalformed, err))
	}
	if _, ok := v.(map[string]any); !ok {
		return nil, fieldErr("args", ErrArgsNotObject)
	}
	return marshalCanonical(v)
}

// ArgsDigest returns "sha256:" and the hex SHA-256 of CanonicalArgs(args). A
// decision is bound to the arguments it approved through this digest.
func ArgsDigest(args json.RawMessage) (string, error) {
	c, err := CanonicalArgs(args)
	if err != nil {
		return "", err
	}
	return digestOf(c), nil
}

// VerifyArgs checks that d.Args matches d.ArgsDigest. Workers call it before they
// execute an approved call.
func (d Decided) VerifyArgs() error {
	got, err := ArgsDigest(d.Args)
	if err != nil {
		return err
	}
	return d.VerifyArgsDigest(got)
}

// VerifyArgsDigest is VerifyArgs for a caller that knows the digest of d.Args
// already, got (ArgsDigest of the same bytes; an agent has it for the args it
// asked with): it checks that d.ArgsDigest is got, without hashing the args
// again.
func (d Decided) VerifyArgsDigest(got string) error {
	if got != d.ArgsDigest {
		return fieldErr("args_digest", fmt.Errorf("%w: args hash to %s, decision says %s", ErrBadValue, got, truncate(d.ArgsDigest, 80)))
	}
	return nil
}
