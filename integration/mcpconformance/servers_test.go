package mcpconformance_test

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/assent-dev/assent/integration/itest"
	"github.com/assent-dev/assent/integration/mcpconformance"
	"github.com/assent-dev/assent/internal/broker"
	"github.com/assent-dev/assent/internal/testenv"
)

// The MCP servers under test are the npm packages pinned in package.json
// and package-lock.json here, installed with `npm ci` (.ci/run does it).

// serverCommand is the command line that runs the pinned server bin
// (mcp-server-everything, mcp-server-filesystem) under node. Without node
// or node_modules the test is skipped, except in CI (CI=true), where it
// fails.
func serverCommand(t *testing.T, bin string) []string {
	t.Helper()
	node := testenv.Program(t, "nodejs", "node")
	dir, err := filepath.Abs("node_modules")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, ".bin", bin)
	if _, err := os.Stat(path); err != nil {
		msg := fmt.Sprintf("no %s: run `npm ci` in integration/mcpconformance (%v)", path, err)
		if os.Getenv("CI") == "true" {
			t.Fatal(msg + "; .ci/run does it")
		}
		t.Skip(msg)
	}
	return []string{node, path}
}

// startStdio runs args as a stdio MCP server until the test ends; grace is
// how long Close waits for it to exit once its stdin is closed.
func startStdio(t *testing.T, grace time.Duration, args ...string) *mcpconformance.Conn {
	t.Helper()
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Env = serverEnv()
	c, err := mcpconformance.StartStdio(cmd, grace)
	if err != nil {
		t.Fatalf("start %s: %v", strings.Join(args, " "), err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return c
}

// serverEnv is the test's environment without what would change how the
// servers run (a port the HTTP server would take, node options) or make
// the gateway warn (the guard, an ASSENT_ variable it does not know).
func serverEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "PORT=") && !strings.HasPrefix(kv, "NODE_OPTIONS=") {
			env = append(env, kv)
		}
	}
	return env
}

// everythingStdio starts server-everything on stdio. It keeps timers (task
// time to live, the slow call the script cancels) past the end of its
// stdin, so it is killed at once when the session ends.
func everythingStdio(t *testing.T) *mcpconformance.Conn {
	t.Helper()
	return startStdio(t, 0, append(serverCommand(t, "mcp-server-everything"), "stdio")...)
}

// listening is what testdata/print-port.mjs prints once the HTTP server
// listens.
var listening = regexp.MustCompile(`conformance: listening on port (\d+)`)

// everythingHTTP starts server-everything's streamable HTTP server on a
// port the kernel picks (PORT=0; testdata/print-port.mjs reports it) and
// dials it.
func everythingHTTP(t *testing.T) *mcpconformance.Conn {
	t.Helper()
	args := serverCommand(t, "mcp-server-everything")
	preload, err := filepath.Abs(filepath.Join("testdata", "print-port.mjs"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(args[0], "--import", "file://"+filepath.ToSlash(preload), args[1], "streamableHttp")
	cmd.Env = append(serverEnv(), "PORT=0")
	port := startListening(t, cmd, listening)
	return dialHTTP(t, "http://127.0.0.1:"+port+"/mcp")
}

// startListening starts cmd, a server, and returns the first group of
// what says where it listens once its output matches: a readiness wait.
// At the end of the test it is stopped with SIGTERM (killed if it does not
// exit), so that a gateway stops its upstreams.
func startListening(t *testing.T, cmd *exec.Cmd, says *regexp.Regexp) string {
	t.Helper()
	var out itest.LockedBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", cmd.Path, err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(itest.Patience):
			_ = cmd.Process.Kill()
			<-done
		}
	})
	var where string
	itest.Eventually(t, itest.Patience, func() (bool, string) {
		if m := says.FindStringSubmatch(out.String()); m != nil {
			where = m[1]
		}
		select {
		case <-done:
			t.Fatalf("%s exited:\n%s", cmd.Path, out.String())
		default:
		}
		return where != "", fmt.Sprintf("%s has not said where it listens:\n%s", cmd.Path, out.String())
	})
	return where
}

