package worker_test

import (
	"context"
	"encoding/json"
	"io"
	"path/filepath"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/assent-dev/assent/internal/envflag"
	"github.com/assent-dev/assent/internal/worker"
)

// connectMCP runs "agent-worker mcp --sandbox dir" through the command line
// code, its stdin and stdout being pipes, and connects an MCP client to it.
// Closing the client ends the command; the test waits for that at cleanup.
func connectMCP(t *testing.T, dir string) *mcp.ClientSession {
	t.Helper()
	cmd, err := worker.ParseArgs([]string{"mcp", "--sandbox", dir}, envflag.Env{}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	clientIn, serverOut := io.Pipe()
	serverIn, clientOut := io.Pipe()
	cmd.Stdin = serverIn
	done := make(chan error, 1)
	go func() {
		done <- cmd.Execute(context.Background(), nil, serverOut, io.Discard)
		serverOut.Close()
	}()
	c := mcp.NewClient(&mcp.Implementation{Name: "worker-test", Version: "v0"}, nil)
	cs, err := c.Connect(testCtx(t), &mcp.IOTransport{Reader: clientIn, Writer: clientOut}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cs.Close()
		if err := <-done; err != nil {
			t.Errorf("agent-worker mcp: %v", err)
		}
	})
	return cs
}

func TestServeMCP(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{"a.txt": "alpha", "b.txt": "beta", "sub/c.txt": "gamma"})
	cs := connectMCP(t, dir)
	ctx := testCtx(t)

	want := map[string]bool{} // tool name -> read only
	for _, n := range worker.Tools() {
		want[n] = n == worker.ToolListFiles || n == worker.ToolReadFile
	}
	for tool, err := range cs.Tools(ctx, nil) {
		if err != nil {
			t.Fatal(err)
		}
		ro, ok := want[tool.Name]
		if !ok || tool.Description == "" || tool.Annotations == nil || tool.Annotations.ReadOnlyHint != ro ||
			tool.Annotations.DestructiveHint == nil || *tool.Annotations.DestructiveHint == ro {
			t.Errorf("tool %+v", tool)
		}
		if s, _ := tool.InputSchema.(map[string]any); s["type"] != "object" {
			t.Errorf("%s: input schema %v", tool.Name, tool.InputSchema)
		}
		delete(want, tool.Name)
	}
	if len(want) > 0 {
		t.Errorf("tools not offered: %v", want)
	}

	tests := []struct {
		tool, args string
		wantErr    string // in the text of a result with IsError
		wantText   string
		gone       string // a file the call removes
	}{
		{worker.ToolReadFile, `{"path":"a.txt"}`, "", `"content":"alpha"`, ""},
		{worker.ToolListFiles, `{"recursive":true}`, "", `"sub/c.txt"`, ""},
		{worker.ToolWriteFile, `{"path":"new/d.txt","content":"delta"}`, "", `"bytes":5`, ""},
		{worker.ToolMoveFile, `{"from":"b.txt","to":"moved/b.txt"}`, "", `"to":"moved/b.txt"`, "b.txt"},
		{worker.ToolDeleteFile, `{"path":"a.txt"}`, "", `"path":"a.txt"`, "a.txt"},
		{worker.ToolDeleteFile, `{"path":"../outside.txt"}`, "escapes the sandbox", "", ""},
		{worker.ToolDeleteFile, `{"path":"missing.txt"}`, "no such file", "", ""},
		{worker.ToolReadFile, `{"file":"a.txt"}`, `unknown argument "file"`, "", ""},
		{worker.ToolWriteFile, `{"path":"x"}`, `"content"`, "", ""},
	}
	for _, tt := range tests {
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: tt.tool, Arguments: json.RawMessage(tt.args)})
		if err != nil {
			t.Fatalf("%s %s: %v", tt.tool, tt.args, err)
		}
		text := res.Content[0].(*mcp.TextContent).Text
		if tt.wantErr != "" {
			if !res.IsError || !strings.Contains(text, tt.wantErr) {
				t.Errorf("%s %s: IsError %v, text %q; want an error with %q", tt.tool, tt.args, res.IsError, text, tt.wantErr)
			}
			continue
		}
		if res.IsError || !strings.Contains(text, tt.wantText) || res.StructuredContent == nil {
			t.Errorf("%s %s: IsError %v, text %q, structured %v; want %q", tt.tool, tt.args, res.IsError, text, res.StructuredContent, tt.wantText)
		}
		if tt.gone != "" && exists(t, filepath.Join(dir, tt.gone)) {
			t.Errorf("%s %s: %s still exists", tt.tool, tt.args, tt.gone)
		}
	}
	if got := readFile(t, filepath.Join(dir, "new", "d.txt")); got != "delta" {
		t.Errorf("write_file wrote %q", got)
	}
}

// A cancelled context ends the server cleanly, as Ctrl-C ends the command.
func TestServeMCPStops(t *testing.T) {
	sb, err := worker.OpenSandbox(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sb.Close() })
	in, _ := io.Pipe()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := worker.ServeMCP(ctx, sb, in, nopCloser{io.Discard}); err != nil {
		t.Fatalf("ServeMCP after cancel: %v", err)
	}
}

type nopCloser struct{ io.Writer }

func (nopCloser) Close() error { return nil }
