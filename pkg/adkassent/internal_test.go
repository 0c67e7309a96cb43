package adkassent

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"google.golang.org/adk/model"
	"google.golang.org/adk/session"
	"google.golang.org/adk/tool/toolconfirmation"
	"google.golang.org/genai"

	"github.com/assent-dev/assent/pkg/events"
)

func ids(callID string) string { return RequestID("file-manager", "files", "carol", "s-1", callID) }

// A confirmation call reads the same live (Go values, as ADK emits it) and
// read back from a stored session (JSON objects, numbers as float64), so a
// request asked again after a restart is the same request.
func TestConfirmationLiveAndStored(t *testing.T) {
	type payload struct {
		DaysApproved int `json:"days_approved"`
	}
	live := &genai.FunctionCall{ID: "adk-conf-1", Name: toolconfirmation.FunctionCallName, Args: map[string]any{
		"originalFunctionCall": &genai.FunctionCall{ID: "adk-call-1", Name: "request_days", Args: map[string]any{"days": 5, "ratio": 1.5, "who": "carol"}},
		"toolConfirmation":     toolconfirmation.ToolConfirmation{Hint: "Grant?", Payload: payload{DaysApproved: 0}},
	}}
	raw, err := json.Marshal(live)
	if err != nil {
		t.Fatal(err)
	}
	var stored genai.FunctionCall
	if err := json.Unmarshal(raw, &stored); err != nil {
		t.Fatal(err)
	}
	a, err := confirmationOf(live, ids)
	if err != nil {
		t.Fatal(err)
	}
	b, err := confirmationOf(&stored, ids)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(a, b) {
		t.Fatalf("live %+v\nstored %+v", a, b)
	}
	want := Confirmation{CallID: "adk-conf-1", RequestID: ids("adk-conf-1"), Tool: "request_days", Args: json.RawMessage(`{"days":5,"ratio":1.5,"who":"carol"}`),
		OriginalCallID: "adk-call-1", Hint: "Grant?", Payload: json.RawMessage(`{"days_approved":0}`)}
	if !reflect.DeepEqual(a, want) {
		t.Fatalf("got %+v\nwant %+v", a, want)
	}
}

func TestRequestID(t *testing.T) {
	id := RequestID("a", "app", "u", "s", "c")
	if id != RequestID("a", "app", "u", "s", "c") {
		t.Fatal("not deterministic")
	}
	if err := events.CheckToken("request id", id); err != nil {
		t.Fatal(err)
	}
	for _, other := range []string{
		RequestID("b", "app", "u", "s", "c"),
		RequestID("a", "ap", "pu", "s", "c"), // the parts do not run together
		RequestID("a", "app", "u", "s2", "c"),
		RequestID("a", "app", "u", "s", "c2"),
	} {
		if other == id {
			t.Errorf("%s is also the id of another confirmation", id)
		}
	}
}

func confirmationEvent(callID, originalID string) *session.Event {
	return &session.Event{Author: "assistant", LLMResponse: model.LLMResponse{Content: &genai.Content{Role: genai.RoleModel, Parts: []*genai.Part{{
		FunctionCall: &genai.FunctionCall{ID: callID, Name: toolconfirmation.FunctionCallName, Args: map[string]any{
			"originalFunctionCall": map[string]any{"id": originalID, "name": "delete_file", "args": map[string]any{"path": "/tmp/x"}},
			"toolConfirmation":     map[string]any{"hint": "Delete?"},
		}},
	}}}}}
}

func responseEvent(author, id, name string, response map[string]any) *session.Event {
	return &session.Event{Author: author, LLMResponse: model.LLMResponse{Content: &genai.Content{Role: genai.RoleUser, Parts: []*genai.Part{{
		FunctionResponse: &genai.FunctionResponse{ID: id, Name: name, Response: response},
	}}}}}
}

