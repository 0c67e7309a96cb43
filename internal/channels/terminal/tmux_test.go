package terminal

import (
	"context"
	"encoding/json"
	"errors"
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
	"github.com/nats-io/nats.go/jetstream"

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
// real terminal, tmux, sized 80x24, for principal alice; startTmux starts
// it with environ (KEY=value) added to its environment.
type tmuxPane struct {
	t       *testing.T
	run     func(args ...string) (string, error)
	errFile string
}

func startTmux(t *testing.T, e *env, environ ...string) *tmuxPane {
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
	extra := ""
	for _, kv := range environ {
		extra += shellQuote(kv) + " "
	}
	cmdline := fmt.Sprintf("env %s=1 %s=%s %s=alice %s=%s TERM=xterm-256color %s%s",
		helperEnv, helperNATS, shellQuote(e.ns.ClientURL()), helperPrincipal, helperErr, shellQuote(errFile), extra, shellQuote(exe))
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

// TestTmuxEditBreaksInputSchema: edited arguments that break the request's
// input_schema are checked before anything is sent, as the broker checks
// them: the edit view says why, with the diff, and y sends nothing; the
// edit is kept for e, and arguments that fit approve.
func TestTmuxEditBreaksInputSchema(t *testing.T) {
	e := newEnv(t)
	dir := t.TempDir()
	typed, editor := filepath.Join(dir, "typed.json"), filepath.Join(dir, "editor.sh")
	// The editor writes what the test typed in it.
	if err := os.WriteFile(editor, []byte("#!/bin/sh\ncp "+shellQuote(typed)+" \"$1\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	typeArgs := func(text string) {
		t.Helper()
		if err := os.WriteFile(typed, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	p := startTmux(t, e, "VISUAL="+editor)
	p.wait("Pending approvals for alice")
	schema := json.RawMessage(`{"type":"object","properties":{"disk":{"type":"string"},"size_gb":{"type":"integer","minimum":1}},"required":["disk","size_gb"],"additionalProperties":false}`)
	id, ch := e.ask(t, events.Requested{Tool: "resize_disk", Agent: "coder", Args: json.RawMessage(`{"disk":"db-1","size_gb":100}`), InputSchema: schema})
	p.wait("> resize_disk", "1 pending")

	typeArgs(`{"disk": "db-1", "size_gb": "200"}`)
	p.keys("e")
	screen := p.wait("Edited arguments refused by the input schema", "/size_gb: got string, want", `+   "size_gb": "200"`, "e edit again")
	if strings.Contains(screen, "y approve") {
		t.Fatalf("the refused edit offers to approve:\n%s", screen)
	}
	p.keys("y")
	p.wait("These arguments cannot be sent")
	if _, err := e.stream.GetLastMsgForSubject(testCtx(t), "assent.response.alice."+id); !errors.Is(err, jetstream.ErrMsgNotFound) {
		t.Fatalf("an answer was sent for an edit the schema refuses: %v", err)
	}

	typeArgs(`{"disk": "db-1", "size_gb": 200}`)
	p.keys("e")
	p.wait("Approve with edited arguments?", `+   "size_gb": 200`, "y approve these arguments")
	p.keys("y")
	r := decision(t, ch)
	if !r.Approved() || !r.Edited || string(r.Args) != `{"disk":"db-1","size_gb":200}` {
		t.Fatalf("decision %+v", r)
	}
	p.wait("resize_disk approved with edited arguments by alice via cli")
	p.quit()
}
