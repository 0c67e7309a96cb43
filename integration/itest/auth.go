package itest

import (
	"bytes"
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/assent-dev/assent/internal/app"
)

const authPolicy = `version: 1
mode: manual
principals:
  alice: {email: alice@example.com}
  bob:   {email: bob@example.com}
rules:
  - name: deletes
    tools: ["delete_*"]
    action: require_approval
    approvers: [alice]
`

// AuthApp is the whole broker process with --auth, and the tokens made for
// it with "broker token create".
type AuthApp struct {
	API    string
	File   string            // the auth file
	Tokens map[string]string // by token name
}

// StartAuthApp writes a policy and an auth file (trusting a proxy on
// loopback), makes tokens with the CLI, and runs the broker with --auth.
func StartAuthApp(t *testing.T) *AuthApp {
	t.Helper()
	dir := t.TempDir()
	pol := filepath.Join(dir, "policy.yaml")
	file := filepath.Join(dir, "auth.yaml")
	if err := os.WriteFile(pol, []byte(authPolicy), 0o600); err != nil {
		t.Fatal(err)
	}
	proxy := "proxy:\n  header: X-Forwarded-Email\n  trusted: [127.0.0.1]\nadmins: [carol]\n"
	if err := os.WriteFile(file, []byte(proxy), 0o600); err != nil {
		t.Fatal(err)
	}
	a := &AuthApp{File: file, Tokens: map[string]string{}}
	for name, flags := range map[string][]string{
		"deployer": {"--agent", "deployer"},
		"alice":    {"--principal", "alice"},
		"bob":      {"--principal", "bob"},
		"intruder": {"--agent", "intruder"},
		"ops":      {"--admin"},
		"carol":    {"--principal", "carol"}, // an admin by the auth file's admins
	} {
		out := CLI(t, app.ExitOK, append([]string{"token", "create", name, "--auth", file}, flags...)...)
		a.Tokens[name] = strings.TrimSpace(out)
	}
	addrs := StartApp(t, app.Options{NATSListen: "127.0.0.1:0", DataDir: filepath.Join(dir, "data"), HTTPListen: "127.0.0.1:0", PolicyFile: pol, AuthFile: file})
	a.API = addrs.HTTP
	return a
}

// CLI runs the broker's CLI with args, wants exit code want, and returns what
// it printed on stdout.
func CLI(t *testing.T, want int, args ...string) string {
	t.Helper()
	var out, errOut bytes.Buffer
	if code := (app.CLI{Stdout: &out, Stderr: &errOut}).Run(context.Background(), args); code != want {
		t.Fatalf("broker %s: exit %d, want %d\n%s%s", strings.Join(args, " "), code, want, out.String(), errOut.String())
	}
	return out.String()
}

// As calls the app with the bearer token of name ("" for none, or a literal
// "assent_..." token).
func (a *AuthApp) As(t *testing.T, name, method, path string, body any) HTTPResp {
	t.Helper()
	tok := a.Tokens[name]
	if tok == "" {
		tok = name
	}
	h := http.Header{}
	if tok != "" {
		h.Set("Authorization", "Bearer "+tok)
	}
	return a.With(t, h, method, path, body)
}

// With calls the app with header.
func (a *AuthApp) With(t *testing.T, h http.Header, method, path string, body any) HTTPResp {
	t.Helper()
	ctx, cancel := OpCtx()
	defer cancel()
	r, err := DoHTTPWith(ctx, method, a.API+path, h, body)
	if err != nil {
		t.Fatal(err)
	}
	return r
}
