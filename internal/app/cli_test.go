package app_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/assent-dev/assent/internal/app"
	"github.com/assent-dev/assent/internal/envflag"
	"github.com/assent-dev/assent/pkg/events"
	"github.com/assent-dev/assent/pkg/policy"
)

// evil is what an agent or an approver could put in a tool name, a reason or
// an argument: clear the screen, then reverse the rest of the line.
const evil = "\x1b[2J\u202Egnp.exe"

// evilShown is evil as the commands must print it.
const evilShown = `\x1b[2J\u202egnp.exe`

// checkEscaped fails unless out shows evil escaped, and only escaped.
func checkEscaped(t *testing.T, out string, want ...string) {
	t.Helper()
	if strings.ContainsAny(out, "\x1b\u202E") {
		t.Errorf("output has raw terminal controls: %q", out)
	}
	for _, w := range want {
		if !strings.Contains(out, w) {
			t.Errorf("output lacks %s:\n%s", w, out)
		}
	}
}

func evilGrant() policy.Grant {
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	return policy.Grant{
		ID: "g1" + evil, Verdict: events.Approve, Tool: "rm" + evil, Scope: events.ScopeSession,
		ScopeValue: "s1" + evil, CreatedBy: "alice" + evil, CreatedAt: at, ExpiresAt: at.Add(time.Hour),
	}
}

// adminServer answers the remembered-choices API with body, and fails the
// test on any other call.
func adminServer(t *testing.T, method, path string, status int, body any) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != method || r.URL.Path != path {
			t.Errorf("unexpected %s %s, want %s %s", r.Method, r.URL.Path, method, path)
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		if err := json.NewEncoder(w).Encode(body); err != nil {
			t.Error(err)
		}
	}))
	t.Cleanup(srv.Close)
	return srv
}

func testCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestRememberedListEscapes(t *testing.T) {
	srv := adminServer(t, http.MethodGet, "/v1/remembered", http.StatusOK, map[string]any{"remembered": []policy.Grant{evilGrant()}})
	var out bytes.Buffer
	if err := app.RememberedList(testCtx(t), &out, app.API{URL: srv.URL}); err != nil {
		t.Fatal(err)
	}
	checkEscaped(t, out.String(), "g1"+evilShown, "rm"+evilShown, "session=s1"+evilShown, "alice"+evilShown)
	if n := strings.Count(out.String(), "\n"); n != 2 {
		t.Errorf("%d lines, want 2:\n%s", n, &out)
	}
}

func TestRememberedRevokeEscapes(t *testing.T) {
	g := evilGrant()
	srv := adminServer(t, http.MethodDelete, "/v1/remembered/"+g.ID, http.StatusOK, map[string]any{"revoked": g})
	var out bytes.Buffer
	if err := app.RememberedRevoke(testCtx(t), &out, app.API{URL: srv.URL}, g.ID); err != nil {
		t.Fatal(err)
	}
	checkEscaped(t, out.String(), "revoked g1"+evilShown+" (approve rm"+evilShown+" for session=s1"+evilShown+")\n")
}

// An error message from the broker may quote the request; it is escaped too.
func TestRememberedErrorEscapes(t *testing.T) {
	srv := adminServer(t, http.MethodDelete, "/v1/remembered/x", http.StatusNotFound,
		map[string]any{"error": map[string]string{"code": "not_found", "message": "no grant " + evil}})
	err := app.RememberedRevoke(testCtx(t), &bytes.Buffer{}, app.API{URL: srv.URL}, "x")
	if err == nil {
		t.Fatal("no error")
	}
	checkEscaped(t, err.Error(), "not_found: no grant "+evilShown)
}

// policy test echoes the request and the policy's reasons.
func TestPolicyTestEscapes(t *testing.T) {
	pol := writeFile(t, "policy.yaml", `version: 1
rules:
  - name: files
    tools: ["rm*"]
    action: allow
    reason: "ok \e[2J\u202Egnp.exe"
`)
	req := writeFile(t, "request.json", `{"tool": "rm", "args": {"n": 1}}`)
	var out bytes.Buffer
	if err := app.PolicyTest(&out, pol, req, time.Now()); err != nil {
		t.Fatal(err)
	}
	checkEscaped(t, out.String(), "reason: ok "+evilShown)
}

