package app_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"

	"github.com/assent-dev/assent/internal/creds"
	"github.com/assent-dev/assent/internal/testenv"
)

// TestCLICreds: `broker creds init` makes the authority once; `creds agent`,
// `approver`, `bot`, `gateway` and `broker` issue credentials files whose user JWTs
// carry their role's permissions; `creds server-config` prints a
// configuration; mistakes say what to do.
func TestCLICreds(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "keys")
	code, out, errOut := run(t, "creds", "init", "--dir", dir)
	if code != 0 || !strings.Contains(out, "credentials authority made in "+dir) {
		t.Fatalf("init: %d %s %s", code, out, errOut)
	}
	if code, out, _ = run(t, "creds", "init", "--dir", dir); code != 0 || !strings.Contains(out, "already there") {
		t.Fatalf("init again: %d %s", code, out)
	}

	file := filepath.Join(t.TempDir(), "coder.creds")
	if code, _, errOut = run(t, "creds", "agent", "coder", "--dir", dir, "--out", file, "--expires", "1h"); code != 0 || !strings.Contains(errOut, "written to "+file) {
		t.Fatalf("agent: %d %s", code, errOut)
	}
	fi, err := os.Stat(file)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("credentials file: %v %v", fi, err)
	}
	data, _ := os.ReadFile(file)
	token, err := jwt.ParseDecoratedJWT(data)
	if err != nil {
		t.Fatal(err)
	}
	uc, err := jwt.DecodeUserClaims(token)
	if err != nil {
		t.Fatal(err)
	}
	// An agent's permissions are its signing key's scope, in the account.
	if uc.Name != "coder" || !uc.HasEmptyPermissions() || uc.Expires == 0 || uc.Expires > time.Now().Add(time.Hour+time.Minute).Unix() {
		t.Fatalf("agent coder's JWT: name %q, permissions %+v, expires %d", uc.Name, uc.UserPermissionLimits, uc.Expires)
	}
	account, err := os.ReadFile(filepath.Join(dir, "assent.jwt"))
	if err != nil {
		t.Fatal(err)
	}
	ac, err := jwt.DecodeAccountClaims(strings.TrimSpace(string(account)))
	if err != nil {
		t.Fatal(err)
	}
	scope, ok := ac.SigningKeys.GetScope(uc.Issuer)
	if !ok || scope == nil {
		t.Fatalf("agent coder's JWT is signed by %s, not a scoped signing key of the account", uc.Issuer)
	}
	if tmpl := scope.(*jwt.UserScope).Template; !tmpl.Pub.Allow.Contains("assent.request.{{name()}}") || tmpl.Pub.Allow.Contains("assent.decision.>") {
		t.Fatalf("the agents' scope: pub %v", tmpl.Pub.Allow)
	}

	// Credentials expire in 90 days unless told otherwise; 0 is never.
	for _, c := range []struct {
		flags []string
		want  time.Duration
	}{{nil, 90 * 24 * time.Hour}, {[]string{"--expires", "0"}, 0}} {
		code, out, errOut := run(t, append([]string{"creds", "approver", "alice", "--dir", dir}, c.flags...)...)
		if code != 0 {
			t.Fatalf("approver %q: %d %s", c.flags, code, errOut)
		}
		token, err := jwt.ParseDecoratedJWT([]byte(out))
		if err != nil {
			t.Fatal(err)
		}
		uc, err := jwt.DecodeUserClaims(token)
		if err != nil {
			t.Fatal(err)
		}
		switch got := time.Until(time.Unix(uc.Expires, 0)); {
		case c.want == 0 && uc.Expires != 0:
			t.Errorf("approver %q: expires %d, want never", c.flags, uc.Expires)
		case c.want != 0 && (got > c.want || got < c.want-time.Minute):
			t.Errorf("approver %q: expires in %s, want %s", c.flags, got, c.want)
		}
	}

	gwFile := filepath.Join(t.TempDir(), "gateway.creds")
	if code, _, errOut = run(t, "creds", "gateway", "desktop", "--agent", "claude-desktop", "--principal", "alice", "--dir", dir, "--out", gwFile); code != 0 || !strings.Contains(errOut, "gateway credentials for desktop written to "+gwFile) {
		t.Fatalf("gateway: %d %s", code, errOut)
	}
	data, _ = os.ReadFile(gwFile)
	if token, err = jwt.ParseDecoratedJWT(data); err != nil {
		t.Fatal(err)
	}
	if uc, err = jwt.DecodeUserClaims(token); err != nil {
		t.Fatal(err)
	}
	if !uc.Pub.Allow.Contains("assent.request.claude-desktop") || !uc.Pub.Allow.Contains("assent.response.alice.>") || !uc.Sub.Allow.Contains("assent.pending.claude-desktop") ||
		uc.Pub.Allow.Contains("assent.decision.>") || uc.Name != "gateway:desktop" || uc.Limits.Subs != 10000 {
		t.Fatalf("gateway desktop's JWT %s: pub %v, sub %v", uc.Name, uc.Pub.Allow, uc.Sub.Allow)
	}

	code, out, _ = run(t, "creds", "bot", "slack-bot", "--principals", "alice,bob", "--dir", dir)
	if code != 0 || !strings.Contains(out, "-----BEGIN NATS USER JWT-----") || !strings.Contains(out, "SEED") {
		t.Fatalf("bot to stdout: %d %s", code, out)
	}
	code, out, _ = run(t, "creds", "server-config", "--dir", dir, "--listen", "0.0.0.0:4222")
	if code != 0 || !strings.Contains(out, "type: full") || !strings.Contains(out, `listen: "0.0.0.0:4222"`) {
		t.Fatalf("server-config: %d %s", code, out)
	}

	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"creds", "agent", "coder"}, 2, "--dir"},
		{[]string{"creds", "agent", "co.der", "--dir", dir}, 1, "agent name"},
		{[]string{"creds", "bot", "b", "--dir", dir}, 1, "at least one"},
		{[]string{"creds", "gateway", "gw", "--dir", dir}, 2, "--agent"},
		{[]string{"creds", "gateway", "gw", "--agent", "a.b", "--dir", dir}, 1, "identity.agent"},
		{[]string{"creds", "gateway", "gw", "--agent", "coder", "--principal", "al ice", "--dir", dir}, 1, "principal"},
		{[]string{"creds", "approver", "alice", "--dir", t.TempDir()}, 1, "broker creds init --dir"},
		{[]string{"creds", "approver", "alice", "--dir", dir, "--expires", "-1h"}, 1, "0 for never"},
		{[]string{"creds", "init", "--dir", dir, "--max-storage", "lots"}, 1, "as in 50G"},
		{[]string{"creds", "server-config", "--dir", dir, "--resolver", "url"}, 1, "full or memory"},
		{[]string{"creds", "server-config", "--dir", dir, "--nats-tls-cert", "c.pem"}, 1, "both the certificate and its key"},
		{[]string{"creds", "server-config", "--dir", dir, "--cluster", "assent"}, 1, "route certificate"},
		{[]string{"creds", "server-config", "--dir", dir, "--cluster", "assent", "--route-cert", "a", "--route-key", "b", "--route-ca", "c", "--routes", "n2"}, 1, `route "n2"`},
		{[]string{"creds", "revoke", "agent:nobody", "--dir", dir}, 1, "broker creds list"},
		{[]string{"creds", "revoke", "UABC", "--dir", dir}, 1, "not a user's public key"},
		{[]string{"creds", "revoke", "--dir", dir}, 2, "WHO"},
	} {
		code, _, errOut := run(t, c.args...)
		if code != c.code || !strings.Contains(errOut, c.want) {
			t.Errorf("%q: exit %d, stderr %s; want %d and %q", c.args, code, errOut, c.code, c.want)
		}
	}
}

