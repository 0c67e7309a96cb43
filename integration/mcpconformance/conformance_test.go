package mcpconformance_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/assent-dev/assent/integration/itest"
	"github.com/assent-dev/assent/integration/mcpconformance"
)

// requireClean fails the test when the script noted something missing or
// unexpected: against server-everything itself, the script must find
// everything it expects.
func requireClean(t *testing.T, tr mcpconformance.Transcript, c *mcpconformance.Conn) {
	t.Helper()
	if len(tr.Notes) > 0 {
		t.Errorf("%s: the script found %d problem(s):\n  %s\n%s", tr.Name, len(tr.Notes), strings.Join(tr.Notes, "\n  "), c.Diagnostics())
	}
}

// TestConformanceSelf runs the script twice directly against
// server-everything over stdio and once over streamable HTTP: the three
// transcripts must compare equal, so the normalisation is not too strict;
// a transcript altered in two small ways must not, so it is not too loose.
func TestConformanceSelf(t *testing.T) {
	var first, second, overHTTP mcpconformance.Transcript
	t.Run("runs", func(t *testing.T) {
		t.Run("stdio 1", func(t *testing.T) {
			t.Parallel()
			c := everythingStdio(t)
			first = run(t, "direct (stdio) 1", c)
			requireClean(t, first, c)
		})
		t.Run("stdio 2", func(t *testing.T) {
			t.Parallel()
			c := everythingStdio(t)
			second = run(t, "direct (stdio) 2", c)
			requireClean(t, second, c)
		})
		t.Run("http", func(t *testing.T) {
			t.Parallel()
			c := everythingHTTP(t)
			overHTTP = run(t, "direct (streamable HTTP)", c)
			requireClean(t, overHTTP, c)
		})
	})
	if t.Failed() || t.Skipped() {
		return
	}
	for _, other := range []mcpconformance.Transcript{second, overHTTP} {
		if r := mcpconformance.Compare(first, other); !r.Equal() {
			t.Errorf("%s\n\n%s\n%s", r, first, other)
		}
	}

	t.Run("altered", func(t *testing.T) {
		altered := first.Clone()
		altered.Name = "altered"
		// A field dropped from one tools/list entry.
		i := responseTo(t, altered, "tools/list page 1")
		var m map[string]any
		if err := json.Unmarshal(altered.Entries[i].Msg, &m); err != nil {
			t.Fatal(err)
		}
		for _, tool := range m["result"].(map[string]any)["tools"].([]any) {
			if tool := tool.(map[string]any); tool["name"] == "get-sum" {
				delete(tool, "annotations")
			}
		}
		altered.Entries[i].Msg = mustJSON(t, m)
		// An extra notification, in the middle.
		extra := mcpconformance.Entry{Dir: mcpconformance.Received, Msg: json.RawMessage(`{"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","data":"one more"}}`)}
		altered.Entries = append(altered.Entries[:i+1], append([]mcpconformance.Entry{extra}, altered.Entries[i+1:]...)...)

		r := mcpconformance.Compare(first, altered)
		var dropped, added bool
		for _, d := range r.Differences {
			switch {
			case d.Path == "response $.result.tools[name=get-sum].annotations" && d.B == "<absent>":
				dropped = true
			case strings.HasPrefix(d.Unit, "server notification notifications/message (no logger)") && d.AAt == "-" && strings.Contains(d.B, "one more"):
				added = true
			default:
				t.Errorf("unexpected difference: %+v", d)
			}
		}
		if !dropped || !added {
			t.Errorf("the comparison missed the dropped field (%v) or the extra notification (%v):\n%s", dropped, added, r)
		}
	})
}

// responseTo is the index of the response to the request step sent.
func responseTo(t *testing.T, tr mcpconformance.Transcript, step string) int {
	t.Helper()
	var id json.RawMessage
	for i, e := range tr.Entries {
		var m struct {
			ID     json.RawMessage `json:"id"`
			Method string          `json:"method"`
		}
		_ = json.Unmarshal(e.Msg, &m)
		switch {
		case e.Step == step:
			id = m.ID
		case id != nil && e.Dir == mcpconformance.Received && m.Method == "" && string(m.ID) == string(id):
			return i
		}
	}
	t.Fatalf("no response to %s in %s", step, tr.Name)
	return -1
}

