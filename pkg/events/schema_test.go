package events_test

import (
	"errors"
	"strconv"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/assent-dev/assent/pkg/events"
)

// toolSchema is an input schema as an MCP tool declares one.
const toolSchema = `{"type":"object","properties":{
	"path":{"type":"string","pattern":"^/srv/"},
	"size_gb":{"type":"integer","minimum":1},
	"mode":{"enum":["fast","safe"]},
	"opts":{"type":"object","properties":{"force":{"type":"boolean"}}}},
	"required":["path"],"additionalProperties":false}`

// TestCheckArgs: args, an agent's or an approver's edit, are checked against
// the request's input_schema, and a failure says where in the args it is.
func TestCheckArgs(t *testing.T) {
	tests := []struct {
		name, schema, args string
		wantErr            error
		field              string
		msg                string // the whole message, or "" for no check
	}{
		{"no schema", ``, `{"anything":[1,2]}`, nil, "", ""},
		{"null schema", `null`, `{"anything":1}`, nil, "", ""},
		{"no schema, args not checked at all", ``, `[1]`, nil, "", ""},
		{"empty schema", `{}`, `{"a":1}`, nil, "", ""},
		{"fits", toolSchema, `{"path":"/srv/a","size_gb":2,"mode":"safe","opts":{"force":true}}`, nil, "", ""},
		{"big integer fits", `{"properties":{"n":{"type":"integer"}}}`, `{"n":123456789012345678901234567890}`, nil, "", ""},
		{"draft 7", `{"$schema":"http://json-schema.org/draft-07/schema#","type":"object","required":["a"]}`, `{"a":1}`, nil, "", ""},
		{"local ref", `{"$defs":{"p":{"type":"string"}},"properties":{"a":{"$ref":"#/$defs/p"}}}`, `{"a":"x"}`, nil, "", ""},

		{"wrong type", toolSchema, `{"path":5}`, events.ErrSchema, "args", "args: /path: got number, want string"},
		{"missing property", toolSchema, `{"size_gb":2}`, events.ErrSchema, "args", "args: missing property 'path'"},
		{"empty args are {}", toolSchema, ``, events.ErrSchema, "args", "args: missing property 'path'"},
		{"null args are {}", toolSchema, `null`, events.ErrSchema, "args", "args: missing property 'path'"},
		{"nested", toolSchema, `{"path":"/srv/a","opts":{"force":"yes"}}`, events.ErrSchema, "args", "args: /opts/force: got string, want boolean"},
		{"several problems, each named", toolSchema, `{"path":"/etc/passwd","size_gb":0,"extra":1}`, events.ErrSchema, "args",
			"args: additional properties 'extra' not allowed; /path: '/etc/passwd' does not match pattern '^/srv/'; /size_gb: minimum: got 0, want 1"},
		{"pointer escapes", `{"properties":{"a/b~c":{"type":"string"}}}`, `{"a/b~c":1}`, events.ErrSchema, "args", "args: /a~1b~0c: got number, want string"},
		{"through a ref", `{"$defs":{"p":{"type":"string"}},"properties":{"a":{"$ref":"#/$defs/p"}}}`, `{"a":1}`, events.ErrSchema, "args", "args: /a: got number, want string"},
		{"alternatives", `{"properties":{"v":{"anyOf":[{"type":"string"},{"type":"boolean"}]}}}`, `{"v":1}`, events.ErrSchema, "args",
			"args: /v: 'anyOf' failed; /v: got number, want string; /v: got number, want boolean"},
		{"false schema", `{"properties":{"a":false}}`, `{"a":1}`, events.ErrSchema, "args", "args: /a: false schema"},

		{"args an array", toolSchema, `[{"path":"/srv/a"}]`, events.ErrArgsNotObject, "args", ""},
		{"args a string", `{}`, `"x"`, events.ErrArgsNotObject, "args", ""},
		{"args not JSON", toolSchema, `{"path":`, events.ErrMalformed, "args", ""},
		{"args bad text", toolSchema, `{"path":"\ud800"}`, events.ErrBadText, "args", ""},

		{"schema does not compile", `{"type":5}`, `{}`, events.ErrSchema, "input_schema", ""},
		{"schema external ref", `{"$ref":"https://example.com/s.json"}`, `{}`, events.ErrSchema, "input_schema", ""},
		{"schema file ref", `{"properties":{"a":{"$ref":"file:///etc/passwd"}}}`, `{}`, events.ErrSchema, "input_schema", ""},
		{"schema not JSON", `{"type":`, `{}`, events.ErrSchema, "input_schema", ""},
		{"schema bad text", `{"description":"\udc00"}`, `{}`, events.ErrBadText, "input_schema", ""},
		{"schema too deep", strings.Repeat(`{"items":`, events.MaxSchemaDepth) + `{}` + strings.Repeat(`}`, events.MaxSchemaDepth), `{}`, events.ErrSchema, "input_schema", "nested deeper than"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := events.CheckArgs([]byte(tt.schema), []byte(tt.args))
			checkErr(t, err, tt.wantErr)
			checkField(t, err, tt.field)
			switch {
			case tt.msg == "":
			case strings.HasPrefix(tt.msg, "args: ") && err.Error() != tt.msg:
				t.Fatalf("message\n%q, want\n%q", err, tt.msg)
			case !strings.Contains(err.Error(), tt.msg):
				t.Fatalf("message %q does not say %q", err, tt.msg)
			}
			if err != nil {
				checkReadable(t, err.Error())
			}
		})
	}
}