// policy check quotes file content in its problems.
func TestPolicyCheckEscapes(t *testing.T) {
	pol := writeFile(t, "policy.yaml", "version: 1\nrules:\n  - name: a\n    action: deny\n    when: \"args.x == 1 \\e[2J\\u202Egnp.exe\"\n")
	var out bytes.Buffer
	if app.PolicyCheck(&out, pol) {
		t.Fatal("policy accepted")
	}
	checkEscaped(t, out.String(), `\x1b`)
}

// untouchable is a broker API that fails the test if it is ever called.
func untouchable(t *testing.T) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t.Errorf("broker called: %s %s", r.Method, r.URL)
		http.Error(w, "no", http.StatusTeapot)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// run runs the CLI with args, split on spaces, and returns its exit status,
// stdout and stderr.
func run(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := app.CLI{Version: "v9.9.9", Stdout: &stdout, Stderr: &stderr}.Run(testCtx(t), args)
	return code, stdout.String(), stderr.String()
}

// fields splits s on spaces, replacing URL by url.
func fields(s, url string) []string {
	f := strings.Fields(s)
	for i := range f {
		f[i] = strings.ReplaceAll(f[i], "URL", url)
	}
	return f
}

// -h, -help and --help, anywhere, print the command's usage and do nothing
// else: no HTTP call, no file read, nothing on stdout.
func TestCLIHelp(t *testing.T) {
	url := untouchable(t)
	missing := "no-such-policy.yaml" // read, it would be reported on stdout
	tests := []struct {
		args string
		want []string // in stderr, which starts with the first
	}{
		{"policy check -h", []string{"usage: broker policy check FILE\n", "Reads the policy file FILE"}},
		{"policy check " + missing + " -h", []string{"usage: broker policy check FILE\n"}},
		{"policy check --help " + missing, []string{"usage: broker policy check FILE\n"}},
		{"policy test -h", []string{"usage: broker policy test --policy FILE --request FILE\n", "Evaluates one request", "-policy FILE", "-request FILE"}},
		{"policy test --policy " + missing + " --request " + missing + " -help", []string{"usage: broker policy test"}},
		{"policy -h", []string{"usage:\n", "broker policy check FILE", "broker policy test --policy FILE --request FILE", `"broker policy COMMAND -h"`}},
		{"remembered -h --http URL", []string{"usage: broker remembered [--http URL]\n", "Lists the remembered choices", "-http URL"}},
		{"remembered --http URL --help", []string{"usage: broker remembered [--http URL]\n"}},
		{"remembered revoke -h --http URL", []string{"usage: broker remembered revoke ID [--http URL]\n", "Revokes the remembered choice ID", "-http URL"}},
		{"remembered revoke ID -h --http URL", []string{"usage: broker remembered revoke ID"}},
		{"remembered revoke --http URL ID --help", []string{"usage: broker remembered revoke ID"}},
		{"remembered revoke --http URL ID -help", []string{"usage: broker remembered revoke ID"}},
		{"remembered revoke --http -h ID", []string{"usage: broker remembered revoke ID"}},
		{"remembered --http URL revoke ID -h", []string{"usage: broker remembered revoke ID"}},
		{"audit -h --http URL", []string{"usage: broker audit", "Prints the events", "-request ID"}},
		{"audit --request x --http URL --help", []string{"usage: broker audit"}},
		{"token create -h", []string{"usage: broker token create NAME [--principal P] [--agent A] [--admin] --auth FILE\n", "shown again"}},
		{"token create ci --auth " + missing + " --principal a -h", []string{"usage: broker token create"}},
		{"token revoke ci --auth " + missing + " -h", []string{"usage: broker token revoke NAME --auth FILE\n"}},
		{"token list -h", []string{"usage: broker token list --auth FILE\n"}},
		{"token -h", []string{"usage:\n", "broker token create NAME", "broker token revoke NAME", "broker token list"}},
		{"version -h", []string{"usage: broker version\n", "Prints the broker's version."}},
		{"version --help", []string{"usage: broker version\n"}},
		{"help", []string{"usage:\n", "broker [flags]", "broker policy check FILE", "broker policy test", "broker remembered [--http URL]", "broker remembered revoke ID [--http URL]", "broker version"}},
		{"help help", []string{"usage:\n", "broker remembered revoke ID"}},
		{"help policy test", []string{"usage: broker policy test"}},
		{"help remembered revoke", []string{"usage: broker remembered revoke ID"}},
	}
	for _, tt := range tests {
		t.Run(tt.args, func(t *testing.T) {
			code, stdout, stderr := run(t, fields(tt.args, url)...)
			if code != app.ExitOK {
				t.Errorf("exit status %d, want %d", code, app.ExitOK)
			}
			if stdout != "" {
				t.Errorf("stdout %q, want nothing", stdout)
			}
			if !strings.HasPrefix(stderr, tt.want[0]) {
				t.Errorf("stderr does not start with %q:\n%s", tt.want[0], stderr)
			}
			for _, w := range tt.want[1:] {
				if !strings.Contains(stderr, w) {
					t.Errorf("stderr lacks %q:\n%s", w, stderr)
				}
			}
		})
	}
}

