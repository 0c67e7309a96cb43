package app_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nats-io/jwt/v2"
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
	if !uc.Pub.Allow.Contains("assent.request.coder") || uc.Pub.Allow.Contains("assent.decision.>") || uc.Expires == 0 {
		t.Fatalf("agent coder's JWT: pub %v, expires %d", uc.Pub.Allow, uc.Expires)
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
		uc.Pub.Allow.Contains("assent.decision.>") || uc.Name != "gateway:desktop" {
		t.Fatalf("gateway desktop's JWT %s: pub %v, sub %v", uc.Name, uc.Pub.Allow, uc.Sub.Allow)
	}

	code, out, _ = run(t, "creds", "bot", "slack-bot", "--principals", "alice,bob", "--dir", dir)
	if code != 0 || !strings.Contains(out, "-----BEGIN NATS USER JWT-----") || !strings.Contains(out, "SEED") {
		t.Fatalf("bot to stdout: %d %s", code, out)
	}
	code, out, _ = run(t, "creds", "server-config", "--dir", dir, "--listen", "0.0.0.0:4222")
	if code != 0 || !strings.Contains(out, "resolver: MEMORY") || !strings.Contains(out, `listen: "0.0.0.0:4222"`) {
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
	} {
		code, _, errOut := run(t, c.args...)
		if code != c.code || !strings.Contains(errOut, c.want) {
			t.Errorf("%q: exit %d, stderr %s; want %d and %q", c.args, code, errOut, c.code, c.want)
		}
	}
}
