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
// are allowed), arrays hold items of the shape the proposal's items share
// (any items if they differ), numbers may be any number, and null allows
// anything. Below shapeDepth levels only a value's type counts, and a
// proposal whose schema would pass the limits on response schemas
// (events.MaxSchemaSize and friends) asks only for its own type. It depends
// on the JSON alone, so a proposal read back from a stored session gives the
// same schema as the live one. It returns nil for a null or absent payload.
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
	schema, err := json.Marshal(shape(v, shapeDepth))
	if err != nil {
		return nil, fmt.Errorf("adkassent: payload: %w", err)
	}
	if _, err := events.CompileSchema(schema); err != nil {
		return json.Marshal(shape(v, 1))
	}
	return schema, nil
}

// shapeDepth is how deep SchemaOf follows a proposal.
const shapeDepth = 8

// shape is the schema of one JSON value, as SchemaOf describes, followed
// depth levels deep: at the last level only the type counts.
func shape(v any, depth int) map[string]any {
	switch x := v.(type) {
	case map[string]any:
		if depth == 1 {
			return map[string]any{"type": "object"}
		}
		props := make(map[string]any, len(x))
		required := make([]string, 0, len(x))
		for k, e := range x {
			props[k] = shape(e, depth-1)
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
		if len(x) == 0 || depth == 1 {
			return s
		}
		items := shape(x[0], depth-1)
		first, _ := json.Marshal(items)
		for _, e := range x[1:] {
			if other, _ := json.Marshal(shape(e, depth-1)); !bytes.Equal(other, first) {
				return s // items of more than one shape: any items
			}
		}
		s["items"] = items
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