// TestCLIRevoke: `broker creds list` shows what was issued; `creds revoke
// ROLE:NAME` revokes it in the authority and pushes the account to the
// running server, which closes the revoked agent's connection at once;
// `--push=false` then `creds push` does the same in two steps; a server out
// of reach is reported with what to do.
func TestCLIRevoke(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "keys")
	if code, _, errOut := run(t, "creds", "init", "--dir", dir); code != 0 {
		t.Fatalf("init: %s", errOut)
	}
	a, err := creds.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	ns := testenv.OperatorServer(t, a.Embedded())
	connected := func(name string) (string, chan struct{}) {
		t.Helper()
		file := filepath.Join(t.TempDir(), name+".creds")
		if code, _, errOut := run(t, "creds", "agent", name, "--dir", dir, "--out", file); code != 0 {
			t.Fatalf("agent %s: %s", name, errOut)
		}
		closed := make(chan struct{})
		nc, err := nats.Connect(ns.ClientURL(), nats.UserCredentials(file), nats.NoReconnect(),
			nats.ClosedHandler(func(*nats.Conn) { close(closed) }), nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		return file, closed
	}
	gone := func(name string, closed chan struct{}) {
		t.Helper()
		select {
		case <-closed:
		case <-time.After(10 * time.Second):
			t.Fatalf("revoked agent %s is still connected", name)
		}
	}
	_, coderClosed := connected("coder")
	writerFile, writerClosed := connected("writer")
	code, out, _ := run(t, "creds", "list", "--dir", dir)
	if code != 0 || !strings.Contains(out, "agent  coder") || !strings.Contains(out, "valid until") {
		t.Fatalf("list: %d\n%s", code, out)
	}

	code, out, errOut := run(t, "creds", "revoke", "agent:coder", "--dir", dir, "--nats-url", ns.ClientURL())
	if code != 0 || !strings.Contains(out, "revoked U") || !strings.Contains(out, "pushed the account to "+ns.ClientURL()+": jwt updated") {
		t.Fatalf("revoke: %d\n%s%s", code, out, errOut)
	}
	gone("coder", coderClosed)
	select {
	case <-writerClosed:
		t.Fatal("revoking coder closed writer's connection")
	default:
	}

	if code, out, errOut = run(t, "creds", "revoke", writerFile, "--dir", dir, "--push=false"); code != 0 || strings.Contains(out, "pushed") {
		t.Fatalf("revoke without pushing: %d\n%s%s", code, out, errOut)
	}
	if code, out, errOut = run(t, "creds", "push", "--dir", dir, "--nats-url", ns.ClientURL()); code != 0 || !strings.Contains(out, "jwt updated") {
		t.Fatalf("push: %d\n%s%s", code, out, errOut)
	}
	gone("writer", writerClosed)
	if code, out, _ = run(t, "creds", "list", "--dir", dir); code != 0 || strings.Count(out, "revoked ") != 2 {
		t.Fatalf("list after revoking both: %d\n%s", code, out)
	}

	code, _, errOut = run(t, "creds", "push", "--dir", dir, "--nats-url", "nats://127.0.0.1:1")
	if code != 1 || !strings.Contains(errOut, "is the server running?") || !strings.Contains(errOut, "broker creds push") {
		t.Fatalf("push to nothing: %d %s", code, errOut)
	}
}

