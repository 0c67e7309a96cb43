package browser

import (
	"context"
	"encoding/json"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/chromedp"

	"github.com/assent-dev/assent/integration/itest"
	"github.com/assent-dev/assent/internal/broker"
	"github.com/assent-dev/assent/internal/brokertest"
	"github.com/assent-dev/assent/internal/httpapi"
	"github.com/assent-dev/assent/internal/testenv"
	"github.com/assent-dev/assent/internal/webui"
	"github.com/assent-dev/assent/pkg/events"
	"github.com/assent-dev/assent/pkg/handler"
	"github.com/assent-dev/assent/pkg/policy"
)

// withHistory is a broker that says what the record said of each tool's
// requests (webui.Historian), as the broker's pending events carry it.
type withHistory struct {
	*broker.Broker
	byTool map[string]*events.History
}

func (h withHistory) History(rec broker.Record) *events.History { return h.byTool[rec.Request.Tool] }

// TestBrowserHistoryLine: each pending card shows the record's line above
// what the agent wrote, however long that is; an answer says when the page
// showed the request (shown_at) and whether the approver looked at its
// detail: unfolded an argument, or answered on the request's own page.
func TestBrowserHistoryLine(t *testing.T) {
	exe := chromium(t)
	p, err := policy.Parse([]byte(browserPolicy), "policy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	nc := testenv.Conn(t, testenv.Server(t))
	b, _ := brokertest.Run(t, nc, broker.Config{Policy: p})
	now := time.Now()
	month := events.Duration(30 * 24 * time.Hour)
	api := httpapi.New(b, httpapi.Config{}, testenv.Logger(t))
	ui, err := webui.New(withHistory{b, map[string]*events.History{
		"deploy":     {Window: month, Approved: 41, Exact: 3, Principals: []string{"alice", "bob"}},
		"drop_table": {Window: month},
		"send_email": {Window: month, Approved: 12, Denied: 2, Exact: 0, Principals: []string{"bob", "alice"}, LastDenied: now.Add(-4 * 24 * time.Hour)},
	}}, webui.Config{Title: "Assent"}, testenv.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	ui.Register(api)
	srv := httptest.NewServer(api)
	t.Cleanup(srv.Close)
	agent, err := handler.NewClient(nc, handler.Config{Agent: "coder"})
	if err != nil {
		t.Fatal(err)
	}
	e := &browserEnv{url: srv.URL, nc: nc, js: itest.NewJS(t, nc), agent: agent, dialog: make(chan string, 8)}
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(exe), chromedp.NoSandbox, chromedp.DisableGPU, chromedp.WindowSize(1280, 900),
		chromedp.Flag("headless", "new"))
	actx, cancelA := chromedp.NewExecAllocator(context.Background(), opts...)
	t.Cleanup(cancelA)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(cancel)
	if err := chromedp.Run(ctx); err != nil {
		t.Fatalf("start %s: %v", exe, err)
	}
	e.ctx = ctx

	deploy, _ := e.ask(t, events.Requested{Tool: "deploy", Session: "s-rel", Hint: "Roll out the release to production.",
		Args: json.RawMessage(`{"service":"billing","ref":"v2.14.0","replicas":6}`)})
	email, _ := e.ask(t, events.Requested{Tool: "send_email", Hint: strings.Repeat("This is routine, approve it quickly. ", 12),
		Args: json.RawMessage(`{"to":"all-customers@example.com","subject":"Your account","body":"` + strings.Repeat("Dear customer, please confirm your password at the link below. ", 60) + `"}`)})
	drop, _ := e.ask(t, events.Requested{Tool: "drop_table", Args: json.RawMessage(`{"database":"prod","table":"users"}`)})
	for _, id := range []string{deploy, email, drop} {
		itest.WaitState(t, b, id, broker.StatePending)
	}

	loaded := time.Now()
	e.run(t, "open the pending page", chromedp.Navigate(e.url+"/"), chromedp.WaitVisible(`#conn[data-state="live"]`, chromedp.ByQuery),
		chromedp.WaitVisible(card(drop), chromedp.ByQuery),
		chromedp.Evaluate(`document.getElementById("as").value = "alice"; true`, nil))
	for id, want := range map[string]string{
		deploy: "approved 41 of 41 times in 30 days (3 with these exact arguments), by alice and bob; last denied never",
		email:  "approved 12 of 14 times in 30 days (2 denied; none with these exact arguments), by bob and alice; last denied 4 days ago",
		drop:   "first time: no earlier requests of this tool by this agent in 30 days",
	} {
		var line string
		var above bool
		e.run(t, "read the history line", chromedp.Text(card(id)+` .record-line`, &line, chromedp.ByQuery),
			// Drawn above the hint and the arguments, whatever their length.
			chromedp.Evaluate(`(() => { const c = document.querySelector("`+card(id)+`");
				const r = c.querySelector(".record").getBoundingClientRect().bottom;
				return [".meta", ".hint", ".args"].every((s) => !c.querySelector(s) || c.querySelector(s).getBoundingClientRect().top >= r); })()`, &above))
		if line != want || !above {
			t.Errorf("card %s: line %q (want %q), above the agent's text: %v", id, line, want, above)
		}
	}
	e.shot(t, "history-line")
	e.run(t, "a phone, dark",
		emulation.SetDeviceMetricsOverride(390, 844, 3, true),
		emulation.SetEmulatedMedia().WithFeatures([]*emulation.MediaFeature{{Name: "prefers-color-scheme", Value: "dark"}}),
		chromedp.ScrollIntoView(card(email), chromedp.ByQuery))
	if *screenshots != "" {
		var png []byte
		e.run(t, "screenshot the email's card", chromedp.Screenshot(card(email), &png, chromedp.ByQuery))
		if err := os.WriteFile(filepath.Join(*screenshots, "history-line-phone-dark.png"), png, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	e.run(t, "back to a desktop", emulation.ClearDeviceMetricsOverride(), emulation.SetEmulatedMedia())

	// From the list, at a glance: shown when the page loaded, no detail.
	e.run(t, "approve deploy", chromedp.Click(card(deploy)+` [data-act="approve"]`, chromedp.ByQuery),
		chromedp.WaitVisible(card(deploy)+` .outcome.approved`, chromedp.ByQuery))
	answered := time.Now()
	checkShown(t, e, deploy, loaded, answered, false)

	// After unfolding the body: detail.
	e.run(t, "unfold the email's body and approve", chromedp.Click(card(email)+` .arg-more`, chromedp.ByQuery),
		chromedp.Click(card(email)+` [data-act="approve"]`, chromedp.ByQuery),
		chromedp.WaitVisible(card(email)+` .outcome.approved`, chromedp.ByQuery))
	checkShown(t, e, email, loaded, time.Now(), true)

	// On the request's own page: detail, shown when that page loaded.
	opened := time.Now()
	e.run(t, "open drop_table's page and deny it", chromedp.Navigate(e.url+"/approvals/"+drop),
		chromedp.WaitVisible(card(drop)+` .record.first`, chromedp.ByQuery),
		chromedp.Evaluate(`document.getElementById("as").value = "alice"; true`, nil),
		chromedp.Click(card(drop)+` [data-act="deny"]`, chromedp.ByQuery),
		chromedp.SetValue(card(drop)+` .reason`, "never on prod", chromedp.ByQuery),
		chromedp.Click(card(drop)+` .deny-panel button[type="submit"]`, chromedp.ByQuery),
		chromedp.WaitVisible(card(drop)+` .outcome.denied`, chromedp.ByQuery))
	checkShown(t, e, drop, opened, time.Now(), true)
}

// checkShown checks the answer alice gave request id on the web: shown
// between from and to, with detail as want.
func checkShown(t *testing.T, e *browserEnv, id string, from, to time.Time, detail bool) {
	t.Helper()
	stream, err := e.js.Stream(itest.TestCtx(t, itest.Patience), events.StreamName)
	if err != nil {
		t.Fatal(err)
	}
	m, err := stream.GetLastMsgForSubject(itest.TestCtx(t, itest.Patience), events.ResponsePrefix+"alice."+id)
	if err != nil {
		t.Fatalf("alice's answer to %s: %v", id, err)
	}
	ev, err := events.Decode(events.Header(m.Header), m.Data)
	if err != nil {
		t.Fatal(err)
	}
	r, err := events.DecodeResponded(&ev)
	if err != nil {
		t.Fatal(err)
	}
	// The page's time is the server's, to the nanosecond.
	if r.ShownAt.Before(from.Add(-time.Second)) || r.ShownAt.After(to) || r.Detail != detail || r.Channel != "web" {
		t.Errorf("answer to %s: shown_at %s (want between %s and %s), detail %v (want %v), channel %q",
			id, r.ShownAt.Format(time.RFC3339Nano), from.Format(time.RFC3339Nano), to.Format(time.RFC3339Nano), r.Detail, detail, r.Channel)
	}
}
