package terminal

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
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

// tmuxPane is the terminal approver running as a process of its own in a
// real terminal, tmux, sized 80x24, for principal alice.
type tmuxPane struct {
	t       *testing.T
	run     func(args ...string) (string, error)
	errFile string
}

func startTmux(t *testing.T, e *env) *tmuxPane {
	t.Helper()
	tmux := testenv.Program(t, "tmux", "tmux")
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
	return &tmuxPane{t: t, run: run, errFile: errFile}
}

// capture returns what the pane shows.
func (p *tmuxPane) capture() string {
	out, _ := p.run("capture-pane", "-p", "-t", "assent")
	return out
}

// wait waits until the pane shows every one of texts, and returns it.
func (p *tmuxPane) wait(texts ...string) string {
	p.t.Helper()
	deadline := time.Now().Add(patience)
	for {
		s := p.capture()
		ok := true
		for _, x := range texts {
			ok = ok && strings.Contains(s, x)
		}
		if ok {
			return s
		}
		if time.Now().After(deadline) {
			msg, _ := os.ReadFile(p.errFile)
			p.t.Fatalf("waiting for %q in the pane; it shows:\n%s\nhelper error: %s", texts, s, msg)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// keys types keys (tmux key names: Enter, Escape, End).
func (p *tmuxPane) keys(keys ...string) {
	p.t.Helper()
	if out, err := p.run(append([]string{"send-keys", "-t", "assent"}, keys...)...); err != nil {
		p.t.Fatalf("send-keys: %v: %s", err, out)
	}
}

// quit presses q and waits for the program to end.
func (p *tmuxPane) quit() {
	p.t.Helper()
	p.keys("q")
	deadline := time.Now().Add(patience)
	for {
		if _, err := p.run("has-session", "-t", "assent"); err != nil {
			break // the program quit, and its pane closed
		}
		if time.Now().After(deadline) {
			p.t.Fatalf("still running after q:\n%s", p.capture())
		}
		time.Sleep(100 * time.Millisecond)
	}
	if msg, err := os.ReadFile(p.errFile); err == nil {
		p.t.Fatalf("the terminal approver failed: %s", msg)
	}
}

// TestTmux runs the terminal approver as a process of its own in a real
// terminal, tmux, sized 80x24: the request shows in the pane, a approves it,
// q quits.
func TestTmux(t *testing.T) {
	e := newEnv(t)
	p := startTmux(t, e)
	p.wait("Pending approvals for alice", "principal alice")
	_, ch := e.ask(t, events.Requested{Tool: "restart", Agent: "coder", Hint: "Restart the API?"})
	p.wait("> restart", "Restart the API?", "1 pending")
	p.keys("a")
	if d := decision(t, ch); !d.Approved() || d.DecidedBy[0].Principal != "alice" || d.DecidedBy[0].Channel != "cli" {
		t.Fatalf("decision %+v", d)
	}
	p.wait("restart approved by alice via cli", "0 pending")
	p.quit()
}

// TestTmuxLongArgs: a long argument written first hides none of the others
// on an 80x24 screen. The list shows every key with its value's start and
// how much is left out; the detail view shows every key, a few lines of
// each value and "N more characters"; v shows the values whole.
func TestTmuxLongArgs(t *testing.T) {
	e := newEnv(t)
	p := startTmux(t, e)
	p.wait("Pending approvals for alice")
	body := strings.Repeat("Dear customer, please find your invoice attached. ", 65) + "Regards, Mallory."
	args := json.RawMessage(`{"body":"` + body + `","subject":"Your invoice","to":"mallory@evil.example"}`)
	_, ch := e.ask(t, events.Requested{Tool: "send_email", Agent: "coder", Hint: "Mails the invoice.", Args: args})

	list := p.wait("> send_email", "1 pending")
	for _, want := range []string{`body="Dear cus`, " more)", `subject="Your invoice"`, `to="mallory@evil.example"`} {
		if !strings.Contains(list, want) {
			t.Errorf("the list lacks %q:\n%s", want, list)
		}
	}

	p.keys("Enter")
	detail := p.wait("Request details", "Arguments")
	for _, want := range []string{"body", "Dear customer, please find", "subject", "Your invoice", "to", "mallory@evil.example", "Mails the invoice."} {
		if !strings.Contains(detail, want) {
			t.Errorf("the detail view lacks %q:\n%s", want, detail)
		}
	}
	if m := regexp.MustCompile(`(\d+) more characters`).FindStringSubmatch(detail); m == nil {
		t.Errorf("the detail view does not say how much of body it leaves out:\n%s", detail)
	} else if n, _ := strconv.Atoi(m[1]); n < 3000 || n >= len(body) {
		t.Errorf("the detail view leaves out %d characters of %d", n, len(body))
	}
	if strings.Contains(detail, "Regards, Mallory.") {
		t.Errorf("the detail view shows the whole body before v:\n%s", detail)
	}

	p.keys("v")
	p.wait("whole values (v folds them)")
	p.keys("End")
	whole := p.wait("Regards, Mallory.")
	if strings.Contains(whole, "more characters") {
		t.Errorf("v still folds a value:\n%s", whole)
	}
	p.keys("Escape")
	p.wait("> send_email")
	p.keys("a")
	if d := decision(t, ch); !d.Approved() {
		t.Fatalf("decision %+v", d)
	}
	p.quit()
}
