package mcpgateway

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"strings"

	"github.com/assent-dev/assent/pkg/events"
	"github.com/assent-dev/assent/pkg/handler"
)

// The question put to the client's user is a form (MCP elicitation, form
// mode): accept approves, decline denies, and the form offers what an
// approver elsewhere may do too, within what the rule allows:
//
//   - reason: recorded with the decision; the agent sees it.
//   - remember: approve and do not ask again for this tool in this session
//     (a remembered choice of scope session), when the rule lets answers
//     be remembered in that scope.
//   - the call's arguments, one field each for those of a type a form can
//     show (string, number, integer, boolean, or one of an enum), filled in
//     with the call's values: changed, they are the approved call's
//     arguments (an edit), when the rule's quorum is one approval.
//
// The message shows the whole call, so that a field the form cannot show
// hides nothing.

// Keys of the form's own fields; the arguments' keys carry argKey before
// their names, so that none collides with them.
const (
	reasonKey   = "reason"
	rememberKey = "remember"
	argKey      = "arg:"
)

// approvalForm is the form for request r, pending as p.
type approvalForm struct {
	schema json.RawMessage
	// fields are the arguments shown, by their names in args, with their
	// types.
	fields map[string]string
	args   map[string]json.RawMessage // the call's arguments
}

// newApprovalForm builds the form for r as p says it is pending.
func newApprovalForm(r handler.Request, p events.Pending) approvalForm {
	f := approvalForm{fields: map[string]string{}, args: map[string]json.RawMessage{}}
	_ = json.Unmarshal(r.Args, &f.args)
	props := []string{fmt.Sprintf(`%q:{"type":"string","title":"Reason","description":"Why (optional); recorded with the decision, and the agent sees it"}`, reasonKey)}
	if t := p.Terms; t != nil && t.Remember != nil && contains(t.Remember.Scopes, "session") {
		props = append(props, fmt.Sprintf(`%q:{"type":"boolean","title":"Approve for this session","description":"Do not ask again for %s in this session (a remembered choice; revoke it in the web page). Applies only when you accept.","default":false}`,
			rememberKey, jsonText(r.Tool)))
	}
	if p.Terms == nil || p.Terms.Quorum <= 1 {
		for _, name := range schemaProperties(r.InputSchema) {
			prop, typ, ok := formField(r.InputSchema, name, f.args[name])
			if !ok {
				continue
			}
			key, _ := json.Marshal(argKey + name)
			props = append(props, string(key)+":"+prop)
			f.fields[name] = typ
		}
	}
	f.schema = json.RawMessage(`{"type":"object","properties":{` + strings.Join(props, ",") + `}}`)
	return f
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// jsonText is s for use inside a JSON string written with %q-free
// formatting: its JSON encoding without the quotes.
func jsonText(s string) string {
	b, _ := json.Marshal(s)
	return string(b[1 : len(b)-1])
}

// schemaProperties are the names of the top-level properties of an input
// schema, in the schema's order.
func schemaProperties(schema json.RawMessage) []string {
	var top map[string]json.RawMessage
	if json.Unmarshal(schema, &top) != nil {
		return nil
	}
	return objectKeys(top["properties"])
}

// objectKeys are the keys of the JSON object raw, in order.
func objectKeys(raw json.RawMessage) []string {
	dec := json.NewDecoder(bytes.NewReader(raw))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil
	}
	var keys []string
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return keys
		}
		k, _ := tok.(string)
		keys = append(keys, k)
		var skip json.RawMessage
		if dec.Decode(&skip) != nil {
			return keys
		}
	}
	return keys
}

// formField is the form's field for argument name, whose current value is
// value (absent: the schema's default, if any): its schema and type; ok is
// false for an argument a form cannot show (an object, an array, a type
// not said).
func formField(schema json.RawMessage, name string, value json.RawMessage) (prop, typ string, ok bool) {
	var top struct {
		Properties map[string]struct {
			Type        any               `json:"type"`
			Title       string            `json:"title"`
			Description string            `json:"description"`
			Enum        []json.RawMessage `json:"enum"`
			Default     json.RawMessage   `json:"default"`
		} `json:"properties"`
	}
	if json.Unmarshal(schema, &top) != nil {
		return "", "", false
	}
	p, found := top.Properties[name]
	if !found {
		return "", "", false
	}
	typ, _ = p.Type.(string)
	field := map[string]any{"title": name}
	if p.Title != "" {
		field["title"] = p.Title + " (" + name + ")"
	}
	if p.Description != "" {
		field["description"] = cut(p.Description, 512)
	}
	switch typ {
	case "string":
		if len(p.Enum) > 0 {
			var names []string
			for _, e := range p.Enum {
				var s string
				if json.Unmarshal(e, &s) != nil {
					return "", "", false
				}
				names = append(names, s)
			}
			field["enum"] = names
		}
	case "number", "integer", "boolean":
	default:
		return "", "", false
	}
	field["type"] = typ
	cur := value
	if len(cur) == 0 {
		cur = p.Default
	}
	if len(cur) > 0 {
		var v any
		if json.Unmarshal(cur, &v) != nil || !fits(typ, v) {
			// A value the field cannot hold (a string where a number
			// goes): the form would show another; leave the argument
			// to the message.
			return "", "", false
		}
		field["default"] = v
	}
	b, err := json.Marshal(field)
	if err != nil {
		return "", "", false
	}
	return string(b), typ, true
}

// fits reports whether v is a value of JSON Schema type typ.
func fits(typ string, v any) bool {
	switch typ {
	case "string":
		_, ok := v.(string)
		return ok
	case "boolean":
		_, ok := v.(bool)
		return ok
	case "number":
		_, ok := v.(float64)
		return ok
	case "integer":
		f, ok := v.(float64)
		return ok && f == math.Trunc(f)
	}
	return false
}

// edited is the arguments as the user's accepted form has them: nil when
// no field changed (approved as asked).
func (f approvalForm) edited(content map[string]any) (json.RawMessage, error) {
	out := map[string]json.RawMessage{}
	for k, v := range f.args {
		out[k] = v
	}
	changed := false
	for name, typ := range f.fields {
		v, ok := content[argKey+name]
		if !ok {
			continue
		}
		if !fits(typ, v) {
			return nil, fmt.Errorf("%s: %v is not a %s", name, v, typ)
		}
		if typ == "integer" {
			v = int64(v.(float64))
		}
		b, err := json.Marshal(v)
		if err != nil {
			return nil, err
		}
		if old, had := f.args[name]; had && sameJSON(old, b) {
			continue
		}
		if _, had := f.args[name]; !had && typ == "string" && v == "" {
			continue // an empty field left empty
		}
		out[name] = b
		changed = true
	}
	if !changed {
		return nil, nil
	}
	return json.Marshal(out)
}

// sameJSON reports whether a and b are the same JSON value.
func sameJSON(a, b json.RawMessage) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	xb, _ := json.Marshal(x)
	yb, _ := json.Marshal(y)
	return bytes.Equal(xb, yb)
}
