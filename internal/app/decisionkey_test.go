package app_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nats-io/nkeys"

	"github.com/assent-dev/assent/internal/app"
)

// TestDecisionKeyNew: "broker decision-key new --out FILE" writes an account
// seed readable by its owner only, prints its public key, and never
// overwrites a key; ReadDecisionKey reads it back.
func TestDecisionKeyNew(t *testing.T) {
	file := filepath.Join(t.TempDir(), "decision.nk")
	run := func(args ...string) (int, string, string) {
		var stdout, stderr bytes.Buffer
		code := app.CLI{Stdout: &stdout, Stderr: &stderr}.Run(context.Background(), args)
		return code, stdout.String(), stderr.String()
	}
	code, out, errOut := run("decision-key", "new", "--out", file)
	if code != app.ExitOK {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	pub := strings.TrimSpace(out)
	if !nkeys.IsValidPublicAccountKey(pub) {
		t.Fatalf("printed %q, want an account public key", out)
	}
	info, err := os.Stat(file)
	if err != nil {
		t.Fatal(err)
	}
	if info.Mode().Perm() != 0o600 {
		t.Errorf("seed file mode %v, want 0600", info.Mode().Perm())
	}
	seed, _ := os.ReadFile(file)
	if !bytes.HasPrefix(seed, []byte("SA")) || strings.Contains(out+errOut, strings.TrimSpace(string(seed))) {
		t.Errorf("the seed file holds %.2q..., or the seed was printed", seed)
	}
	kp, err := app.ReadDecisionKey(file)
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := kp.PublicKey(); got != pub {
		t.Errorf("the file's key is %s, the command printed %s", got, pub)
	}

	if code, _, errOut := run("decision-key", "new", "--out", file); code != app.ExitFailed || !strings.Contains(errOut, "exists") {
		t.Errorf("over an existing key: exit %d: %s", code, errOut)
	}
	if again, _ := os.ReadFile(file); !bytes.Equal(again, seed) {
		t.Error("an existing key was overwritten")
	}
	if code, _, _ := run("decision-key", "new"); code != app.ExitUsage {
		t.Errorf("without --out: exit %d", code)
	}
	if code, _, _ := run("decision-key"); code != app.ExitUsage {
		t.Errorf("without a command: exit %d", code)
	}

	user, _ := nkeys.CreateUser()
	userSeed, _ := user.Seed()
	userFile := filepath.Join(t.TempDir(), "user.nk")
	if err := os.WriteFile(userFile, userSeed, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := app.ReadDecisionKey(userFile); err == nil {
		t.Error("ReadDecisionKey took a user seed")
	}
	if _, err := app.ReadDecisionKey(filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Error("ReadDecisionKey read a missing file")
	}
}