func TestWaiting(t *testing.T) {
	ours := map[string]any{"confirmed": true, answerKey: map[string]any{"outcome": "approved"}}
	theirs := map[string]any{"confirmed": true}
	ran := map[string]any{"deleted": "/tmp/x"}
	tests := []struct {
		name    string
		events  []*session.Event
		waiting []string // confirmation call ids
		errs    int
	}{
		{name: "unanswered", events: []*session.Event{confirmationEvent("conf-1", "call-1")}, waiting: []string{"conf-1"}},
		{name: "answered and run", events: []*session.Event{
			confirmationEvent("conf-1", "call-1"),
			responseEvent("user", "conf-1", toolconfirmation.FunctionCallName, ours),
			responseEvent("assistant", "call-1", "delete_file", ran),
		}},
		{name: "answered, stopped before the run", events: []*session.Event{
			responseEvent("assistant", "call-1", "delete_file", map[string]any{"error": "requires confirmation"}),
			confirmationEvent("conf-1", "call-1"),
			responseEvent("user", "conf-1", toolconfirmation.FunctionCallName, ours),
		}, waiting: []string{"conf-1"}},
		{name: "answered by someone else", events: []*session.Event{
			confirmationEvent("conf-1", "call-1"),
			responseEvent("user", "conf-1", toolconfirmation.FunctionCallName, theirs),
		}},
		{name: "two, one answered", events: []*session.Event{
			confirmationEvent("conf-1", "call-1"),
			responseEvent("user", "conf-1", toolconfirmation.FunctionCallName, ours),
			responseEvent("assistant", "call-1", "delete_file", ran),
			confirmationEvent("conf-2", "call-2"),
		}, waiting: []string{"conf-2"}},
		{name: "malformed", events: []*session.Event{{LLMResponse: model.LLMResponse{Content: &genai.Content{Parts: []*genai.Part{{
			FunctionCall: &genai.FunctionCall{ID: "conf-1", Name: toolconfirmation.FunctionCallName, Args: map[string]any{"toolConfirmation": map[string]any{}}},
		}}}}}}, errs: 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, errs := waiting(tc.events, ids)
			var calls []string
			for _, c := range got {
				calls = append(calls, c.CallID)
			}
			if !reflect.DeepEqual(calls, tc.waiting) {
				t.Errorf("waiting %v, want %v", calls, tc.waiting)
			}
			if len(errs) != tc.errs {
				t.Errorf("errors %v, want %d", errs, tc.errs)
			}
			for _, err := range errs {
				if !errors.Is(err, ErrMalformed) {
					t.Errorf("error %v is not ErrMalformed", err)
				}
			}
		})
	}
}

func TestPayloadFor(t *testing.T) {
	schema := json.RawMessage(`{"type":"object","properties":{"days_approved":{"type":"integer","minimum":1}},"required":["days_approved"]}`)
	tests := []struct {
		name            string
		schema, decided string
		proposed        string
		want            any
		err             error
	}{
		{name: "no schema, no payload", want: nil},
		{name: "no schema, the approver's", decided: `{"x":1}`, proposed: `{"x":0}`, want: map[string]any{"x": float64(1)}},
		{name: "no schema, the proposal", proposed: `{"x":0}`, want: map[string]any{"x": float64(0)}},
		{name: "fits", schema: string(schema), decided: `{"days_approved":3}`, want: map[string]any{"days_approved": float64(3)}},
		{name: "does not fit", schema: string(schema), decided: `{"days_approved":"three"}`, err: ErrPayload},
		{name: "below the minimum", schema: string(schema), decided: `{"days_approved":0}`, err: ErrPayload},
		{name: "the proposal does not fit", schema: string(schema), proposed: `{"days_approved":0}`, err: ErrPayload},
		{name: "the proposal fits", schema: string(schema), proposed: `{"days_approved":2}`, want: map[string]any{"days_approved": float64(2)}},
		{name: "missing", schema: string(schema), err: ErrPayload},
		{name: "the approver's wins", schema: string(schema), decided: `{"days_approved":4}`, proposed: `{"days_approved":0}`, want: map[string]any{"days_approved": float64(4)}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := payloadFor(json.RawMessage(tc.schema), json.RawMessage(tc.decided), json.RawMessage(tc.proposed))
			if !errors.Is(err, tc.err) {
				t.Fatalf("err %v, want %v", err, tc.err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("payload %#v, want %#v", got, tc.want)
			}
		})
	}
}

