package browser

import (
	"bytes"
	"context"
	"encoding/json"
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
	"github.com/chromedp/chromedp"
	"github.com/nats-io/nats.go"

	"github.com/assent-dev/assent/integration/itest"
	"github.com/assent-dev/assent/internal/app"
	"github.com/assent-dev/assent/internal/auth"
	"github.com/assent-dev/assent/internal/authtest"
	"github.com/assent-dev/assent/pkg/events"
	"github.com/assent-dev/assent/pkg/handler"
)

// insightsPolicy: reads are allowed and drops denied by the policy; people
// answer the rest, deploys alice or bob, pings within 2 seconds or never.
const insightsPolicy = `version: 1
mode: manual
defaults:
  timeout: 10m
principals:
  alice: {email: test-user@zitadel.ch, roles: [ops]}
  bob:   {email: test-user2@zitadel.ch, roles: [ops]}
rules:
  - name: reads
    tools: ["read_*", "list_*"]
    action: allow
  - name: drops
    tools: ["drop_*"]
    action: deny
  - name: pings
    tools: ["ping_*"]
    action: require_approval
    approvers: [bob]
    timeout: 2s
  - name: deploys
    tools: [deploy]
    action: require_approval
    approvers: ["role:ops"]
  - name: changes
    tools: ["*"]
    action: require_approval
    approvers: [bob]
`

// insightsShadow is the candidate policy run beside it: it would let
// deploys to staging through without anyone.
const insightsShadow = `version: 1
mode: manual
defaults:
  timeout: 10m
principals:
  alice: {email: test-user@zitadel.ch, roles: [ops]}
  bob:   {email: test-user2@zitadel.ch, roles: [ops]}
rules:
  - name: reads
    tools: ["read_*", "list_*"]
    action: allow
  - name: drops
    tools: ["drop_*"]
    action: deny
  - name: pings
    tools: ["ping_*"]
    action: require_approval
    approvers: [bob]
    timeout: 2s
  - name: staging-deploys
    tools: [deploy]
    when: 'args.env == "staging"'
    action: allow
  - name: deploys
    tools: [deploy]
    action: require_approval
    approvers: ["role:ops"]
  - name: changes
    tools: ["*"]
    action: require_approval
    approvers: [bob]
`

// insightsEnv is the broker process with a shadow policy, OIDC sign-in
// (alice, an admin, in the browser) and API tokens (bob answers over
// HTTP; an admin token reads), an agent on NATS, and a browser.
type insightsEnv struct {
	*browserEnv
	api    string
	tokens map[string]string // bob, ops
}

func newInsightsEnv(t *testing.T) *insightsEnv {
	t.Helper()
	exe := chromium(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	httpAddr := ln.Addr().String()
	ln.Close()
	ours := "http://" + httpAddr
	dir := t.TempDir()
	pol, shadow, authFile := filepath.Join(dir, "policy.yaml"), filepath.Join(dir, "shadow.yaml"), filepath.Join(dir, "auth.yaml")
	issuer := authtest.StartOP(t, ours+"/auth/callback")
	for file, data := range map[string]string{
		pol: insightsPolicy, shadow: insightsShadow,
		authFile: "admins: [alice]\noidc:\n  issuer: " + issuer + "\n  client_id: assent\n  client_secret: s3cret\n  redirect_url: " + ours + "/auth/callback\n",
	} {
		if err := os.WriteFile(file, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	tokens := map[string]string{}
	for name, principal := range map[string]string{"bob": "bob", "ops": ""} {
		tok, err := auth.CreateToken(authFile, name, principal, "", principal == "", time.Now())
		if err != nil {
			t.Fatal(err)
		}
		tokens[name] = tok
	}
	addrs := itest.StartApp(t, app.Options{NATSListen: "127.0.0.1:0", DataDir: filepath.Join(dir, "data"), HTTPListen: httpAddr,
		PolicyFile: pol, ShadowPolicyFile: shadow, AuthFile: authFile})
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
	e.ctx = ctx
	if err := chromedp.Run(ctx); err != nil {
		t.Fatalf("start %s: %v", exe, err)
	}
	return &insightsEnv{browserEnv: e, api: ours, tokens: tokens}
}

// call makes an API call with token (by name) and returns the status and
// body.
func (e *insightsEnv) call(t *testing.T, token, method, path string, body any) (int, []byte) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(mustJSON(t, body))
	}
	ctx, cancel := itest.OpCtx()
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, e.api+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+e.tokens[token])
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, out
}

// state waits until request id is stored and returns its state.
func (e *insightsEnv) state(t *testing.T, id string) string {
	t.Helper()
	for deadline := time.Now().Add(itest.Patience); ; time.Sleep(20 * time.Millisecond) {
		status, body := e.call(t, "ops", http.MethodGet, "/v1/approvals/"+id, nil)
		var a struct{ State string }
		if status == http.StatusOK && json.Unmarshal(body, &a) == nil {
			return a.State
		}
		if time.Now().After(deadline) {
			t.Fatalf("request %s is not stored: %d %s", id, status, body)
		}
	}
}

