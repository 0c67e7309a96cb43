package events

import (
	"bytes"
	"errors"
	"fmt"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// ErrSchema is wrapped when a response schema does not compile or a payload does
// not satisfy it. It also matches ErrInvalid.
var ErrSchema = invalid("response schema")

const schemaURL = "mem:///response_schema.json"

// Limits on a response schema. Compiling one costs more than linear time in
// its nesting and in its number of subschemas (a 10 KB schema nested 1000
// deep takes over a second), and every request with a schema is compiled when
// it is validated, so schemas are bounded well below the event size. They
// are far above what a form for an approver needs.
const (
	// MaxSchemaSize bounds response_schema in bytes.
	MaxSchemaSize = 64 << 10
	// MaxSchemaDepth bounds how deep objects and arrays nest in
	// response_schema; the schema object itself is depth 1.
	MaxSchemaDepth = 64
	// MaxSchemaObjects bounds the number of JSON objects in response_schema,
	// the schema itself and objects inside values (enum, const, ...) included.
	MaxSchemaObjects = 1000
)

// noLoader refuses every external reference, so a schema cannot make the broker
// read files or reach the network.
type noLoader struct{}

func (noLoader) Load(url string) (any, error) {
	return nil, fmt.Errorf("external references are not allowed (%s)", truncate(url, 80))
}

// CompileSchema compiles a request's response_schema (JSON Schema, draft 2020-12
// unless the schema says otherwise). External $refs are refused. A schema that
// does not compile, or is over MaxSchemaSize, MaxSchemaDepth or
// MaxSchemaObjects, wraps ErrSchema; one whose text is not valid
// (CheckJSONText) wraps ErrBadText. Both name the field response_schema.
func CompileSchema(schema []byte) (*jsonschema.Schema, error) {
	if err := CheckJSONText(schema); err != nil {
		return nil, fieldErr("response_schema", err)
	}
	if err := checkSchemaShape(schema); err != nil {
		return nil, fieldErr("response_schema", err)
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(schema))
	if err != nil {
		return nil, fieldErr("response_schema", fmt.Errorf("%w: %v", ErrSchema, err))
	}
	c := jsonschema.NewCompiler()
	c.UseLoader(noLoader{})
	if err := c.AddResource(schemaURL, doc); err != nil {
		return nil, fieldErr("response_schema", fmt.Errorf("%w: %v", ErrSchema, err))
	}
	sch, err := c.Compile(schemaURL)
	if err != nil {
		return nil, fieldErr("response_schema", fmt.Errorf("%w: %v", ErrSchema, err))
	}
	return sch, nil
}

// CheckPayload validates an approver's structured answer against the request's
// response_schema. An empty schema accepts anything; with a schema, a missing
// payload is an error.
func CheckPayload(schema, payload []byte) error {
	if len(bytes.TrimSpace(schema)) == 0 {
		return nil
	}
	sch, err := CompileSchema(schema)
	if err != nil {
		return err
	}
	if len(TrimJSONSpace(payload)) == 0 {
		return fieldErr("payload", fmt.Errorf("%w: the request asks for a structured answer", ErrMissingField))
	}
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(payload))
	if err != nil {
		return fieldErr("payload", fmt.Errorf("%w: %v", ErrMalformed, err))
	}
	if err := sch.Validate(inst); err != nil {
		var ve *jsonschema.ValidationError
		if errors.As(err, &ve) {
			return fieldErr("payload", fmt.Errorf("%w: %s", ErrSchema, truncate(ve.Error(), 400)))
		}
		return fieldErr("payload", fmt.Errorf("%w: %v", ErrSchema, err))
	}
	return nil
}

// checkSchemaShape enforces MaxSchemaSize, MaxSchemaDepth and MaxSchemaObjects
// in one pass over the bytes, before anything is parsed. The JSON syntax is
// checked later, by the parser.
func checkSchemaShape(schema []byte) error {
	if len(schema) > MaxSchemaSize {
		return fmt.Errorf("%w: %d bytes, limit %d", ErrSchema, len(schema), MaxSchemaSize)
	}
	depth, objects, inString := 0, 0, false
	for i := 0; i < len(schema); i++ {
		c := schema[i]
		if inString {
			switch c {
			case '\\':
				i++
			case '"':
				inString = false
			}
			continue
		}
		switch c {
		case '"':
			inString = true
		case '{', '[':
			if depth++; depth > MaxSchemaDepth {
				return fmt.Errorf("%w: nested deeper than %d at byte %d", ErrSchema, MaxSchemaDepth, i)
			}
			if c == '{' {
				if objects++; objects > MaxSchemaObjects {
					return fmt.Errorf("%w: more than %d objects", ErrSchema, MaxSchemaObjects)
				}
			}
		case '}', ']':
			depth--
		}
	}
	return nil
}
