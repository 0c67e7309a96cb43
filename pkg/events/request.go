package events

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
)

// ErrRequestMismatch is wrapped when a decision or rejection names a request
// digest other than the request's own: the request id was used for a different
// request. It also matches ErrInvalid.
var ErrRequestMismatch = invalid("request digest mismatch")

// CanonicalRequest returns the canonical form of the parts of r that make it
// the request it is: a JSON object whose keys are, in this order, "agent",
// "args", "call_id", "labels", "response_schema", "session", "tool" and "user".
// "args" is always present, in its canonical form (CanonicalArgs); the others
// are left out when empty (a null or absent response_schema, no labels).
// Labels and the response schema are canonical like args: keys sorted, no
// white space, strings without HTML escaping. The hint, the input schema and
// the timeout are not part of it: they change how a request is shown and how
// long it waits, not what runs (and leaving the input schema out keeps the
// digests of clients from before it was added).
//
// Agent is taken as given; the broker fills it from the subject
// (assent.request.<agent>) when the data leaves it out, so a client computing
// the digest of a request it published without "agent" must fill it in too.
func CanonicalRequest(r Requested) (json.RawMessage, error) {
	args, err := CanonicalArgs(r.Args)
	if err != nil {
		return nil, err
	}
	return canonicalRequest(r, args)
}

// canonicalRequest is CanonicalRequest for r whose args are args, in their
// canonical form already. It writes the object itself, the same bytes that
// marshalling a map of the fields would give: its keys in sorted order, its
// values canonical JSON already.
func canonicalRequest(r Requested, args json.RawMessage) (json.RawMessage, error) {
	b := make([]byte, 0, len(args)+len(r.Agent)+len(r.CallID)+len(r.Session)+len(r.Tool)+len(r.User)+96)
	b = append(b, '{')
	field := func(name string) {
		if len(b) > 1 {
			b = append(b, ',')
		}
		b = append(b, '"')
		b = append(b, name...)
		b = append(b, '"', ':')
	}
	if r.Agent != "" {
		field("agent")
		b = appendString(b, r.Agent)
	}
	field("args")
	b = append(b, args...)
	if r.CallID != "" {
		field("call_id")
		b = appendString(b, r.CallID)
	}
	if len(r.Labels) > 0 {
		field("labels")
		b = append(b, '{')
		for i, k := range slices.Sorted(maps.Keys(r.Labels)) {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendString(b, k)
			b = append(b, ':')
			b = appendString(b, r.Labels[k])
		}
		b = append(b, '}')
	}
	if !EmptyJSON(r.ResponseSchema) {
		schema, err := CanonicalArgs(r.ResponseSchema)
		if err != nil {
			return nil, fieldErr("response_schema", err)
		}
		field("response_schema")
		b = append(b, schema...)
	}
	if r.Session != "" {
		field("session")
		b = appendString(b, r.Session)
	}
	if r.Tool != "" {
		field("tool")
		b = appendString(b, r.Tool)
	}
	if r.User != "" {
		field("user")
		b = appendString(b, r.User)
	}
	return append(b, '}'), nil
}

// RequestDigest returns "sha256:" and the hex SHA-256 of CanonicalRequest(r).
// The broker writes it into every decision (Decided.RequestDigest) and
// rejection, and refuses a request that reuses an id with another digest.
func RequestDigest(r Requested) (string, error) {
	c, err := CanonicalRequest(r)
	if err != nil {
		return "", err
	}
	return digestOf(c), nil
}

// RequestDigests returns RequestDigest(r) and ArgsDigest(r.Args), reading the
// args once for both. Its errors are RequestDigest's.
func RequestDigests(r Requested) (request, args string, err error) {
	canon, err := CanonicalArgs(r.Args)
	if err != nil {
		return "", "", err
	}
	c, err := canonicalRequest(r, canon)
	if err != nil {
		return "", "", err
	}
	return digestOf(c), digestOf(canon), nil
}

// digestOf returns "sha256:" and the hex SHA-256 of b.
func digestOf(b []byte) string {
	const prefix = "sha256:"
	sum := sha256.Sum256(b)
	out := make([]byte, len(prefix)+hex.EncodedLen(len(sum)))
	copy(out, prefix)
	hex.Encode(out[len(prefix):], sum[:])
	return string(out)
}

// VerifyRequest checks that d decides r: see VerifyRequestDigest.
func (d Decided) VerifyRequest(r Requested) error {
	want, err := RequestDigest(r)
	if err != nil {
		return err
	}
	return d.VerifyRequestDigest(want)
}

// VerifyRequestDigest checks that d decides the request whose RequestDigest is
// want. A decision that lets the call run (approved) must carry a digest; one
// that does not (denied, expired, cancelled) may lack it, since nothing runs
// on it. A mismatch wraps ErrRequestMismatch: the request id was used for
// another request, and this decision is about that one.
func (d Decided) VerifyRequestDigest(want string) error {
	switch {
	case d.RequestDigest == "" && d.Approved():
		return fieldErr("request_digest", fmt.Errorf("%w: an approval must name the request it approves", ErrMissingField))
	case d.RequestDigest != "" && d.RequestDigest != want:
		return fieldErr("request_digest", fmt.Errorf("%w: the decision is for request %s, this request is %s", ErrRequestMismatch, truncate(d.RequestDigest, 80), want))
	}
	return nil
}

// DiffRequests names the fields that make a and b different requests (those
// of CanonicalRequest), for error messages about a reused request id.
func DiffRequests(a, b Requested) []string {
	var out []string
	ca, errA := CanonicalRequest(a)
	cb, errB := CanonicalRequest(b)
	if errA != nil || errB != nil {
		return []string{"args"}
	}
	var ma, mb map[string]json.RawMessage
	_ = json.Unmarshal(ca, &ma)
	_ = json.Unmarshal(cb, &mb)
	for _, k := range []string{"agent", "args", "call_id", "labels", "response_schema", "session", "tool", "user"} {
		if !bytes.Equal(ma[k], mb[k]) {
			out = append(out, k)
		}
	}
	return slices.Clip(out)
}

// DecodeRejected reads and validates the data of a rejected event.
func DecodeRejected(e *Event) (Rejected, error) { return DecodeData[Rejected](e, TypeRejected) }

// marshalCanonical writes v as compact JSON without HTML escaping; map keys
// come out sorted.
func marshalCanonical(v any) (json.RawMessage, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimRight(buf.Bytes(), "\n"), nil
}

// appendString appends s as marshalCanonical writes it: a JSON string,
// without HTML escaping.
func appendString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e || c == '"' || c == '\\' {
			// Escapes and runes beyond ASCII: as encoding/json writes them.
			q, _ := marshalCanonical(s) // a string always marshals
			return append(b, q...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}