// TestCheckArgsMessageBounded: however many problems the args have, and
// whatever they hold, the message is one bounded line that shows control
// and format characters escaped.
func TestCheckArgsMessageBounded(t *testing.T) {
	var props, args strings.Builder
	props.WriteString(`{"type":"object","properties":{`)
	args.WriteString(`{`)
	for i := range 200 {
		if i > 0 {
			props.WriteString(",")
			args.WriteString(",")
		}
		props.WriteString(`"p` + strings.Repeat("x", i%7) + string(rune('a'+i%26)) + `_` + strconv.Itoa(i) + `":{"type":"string"}`)
		args.WriteString(`"p` + strings.Repeat("x", i%7) + string(rune('a'+i%26)) + `_` + strconv.Itoa(i) + `":1`)
	}
	props.WriteString(`}}`)
	args.WriteString(`}`)
	err := events.CheckArgs([]byte(props.String()), []byte(args.String()))
	checkErr(t, err, events.ErrSchema)
	if len(err.Error()) > 500 {
		t.Fatalf("message of %d bytes: %q", len(err.Error()), err)
	}
	if !strings.Contains(err.Error(), " more") {
		t.Fatalf("message %q does not say that it leaves problems out", err)
	}
	checkReadable(t, err.Error())

	// A value quoted in the message, with a bidirectional override, a bell
	// and a line feed in it, and long.
	long := strings.Repeat("é", 400)
	err = events.CheckArgs([]byte(`{"properties":{"p":{"pattern":"^/srv/"}}}`), []byte(`{"p":"\u202e\u0007\n`+long+`"}`))
	checkErr(t, err, events.ErrSchema)
	checkReadable(t, err.Error())
	if len(err.Error()) > 500 {
		t.Fatalf("message of %d bytes: %q", len(err.Error()), err)
	}

	// A schema that does not compile says why on one bounded line too.
	err = events.CheckArgs([]byte(`{"properties":{"a":{"type":5},"b":{"minimum":"x"},"c":{"pattern":"("}}}`), []byte(`{}`))
	checkErr(t, err, events.ErrSchema)
	checkField(t, err, "input_schema")
	checkReadable(t, err.Error())
}

// checkReadable fails t unless msg is valid UTF-8 on one line, at most
// about 400 bytes after its field, without control or format characters.
func checkReadable(t *testing.T, msg string) {
	t.Helper()
	if !utf8.ValidString(msg) {
		t.Fatalf("message is not UTF-8: %q", msg)
	}
	for _, r := range msg {
		if unicode.Is(unicode.Cc, r) || unicode.Is(unicode.Cf, r) {
			t.Fatalf("message holds %U: %q", r, msg)
		}
	}
	if len(msg) > 500 {
		t.Fatalf("message of %d bytes", len(msg))
	}
}

// TestCheckArgsMatchesRequests: args an input schema accepts are args a
// request may carry, and CheckArgs judges the canonical form (what a
// decision carries) as it judges what was sent.
func TestCheckArgsMatchesRequests(t *testing.T) {
	for _, args := range []string{`{"path":"/srv/a", "size_gb" : 2}`, `{"size_gb":1.0,"path":"/srv/a"}`, `{"path":"/srv/\u00e9"}`} {
		if err := events.CheckArgs([]byte(toolSchema), []byte(args)); err != nil {
			t.Fatalf("%s: %v", args, err)
		}
		c, err := events.CanonicalArgs([]byte(args))
		if err != nil {
			t.Fatal(err)
		}
		if err := events.CheckArgs([]byte(toolSchema), c); err != nil {
			t.Fatalf("canonical %s: %v", c, err)
		}
		r := events.Requested{Tool: "t", Args: []byte(args), InputSchema: []byte(toolSchema)}
		if err := r.Validate(); err != nil {
			t.Fatal(err)
		}
	}
	var fe *events.FieldError
	if err := events.CheckArgs([]byte(toolSchema), []byte(`{}`)); !errors.As(err, &fe) || fe.Field != "args" {
		t.Fatalf("got %v", err)
	}
}