// TestCLIRotate: `broker creds rotate agent` replaces the agents' signing
// key and pushes the account: an agent the old key signed is cut off, one
// issued after works, and an approver (another key) is untouched.
func TestCLIRotate(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "keys")
	if code, _, errOut := run(t, "creds", "init", "--dir", dir); code != 0 {
		t.Fatalf("init: %s", errOut)
	}
	a, err := creds.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	ns := testenv.OperatorServer(t, a.Embedded())
	connect := func(role, name string) chan struct{} {
		t.Helper()
		file := filepath.Join(t.TempDir(), name+".creds")
		if code, _, errOut := run(t, "creds", role, name, "--dir", dir, "--out", file); code != 0 {
			t.Fatalf("%s %s: %s", role, name, errOut)
		}
		closed := make(chan struct{})
		nc, err := nats.Connect(ns.ClientURL(), nats.UserCredentials(file), nats.NoReconnect(),
			nats.ClosedHandler(func(*nats.Conn) { close(closed) }), nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
		if err != nil {
			t.Fatalf("%s %s: %v", role, name, err)
		}
		t.Cleanup(nc.Close)
		return closed
	}
	oldAgent, approver := connect("agent", "coder"), connect("approver", "alice")
	code, out, errOut := run(t, "creds", "rotate", "agent", "--dir", dir, "--nats-url", ns.ClientURL())
	if code != 0 || !strings.Contains(out, "issue agent credentials again") || !strings.Contains(out, "jwt updated") {
		t.Fatalf("rotate: %d\n%s%s", code, out, errOut)
	}
	select {
	case <-oldAgent:
	case <-time.After(10 * time.Second):
		t.Fatal("an agent signed by the old key is still connected")
	}
	connect("agent", "coder") // issued with the new key
	select {
	case <-approver:
		t.Fatal("rotating the agents' key cut off an approver")
	default:
	}
	if code, _, errOut = run(t, "creds", "rotate", "admin", "--dir", dir); code != 1 || !strings.Contains(errOut, "want one of broker, agent") {
		t.Fatalf("rotate admin: %d %s", code, errOut)
	}
}