func mustJSON(t *testing.T, v any) json.RawMessage {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestConformanceThroughGateway runs the script directly against
// server-everything and through the built mcp-gateway (a broker whose
// policy allows every tool at once, on embedded NATS), the client on the
// gateway's stdio and over its streamable HTTP, and compares each with the
// direct run over the same transport: what the gateway changes, adds or
// drops, beyond an approval's own messages, is a difference.
func TestConformanceThroughGateway(t *testing.T) {
	args := append(serverCommand(t, "mcp-server-everything"), "stdio")
	for _, tc := range []struct {
		name            string
		direct, through func(t *testing.T) *mcpconformance.Conn
	}{
		{"stdio", everythingStdio, func(t *testing.T) *mcpconformance.Conn { return throughGateway(t, "everything", args...) }},
		{"streamable HTTP", everythingHTTP, func(t *testing.T) *mcpconformance.Conn { return throughGatewayHTTP(t, "everything", args...) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := tc.direct(t)
			direct := run(t, "direct ("+tc.name+")", c)
			requireClean(t, direct, c)
			if t.Failed() {
				return
			}
			gw := tc.through(t)
			through := run(t, "through mcp-gateway ("+tc.name+")", gw)
			r := mcpconformance.Compare(direct, through)
			keep(t, "gateway report ("+tc.name+")", r.String())
			if !r.Equal() || len(through.Notes) > 0 {
				notes := ""
				if len(through.Notes) > 0 {
					notes = "\n\nwhat the script noted through the gateway:\n  " + strings.Join(through.Notes, "\n  ")
				}
				t.Errorf("%s%s\n\ngateway %s", r, notes, gw.Diagnostics())
			}
		})
	}
}

// TestFilesystemRoots starts server-filesystem with no directory, so that
// it takes the client's roots, directly and through mcp-gateway: it must allow the directory the client
// offers as a root, list it, and follow when the roots change.
func TestFilesystemRoots(t *testing.T) {
	args := serverCommand(t, "mcp-server-filesystem")
	t.Run("direct", func(t *testing.T) {
		checkRoots(t, startStdio(t, 0, args...))
	})
	t.Run("through mcp-gateway", func(t *testing.T) {
		checkRoots(t, throughGateway(t, "fs", args...))
	})
}

func checkRoots(t *testing.T, c *mcpconformance.Conn) {
	t.Helper()
	dirs := make([]string, 2)
	for i, file := range []string{"a.txt", "b.txt"} {
		d, err := filepath.EvalSymlinks(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(d, file), []byte(file), 0o644); err != nil {
			t.Fatal(err)
		}
		dirs[i] = d
	}
	ctx := itest.TestCtx(t, 5*time.Minute)
	call := func(step, method string, params any) mcpconformance.Response {
		t.Helper()
		cctx, cancel := context.WithTimeout(ctx, itest.Patience)
		defer cancel()
		r, err := c.Call(cctx, step, method, params)
		if err != nil {
			t.Fatalf("%s: %v\n%s", step, err, c.Diagnostics())
		}
		if r.Error != nil {
			t.Fatalf("%s: %v", step, r.Error)
		}
		return r
	}
	toolText := func(step, tool string, args map[string]any) string {
		t.Helper()
		var res struct {
			Content []struct {
				Text string `json:"text"`
			} `json:"content"`
		}
		if err := call(step, "tools/call", map[string]any{"name": tool, "arguments": args}).Decode(&res); err != nil {
			t.Fatalf("%s: %v", step, err)
		}
		var texts []string
		for _, c := range res.Content {
			texts = append(texts, c.Text)
		}
		return strings.Join(texts, "\n")
	}
	// allowed waits until list_allowed_directories names dir alone: the
	// server takes the roots after it asked for them, in its own time.
	allowed := func(dir string) {
		t.Helper()
		var text string
		itest.Eventually(t, itest.Patience, func() (bool, string) {
			text = toolText("list_allowed_directories", "list_allowed_directories", map[string]any{})
			return strings.TrimSpace(text) == "Allowed directories:\n"+dir, "list_allowed_directories says: " + text
		})
	}
	fileURI := func(dir string) string { return "file://" + filepath.ToSlash(dir) }

	c.SetRoots([]mcpconformance.Root{{URI: fileURI(dirs[0]), Name: "one"}})
	call("initialize", "initialize", map[string]any{"protocolVersion": mcpconformance.ProtocolVersion,
		"capabilities": mcpconformance.ClientCapabilities, "clientInfo": mcpconformance.ClientInfo})
	if err := c.Notify(ctx, "initialized", "notifications/initialized", nil); err != nil {
		t.Fatal(err)
	}
	allowed(dirs[0])
	if text := toolText("list_directory", "list_directory", map[string]any{"path": dirs[0]}); !strings.Contains(text, "[FILE] a.txt") {
		t.Errorf("list_directory %s: %q", dirs[0], text)
	}

	c.SetRoots([]mcpconformance.Root{{URI: fileURI(dirs[1]), Name: "two"}})
	if err := c.Notify(ctx, "notifications/roots/list_changed", "notifications/roots/list_changed", nil); err != nil {
		t.Fatal(err)
	}
	allowed(dirs[1])
	if text := toolText("list_directory after the change", "list_directory", map[string]any{"path": dirs[1]}); !strings.Contains(text, "[FILE] b.txt") {
		t.Errorf("list_directory %s: %q", dirs[1], text)
	}
}
