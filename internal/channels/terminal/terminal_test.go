package terminal

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/charmbracelet/x/ansi"
	"github.com/creack/pty"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/assent-dev/assent/internal/broker"
	"github.com/assent-dev/assent/internal/brokertest"
	"github.com/assent-dev/assent/internal/channels"
	"github.com/assent-dev/assent/internal/testenv"
	"github.com/assent-dev/assent/pkg/events"
	"github.com/assent-dev/assent/pkg/handler"
	"github.com/assent-dev/assent/pkg/policy"
)

// patience bounds every wait of these tests.
const patience = 20 * time.Second

// testPolicy: alice and bob are in ops, erin is the CFO. Wires need the
// CFO; deploys may be remembered per session; payroll needs two of ops;
// pages go to alice, then escalate to bob; everything else needs ops.
const testPolicy = `version: 1
principals:
  alice: {roles: [ops]}
  bob:   {roles: [ops]}
  erin:  {roles: [cfo]}
rules:
  - name: wires
    tools: [wire]
    action: require_approval
    approvers: ["role:cfo"]
  - name: deploys
    tools: [deploy]
    action: require_approval
    approvers: ["role:ops"]
    remember_scopes: [session]
    max_remember: 1h
  - name: payroll
    tools: [payroll]
    action: require_approval
    approvers: ["role:ops"]
    quorum: 2
  - name: oncall
    tools: [page]
    action: require_approval
    approvers: [alice]
    timeout: 30s
    escalation:
      - after: 1s
        approvers: [bob]
        extend: 30s
  - name: ops
    tools: ["*"]
    action: require_approval
    approvers: ["role:ops"]
    rememberable: false
`

// env is a NATS server with a broker on it, an agent, and the policy.
type env struct {
	ns     *testenv.NATS
	dir    *channels.Directory
	agent  *handler.Client
	js     jetstream.JetStream
	stream jetstream.Stream
}

func newEnv(t *testing.T) *env {
	t.Helper()
	p, err := policy.Parse([]byte(testPolicy), "terminal.yaml")
	if err != nil {
		t.Fatal(err)
	}
	ns := testenv.Server(t)
	brokertest.Run(t, testenv.Conn(t, ns), broker.Config{Policy: p})
	agent, err := handler.NewClient(testenv.Conn(t, ns), handler.Config{Agent: "coder"})
	if err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(testenv.Conn(t, ns))
	if err != nil {
		t.Fatal(err)
	}
	stream, err := js.Stream(testCtx(t), events.StreamName)
	if err != nil {
		t.Fatal(err)
	}
	return &env{ns: ns, dir: channels.NewDirectory(p), agent: agent, js: js, stream: stream}
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	t.Cleanup(cancel)
	return ctx
}

// result is what an agent's Request returned.
type result struct {
	d   handler.Decision
	err error
}