func dialHTTP(t *testing.T, url string) *mcpconformance.Conn {
	t.Helper()
	c := mcpconformance.DialHTTP(url)
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return c
}

// allowAll lets every call through at once: no approval traffic, so that
// what the gateway adds is the proxy's work alone.
const allowAll = `version: 1
rules:
  - name: conformance-allows-everything
    tools: ["*"]
    action: allow
`

// gateway is the mcp-gateway to run: -conformance.gateway, else
// ./cmd/mcp-gateway built.
func gateway(t *testing.T) string {
	t.Helper()
	if *gatewayBin != "" {
		return *gatewayBin
	}
	return itest.Binary(t, "mcp-gateway")
}

// gatewayConfig starts a broker whose policy allows every tool, on an
// embedded NATS server, and writes the configuration of a gateway in
// front of the upstream args (a stdio server) named name.
func gatewayConfig(t *testing.T, name string, args ...string) string {
	t.Helper()
	ns := testenv.Server(t)
	itest.RunBroker(t, testenv.Conn(t, ns), broker.Config{Name: "conformance", Policy: itest.MustPolicy(t, allowAll, "policy.yaml")})
	var b strings.Builder
	fmt.Fprintf(&b, "upstreams:\n  - name: %s\n    command: %q\n    args: [", name, args[0])
	for i, a := range args[1:] {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%q", a)
	}
	fmt.Fprintf(&b, "]\nnats:\n  url: %s\n", ns.ClientURL())
	config := filepath.Join(t.TempDir(), "gateway.yaml")
	if err := os.WriteFile(config, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return config
}

// throughGateway runs the gateway (gatewayConfig) with the client on its
// stdio.
func throughGateway(t *testing.T, name string, args ...string) *mcpconformance.Conn {
	t.Helper()
	config := gatewayConfig(t, name, args...)
	// The gateway exits when its stdin closes; the grace only bounds a
	// gateway that does not.
	return startStdio(t, itest.Patience, gateway(t), "--config", config)
}

// serving is what the gateway prints once it serves HTTP.
var serving = regexp.MustCompile(`serving MCP over streamable HTTP at (http://\S+/mcp)`)

// throughGatewayHTTP runs the gateway (gatewayConfig) serving streamable
// HTTP on a port the kernel picks, and dials it.
func throughGatewayHTTP(t *testing.T, name string, args ...string) *mcpconformance.Conn {
	t.Helper()
	config := gatewayConfig(t, name, args...)
	cmd := exec.Command(gateway(t), "--config", config, "--http", "127.0.0.1:0")
	cmd.Env = serverEnv()
	return dialHTTP(t, startListening(t, cmd, serving))
}

var (
	gatewayBin = flag.String("conformance.gateway", "", "TestConformanceThroughGateway, TestFilesystemRoots: run this mcp-gateway binary instead of building ./cmd/mcp-gateway (one built from another commit, say)")
	outDir     = flag.String("conformance.out", "", "write each run's transcript, one message a line, and each comparison's report to this directory")
)

// run runs RunEverything on c, ends the session, and returns the
// transcript named name.
func run(t *testing.T, name string, c *mcpconformance.Conn) mcpconformance.Transcript {
	t.Helper()
	ctx := itest.TestCtx(t, 10*time.Minute)
	if err := mcpconformance.RunEverything(ctx, c, itest.Patience); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	if err := c.Close(ctx); err != nil {
		t.Errorf("%s: end the session: %v", name, err)
	}
	tr := c.Transcript(name)
	keep(t, name+".transcript", tr.String())
	return tr
}

// keep writes text to the file name in -conformance.out, if given.
func keep(t *testing.T, name, text string) {
	t.Helper()
	if *outDir == "" {
		return
	}
	name = strings.Map(func(r rune) rune {
		if r == ' ' || r == '/' || r == '(' || r == ')' {
			return '-'
		}
		return r
	}, name)
	if err := os.MkdirAll(*outDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(*outDir, name+".txt"), []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
}
