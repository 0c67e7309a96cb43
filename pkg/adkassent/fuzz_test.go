package adkassent

import (
	"encoding/json"
	"errors"
	"testing"

	"google.golang.org/adk/tool/toolconfirmation"
	"google.golang.org/genai"

	"github.com/assent-dev/assent/pkg/events"
)

// FuzzConfirmation reads adk_request_confirmation calls as a stored session
// holds them (their args come from the model): a call that reads is one
// Assent can be asked about, and a proposed payload fits the schema derived
// from it.
func FuzzConfirmation(f *testing.F) {
	for _, seed := range []string{
		`{"originalFunctionCall":{"id":"c1","name":"delete_file","args":{"path":"/tmp/x"}},"toolConfirmation":{"hint":"Delete?"}}`,
		`{"originalFunctionCall":{"id":"c1","name":"request_days","args":{"days":5}},"toolConfirmation":{"hint":"","payload":{"days_approved":0,"note":null,"tags":["a",1]}}}`,
		`{"originalFunctionCall":{"name":"t","args":{"n":12345678901234567890,"f":1.50,"e":1e3}},"toolConfirmation":{"payload":[{"a":true},"x"]}}`,
		`{"originalFunctionCall":{"name":"t"},"toolConfirmation":{"payload":"yes"}}`,
		`{"originalFunctionCall":"delete_file"}`,
		`{"toolConfirmation":{}}`,
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		var args map[string]any
		if json.Unmarshal([]byte(raw), &args) != nil {
			return
		}
		c, err := confirmationOf(&genai.FunctionCall{ID: "conf", Name: toolconfirmation.FunctionCallName, Args: args}, ids)
		if err != nil {
			return
		}
		if !events.ValidToken(c.RequestID) {
			t.Fatalf("request id %q is not a token", c.RequestID)
		}
		if _, err := events.ArgsDigest(c.Args); err != nil && !isJSONText(err) {
			t.Fatalf("args %s have no digest: %v", c.Args, err)
		}
		schema, err := SchemaOf(c.Payload)
		if err != nil {
			t.Fatalf("no schema for %s: %v", c.Payload, err)
		}
		if schema == nil {
			return
		}
		if err := events.CheckPayload(schema, c.Payload); err != nil && !isJSONText(err) {
			t.Fatalf("%s does not fit its own schema %s: %v", c.Payload, schema, err)
		}
	})
}

// isJSONText reports whether err is about text events refuses anywhere
// (invalid UTF-8, lone surrogates), which a request then cannot carry.
func isJSONText(err error) bool { return errors.Is(err, events.ErrBadText) }
