package adkassent

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"

	"github.com/google/jsonschema-go/jsonschema"

	"github.com/assent-dev/assent/pkg/events"
)

// SchemaFor returns a JSON Schema for payloads of type T, for Config.Schemas:
// the schema ADK's functiontool would infer for T (integers are integers,
// fields without omitempty are required, no other fields are allowed).
func SchemaFor[T any]() (json.RawMessage, error) {
	s, err := jsonschema.For[T](nil)
	if err != nil {
		return nil, fmt.Errorf("adkassent: schema for %T: %w", *new(T), err)
	}
	raw, err := json.Marshal(s)
	if err != nil {
		return nil, fmt.Errorf("adkassent: schema for %T: %w", *new(T), err)
	}
	if _, err := events.CompileSchema(raw); err != nil {
		return nil, fmt.Errorf("adkassent: schema for %T: %w", *new(T), err)
	}
	return raw, nil
}

// SchemaOf derives a JSON Schema from a proposed payload's JSON: the answer
// must have the proposal's shape. Objects need the proposal's keys (others
// are allowed), arrays hold items shaped like the proposal's first, numbers
// may be any number, and null allows anything. It depends on the JSON alone,
// so a proposal read back from a stored session gives the same schema as the
// live one. It returns nil for a null or absent payload.
func SchemaOf(payload json.RawMessage) (json.RawMessage, error) {
	if isNull(payload) {
		return nil, nil
	}
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, fmt.Errorf("adkassent: payload: %w", err)
	}
	return json.Marshal(shape(v))
}

// shape is the schema of one JSON value, as SchemaOf describes.
func shape(v any) map[string]any {
	switch x := v.(type) {
	case map[string]any:
		props := make(map[string]any, len(x))
		required := make([]string, 0, len(x))
		for k, e := range x {
			props[k] = shape(e)
			required = append(required, k)
		}
		slices.Sort(required)
		s := map[string]any{"type": "object", "properties": props}
		if len(required) > 0 {
			s["required"] = required
		}
		return s
	case []any:
		s := map[string]any{"type": "array"}
		if len(x) > 0 {
			s["items"] = shape(x[0])
		}
		return s
	case string:
		return map[string]any{"type": "string"}
	case bool:
		return map[string]any{"type": "boolean"}
	case json.Number:
		return map[string]any{"type": "number"}
	default: // null
		return map[string]any{}
	}
}

// payloadFor returns the payload ADK gets for an approval under schema: the
// approver's (decided) if there is one, else the tool's proposal. With a
// schema the payload must fit it, as the broker requires of approvers; one
// that does not is refused with ErrPayload.
func payloadFor(schema, decided, proposed json.RawMessage) (any, error) {
	p, from := decided, "the approver's payload"
	if isNull(p) {
		p, from = proposed, "the tool's proposed payload"
	}
	if !isNull(schema) {
		if err := events.CheckPayload(schema, p); err != nil {
			return nil, fmt.Errorf("%w: %s: %w", ErrPayload, from, err)
		}
	}
	if isNull(p) {
		return nil, nil
	}
	var v any
	if err := json.Unmarshal(p, &v); err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrPayload, from, err)
	}
	return v, nil
}
