package events

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/santhosh-tekuri/jsonschema/v6/kind"
	"golang.org/x/text/language"
	"golang.org/x/text/message"
)

// ErrSchema is wrapped when a response or input schema does not compile, a
// payload does not satisfy its response schema, or args do not satisfy
// their input schema. It also matches ErrInvalid.
var ErrSchema = invalid("response schema")

// errInputSchema is ErrSchema, worded for an input schema.
var errInputSchema = &schemaKind{msg: "input schema"}

// schemaKind is a kind of ErrSchema with words of its own.
type schemaKind struct{ msg string }

func (k *schemaKind) Error() string { return k.msg }
func (k *schemaKind) Unwrap() error { return ErrSchema }

// Limits on a response schema, and on an input schema compiled to check args
// (CheckArgs). Compiling one costs more than linear time in its nesting and
// in its number of subschemas (a 10 KB schema nested 1000 deep takes over a
// second), and every request with a schema is compiled when it is validated,
// so schemas are bounded well below the event size. They are far above what
// a form for an approver, or a tool's arguments, need.
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
	return compileSchema("response_schema", ErrSchema, schema)
}

// compileSchema is CompileSchema for the schema in field, whose errors wrap
// sentinel: ErrSchema, or a kind of it (errInputSchema) whose errors are
// also made one bounded line.
func compileSchema(field string, sentinel error, schema []byte) (*jsonschema.Schema, error) {
	if err := CheckJSONText(schema); err != nil {
		return nil, fieldErr(field, err)
	}
	if err := checkSchemaShape(schema, sentinel); err != nil {
		return nil, fieldErr(field, err)
	}
	fail := func(err error) error {
		msg := err.Error()
		if sentinel != ErrSchema {
			// One line, bounded: it may end up in a decision's reason.
			msg = truncateText(escapeInvisible(strings.Join(strings.Fields(msg), " ")), maxFailureText)
		}
		return fieldErr(field, fmt.Errorf("%w: %s", sentinel, msg))
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(schema))
	if err != nil {
		return nil, fail(err)
	}
	url := "mem:///" + field + ".json"
	c := jsonschema.NewCompiler()
	c.UseLoader(noLoader{})
	if err := c.AddResource(url, doc); err != nil {
		return nil, fail(err)
	}
	sch, err := c.Compile(url)
	if err != nil {
		return nil, fail(err)
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
	// The agent wrote the schema: bound the work it can make the broker
	// do, as for input schemas.
	if err := boundWork(sch, inst, "response_schema", "payload", ErrSchema); err != nil {
		return err
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

// CheckArgs validates args against a request's input_schema: the args an
// agent asks to run a tool with, or an approver's edit of them. An empty or
// null schema accepts anything. The schema is compiled as CompileSchema
// compiles a response schema (draft 2020-12 unless it names another, within
// MaxSchemaSize, MaxSchemaDepth and MaxSchemaObjects, no external $refs);
// one that does not compile wraps ErrSchema (ErrBadText for invalid text) and
// names the field input_schema.
//
// Empty or null args are checked as {}; args that are not JSON wrap
// ErrMalformed, args that are not an object ErrArgsNotObject, invalid text
// ErrBadText. Args that do not satisfy the schema wrap ErrSchema, name the
// field args, and say where, as JSON pointers into the args, each problem
// once, in at most about 400 bytes: "args: /path: got number, want string".
func CheckArgs(inputSchema, args []byte) error {
	return NewArgsChecker(inputSchema).Check(args)
}

// ArgsChecker checks args against one input schema, compiled once:
// CheckArgs for a schema that checks many calls (a tool's).
type ArgsChecker struct {
	sch *jsonschema.Schema // nil: anything goes, unless err
	err error              // the schema's own problem
}

// NewArgsChecker compiles inputSchema for Check.
func NewArgsChecker(inputSchema []byte) ArgsChecker {
	if EmptyJSON(inputSchema) {
		return ArgsChecker{}
	}
	sch, err := compileSchema("input_schema", errInputSchema, inputSchema)
	return ArgsChecker{sch: sch, err: err}
}

// Check is CheckArgs(the checker's schema, args).
func (c ArgsChecker) Check(args []byte) error {
	if c.err != nil {
		return c.err
	}
	sch := c.sch
	if sch == nil {
		return nil
	}
	if EmptyJSON(args) {
		args = []byte("{}")
	}
	if err := CheckJSONText(args); err != nil {
		return fieldErr("args", err)
	}
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(args))
	if err != nil {
		return fieldErr("args", fmt.Errorf("%w: %v", ErrMalformed, err))
	}
	if _, ok := inst.(map[string]any); !ok {
		return fieldErr("args", ErrArgsNotObject)
	}
	if err := boundWork(sch, inst, "input_schema", "args", errInputSchema); err != nil {
		return err
	}
	if err := sch.Validate(inst); err != nil {
		var ve *jsonschema.ValidationError
		if errors.As(err, &ve) {
			return fieldErr("args", &schemaKind{msg: describeFailure(ve, maxFailureText)})
		}
		return fieldErr("args", fmt.Errorf("%w: %v", errInputSchema, err))
	}
	return nil
}

// boundWork refuses, before validating inst against sch, what validating
// could take too long on (schemacost.go): a schema with $dynamicRef or
// $recursiveRef (field schemaField), a value nested too deep, or too many
// steps (field valueField); each wraps kind.
func boundWork(sch *jsonschema.Schema, inst any, schemaField, valueField string, kind error) error {
	if dynamicRefs(sch) {
		return fieldErr(schemaField, fmt.Errorf("%w: $dynamicRef and $recursiveRef are not supported", kind))
	}
	budget, depth := validationBudget(inst)
	if depth > maxArgsDepth {
		return fieldErr(valueField, fmt.Errorf("%w: nested %d deep, deeper than %d: too deep to check", kind, depth, maxArgsDepth))
	}
	if validationCost(sch, inst, budget) > budget {
		return fieldErr(valueField, fmt.Errorf("%w: too costly to check (over %d steps: the schema applies too many subschemas to them)", kind, budget))
	}
	return nil
}

// maxFailureText bounds what describeFailure says.
const maxFailureText = 400

// english is the printer the schema library's messages are written with.
var english = message.NewPrinter(language.English)

// describeFailure says what ve found wrong, one problem after another
// ("/path: got number, want string; /n: minimum: got 0, want 1"), each at
// the JSON pointer of the value it is about (none for the whole value), in
// at most about n bytes. Control and format characters, which the values
// quoted may hold, are shown escaped: the text ends up in terminals and
// pages.
func describeFailure(ve *jsonschema.ValidationError, n int) string {
	type problem struct{ at, what string }
	var found []problem
	var walk func(e *jsonschema.ValidationError)
	walk = func(e *jsonschema.ValidationError) {
		switch e.ErrorKind.(type) {
		case *kind.Schema, *kind.Group, *kind.AllOf, *kind.Reference:
			// Containers: what is wrong is in their causes.
		default:
			if len(e.Causes) == 0 || isAlternatives(e.ErrorKind) {
				found = append(found, problem{jsonPointer(e.InstanceLocation), e.ErrorKind.LocalizedString(english)})
			}
		}
		for _, c := range e.Causes {
			walk(c)
		}
	}
	walk(ve)
	// The library visits properties in no fixed order: say them in the
	// order of their places, so the same args always read the same.
	slices.SortStableFunc(found, func(a, b problem) int { return strings.Compare(a.at, b.at) })
	var parts []string
	for _, p := range found {
		part := p.what
		if p.at != "" {
			part = p.at + ": " + part
		}
		if !slices.Contains(parts, part) {
			parts = append(parts, part)
		}
	}
	if len(parts) == 0 {
		parts = append(parts, "does not satisfy the input schema")
	}
	const more = "; and 9999 more"
	var b strings.Builder
	for i, p := range parts {
		if i > 0 && b.Len()+2+len(p)+len(more) > n {
			fmt.Fprintf(&b, "; and %d more", len(parts)-i)
			break
		}
		if i > 0 {
			b.WriteString("; ")
		}
		b.WriteString(p)
	}
	return truncateText(escapeInvisible(b.String()), n)
}

// isAlternatives reports whether k is a keyword whose subschemas are
// alternatives (anyOf, oneOf): its own message says so, before theirs.
func isAlternatives(k jsonschema.ErrorKind) bool {
	switch k.(type) {
	case *kind.AnyOf, *kind.OneOf:
		return true
	}
	return false
}

// jsonPointer writes tokens as a JSON pointer (RFC 6901); "" for none.
func jsonPointer(tokens []string) string {
	var b strings.Builder
	for _, t := range tokens {
		b.WriteByte('/')
		t = strings.ReplaceAll(t, "~", "~0")
		b.WriteString(strings.ReplaceAll(t, "/", "~1"))
	}
	return b.String()
}

// escapeInvisible writes control (Cc) and format (Cf) characters of s as
// \u escapes (\U+XXXXXX beyond the BMP), and invalid UTF-8 as U+FFFD.
func escapeInvisible(s string) string {
	clean := true
	for _, r := range s {
		if r == utf8.RuneError || unicode.Is(unicode.Cc, r) || unicode.Is(unicode.Cf, r) {
			clean = false
			break
		}
	}
	if clean {
		return s
	}
	var b strings.Builder
	for _, r := range s {
		switch {
		case unicode.Is(unicode.Cc, r), unicode.Is(unicode.Cf, r):
			if r > 0xFFFF {
				fmt.Fprintf(&b, "\\U%08X", r)
			} else {
				fmt.Fprintf(&b, "\\u%04x", r)
			}
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// truncateText is truncate that never cuts a UTF-8 sequence in two.
func truncateText(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "..."
}

// checkSchemaShape enforces MaxSchemaSize, MaxSchemaDepth and MaxSchemaObjects
// in one pass over the bytes, before anything is parsed; its errors wrap
// sentinel. The JSON syntax is checked later, by the parser.
func checkSchemaShape(schema []byte, sentinel error) error {
	if len(schema) > MaxSchemaSize {
		return fmt.Errorf("%w: %d bytes, limit %d", sentinel, len(schema), MaxSchemaSize)
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
				return fmt.Errorf("%w: nested deeper than %d at byte %d", sentinel, MaxSchemaDepth, i)
			}
			if c == '{' {
				if objects++; objects > MaxSchemaObjects {
					return fmt.Errorf("%w: more than %d objects", sentinel, MaxSchemaObjects)
				}
			}
		case '}', ']':
			depth--
		}
	}
	return nil
}