// A wrong command line says what is expected in one line, then shows the
// usage, and exits 2.
func TestCLIUsageErrors(t *testing.T) {
	url := untouchable(t)
	tests := []struct {
		args      string
		wantFirst string // the first line of stderr
		wantUsage string // "": no usage
	}{
		{"policy", "broker policy: missing command: want check, test, suggest or replay", "usage:\n"},
		{"policy lint x", `broker policy: unknown command "lint": want check, test, suggest or replay`, "usage:\n"},
		{"policy check", "broker policy check: missing FILE (want one argument, FILE)", "usage: broker policy check FILE"},
		{"policy check a.yaml b.yaml", `broker policy check: unexpected argument "b.yaml" (want one argument, FILE)`, "usage: broker policy check FILE"},
		{"policy check --strict a.yaml", "broker policy check: flag provided but not defined: -strict", "usage: broker policy check FILE"},
		{"policy test --policy p.yaml", "broker policy test: missing --request", "usage: broker policy test"},
		{"policy test --request r.json", "broker policy test: missing --policy", "usage: broker policy test"},
		{"policy test --policy p.yaml --request r.json extra", `broker policy test: unexpected argument "extra" (want no arguments)`, "usage: broker policy test"},
		{"remembered extra --http URL", `broker remembered: unexpected argument "extra" (want no arguments)`, "usage: broker remembered [--http URL]"},
		{"remembered --http", "broker remembered: flag needs an argument: -http", "usage: broker remembered [--http URL]"},
		{"remembered revoke --http URL", "broker remembered revoke: missing ID (want one argument, ID)", "usage: broker remembered revoke ID"},
		{"remembered revoke a b --http URL", `broker remembered revoke: unexpected argument "b" (want one argument, ID)`, "usage: broker remembered revoke ID"},
		{"version 2", `broker version: unexpected argument "2" (want no arguments)`, "usage: broker version"},
		{"serve", `broker: unknown command "serve"; the commands are policy check, policy test, remembered, remembered revoke, audit, cancel, token create, token revoke, token list, decision-key new, `, ""},
		{"", "broker: missing command", "usage:\n"},
	}
	for _, tt := range tests {
		t.Run(tt.args, func(t *testing.T) {
			code, stdout, stderr := run(t, fields(tt.args, url)...)
			if code != app.ExitUsage {
				t.Errorf("exit status %d, want %d", code, app.ExitUsage)
			}
			if stdout != "" {
				t.Errorf("stdout %q, want nothing", stdout)
			}
			first, rest, _ := strings.Cut(stderr, "\n")
			if !strings.HasPrefix(first, tt.wantFirst) {
				t.Errorf("first line %q, want %q", first, tt.wantFirst)
			}
			if tt.wantUsage != "" && !strings.Contains(rest, tt.wantUsage) {
				t.Errorf("no usage %q after the error:\n%s", tt.wantUsage, stderr)
			}
		})
	}
}

// Flags may come before or after the positional arguments; "--" ends them.
func TestCLIRememberedRevoke(t *testing.T) {
	tests := []struct {
		args   string
		wantID string
	}{
		{"remembered revoke g1 --http URL", "g1"},
		{"remembered revoke --http URL g1", "g1"},
		{"remembered revoke --http=URL g1", "g1"},
		{"remembered --http URL revoke g1", "g1"},
		{"remembered revoke --http URL -- -h", "-h"},
	}
	for _, tt := range tests {
		t.Run(tt.args, func(t *testing.T) {
			g := policy.Grant{ID: tt.wantID, Verdict: events.Approve, Tool: "rm", Scope: events.ScopeSession, ScopeValue: "s1"}
			srv := adminServer(t, http.MethodDelete, "/v1/remembered/"+tt.wantID, http.StatusOK, map[string]any{"revoked": g})
			code, stdout, stderr := run(t, fields(tt.args, srv.URL)...)
			if code != app.ExitOK {
				t.Fatalf("exit status %d; stderr:\n%s", code, stderr)
			}
			if want := "revoked " + tt.wantID + " (approve rm for session=s1)\n"; stdout != want {
				t.Errorf("stdout %q, want %q", stdout, want)
			}
		})
	}
}

