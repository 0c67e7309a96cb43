// Package openapicheck reads an OpenAPI 3.1 document and checks JSON against
// its schemas, so that tests can hold the API to its document.
package openapicheck

import (
	"bytes"
	"fmt"
	"net/http"
	"slices"
	"sort"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

const docURL = "mem:///openapi.json"

// Doc is a loaded OpenAPI document.
type Doc struct {
	Version string
	raw     map[string]any
	c       *jsonschema.Compiler
	cache   map[string]*jsonschema.Schema
}

// Load parses an OpenAPI document. Its schemas are JSON Schema 2020-12, the
// dialect of OpenAPI 3.1.
func Load(raw []byte) (*Doc, error) {
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		return nil, fmt.Errorf("openapi document: %w", err)
	}
	m, ok := v.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("openapi document: not an object")
	}
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	if err := c.AddResource(docURL, m); err != nil {
		return nil, err
	}
	version, _ := m["openapi"].(string)
	return &Doc{Version: version, raw: m, c: c, cache: map[string]*jsonschema.Schema{}}, nil
}

// Operations lists the document's operations as "METHOD /path".
func (d *Doc) Operations() []string {
	var out []string
	paths, _ := d.raw["paths"].(map[string]any)
	for path, item := range paths {
		ops, _ := item.(map[string]any)
		for method := range ops {
			switch m := strings.ToUpper(method); m {
			case http.MethodGet, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete:
				out = append(out, m+" "+path)
			}
		}
	}
	sort.Strings(out)
	return out
}

// SchemaNames lists the component schemas.
func (d *Doc) SchemaNames() []string {
	comps, _ := d.raw["components"].(map[string]any)
	schemas, _ := comps["schemas"].(map[string]any)
	var out []string
	for name := range schemas {
		out = append(out, name)
	}
	sort.Strings(out)
	return out
}

// Schema compiles the component schema name.
func (d *Doc) Schema(name string) (*jsonschema.Schema, error) {
	return d.compile("#/components/schemas/" + name)
}

func (d *Doc) compile(pointer string) (*jsonschema.Schema, error) {
	if s, ok := d.cache[pointer]; ok {
		return s, nil
	}
	s, err := d.c.Compile(docURL + pointer)
	if err != nil {
		return nil, err
	}
	d.cache[pointer] = s
	return s, nil
}

// CheckRefs reports every $ref that does not resolve within the document.
func (d *Doc) CheckRefs() error {
	var bad []string
	var walk func(v any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			if ref, ok := v["$ref"].(string); ok {
				if _, err := d.lookup(ref); err != nil {
					bad = append(bad, ref)
				}
			}
			for _, x := range v {
				walk(x)
			}
		case []any:
			for _, x := range v {
				walk(x)
			}
		}
	}
	walk(d.raw)
	if len(bad) > 0 {
		slices.Sort(bad)
		return fmt.Errorf("unresolved references: %s", strings.Join(slices.Compact(bad), ", "))
	}
	return nil
}

func (d *Doc) lookup(ref string) (any, error) {
	if !strings.HasPrefix(ref, "#/") {
		return nil, fmt.Errorf("%s: only local references", ref)
	}
	var cur any = d.raw
	for _, part := range strings.Split(ref[2:], "/") {
		part = strings.NewReplacer("~1", "/", "~0", "~").Replace(part)
		m, ok := cur.(map[string]any)
		if !ok {
			return nil, fmt.Errorf("%s: no %s", ref, part)
		}
		if cur, ok = m[part]; !ok {
			return nil, fmt.Errorf("%s: no %s", ref, part)
		}
	}
	return cur, nil
}

// CheckResponse validates a JSON response body of operation "METHOD /path"
// (as the document writes the path) with status against the documented
// schema. A status the operation does not document is an error.
func (d *Doc) CheckResponse(op string, status int, body []byte) error {
	method, path, _ := strings.Cut(op, " ")
	base := fmt.Sprintf("#/paths/%s/%s/responses", escape(path), strings.ToLower(method))
	resps, err := d.lookup(base)
	if err != nil {
		return fmt.Errorf("%s: not documented", op)
	}
	code := fmt.Sprint(status)
	if _, ok := resps.(map[string]any)[code]; !ok {
		return fmt.Errorf("%s: status %d not documented", op, status)
	}
	pointer := base + "/" + code + "/content/application~1json/schema"
	if _, err := d.lookup(pointer); err != nil {
		return fmt.Errorf("%s %d: no JSON schema documented", op, status)
	}
	s, err := d.compile(pointer)
	if err != nil {
		return err
	}
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("%s %d: body is not JSON: %w", op, status, err)
	}
	if err := s.Validate(v); err != nil {
		return fmt.Errorf("%s %d: body does not match the document: %v\n%s", op, status, err, body)
	}
	return nil
}

// escape writes path as one JSON pointer token.
func escape(path string) string {
	return strings.NewReplacer("~", "~0", "/", "~1").Replace(path)
}
