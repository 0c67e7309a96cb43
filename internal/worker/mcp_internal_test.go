package worker

import (
	"encoding/json"
	"maps"
	"reflect"
	"slices"
	"testing"
)

// The MCP input schemas say what parseArgs accepts: the same argument names,
// the same required ones, and nothing else.
func TestMCPSchemasMatchArgs(t *testing.T) {
	argTypes := map[string]reflect.Type{
		ToolListFiles:  reflect.TypeFor[listArgs](),
		ToolReadFile:   reflect.TypeFor[readArgs](),
		ToolWriteFile:  reflect.TypeFor[writeArgs](),
		ToolDeleteFile: reflect.TypeFor[deleteArgs](),
		ToolMoveFile:   reflect.TypeFor[moveArgs](),
	}
	var names []string
	for _, tool := range mcpTools {
		names = append(names, tool.name)
		var schema struct {
			Type                 string                     `json:"type"`
			Properties           map[string]json.RawMessage `json:"properties"`
			Required             []string                   `json:"required"`
			AdditionalProperties *bool                      `json:"additionalProperties"`
		}
		if err := json.Unmarshal([]byte(tool.schema), &schema); err != nil {
			t.Fatalf("%s: schema: %v", tool.name, err)
		}
		props := slices.Sorted(maps.Keys(schema.Properties))
		want := argNames(argTypes[tool.name])
		slices.Sort(want)
		if schema.Type != "object" || !slices.Equal(props, want) || schema.AdditionalProperties == nil || *schema.AdditionalProperties {
			t.Errorf("%s: schema %s: want an object of exactly %v, no other properties", tool.name, tool.schema, want)
		}
		// A call without the required arguments is refused, with them accepted.
		if len(schema.Required) > 0 {
			if err := CheckArgs(tool.name, json.RawMessage(`{}`)); err == nil {
				t.Errorf("%s: {} accepted though the schema requires %v", tool.name, schema.Required)
			}
		}
		args := map[string]string{}
		for _, r := range schema.Required {
			args[r] = "x"
		}
		b, _ := json.Marshal(args)
		if err := CheckArgs(tool.name, b); err != nil {
			t.Errorf("%s: the required arguments %s alone are refused: %v", tool.name, b, err)
		}
	}
	slices.Sort(names)
	if !slices.Equal(names, Tools()) {
		t.Errorf("MCP tools %v, want every tool %v", names, Tools())
	}
}
