package httpapi_test

import (
	"encoding/json"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/assent-dev/assent/internal/httpapi"
	"github.com/assent-dev/assent/internal/openapicheck"
)

// TestOpenAPIMatchesRouter: the document names exactly the operations the
// router serves, every path parameter is declared, operation ids are unique,
// every reference resolves and every schema compiles.
func TestOpenAPIMatchesRouter(t *testing.T) {
	raw, doc := loadOpenAPI(t)
	if !strings.HasPrefix(doc.Version, "3.1.") {
		t.Fatalf("openapi %q, want 3.1.x", doc.Version)
	}
	routes := httpapi.New(nil, httpapi.Config{}, nil).Routes()
	documented := doc.Operations()
	slices.Sort(routes)
	slices.Sort(documented)
	if !slices.Equal(routes, documented) {
		t.Fatalf("router serves %v\nthe document has %v", routes, documented)
	}
	var ops map[string]map[string]struct {
		OperationID string `json:"operationId"`
		Parameters  []struct {
			Name string `json:"name"`
			In   string `json:"in"`
		} `json:"parameters"`
		Responses map[string]json.RawMessage `json:"responses"`
	}
	var top struct {
		Paths json.RawMessage `json:"paths"`
	}
	if err := json.Unmarshal(raw, &top); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(top.Paths, &ops); err != nil {
		t.Fatal(err)
	}
	seen := map[string]string{}
	param := regexp.MustCompile(`\{(\w+)\}`)
	for path, methods := range ops {
		for method, op := range methods {
			where := strings.ToUpper(method) + " " + path
			if op.OperationID == "" || seen[op.OperationID] != "" {
				t.Errorf("%s: operationId %q missing or used by %s too", where, op.OperationID, seen[op.OperationID])
			}
			seen[op.OperationID] = where
			if len(op.Responses) == 0 {
				t.Errorf("%s: no responses", where)
			}
			for _, m := range param.FindAllStringSubmatch(path, -1) {
				if !slices.ContainsFunc(op.Parameters, func(p struct {
					Name string `json:"name"`
					In   string `json:"in"`
				}) bool {
					return p.Name == m[1] && p.In == "path"
				}) {
					t.Errorf("%s: path parameter %s not declared", where, m[1])
				}
			}
		}
	}
	if err := doc.CheckRefs(); err != nil {
		t.Fatal(err)
	}
	for _, name := range doc.SchemaNames() {
		if _, err := doc.Schema(name); err != nil {
			t.Errorf("schema %s: %v", name, err)
		}
	}
}

// loadOpenAPI reads openapi.json, as text and as a document to check
// responses against.
func loadOpenAPI(t *testing.T) ([]byte, *openapicheck.Doc) {
	t.Helper()
	raw, err := os.ReadFile("openapi.json")
	if err != nil {
		t.Fatal(err)
	}
	doc, err := openapicheck.Load(raw)
	if err != nil {
		t.Fatal(err)
	}
	return raw, doc
}
