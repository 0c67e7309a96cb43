package terminal

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/assent-dev/assent/internal/testenv"
	"github.com/assent-dev/assent/pkg/events"
)

// The test binary doubles as the terminal approver for TestTmux: with
// helperEnv set it runs Run on its own terminal instead of the tests.
const (
	helperEnv       = "ASSENT_TERMINAL_HELPER"
	helperNATS      = "ASSENT_TERMINAL_NATS"
	helperPrincipal = "ASSENT_TERMINAL_PRINCIPAL"
	helperErr       = "ASSENT_TERMINAL_ERRFILE"
)

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) != "" {
		os.Exit(helperMain())
	}
	os.Exit(m.Run())
}

// helperMain runs the terminal approver on stdin and stdout, as
// `approver-bot cli` would, writing an error to the file helperErr names.
func helperMain() int {
	fail := func(err error) int {
		_ = os.WriteFile(os.Getenv(helperErr), []byte(err.Error()), 0o600)
		return 1
	}
	nc, err := nats.Connect(os.Getenv(helperNATS))
	if err != nil {
		return fail(err)
	}
	defer nc.Close()
	if err := Run(context.Background(), Options{NATS: nc, Principal: os.Getenv(helperPrincipal)}); err != nil {
		return fail(err)
	}
	return 0
}

// shellQuote quotes s for sh.
func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// TestTmux runs the terminal approver as a process of its own in a real
// terminal, tmux, sized 80x24: the request shows in the pane, a approves it,
// q quits.
func TestTmux(t *testing.T) {
	tmux := testenv.Program(t, "tmux", "tmux")
	e := newEnv(t)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	sock, errFile := filepath.Join(dir, "tmux.sock"), filepath.Join(dir, "error")
	run := func(args ...string) (string, error) {
		out, err := exec.Command(tmux, append([]string{"-S", sock, "-f", os.DevNull}, args...)...).CombinedOutput()
		return string(out), err
	}
	cmdline := fmt.Sprintf("env %s=1 %s=%s %s=alice %s=%s TERM=xterm-256color %s",
		helperEnv, helperNATS, shellQuote(e.ns.ClientURL()), helperPrincipal, helperErr, shellQuote(errFile), shellQuote(exe))
	if out, err := run("new-session", "-d", "-s", "assent", "-x", "80", "-y", "24", cmdline); err != nil {
		t.Fatalf("start tmux: %v: %s", err, out)
	}
	t.Cleanup(func() { _, _ = run("kill-server") })
	pane := func() string {
		out, _ := run("capture-pane", "-p", "-t", "assent")
		return out
	}
	waitPane := func(texts ...string) {
		t.Helper()
		deadline := time.Now().Add(patience)
		for {
			s := pane()
			ok := true
			for _, x := range texts {
				ok = ok && strings.Contains(s, x)
			}
			if ok {
				return
			}
			if time.Now().After(deadline) {
				msg, _ := os.ReadFile(errFile)
				t.Fatalf("waiting for %q in the pane; it shows:\n%s\nhelper error: %s", texts, s, msg)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}

	waitPane("Pending approvals for alice", "principal alice")
	_, ch := e.ask(t, events.Requested{Tool: "restart", Agent: "coder", Hint: "Restart the API?"})
	waitPane("> restart", "Restart the API?", "1 pending")
	if out, err := run("send-keys", "-t", "assent", "a"); err != nil {
		t.Fatalf("send-keys: %v: %s", err, out)
	}
	if d := decision(t, ch); !d.Approved() || d.DecidedBy[0].Principal != "alice" || d.DecidedBy[0].Channel != "cli" {
		t.Fatalf("decision %+v", d)
	}
	waitPane("restart approved by alice via cli", "0 pending")
	if out, err := run("send-keys", "-t", "assent", "q"); err != nil {
		t.Fatalf("send-keys: %v: %s", err, out)
	}
	deadline := time.Now().Add(patience)
	for {
		if _, err := run("has-session", "-t", "assent"); err != nil {
			break // the program quit, and its pane closed
		}
		if time.Now().After(deadline) {
			t.Fatalf("still running after q:\n%s", pane())
		}
		time.Sleep(100 * time.Millisecond)
	}
	if msg, err := os.ReadFile(errFile); err == nil {
		t.Fatalf("the terminal approver failed: %s", msg)
	}
}
