package events_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/textproto"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/assent-dev/assent/pkg/events"
)

const (
	testID      = "0193a5b2-7c1e-7d3a-9f1e-3c2b1a0f9e8d"
	testAnswer  = "0193a5b3-0000-7000-8000-000000000001"
	testDecided = "0193a5b3-0000-7000-8000-000000000002"
)

// checkErr fails t unless err matches want with errors.Is (want nil: err must be
// nil). Every non-nil error must also match ErrInvalid.
func checkErr(t *testing.T, err, want error) {
	t.Helper()
	if want == nil {
		if err != nil {
			t.Fatalf("unexpected error: %v", err)
		}
		return
	}
	if err == nil {
		t.Fatalf("got no error, want %v", want)
	}
	if !errors.Is(err, want) {
		t.Fatalf("error %q does not match %q", err, want)
	}
	if !errors.Is(err, events.ErrInvalid) {
		t.Fatalf("error %q does not match ErrInvalid", err)
	}
}

// checkField fails t unless err holds a *FieldError for field.
func checkField(t *testing.T, err error, field string) {
	t.Helper()
	if field == "" {
		return
	}
	var fe *events.FieldError
	if !errors.As(err, &fe) {
		t.Fatalf("error %q holds no *FieldError", err)
	}
	if fe.Field != field {
		t.Fatalf("error %q names field %q, want %q", err, fe.Field, field)
	}
}

func labels(n int) map[string]string {
	m := make(map[string]string, n)
	for i := range n {
		m[fmt.Sprintf("k%d", i)] = "v"
	}
	return m
}

func TestSentinelsMatchErrInvalid(t *testing.T) {
	all := []error{
		events.ErrTooLarge, events.ErrMalformed, events.ErrWrongType, events.ErrMissingField,
		events.ErrMissingTool, events.ErrBadToken, events.ErrArgsNotObject,
		events.ErrUnknownDecision, events.ErrBadSubject, events.ErrBadValue,
		events.ErrBadText, events.ErrSchema, events.ErrRequestMismatch,
	}
	for _, err := range all {
		if !errors.Is(err, events.ErrInvalid) {
			t.Errorf("%v does not match ErrInvalid", err)
		}
		if !errors.Is(fmt.Errorf("wrapped: %w", err), err) {
			t.Errorf("wrapped %v does not match itself", err)
		}
		if errors.Is(events.ErrInvalid, err) {
			t.Errorf("ErrInvalid matches %v; the relation must go one way only", err)
		}
	}
	if errors.Is(events.ErrMissingTool, events.ErrBadValue) {
		t.Error("ErrMissingTool matches ErrBadValue")
	}
	if errors.Is(events.ErrBadText, events.ErrBadValue) || errors.Is(events.ErrBadValue, events.ErrBadText) {
		t.Error("ErrBadText and ErrBadValue match each other")
	}
}

func TestRequestedValidate(t *testing.T) {
	ok := func() events.Requested {
		return events.Requested{
			Tool:    "delete_file",
			Args:    json.RawMessage(`{"path":"/srv/reports/q3.csv"}`),
			Agent:   "file-manager",
			Session: "s-42",
			User:    "carol",
			Hint:    "Delete the Q3 report?",
			Timeout: events.Duration(2 * time.Minute),
		}
	}
	tests := []struct {
		name    string
		edit    func(*events.Requested)
		wantErr error
		field   string
	}{
		{"valid", func(*events.Requested) {}, nil, ""},
		{"minimal", func(r *events.Requested) { *r = events.Requested{Tool: "t"} }, nil, ""},
		{"args null", func(r *events.Requested) { r.Args = json.RawMessage("null") }, nil, ""},
		{"args empty object", func(r *events.Requested) { r.Args = json.RawMessage(" {} ") }, nil, ""},
		{"missing tool", func(r *events.Requested) { r.Tool = "" }, events.ErrMissingTool, "tool"},
		{"tool too long", func(r *events.Requested) { r.Tool = strings.Repeat("t", events.MaxToolLength+1) }, events.ErrBadValue, "tool"},
		{"tool at limit", func(r *events.Requested) { r.Tool = strings.Repeat("t", events.MaxToolLength) }, nil, ""},
		{"args array", func(r *events.Requested) { r.Args = json.RawMessage(`["/srv"]`) }, events.ErrArgsNotObject, "args"},
		{"args string", func(r *events.Requested) { r.Args = json.RawMessage(`"/srv"`) }, events.ErrArgsNotObject, "args"},
		{"args number", func(r *events.Requested) { r.Args = json.RawMessage(`42`) }, events.ErrArgsNotObject, "args"},
		{"args bool", func(r *events.Requested) { r.Args = json.RawMessage(`true`) }, events.ErrArgsNotObject, "args"},
		{"args broken object", func(r *events.Requested) { r.Args = json.RawMessage(`{"path":`) }, events.ErrArgsNotObject, "args"},
		{"agent not a token", func(r *events.Requested) { r.Agent = "file.manager" }, events.ErrBadToken, "agent"},
		{"agent wildcard", func(r *events.Requested) { r.Agent = "*" }, events.ErrBadToken, "agent"},
		{"session too long", func(r *events.Requested) { r.Session = strings.Repeat("s", 257) }, events.ErrBadValue, "session"},
		{"user too long", func(r *events.Requested) { r.User = strings.Repeat("u", 257) }, events.ErrBadValue, "user"},
		{"call_id too long", func(r *events.Requested) { r.CallID = strings.Repeat("c", 257) }, events.ErrBadValue, "call_id"},
		{"hint at limit", func(r *events.Requested) { r.Hint = strings.Repeat("h", events.MaxTextLength) }, nil, ""},
		{"hint too long", func(r *events.Requested) { r.Hint = strings.Repeat("h", events.MaxTextLength+1) }, events.ErrBadValue, "hint"},
		{"schema object", func(r *events.Requested) { r.ResponseSchema = json.RawMessage(`{"type":"object"}`) }, nil, ""},
		{"schema not object", func(r *events.Requested) { r.ResponseSchema = json.RawMessage(`"object"`) }, events.ErrBadValue, "response_schema"},
		{"schema does not compile", func(r *events.Requested) { r.ResponseSchema = json.RawMessage(`{"type":5}`) }, events.ErrSchema, "response_schema"},
		{"negative timeout", func(r *events.Requested) { r.Timeout = events.Duration(-time.Second) }, events.ErrBadValue, "timeout"},
		{"timeout at limit", func(r *events.Requested) { r.Timeout = events.Duration(events.MaxTimeout) }, nil, ""},
		{"huge timeout", func(r *events.Requested) { r.Timeout = events.Duration(events.MaxTimeout + time.Second) }, events.ErrBadValue, "timeout"},
		{"labels ok", func(r *events.Requested) { r.Labels = labels(events.MaxLabels) }, nil, ""},
		{"too many labels", func(r *events.Requested) { r.Labels = labels(events.MaxLabels + 1) }, events.ErrBadValue, "labels"},
		{"empty label key", func(r *events.Requested) { r.Labels = map[string]string{"": "v"} }, events.ErrBadValue, "labels"},
		{"long label key", func(r *events.Requested) {
			r.Labels = map[string]string{strings.Repeat("k", events.MaxLabelLength+1): "v"}
		}, events.ErrBadValue, "labels"},
		{"long label value", func(r *events.Requested) {
			r.Labels = map[string]string{"k": strings.Repeat("v", events.MaxLabelLength+1)}
		}, events.ErrBadValue, "labels"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := ok()
			tt.edit(&r)
			err := r.Validate()
			checkErr(t, err, tt.wantErr)
			checkField(t, err, tt.field)
		})
	}
}

func TestRequestedValidateReportsEveryProblem(t *testing.T) {
	r := events.Requested{Args: json.RawMessage(`[]`), Agent: "a b", Timeout: -1}
	err := r.Validate()
	for _, want := range []error{events.ErrMissingTool, events.ErrArgsNotObject, events.ErrBadToken, events.ErrBadValue} {
		if !errors.Is(err, want) {
			t.Errorf("error %q does not match %q", err, want)
		}
	}
}

func TestRespondedValidate(t *testing.T) {
	tests := []struct {
		name    string
		r       events.Responded
		wantErr error
		field   string
	}{
		{"approve", events.Responded{Decision: events.Approve}, nil, ""},
		{"deny with reason", events.Responded{Decision: events.Deny, Reason: "no"}, nil, ""},
		{"approve with edited args", events.Responded{Decision: events.Approve, Args: json.RawMessage(`{"path":"/tmp/x"}`)}, nil, ""},
		{"deny with null args", events.Responded{Decision: events.Deny, Args: json.RawMessage(`null`)}, nil, ""},
		{"full", events.Responded{
			Decision: events.Approve, Reason: "ok", Payload: json.RawMessage(`{"n":1}`),
			Remember: &events.Remember{Scope: events.ScopeSession, TTL: events.Duration(time.Hour)}, Channel: "cli",
		}, nil, ""},
		{"missing decision", events.Responded{}, events.ErrMissingField, "decision"},
		{"unknown decision", events.Responded{Decision: "maybe"}, events.ErrUnknownDecision, "decision"},
		{"decision wrong case", events.Responded{Decision: "Approve"}, events.ErrUnknownDecision, "decision"},
		{"reason too long", events.Responded{Decision: events.Deny, Reason: strings.Repeat("r", events.MaxTextLength+1)}, events.ErrBadValue, "reason"},
		{"args array", events.Responded{Decision: events.Approve, Args: json.RawMessage(`[1]`)}, events.ErrArgsNotObject, "args"},
		{"args string", events.Responded{Decision: events.Approve, Args: json.RawMessage(`"x"`)}, events.ErrArgsNotObject, "args"},
		{"args number", events.Responded{Decision: events.Approve, Args: json.RawMessage(`1`)}, events.ErrArgsNotObject, "args"},
		{"edited args on deny", events.Responded{Decision: events.Deny, Args: json.RawMessage(`{"path":"/tmp/x"}`)}, events.ErrBadValue, "args"},
		{"payload not JSON", events.Responded{Decision: events.Approve, Payload: json.RawMessage(`{`)}, events.ErrBadValue, "payload"},
		{"bad remember scope", events.Responded{Decision: events.Approve, Remember: &events.Remember{Scope: "forever"}}, events.ErrBadValue, "remember.scope"},
		{"empty remember scope", events.Responded{Decision: events.Approve, Remember: &events.Remember{}}, events.ErrBadValue, "remember.scope"},
		{"negative remember ttl", events.Responded{Decision: events.Approve, Remember: &events.Remember{Scope: events.ScopeAgent, TTL: -1}}, events.ErrBadValue, "remember.ttl"},
		{"channel not a token", events.Responded{Decision: events.Approve, Channel: "web ui"}, events.ErrBadToken, "channel"},
	}
	for _, scope := range []string{events.ScopeCall, events.ScopeSession, events.ScopeAgent, events.ScopeUser} {
		tests = append(tests, struct {
			name    string
			r       events.Responded
			wantErr error
			field   string
		}{"scope " + scope, events.Responded{Decision: events.Deny, Remember: &events.Remember{Scope: scope}}, nil, ""})
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.r.Validate()
			checkErr(t, err, tt.wantErr)
			checkField(t, err, tt.field)
		})
	}
}

