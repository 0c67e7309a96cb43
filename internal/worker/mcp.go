package worker

import (
	"context"
	"encoding/json"
	"io"
	"runtime/debug"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// mcpTool is one file tool as an MCP server offers it.
type mcpTool struct {
	name, title, description string
	schema                   string // JSON Schema of the arguments
	readOnly, destructive    bool
}

// mcpTools are the file tools with their input schemas. The schemas say what
// parseArgs accepts: TestMCPSchemasMatchArgs holds them to the args structs.
var mcpTools = []mcpTool{
	{ToolListFiles, "List files", "List the entries of a directory in the sandbox, optionally recursively. Paths are relative to the sandbox root.",
		`{"type":"object","properties":{"path":{"type":"string","description":"Directory to list, relative to the sandbox root; default \".\""},"recursive":{"type":"boolean","description":"List subdirectories too"}},"additionalProperties":false}`,
		true, false},
	{ToolReadFile, "Read a file", "Read a text file in the sandbox (at most 1 MiB).",
		`{"type":"object","properties":{"path":{"type":"string","description":"File to read, relative to the sandbox root"}},"required":["path"],"additionalProperties":false}`,
		true, false},
	{ToolWriteFile, "Write a file", "Write a file in the sandbox, replacing it if it exists; missing parent directories are created.",
		`{"type":"object","properties":{"path":{"type":"string","description":"File to write, relative to the sandbox root"},"content":{"type":"string","description":"The whole new content (may be empty)"}},"required":["path","content"],"additionalProperties":false}`,
		false, true},
	{ToolDeleteFile, "Delete a file", "Delete one file in the sandbox. Directories are refused.",
		`{"type":"object","properties":{"path":{"type":"string","description":"File to delete, relative to the sandbox root"}},"required":["path"],"additionalProperties":false}`,
		false, true},
	{ToolMoveFile, "Move a file", "Move or rename one file in the sandbox; missing parent directories of the destination are created.",
		`{"type":"object","properties":{"from":{"type":"string","description":"File to move, relative to the sandbox root"},"to":{"type":"string","description":"Destination, relative to the sandbox root"},"overwrite":{"type":"boolean","description":"Replace the destination if it exists"}},"required":["from","to"],"additionalProperties":false}`,
		false, true},
}

// NewMCPServer returns an MCP server that offers the file tools on sb, with
// no approval of its own: whoever connects runs them. Put it behind
// cmd/mcp-gateway to have Assent guard them. A tool's failure (a bad
// argument, a path outside the sandbox, a missing file) is a tool result with
// IsError set, whose text says what went wrong.
func NewMCPServer(sb *Sandbox) *mcp.Server {
	version := "(devel)"
	if bi, ok := debug.ReadBuildInfo(); ok {
		version = bi.Main.Version
	}
	s := mcp.NewServer(&mcp.Implementation{Name: "assent-agent-worker", Title: "Assent example file tools", Version: version},
		&mcp.ServerOptions{Capabilities: &mcp.ServerCapabilities{}})
	for _, t := range mcpTools {
		open := false
		s.AddTool(&mcp.Tool{
			Name:        t.name,
			Title:       t.title,
			Description: t.description,
			InputSchema: json.RawMessage(t.schema),
			Annotations: &mcp.ToolAnnotations{ReadOnlyHint: t.readOnly, DestructiveHint: &t.destructive, OpenWorldHint: &open},
		}, func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return toolResult(sb.Exec(ctx, req.Params.Name, req.Params.Arguments))
		})
	}
	return s
}

// toolResult is what a tool did as an MCP result: the result as JSON text and
// as structured content, or the error as text with IsError.
func toolResult(res Result, err error) (*mcp.CallToolResult, error) {
	if err != nil {
		return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: err.Error()}}}, nil
	}
	b, err := json.Marshal(res)
	if err != nil {
		return nil, err
	}
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: string(b)}}, StructuredContent: json.RawMessage(b)}, nil
}

// ServeMCP serves the file tools on sb to one MCP client over in and out
// (newline-delimited JSON-RPC, as on stdio) until the client goes away or ctx
// ends; either is a clean end. The client closing its side is the usual way
// to end, and the SDK reports it as an error ("server is closing: EOF"),
// so the session's end is not an error here: there is nobody left to tell.
func ServeMCP(ctx context.Context, sb *Sandbox, in io.ReadCloser, out io.WriteCloser) error {
	_ = NewMCPServer(sb).Run(ctx, &mcp.IOTransport{Reader: in, Writer: out})
	return nil
}