// ask makes a request as the agent would, in a goroutine; the decision
// arrives on the returned channel. The request is withdrawn when the test
// ends.
func (e *env) ask(t *testing.T, req events.Requested) (string, <-chan result) {
	t.Helper()
	if req.Timeout == 0 {
		req.Timeout = events.Duration(2 * time.Minute)
	}
	id := events.NewID()
	ctx, cancel := context.WithCancel(context.Background())
	ch := make(chan result, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		d, err := e.agent.Request(ctx, handler.Request{ID: id, Requested: req})
		ch <- result{d, err}
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return id, ch
}

// decision waits for the agent's decision.
func decision(t *testing.T, ch <-chan result) handler.Decision {
	t.Helper()
	select {
	case r := <-ch:
		if r.err != nil {
			t.Fatalf("request: %v", r.err)
		}
		return r.d
	case <-time.After(patience):
		t.Fatal("the agent got no decision")
	}
	return handler.Decision{}
}

// waitPending waits until the broker has published request id's pending
// event.
func (e *env) waitPending(t *testing.T, id string) {
	t.Helper()
	deadline := time.Now().Add(patience)
	for time.Now().Before(deadline) {
		m, err := e.stream.GetLastMsgForSubject(testCtx(t), events.PendingPrefix+"coder")
		if err == nil && bytes.Contains(m.Data, []byte(id)) {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("request %s is not pending after %s", id, patience)
}

// tui is the terminal approver running in a pseudo-terminal.
type tui struct {
	t    *testing.T
	ptmx *os.File
	done chan error
	stop func()

	mu      sync.Mutex
	raw     bytes.Buffer
	scr     *screen
	changed chan struct{}
}

// start runs the terminal approver for o in an 80x24 pseudo-terminal.
func (e *env) start(t *testing.T, o Options) *tui {
	t.Helper()
	ptmx, tty, err := pty.Open()
	if err != nil {
		t.Fatalf("open a pseudo-terminal: %v", err)
	}
	if err := pty.Setsize(ptmx, &pty.Winsize{Rows: 24, Cols: 80}); err != nil {
		t.Fatal(err)
	}
	if o.NATS == nil {
		o.NATS = testenv.Conn(t, e.ns)
	}
	if o.Principal == "" {
		o.Principal = "alice"
	}
	o.In, o.Out = tty, tty
	if o.Editor == "" {
		o.Editor = "false" // no editor in tests, unless one is given
	}
	u := &tui{t: t, ptmx: ptmx, done: make(chan error, 1), scr: newScreen(80, 24), changed: make(chan struct{}, 1)}
	ctx, cancel := context.WithCancel(context.Background())
	go func() { u.done <- Run(ctx, o) }()
	read := make(chan struct{})
	go func() {
		defer close(read)
		buf := make([]byte, 4096)
		for {
			n, err := ptmx.Read(buf)
			if n > 0 {
				u.mu.Lock()
				u.raw.Write(buf[:n])
				u.scr.write(buf[:n])
				u.mu.Unlock()
				select {
				case u.changed <- struct{}{}:
				default:
				}
			}
			if err != nil {
				return
			}
		}
	}()
	var once sync.Once
	u.stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-u.done:
				if err != nil {
					t.Errorf("Run: %v", err)
				}
				u.done <- nil
			case <-time.After(patience):
				t.Errorf("Run did not return %s after its context ended", patience)
			}
			tty.Close()
			ptmx.Close()
			<-read
		})
	}
	t.Cleanup(u.stop)
	return u
}

// resize changes the terminal's size and tells the program, as a terminal
// emulator does.
func (u *tui) resize(cols, rows int) {
	u.t.Helper()
	u.mu.Lock()
	u.scr = newScreen(cols, rows) // the program repaints it all
	u.mu.Unlock()
	if err := pty.Setsize(u.ptmx, &pty.Winsize{Rows: uint16(rows), Cols: uint16(cols)}); err != nil {
		u.t.Fatal(err)
	}
	if err := syscall.Kill(os.Getpid(), syscall.SIGWINCH); err != nil {
		u.t.Fatal(err)
	}
}

// screen returns what the terminal shows.
func (u *tui) screen() string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.scr.String()
}

// output returns everything the program wrote, escape sequences included.
func (u *tui) output() string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.raw.String()
}

// waitFor waits until cond holds for the screen.
func (u *tui) waitFor(what string, cond func(screen string) bool) string {
	u.t.Helper()
	deadline := time.After(patience)
	for {
		s := u.screen()
		if cond(s) {
			return s
		}
		select {
		case <-u.changed:
		case <-time.After(100 * time.Millisecond):
		case err := <-u.done:
			u.done <- err
			u.t.Fatalf("waiting for %s: Run returned %v; the screen:\n%s", what, err, s)
		case <-deadline:
			u.t.Fatalf("waiting for %s: not after %s; the screen:\n%s", what, patience, s)
		}
	}
}

// waitText waits until every one of texts is on the screen.
func (u *tui) waitText(texts ...string) string {
	u.t.Helper()
	return u.waitFor(fmt.Sprintf("%q on the screen", texts), func(s string) bool {
		for _, x := range texts {
			if !strings.Contains(s, x) {
				return false
			}
		}
		return true
	})
}

// waitGone waits until text is not on the screen.
func (u *tui) waitGone(text string) string {
	u.t.Helper()
	return u.waitFor(fmt.Sprintf("%q gone from the screen", text), func(s string) bool { return !strings.Contains(s, text) })
}

// waitOutput waits until text is in the output, escape sequences removed;
// it sees text that was on the screen only briefly.
func (u *tui) waitOutput(text string) {
	u.t.Helper()
	u.waitFor(fmt.Sprintf("%q in the output", text), func(string) bool { return strings.Contains(ansi.Strip(u.output()), text) })
}

// press types keys.
func (u *tui) press(keys ...string) {
	u.t.Helper()
	for _, k := range keys {
		if _, err := u.ptmx.Write([]byte(k)); err != nil {
			u.t.Fatalf("type %q: %v", k, err)
		}
	}
}

