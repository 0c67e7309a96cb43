package mcpgateway_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/assent-dev/assent/internal/broker"
	"github.com/assent-dev/assent/internal/brokertest"
	"github.com/assent-dev/assent/internal/envflag"
	"github.com/assent-dev/assent/internal/mcpgateway"
	"github.com/assent-dev/assent/internal/testenv"
)

// tinyServer is an MCP server over stdio in plain Node.js, no packages: it
// names itself Tiny Notes, offers one tool, hello, and says on stderr that
// it runs.
const tinyServer = `
const rl = require('readline').createInterface({ input: process.stdin });
const send = (m) => process.stdout.write(JSON.stringify(m) + '\n');
console.error('tiny notes: listening on stdio');
rl.on('line', (line) => {
  const m = JSON.parse(line);
  if (m.id === undefined) return;
  switch (m.method) {
  case 'initialize':
    send({ jsonrpc: '2.0', id: m.id, result: { protocolVersion: m.params.protocolVersion, capabilities: { tools: {} },
      serverInfo: { name: 'Tiny Notes', version: '1.0.0' } } });
    break;
  case 'tools/list':
    send({ jsonrpc: '2.0', id: m.id, result: { tools: [{ name: 'hello', inputSchema: { type: 'object' } }] } });
    break;
  default:
    send({ jsonrpc: '2.0', id: m.id, error: { code: -32601, message: 'no method ' + m.method } });
  }
});
`

// An upstream started with node, as from a desktop assistant's
// configuration: one that fails to start says why (its stderr, in the error
// and in the log at warn level, the default), and one that starts is named
// as it names itself, not after node.
func TestNodeUpstream(t *testing.T) {
	node := testenv.Program(t, "nodejs", "node")
	ns := testenv.Server(t)
	brokertest.Run(t, testenv.Conn(t, ns), broker.Config{Name: "node"})
	// check runs mcp-gateway check -- args, logging at warn level.
	check := func(t *testing.T, args ...string) (string, *observer.ObservedLogs, error) {
		t.Helper()
		cmd, err := mcpgateway.ParseArgs(append([]string{"check", "--nats-url", ns.ClientURL(), "--"}, args...), envflag.Env{}, &bytes.Buffer{})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), patience)
		defer cancel()
		core, logs := observer.New(zap.WarnLevel)
		var out bytes.Buffer
		err = cmd.Execute(ctx, zap.New(core), nil, &out, &bytes.Buffer{})
		return out.String(), logs, err
	}
	// logged reports whether a warning logged a stderr line holding s.
	logged := func(logs *observer.ObservedLogs, s string) bool {
		for _, e := range logs.FilterMessage("upstream stderr").All() {
			if line, _ := e.ContextMap()["line"].(string); strings.Contains(line, s) {
				return true
			}
		}
		return false
	}

	t.Run("a script that is not there", func(t *testing.T) {
		out, logs, err := check(t, node, "/nonexistent.js")
		if err == nil {
			t.Fatalf("check passed:\n%s", out)
		}
		t.Logf("check: %v", err)
		for _, want := range []string{"upstream nonexistent (" + node + " /nonexistent.js): connect: ", "its stderr ended with:", "Error: Cannot find module '/nonexistent.js'"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("error lacks %q:\n%v", want, err)
			}
		}
		if !logged(logs, "Cannot find module '/nonexistent.js'") {
			t.Errorf("no warning with the upstream's stderr: %+v", logs.All())
		}
	})
	t.Run("a server names itself", func(t *testing.T) {
		script := filepath.Join(t.TempDir(), "tiny.js")
		if err := os.WriteFile(script, []byte(tinyServer), 0o644); err != nil {
			t.Fatal(err)
		}
		out, logs, err := check(t, node, script)
		if err != nil || !strings.Contains(out, "upstream tiny-notes: 1 tool(s): hello") {
			t.Errorf("check: %v\n%s", err, out)
		}
		if !logged(logs, "tiny notes: listening on stdio") {
			t.Errorf("no warning with the upstream's stderr: %+v", logs.All())
		}
	})
}