func TestCancelValidate(t *testing.T) {
	tests := []struct {
		name    string
		c       events.Cancel
		wantErr error
		field   string
	}{
		{"empty", events.Cancel{}, nil, ""},
		{"reason", events.Cancel{Reason: "user stopped the run"}, nil, ""},
		{"reason at limit", events.Cancel{Reason: strings.Repeat("r", events.MaxTextLength)}, nil, ""},
		{"reason too long", events.Cancel{Reason: strings.Repeat("r", events.MaxTextLength+1)}, events.ErrBadValue, "reason"},
		{"reason too long in multi-byte characters", events.Cancel{Reason: strings.Repeat("é", events.MaxTextLength/2+1)}, events.ErrBadValue, "reason"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.c.Validate()
			checkErr(t, err, tt.wantErr)
			checkField(t, err, tt.field)
		})
	}
}

// TestRequestedValidateSchema: a response schema that cannot be compiled is
// refused with the request, not with every answer to it.
func TestRequestedValidateSchema(t *testing.T) {
	tests := []struct {
		name    string
		schema  string
		wantErr error
	}{
		{"absent", ``, nil},
		{"null", `null`, nil},
		{"empty", `{}`, nil},
		{"object", `{"type":"object","properties":{"size_gb":{"type":"integer","minimum":1}},"required":["size_gb"]}`, nil},
		{"local ref", `{"$defs":{"n":{"type":"integer"}},"$ref":"#/$defs/n"}`, nil},
		{"draft 7", `{"$schema":"http://json-schema.org/draft-07/schema#","type":"object","definitions":{"a":{}}}`, nil},

		{"type not a string", `{"type":5}`, events.ErrSchema},
		{"unknown type name", `{"type":"whole-number"}`, events.ErrSchema},
		{"minimum not a number", `{"type":"integer","minimum":"one"}`, events.ErrSchema},
		{"nested bad keyword", `{"properties":{"n":{"required":"yes"}}}`, events.ErrSchema},
		{"bad pattern", `{"type":"string","pattern":"("}`, events.ErrSchema},
		{"missing local ref", `{"$ref":"#/$defs/missing"}`, events.ErrSchema},
		{"external ref", `{"$ref":"https://example.com/s.json"}`, events.ErrSchema},
		{"relative ref", `{"$ref":"other.json"}`, events.ErrSchema},
		{"file ref", `{"properties":{"a":{"$ref":"file:///etc/passwd"}}}`, events.ErrSchema},
		{"unknown meta-schema", `{"$schema":"https://example.com/meta","type":"object"}`, events.ErrSchema},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := events.Requested{Tool: "ask", ResponseSchema: json.RawMessage(tt.schema)}
			err := r.Validate()
			checkErr(t, err, tt.wantErr)
			if err != nil {
				checkField(t, err, "response_schema")
			}

			checkSchemaOnWire(t, "response_schema", tt.schema, r, tt.wantErr)

			// A schema Validate accepts is one CheckPayload can use.
			if err == nil && len(tt.schema) > 0 && tt.schema != "null" {
				if _, err := events.CompileSchema([]byte(tt.schema)); err != nil {
					t.Fatalf("CompileSchema: %v", err)
				}
			}
		})
	}
}

// TestRequestedValidateInputSchema: an input schema is context for
// approvers and checked by the broker (CheckArgs), not compiled when a
// request is validated: any JSON object within MaxInputSchemaSize.
func TestRequestedValidateInputSchema(t *testing.T) {
	big := `{"description":"` + strings.Repeat("d", events.MaxInputSchemaSize) + `"}`
	atLimit := `{"description":"` + strings.Repeat("d", events.MaxInputSchemaSize-len(`{"description":""}`)) + `"}`
	tests := []struct {
		name    string
		schema  string
		wantErr error
	}{
		{"absent", ``, nil},
		{"null", `null`, nil},
		{"empty object", `{}`, nil},
		{"mcp input schema", `{"type":"object","properties":{"path":{"type":"string","description":"the file"}},"required":["path"]}`, nil},
		{"not a schema that compiles", `{"type":5}`, nil},
		{"at limit", atLimit, nil},
		{"array", `[{"type":"object"}]`, events.ErrBadValue},
		{"string", `"object"`, events.ErrBadValue},
		{"true", `true`, events.ErrBadValue},
		{"too large", big, events.ErrBadValue},
		{"lone surrogate", `{"description":"\ud800"}`, events.ErrBadText},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := events.Requested{Tool: "ask", InputSchema: json.RawMessage(tt.schema)}
			err := r.Validate()
			checkErr(t, err, tt.wantErr)
			if err != nil {
				checkField(t, err, "input_schema")
			}
			if errors.Is(tt.wantErr, events.ErrBadValue) && !strings.Contains(err.Error(), "object") && !strings.Contains(err.Error(), fmt.Sprint(events.MaxInputSchemaSize)) {
				t.Errorf("error %q says neither what is wanted nor the limit", err)
			}

			got := checkSchemaOnWire(t, "input_schema", tt.schema, r, tt.wantErr)
			if err == nil && tt.schema != "" && tt.schema != "null" && string(got.InputSchema) != tt.schema {
				t.Errorf("decoded input_schema %.80s, want %.80s", got.InputSchema, tt.schema)
			}
		})
	}
}

// TestInputSchemaWithinEventSize: the input schema counts toward the event
// size limit like any other field.
func TestInputSchemaWithinEventSize(t *testing.T) {
	schema := `{"description":"` + strings.Repeat("d", events.MaxInputSchemaSize-100) + `"}`
	args := `{"blob":"` + strings.Repeat("a", events.DefaultMaxEventSize-len(schema)) + `"}`
	r := events.Requested{Tool: "ask", Args: json.RawMessage(args), InputSchema: json.RawMessage(schema)}
	if err := r.Validate(); err != nil {
		t.Fatalf("each part alone is valid: %v", err)
	}
	e, err := events.New(events.TypeRequested, testID, "agent/a", r)
	if err != nil {
		t.Fatal(err)
	}
	h, body, err := events.Encode(&e)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := events.Decode(h, body); !errors.Is(err, events.ErrTooLarge) {
		t.Errorf("an event of %d bytes: %v, want ErrTooLarge", len(body), err)
	}
}

// checkSchemaOnWire checks that a request with schema as its field (absent
// when "") decodes with wantErr, and that r in a pending event validates with
// it too; it returns the decoded request.
func checkSchemaOnWire(t *testing.T, field, schema string, r events.Requested, wantErr error) events.Requested {
	t.Helper()
	data := `{"tool":"ask"}`
	if schema != "" {
		data = `{"tool":"ask","` + field + `":` + schema + `}`
	}
	e, err := events.Decode(structuredHeader, structured(testID, events.TypeRequested, data))
	if err != nil {
		t.Fatal(err)
	}
	got, err := events.DecodeRequested(&e)
	checkErr(t, err, wantErr)
	p := events.Pending{RequestID: testID, Request: r}
	checkErr(t, p.Validate(), wantErr)
	return got
}

// TestSchemaLimits: compiling costs more than linear time in nesting and
// subschemas, so a response schema is bounded before it is compiled.
func TestSchemaLimits(t *testing.T) {
	nested := func(depth int) string { // depth levels of objects
		return strings.Repeat(`{"items":`, depth-1) + `{}` + strings.Repeat(`}`, depth-1)
	}
	objects := func(n int) string { // n objects
		return `{"allOf":[` + strings.TrimSuffix(strings.Repeat(`{},`, n-1), ",") + `]}`
	}
	sized := func(n int) string { // n bytes
		const pre, post = `{"description":"`, `"}`
		return pre + strings.Repeat("d", n-len(pre)-len(post)) + post
	}
	tests := []struct {
		name    string
		schema  string
		wantErr error
		msg     string
	}{
		{"depth at limit", nested(events.MaxSchemaDepth), nil, ""},
		{"depth over limit", nested(events.MaxSchemaDepth + 1), events.ErrSchema, fmt.Sprintf("nested deeper than %d", events.MaxSchemaDepth)},
		{"arrays count as depth", `{"allOf":` + strings.Repeat(`[`, events.MaxSchemaDepth) + strings.Repeat(`]`, events.MaxSchemaDepth) + `}`, events.ErrSchema, "nested deeper"},
		{"very deep", nested(5000), events.ErrSchema, "nested deeper"},
		{"objects at limit", objects(events.MaxSchemaObjects), nil, ""},
		{"objects over limit", objects(events.MaxSchemaObjects + 1), events.ErrSchema, fmt.Sprintf("more than %d objects", events.MaxSchemaObjects)},
		{"objects in values count", `{"enum":[` + strings.TrimSuffix(strings.Repeat(`{},`, events.MaxSchemaObjects), ",") + `]}`, events.ErrSchema, "objects"},
		{"size at limit", sized(events.MaxSchemaSize), nil, ""},
		{"size over limit", sized(events.MaxSchemaSize + 1), events.ErrSchema, fmt.Sprintf("%d bytes, limit %d", events.MaxSchemaSize+1, events.MaxSchemaSize)},
		{"brackets in strings do not count", `{"description":"` + strings.Repeat(`{[\"`, events.MaxSchemaObjects+1) + `","title":"}]"}`, nil, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := events.Requested{Tool: "ask", ResponseSchema: json.RawMessage(tt.schema)}
			err := r.Validate()
			checkErr(t, err, tt.wantErr)
			if err != nil {
				checkField(t, err, "response_schema")
				if !strings.Contains(err.Error(), tt.msg) {
					t.Fatalf("error %q does not say %q", err, tt.msg)
				}
			}
			// Answers are checked against the same schema, within the same limits.
			checkErr(t, events.CheckPayload([]byte(tt.schema), []byte(`{}`)), tt.wantErr)
		})
	}
}