// Keys as a terminal sends them.
const (
	keyEnter = "\r"
	keyEsc   = "\x1b"
	keyDown  = "\x1b[B"
	keyUp    = "\x1b[A"
	keyKill  = "\x15" // ctrl+u: delete to the start of the line
)

// quit presses q and waits for Run to return.
func (u *tui) quit() {
	u.t.Helper()
	u.press("q")
	select {
	case err := <-u.done:
		if err != nil {
			u.t.Fatalf("Run after q: %v", err)
		}
		u.done <- nil
	case <-time.After(patience):
		u.t.Fatalf("Run did not return after q; the screen:\n%s", u.screen())
	}
}

// checkNoLeaks fails if goroutines running this package's code (tests
// aside) outlive Run.
func checkNoLeaks(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		buf := make([]byte, 1<<20)
		buf = buf[:runtime.Stack(buf, true)]
		var leaked []string
		for _, g := range strings.Split(string(buf), "\n\n") {
			if strings.Contains(g, "/internal/channels/terminal/") && !strings.Contains(g, "_test.go") {
				leaked = append(leaked, g)
			}
		}
		if len(leaked) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("goroutines left running after Run returned:\n%s", strings.Join(leaked, "\n\n"))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestApprove: a request an agent makes appears in the list with its tool,
// agent, user, hint, time left, level and rule; a approves it, the agent gets
// the approval as alice via cli, and the request leaves the list with a
// notice. q quits, leaving nothing running.
func TestApprove(t *testing.T) {
	e := newEnv(t)
	u := e.start(t, Options{Directory: e.dir})
	u.waitText("Pending approvals for alice", "Nothing waits for an answer", "0 pending", "principal alice", "connected")

	_, ch := e.ask(t, events.Requested{Tool: "restart", Args: json.RawMessage(`{"service":"api"}`), Agent: "coder", User: "carol", Hint: "Restart the API?"})
	s := u.waitText("restart", "coder", "carol", "Restart the API?", "ops", "1 pending")
	if !regexp.MustCompile(`> restart +coder +carol +[12]m\d\ds +0 +ops`).MatchString(s) {
		t.Fatalf("the request's row is not as expected:\n%s", s)
	}
	u.press("a")
	d := decision(t, ch)
	if !d.Approved() || d.Edited || len(d.DecidedBy) != 1 || d.DecidedBy[0].Principal != "alice" || d.DecidedBy[0].Channel != "cli" {
		t.Fatalf("decision %+v", d)
	}
	u.waitText("restart approved by alice via cli", "Nothing waits for an answer", "0 pending")

	// The terminal announces alice on the cli channel while it runs.
	kv, err := e.js.KeyValue(testCtx(t), events.PresenceBucket)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Get(testCtx(t), "alice.cli"); err != nil {
		t.Fatalf("alice is not announced on cli: %v", err)
	}
	u.quit()
	checkNoLeaks(t)
	if _, err := kv.Get(testCtx(t), "alice.cli"); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatalf("alice is still announced after quitting: %v", err)
	}
}

// TestDenyWithReason: d asks for a reason; the agent gets the denial with it.
func TestDenyWithReason(t *testing.T) {
	e := newEnv(t)
	u := e.start(t, Options{Directory: e.dir})
	_, ch := e.ask(t, events.Requested{Tool: "drop_table", Args: json.RawMessage(`{"table":"users"}`)})
	u.waitText("drop_table")
	u.press("d")
	u.waitText("Deny this request?", "Reason:", `Args: table="users"`)
	u.press("not on a friday")
	u.waitText("> not on a friday")
	u.press(keyEnter)
	d := decision(t, ch)
	if d.Outcome != events.Denied || d.Reason != "not on a friday" || d.DecidedBy[0].Principal != "alice" || d.DecidedBy[0].Channel != "cli" {
		t.Fatalf("decision %+v", d)
	}
	u.waitText("drop_table denied by alice via cli: not on a friday")
}