func TestCLIRememberedList(t *testing.T) {
	srv := adminServer(t, http.MethodGet, "/v1/remembered", http.StatusOK, map[string]any{"remembered": []policy.Grant{evilGrant()}})
	code, stdout, stderr := run(t, "remembered", "--http", srv.URL)
	if code != app.ExitOK {
		t.Fatalf("exit status %d; stderr:\n%s", code, stderr)
	}
	checkEscaped(t, stdout, "rm"+evilShown)
}

// The broker's error, escaped, on stderr; exit status 1.
func TestCLIRememberedError(t *testing.T) {
	srv := adminServer(t, http.MethodDelete, "/v1/remembered/nope", http.StatusNotFound,
		map[string]any{"error": map[string]string{"code": "not_found", "message": "no remembered choice " + evil}})
	code, stdout, stderr := run(t, "remembered", "revoke", "nope", "--http", srv.URL)
	if code != app.ExitFailed || stdout != "" {
		t.Errorf("exit status %d, stdout %q; want %d and nothing", code, stdout, app.ExitFailed)
	}
	checkEscaped(t, stderr, "broker remembered revoke: not_found: no remembered choice "+evilShown+"\n")
}

func TestCLIPolicy(t *testing.T) {
	good := writeFile(t, "good.yaml", "version: 1\nrules:\n  - {name: reads, tools: [\"read_*\"], action: allow}\n")
	bad := writeFile(t, "bad.yaml", "version: 1\nmode: sometimes\n")
	req := writeFile(t, "req.json", `{"tool": "read_file"}`)

	code, stdout, _ := run(t, "policy", "check", good)
	if code != app.ExitOK || !strings.Contains(stdout, "good.yaml: ok (1 rules") {
		t.Errorf("check good: exit status %d, stdout %q", code, stdout)
	}
	code, stdout, _ = run(t, "policy", "check", bad)
	if code != app.ExitFailed || !strings.Contains(stdout, "bad.yaml:2: mode \"sometimes\"") {
		t.Errorf("check bad: exit status %d, stdout %q", code, stdout)
	}
	code, stdout, stderr := run(t, "policy", "test", "--request", req, "--policy", good)
	if code != app.ExitOK || !strings.HasPrefix(stdout, "decision: allow (automatic)\nrule: reads\n") {
		t.Errorf("test: exit status %d, stdout %q, stderr %q", code, stdout, stderr)
	}
	code, stdout, stderr = run(t, "policy", "test", "--request", req, "--policy", bad)
	if code != app.ExitFailed || stdout != "" || !strings.HasPrefix(stderr, "broker policy test: ") || !strings.Contains(stderr, "bad.yaml:2: mode") {
		t.Errorf("test with a bad policy: exit status %d, stdout %q, stderr %q", code, stdout, stderr)
	}
}

func TestCLIVersion(t *testing.T) {
	code, stdout, stderr := run(t, "version")
	if code != app.ExitOK || stdout != "assent broker v9.9.9\n" || stderr != "" {
		t.Errorf("exit status %d, stdout %q, stderr %q", code, stdout, stderr)
	}
}