func BenchmarkRequestedValidate(b *testing.B) {
	for _, bm := range []struct {
		name   string
		schema string
	}{
		{"no schema", ``},
		{"small schema", `{"type":"object","properties":{"size_gb":{"type":"integer","minimum":1},"note":{"type":"string","maxLength":200}},"required":["size_gb"]}`},
	} {
		b.Run(bm.name, func(b *testing.B) {
			r := wantRequested()
			r.Labels = map[string]string{"team": "finance", "env": "prod"}
			if bm.schema != "" {
				r.ResponseSchema = json.RawMessage(bm.schema)
			}
			b.ReportAllocs()
			for b.Loop() {
				if err := r.Validate(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func TestDecidedValidate(t *testing.T) {
	at := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	tests := []struct {
		name    string
		d       events.Decided
		wantErr error
		field   string
	}{
		{"approved", events.Decided{RequestID: testID, Outcome: events.Approved, Args: json.RawMessage(`{}`), DecidedAt: at}, nil, ""},
		{"expired no args", events.Decided{RequestID: testID, Outcome: events.Expired, DecidedAt: at}, nil, ""},
		{"missing request id", events.Decided{Outcome: events.Denied, DecidedAt: at}, events.ErrBadToken, "request_id"},
		{"request id with dot", events.Decided{RequestID: "a.b", Outcome: events.Denied, DecidedAt: at}, events.ErrBadToken, "request_id"},
		{"unknown outcome", events.Decided{RequestID: testID, Outcome: "approve", DecidedAt: at}, events.ErrBadValue, "outcome"},
		{"empty outcome", events.Decided{RequestID: testID, DecidedAt: at}, events.ErrBadValue, "outcome"},
		{"args array", events.Decided{RequestID: testID, Outcome: events.Approved, Args: json.RawMessage(`[]`), DecidedAt: at}, events.ErrArgsNotObject, "args"},
		{"missing decided_at", events.Decided{RequestID: testID, Outcome: events.Cancelled}, events.ErrMissingField, "decided_at"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.d.Validate()
			checkErr(t, err, tt.wantErr)
			checkField(t, err, tt.field)
		})
	}
}

func TestOutcomeValid(t *testing.T) {
	for _, o := range []events.Outcome{events.Approved, events.Denied, events.Expired, events.Cancelled} {
		if !o.Valid() {
			t.Errorf("%q not valid", o)
		}
	}
	for _, o := range []events.Outcome{"", "approve", "APPROVED", "pending"} {
		if o.Valid() {
			t.Errorf("%q valid", o)
		}
	}
	if !(events.Decided{Outcome: events.Approved}).Approved() || (events.Decided{Outcome: events.Denied}).Approved() {
		t.Error("Decided.Approved is wrong")
	}
}

func TestPendingValidate(t *testing.T) {
	req := events.Requested{Tool: "delete_file", Args: json.RawMessage(`{}`)}
	tests := []struct {
		name    string
		p       events.Pending
		wantErr error
	}{
		{"valid", events.Pending{RequestID: testID, Request: req, Deadline: time.Now()}, nil},
		{"missing request id", events.Pending{Request: req}, events.ErrBadToken},
		{"request id with wildcard", events.Pending{RequestID: ">", Request: req}, events.ErrBadToken},
		{"request missing tool", events.Pending{RequestID: testID, Request: events.Requested{}}, events.ErrMissingTool},
		{"request args array", events.Pending{RequestID: testID, Request: events.Requested{Tool: "t", Args: json.RawMessage(`[]`)}}, events.ErrArgsNotObject},
		{"request bad timeout", events.Pending{RequestID: testID, Request: events.Requested{Tool: "t", Timeout: -1}}, events.ErrBadValue},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			checkErr(t, tt.p.Validate(), tt.wantErr)
		})
	}
}

func TestEscalatedValidate(t *testing.T) {
	tests := []struct {
		name    string
		e       events.Escalated
		wantErr error
	}{
		{"valid", events.Escalated{RequestID: testID, Level: 1}, nil},
		{"missing request id", events.Escalated{Level: 1}, events.ErrBadToken},
		{"negative level", events.Escalated{RequestID: testID, Level: -1}, events.ErrBadValue},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			checkErr(t, tt.e.Validate(), tt.wantErr)
		})
	}
}

func TestValidToken(t *testing.T) {
	tests := []struct {
		s    string
		want bool
	}{
		{"a", true},
		{"file-manager", true},
		{"A_Z-09", true},
		{testID, true},
		{strings.Repeat("x", events.MaxTokenLength), true},
		{strings.Repeat("x", events.MaxTokenLength+1), false},
		{"", false},
		{"a.b", false},
		{"*", false},
		{">", false},
		{"a b", false},
		{"a\tb", false},
		{"tab\n", false},
		{"é", false},
		{"a/b", false},
	}
	for _, tt := range tests {
		if got := events.ValidToken(tt.s); got != tt.want {
			t.Errorf("ValidToken(%q) = %v, want %v", tt.s, got, tt.want)
		}
		err := events.CheckToken("what", tt.s)
		if tt.want {
			checkErr(t, err, nil)
		} else {
			checkErr(t, err, events.ErrBadToken)
			checkField(t, err, "what")
		}
	}
}

func TestSubjectBuilders(t *testing.T) {
	long := strings.Repeat("x", events.MaxTokenLength+1)
	build := map[string]func(a, b string) (string, error){
		"request":      func(a, _ string) (string, error) { return events.RequestSubject(a) },
		"pending":      func(a, _ string) (string, error) { return events.PendingSubject(a) },
		"response":     events.ResponseSubject,
		"cancel":       func(a, _ string) (string, error) { return events.CancelSubject(a) },
		"agent cancel": events.AgentCancelSubject,
		"decision":     func(a, _ string) (string, error) { return events.DecisionSubject(a) },
	}
	tests := []struct {
		kind, a, b string
		want       string
		wantErr    error
	}{
		{"request", "file-manager", "", "assent.request.file-manager", nil},
		{"pending", "file-manager", "", "assent.pending.file-manager", nil},
		{"response", "alice", testID, "assent.response.alice." + testID, nil},
		{"cancel", testID, "", "assent.cancel." + testID, nil},
		{"agent cancel", "coder", testID, "assent.cancel.coder." + testID, nil},
		{"decision", testID, "", "assent.decision." + testID, nil},
		{"request", "", "", "", events.ErrBadToken},
		{"request", "a.b", "", "", events.ErrBadToken},
		{"request", "*", "", "", events.ErrBadToken},
		{"request", ">", "", "", events.ErrBadToken},
		{"request", "a b", "", "", events.ErrBadToken},
		{"request", long, "", "", events.ErrBadToken},
		{"pending", "a.>", "", "", events.ErrBadToken},
		{"response", "", testID, "", events.ErrBadToken},
		{"response", "alice", "", "", events.ErrBadToken},
		{"response", "alice", "a.b", "", events.ErrBadToken},
		{"response", "al*ce", testID, "", events.ErrBadToken},
		{"cancel", "", "", "", events.ErrBadToken},
		{"cancel", long, "", "", events.ErrBadToken},
		{"agent cancel", "a.b", testID, "", events.ErrBadToken},
		{"agent cancel", "coder", "", "", events.ErrBadToken},
		{"decision", "id with space", "", "", events.ErrBadToken},
	}
	for _, tt := range tests {
		t.Run(tt.kind+"/"+tt.a+"/"+tt.b, func(t *testing.T) {
			got, err := build[tt.kind](tt.a, tt.b)
			checkErr(t, err, tt.wantErr)
			if got != tt.want {
				t.Fatalf("got %q, want %q", got, tt.want)
			}
			if err != nil {
				return
			}
			if !strings.HasPrefix(got, events.Prefix) {
				t.Fatalf("%q is not under %q", got, events.Prefix)
			}
			if _, err := events.ParseSubject(got); err != nil {
				t.Fatalf("ParseSubject(%q): %v", got, err)
			}
		})
	}
}

func TestParseSubject(t *testing.T) {
	long := strings.Repeat("x", events.MaxTokenLength+1)
	max := strings.Repeat("x", events.MaxTokenLength)
	tests := []struct {
		in      string
		want    events.Subject
		wantErr error
	}{
		{"assent.request.file-manager", events.Subject{Kind: events.KindRequest, Agent: "file-manager"}, nil},
		{"assent.pending.file-manager", events.Subject{Kind: events.KindPending, Agent: "file-manager"}, nil},
		{"assent.response.alice." + testID, events.Subject{Kind: events.KindResponse, Principal: "alice", RequestID: testID}, nil},
		{"assent.cancel." + testID, events.Subject{Kind: events.KindCancel, RequestID: testID}, nil},
		{"assent.cancel.coder." + testID, events.Subject{Kind: events.KindCancel, Agent: "coder", RequestID: testID}, nil},
		{"assent.decision." + testID, events.Subject{Kind: events.KindDecision, RequestID: testID}, nil},
		{"assent.request." + max, events.Subject{Kind: events.KindRequest, Agent: max}, nil},

		{"", events.Subject{}, events.ErrBadSubject},
		{"assent", events.Subject{}, events.ErrBadSubject},
		{"assent.", events.Subject{}, events.ErrBadSubject},
		{"other.request.a", events.Subject{}, events.ErrBadSubject},
		{"ASSENT.request.a", events.Subject{}, events.ErrBadSubject},
		{"assent.unknown.a", events.Subject{}, events.ErrBadSubject},
		{"assent.Request.a", events.Subject{}, events.ErrBadSubject},
		{"assent.>", events.Subject{}, events.ErrBadSubject},
		{"assent.*.a", events.Subject{}, events.ErrBadSubject},
		{"assent.request", events.Subject{}, events.ErrBadSubject},
		{"assent.request.a.b", events.Subject{}, events.ErrBadSubject},
		{"assent.pending.a.b", events.Subject{}, events.ErrBadSubject},
		{"assent.response.alice", events.Subject{}, events.ErrBadSubject},
		{"assent.response.alice.id.more", events.Subject{}, events.ErrBadSubject},
		{"assent.cancel", events.Subject{}, events.ErrBadSubject},
		{"assent.cancel.a.b.c", events.Subject{}, events.ErrBadSubject},
		{"assent.cancel.a*.b", events.Subject{}, events.ErrBadToken},
		{"assent.decision.a.b", events.Subject{}, events.ErrBadSubject},
		{"assent.decision." + testID + ".", events.Subject{}, events.ErrBadSubject},

		{"assent.request.", events.Subject{}, events.ErrBadToken},
		{"assent.request.*", events.Subject{}, events.ErrBadToken},
		{"assent.request.>", events.Subject{}, events.ErrBadToken},
		{"assent.request.a b", events.Subject{}, events.ErrBadToken},
		{"assent.request." + long, events.Subject{}, events.ErrBadToken},
		{"assent.pending.", events.Subject{}, events.ErrBadToken},
		{"assent.response..id", events.Subject{}, events.ErrBadToken},
		{"assent.response.alice.", events.Subject{}, events.ErrBadToken},
		{"assent.response.*.id", events.Subject{}, events.ErrBadToken},
		{"assent.response.alice.>", events.Subject{}, events.ErrBadToken},
		{"assent.response.alice." + long, events.Subject{}, events.ErrBadToken},
		{"assent.cancel.", events.Subject{}, events.ErrBadToken},
		{"assent.cancel.a%2Eb", events.Subject{}, events.ErrBadToken},
		{"assent.decision. ", events.Subject{}, events.ErrBadToken},
		{"assent.decision." + long, events.Subject{}, events.ErrBadToken},
	}
	for _, tt := range tests {
		name := tt.in
		if len(name) > 60 {
			name = name[:60]
		}
		t.Run(name, func(t *testing.T) {
			got, err := events.ParseSubject(tt.in)
			checkErr(t, err, tt.wantErr)
			if err != nil {
				return
			}
			if got != tt.want {
				t.Fatalf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestKindString(t *testing.T) {
	tests := []struct {
		k    events.Kind
		want string
	}{
		{events.KindUnknown, "unknown"},
		{events.KindRequest, "request"},
		{events.KindPending, "pending"},
		{events.KindResponse, "response"},
		{events.KindCancel, "cancel"},
		{events.KindDecision, "decision"},
		{events.Kind(99), "unknown"},
	}
	for _, tt := range tests {
		if got := tt.k.String(); got != tt.want {
			t.Errorf("Kind(%d).String() = %q, want %q", int(tt.k), got, tt.want)
		}
	}
}

func TestNewID(t *testing.T) {
	a, b := events.NewID(), events.NewID()
	if a == b {
		t.Fatalf("two ids are equal: %s", a)
	}
	for _, id := range []string{a, b} {
		if !events.ValidToken(id) {
			t.Fatalf("id %q is not a subject token", id)
		}
		if len(id) != 36 || id[14] != '7' {
			t.Fatalf("id %q is not a UUIDv7", id)
		}
	}
}

func TestNew(t *testing.T) {
	req := events.Requested{Tool: "delete_file", Args: json.RawMessage(`{"path":"/srv/reports/q3.csv"}`)}
	tests := []struct {
		name    string
		id      string
		source  string
		wantErr error
	}{
		{"given id", testID, "agent/file-manager", nil},
		{"new id", "", "agent/file-manager", nil},
		{"id with dot", "a.b", "agent/file-manager", events.ErrBadToken},
		{"id with space", "a b", "agent/file-manager", events.ErrBadToken},
		{"missing source", testID, "", events.ErrMalformed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e, err := events.New(events.TypeRequested, tt.id, tt.source, req)
			checkErr(t, err, tt.wantErr)
			if err != nil {
				return
			}
			if tt.id != "" && e.ID() != tt.id {
				t.Errorf("id = %q, want %q", e.ID(), tt.id)
			}
			if !events.ValidToken(e.ID()) {
				t.Errorf("id %q is not a subject token", e.ID())
			}
			if e.Type() != events.TypeRequested || e.Source() != tt.source || e.SpecVersion() != "1.0" {
				t.Errorf("envelope = %s %s %s", e.SpecVersion(), e.Type(), e.Source())
			}
			if e.DataContentType() != events.ContentTypeJSON {
				t.Errorf("datacontenttype = %q", e.DataContentType())
			}
			if e.Time().IsZero() {
				t.Error("time not set")
			}
			got, err := events.DecodeRequested(&e)
			if err != nil {
				t.Fatal(err)
			}
			if got.Tool != req.Tool || !bytes.Equal(got.Args, req.Args) {
				t.Errorf("data = %+v", got)
			}
		})
	}
}

// TestEncodeNoHTMLEscaping: what Assent writes keeps <, > and & as they are,
// so an event is about as large as what it carries.
func TestEncodeNoHTMLEscaping(t *testing.T) {
	tests := []struct {
		name string
		args string
	}{
		{"html", `{"q":"<a&b>"}`},
		{"many", `{"q":"` + strings.Repeat("<", 250_000) + `"}`},
		{"escaped on input", `{"q":"\u003ca\u0026b\u003e"}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := events.Requested{Tool: "search", Args: json.RawMessage(tt.args), Hint: "<b>Search</b> & more"}
			e, err := events.New(events.TypeRequested, testID, "agent/a&b", req)
			if err != nil {
				t.Fatal(err)
			}
			// Escapes are as many as the input had: none added.
			escapes := strings.Count(tt.args, `\u00`)
			if n := bytes.Count(e.Data(), []byte(`\u00`)); n != escapes {
				t.Fatalf("data has %d escapes, want %d: %.200s", n, escapes, e.Data())
			}
			h, body, err := events.Encode(&e)
			if err != nil {
				t.Fatal(err)
			}
			if n := bytes.Count(body, []byte(`\u00`)); n != escapes || bytes.Contains(body, []byte(`data_base64`)) {
				t.Fatalf("body has %d escapes, want %d: %.300s", n, escapes, body)
			}
			if !bytes.Contains(body, []byte(`"hint":"<b>Search</b> & more"`)) || !bytes.Contains(body, []byte(`"source":"agent/a&b"`)) {
				t.Fatalf("body = %.300s", body)
			}
			if limit := len(tt.args) + 512; len(body) > limit {
				t.Fatalf("body is %d bytes for %d bytes of args (limit %d)", len(body), len(tt.args), limit)
			}
			got, err := events.Decode(h, body)
			if err != nil {
				t.Fatal(err)
			}
			sameEnvelope(t, &got, &e)
			r, err := events.DecodeRequested(&got)
			if err != nil {
				t.Fatal(err)
			}
			if !sameJSON(r.Args, []byte(tt.args)) || r.Hint != req.Hint {
				t.Fatalf("data = %.200s", got.Data())
			}
		})
	}
}

// TestEncodeCompact: Encode writes one compact JSON object, whatever white
// space the data it carries was received with.
func TestEncodeCompact(t *testing.T) {
	data := "{ \"tool\" : \"t\",\n  \"args\": {\"q\": \"<x>\", \"n\": [1, 2.50]} }"
	e, err := events.Decode(binaryHeader(testID, events.TypeRequested), []byte(data))
	if err != nil {
		t.Fatal(err)
	}
	_, body, err := events.Encode(&e)
	if err != nil {
		t.Fatal(err)
	}
	var compact bytes.Buffer
	if err := json.Compact(&compact, body); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(body, compact.Bytes()) {
		t.Fatalf("body not compact: %s", body)
	}
	if !bytes.Contains(body, []byte(`"data":{"tool":"t","args":{"q":"<x>","n":[1,2.50]}}`)) {
		t.Fatalf("body = %s", body)
	}

	// An event without data has none after encoding either.
	e, err = events.New(events.TypeCancel, testID, "agent/a", nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(e.Data()) != 0 {
		t.Fatalf("data = %q", e.Data())
	}
	_, body, err = events.Encode(&e)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(body, []byte(`"data":`)) || bytes.Contains(body, []byte(`"data_base64":`)) {
		t.Fatalf("body = %s", body)
	}
	if _, err := events.Decode(nil, body); err != nil {
		t.Fatal(err)
	}
}

// fixtures: what a peer written in any language would put on the wire.

func structured(id, typ, data string) []byte {
	return []byte(`{"specversion":"1.0","id":"` + id + `","type":"` + typ +
		`","source":"test/fixture","datacontenttype":"application/json","data":` + data + `}`)
}

var structuredHeader = events.Header{"Content-Type": {events.ContentTypeStructured}}

func binaryHeader(id, typ string) events.Header {
	return events.Header{
		"ce-specversion": {"1.0"},
		"ce-id":          {id},
		"ce-type":        {typ},
		"ce-source":      {"test%2Ffixture"},
		"Content-Type":   {events.ContentTypeJSON},
	}
}

const (
	requestedData = `{"tool":"delete_file","args":{"path":"/srv/reports/q3.csv"},"agent":"file-manager",` +
		`"session":"s-42","user":"carol","hint":"Delete the Q3 report?","timeout":"2m"}`
	respondedData = `{"decision":"approve","args":{"path":"/srv/reports/q3-draft.csv"},"reason":"only the draft","channel":"cli"}`
	decidedData   = `{"request_id":"` + testID + `","outcome":"approved","args":{"path":"/srv/reports/q3-draft.csv"},` +
		`"edited":true,"args_digest":"sha256:8f7f2c358c9a100a5f7fc238c878910982a3ef96af99ac7d5b80995790116c9e",` +
		`"decided_by":[{"principal":"alice","channel":"cli","decision":"approve","at":"2025-01-02T03:04:05Z"}],` +
		`"decided_at":"2025-01-02T03:04:05Z"}`
)

func wantRequested() events.Requested {
	return events.Requested{
		Tool:    "delete_file",
		Args:    json.RawMessage(`{"path":"/srv/reports/q3.csv"}`),
		Agent:   "file-manager",
		Session: "s-42",
		User:    "carol",
		Hint:    "Delete the Q3 report?",
		Timeout: events.Duration(2 * time.Minute),
	}
}

func TestDecodeDesignExamples(t *testing.T) {
	// The two messages of DESIGN.md section 3, byte for byte in spirit.
	request := []byte(`{"specversion": "1.0", "id": "0193a5b2-7c1e-7d3a-9f1e-3c2b1a0f9e8d",
 "type": "dev.assent.approval.requested", "source": "agent/file-manager",
 "datacontenttype": "application/json",
 "data": {"tool": "delete_file", "args": {"path": "/srv/reports/q3.csv"},
          "agent": "file-manager", "session": "s-42", "user": "carol",
          "hint": "Delete the Q3 report?", "timeout": "2m"}}`)
	answer := []byte(`{"specversion": "1.0", "id": "0193a5b3-0000-7000-8000-000000000001",
 "type": "dev.assent.approval.responded", "source": "approver/alice",
 "datacontenttype": "application/json",
 "data": {"decision": "approve", "args": {"path": "/srv/reports/q3-draft.csv"},
          "reason": "only the draft", "channel": "cli"}}`)

	e, err := events.Decode(structuredHeader, request)
	if err != nil {
		t.Fatal(err)
	}
	r, err := events.DecodeRequested(&e)
	if err != nil {
		t.Fatal(err)
	}
	if e.ID() != testID || r.Tool != "delete_file" || r.User != "carol" || r.Timeout.Std() != 2*time.Minute {
		t.Fatalf("request = %s %+v", e.ID(), r)
	}
	if sub, _ := events.RequestSubject(r.Agent); sub != "assent.request.file-manager" {
		t.Fatalf("subject = %q", sub)
	}

	e, err = events.Decode(nil, answer)
	if err != nil {
		t.Fatal(err)
	}
	a, err := events.DecodeResponded(&e)
	if err != nil {
		t.Fatal(err)
	}
	if a.Decision != events.Approve || a.Channel != "cli" || a.Reason != "only the draft" {
		t.Fatalf("answer = %+v", a)
	}
	canon, err := events.CanonicalArgs(a.Args)
	if err != nil || string(canon) != `{"path":"/srv/reports/q3-draft.csv"}` {
		t.Fatalf("args = %s, %v", canon, err)
	}
}

func TestDecodeStructuredRoundTrip(t *testing.T) {
	req := wantRequested()
	req.CallID = "call_1"
	req.ResponseSchema = json.RawMessage(`{"type":"object"}`)
	req.Labels = map[string]string{"team": "finance"}
	e, err := events.New(events.TypeRequested, testID, "agent/file-manager", req)
	if err != nil {
		t.Fatal(err)
	}
	e.SetSubject("delete_file")
	e.SetExtension("assenttrace", "abc")
	h, body, err := events.Encode(&e)
	if err != nil {
		t.Fatal(err)
	}
	if got := h["Content-Type"]; len(got) != 1 || got[0] != events.ContentTypeStructured {
		t.Fatalf("Content-Type = %q", got)
	}
	if !json.Valid(body) {
		t.Fatalf("body is not JSON: %s", body)
	}
	got, err := events.Decode(h, body)
	if err != nil {
		t.Fatal(err)
	}
	sameEnvelope(t, &got, &e)
	r, err := events.DecodeRequested(&got)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(r, req) {
		t.Fatalf("data = %+v\nwant   %+v", r, req)
	}
}

func sameEnvelope(t *testing.T, got, want *events.Event) {
	t.Helper()
	if got.ID() != want.ID() || got.Type() != want.Type() || got.Source() != want.Source() ||
		got.SpecVersion() != want.SpecVersion() || got.Subject() != want.Subject() {
		t.Fatalf("envelope = %s %s %s %s %q, want %s %s %s %s %q",
			got.SpecVersion(), got.ID(), got.Type(), got.Source(), got.Subject(),
			want.SpecVersion(), want.ID(), want.Type(), want.Source(), want.Subject())
	}
	if !got.Time().Equal(want.Time()) {
		t.Fatalf("time = %v, want %v", got.Time(), want.Time())
	}
	if !bytes.Equal(got.Data(), want.Data()) {
		t.Fatalf("data = %s, want %s", got.Data(), want.Data())
	}
	if !reflect.DeepEqual(got.Extensions(), want.Extensions()) {
		t.Fatalf("extensions = %v, want %v", got.Extensions(), want.Extensions())
	}
}

func TestDecodeBinaryRoundTrip(t *testing.T) {
	data := events.Responded{Decision: events.Approve, Reason: "50% sure: ok", Channel: "cli"}
	e, err := events.New(events.TypeResponded, testAnswer, "approver/alice smith?x=1", data)
	if err != nil {
		t.Fatal(err)
	}
	e.SetSubject("réponse/1")
	e.SetExtension("assenttrace", "a b%c")
	h, body, err := events.EncodeBinary(&e)
	if err != nil {
		t.Fatal(err)
	}
	if h["ce-specversion"][0] != "1.0" || h["Content-Type"][0] != events.ContentTypeJSON {
		t.Fatalf("headers = %v", h)
	}
	if strings.ContainsAny(h["ce-source"][0], " ?") || strings.ContainsAny(h["ce-assenttrace"][0], " ") {
		t.Fatalf("header values not percent-encoded: %v", h)
	}
	if !bytes.Equal(body, e.Data()) {
		t.Fatalf("body = %s, want the data %s", body, e.Data())
	}

	variants := map[string]func(string) string{
		"as written": func(k string) string { return k },
		"upper":      strings.ToUpper,
		"canonical":  textproto.CanonicalMIMEHeaderKey,
		"lower":      strings.ToLower,
	}
	for name, key := range variants {
		t.Run(name, func(t *testing.T) {
			h2 := events.Header{}
			for k, v := range h {
				h2[key(k)] = v
			}
			got, err := events.Decode(h2, body)
			if err != nil {
				t.Fatal(err)
			}
			sameEnvelope(t, &got, &e)
			if got.DataContentType() != events.ContentTypeJSON {
				t.Fatalf("datacontenttype = %q", got.DataContentType())
			}
			r, err := events.DecodeResponded(&got)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(r, data) {
				t.Fatalf("data = %+v, want %+v", r, data)
			}
		})
	}
}

func TestDecodeBinaryToStructured(t *testing.T) {
	// A broker that receives binary mode re-publishes in structured mode.
	h := binaryHeader(testID, events.TypeRequested)
	e, err := events.Decode(h, []byte(requestedData))
	if err != nil {
		t.Fatal(err)
	}
	if e.Source() != "test/fixture" {
		t.Fatalf("source = %q, want percent-decoded", e.Source())
	}
	h2, body, err := events.Encode(&e)
	if err != nil {
		t.Fatal(err)
	}
	e2, err := events.Decode(h2, body)
	if err != nil {
		t.Fatal(err)
	}
	sameEnvelope(t, &e2, &e)
	r, err := events.DecodeRequested(&e2)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(r, wantRequested()) {
		t.Fatalf("data = %+v", r)
	}
}

func TestDecodeContentTypes(t *testing.T) {
	body := structured(testID, events.TypeRequested, requestedData)
	tests := []struct {
		name string
		h    events.Header
		body []byte
	}{
		{"structured", structuredHeader, body},
		{"no headers", nil, body},
		{"empty header", events.Header{}, body},
		{"lower-case key", events.Header{"content-type": {events.ContentTypeStructured}}, body},
		{"upper-case key", events.Header{"CONTENT-TYPE": {events.ContentTypeStructured}}, body},
		{"charset parameter", events.Header{"Content-Type": {"application/cloudevents+json; charset=utf-8"}}, body},
		{"mixed-case media type", events.Header{"Content-Type": {"Application/CloudEvents+JSON;charset=UTF-8"}}, body},
		{"structured wins over ce- headers", events.Header{
			"Content-Type": {events.ContentTypeStructured}, "ce-specversion": {"0.3"}, "ce-id": {"x.y"},
		}, body},
		{"unrelated headers", events.Header{"Nats-Msg-Id": {testID}, "X-Other": {"1", "2"}}, body},
		{"binary", binaryHeader(testID, events.TypeRequested), []byte(requestedData)},
		{"binary json charset", func() events.Header {
			h := binaryHeader(testID, events.TypeRequested)
			h["Content-Type"] = []string{"application/json; charset=utf-8"}
			return h
		}(), []byte(requestedData)},
		{"binary without Content-Type", func() events.Header {
			h := binaryHeader(testID, events.TypeRequested)
			delete(h, "Content-Type")
			return h
		}(), []byte(requestedData)},
		{"binary upper-case keys", events.Header{
			"CE-SPECVERSION": {"1.0"}, "CE-ID": {testID}, "CE-TYPE": {events.TypeRequested},
			"CE-SOURCE": {"agent/x"}, "CONTENT-TYPE": {"application/json"},
		}, []byte(requestedData)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e, err := events.Decode(tt.h, tt.body)
			if err != nil {
				t.Fatal(err)
			}
			if e.ID() != testID || e.Type() != events.TypeRequested {
				t.Fatalf("envelope = %s %s", e.ID(), e.Type())
			}
			r, err := events.DecodeRequested(&e)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(r, wantRequested()) {
				t.Fatalf("data = %+v", r)
			}
		})
	}
}

func TestDecodeErrors(t *testing.T) {
	withHeader := func(k, v string) events.Header {
		h := binaryHeader(testID, events.TypeRequested)
		h[k] = []string{v}
		return h
	}
	without := func(k string) events.Header {
		h := binaryHeader(testID, events.TypeRequested)
		delete(h, k)
		return h
	}
	long := strings.Repeat("x", events.MaxTokenLength+1)
	tests := []struct {
		name    string
		h       events.Header
		body    string
		wantErr error
	}{
		{"empty body", structuredHeader, ``, events.ErrMalformed},
		{"empty body no headers", nil, ``, events.ErrMalformed},
		{"bad JSON", structuredHeader, `{"specversion":"1.0",`, events.ErrMalformed},
		{"not an object", structuredHeader, `[1,2]`, events.ErrMalformed},
		{"JSON string", structuredHeader, `"hello"`, events.ErrMalformed},
		{"JSON null", structuredHeader, `null`, events.ErrMalformed},
		{"garbage no headers", nil, `hello`, events.ErrMalformed},
		{"data only, no headers", nil, requestedData, events.ErrMalformed},
		{"data only, Content-Type json", events.Header{"Content-Type": {"application/json"}}, requestedData, events.ErrMalformed},
		{"no specversion", structuredHeader, `{"id":"a","type":"t","source":"s"}`, events.ErrMalformed},
		{"spec version 0.3", structuredHeader, `{"specversion":"0.3","id":"a","type":"t","source":"s","data":{}}`, events.ErrBadValue},
		{"spec version 2.0", structuredHeader, `{"specversion":"2.0","id":"a","type":"t","source":"s"}`, events.ErrMalformed},
		{"spec version number", structuredHeader, `{"specversion":1.0,"id":"a","type":"t","source":"s"}`, events.ErrMalformed},
		{"missing id", structuredHeader, `{"specversion":"1.0","type":"t","source":"s"}`, events.ErrMalformed},
		{"missing type", structuredHeader, `{"specversion":"1.0","id":"a","source":"s"}`, events.ErrMalformed},
		{"missing source", structuredHeader, `{"specversion":"1.0","id":"a","type":"t"}`, events.ErrMalformed},
		{"id with dot", structuredHeader, string(structured("a.b", events.TypeRequested, requestedData)), events.ErrBadToken},
		{"id with space", structuredHeader, string(structured("a b", events.TypeRequested, requestedData)), events.ErrBadToken},
		{"id wildcard", structuredHeader, string(structured(">", events.TypeRequested, requestedData)), events.ErrBadToken},
		{"id too long", structuredHeader, string(structured(long, events.TypeRequested, requestedData)), events.ErrBadToken},
		{"id as number", structuredHeader, `{"specversion":"1.0","id":7,"type":"t","source":"s"}`, events.ErrMalformed},
		{"text data", structuredHeader, `{"specversion":"1.0","id":"a","type":"t","source":"s","datacontenttype":"text/plain","data":"hi"}`, events.ErrBadValue},
		{"xml data", structuredHeader, `{"specversion":"1.0","id":"a","type":"t","source":"s","datacontenttype":"application/xml","data":"<a/>"}`, events.ErrBadValue},
		{"bad time", structuredHeader, `{"specversion":"1.0","id":"a","type":"t","source":"s","time":"yesterday"}`, events.ErrMalformed},
		{"bad data_base64", structuredHeader, `{"specversion":"1.0","id":"a","type":"t","source":"s","data_base64":"!!"}`, events.ErrMalformed},
		{"data_base64 not JSON", structuredHeader, `{"specversion":"1.0","id":"a","type":"t","source":"s","datacontenttype":"application/json","data_base64":"aGVsbG8="}`, events.ErrMalformed},
		{"object extension", structuredHeader, `{"specversion":"1.0","id":"a","type":"t","source":"s","ext":{"a":1}}`, events.ErrMalformed},

		{"binary spec version 0.3", withHeader("ce-specversion", "0.3"), requestedData, events.ErrBadValue},
		{"binary missing id", without("ce-id"), requestedData, events.ErrMalformed},
		{"binary missing type", without("ce-type"), requestedData, events.ErrMalformed},
		{"binary missing source", without("ce-source"), requestedData, events.ErrMalformed},
		{"binary id with dot", withHeader("ce-id", "a.b"), requestedData, events.ErrBadToken},
		{"binary percent-encoded dot in id", withHeader("ce-id", "a%2Eb"), requestedData, events.ErrBadToken},
		{"binary bad percent-encoding", withHeader("ce-source", "agent%zz"), requestedData, events.ErrMalformed},
		{"binary bad time", withHeader("ce-time", "2025-13-01T00:00:00Z"), requestedData, events.ErrBadValue},
		{"binary text data", withHeader("Content-Type", "text/plain"), "hello", events.ErrBadValue},
		{"binary json with charset but not JSON", withHeader("Content-Type", "application/json; charset=utf-8"), "hello", events.ErrMalformed},
		{"binary data not JSON", binaryHeader(testID, events.TypeRequested), `{"tool":`, events.ErrMalformed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := events.Decode(tt.h, []byte(tt.body))
			checkErr(t, err, tt.wantErr)
		})
	}
}

func TestDecodeSizeLimit(t *testing.T) {
	body := structured(testID, events.TypeRequested, requestedData)
	h := events.Header{"Content-Type": {events.ContentTypeStructured}, "Nats-Msg-Id": {testID}}
	size := len(body)
	for k, vs := range h {
		for _, v := range vs {
			size += len(k) + len(v)
		}
	}

	tests := []struct {
		name    string
		c       events.Codec
		h       events.Header
		body    []byte
		wantErr error
	}{
		{"at the limit", events.Codec{MaxSize: size}, h, body, nil},
		{"one byte over, counting headers", events.Codec{MaxSize: size - 1}, h, body, events.ErrTooLarge},
		{"headers alone over", events.Codec{MaxSize: len(body) + 10}, events.Header{
			"Content-Type": {events.ContentTypeStructured}, "X-Pad": {strings.Repeat("p", 64)},
		}, body, events.ErrTooLarge},
		{"every header value counts", events.Codec{MaxSize: len(body) + len("Content-Type") + len(events.ContentTypeStructured) + 5}, events.Header{
			"Content-Type": {events.ContentTypeStructured}, "X": {"12", "34"},
		}, body, events.ErrTooLarge},
		{"tiny limit", events.Codec{MaxSize: 10}, nil, body, events.ErrTooLarge},
		{"zero means default", events.Codec{}, h, body, nil},
		{"negative means default", events.Codec{MaxSize: -1}, h, body, nil},
		{"default limit exceeded", events.Codec{}, nil, bytes.Repeat([]byte{' '}, events.DefaultMaxEventSize+1), events.ErrTooLarge},
		{"default limit exceeded by headers", events.Codec{}, events.Header{"X-Pad": {strings.Repeat("p", events.DefaultMaxEventSize)}}, body, events.ErrTooLarge},
		// Exactly at the default limit the size check passes and the body is then
		// rejected for what it is.
		{"default limit reached", events.Codec{}, nil, bytes.Repeat([]byte{' '}, events.DefaultMaxEventSize), events.ErrMalformed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := tt.c.Decode(tt.h, tt.body)
			checkErr(t, err, tt.wantErr)
			if tt.wantErr != events.ErrTooLarge && errors.Is(err, events.ErrTooLarge) {
				t.Fatalf("unexpected ErrTooLarge: %v", err)
			}
		})
	}

	// A large but valid event under the default limit.
	big := `{"tool":"t","args":{"blob":"` + strings.Repeat("b", 900_000) + `"}}`
	e, err := events.Decode(nil, structured(testID, events.TypeRequested, big))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := events.DecodeRequested(&e); err != nil {
		t.Fatal(err)
	}
}

func TestDecodeData(t *testing.T) {
	decode := map[string]func(*events.Event) error{
		events.TypeRequested: func(e *events.Event) error { _, err := events.DecodeRequested(e); return err },
		events.TypeResponded: func(e *events.Event) error { _, err := events.DecodeResponded(e); return err },
		events.TypeCancel:    func(e *events.Event) error { _, err := events.DecodeCancel(e); return err },
		events.TypeDecided:   func(e *events.Event) error { _, err := events.DecodeDecided(e); return err },
		events.TypePending:   func(e *events.Event) error { _, err := events.DecodePending(e); return err },
		events.TypeEscalated: func(e *events.Event) error { _, err := events.DecodeEscalated(e); return err },
	}
	pendingData := `{"request_id":"` + testID + `","request":` + requestedData + `,"deadline":"2025-01-02T03:06:05Z","approvers":["alice","role:ops"],"rule":"r1"}`
	tests := []struct {
		name    string
		typ     string // type on the event
		as      string // decoder to use
		data    string // "" means no data
		wantErr error
	}{
		{"requested", events.TypeRequested, events.TypeRequested, requestedData, nil},
		{"responded", events.TypeResponded, events.TypeResponded, respondedData, nil},
		{"decided", events.TypeDecided, events.TypeDecided, decidedData, nil},
		{"pending", events.TypePending, events.TypePending, pendingData, nil},
		{"escalated", events.TypeEscalated, events.TypeEscalated, `{"request_id":"` + testID + `","request":{"tool":"t"},"level":2,"deadline":"2025-01-02T03:06:05Z"}`, nil},
		{"cancel with reason", events.TypeCancel, events.TypeCancel, `{"reason":"stop"}`, nil},
		{"cancel without data", events.TypeCancel, events.TypeCancel, "", nil},
		{"cancel null data", events.TypeCancel, events.TypeCancel, `null`, nil},

		{"requested as responded", events.TypeRequested, events.TypeResponded, requestedData, events.ErrWrongType},
		{"responded as requested", events.TypeResponded, events.TypeRequested, respondedData, events.ErrWrongType},
		{"decided as pending", events.TypeDecided, events.TypePending, decidedData, events.ErrWrongType},
		{"cancel as decided", events.TypeCancel, events.TypeDecided, "", events.ErrWrongType},
		{"other type as cancel", "dev.assent.approval.other", events.TypeCancel, "", events.ErrWrongType},
		{"type differs in case", "Dev.Assent.Approval.Requested", events.TypeRequested, requestedData, events.ErrWrongType},

		{"requested without data", events.TypeRequested, events.TypeRequested, "", events.ErrMissingField},
		{"decided without data", events.TypeDecided, events.TypeDecided, "", events.ErrMissingField},
		{"missing tool", events.TypeRequested, events.TypeRequested, `{"args":{}}`, events.ErrMissingTool},
		{"null tool", events.TypeRequested, events.TypeRequested, `{"tool":null}`, events.ErrMissingTool},
		{"tool as number", events.TypeRequested, events.TypeRequested, `{"tool":5}`, events.ErrMalformed},
		{"tool as object", events.TypeRequested, events.TypeRequested, `{"tool":{"name":"x"}}`, events.ErrMalformed},
		{"args as array", events.TypeRequested, events.TypeRequested, `{"tool":"t","args":["/srv"]}`, events.ErrArgsNotObject},
		{"args as string", events.TypeRequested, events.TypeRequested, `{"tool":"t","args":"{\"path\":1}"}`, events.ErrArgsNotObject},
		{"args as number", events.TypeRequested, events.TypeRequested, `{"tool":"t","args":1}`, events.ErrArgsNotObject},
		{"timeout as number", events.TypeRequested, events.TypeRequested, `{"tool":"t","timeout":120}`, events.ErrMalformed},
		{"timeout bad string", events.TypeRequested, events.TypeRequested, `{"tool":"t","timeout":"soon"}`, events.ErrMalformed},
		{"timeout negative", events.TypeRequested, events.TypeRequested, `{"tool":"t","timeout":"-5s"}`, events.ErrBadValue},
		{"timeout too long", events.TypeRequested, events.TypeRequested, `{"tool":"t","timeout":"721h"}`, events.ErrBadValue},
		{"labels as array", events.TypeRequested, events.TypeRequested, `{"tool":"t","labels":["a"]}`, events.ErrMalformed},
		{"label value number", events.TypeRequested, events.TypeRequested, `{"tool":"t","labels":{"a":1}}`, events.ErrMalformed},
		{"data as string", events.TypeRequested, events.TypeRequested, `"delete_file"`, events.ErrMalformed},
		{"data as array", events.TypeRequested, events.TypeRequested, `[]`, events.ErrMalformed},
		{"data null", events.TypeRequested, events.TypeRequested, `null`, events.ErrMissingTool},
		{"decision as number", events.TypeResponded, events.TypeResponded, `{"decision":1}`, events.ErrMalformed},
		{"unknown decision", events.TypeResponded, events.TypeResponded, `{"decision":"yes"}`, events.ErrUnknownDecision},
		{"missing decision", events.TypeResponded, events.TypeResponded, `{"reason":"x"}`, events.ErrMissingField},
		{"edited args on deny", events.TypeResponded, events.TypeResponded, `{"decision":"deny","args":{"a":1}}`, events.ErrBadValue},
		{"remember as string", events.TypeResponded, events.TypeResponded, `{"decision":"approve","remember":"session"}`, events.ErrMalformed},
		{"remember bad scope", events.TypeResponded, events.TypeResponded, `{"decision":"approve","remember":{"scope":"world"}}`, events.ErrBadValue},
		{"remember ttl number", events.TypeResponded, events.TypeResponded, `{"decision":"approve","remember":{"scope":"user","ttl":60}}`, events.ErrMalformed},
		{"decided bad outcome", events.TypeDecided, events.TypeDecided, `{"request_id":"a","outcome":"maybe","decided_at":"2025-01-02T03:04:05Z"}`, events.ErrBadValue},
		{"decided bad time", events.TypeDecided, events.TypeDecided, `{"request_id":"a","outcome":"denied","decided_at":"Jan 2"}`, events.ErrMalformed},
		{"decided no time", events.TypeDecided, events.TypeDecided, `{"request_id":"a","outcome":"denied"}`, events.ErrMissingField},
		{"decided edited as string", events.TypeDecided, events.TypeDecided, `{"request_id":"a","outcome":"denied","edited":"yes","decided_at":"2025-01-02T03:04:05Z"}`, events.ErrMalformed},
		{"pending bad request", events.TypePending, events.TypePending, `{"request_id":"a","request":{"tool":""}}`, events.ErrMissingTool},
		{"pending bad request id", events.TypePending, events.TypePending, `{"request_id":"a.b","request":{"tool":"t"}}`, events.ErrBadToken},
		{"escalated negative level", events.TypeEscalated, events.TypeEscalated, `{"request_id":"a","level":-1}`, events.ErrBadValue},
		{"cancel reason number", events.TypeCancel, events.TypeCancel, `{"reason":1}`, events.ErrMalformed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			body := structured(testID, tt.typ, tt.data)
			if tt.data == "" {
				body = []byte(`{"specversion":"1.0","id":"` + testID + `","type":"` + tt.typ + `","source":"test/fixture"}`)
			}
			e, err := events.Decode(structuredHeader, body)
			if err != nil {
				t.Fatalf("Decode: %v", err)
			}
			checkErr(t, decode[tt.as](&e), tt.wantErr)
		})
	}
}

func TestDecodeIgnoresUnknownFields(t *testing.T) {
	tests := []struct {
		name string
		typ  string
		data string
	}{
		{"requested", events.TypeRequested, `{"tool":"t","args":{"a":1},"priority":"high","future":{"nested":[1,2,3]},"labels":{"k":"v"}}`},
		{"responded", events.TypeResponded, `{"decision":"approve","signature":"abc","remember":{"scope":"call","ttl":"1h","why":"x"}}`},
		{"decided", events.TypeDecided, `{"request_id":"a","outcome":"expired","decided_at":"2025-01-02T03:04:05Z","escalation":{"level":3},"decided_by":[{"principal":"p","at":"2025-01-02T03:04:05Z","mfa":true}]}`},
		{"cancel", events.TypeCancel, `{"reason":"x","by":"admin"}`},
		{"pending", events.TypePending, `{"request_id":"a","request":{"tool":"t","x":1},"deadline":"2025-01-02T03:04:05Z","ui":{"color":"red"}}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// Unknown envelope attributes (CloudEvents extensions) must pass too.
			body := []byte(`{"specversion":"1.0","id":"` + testID + `","type":"` + tt.typ +
				`","source":"s","assentversion":"2","traceparent":"00-abc","datacontenttype":"application/json","data":` + tt.data + `}`)
			e, err := events.Decode(structuredHeader, body)
			if err != nil {
				t.Fatal(err)
			}
			var derr error
			switch tt.typ {
			case events.TypeRequested:
				var r events.Requested
				r, derr = events.DecodeRequested(&e)
				if derr == nil && (r.Tool != "t" || string(r.Args) != `{"a":1}` || r.Labels["k"] != "v") {
					t.Fatalf("data = %+v", r)
				}
			case events.TypeResponded:
				var r events.Responded
				r, derr = events.DecodeResponded(&e)
				if derr == nil && (r.Remember == nil || r.Remember.TTL.Std() != time.Hour) {
					t.Fatalf("data = %+v", r)
				}
			case events.TypeDecided:
				_, derr = events.DecodeDecided(&e)
			case events.TypeCancel:
				_, derr = events.DecodeCancel(&e)
			case events.TypePending:
				_, derr = events.DecodePending(&e)
			}
			if derr != nil {
				t.Fatal(derr)
			}
			if got := e.Extensions()["assentversion"]; got != "2" {
				t.Fatalf("extension assentversion = %v", got)
			}
		})
	}

	// Binary mode: unknown ce- headers become extensions, invalid names are skipped.
	h := binaryHeader(testID, events.TypeRequested)
	h["ce-assentversion"] = []string{"2"}
	h["ce-not_valid"] = []string{"x"}
	h["ce-"] = []string{"x"}
	e, err := events.Decode(h, []byte(requestedData))
	if err != nil {
		t.Fatal(err)
	}
	if got := e.Extensions(); len(got) != 1 || got["assentversion"] != "2" {
		t.Fatalf("extensions = %v", got)
	}
}

func TestDurationJSON(t *testing.T) {
	tests := []struct {
		in      string
		want    time.Duration
		wantErr bool
	}{
		{`"90s"`, 90 * time.Second, false},
		{`"5m"`, 5 * time.Minute, false},
		{`"1h30m"`, 90 * time.Minute, false},
		{`"250ms"`, 250 * time.Millisecond, false},
		{`"-5s"`, -5 * time.Second, false}, // parses; Validate rejects it where it matters
		{`""`, 0, false},
		{`"0"`, 0, false},
		{`90`, 0, true},
		{`90.5`, 0, true},
		{`"90"`, 0, true},
		{`"soon"`, 0, true},
		{`"5 m"`, 0, true},
		{`true`, 0, true},
		{`{}`, 0, true},
		{`[]`, 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			var d events.Duration
			err := json.Unmarshal([]byte(tt.in), &d)
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, want error %v", err, tt.wantErr)
			}
			if err == nil && d.Std() != tt.want {
				t.Fatalf("got %v, want %v", d.Std(), tt.want)
			}
		})
	}

	for _, d := range []time.Duration{0, time.Second, 90 * time.Second, 2 * time.Minute, 36 * time.Hour, 1500 * time.Millisecond} {
		b, err := json.Marshal(events.Duration(d))
		if err != nil {
			t.Fatal(err)
		}
		if want := `"` + d.String() + `"`; string(b) != want {
			t.Errorf("Marshal(%v) = %s, want %s", d, b, want)
		}
		var back events.Duration
		if err := json.Unmarshal(b, &back); err != nil || back.Std() != d {
			t.Errorf("round trip of %v: %v, %v", d, back.Std(), err)
		}
	}

	// omitempty drops a zero timeout from requested data.
	b, err := json.Marshal(events.Requested{Tool: "t"})
	if err != nil {
		t.Fatal(err)
	}
	if string(b) != `{"tool":"t"}` {
		t.Errorf("Marshal = %s", b)
	}
}

