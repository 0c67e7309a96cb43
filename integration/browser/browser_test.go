package browser

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/assent-dev/assent/integration/itest"
	"github.com/assent-dev/assent/internal/app"
	"github.com/assent-dev/assent/internal/authtest"
	"github.com/assent-dev/assent/internal/testenv"
	"github.com/assent-dev/assent/pkg/events"
	"github.com/assent-dev/assent/pkg/handler"
)

// screenshots, when set, is a directory the browser tests save the pages
// they see to (docs/img is made this way):
//
//	go test ./integration/browser -run TestBrowser -screenshots ../../docs/img
var screenshots = flag.String("screenshots", "", "directory to save the browser tests' screenshots to")

const browserPolicy = `version: 1
mode: manual
defaults:
  timeout: 10m
principals:
  alice: {email: test-user@zitadel.ch, roles: [ops]}
  bob:   {email: test-user2@zitadel.ch, roles: [ops]}
rules:
  - name: payments
    tools: [wire_money]
    action: require_approval
    approvers: [bob]
  - name: changes
    tools: ["*"]
    action: require_approval
    approvers: ["role:ops"]
    remember_scopes: [session]
    max_remember: 8h
`

// chromium returns the browser the tests drive.
func chromium(t testing.TB) string {
	t.Helper()
	return testenv.Program(t, "chromium", "chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
}

// browserEnv is the whole broker process with OIDC sign-in against a real
// OpenID provider, an agent on NATS, and a browser.
type browserEnv struct {
	url    string
	nc     *nats.Conn
	js     jetstream.JetStream
	agent  *handler.Client
	ctx    context.Context // the browser tab
	shots  int
	dialog chan string // messages of the JavaScript dialogs accepted
}

func newBrowserEnv(t testing.TB) *browserEnv {
	t.Helper()
	return newBrowserEnvWith(t, true)
}

// newBrowserEnvWith is newBrowserEnv, without --auth when signIn is false:
// the pages then ask for a name to answer as.
func newBrowserEnvWith(t testing.TB, signIn bool) *browserEnv {
	t.Helper()
	exe := chromium(t)
	// The broker's address is fixed before it starts: the provider must know
	// where to send people back to.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	httpAddr := ln.Addr().String()
	ln.Close()
	ours := "http://" + httpAddr

	dir := t.TempDir()
	pol, authFile := filepath.Join(dir, "policy.yaml"), filepath.Join(dir, "auth.yaml")
	files := map[string]string{pol: browserPolicy}
	if signIn {
		issuer := authtest.StartOP(t, ours+"/auth/callback")
		files[authFile] = "oidc:\n  issuer: " + issuer + "\n  client_id: assent\n  client_secret: s3cret\n  redirect_url: " + ours + "/auth/callback\n"
	} else {
		authFile = ""
	}
	for file, data := range files {
		if err := os.WriteFile(file, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	addrs := itest.StartApp(t, app.Options{NATSListen: "127.0.0.1:0", DataDir: filepath.Join(dir, "data"), HTTPListen: httpAddr, PolicyFile: pol, AuthFile: authFile})

	nc, err := nats.Connect(addrs.NATS)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	agent, err := handler.NewClient(nc, handler.Config{Agent: "coder"})
	if err != nil {
		t.Fatal(err)
	}
	e := &browserEnv{url: ours, nc: nc, js: itest.NewJS(t, nc), agent: agent, dialog: make(chan string, 8)}

	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(exe), chromedp.NoSandbox, chromedp.DisableGPU, chromedp.WindowSize(1280, 900),
		chromedp.Flag("headless", "new"))
	actx, cancelA := chromedp.NewExecAllocator(context.Background(), opts...)
	t.Cleanup(cancelA)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(cancel)
	chromedp.ListenTarget(ctx, func(ev any) {
		if d, ok := ev.(*page.EventJavascriptDialogOpening); ok {
			e.dialog <- d.Message
			go func() { _ = chromedp.Run(ctx, page.HandleJavaScriptDialog(true)) }()
		}
	})
	e.ctx = ctx
	// The first Run starts the browser, which lives as long as its context:
	// e.ctx, not one with a deadline.
	if err := chromedp.Run(ctx); err != nil {
		t.Fatalf("start %s: %v", exe, err)
	}
	return e
}

// run runs browser actions, failing the test (with what it was doing) if
// they fail or take longer than patience.
//
// A page that changes under an action (a navigation, a card replaced by its
// new version) can leave it holding a node that no longer exists; the
// actions are then run again, so each run is written to be safe to repeat.
func (e *browserEnv) run(t testing.TB, what string, actions ...chromedp.Action) {
	t.Helper()
	ctx, cancel := context.WithTimeout(e.ctx, itest.Patience)
	defer cancel()
	var err error
	for range 5 {
		if err = chromedp.Run(ctx, actions...); err == nil || !stale(err) {
			break
		}
	}
	if err != nil {
		var loc, html string
		_ = chromedp.Run(e.ctx, chromedp.Location(&loc), chromedp.OuterHTML("html", &html, chromedp.ByQuery))
		if len(html) > 40000 {
			html = html[:40000] + "…"
		}
		t.Fatalf("%s: %v (at %s)\n%s", what, err, loc, html)
	}
}

// stale reports whether err is about a node that left the page.
func stale(err error) bool {
	msg := err.Error()
	return strings.Contains(msg, "No node with given id") || strings.Contains(msg, "Could not find node") ||
		strings.Contains(msg, "Cannot find context with specified id") || strings.Contains(msg, "node not found")
}

// shot saves a screenshot as name.png when -screenshots is given.
func (e *browserEnv) shot(t *testing.T, name string) {
	t.Helper()
	if *screenshots == "" {
		return
	}
	var png []byte
	// From the top: a sticky header stays where a window scrolled down had
	// it, in the middle of a screenshot of the whole page.
	e.run(t, "screenshot "+name, chromedp.Evaluate(`window.scrollTo(0, 0)`, nil), chromedp.Sleep(300*time.Millisecond), chromedp.FullScreenshot(&png, 100))
	if err := os.WriteFile(filepath.Join(*screenshots, name+".png"), png, 0o644); err != nil {
		t.Fatal(err)
	}
}

// ask sends a request as the agent would, and returns its id and where its
// decision will arrive.
func (e *browserEnv) ask(t *testing.T, req events.Requested) (string, <-chan handler.Decision) {
	t.Helper()
	id := events.NewID()
	out := make(chan handler.Decision, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*itest.Patience)
		defer cancel()
		d, err := e.agent.Request(ctx, handler.Request{ID: id, Requested: req})
		if err != nil {
			d.Reason = "error: " + err.Error()
		}
		out <- d
	}()
	return id, out
}

// decided waits for the agent's decision.
func decided(t *testing.T, ch <-chan handler.Decision) handler.Decision {
	t.Helper()
	select {
	case d := <-ch:
		if strings.HasPrefix(d.Reason, "error: ") {
			t.Fatal(d.Reason)
		}
		return d
	case <-time.After(2 * itest.Patience):
		t.Fatal("the agent got no decision")
	}
	return handler.Decision{}
}

// signIn signs in through the provider's own form, as alice, and returns who
// the page then says is signed in.
func (e *browserEnv) signIn(t testing.TB) string {
	t.Helper()
	var who string
	e.run(t, "open the broker", chromedp.Navigate(e.url+"/"), chromedp.WaitVisible(`a.button`, chromedp.ByQuery))
	e.run(t, "go to the provider", chromedp.Click(`a.button`, chromedp.ByQuery))
	e.run(t, "fill in the provider's form",
		chromedp.WaitVisible(`#username`, chromedp.ByQuery),
		chromedp.SetValue(`#username`, "test-user@127.0.0.1", chromedp.ByQuery),
		chromedp.SetValue(`#password`, "verysecure", chromedp.ByQuery))
	e.run(t, "send it", chromedp.Submit(`#password`, chromedp.ByQuery))
	e.run(t, "back, signed in", chromedp.WaitVisible(`.me`, chromedp.ByQuery), chromedp.Text(`.me`, &who, chromedp.ByQuery))
	return who
}

func card(id string) string { return "#r-" + id }

// TestBrowser drives the web UI in Chromium as an approver would: sign in
// through a real OpenID provider, watch an agent's request arrive without a
// reload, approve with edited arguments, deny with a reason, give a
// structured answer, approve a whole session, see a request answered
// elsewhere resolve, use the keyboard, and the page on a phone.
func TestBrowser(t *testing.T) {
	e := newBrowserEnv(t)

	ran := false
	signedIn := t.Run("sign-in", func(t *testing.T) {
		ran = true
		if who := e.signIn(t); who != "alice" {
			t.Fatalf("signed in as %q, want alice", who)
		}
	})
	if !signedIn {
		t.FailNow()
	}
	if !ran { // -run chose other subtests: they still need a session
		if who := e.signIn(t); who != "alice" {
			t.Fatalf("signed in as %q, want alice", who)
		}
	}

	t.Run("arrives-live-and-edit-args", func(t *testing.T) {
		e.run(t, "open the pending page", chromedp.Navigate(e.url+"/"), chromedp.WaitVisible(`#conn[data-state="live"]`, chromedp.ByQuery))
		id, got := e.ask(t, events.Requested{Tool: "delete_file", Session: "s-edit", Args: json.RawMessage(`{"path":"/srv/releases/2026-10","recursive":true}`)})
		var diff string
		e.run(t, "edit the arguments",
			chromedp.WaitVisible(card(id), chromedp.ByQuery),
			chromedp.Click(card(id)+` [data-act="edit"]`, chromedp.ByQuery),
			chromedp.WaitVisible(card(id)+` .args-edit`, chromedp.ByQuery),
			chromedp.SetValue(card(id)+` .args-edit`, `{"path": "/srv/releases/2026-10", "recursive": false}`, chromedp.ByQuery),
			chromedp.Evaluate(fmt.Sprintf(`document.querySelector(%q).dispatchEvent(new Event("input", {bubbles: true}))`, card(id)+" .args-edit"), nil),
			chromedp.WaitVisible(card(id)+` .diff .add`, chromedp.ByQuery),
			chromedp.Text(card(id)+` .diff`, &diff, chromedp.ByQuery),
		)
		if !strings.Contains(diff, `"recursive": false`) || !strings.Contains(diff, `"recursive": true`) {
			t.Fatalf("diff does not show the change:\n%s", diff)
		}
		e.shot(t, "edit-args")
		e.run(t, "approve with the edits", chromedp.Click(card(id)+` .edit-panel button[type="submit"]`, chromedp.ByQuery))
		e.run(t, "see it approved", chromedp.WaitVisible(card(id)+` .outcome.approved`, chromedp.ByQuery))
		e.notUnsent(t, id)
		d := decided(t, got)
		if !d.Approved() || !d.Edited || string(d.Args) != `{"path":"/srv/releases/2026-10","recursive":false}` || d.DecidedBy[0].Principal != "alice" || d.DecidedBy[0].Channel != "web" {
			t.Fatalf("the agent got %+v", d)
		}
	})

	t.Run("edit-args-breaks-input-schema", func(t *testing.T) {
		// The broker refuses edited arguments that break the request's
		// input_schema: the page says why next to the edit box, and the
		// form stays open with the edit, to be fixed and sent again.
		schema := json.RawMessage(`{"type":"object","properties":{"disk":{"type":"string"},"size_gb":{"type":"integer","minimum":1}},"required":["disk","size_gb"],"additionalProperties":false}`)
		id, got := e.ask(t, events.Requested{Tool: "resize_disk", Args: json.RawMessage(`{"disk":"db-1","size_gb":100}`), InputSchema: schema})
		bad := `{"disk": "db-1", "size_gb": "200"}`
		edit := func(text string) chromedp.Tasks {
			return chromedp.Tasks{
				chromedp.SetValue(card(id)+` .args-edit`, text, chromedp.ByQuery),
				chromedp.Evaluate(fmt.Sprintf(`document.querySelector(%q).dispatchEvent(new Event("input", {bubbles: true}))`, card(id)+" .args-edit"), nil),
			}
		}
		e.run(t, "edit the arguments", chromedp.Navigate(e.url+"/"), chromedp.WaitVisible(card(id), chromedp.ByQuery),
			chromedp.Click(card(id)+` [data-act="edit"]`, chromedp.ByQuery), chromedp.WaitVisible(card(id)+` .args-edit`, chromedp.ByQuery),
			edit(bad), chromedp.WaitVisible(card(id)+` .diff .add`, chromedp.ByQuery))
		var msg, kept, invalid string
		var open bool
		e.run(t, "approve with them, and be refused",
			chromedp.Click(card(id)+` .edit-panel button[type="submit"]`, chromedp.ByQuery),
			chromedp.WaitVisible(card(id)+` .edit-panel .error`, chromedp.ByQuery),
			chromedp.Text(card(id)+` .edit-panel .error`, &msg, chromedp.ByQuery),
			chromedp.Value(card(id)+` .args-edit`, &kept, chromedp.ByQuery),
			chromedp.AttributeValue(card(id)+` .args-edit`, "aria-invalid", &invalid, nil, chromedp.ByQuery),
			chromedp.Evaluate(fmt.Sprintf(`!document.querySelector(%q).hidden && !document.querySelector(%q)`, card(id)+" .edit-panel", card(id)+" .outcome"), &open))
		if !strings.Contains(msg, "/size_gb: got string, want integer") || strings.Contains(msg, "invalid input") {
			t.Fatalf("the form says %q; want the schema's words, without the broker's prefix", msg)
		}
		if kept != bad || invalid != "true" || !open {
			t.Fatalf("after the refusal: edit %q (want %q kept), aria-invalid %q, form open and request pending: %v", kept, bad, invalid, open)
		}
		e.shot(t, "edit-args-schema")
		e.run(t, "fix it and approve", edit(`{"disk": "db-1", "size_gb": 200}`),
			chromedp.WaitNotVisible(card(id)+` .edit-panel .error`, chromedp.ByQuery),
			chromedp.Click(card(id)+` .edit-panel button[type="submit"]`, chromedp.ByQuery),
			chromedp.WaitVisible(card(id)+` .outcome.approved`, chromedp.ByQuery))
		e.notUnsent(t, id)
		if d := decided(t, got); !d.Approved() || !d.Edited || string(d.Args) != `{"disk":"db-1","size_gb":200}` {
			t.Fatalf("the agent got %+v", d)
		}
	})

	t.Run("deny-with-reason", func(t *testing.T) {
		id, got := e.ask(t, events.Requested{Tool: "drop_table", Args: json.RawMessage(`{"table":"users"}`)})
		e.run(t, "write why",
			chromedp.WaitVisible(card(id), chromedp.ByQuery),
			chromedp.Click(card(id)+` [data-act="deny"]`, chromedp.ByQuery),
			chromedp.WaitVisible(card(id)+` .reason`, chromedp.ByQuery),
			chromedp.SetValue(card(id)+` .reason`, "not on a Friday", chromedp.ByQuery))
		e.run(t, "deny", chromedp.Click(card(id)+` .deny-panel button[type="submit"]`, chromedp.ByQuery))
		e.run(t, "see it denied", chromedp.WaitVisible(card(id)+` .outcome.denied`, chromedp.ByQuery))
		e.notUnsent(t, id)
		if d := decided(t, got); d.Approved() || d.Reason != "not on a Friday" {
			t.Fatalf("the agent got %+v", d)
		}
	})

	t.Run("structured-answer", func(t *testing.T) {
		schema := json.RawMessage(`{"type":"object","properties":{"priority":{"type":"string","enum":["low","high"]},"pages":{"type":"integer"},"notify":{"type":"boolean"}},"required":["priority"]}`)
		id, got := e.ask(t, events.Requested{Tool: "write_report", Args: json.RawMessage(`{"title":"Q4"}`), ResponseSchema: schema})
		e.run(t, "open the form", chromedp.WaitVisible(card(id), chromedp.ByQuery), chromedp.Click(card(id)+` [data-act="answer"]`, chromedp.ByQuery))
		e.run(t, "see the form", chromedp.WaitVisible(card(id)+` .answer-panel select`, chromedp.ByQuery))
		e.run(t, "choose", chromedp.SetValue(card(id)+` .answer-panel select`, "high", chromedp.ByQuery))
		e.run(t, "type", chromedp.SetValue(card(id)+` .answer-panel input[type="number"]`, "12", chromedp.ByQuery))
		e.run(t, "tick", chromedp.Click(card(id)+` .answer-panel input[type="checkbox"]`, chromedp.ByQuery))
		e.shot(t, "structured-answer")
		e.run(t, "send it", chromedp.Click(card(id)+` .answer-panel button[type="submit"]`, chromedp.ByQuery))
		e.run(t, "see it approved", chromedp.WaitVisible(card(id)+` .outcome.approved`, chromedp.ByQuery))
		d := decided(t, got)
		var payload map[string]any
		if err := json.Unmarshal(d.Payload, &payload); err != nil || payload["priority"] != "high" || payload["pages"] != float64(12) || payload["notify"] != true {
			t.Fatalf("payload %s (%v), decision %+v", d.Payload, err, d)
		}
	})

	t.Run("approve-a-session", func(t *testing.T) {
		var ids []string
		var gots []<-chan handler.Decision
		for i := range 3 {
			id, got := e.ask(t, events.Requested{Tool: "write_file", Session: "s-batch", Args: json.RawMessage(fmt.Sprintf(`{"path":"/tmp/%d"}`, i))})
			ids, gots = append(ids, id), append(gots, got)
		}
		e.run(t, "see the session", chromedp.Navigate(e.url+"/"), chromedp.WaitVisible(card(ids[2]), chromedp.ByQuery), chromedp.WaitVisible(`.session[data-session="s-batch"]`, chromedp.ByQuery))
		e.shot(t, "pending")
		e.run(t, "approve all", chromedp.Click(`button[data-batch="approve"][data-session="s-batch"]`, chromedp.ByQuery))
		e.run(t, "see them approved", chromedp.WaitVisible(card(ids[0])+` .outcome.approved`, chromedp.ByQuery), chromedp.WaitVisible(card(ids[2])+` .outcome.approved`, chromedp.ByQuery))
		select {
		case msg := <-e.dialog:
			if !strings.Contains(msg, "s-batch") {
				t.Fatalf("confirmation %q does not name the session", msg)
			}
		default:
			t.Fatal("approving a whole session asked for no confirmation")
		}
		for i, got := range gots {
			if d := decided(t, got); !d.Approved() {
				t.Fatalf("request %d: %+v", i, d)
			}
		}
	})

	t.Run("decided-elsewhere-resolves", func(t *testing.T) {
		id, got := e.ask(t, events.Requested{Tool: "restart_service", Args: json.RawMessage(`{"name":"api"}`)})
		e.run(t, "see it", chromedp.Navigate(e.url+"/"), chromedp.WaitVisible(card(id), chromedp.ByQuery))
		ctx, cancel := itest.OpCtx()
		defer cancel()
		if err := handler.Answer(ctx, e.js, "bob", id, events.Responded{Decision: events.Approve, Channel: "slack"}); err != nil {
			t.Fatal(err)
		}
		var outcome string
		e.run(t, "see it resolve", chromedp.WaitVisible(card(id)+` .outcome.approved`, chromedp.ByQuery), chromedp.Text(card(id)+` .outcome`, &outcome, chromedp.ByQuery))
		if !strings.Contains(outcome, "bob") || !strings.Contains(outcome, "slack") {
			t.Fatalf("outcome %q does not say who answered where", outcome)
		}
		decided(t, got)
		e.run(t, "it leaves the page", chromedp.WaitNotPresent(card(id), chromedp.ByQuery))
	})

	t.Run("not-eligible-and-reload", func(t *testing.T) {
		// A payment asked on alice's behalf is hers to see, not to answer;
		// one of someone else's she neither sees nor may answer.
		other, _ := e.ask(t, events.Requested{Tool: "wire_money", Args: json.RawMessage(`{"amount":200}`)})
		id, _ := e.ask(t, events.Requested{Tool: "wire_money", User: "alice", Args: json.RawMessage(`{"amount":100}`)})
		var why string
		var buttons, others int
		e.run(t, "see it", chromedp.Navigate(e.url+"/"), chromedp.WaitVisible(card(id), chromedp.ByQuery), chromedp.Reload(), chromedp.WaitVisible(card(id)+` .whynot`, chromedp.ByQuery),
			chromedp.Text(card(id)+` .whynot`, &why, chromedp.ByQuery),
			chromedp.Evaluate(fmt.Sprintf(`document.querySelectorAll(%q).length`, card(id)+" .actions button"), &buttons),
			chromedp.Evaluate(fmt.Sprintf(`document.querySelectorAll(%q).length`, card(other)), &others))
		if buttons != 0 || !strings.Contains(why, "not an approver") {
			t.Fatalf("alice may not answer a payment: %d buttons, %q", buttons, why)
		}
		if others != 0 {
			t.Fatalf("alice sees a payment she may neither answer nor was asked on behalf of")
		}
		ctx, cancel := itest.OpCtx()
		defer cancel()
		for _, id := range []string{id, other} {
			if err := e.agent.Cancel(ctx, id, "test over"); err != nil {
				t.Fatal(err)
			}
		}
	})

	t.Run("keyboard", func(t *testing.T) {
		// The first card is decided while the page shows it: it stays a
		// moment to be read, and j passes over it to the open one.
		// The page's script listens for keys once it runs: the live marker
		// says it has (a card alone may show before, on a busy machine).
		// The second request arrives live, after the first on the page.
		first, _ := e.ask(t, events.Requested{Tool: "restart_service", Args: json.RawMessage(`{"name":"cache"}`)})
		e.run(t, "see the first", chromedp.Navigate(e.url+"/"), chromedp.WaitVisible(card(first), chromedp.ByQuery), chromedp.WaitVisible(`#conn[data-state="live"]`, chromedp.ByQuery))
		id, got := e.ask(t, events.Requested{Tool: "rotate_keys", Args: json.RawMessage(`{"service":"db"}`)})
		e.run(t, "see the second", chromedp.WaitVisible(card(first)+` ~ `+card(id), chromedp.ByQuery))
		ctx, cancel := itest.OpCtx()
		defer cancel()
		if err := e.agent.Cancel(ctx, first, "no longer needed"); err != nil {
			t.Fatal(err)
		}
		e.run(t, "see the first resolve", chromedp.WaitVisible(card(first)+`.resolved`, chromedp.ByQuery))
		// The key is handled by the time KeyEvent returns: look at once, not
		// after the decided card has left the page (and j with it).
		var selected string
		e.run(t, "select the open one with j", chromedp.KeyEvent("j"), chromedp.Evaluate(`document.querySelector("article.card.selected")?.id ?? ""`, &selected))
		if selected != card(id)[1:] {
			t.Fatalf("j selected %q, want the open request %s", selected, card(id)[1:])
		}
		e.run(t, "approve it with a", chromedp.KeyEvent("a"))
		e.run(t, "see it approved", chromedp.WaitVisible(card(id)+` .outcome.approved`, chromedp.ByQuery))
		if d := decided(t, got); !d.Approved() {
			t.Fatalf("%+v", d)
		}
		var open bool
		e.run(t, "help", chromedp.KeyEvent("?"), chromedp.Evaluate(`document.getElementById("help").open`, &open))
		if !open {
			t.Fatal("? does not open the shortcuts")
		}
		e.run(t, "close help", chromedp.KeyEvent("\x1b"))
	})

	t.Run("history-and-detail", func(t *testing.T) {
		var rows int
		e.run(t, "history", chromedp.Navigate(e.url+"/history"), chromedp.WaitVisible(`table.history`, chromedp.ByQuery),
			chromedp.Evaluate(`document.querySelectorAll("table.history tbody tr").length`, &rows))
		if rows < 7 {
			t.Fatalf("history shows %d decisions, want at least 7", rows)
		}
		e.shot(t, "history")
		var steps int
		e.run(t, "open a request", chromedp.Click(`table.history tbody tr a`, chromedp.ByQuery))
		e.run(t, "its page", chromedp.WaitVisible(`.timeline`, chromedp.ByQuery),
			chromedp.Evaluate(`document.querySelectorAll(".timeline li.step").length`, &steps))
		if steps < 3 {
			t.Fatalf("timeline has %d steps, want requested, pending and decided at least", steps)
		}
		e.shot(t, "detail")
	})

	t.Run("arguments-schema", func(t *testing.T) {
		schema := json.RawMessage(`{"type":"object","properties":{` +
			`"path":{"type":"string","description":"The note to delete, relative to the sandbox. <b>Not</b> a directory."},` +
			`"recursive":{"type":"boolean","description":"Delete a directory and everything in it."},` +
			`"mode":{"enum":["trash","purge"],"title":"How","description":"Move to the trash, or delete for good."},` +
			`"tags":{"type":"array","items":{"type":"string"}}},"required":["path"],"additionalProperties":false}`)
		id, _ := e.ask(t, events.Requested{Tool: "delete_file", Session: "s-mcp", Args: json.RawMessage(`{"path":"notes/q3.md","mode":"trash"}`),
			Hint: "Delete a note: Delete one note.\nMCP tool fs__delete_file of server fs.", InputSchema: schema,
			Labels: map[string]string{"mcp_server": "fs"}})
		var collapsed bool
		var rows int
		var cell string
		e.run(t, "see it", chromedp.Navigate(e.url+"/"), chromedp.WaitVisible(card(id), chromedp.ByQuery))
		e.run(t, "its page", chromedp.Navigate(e.url+"/approvals/"+id), chromedp.WaitVisible(card(id)+` .args-schema summary`, chromedp.ByQuery),
			chromedp.Evaluate(fmt.Sprintf(`!document.querySelector(%q).open`, card(id)+" .args-schema"), &collapsed))
		if !collapsed {
			t.Fatal("the arguments schema is open before anyone asks")
		}
		e.run(t, "open the schema", chromedp.Click(card(id)+` .args-schema > summary`, chromedp.ByQuery),
			chromedp.WaitVisible(card(id)+` .args-schema table`, chromedp.ByQuery),
			chromedp.Evaluate(fmt.Sprintf(`document.querySelectorAll(%q).length`, card(id)+" .args-schema tbody tr"), &rows),
			chromedp.Text(card(id)+` .args-schema tbody tr td.desc`, &cell, chromedp.ByQuery))
		if rows != 4 || !strings.Contains(cell, "<b>Not</b> a directory") {
			t.Fatalf("%d rows, the first described %q", rows, cell)
		}
		e.shot(t, "args-schema")
		ctx, cancel := itest.OpCtx()
		defer cancel()
		if err := e.agent.Cancel(ctx, id, "test over"); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("long-args", func(t *testing.T) {
		// The agent writes a long body first: the approver must still see
		// every argument's name and the start of its value above Approve,
		// and be told how much of the body is folded away.
		body := strings.Repeat("Please find the quarterly invoice attached. ", 75) // 3,300 characters
		args := `{"body":` + string(mustJSON(t, body)) + `,"subject":"Invoice Q3","to":"mallory@evil.example"}`
		keys := []string{"body", "subject", "to"}
		starts := []string{"Please find the quarterly invoice attached.", "Invoice Q3", "mallory@evil.example"}
		id, got := e.ask(t, events.Requested{Tool: "send_email", Session: "s-long", Args: json.RawMessage(args)})
		e.run(t, "see it", chromedp.Navigate(e.url+"/"), chromedp.WaitVisible(card(id), chromedp.ByQuery))
		e.inSight(t, card(id), keys, starts)
		e.shot(t, "long-args")
		var more string
		e.run(t, "find the folded body's control", chromedp.Text(card(id)+` button.arg-more`, &more, chromedp.ByQuery))
		var n int
		if _, err := fmt.Sscanf(strings.ReplaceAll(more, ",", ""), "%d more characters", &n); err != nil || n < 3000 || n >= len(body) {
			t.Errorf("the fold says %q, want the count of characters folded away", more)
		}
		var shown string
		e.run(t, "unfold it", chromedp.Click(card(id)+` button.arg-more`, chromedp.ByQuery),
			chromedp.WaitVisible(card(id)+` button.arg-more[aria-expanded="true"]`, chromedp.ByQuery),
			chromedp.Text(card(id)+` .arg:first-child .arg-val`, &shown, chromedp.ByQuery))
		if !strings.Contains(shown, strings.TrimSpace(body)) {
			t.Errorf("unfolded, the body shows %d characters, not all %d", len(shown), len(body))
		}
		e.inSight(t, card(id), keys, append(starts, strings.TrimSpace(body)))
		e.run(t, "fold it again", chromedp.Click(card(id)+` button.arg-more`, chromedp.ByQuery),
			chromedp.WaitVisible(card(id)+` button.arg-more[aria-expanded="false"]`, chromedp.ByQuery))

		// The same on a phone, and in the dark.
		for _, v := range []struct {
			name   string
			width  int64
			scheme string
		}{{"desktop-dark", 0, "dark"}, {"phone", 390, "light"}, {"phone-dark", 390, "dark"}} {
			look := []chromedp.Action{emulation.SetEmulatedMedia().WithFeatures([]*emulation.MediaFeature{{Name: "prefers-color-scheme", Value: v.scheme}})}
			if v.width > 0 {
				look = append(look, emulation.SetDeviceMetricsOverride(v.width, 844, 3, true))
			}
			e.run(t, v.name, append(look, chromedp.Navigate(e.url+"/"), chromedp.WaitVisible(card(id), chromedp.ByQuery))...)
			e.inSight(t, card(id), keys, starts)
			if v.name == "phone-dark" {
				e.shot(t, "long-args-"+v.name)
			}
			e.run(t, "back to a desktop", emulation.ClearDeviceMetricsOverride(), emulation.SetEmulatedMedia())
		}

		// Approved with an edited recipient: the decision shows the
		// arguments approved the same way.
		edited := `{"body":` + string(mustJSON(t, body)) + `,"subject":"Invoice Q3","to":"billing@example.com"}`
		e.run(t, "see it again", chromedp.Navigate(e.url+"/"), chromedp.WaitVisible(card(id), chromedp.ByQuery), chromedp.WaitVisible(`#conn[data-state="live"]`, chromedp.ByQuery))
		e.run(t, "edit the recipient",
			chromedp.Click(card(id)+` [data-act="edit"]`, chromedp.ByQuery),
			chromedp.WaitVisible(card(id)+` .args-edit`, chromedp.ByQuery),
			chromedp.SetValue(card(id)+` .args-edit`, edited, chromedp.ByQuery),
			chromedp.Evaluate(fmt.Sprintf(`document.querySelector(%q).dispatchEvent(new Event("input", {bubbles: true}))`, card(id)+" .args-edit"), nil),
			chromedp.WaitVisible(card(id)+` .diff .add`, chromedp.ByQuery))
		e.inSight(t, card(id)+` .diff`, nil, []string{`"to": "billing@example.com"`, `"to": "mallory@evil.example"`})
		e.run(t, "approve with the edits", chromedp.Click(card(id)+` .edit-panel button[type="submit"]`, chromedp.ByQuery))
		e.run(t, "see it approved", chromedp.WaitVisible(card(id)+` .outcome.approved`, chromedp.ByQuery))
		if d := decided(t, got); !d.Approved() || !d.Edited {
			t.Fatalf("the agent got %+v", d)
		}
		e.inSight(t, card(id)+` .outcome`, keys, []string{"Please find the quarterly invoice attached.", "Invoice Q3", "billing@example.com"})

		// The request's own page.
		e.run(t, "its page", chromedp.Navigate(e.url+"/approvals/"+id), chromedp.WaitVisible(`.timeline`, chromedp.ByQuery))
		e.inSight(t, card(id), keys, starts)
		e.inSight(t, card(id)+` .outcome`, keys, []string{"Invoice Q3", "billing@example.com"})
	})

	t.Run("times-tick", func(t *testing.T) {
		// "Asked 0s ago" goes on counting, and what happens at the deadline
		// is written out, not only in a tooltip a phone never shows.
		id, _ := e.ask(t, events.Requested{Tool: "rotate_keys", Args: json.RawMessage(`{"service":"web"}`)})
		var first, meta string
		e.run(t, "see it", chromedp.Navigate(e.url+"/"), chromedp.WaitVisible(card(id), chromedp.ByQuery),
			chromedp.Text(card(id)+` dl.meta time`, &first, chromedp.ByQuery), chromedp.Text(card(id)+` dl.meta`, &meta, chromedp.ByQuery))
		if !strings.Contains(meta, "then denied if nobody answers") {
			t.Errorf("the card does not say what happens at the deadline: %q", meta)
		}
		e.run(t, "wait for the time to move", chromedp.Poll(fmt.Sprintf(`(t => /^[1-9]\d*s ago$/.test(t) && t !== %q)(document.querySelector(%q).textContent)`, first, card(id)+" dl.meta time"), nil,
			chromedp.WithPollingInterval(200*time.Millisecond), chromedp.WithPollingTimeout(6*time.Second)))
		ctx, cancel := itest.OpCtx()
		defer cancel()
		if err := e.agent.Cancel(ctx, id, "test over"); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("notice-covers-nothing", func(t *testing.T) {
		// A request arrives while the approver edits another's arguments,
		// the edit form's buttons at the bottom of the window: the notice of
		// its arrival must not cover them.
		a, _ := e.ask(t, events.Requested{Tool: "delete_file", Args: json.RawMessage(`{"path":"/srv/a"}`)})
		e.run(t, "edit one", chromedp.Navigate(e.url+"/"), chromedp.WaitVisible(card(a), chromedp.ByQuery), chromedp.WaitVisible(`#conn[data-state="live"]`, chromedp.ByQuery),
			chromedp.Click(card(a)+` [data-act="edit"]`, chromedp.ByQuery), chromedp.WaitVisible(card(a)+` .edit-panel`, chromedp.ByQuery),
			chromedp.Evaluate(fmt.Sprintf(`document.querySelector(%q).scrollIntoView({block: "end"}); true`, card(a)+" .edit-panel"), nil))
		b, _ := e.ask(t, events.Requested{Tool: "delete_file", Args: json.RawMessage(`{"path":"/srv/b"}`)})
		var covered []string
		e.run(t, "another arrives", chromedp.WaitReady(card(b), chromedp.ByQuery),
			chromedp.Poll(`document.getElementById("live").textContent !== ""`, nil, chromedp.WithPollingInterval(50*time.Millisecond)),
			chromedp.Evaluate(fmt.Sprintf(`(() => {
				const live = document.getElementById("live"), r = live.getBoundingClientRect();
				if (r.width < 2 || r.height < 2 || !live.checkVisibility()) return [];
				return Array.from(document.querySelectorAll(%q)).filter(el => {
					const b = el.getBoundingClientRect();
					return r.left < b.right && r.right > b.left && r.top < b.bottom && r.bottom > b.top;
				}).map(el => el.textContent.trim());
			})()`, card(a)+" .edit-panel button, "+card(a)+" .edit-panel textarea"), &covered))
		if len(covered) > 0 {
			t.Errorf("the notice of a new request covers %q", covered)
		}
		ctx, cancel := itest.OpCtx()
		defer cancel()
		for _, id := range []string{a, b} {
			if err := e.agent.Cancel(ctx, id, "test over"); err != nil {
				t.Fatal(err)
			}
		}
	})

	t.Run("approve-with-comment", func(t *testing.T) {
		id, got := e.ask(t, events.Requested{Tool: "restart_service", Args: json.RawMessage(`{"name":"queue"}`)})
		e.run(t, "write a comment", chromedp.Navigate(e.url+"/"), chromedp.WaitVisible(card(id), chromedp.ByQuery),
			chromedp.Click(card(id)+` [data-act="comment"]`, chromedp.ByQuery),
			chromedp.WaitVisible(card(id)+` .comment-in`, chromedp.ByQuery),
			chromedp.SendKeys(card(id)+` .comment-in`, "after the 14:00 deploy only", chromedp.ByQuery))
		e.run(t, "approve", chromedp.Click(card(id)+` [data-act="approve"]`, chromedp.ByQuery))
		e.run(t, "see it approved", chromedp.WaitVisible(card(id)+` .outcome.approved`, chromedp.ByQuery))
		if d := decided(t, got); !d.Approved() || d.Reason != "after the 14:00 deploy only" {
			t.Fatalf("the agent got %+v", d)
		}
	})

	t.Run("unsent-reason-kept", func(t *testing.T) {
		// Someone else decides while the approver is writing why to deny:
		// what they wrote stays, and the card says it was not sent, and who
		// decided instead.
		id, got := e.ask(t, events.Requested{Tool: "drop_table", Args: json.RawMessage(`{"table":"audit"}`)})
		e.run(t, "start writing why", chromedp.Navigate(e.url+"/"), chromedp.WaitVisible(card(id), chromedp.ByQuery), chromedp.WaitVisible(`#conn[data-state="live"]`, chromedp.ByQuery),
			chromedp.Click(card(id)+` [data-act="deny"]`, chromedp.ByQuery), chromedp.WaitVisible(card(id)+` .reason`, chromedp.ByQuery),
			chromedp.SendKeys(card(id)+` .reason`, "the audit table is kept for", chromedp.ByQuery))
		ctx, cancel := itest.OpCtx()
		defer cancel()
		if err := handler.Answer(ctx, e.js, "bob", id, events.Responded{Decision: events.Approve, Channel: "slack"}); err != nil {
			t.Fatal(err)
		}
		decided(t, got)
		var note, kept string
		e.run(t, "see what was typed, not sent", chromedp.WaitVisible(card(id)+` .outcome.approved`, chromedp.ByQuery),
			chromedp.WaitVisible(card(id)+` .unsent`, chromedp.ByQuery), chromedp.Text(card(id)+` .unsent p`, &note, chromedp.ByQuery),
			chromedp.Value(card(id)+` .unsent textarea`, &kept, chromedp.ByQuery))
		if kept != "the audit table is kept for" || !strings.Contains(note, "bob") || !strings.Contains(note, "not") {
			t.Errorf("kept %q, note %q", kept, note)
		}
		e.shot(t, "unsent")
		e.run(t, "dismiss it", chromedp.Click(card(id)+` .unsent [data-act="dismiss"]`, chromedp.ByQuery), chromedp.WaitNotPresent(card(id), chromedp.ByQuery))
	})

	t.Run("sign-in-page", func(t *testing.T) {
		// The sign-in page sends the headers the other pages send, and names
		// its icon (no request for /favicon.ico, no 404).
		resp, err := http.Get(e.url + "/login")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		h := resp.Header
		if csp := h.Get("Content-Security-Policy"); !strings.Contains(csp, "script-src 'self'") || !strings.Contains(csp, "frame-ancestors 'none'") || h.Get("X-Frame-Options") != "DENY" || h.Get("X-Content-Type-Options") != "nosniff" {
			t.Errorf("the sign-in page's headers: %v", h)
		}
		if !strings.Contains(string(body), `<link rel="icon" href="/static/icon.svg" type="image/svg+xml">`) {
			t.Errorf("the sign-in page names no icon:\n%s", body)
		}
		icon, err := http.Get(e.url + "/static/icon.svg")
		if err != nil {
			t.Fatal(err)
		}
		icon.Body.Close()
		if icon.StatusCode != http.StatusOK || icon.Header.Get("Content-Type") != "image/svg+xml" {
			t.Errorf("the icon, signed out: %d %s", icon.StatusCode, icon.Header.Get("Content-Type"))
		}
		// Its own style is allowed by that policy: the button is laid out
		// as a block.
		var display string
		e.run(t, "open it", chromedp.Navigate(e.url+"/login"), chromedp.WaitVisible(`main`, chromedp.ByQuery),
			chromedp.Evaluate(`getComputedStyle(document.querySelector("a.button")).display`, &display))
		if display != "block" {
			t.Errorf("the sign-in page's style is refused: a.button is %q", display)
		}
	})

	t.Run("phone-and-dark", func(t *testing.T) {
		id, _ := e.ask(t, events.Requested{Tool: "send_email", Session: "s-phone", Args: json.RawMessage(`{"to":"all@example.com","subject":"Quarterly results"}`)})
		var overflow bool
		e.run(t, "a phone",
			emulation.SetDeviceMetricsOverride(390, 844, 3, true),
			emulation.SetEmulatedMedia().WithFeatures([]*emulation.MediaFeature{{Name: "prefers-color-scheme", Value: "dark"}}),
			chromedp.Navigate(e.url+"/"), chromedp.WaitVisible(card(id), chromedp.ByQuery),
			chromedp.Evaluate(`document.documentElement.scrollWidth > window.innerWidth`, &overflow))
		if overflow {
			t.Fatal("the pending page scrolls sideways on a phone")
		}
		e.shot(t, "phone-dark")
		e.run(t, "back to a desktop", emulation.ClearDeviceMetricsOverride(), emulation.SetEmulatedMedia())
	})

	t.Run("sign-out", func(t *testing.T) {
		var loc string
		e.run(t, "the pending page", chromedp.Navigate(e.url+"/"), chromedp.WaitVisible(`.logout button`, chromedp.ByQuery))
		e.run(t, "sign out", chromedp.Click(`.logout button`, chromedp.ByQuery))
		e.run(t, "signed out", chromedp.WaitVisible(`a.button`, chromedp.ByQuery), chromedp.Location(&loc))
		if !strings.Contains(loc, "/login") {
			t.Fatalf("after signing out: %s", loc)
		}
		e.run(t, "the pages need sign-in again", chromedp.Navigate(e.url+"/history"), chromedp.WaitVisible(`a.button`, chromedp.ByQuery), chromedp.Location(&loc))
		if !strings.Contains(loc, "/login") {
			t.Fatalf("after signing out, /history is at %s", loc)
		}
	})
}

// TestBrowserAnsweringAs: without sign-in, the page takes only a name the
// broker takes as a principal, says the rule when it is not one, and sends
// nothing until it is.
func TestBrowserAnsweringAs(t *testing.T) {
	e := newBrowserEnvWith(t, false)
	id, got := e.ask(t, events.Requested{Tool: "restart_service", Args: json.RawMessage(`{"name":"web"}`)})
	e.run(t, "see it", chromedp.Navigate(e.url+"/"), chromedp.WaitVisible(card(id), chromedp.ByQuery))
	var notice string
	e.run(t, "answer as a name with a space",
		chromedp.SendKeys(`#as`, "alice smith", chromedp.ByQuery),
		chromedp.Click(card(id)+` [data-act="approve"]`, chromedp.ByQuery),
		chromedp.Poll(`document.getElementById("live").textContent !== ""`, nil, chromedp.WithPollingInterval(50*time.Millisecond)),
		chromedp.Text(`#live`, &notice, chromedp.ByQuery))
	if !strings.Contains(notice, "a space") || !strings.Contains(notice, "letters") || !strings.Contains(notice, "digits") {
		t.Errorf("the page says %q, not which names it takes", notice)
	}
	select {
	case d := <-got:
		t.Fatalf("a name the broker refuses was sent: %+v", d)
	case <-time.After(500 * time.Millisecond):
	}
	e.run(t, "answer as alice", chromedp.Evaluate(`document.getElementById("as").value = ""`, nil), chromedp.SendKeys(`#as`, "alice", chromedp.ByQuery),
		chromedp.Click(card(id)+` [data-act="approve"]`, chromedp.ByQuery), chromedp.WaitVisible(card(id)+` .outcome.approved`, chromedp.ByQuery))
	if d := decided(t, got); !d.Approved() || d.DecidedBy[0].Principal != "alice" {
		t.Fatalf("the agent got %+v", d)
	}
}

// BenchmarkBrowserCard measures how long a request takes from an agent's
// publish to its card in the DOM of an approvals page open in Chromium: the
// broker evaluates, stores and indexes it, the event stream tells the page,
// the page fetches the card and inserts it. A MutationObserver in the page
// notes when the card is inserted, and the page's resource timings when the
// event arrived (the card's fetch starts) and when the card's HTML was in
// (event-ms, fetched-ms); the DevTools round trips that read them are not in
// the figures. Beside it, raw-jetstream is the least work that could do the
// same: a publish into a stream and an ordered consumer receiving it.
//
//	go test ./integration/browser -run '^$' -bench BrowserCard -benchtime 200x
func BenchmarkBrowserCard(b *testing.B) {
	b.Run("assent", func(b *testing.B) {
		e := newBrowserEnv(b)
		e.signIn(b)
		e.run(b, "open the page", chromedp.Navigate(e.url+"/"), chromedp.WaitVisible(`#conn[data-state="live"]`, chromedp.ByQuery),
			chromedp.Evaluate(`new MutationObserver(ms => { const at = performance.timeOrigin + performance.now();
				for (const m of ms) for (const n of m.addedNodes) if (n.id && n.id.startsWith("r-")) n.dataset.inserted = at;
			}).observe(document.getElementById("cards"), {childList: true, subtree: true}); true`, nil))
		var lat, event, fetched latencies
		b.ResetTimer()
		for range b.N {
			id := events.NewID()
			ev, err := events.New(events.TypeRequested, id, "agent/coder", events.Requested{Agent: "coder", Tool: "bench", Args: json.RawMessage(`{"n":1}`)})
			if err != nil {
				b.Fatal(err)
			}
			h, data, err := events.Encode(&ev)
			if err != nil {
				b.Fatal(err)
			}
			start := time.Now()
			if _, err := e.js.PublishMsg(context.Background(), &nats.Msg{Subject: events.RequestPrefix + "coder", Header: nats.Header(h), Data: data}); err != nil {
				b.Fatal(err)
			}
			var at []float64 // epoch milliseconds: the card's fetch started, its HTML was in, it was inserted
			e.run(b, "see the card", chromedp.Poll(fmt.Sprintf(`document.getElementById("r-" + %[1]q)?.dataset.inserted !== undefined &&
					performance.getEntriesByType("resource").some(x => x.name.includes("/ui/cards/" + %[1]q))`, id), nil, chromedp.WithPollingInterval(10*time.Millisecond)),
				chromedp.Evaluate(fmt.Sprintf(`(() => {
					const id = %q, r = performance.getEntriesByType("resource").find(x => x.name.includes("/ui/cards/" + id));
					performance.clearResourceTimings(); // the buffer holds 250
					return [performance.timeOrigin + r.startTime, performance.timeOrigin + r.responseEnd, Number(document.getElementById("r-" + id).dataset.inserted)];
				})()`, id), &at))
			b.StopTimer()
			since := func(ms float64) time.Duration { return time.UnixMicro(int64(ms * 1000)).Sub(start) }
			event.add(since(at[0]))
			fetched.add(since(at[1]))
			lat.add(since(at[2]))
			// The agent withdraws the request, and the next one comes once
			// the page has shown that (the card leaves 8s later, while the
			// next ones arrive).
			ctx, cancel := itest.OpCtx()
			if err := e.agent.Cancel(ctx, id, "measured"); err != nil {
				b.Fatal(err)
			}
			cancel()
			e.run(b, "see it withdrawn", chromedp.WaitVisible(card(id)+".resolved", chromedp.ByQuery))
			b.StartTimer()
		}
		b.StopTimer()
		lat.report(b, b.N)
		event.stage(b, "event")
		fetched.stage(b, "fetched")
	})
	b.Run("raw-jetstream", func(b *testing.B) {
		nc := itest.BenchServer(b, "always")
		js := itest.NewJS(b, nc)
		ctx := context.Background()
		if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "RAW", Subjects: []string{"raw.>"}}); err != nil {
			b.Fatal(err)
		}
		cons, err := js.OrderedConsumer(ctx, "RAW", jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverNewPolicy})
		if err != nil {
			b.Fatal(err)
		}
		got := make(chan struct{}, 1)
		cc, err := cons.Consume(func(m jetstream.Msg) { got <- struct{}{} })
		if err != nil {
			b.Fatal(err)
		}
		defer cc.Stop()
		var lat latencies
		b.ResetTimer()
		for range b.N {
			start := time.Now()
			if _, err := js.Publish(ctx, "raw.request", []byte(`{"n":1}`)); err != nil {
				b.Fatal(err)
			}
			<-got
			lat.add(time.Since(start))
		}
		b.StopTimer()
		lat.report(b, b.N)
	})
}

// inSightJS finds, under the element root selects, the first rendered
// occurrence of each string as a whole word (keys) or as written (values), in
// document order, whatever the markup, and says which are not in sight: not
// rendered, or outside the root's box or the visible box of a scroll or clip
// container between them (independent of the window: a card taller than
// the window is fine, a box that hides part of itself is not). It returns
// one line per string out of sight; none when all are.
const inSightJS = `((rootSel, wanted) => {
	const root = document.querySelector(rootSel);
	if (!root) return ["no element " + rootSel];
	const inside = (r, box) => r.left >= box.left - 1 && r.right <= box.right + 1 && r.top >= box.top - 1 && r.bottom <= box.bottom + 1;
	const esc = (s) => s.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");
	const out = [];
	for (const [text, word] of wanted) {
		const re = word ? new RegExp("(^|[^A-Za-z0-9_])(" + esc(text) + ")(?![A-Za-z0-9_])") : new RegExp("()(" + esc(text) + ")");
		const walk = document.createTreeWalker(root, NodeFilter.SHOW_TEXT);
		let found = null;
		for (let n = walk.nextNode(); n && !found; n = walk.nextNode()) {
			const m = re.exec(n.data);
			if (!m || !n.parentElement.checkVisibility({opacityProperty: true, visibilityProperty: true})) continue;
			const range = document.createRange();
			range.setStart(n, m.index + m[1].length);
			range.setEnd(n, m.index + m[1].length + text.length);
			const r = range.getBoundingClientRect();
			if (r.width > 0 && r.height > 0) found = [n, r];
		}
		if (!found) { out.push(JSON.stringify(text) + ": not shown"); continue; }
		const [n, r] = found;
		for (let el = n.parentElement; el; el = el.parentElement) {
			const cs = getComputedStyle(el);
			const clips = el === root || cs.overflowX !== "visible" || cs.overflowY !== "visible";
			if (clips && !inside(r, el.getBoundingClientRect())) {
				const box = el.getBoundingClientRect();
				out.push(JSON.stringify(text) + " at y " + Math.round(r.top) + ".." + Math.round(r.bottom) + " is outside " + el.tagName.toLowerCase() + "." + el.className + " (y " + Math.round(box.top) + ".." + Math.round(box.bottom) + ", overflow " + cs.overflowY + ")");
				break;
			}
			if (el === root) break;
		}
	}
	return out;
})`

// inSight fails the test unless every key (as a whole word) and every value
// start (as written) is in sight under root; see inSightJS.
func (e *browserEnv) inSight(t *testing.T, root string, keys, values []string) {
	t.Helper()
	var wanted [][2]any
	for _, k := range keys {
		wanted = append(wanted, [2]any{k, true})
	}
	for _, v := range values {
		wanted = append(wanted, [2]any{v, false})
	}
	arg, _ := json.Marshal(wanted)
	var out []string
	e.run(t, "look at "+root, chromedp.Evaluate(fmt.Sprintf("%s(%q, %s)", inSightJS, root, arg), &out))
	if len(out) > 0 {
		t.Errorf("out of sight under %s:\n%s", root, strings.Join(out, "\n"))
	}
}

// notUnsent fails the test if request id's card, answered from the page,
// says what was typed was not sent (the answer's own decision arrives on
// the event stream too, perhaps before the answer returns).
func (e *browserEnv) notUnsent(t *testing.T, id string) {
	t.Helper()
	var note bool
	e.run(t, "look for a note of unsent text", chromedp.Sleep(500*time.Millisecond),
		chromedp.Evaluate(fmt.Sprintf(`document.querySelector(%q) !== null`, card(id)+" .unsent"), &note))
	if note {
		t.Error("the card says the answer just sent was not sent")
	}
}

func mustJSON(t testing.TB, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
