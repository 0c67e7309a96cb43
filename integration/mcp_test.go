package integration

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/assent-dev/assent/integration/itest"
	"github.com/assent-dev/assent/internal/broker"
	"github.com/assent-dev/assent/internal/mcpgateway"
	"github.com/assent-dev/assent/pkg/events"
)

// mcpPolicy lets listing through at once; everything else waits for anyone.
const mcpPolicy = `version: 1
defaults:
  allow_self_approval: true
principals:
  alice: {}
rules:
  - name: read-only
    tools: ["list_*"]
    action: allow
`

// TestMCPGatewayBinary runs the built mcp-gateway in front of the built
// agent-worker (agent-worker mcp over stdio), as a desktop assistant would
// (the gateway started with its client on stdio) and as an IDE reaching it
// over streamable HTTP, against a real broker: a read-only call passes by
// policy, a delete runs with the args an approver edited, a denied one does
// not run, and check reports the tools.
func TestMCPGatewayBinary(t *testing.T) {
	gateway, workerBin := itest.Binary(t, "mcp-gateway"), itest.Binary(t, "agent-worker")
	e := itest.NewEnv(t, broker.Config{Policy: itest.MustPolicy(t, mcpPolicy, "policy.yaml")})
	sandbox := t.TempDir()
	for _, f := range []string{"a.txt", "b.txt", "c.txt"} {
		if err := os.WriteFile(filepath.Join(sandbox, f), []byte(f), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	config := filepath.Join(t.TempDir(), "gateway.yaml")
	src := "upstreams:\n  - name: fs\n    command: " + workerBin + "\n    args: [mcp, --sandbox, " + sandbox + "]\n    prefix: fs__\n" +
		"identity:\n  user: carol\nnats:\n  url: " + e.NS.ClientURL() + "\n"
	if err := os.WriteFile(config, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	exists := func(name string) bool {
		_, err := os.Stat(filepath.Join(sandbox, name))
		return err == nil
	}

	t.Run("stdio", func(t *testing.T) {
		var stderr itest.LockedBuffer
		cmd := exec.Command(gateway, "--config", config)
		cmd.Stderr = &stderr
		cs, err := mcp.NewClient(&mcp.Implementation{Name: "Claude Desktop", Version: "1"}, nil).Connect(itest.TestCtx(t, itest.Patience), &mcp.CommandTransport{Command: cmd}, nil)
		if err != nil {
			t.Fatalf("connect: %v\n%s", err, stderr.String())
		}
		res := callMCP(t, cs, "fs__list_files", `{}`)
		if v := verdictOf(t, res); res.IsError || !v.Auto || v.Rule != "read-only" {
			t.Errorf("list_files: %+v, verdict %+v", res, v)
		}
		ch := callMCPAfter(t, e, cs, "claude-desktop", "fs__delete_file", `{"path":"a.txt"}`,
			events.Responded{Decision: events.Approve, Args: json.RawMessage(`{"path":"b.txt"}`), Reason: "b, not a"})
		if res := <-ch; res.IsError || !verdictOf(t, res).Edited {
			t.Errorf("delete_file: %+v", res)
		}
		if !exists("a.txt") || exists("b.txt") {
			t.Error("agent-worker did not delete b.txt, the file the approver chose, alone")
		}
		// Closing stdin ends the gateway, which exits 0.
		if err := cs.Close(); err != nil {
			t.Errorf("the gateway did not exit cleanly: %v\n%s", err, stderr.String())
		}
	})

	t.Run("http", func(t *testing.T) {
		var out itest.LockedBuffer
		p := &itest.Proc{Cmd: exec.Command(gateway, "--config", config, "--http", "127.0.0.1:0"), Done: make(chan struct{})}
		p.Cmd.Stdout, p.Cmd.Stderr = &out, &out
		if err := p.Cmd.Start(); err != nil {
			t.Fatal(err)
		}
		go func() { p.Err = p.Cmd.Wait(); close(p.Done) }()
		t.Cleanup(func() { p.Kill(t) })
		served := regexp.MustCompile(`serving MCP over streamable HTTP at (http://\S+/mcp)`)
		var url string
		itest.Eventually(t, itest.Patience, func() (bool, string) {
			if m := served.FindStringSubmatch(out.String()); m != nil {
				url = m[1]
			}
			return url != "", "the gateway has not said where it serves: " + out.String()
		})
		cs, err := mcp.NewClient(&mcp.Implementation{Name: "vscode", Version: "1"}, nil).Connect(itest.TestCtx(t, itest.Patience), &mcp.StreamableClientTransport{Endpoint: url}, nil)
		if err != nil {
			t.Fatal(err)
		}
		ch := callMCPAfter(t, e, cs, "vscode", "fs__delete_file", `{"path":"c.txt"}`, events.Responded{Decision: events.Deny, Reason: "keep c"})
		res := <-ch
		if text := res.Content[0].(*mcp.TextContent).Text; !res.IsError || !strings.Contains(text, "keep c") || !strings.Contains(text, "denied") {
			t.Errorf("denied delete_file: %+v", res)
		}
		if !exists("c.txt") {
			t.Error("the denied delete ran")
		}
		_ = cs.Close()
		p.Stop(t) // SIGTERM: exit status 0
	})

	t.Run("check", func(t *testing.T) {
		out, err := exec.Command(gateway, "check", "--config", config).CombinedOutput()
		if err != nil || !strings.Contains(string(out), "upstream fs: 5 tool(s): fs__delete_file, fs__list_files, fs__move_file, fs__read_file, fs__write_file") {
			t.Errorf("check: %v\n%s", err, out)
		}
	})
}

// callMCP calls tool through cs; a protocol error fails the test.
func callMCP(t *testing.T, cs *mcp.ClientSession, tool, args string) *mcp.CallToolResult {
	t.Helper()
	res, err := cs.CallTool(itest.TestCtx(t, itest.Patience), &mcp.CallToolParams{Name: tool, Arguments: json.RawMessage(args)})
	if err != nil {
		t.Fatalf("call %s: %v", tool, err)
	}
	return res
}

// callMCPAfter calls tool through cs in a goroutine, answers the request
// agent makes of it with r as alice, and returns the call's result.
func callMCPAfter(t *testing.T, e *itest.Env, cs *mcp.ClientSession, agent, tool, args string, r events.Responded) <-chan *mcp.CallToolResult {
	t.Helper()
	pending := itest.Subscribe(t, e.NC, events.PendingPrefix+agent)
	ch := make(chan *mcp.CallToolResult, 1)
	ctx, cancel := context.WithTimeout(context.Background(), itest.Patience)
	var wg sync.WaitGroup
	wg.Go(func() {
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: json.RawMessage(args)})
		if err != nil {
			res = &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: "protocol error: " + err.Error()}}}
		}
		ch <- res
	})
	t.Cleanup(func() { cancel(); wg.Wait() })
	select {
	case m := <-pending:
		p, err := itest.DecodePending(t, m.Header, m.Data)
		if err != nil {
			t.Fatal(err)
		}
		itest.AnswerNATS(t, e.JS, "alice", p.RequestID, r)
	case <-ctx.Done():
		t.Fatalf("no pending request of %s", agent)
	}
	return ch
}

// verdictOf reads what the gateway said of the decision, from _meta.
func verdictOf(t *testing.T, res *mcp.CallToolResult) mcpgateway.Verdict {
	t.Helper()
	raw, _ := json.Marshal(res.Meta[mcpgateway.MetaKey])
	var v mcpgateway.Verdict
	if err := json.Unmarshal(raw, &v); err != nil || v.RequestID == "" {
		t.Fatalf("no verdict in %+v", res.Meta)
	}
	return v
}