func TestCanonicalArgs(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    string
		wantErr error
	}{
		{"sorted already", `{"a":1,"b":2}`, `{"a":1,"b":2}`, nil},
		{"keys sorted", `{"b":2,"a":1}`, `{"a":1,"b":2}`, nil},
		{"white space dropped", " {\n\t\"b\" : 2 ,\r\n \"a\":1 } ", `{"a":1,"b":2}`, nil},
		{"nested keys sorted", `{"z":{"y":1,"x":[{"b":1,"a":2}]},"a":null}`, `{"a":null,"z":{"x":[{"a":2,"b":1}],"y":1}}`, nil},
		{"array order kept", `{"a":[3,1,2]}`, `{"a":[3,1,2]}`, nil},
		{"big integer exact", `{"n":12345678901234567890}`, `{"n":12345678901234567890}`, nil},
		{"numbers as written", `{"a":1.50,"b":1e3,"c":-0,"d":0.1}`, `{"a":1.50,"b":1e3,"c":-0,"d":0.1}`, nil},
		{"no HTML escaping", `{"h":"<b>Tom & Jerry</b>"}`, `{"h":"<b>Tom & Jerry</b>"}`, nil},
		{"escaped HTML unescaped", `{"h":"\u003cb\u003e \u0026"}`, `{"h":"<b> &"}`, nil},
		{"unicode escapes resolved", `{"s":"\u00e9\u0041"}`, `{"s":"éA"}`, nil},
		{"slash not escaped", `{"p":"\/srv\/x"}`, `{"p":"/srv/x"}`, nil},
		{"key byte order", `{"b":1,"B":2,"é":3,"a":4}`, `{"B":2,"a":4,"b":1,"é":3}`, nil},
		{"duplicate keys, last wins", `{"a":1,"a":2}`, `{"a":2}`, nil},
		{"empty object", `{}`, `{}`, nil},
		{"empty", ``, `{}`, nil},
		{"white space only", " \n\t", `{}`, nil},
		{"null", `null`, `{}`, nil},
		{"null with space", ` null `, `{}`, nil},
		{"array", `[1,2]`, "", events.ErrArgsNotObject},
		{"string", `"x"`, "", events.ErrArgsNotObject},
		{"number", `1`, "", events.ErrArgsNotObject},
		{"true", `true`, "", events.ErrArgsNotObject},
		{"broken", `{"a":`, "", events.ErrMalformed},
		{"not JSON", `nope`, "", events.ErrMalformed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := events.CanonicalArgs(json.RawMessage(tt.in))
			checkErr(t, err, tt.wantErr)
			if err != nil {
				return
			}
			if string(got) != tt.want {
				t.Fatalf("got %s, want %s", got, tt.want)
			}
			again, err := events.CanonicalArgs(got)
			if err != nil || !bytes.Equal(again, got) {
				t.Fatalf("not idempotent: %s -> %s, %v", got, again, err)
			}
		})
	}
}