// TestCheckArgsBoundsWork: validating can take time exponential in the
// schema and the args, and both may come from an agent; CheckArgs refuses,
// at once, args whose check could take too long, and still checks large
// args against a plain schema.
func TestCheckArgsBoundsWork(t *testing.T) {
	// Two branches that both apply the schema again, one level down.
	twice := `{"$defs":{"a":{"anyOf":[{"type":"array","items":{"$ref":"#/$defs/a"}},{"type":"array","items":{"$ref":"#/$defs/a"}}]}},"properties":{"x":{"$ref":"#/$defs/a"}}}`
	nested := func(depth int) string {
		return `{"x":` + strings.Repeat("[", depth) + "1" + strings.Repeat("]", depth) + `}`
	}
	// 2^30 paths to one subschema, without a cycle, for any args.
	dag := `{"$defs":{`
	for i := range 30 {
		dag += `"d` + strconv.Itoa(i) + `":{"allOf":[{"$ref":"#/$defs/d` + strconv.Itoa(i+1) + `"},{"$ref":"#/$defs/d` + strconv.Itoa(i+1) + `"}]},`
	}
	dag += `"d30":{"type":"object"}},"$ref":"#/$defs/d0"}`
	numbers := func(n int) string { return `{"l":[` + strings.TrimSuffix(strings.Repeat("1,", n), ",") + `]}` }
	recursive := `{"$defs":{"a":{"type":"array","items":{"$ref":"#/$defs/a"}}},"properties":{"x":{"$ref":"#/$defs/a"}}}`
	tests := []struct {
		name, schema, args string
		wantErr            error
		field, msg         string
	}{
		{"shallow, checked", twice, nested(3), events.ErrSchema, "args", "/x/0/0/0: got number, want array"},
		{"deep, refused", twice, nested(40), events.ErrSchema, "args", "too costly to check"},
		{"no cycle, refused", dag, `{}`, events.ErrSchema, "args", "too costly to check"},
		{"many values, one plain schema", `{"properties":{"l":{"items":{"type":"number"}}}}`, numbers(100_000), nil, "", ""},
		{"many values, many subschemas each", `{"properties":{"l":{"items":{"anyOf":[` + strings.TrimSuffix(strings.Repeat(`{"type":"string"},`, 500), ",") + `]}}}}`,
			numbers(2000), events.ErrSchema, "args", "too costly to check"},
		{"large enum, many values", `{"properties":{"l":{"items":{"enum":[` + strings.TrimSuffix(strings.Repeat(`"abcdefgh",`, 2000), ",") + `,1]}}}}`,
			numbers(100_000), events.ErrSchema, "args", "too costly to check"},
		{"recursive schema, args as deep as allowed", recursive, nested(63), events.ErrSchema, "args", "got number, want array"},
		{"recursive schema, args too deep", recursive, nested(64), events.ErrSchema, "args", "deeper than 64"},
		{"dynamic ref", `{"$dynamicAnchor":"n","properties":{"a":{"$dynamicRef":"#n"}}}`, `{}`, events.ErrSchema, "input_schema", "$dynamicRef"},
		{"ref cycle on one value", `{"$defs":{"a":{"$ref":"#/$defs/b"},"b":{"$ref":"#/$defs/a"}},"$ref":"#/$defs/a"}`, `{}`, events.ErrSchema, "args", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := events.CheckArgs([]byte(tt.schema), []byte(tt.args))
			checkErr(t, err, tt.wantErr)
			checkField(t, err, tt.field)
			if err != nil && !strings.Contains(err.Error(), tt.msg) {
				t.Fatalf("message %q does not say %q", err, tt.msg)
			}
			if err != nil {
				checkReadable(t, err.Error())
			}
		})
	}
}

// TestCheckPayloadBoundsWork: an approver's structured answer is checked
// against a response_schema the agent wrote, with the same bounds as args:
// a schema that would take exponential time is refused at once.
func TestCheckPayloadBoundsWork(t *testing.T) {
	twice := `{"$defs":{"a":{"anyOf":[{"type":"array","items":{"$ref":"#/$defs/a"}},{"type":"array","items":{"$ref":"#/$defs/a"}}]}},"properties":{"x":{"$ref":"#/$defs/a"}}}`
	deep := `{"x":` + strings.Repeat("[", 40) + "1" + strings.Repeat("]", 40) + `}`
	err := events.CheckPayload([]byte(twice), []byte(deep))
	checkErr(t, err, events.ErrSchema)
	checkField(t, err, "payload")
	if !strings.Contains(err.Error(), "too costly to check") {
		t.Fatalf("message %q", err)
	}
	if err := events.CheckPayload([]byte(`{"$dynamicAnchor":"n","properties":{"a":{"$dynamicRef":"#n"}}}`), []byte(`{}`)); err == nil || !strings.Contains(err.Error(), "$dynamicRef") {
		t.Fatalf("a dynamic ref: %v", err)
	}
	if err := events.CheckPayload([]byte(twice), []byte(`{"x":[[[]]]}`)); err != nil {
		t.Fatalf("a shallow payload: %v", err)
	}
}

// BenchmarkCheckArgs: what the broker spends on a request with an input
// schema (and again on an approval with edited args): compiling the schema,
// bounding the work, validating.
func BenchmarkCheckArgs(b *testing.B) {
	schema, args := []byte(toolSchema), []byte(`{"path":"/srv/a","size_gb":2,"mode":"safe","opts":{"force":true}}`)
	b.ReportAllocs()
	for b.Loop() {
		if err := events.CheckArgs(schema, args); err != nil {
			b.Fatal(err)
		}
	}
}