// TestEditArgs: e opens the arguments in the editor; the edit is shown as a
// diff and, once confirmed, is what the agent is told to run.
func TestEditArgs(t *testing.T) {
	e := newEnv(t)
	dir := t.TempDir()
	editor := filepath.Join(dir, "editor.sh")
	// The editor checks it got the arguments, then rewrites them.
	script := `#!/bin/sh
grep -q '"path": "/srv/reports/q3.csv"' "$1" || exit 3
printf '{"path": "/srv/reports/q3-draft.csv", "dry_run": true}\n' > "$1"
`
	if err := os.WriteFile(editor, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	u := e.start(t, Options{Directory: e.dir, Editor: editor})
	_, ch := e.ask(t, events.Requested{Tool: "delete_file", Args: json.RawMessage(`{"path":"/srv/reports/q3.csv"}`)})
	u.waitText("delete_file")
	u.press("e")
	u.waitText("Approve with edited arguments?", `+   "dry_run": true,`, `-   "path": "/srv/reports/q3.csv"`, `+   "path": "/srv/reports/q3-draft.csv"`)
	u.press("y")
	d := decision(t, ch)
	if !d.Approved() || !d.Edited || d.DecidedBy[0].Channel != "cli" {
		t.Fatalf("decision %+v", d)
	}
	var args map[string]any
	if err := json.Unmarshal(d.Args, &args); err != nil || args["path"] != "/srv/reports/q3-draft.csv" || args["dry_run"] != true || len(args) != 2 {
		t.Fatalf("the agent is told to run %s (%v)", d.Args, err)
	}
	if err := d.VerifyArgs(); err != nil {
		t.Fatal(err)
	}
	u.waitText("delete_file approved with edited arguments by alice via cli")
}

// TestEditRefused: an edit that is not a JSON object is not sent, and says
// what to do; so is an edit that changes nothing.
func TestEditRefused(t *testing.T) {
	e := newEnv(t)
	dir := t.TempDir()
	broken := filepath.Join(dir, "broken.sh")
	if err := os.WriteFile(broken, []byte("#!/bin/sh\nprintf '[1, 2]' > \"$1\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	u := e.start(t, Options{Directory: e.dir, Editor: broken})
	id, _ := e.ask(t, events.Requested{Tool: "delete_file", Args: json.RawMessage(`{"path":"/srv/a"}`)})
	u.waitText("delete_file")
	u.press("e")
	u.waitText("not a JSON object", "nothing was sent")
	if _, err := e.stream.GetLastMsgForSubject(testCtx(t), "assent.response.alice."+id); !errors.Is(err, jetstream.ErrMsgNotFound) {
		t.Fatalf("an answer was sent for a broken edit: %v", err)
	}
	u.waitText("1 pending")
}

// TestDecidedElsewhere: a request answered by someone else leaves the list
// with a notice naming who, and the prompt open for it is withdrawn.
func TestDecidedElsewhere(t *testing.T) {
	e := newEnv(t)
	u := e.start(t, Options{Directory: e.dir})
	id, ch := e.ask(t, events.Requested{Tool: "scale_up", Args: json.RawMessage(`{"replicas":5}`)})
	u.waitText("> scale_up")
	_, other := e.ask(t, events.Requested{Tool: "rotate_keys"})
	u.waitText("rotate_keys", "2 pending")
	u.press("d") // the first stays selected: start denying it
	u.waitText("Deny this request?", `Args: replicas=5`)
	if err := handler.Answer(testCtx(t), e.js, "bob", id, events.Responded{Decision: events.Approve, Channel: "slack"}); err != nil {
		t.Fatal(err)
	}
	if d := decision(t, ch); !d.Approved() || d.DecidedBy[0].Principal != "bob" {
		t.Fatalf("decision %+v", d)
	}
	s := u.waitText("scale_up approved by bob via slack", "Withdrawn: scale_up approved by bob via slack", "1 pending")
	if strings.Contains(s, "Deny this request?") || strings.Contains(s, "> scale_up") {
		t.Fatalf("the prompt or the request is still shown:\n%s", s)
	}
	// The list goes on with the other request, selected.
	u.waitText("> rotate_keys")
	u.press("a")
	if d := decision(t, other); !d.Approved() || d.DecidedBy[0].Principal != "alice" {
		t.Fatalf("decision %+v", d)
	}
}

// TestPendingBeforeStart: requests pending before the terminal started are
// listed; those decided before are not.
func TestPendingBeforeStart(t *testing.T) {
	e := newEnv(t)
	decided, dch := e.ask(t, events.Requested{Tool: "old_news"})
	e.waitPending(t, decided)
	if err := handler.Answer(testCtx(t), e.js, "bob", decided, events.Responded{Decision: events.Deny, Channel: "web"}); err != nil {
		t.Fatal(err)
	}
	decision(t, dch)
	waiting, ch := e.ask(t, events.Requested{Tool: "migrate_db", Hint: "Run the migration?"})
	e.waitPending(t, waiting)

	u := e.start(t, Options{Directory: e.dir})
	s := u.waitText("migrate_db", "Run the migration?", "1 pending")
	if strings.Contains(s, "old_news") {
		t.Fatalf("a decided request is listed:\n%s", s)
	}
	u.press("a")
	if d := decision(t, ch); !d.Approved() {
		t.Fatalf("decision %+v", d)
	}
}

// TestIneligible: a request alice may not answer is shown with the reason,
// answering it is refused on the spot with nothing sent, and h hides it.
func TestIneligible(t *testing.T) {
	e := newEnv(t)
	u := e.start(t, Options{Directory: e.dir})
	id, _ := e.ask(t, events.Requested{Tool: "wire", Args: json.RawMessage(`{"amount":5000}`)})
	u.waitText("wire", "not yours: only role:cfo may answer", "1 pending, 1 not yours")
	for _, k := range []string{"a", "d", "e", "s", "r"} {
		u.press(k)
		u.waitText("You may not answer wire", "Nothing was sent")
		u.press("j") // clears the message
		u.waitGone("You may not answer wire")
	}
	if _, err := e.stream.GetLastMsgForSubject(testCtx(t), "assent.response.alice."+id); !errors.Is(err, jetstream.ErrMsgNotFound) {
		t.Fatalf("an answer was sent for an ineligible request: %v", err)
	}
	if _, ok, err := e.agent.Decision(testCtx(t), id); err != nil || ok {
		t.Fatalf("the request was decided: %v %v", ok, err)
	}
	u.press("h")
	s := u.waitText("1 pending, 1 not yours (hidden; h shows)", "press h to show")
	if strings.Contains(s, "wire") {
		t.Fatalf("a hidden request is shown:\n%s", s)
	}
	u.press("h")
	u.waitText("not yours: only role:cfo may answer")
}

// TestSelfApproval: without a policy, the terms the broker sent still stop
// a principal from answering a request made for them.
func TestSelfApproval(t *testing.T) {
	e := newEnv(t)
	u := e.start(t, Options{}) // no directory
	id, _ := e.ask(t, events.Requested{Tool: "restart", User: "alice"})
	u.waitText("restart", "your own request")
	u.press("a")
	u.waitText("You may not answer restart", "self-approval")
	if _, err := e.stream.GetLastMsgForSubject(testCtx(t), "assent.response.alice."+id); !errors.Is(err, jetstream.ErrMsgNotFound) {
		t.Fatalf("an answer was sent: %v", err)
	}
}

// TestStructuredAnswer: a request with a response schema is approved with a
// payload checked against the schema before it is sent.
func TestStructuredAnswer(t *testing.T) {
	e := newEnv(t)
	u := e.start(t, Options{Directory: e.dir})
	schema := `{"type":"object","required":["env"],"properties":{"env":{"type":"string","enum":["prod","staging"]}}}`
	id, ch := e.ask(t, events.Requested{Tool: "release", ResponseSchema: json.RawMessage(schema), Hint: "Which environment?"})
	u.waitText("release")
	u.press("a") // approving needs the answer
	u.waitText("Answer the request's question", `env (string, required): one of "prod", "staging"`, `> {"env": ""}`)
	u.press(keyKill, `{"env":"qa"}`)
	u.waitText(`> {"env":"qa"}`)
	u.press(keyEnter)
	u.waitText("Does not fit the schema")
	if _, err := e.stream.GetLastMsgForSubject(testCtx(t), "assent.response.alice."+id); !errors.Is(err, jetstream.ErrMsgNotFound) {
		t.Fatalf("an answer that does not fit was sent: %v", err)
	}
	u.press(keyKill, `{"env":"prod"}`)
	u.waitText(`> {"env":"prod"}`)
	u.press(keyEnter)
	d := decision(t, ch)
	if !d.Approved() || string(d.Payload) != `{"env":"prod"}` {
		t.Fatalf("decision %+v, payload %s", d, d.Payload)
	}
}

// TestRemember: r offers the scopes the rule allows; the remembered
// approval decides the next request of the session by itself.
func TestRemember(t *testing.T) {
	e := newEnv(t)
	u := e.start(t, Options{Directory: e.dir})
	_, ch := e.ask(t, events.Requested{Tool: "deploy", Session: "s-42", Args: json.RawMessage(`{"ref":"v1"}`)})
	u.waitText("deploy")
	u.press("r")
	u.waitText("Reuse the answer for later requests of deploy", "> session  in session s-42", "Kept for 1h0m0s")
	u.press("a")
	if d := decision(t, ch); !d.Approved() || d.DecidedBy[0].Principal != "alice" {
		t.Fatalf("decision %+v", d)
	}
	_, next := e.ask(t, events.Requested{Tool: "deploy", Session: "s-42", Args: json.RawMessage(`{"ref":"v2"}`)})
	if d := decision(t, next); !d.Approved() || !d.Auto || !strings.HasPrefix(d.Rule, "remembered:") {
		t.Fatalf("the next request was not decided by the remembered answer: %+v", d)
	}

	// A rule that does not allow it says so.
	_, _ = e.ask(t, events.Requested{Tool: "restart"})
	u.waitText("> restart", "1 pending")
	u.press("r")
	u.waitText("may not be remembered")
}

// TestDetails: enter shows the request in full: each argument on its own
// line, the schema, the terms; esc returns to the list.
func TestDetails(t *testing.T) {
	e := newEnv(t)
	u := e.start(t, Options{Directory: e.dir})
	_, _ = e.ask(t, events.Requested{Tool: "deploy", Session: "s-1", CallID: "call-7", Labels: map[string]string{"env": "prod"},
		Args: json.RawMessage(`{"ref":"v1","targets":["a","b"]}`), ResponseSchema: json.RawMessage(`{"type":"object"}`)})
	u.waitText("deploy")
	u.press(keyEnter)
	u.waitText("Request details", "  ref      v1", `  targets  ["a","b"]`, "Response schema", "call-7", "env=prod",
		"quorum 1, may be remembered (session, up to 1h0m0s)")
	u.press(keyEsc)
	u.waitText("Pending approvals")
	u.press("?")
	u.waitText("Keys", "edit the arguments in $EDITOR", "Editor: false")
	u.press("x")
	u.waitText("Pending approvals")
}

// TestWaitingForBroker: an answer that does not decide (a quorum of two,
// or one the broker refuses, which it does not report on NATS) leaves the
// request listed as sent and waiting for the broker.
func TestWaitingForBroker(t *testing.T) {
	e := newEnv(t)
	u := e.start(t, Options{}) // no policy here: the broker judges
	id, ch := e.ask(t, events.Requested{Tool: "payroll", Args: json.RawMessage(`{"month":"2026-11"}`)})
	u.waitText("payroll")
	u.press("e")
	u.waitText("needs 2 approvals of the same call")
	u.press("a")
	u.waitText("sent; waiting for the broker", "1 pending")
	if err := handler.Answer(testCtx(t), e.js, "bob", id, events.Responded{Decision: events.Approve, Channel: "slack"}); err != nil {
		t.Fatal(err)
	}
	if d := decision(t, ch); !d.Approved() || len(d.DecidedBy) != 2 {
		t.Fatalf("decision %+v", d)
	}
	u.waitText("payroll approved by alice via cli, bob via slack", "0 pending")

	// Only the CFO may answer wires: the broker refuses alice's answer.
	wire, _ := e.ask(t, events.Requested{Tool: "wire"})
	u.waitText("> wire")
	u.press("a")
	u.waitText("> wire", "sent; waiting for the broker", "1 pending")
	if _, err := e.stream.GetLastMsgForSubject(testCtx(t), "assent.response.alice."+wire); err != nil {
		t.Fatalf("the answer was not sent: %v", err)
	}
	if _, ok, err := e.agent.Decision(testCtx(t), wire); err != nil || ok {
		t.Fatalf("the request was decided: %v %v", ok, err)
	}
}

// TestEscalation: an escalation updates the request's level and deadline
// in place.
func TestEscalation(t *testing.T) {
	e := newEnv(t)
	u := e.start(t, Options{Directory: e.dir})
	_, ch := e.ask(t, events.Requested{Tool: "page", Agent: "coder"})
	row := regexp.MustCompile(`> page +coder +- +(\d+s|1m\d\ds) +1 +oncall`)
	u.waitFor("the request at level 1", row.MatchString)
	s := u.screen()
	if m := regexp.MustCompile(`> page +coder +- +(\d+)s +1`).FindStringSubmatch(s); m != nil {
		if n, _ := strconv.Atoi(m[1]); n <= 30 {
			t.Fatalf("the deadline did not move out with the escalation:\n%s", s)
		}
	}
	u.press("a")
	if d := decision(t, ch); !d.Approved() {
		t.Fatalf("decision %+v", d)
	}
}

// TestResize: the screen follows the terminal's size.
func TestResize(t *testing.T) {
	e := newEnv(t)
	u := e.start(t, Options{Directory: e.dir})
	_, _ = e.ask(t, events.Requested{Tool: "restart", Hint: strings.Repeat("long hint ", 11) + "END"})
	s := u.waitText("restart", "long hint")
	if strings.Contains(s, "END") {
		t.Fatalf("a line wider than 80 columns is shown whole:\n%s", s)
	}
	u.resize(120, 30)
	s = u.waitText("END")
	lines := strings.Split(s, "\n")
	if len(lines) != 30 || !strings.Contains(lines[29], "a approve") {
		t.Fatalf("the screen does not fill 120x30:\n%s", s)
	}
}

// TestReconnect: the list goes on across a restart of the NATS server.
func TestReconnect(t *testing.T) {
	e := newEnv(t)
	u := e.start(t, Options{Directory: e.dir})
	_, before := e.ask(t, events.Requested{Tool: "before_restart"})
	u.waitText("before_restart", "connected")
	e.ns = e.ns.Restart(t)
	_, after := e.ask(t, events.Requested{Tool: "after_restart"})
	u.waitText("> before_restart", "after_restart", "2 pending", "connected")
	u.press("a")
	if d := decision(t, before); !d.Approved() || d.DecidedBy[0].Channel != "cli" {
		t.Fatalf("decision %+v", d)
	}
	u.waitText("> after_restart", "1 pending")
	u.press("a")
	if d := decision(t, after); !d.Approved() || d.DecidedBy[0].Channel != "cli" {
		t.Fatalf("decision %+v", d)
	}
	u.waitText("0 pending")
}

// TestNoColor: with NO_COLOR set nothing is colored (the selection and the
// messages stay legible through markers and words); without it, colors are
// used.
func TestNoColor(t *testing.T) {
	t.Setenv("TERM", "xterm-256color")
	t.Setenv("COLORTERM", "")
	t.Setenv("CI", "") // termenv gives no colors on a CI machine
	colored := regexp.MustCompile(`\x1b\[([0-9;]*)m`)
	hasColor := func(out string) bool {
		for _, m := range colored.FindAllStringSubmatch(out, -1) {
			for _, p := range strings.Split(m[1], ";") {
				var n int
				fmt.Sscan(p, &n)
				if (n >= 30 && n <= 38) || (n >= 40 && n <= 48) || (n >= 90 && n <= 97) || (n >= 100 && n <= 107) {
					return true
				}
			}
		}
		return false
	}
	e := newEnv(t)
	for _, noColor := range []bool{false, true} {
		t.Run(fmt.Sprintf("NO_COLOR=%v", noColor), func(t *testing.T) {
			if noColor {
				t.Setenv("NO_COLOR", "1")
			}
			u := e.start(t, Options{Directory: e.dir})
			u.waitText("principal alice", "connected")
			u.quit()
			if got := hasColor(u.output()); got == noColor {
				t.Fatalf("colors in the output: %v, want %v", got, !noColor)
			}
		})
	}
}

// TestStartErrors: Run refuses bad options and a server without the
// stream, saying what to do, before it touches the terminal.
func TestStartErrors(t *testing.T) {
	ns := testenv.Server(t) // no broker: no stream
	nc := testenv.Conn(t, ns)
	closed := testenv.Conn(t, ns)
	closed.Close()
	_, tty, err := pty.Open()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tty.Close() })
	notTTY, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { notTTY.Close() })
	for _, c := range []struct {
		name string
		o    Options
		want []string
	}{
		{"nothing", Options{In: tty, Out: tty}, []string{"no NATS connection", "--principal"}},
		{"closed", Options{NATS: closed, Principal: "alice", In: tty, Out: tty}, []string{"connection is closed"}},
		{"bad names", Options{NATS: nc, Principal: "al ice", Agents: []string{"a.b"}, In: tty, Out: tty}, []string{"--principal", "--agent"}},
		{"not a principal", Options{NATS: nc, Principal: "mallory", Directory: newDirectory(t), In: tty, Out: tty}, []string{`"mallory" is not in the policy`, "alice, bob, erin"}},
		{"not a terminal", Options{NATS: nc, Principal: "alice", In: notTTY, Out: io.Discard}, []string{"not a terminal"}},
		{"no stream", Options{NATS: nc, Principal: "alice", In: tty, Out: tty}, []string{"no stream ASSENT", "start the broker"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := Run(testCtx(t), c.o)
			if err == nil {
				t.Fatal("Run succeeded")
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
		})
	}
}

func newDirectory(t *testing.T) *channels.Directory {
	t.Helper()
	p, err := policy.Parse([]byte(testPolicy), "terminal.yaml")
	if err != nil {
		t.Fatal(err)
	}
	return channels.NewDirectory(p)
}

func TestLineDiff(t *testing.T) {
	for _, c := range []struct{ a, b, want string }{
		{"x y z", "x y z", "  x|  y|  z"},
		{"x y z", "x z", "  x|- y|  z"},
		{"x z", "x y z", "  x|+ y|  z"},
		{"a b", "c d", "- a|- b|+ c|+ d"},
		{"", "a", "- |+ a"},
	} {
		got := strings.Join(lineDiff(strings.Split(c.a, " "), strings.Split(c.b, " ")), "|")
		if got != c.want {
			t.Errorf("diff %q %q = %q, want %q", c.a, c.b, got, c.want)
		}
	}
}

func TestLeft(t *testing.T) {
	for d, want := range map[time.Duration]string{
		-time.Second:                    "0s",
		1500 * time.Millisecond:         "1s",
		59 * time.Second:                "59s",
		4*time.Minute + 5*time.Second:   "4m05s",
		2*time.Hour + 3*time.Minute:     "2h03m",
		3*24*time.Hour + 4*time.Hour:    "3d04h",
		time.Hour - time.Nanosecond:     "59m59s",
		24*time.Hour - time.Millisecond: "23h59m",
	} {
		if got := left(d); got != want {
			t.Errorf("left(%s) = %q, want %q", d, got, want)
		}
	}
}

func TestCheckPayload(t *testing.T) {
	schema := json.RawMessage(`{"type":"object","required":["n"],"properties":{"n":{"type":"integer"}}}`)
	for _, c := range []struct {
		text, problem string
	}{
		{`{"n": 3}`, ""},
		{``, "Type the answer"},
		{`{"n": `, "Not JSON"},
		{`{"n": "3"}`, "Does not fit the schema"},
		{`{}`, "Does not fit the schema"},
	} {
		_, problem := checkPayload(schema, c.text)
		if (c.problem == "") != (problem == "") || !strings.Contains(problem, c.problem) {
			t.Errorf("checkPayload(%q) = %q, want %q", c.text, problem, c.problem)
		}
	}
	if got := payloadTemplate(schema); got != `{"n": 0}` {
		t.Errorf("template %q", got)
	}
}

// TestArgsLine: the list's line of arguments names every key, in the order
// written, in the width it has: short values whole, long ones cut with how
// much is left out, and when even that is too wide, the keys alone.
func TestArgsLine(t *testing.T) {
	long := strings.Repeat("x", 500)
	for _, c := range []struct {
		args  string
		width int
		want  string
	}{
		{``, 40, ""},
		{`{}`, 40, ""},
		{`{"a":1,"b":"two"}`, 40, `a=1 b="two"`},
		{`{"body":"` + long + `","to":"m@x.example"}`, 50, `body="xxxxxxxxxxxxxx…"(486 more) to="m@x.example"`},
		{`{"s":"line one\nline two"}`, 40, `s="line one…"(9 more)`},
		{`{"a":"` + long + `","b":"` + long + `","c":"` + long + `","d":1}`, 50, `4 args: a b c d`},
		{`{"alpha":"` + long + `","beta":"` + long + `","gamma":"` + long + `","delta":1}`, 30, `4 args: alpha beta +2 (enter)`},
		{`{"k\u202e":"v\u001b"}`, 40, `k\u202e="v\x1b"`},
		{`[1,2]`, 40, `[1,2]`},
	} {
		got := argsLine(json.RawMessage(c.args), c.width)
		if got != c.want {
			t.Errorf("argsLine(%.40q, %d) = %q, want %q", c.args, c.width, got, c.want)
		}
		if w := ansi.StringWidth(got); w > c.width {
			t.Errorf("argsLine(%.40q, %d) is %d cells wide", c.args, c.width, w)
		}
	}
}