func TestArgsDigest(t *testing.T) {
	// sha256("{}"), so a client in any language can check its implementation.
	const emptyDigest = "sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"
	for _, in := range []string{``, `null`, `{}`, ` { } `} {
		got, err := events.ArgsDigest(json.RawMessage(in))
		if err != nil || got != emptyDigest {
			t.Errorf("ArgsDigest(%q) = %s, %v; want %s", in, got, err, emptyDigest)
		}
	}

	same := []string{
		`{"path":"/srv/reports/q3-draft.csv"}`,
		`{ "path" : "/srv/reports/q3-draft.csv" }`,
		"{\n  \"path\": \"\\/srv\\/reports\\/q3-draft.csv\"\n}",
	}
	const want = "sha256:8f7f2c358c9a100a5f7fc238c878910982a3ef96af99ac7d5b80995790116c9e"
	for _, in := range same {
		got, err := events.ArgsDigest(json.RawMessage(in))
		if err != nil || got != want {
			t.Errorf("ArgsDigest(%s) = %s, %v; want %s", in, got, err, want)
		}
	}

	pairs := []struct {
		name  string
		a, b  string
		equal bool
	}{
		{"key order", `{"a":1,"b":{"c":2,"d":3}}`, `{"b":{"d":3,"c":2},"a":1}`, true},
		{"white space", `{"a":[1, 2, 3]}`, "{\"a\":[1,2,3]}\n", true},
		{"big integers differ in last digit", `{"n":12345678901234567890}`, `{"n":12345678901234567891}`, false},
		{"number spelling matters", `{"n":1}`, `{"n":1.0}`, false},
		{"array order matters", `{"a":[1,2]}`, `{"a":[2,1]}`, false},
		{"value changes", `{"path":"/srv/a"}`, `{"path":"/srv/b"}`, false},
		{"HTML escaping does not matter", `{"h":"<&>"}`, `{"h":"\u003c\u0026\u003e"}`, true},
	}
	for _, tt := range pairs {
		t.Run(tt.name, func(t *testing.T) {
			da, err := events.ArgsDigest(json.RawMessage(tt.a))
			if err != nil {
				t.Fatal(err)
			}
			db, err := events.ArgsDigest(json.RawMessage(tt.b))
			if err != nil {
				t.Fatal(err)
			}
			if (da == db) != tt.equal {
				t.Fatalf("digests %s and %s: equal=%v, want %v", da, db, da == db, tt.equal)
			}
			if !strings.HasPrefix(da, "sha256:") || len(da) != len("sha256:")+64 {
				t.Fatalf("digest %q has the wrong form", da)
			}
		})
	}

	for _, bad := range []struct {
		in      string
		wantErr error
	}{{`[]`, events.ErrArgsNotObject}, {`"x"`, events.ErrArgsNotObject}, {`{`, events.ErrMalformed}} {
		_, err := events.ArgsDigest(json.RawMessage(bad.in))
		checkErr(t, err, bad.wantErr)
	}
}