func TestSchemaOf(t *testing.T) {
	tests := []struct {
		name     string
		payload  string
		fits     []string
		doesNot  []string
		noSchema bool
	}{
		{name: "null", payload: `null`, noSchema: true},
		{name: "object", payload: `{"days_approved":0,"note":"","tags":["a"],"ok":false,"extra":null}`,
			fits:    []string{`{"days_approved":2.5,"note":"x","tags":[],"ok":true,"extra":{"a":1}}`, `{"days_approved":1,"note":"","tags":["b"],"ok":true,"extra":1,"more":1}`},
			doesNot: []string{`{"days_approved":"2","note":"","tags":[],"ok":true,"extra":1}`, `{"note":"","tags":[],"ok":true,"extra":1}`, `{"days_approved":1,"note":"","tags":[1],"ok":true,"extra":1}`, `[]`}},
		{name: "string", payload: `"yes"`, fits: []string{`"no"`}, doesNot: []string{`1`}},
		{name: "mixed items", payload: `[1,"a"]`, fits: []string{`["x",2,true]`, `[]`}, doesNot: []string{`{}`}},
		{name: "deep", payload: strings.Repeat(`{"a":`, 40) + `1` + strings.Repeat(`}`, 40), fits: []string{`{"a":{"a":{"a":{"a":{"a":{"a":{"a":{"b":1}}}}}}}}`}, doesNot: []string{`{"b":1}`}},
		{name: "over the limits", payload: bigObject(2000), fits: []string{`{}`}, doesNot: []string{`[]`}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			schema, err := SchemaOf(json.RawMessage(tc.payload))
			if err != nil {
				t.Fatal(err)
			}
			if tc.noSchema {
				if schema != nil {
					t.Fatalf("schema %s, want none", schema)
				}
				return
			}
			if err := events.CheckPayload(schema, json.RawMessage(tc.payload)); err != nil {
				t.Fatalf("the proposal does not fit its own schema %.200s: %v", schema, err)
			}
			for _, p := range tc.fits {
				if err := events.CheckPayload(schema, json.RawMessage(p)); err != nil {
					t.Errorf("%s does not fit %.200s: %v", p, schema, err)
				}
			}
			for _, p := range tc.doesNot {
				if err := events.CheckPayload(schema, json.RawMessage(p)); !errors.Is(err, events.ErrSchema) {
					t.Errorf("%s fits %.200s (err %v)", p, schema, err)
				}
			}
		})
	}
}

// bigObject is a JSON object with n keys, each holding an object.
func bigObject(n int) string {
	var b strings.Builder
	b.WriteString("{")
	for i := range n {
		if i > 0 {
			b.WriteString(",")
		}
		fmt.Fprintf(&b, `"k%d":{"v":%d}`, i, i)
	}
	b.WriteString("}")
	return b.String()
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		errs []error
	}{
		{name: "minimal", cfg: Config{Agent: "file-manager"}},
		{name: "no agent", cfg: Config{}, errs: []error{events.ErrBadToken}},
		{name: "every problem at once", cfg: Config{Agent: "file.manager", Timeout: -1, Labels: map[string]string{"": "x"},
			Schemas: map[string]json.RawMessage{"t": json.RawMessage(`{"type":5}`)}},
			errs: []error{events.ErrBadToken, events.ErrSchema}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate()
			if len(tc.errs) == 0 && err != nil {
				t.Fatalf("Validate: %v", err)
			}
			for _, want := range tc.errs {
				if !errors.Is(err, want) {
					t.Errorf("Validate: %v, want it to wrap %v", err, want)
				}
			}
			if tc.name == "every problem at once" && (!strings.Contains(err.Error(), "timeout") || !strings.Contains(err.Error(), "labels")) {
				t.Errorf("Validate: %v, want the timeout and the labels named too", err)
			}
		})
	}
}