// The token commands make, list and revoke tokens in an auth file; a token is
// shown once and never stored.
func TestCLITokens(t *testing.T) {
	file := filepath.Join(t.TempDir(), "auth.yaml")
	code, out, errOut := run(t, "token", "create", "ci", "--agent", "deployer", "--auth", file)
	if code != app.ExitOK || !strings.HasPrefix(out, "assent_") || !strings.Contains(errOut, "shown this once") {
		t.Fatalf("create: %d %q %q", code, out, errOut)
	}
	token := strings.TrimSpace(out)
	if data, _ := os.ReadFile(file); strings.Contains(string(data), token) || !strings.Contains(string(data), "sha256:") {
		t.Fatalf("auth file:\n%s", data)
	}
	if code, _, errOut := run(t, "token", "create", "ci", "--principal", "alice", "--auth", file); code != app.ExitFailed || !strings.Contains(errOut, "exists") {
		t.Fatalf("create twice: %d %q", code, errOut)
	}
	if code, _, errOut := run(t, "token", "create", "x", "--auth", file); code != app.ExitFailed || !strings.Contains(errOut, "--principal") {
		t.Fatalf("create for nobody: %d %q", code, errOut)
	}
	if code, _, errOut := run(t, "token", "create", "x", "--principal", "alice"); code != app.ExitUsage || !strings.Contains(errOut, "--auth") {
		t.Fatalf("create without --auth: %d %q", code, errOut)
	}
	code, out, _ = run(t, "token", "list", "--auth", file)
	if code != app.ExitOK || !strings.Contains(out, "ci") || !strings.Contains(out, "deployer") || strings.Contains(out, "sha256") {
		t.Fatalf("list: %d %q", code, out)
	}
	if code, out, _ := run(t, "token", "revoke", "ci", "--auth", file); code != app.ExitOK || out != "revoked ci\n" {
		t.Fatalf("revoke: %d %q", code, out)
	}
	if code, out, _ := run(t, "token", "list", "--auth", file); code != app.ExitOK || out != "no tokens\n" {
		t.Fatalf("list after revoke: %d %q", code, out)
	}
}

// The commands read flags not given from the environment: a required flag
// may come from it, the command line wins, and a bad value is a usage error
// naming the variable.
func TestCLIEnvironment(t *testing.T) {
	srv := adminServer(t, http.MethodGet, "/v1/remembered", http.StatusOK, map[string]any{"remembered": []policy.Grant{}})
	runEnv := func(vars map[string]string, args ...string) (int, string, string) {
		t.Helper()
		var stdout, stderr bytes.Buffer
		code := app.CLI{Stdout: &stdout, Stderr: &stderr, Env: envflag.Map(vars)}.Run(testCtx(t), args)
		return code, stdout.String(), stderr.String()
	}
	if code, out, errOut := runEnv(map[string]string{"ASSENT_HTTP": srv.URL}, "remembered"); code != app.ExitOK || errOut != "" {
		t.Errorf("remembered with ASSENT_HTTP: exit %d\n%s%s", code, out, errOut)
	}
	// In the broker's container, ASSENT_HTTP is the broker's listen address.
	_, port, _ := net.SplitHostPort(strings.TrimPrefix(srv.URL, "http://"))
	if code, out, errOut := runEnv(map[string]string{"ASSENT_HTTP": "0.0.0.0:" + port}, "remembered"); code != app.ExitOK || errOut != "" {
		t.Errorf("remembered with the broker's listen address in ASSENT_HTTP: exit %d\n%s%s", code, out, errOut)
	}
	if code, out, errOut := runEnv(map[string]string{"ASSENT_HTTP": "http://127.0.0.1:1"}, "remembered", "--http", srv.URL); code != app.ExitOK {
		t.Errorf("--http did not win over ASSENT_HTTP: exit %d\n%s%s", code, out, errOut)
	}

	auth := filepath.Join(t.TempDir(), "auth.yaml")
	if code, out, errOut := runEnv(map[string]string{"ASSENT_AUTH": auth}, "token", "create", "ci", "--principal", "alice"); code != app.ExitOK || !strings.Contains(errOut, "recorded in "+auth) {
		t.Fatalf("token create with ASSENT_AUTH: exit %d\n%s%s", code, out, errOut)
	}
	if code, out, errOut := runEnv(map[string]string{"ASSENT_AUTH": auth, "ASSENT_HTTP": srv.URL}, "token", "list"); code != app.ExitOK || !strings.Contains(out, "ci") ||
		errOut != "" { // ASSENT_HTTP is another command's: no warning
		t.Errorf("token list with ASSENT_AUTH: exit %d\n%s%s", code, out, errOut)
	}
	if code, _, errOut := runEnv(map[string]string{"ASSENT_LIMIT": "all", "ASSENT_HTTP": srv.URL}, "audit"); code != app.ExitUsage ||
		!strings.HasPrefix(errOut, "broker audit: ASSENT_LIMIT, for --limit: want a whole number") || !strings.Contains(errOut, "usage: broker audit") {
		t.Errorf("audit with a bad ASSENT_LIMIT: exit %d\n%s", code, errOut)
	}
}