// TestBrowserInsights: a real record (requests approved and denied by
// people in the page and over the API, by the policy, expired, cancelled,
// some the shadow policy would have let through) read on the Insights tab:
// its numbers, its chart, a number's requests, on a desktop, in the dark
// and on a phone.
func TestBrowserInsights(t *testing.T) {
	e := newInsightsEnv(t)
	if who := e.signIn(t); who != "alice" {
		t.Fatalf("signed in as %q, want alice", who)
	}
	ask := func(tool, args string) (string, <-chan handler.Decision) {
		t.Helper()
		return e.ask(t, events.Requested{Tool: tool, Args: json.RawMessage(args), Session: "s-insights"})
	}
	// bob answers over the HTTP API, at once.
	bob := func(tool, args, decision string) {
		t.Helper()
		id, got := ask(tool, args)
		if st := e.state(t, id); st != "pending" {
			t.Fatalf("%s: %s, want pending", tool, st)
		}
		if status, body := e.call(t, "bob", http.MethodPost, "/v1/approvals/"+id+"/decision", map[string]string{"decision": decision, "reason": "as always"}); status != http.StatusOK {
			t.Fatalf("bob answers %s: %d %s", tool, status, body)
		}
		decided(t, got)
	}
	for i := range 6 {
		bob("rotate_logs", `{"service":"web"}`, "approve")
		_, got := ask("read_file", fmt.Sprintf(`{"path":"/srv/reports/q%d.csv"}`, i+1))
		decided(t, got)
	}
	for range 5 {
		bob("delete_branch", `{"repo":"assent","name":"main"}`, "deny")
	}
	for _, table := range []string{"users", "orders"} {
		_, got := ask("drop_table", `{"table":"`+table+`"}`)
		decided(t, got)
	}
	// Pings nobody answers in time.
	var pings []<-chan handler.Decision
	for range 2 {
		_, got := ask("ping_host", `{"host":"db-1"}`)
		pings = append(pings, got)
	}
	// One the agent takes back.
	stop, _ := ask("restart_service", `{"name":"web"}`)
	e.state(t, stop)
	ctx, cancel := itest.OpCtx()
	if err := e.agent.Cancel(ctx, stop, "not needed after all"); err != nil {
		t.Fatal(err)
	}
	cancel()
	// Deploys alice answers in the page: two at once, one with the
	// environment changed, one denied after a look.
	e.run(t, "the pending page", chromedp.Navigate(e.url+"/"), chromedp.WaitVisible(`#conn[data-state="live"]`, chromedp.ByQuery))
	for i, env := range []string{"staging", "staging", "production", "production"} {
		id, got := ask("deploy", `{"service":"web","version":"1.4.`+fmt.Sprint(i)+`","env":"`+env+`"}`)
		e.run(t, "see the deploy", chromedp.WaitVisible(card(id)+` [data-act="approve"]`, chromedp.ByQuery))
		switch i {
		case 2:
			e.run(t, "edit the environment",
				chromedp.Click(card(id)+` [data-act="edit"]`, chromedp.ByQuery),
				chromedp.WaitVisible(card(id)+` .args-edit`, chromedp.ByQuery),
				chromedp.SetValue(card(id)+` .args-edit`, `{"service":"web","version":"1.4.2","env":"staging"}`, chromedp.ByQuery),
				chromedp.Evaluate(fmt.Sprintf(`document.querySelector(%q).dispatchEvent(new Event("input", {bubbles: true}))`, card(id)+" .args-edit"), nil),
				chromedp.WaitVisible(card(id)+` .diff .add`, chromedp.ByQuery),
				chromedp.Click(card(id)+` .edit-panel button[type="submit"]`, chromedp.ByQuery))
		case 3:
			e.run(t, "deny it", chromedp.Sleep(2500*time.Millisecond), chromedp.Click(card(id)+` [data-act="deny"]`, chromedp.ByQuery),
				chromedp.WaitVisible(card(id)+` .reason`, chromedp.ByQuery),
				chromedp.SetValue(card(id)+` .reason`, "not on a Friday", chromedp.ByQuery),
				chromedp.Click(card(id)+` .deny-panel button[type="submit"]`, chromedp.ByQuery))
		default:
			e.run(t, "approve it", chromedp.Click(card(id)+` [data-act="approve"]`, chromedp.ByQuery))
		}
		if d := decided(t, got); d.Approved() != (i < 3) {
			t.Fatalf("deploy %d: %+v", i, d)
		}
	}
	for _, got := range pings {
		if d := decided(t, got); d.Outcome != events.Expired {
			t.Fatalf("a ping: %+v, want expired", d)
		}
	}

	// The tab, once the replica has read all of it: 6 + 6 + 5 + 2 + 2 + 1 + 4
	// decisions.
	const total = 26
	var legend string
	for deadline := time.Now().Add(itest.Patience); ; time.Sleep(200 * time.Millisecond) {
		e.run(t, "the insights", chromedp.Navigate(e.url+"/insights?since=24h"), chromedp.WaitVisible(`svg.plot`, chromedp.ByQuery),
			chromedp.Text(`.legend`, &legend, chromedp.ByQuery))
		var window string
		e.run(t, "its window", chromedp.Text(`.window`, &window, chromedp.ByQuery))
		if strings.Contains(window, fmt.Sprintf("%d decisions", total)) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the tab says %q, want %d decisions", window, total)
		}
	}
	for _, want := range []string{"9 approved by people", "6 approved by policy", "6 denied by people", "2 denied by policy", "2 expired", "1 cancelled"} {
		if !strings.Contains(legend, want) {
			t.Errorf("the legend says %q, not %q", legend, want)
		}
	}
	var texts map[string]string
	e.run(t, "read the sections", chromedp.Evaluate(`Object.fromEntries([...document.querySelectorAll("section.insight")].map(s => [s.querySelector("h2").id, s.innerText]))`, &texts))
	for section, wants := range map[string][]string{
		"latency-h": {"deploys", "pings", "bob", "alice"},
		"stamps-h":  {"bob", "alice", "Of 9 approvals by people"},
		"always-h":  {"ALWAYS APPROVED", "rotate_logs", "\"web\"", "6 times by bob", "ALWAYS DENIED", "delete_branch", "\"main\"", "5 times by bob", "broker policy suggest"},
		"shadow-h":  {"require_approval by deploys", "staging-deploys"},
		"edited-h":  {"env"},
	} {
		for _, w := range wants {
			if !strings.Contains(texts[section], w) {
				t.Errorf("%s lacks %q:\n%s", section, w, texts[section])
			}
		}
	}
	e.shot(t, "insights")
	e.run(t, "dark", emulation.SetEmulatedMedia().WithFeatures([]*emulation.MediaFeature{{Name: "prefers-color-scheme", Value: "dark"}}),
		chromedp.Navigate(e.url+"/insights?since=24h"), chromedp.WaitVisible(`svg.plot`, chromedp.ByQuery))
	e.shot(t, "insights-dark")
	var overflow bool
	e.run(t, "a phone", emulation.SetDeviceMetricsOverride(390, 844, 3, true), emulation.SetEmulatedMedia(),
		chromedp.Navigate(e.url+"/insights?since=24h"), chromedp.WaitVisible(`svg.plot`, chromedp.ByQuery),
		chromedp.Evaluate(`document.documentElement.scrollWidth > window.innerWidth`, &overflow))
	if overflow {
		t.Error("the insights page scrolls sideways on a phone")
	}
	e.shot(t, "insights-phone")
	e.run(t, "back to a desktop", emulation.ClearDeviceMetricsOverride(), emulation.SetEmulatedMedia())

	// A number leads to its requests: the denials by people are bob's
	// branch deletes and alice's deploy.
	var rows int
	var what string
	e.run(t, "follow the denials by people", chromedp.Navigate(e.url+"/insights?since=24h"), chromedp.WaitVisible(`.legend`, chromedp.ByQuery),
		chromedp.Click(`.legend a[href*="outcome=denied"][href*="by=people"]`, chromedp.ByQuery),
		chromedp.WaitVisible(`table.insights-requests`, chromedp.ByQuery),
		chromedp.Evaluate(`document.querySelectorAll("table.insights-requests tbody tr").length`, &rows),
		chromedp.Text(`main`, &what, chromedp.ByQuery))
	if rows != 6 || strings.Count(what, "delete_branch") != 5 || !strings.Contains(what, "deploy") || !strings.Contains(what, "denied by people") {
		t.Errorf("the denials by people: %d rows\n%s", rows, what)
	}
	e.shot(t, "insights-requests")
	// And a bar's segment to its hour's requests of that outcome.
	var href string
	e.run(t, "a bar's expirations", chromedp.Navigate(e.url+"/insights?since=24h"), chromedp.WaitVisible(`svg.plot`, chromedp.ByQuery),
		chromedp.Evaluate(`document.querySelector("svg.plot rect.s.expired").parentNode.getAttribute("href")`, &href))
	e.run(t, "follow it", chromedp.Navigate(e.url+href), chromedp.WaitVisible(`table.insights-requests`, chromedp.ByQuery),
		chromedp.Evaluate(`document.querySelectorAll("table.insights-requests tbody tr").length`, &rows),
		chromedp.Text(`main`, &what, chromedp.ByQuery))
	if rows != 2 || strings.Count(what, "ping_host") != 2 {
		t.Errorf("the hour's expirations: %d rows\n%s", rows, what)
	}
}
