package policy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/assent-dev/assent/pkg/events"
)

// Input is the part of a request that policy looks at. Build it with InputFrom;
// a hand-built Input without ArgsDigest never matches call-scoped grants.
type Input struct {
	Tool    string
	Agent   string
	Session string
	User    string
	Labels  map[string]string
	// Args holds the decoded arguments as CEL sees them: nil, bool, string,
	// int64 (integers that fit), float64 (every other number), []any and
	// map[string]any. InputWithDigest leaves it nil and keeps the args as
	// JSON, decoded only if the evaluation reads them.
	Args map[string]any
	// ArgsDigest is events.ArgsDigest of the request's arguments.
	ArgsDigest string
	// Timeout is the timeout the request asked for; zero if none.
	Timeout time.Duration

	// raw holds the args of an Input from InputWithDigest until they are
	// decoded; it is shared by the copies of the Input.
	raw *rawArgs
}

// rawArgs are a request's args as JSON, decoded the first time they are read.
type rawArgs struct {
	once sync.Once
	json json.RawMessage
	args map[string]any
	err  error
}

// args returns the decoded args: Args, or, for an Input from InputWithDigest,
// the args it holds, decoded.
func (in *Input) args() (map[string]any, error) {
	if in.Args != nil || in.raw == nil {
		return in.Args, nil
	}
	r := in.raw
	r.once.Do(func() { r.args, r.err = DecodeArgs(r.json) })
	return r.args, r.err
}

// InputFrom reads a request. Arguments that are not a JSON object give an error
// wrapping ErrInput.
func InputFrom(req events.Requested) (Input, error) {
	digest, err := events.ArgsDigest(req.Args)
	if err != nil {
		return Input{}, fmt.Errorf("%w: %w", ErrInput, err)
	}
	in := Input{
		Tool:       req.Tool,
		Agent:      req.Agent,
		Session:    req.Session,
		User:       req.User,
		Labels:     req.Labels,
		ArgsDigest: digest,
		Timeout:    req.Timeout.Std(),
	}
	if in.Args, err = DecodeArgs(req.Args); err != nil {
		return Input{}, err
	}
	return in, nil
}

// InputWithDigest is InputFrom for a request whose args digest the caller
// has computed already (events.ArgsDigest, or events.RequestDigests beside
// the request digest), which shows the args are a JSON object: they are not
// read again for the digest, and are decoded only when the evaluation looks at
// them (a condition or a limit's sum that reads args, a remembered choice with
// an args pattern), so Input.Args stays nil. argsDigest must be the digest of
// req.Args; it is taken as it is. Should the args not decode after all,
// conditions that read them fail (and count fail-closed) and args patterns do
// not match.
func InputWithDigest(req events.Requested, argsDigest string) Input {
	return Input{
		Tool:       req.Tool,
		Agent:      req.Agent,
		Session:    req.Session,
		User:       req.User,
		Labels:     req.Labels,
		ArgsDigest: argsDigest,
		Timeout:    req.Timeout.Std(),
		raw:        &rawArgs{json: req.Args},
	}
}

// DecodeArgs decodes a JSON object of arguments the way Input.Args holds them.
// Empty or null input gives an empty map; anything but an object is an error
// wrapping ErrInput.
func DecodeArgs(raw json.RawMessage) (map[string]any, error) {
	if events.EmptyJSON(raw) {
		return map[string]any{}, nil
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, fmt.Errorf("%w: args: %v", ErrInput, err)
	}
	if dec.More() {
		return nil, fmt.Errorf("%w: args: trailing data after the object", ErrInput)
	}
	m, ok := v.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("%w: args: %w", ErrInput, events.ErrArgsNotObject)
	}
	return convertNumbers(m).(map[string]any), nil
}

// convertNumbers replaces json.Number values in place with int64 when the
// number is an integer that fits, float64 otherwise.
func convertNumbers(v any) any {
	switch x := v.(type) {
	case json.Number:
		if i, err := strconv.ParseInt(string(x), 10, 64); err == nil {
			return i
		}
		f, _ := strconv.ParseFloat(string(x), 64) // out of range gives ±Inf
		return f
	case map[string]any:
		for k, e := range x {
			x[k] = convertNumbers(e)
		}
	case []any:
		for i, e := range x {
			x[i] = convertNumbers(e)
		}
	}
	return v
}
