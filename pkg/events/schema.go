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

// noLoader refuses every external reference, so a schema cannot make the broker
// read files or reach the network.
type noLoader struct{}

func (noLoader) Load(url string) (any, error) {
	return nil, fmt.Errorf("external references are not allowed (%s)", truncate(url, 80))
}

// CompileSchema compiles a request's response_schema (JSON Schema, draft 2020-12
// unless the schema says otherwise). External $refs are refused.
func CompileSchema(schema []byte) (*jsonschema.Schema, error) {
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
	if len(bytes.TrimSpace(payload)) == 0 {
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