func TestVerifyArgs(t *testing.T) {
	approved := func(args string) events.Decided {
		d := events.Decided{RequestID: testID, Outcome: events.Approved, Args: json.RawMessage(args), DecidedAt: time.Now()}
		digest, err := events.ArgsDigest(d.Args)
		if err != nil {
			t.Fatal(err)
		}
		d.ArgsDigest = digest
		return d
	}
	tests := []struct {
		name    string
		d       func() events.Decided
		wantErr error
	}{
		{"intact", func() events.Decided { return approved(`{"path":"/srv/a","force":false}`) }, nil},
		{"no args", func() events.Decided { return approved(``) }, nil},
		{"reformatted args", func() events.Decided {
			d := approved(`{"path":"/srv/a","force":false}`)
			d.Args = json.RawMessage("{ \"force\": false,\n \"path\": \"/srv/a\" }")
			return d
		}, nil},
		{"tampered value", func() events.Decided {
			d := approved(`{"path":"/srv/a"}`)
			d.Args = json.RawMessage(`{"path":"/etc/passwd"}`)
			return d
		}, events.ErrBadValue},
		{"added field", func() events.Decided {
			d := approved(`{"path":"/srv/a"}`)
			d.Args = json.RawMessage(`{"path":"/srv/a","recursive":true}`)
			return d
		}, events.ErrBadValue},
		{"args dropped", func() events.Decided {
			d := approved(`{"path":"/srv/a"}`)
			d.Args = nil
			return d
		}, events.ErrBadValue},
		{"digest missing", func() events.Decided {
			d := approved(`{"path":"/srv/a"}`)
			d.ArgsDigest = ""
			return d
		}, events.ErrBadValue},
		{"digest of other algorithm", func() events.Decided {
			d := approved(`{"path":"/srv/a"}`)
			d.ArgsDigest = strings.Replace(d.ArgsDigest, "sha256:", "sha512:", 1)
			return d
		}, events.ErrBadValue},
		{"digest upper-case hex", func() events.Decided {
			d := approved(`{"path":"/srv/a"}`)
			d.ArgsDigest = "sha256:" + strings.ToUpper(strings.TrimPrefix(d.ArgsDigest, "sha256:"))
			return d
		}, events.ErrBadValue},
		{"args not an object", func() events.Decided {
			d := approved(`{}`)
			d.Args = json.RawMessage(`[1]`)
			return d
		}, events.ErrArgsNotObject},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.d().VerifyArgs()
			checkErr(t, err, tt.wantErr)
			if tt.wantErr == events.ErrBadValue {
				checkField(t, err, "args_digest")
			}
		})
	}
}

func TestVerifyArgsOnTheWire(t *testing.T) {
	// The digest travels with the decision; a decision whose args field was
	// changed in transit must fail verification after decoding.
	e, err := events.Decode(structuredHeader, structured(testDecided, events.TypeDecided, decidedData))
	if err != nil {
		t.Fatal(err)
	}
	d, err := events.DecodeDecided(&e)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.VerifyArgs(); err != nil {
		t.Fatalf("untouched decision: %v", err)
	}
	if !d.Approved() || !d.Edited || len(d.DecidedBy) != 1 || d.DecidedBy[0].Principal != "alice" {
		t.Fatalf("decision = %+v", d)
	}

	tampered := strings.Replace(decidedData, "q3-draft.csv", "q3.csv", 1)
	e, err = events.Decode(structuredHeader, structured(testDecided, events.TypeDecided, tampered))
	if err != nil {
		t.Fatal(err)
	}
	d, err = events.DecodeDecided(&e)
	if err != nil {
		t.Fatal(err) // the data is still well-formed; only the digest check catches it
	}
	checkErr(t, d.VerifyArgs(), events.ErrBadValue)
}
