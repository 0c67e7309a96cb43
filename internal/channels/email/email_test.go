package email_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"html"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/assent-dev/assent/internal/broker"
	"github.com/assent-dev/assent/internal/brokertest"
	"github.com/assent-dev/assent/internal/channels"
	"github.com/assent-dev/assent/internal/channels/email"
	"github.com/assent-dev/assent/internal/smtptest"
	"github.com/assent-dev/assent/internal/testenv"
	"github.com/assent-dev/assent/pkg/events"
	"github.com/assent-dev/assent/pkg/handler"
	"github.com/assent-dev/assent/pkg/policy"
)

const linkSecret = "test-link-secret-0123456789-abcdefghijklmnop"

const teamPolicy = `version: 1
principals:
  alice:   {roles: [ops], email: alice@example.com}
  bob:     {roles: [ops], email: Bob@Example.com}
  mallory: {roles: [sales], email: mallory@example.com}
  dave:    {roles: [ops]}
rules:
  - name: deploys
    tools: [deploy]
    action: require_approval
    approvers: ["role:ops"]
    timeout: 2m
  - name: wires
    tools: [wire]
    action: require_approval
    approvers: ["role:ops"]
    quorum: 2
    timeout: 2m
  - name: mails
    tools: [send_email]
    action: require_approval
    approvers: ["role:ops"]
    timeout: 2m
`

// harness is a broker, the email channel, its web server and a test SMTP
// server, all real, for one test.
type harness struct {
	broker  *broker.Broker
	ns      *testenv.NATS
	smtp    *smtptest.Server
	web     *httptest.Server
	dir     *channels.Directory
	adapter *email.Adapter
	channel *handler.Channel
	client  *handler.Client
}

func setup(t *testing.T, src string, remind time.Duration) *harness {
	t.Helper()
	return setupWith(t, src, remind, nil)
}

// setupWith is setup with the mail going to plain, a server without TLS or
// authentication, in plain text; nil is a server with both.
func setupWith(t *testing.T, src string, remind time.Duration, plain *smtptest.Server) *harness {
	t.Helper()
	t.Setenv(email.DefaultLinkSecretEnv, linkSecret)
	t.Setenv(email.DefaultPasswordEnv, smtptest.Password)
	p, err := policy.Parse([]byte(src), "email.yaml")
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{ns: testenv.Server(t), dir: channels.NewDirectory(p)}
	h.broker, _ = brokertest.Run(t, testenv.Conn(t, h.ns), broker.Config{Policy: p})
	h.smtp = plain
	if plain == nil {
		h.smtp = smtptest.Start(t)
	}
	mux := http.NewServeMux()
	h.web = httptest.NewServer(mux)
	t.Cleanup(h.web.Close)
	nc := testenv.Conn(t, h.ns)
	log := testenv.Logger(t)
	cfg := email.Config{
		SMTP: email.SMTPConfig{Host: h.smtp.Host, Port: h.smtp.Port, Username: smtptest.User, CAFile: h.smtp.CAFile},
		From: "Assent <assent@example.com>",
	}
	if plain != nil {
		cfg.SMTP = email.SMTPConfig{Host: plain.Host, Port: plain.Port, TLS: email.TLSNone, InsecurePlaintext: true}
	}
	h.adapter, err = email.New(cfg, channels.Env{NATS: nc, Directory: h.dir, PublicURL: h.web.URL, WebUI: "https://assent.example.com", Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	h.channel, _ = brokertest.RunAdapter(t, nc, handler.ChannelConfig{Remind: remind, Logger: log}, h.adapter, mux)
	h.client, err = handler.NewClient(testenv.Conn(t, h.ns), handler.Config{Agent: "coder"})
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// ask makes a request without waiting for it; its decision arrives on the
// returned channel.
func (h *harness) ask(t *testing.T, req events.Requested) (string, <-chan handler.Decision) {
	t.Helper()
	return brokertest.Ask(t, h.client, handler.Request{Requested: req})
}

// pending fails the test if request id has a decision.
func (h *harness) pending(t *testing.T, id string) {
	t.Helper()
	d, decided, err := h.channel.Decision(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	if decided {
		t.Fatalf("request %s decided: %+v", id, d)
	}
}

// mailsTo waits for n mails about request id to addr, and returns all of
// them so far.
func (h *harness) mailsTo(t *testing.T, addr, id string, n int) []smtptest.Mail {
	t.Helper()
	return h.smtp.MailsAbout(t, addr, id, n)
}

func (h *harness) mailTo(t *testing.T, addr, id string) smtptest.Mail {
	t.Helper()
	return h.mailsTo(t, addr, id, 1)[0]
}

// get fetches a link page.
func get(t *testing.T, u string) (int, string, http.Header) {
	t.Helper()
	resp, err := http.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b), resp.Header
}

// post submits a link page's form.
func post(t *testing.T, u, reason string) (int, string) {
	t.Helper()
	resp, err := http.PostForm(u, url.Values{"reason": {reason}})
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

func wantPage(t *testing.T, what string, gotStatus int, body string, status int, texts ...string) {
	t.Helper()
	if gotStatus != status {
		t.Errorf("%s: status %d, want %d\n%s", what, gotStatus, status, body)
		return
	}
	for _, s := range texts {
		if !strings.Contains(body, s) {
			t.Errorf("%s: page lacks %q\n%s", what, s, body)
		}
	}
}

// TestApproveByLink: a request is mailed to each approver, over STARTTLS
// with AUTH PLAIN, as a text and an HTML part with the request and personal
// links; opening the approve link shows a confirmation and decides nothing;
// posting its form approves as alice through the email channel.
func TestApproveByLink(t *testing.T) {
	h := setup(t, teamPolicy, 0)
	args := json.RawMessage(`{"service":"api","version":"1.4.2","replicas":3}`)
	id, decided := h.ask(t, events.Requested{Tool: "deploy", Args: args, User: "carol", Session: "s-42", Hint: "Rolls out the login fix.", Labels: map[string]string{"env": "prod"}})

	m := h.mailTo(t, "alice@example.com", id)
	bobs := h.mailTo(t, "bob@example.com", id)
	if !m.TLS || !m.Auth {
		t.Fatalf("mail submitted with TLS %v, AUTH %v; want both", m.TLS, m.Auth)
	}
	if m.From != "assent@example.com" || len(m.To) != 1 {
		t.Fatalf("envelope from %q to %v", m.From, m.To)
	}
	for header, want := range map[string]string{
		"From":           `"Assent" <assent@example.com>`,
		"To":             "<alice@example.com>",
		"Message-Id":     "<assent." + id + ".alice@example.com>",
		"Auto-Submitted": "auto-generated",
	} {
		if got := m.Header.Get(header); got != want {
			t.Errorf("header %s: %q, want %q", header, got, want)
		}
	}
	if want := "[Assent] Approve deploy by coder?"; m.Subject != want {
		t.Errorf("subject %q, want %q", m.Subject, want)
	}
	for _, part := range []string{m.Text, html.UnescapeString(m.HTML)} {
		for _, s := range []string{"coder asks to run deploy", "carol", "s-42", "env=prod", "deploys", "Rolls out the login fix.", "service", "1.4.2", "replicas", id, "https://assent.example.com/approvals/" + id} {
			if !strings.Contains(part, s) {
				t.Errorf("a part lacks %q:\n%s", s, part)
			}
		}
	}
	approve := m.Approve(t)
	if !strings.HasPrefix(approve, h.web.URL+"/email/a/") || approve == m.Deny(t) || approve == bobs.Approve(t) {
		t.Fatalf("links: approve %s, deny %s, bob's approve %s: want personal links to the bot", approve, m.Deny(t), bobs.Approve(t))
	}

	// Opening the link (as a mail scanner would, twice) decides nothing.
	for range 2 {
		status, body, hdr := get(t, approve)
		wantPage(t, "GET approve", status, body, http.StatusOK, "Approve deploy?", `<form method="post">`, "You answer as <strong>alice</strong>", "s-42", "Rolls out the login fix.")
		csp := hdr.Get("Content-Security-Policy")
		sum := sha256.Sum256([]byte(email.PageCSS))
		for _, want := range []string{"default-src 'none'", "form-action 'self'", "frame-ancestors 'none'", "style-src 'sha256-" + base64.StdEncoding.EncodeToString(sum[:]) + "'"} {
			if !strings.Contains(csp, want) {
				t.Errorf("CSP %q lacks %q", csp, want)
			}
		}
		if !strings.Contains(body, "<style>"+email.PageCSS+"</style>") {
			t.Error("the page's style is not the one the CSP hash allows")
		}
		if hdr.Get("Referrer-Policy") != "no-referrer" || hdr.Get("Cache-Control") != "no-store" || hdr.Get("X-Frame-Options") != "DENY" {
			t.Errorf("headers %v", hdr)
		}
	}
	h.pending(t, id)

	status, body := post(t, approve, "ship it")
	wantPage(t, "POST approve", status, body, http.StatusOK, "You approved deploy", "approved by alice via email")
	d := brokertest.Decision(t, decided)
	if !d.Approved() || len(d.DecidedBy) != 1 || d.DecidedBy[0].Principal != "alice" || d.DecidedBy[0].Channel != "email" {
		t.Fatalf("decision %+v; want approved by alice via email", d)
	}

	// Every other link now says who decided.
	status, body, _ = get(t, m.Deny(t))
	wantPage(t, "GET alice's deny link after", status, body, http.StatusOK, "Already decided", "This request was already approved by alice via email, just now.")
	if strings.Contains(body, "<form") {
		t.Error("a decided request's page still has a form")
	}
	status, body = post(t, bobs.Deny(t), "too late")
	wantPage(t, "POST bob's deny link after", status, body, http.StatusConflict, "already approved by alice via email")
	if d, _, _ := h.channel.Decision(context.Background(), id); d.Outcome != events.Approved || len(d.DecidedBy) != 1 {
		t.Fatalf("decision changed: %+v", d)
	}
}

// TestDenyWithReason: the deny link's page asks for a reason, and the reason
// reaches the agent with the denial.
func TestDenyWithReason(t *testing.T) {
	h := setup(t, teamPolicy, 0)
	id, decided := h.ask(t, events.Requested{Tool: "deploy", Args: json.RawMessage(`{"service":"billing"}`)})
	deny := h.mailTo(t, "bob@example.com", id).Deny(t)
	status, body, _ := get(t, deny)
	wantPage(t, "GET deny", status, body, http.StatusOK, "Deny deploy?", "Why deny it?", `<textarea id="reason" name="reason"`, `class="deny"`)
	h.pending(t, id)
	status, body = post(t, deny, "  Not during the freeze.\r\nTry Monday.  ")
	wantPage(t, "POST deny", status, body, http.StatusOK, "You denied deploy", "denied by bob via email")
	d := brokertest.Decision(t, decided)
	if d.Outcome != events.Denied || d.DecidedBy[0].Principal != "bob" || d.DecidedBy[0].Channel != "email" || !strings.Contains(d.Reason, "Not during the freeze.\nTry Monday.") {
		t.Fatalf("decision %+v; want denied by bob via email with his reason", d)
	}
}

// TestRefusedLinks: links that are tampered with, cut, expired, for another
// principal, request, address or arguments, or whose principal may no
// longer answer, are refused with a clear page and the right status, on GET
// and POST, and change nothing: the real link still works afterwards.
func TestRefusedLinks(t *testing.T) {
	h := setup(t, teamPolicy, 0)
	args := json.RawMessage(`{"service":"api"}`)
	id, decided := h.ask(t, events.Requested{Tool: "deploy", Args: args})
	approve := h.mailTo(t, "alice@example.com", id).Approve(t)
	token := approve[strings.LastIndexByte(approve, '/')+1:]
	base := approve[:len(approve)-len(token)]
	deadline := time.Now().Add(time.Minute)
	flip := func(s string, i int) string {
		c := byte('A')
		if s[i] == 'A' {
			c = 'B'
		}
		return s[:i] + string(c) + s[i+1:]
	}
	dot := strings.IndexByte(token, '.')
	cases := []struct {
		name   string
		link   string
		status int
		text   string
	}{
		{"payload tampered", base + flip(token, 5), http.StatusForbidden, "Link not valid"},
		{"signature tampered", base + flip(token, dot+3), http.StatusForbidden, "Link not valid"},
		{"cut short", approve[:len(approve)-7], http.StatusForbidden, "Link not valid"},
		{"no signature", base + token[:dot], http.StatusForbidden, "Link not valid"},
		{"padded", approve + "=", http.StatusForbidden, "Link not valid"},
		{"expired", h.adapter.LinkForTest(id, "alice", "alice@example.com", events.Approve, args, time.Now().Add(-time.Second)), http.StatusGone, "Link expired"},
		{"not an approver", h.adapter.LinkForTest(id, "mallory", "mallory@example.com", events.Approve, args, deadline), http.StatusForbidden, "mallory may not answer this request"},
		{"unknown request", h.adapter.LinkForTest(events.NewID(), "alice", "alice@example.com", events.Approve, args, deadline), http.StatusNotFound, "Request not found"},
		{"other arguments", h.adapter.LinkForTest(id, "alice", "alice@example.com", events.Approve, json.RawMessage(`{"service":"db"}`), deadline), http.StatusForbidden, "Link out of date"},
		{"other address", h.adapter.LinkForTest(id, "alice", "alice@old.example.com", events.Approve, args, deadline), http.StatusForbidden, "no longer alice"},
	}
	for _, c := range cases {
		status, body, _ := get(t, c.link)
		wantPage(t, c.name+": GET", status, body, c.status, c.text)
		status, body = post(t, c.link, "")
		wantPage(t, c.name+": POST", status, body, c.status, c.text)
		if strings.Contains(body, "<form") {
			t.Errorf("%s: a refusal shows a form", c.name)
		}
	}
	h.pending(t, id)

	// Alice leaves the ops role: her link is refused while she may not
	// answer, and works again once she may.
	p, err := policy.Parse([]byte(strings.Replace(teamPolicy, "alice:   {roles: [ops]", "alice:   {roles: [sales]", 1)), "moved.yaml")
	if err != nil {
		t.Fatal(err)
	}
	before := h.dir.Policy()
	h.dir.Set(p)
	status, body, _ := get(t, approve)
	wantPage(t, "no longer an approver: GET", status, body, http.StatusForbidden, "alice may not answer this request")
	status, body = post(t, approve, "")
	wantPage(t, "no longer an approver: POST", status, body, http.StatusForbidden, "alice may not answer this request")
	h.pending(t, id)
	h.dir.Set(before)

	status, body = post(t, approve, "")
	wantPage(t, "the real link", status, body, http.StatusOK, "You approved deploy")
	if d := brokertest.Decision(t, decided); !d.Approved() || d.DecidedBy[0].Principal != "alice" {
		t.Fatalf("decision %+v", d)
	}
}

// TestLinkWorksOnce: a used link is refused (409) on POST and GET, even while
// the request still waits; the request is decided by the answers that count.
func TestLinkWorksOnce(t *testing.T) {
	h := setup(t, teamPolicy, 0)
	id, decided := h.ask(t, events.Requested{Tool: "wire", Args: json.RawMessage(`{"amount":5000}`)})
	alice := h.mailTo(t, "alice@example.com", id).Approve(t)
	status, body := post(t, alice, "")
	wantPage(t, "first POST", status, body, http.StatusOK, "You approved wire", "still waits for other approvals")
	status, body = post(t, alice, "")
	wantPage(t, "second POST", status, body, http.StatusConflict, "Link already used", "still waits")
	status, body, _ = get(t, alice)
	wantPage(t, "GET after use", status, body, http.StatusConflict, "Link already used")
	h.pending(t, id)

	status, body = post(t, h.mailTo(t, "bob@example.com", id).Approve(t), "")
	wantPage(t, "bob's POST", status, body, http.StatusOK, "You approved wire", "approved by alice via email, bob via email")
	d := brokertest.Decision(t, decided)
	if !d.Approved() || len(d.DecidedBy) != 2 {
		t.Fatalf("decision %+v; want approved by alice and bob", d)
	}
	status, body = post(t, alice, "")
	wantPage(t, "POST after the decision", status, body, http.StatusConflict, "already approved by alice via email, bob via email")
}

// nobody is a Notifier that shows nothing: a second channel, to answer
// through.
type nobody struct{}

func (nobody) Notify(context.Context, handler.Notice) (json.RawMessage, error) { return nil, nil }
func (nobody) Resolve(context.Context, handler.Outcome) error                  { return nil }

// TestDecidedElsewhere: a request answered on another channel shows who
// decided on the mailed links, and they no longer answer.
func TestDecidedElsewhere(t *testing.T) {
	h := setup(t, teamPolicy, 0)
	id, decided := h.ask(t, events.Requested{Tool: "deploy"})
	m := h.mailTo(t, "alice@example.com", id)
	slack, err := handler.NewChannel(testenv.Conn(t, h.ns), handler.ChannelConfig{Channel: "slack"}, nobody{})
	if err != nil {
		t.Fatal(err)
	}
	if err := slack.Answer(context.Background(), "bob", id, handler.Response{Decision: events.Approve}); err != nil {
		t.Fatal(err)
	}
	if d := brokertest.Decision(t, decided); !d.Approved() {
		t.Fatalf("decision %+v", d)
	}
	status, body, _ := get(t, m.Deny(t))
	wantPage(t, "GET", status, body, http.StatusOK, "Already decided", "This request was already approved by bob via slack, just now.")
	status, body = post(t, m.Deny(t), "no")
	wantPage(t, "POST", status, body, http.StatusConflict, "already approved by bob via slack")
	d, _, err := h.channel.Decision(context.Background(), id)
	if err != nil || d.Outcome != events.Approved || len(d.DecidedBy) != 1 || d.DecidedBy[0].Channel != "slack" {
		t.Fatalf("decision %+v, %v; want bob's approval via slack alone", d, err)
	}
}

// TestHostileRequest: markup, bidirectional overrides and huge values from
// the agent are escaped and cut in the mail and on the page.
func TestHostileRequest(t *testing.T) {
	h := setup(t, teamPolicy, 0)
	items := make([]int, 200)
	args, err := json.Marshal(map[string]any{
		"cmd":   `<script>alert(1)</script>`,
		"file":  "invoice\u202efdp.exe",
		"quote": `"></pre><img src=x onerror=alert(2)>`,
		"blob":  strings.Repeat("x", 5000),
		"items": items,
	})
	if err != nil {
		t.Fatal(err)
	}
	id, _ := h.ask(t, events.Requested{Tool: "deploy", Args: args, Hint: "<b onmouseover=alert(3)>urgent</b>\u202e", User: "<i>root</i>"})
	m := h.mailTo(t, "alice@example.com", id)
	status, page, _ := get(t, m.Approve(t))
	if status != http.StatusOK {
		t.Fatalf("GET: %d\n%s", status, page)
	}
	for name, doc := range map[string]string{"HTML part": m.HTML, "page": page} {
		for _, bad := range []string{"<script", "<img", "<b ", "<i>", "\u202e"} {
			if strings.Contains(doc, bad) {
				t.Errorf("%s contains %q", name, bad)
			}
		}
		for _, want := range []string{"&lt;script&gt;alert(1)&lt;/script&gt;", "&lt;img src=x onerror=alert(2)&gt;", `invoice\u202efdp.exe`, "4840 more characters", "241 more characters", "&lt;i&gt;root&lt;/i&gt;"} {
			if !strings.Contains(doc, want) {
				t.Errorf("%s lacks %q", name, want)
			}
		}
	}
	if strings.Contains(m.Text, "\u202e") || !strings.Contains(m.Text, `<script>alert(1)</script>`) {
		t.Errorf("text part: want markup as text and no bidirectional override:\n%s", m.Text)
	}
	if len(m.Data) > 64<<10 {
		t.Errorf("mail of %d bytes; the arguments should be cut", len(m.Data))
	}
}

// TestEscalationAndReminder: an escalation mails the approver it adds; a
// reminder mails everyone who may still answer, in the same thread; a
// reminder's link answers.
func TestEscalationAndReminder(t *testing.T) {
	h := setup(t, `version: 1
principals:
  alice: {roles: [ops], email: alice@example.com}
  bob:   {roles: [cfo], email: bob@example.com}
rules:
  - name: wires
    tools: [wire]
    action: require_approval
    approvers: [alice]
    timeout: 8s
    escalation:
      - after: 1s
        approvers: [bob]
`, 3*time.Second) // reminded 5s in: not before half the request's time
	id, decided := h.ask(t, events.Requested{Tool: "wire", Args: json.RawMessage(`{"amount":900}`)})
	first := h.mailTo(t, "alice@example.com", id)
	esc := h.mailTo(t, "bob@example.com", id)
	if !strings.Contains(esc.Subject, "Escalated to you") || !strings.Contains(esc.Text, "Escalated:") {
		t.Errorf("escalation mail: %q\n%s", esc.Subject, esc.Text)
	}
	if strings.Contains(first.Subject, "Escalated") {
		t.Errorf("first mail: %q", first.Subject)
	}
	for _, who := range []struct{ name, addr string }{{"alice", "alice@example.com"}, {"bob", "bob@example.com"}} {
		ms := h.mailsTo(t, who.addr, id, 2)
		r := ms[len(ms)-1]
		root := "<assent." + id + "." + who.name + "@example.com>"
		if !strings.Contains(r.Subject, "Reminder") || !strings.Contains(r.Text, "Reminder:") || r.Header.Get("In-Reply-To") != root || r.Header.Get("References") != root {
			t.Errorf("%s's reminder: %q, In-Reply-To %q\n%s", who.name, r.Subject, r.Header.Get("In-Reply-To"), r.Text)
		}
		if ms[0].Header.Get("Message-Id") != root {
			t.Errorf("%s's first mail has Message-ID %q, want %q", who.name, ms[0].Header.Get("Message-Id"), root)
		}
	}
	reminder := h.mailsTo(t, "alice@example.com", id, 2)[1]
	status, body := post(t, reminder.Approve(t), "")
	wantPage(t, "POST from the reminder", status, body, http.StatusOK, "You approved wire")
	if d := brokertest.Decision(t, decided); !d.Approved() || d.DecidedBy[0].Principal != "alice" {
		t.Fatalf("decision %+v", d)
	}
	if n := len(h.smtp.Matching(func(d smtptest.Delivery) bool { return bytes.Contains(d.Data, []byte("<assent."+id+".")) })); n != 4 {
		t.Errorf("%d mails, want 4 (two each)", n)
	}
}

// TestRetryMailsOnlyTheFailed: when the server refuses one recipient for a
// while, the notification is retried and only that recipient is mailed
// again.
func TestRetryMailsOnlyTheFailed(t *testing.T) {
	h := setup(t, teamPolicy, 0)
	h.smtp.FailOnce("bob@example.com")
	id, _ := h.ask(t, events.Requested{Tool: "deploy"})
	h.mailTo(t, "bob@example.com", id)
	time.Sleep(500 * time.Millisecond) // time for a stray second mail to alice
	if n := len(h.mailsTo(t, "alice@example.com", id, 1)); n != 1 {
		t.Fatalf("alice got %d mails, want 1", n)
	}
	if rcpt, auth := h.smtp.Refusals(); rcpt != 1 || auth != 0 {
		t.Fatalf("%d refusals, %d failed logins; want 1 and 0", rcpt, auth)
	}
}

// TestLongArgumentsHideNoKey: a long argument written first (and a longer
// list after it) pushes no other argument out of the mail. Every key, in
// the order the agent wrote it, shows with its value's start in the first
// screenful of the text part and in the HTML part's list, a cut value says
// how many characters it left out, and the values follow in full below
// the list; the link page shows them too.
func TestLongArgumentsHideNoKey(t *testing.T) {
	h := setup(t, teamPolicy, 0)
	body := strings.Repeat("Dear customer, please find your invoice attached. ", 66) // 3,300 characters
	attachments := make([]string, 40)
	for i := range attachments {
		attachments[i] = fmt.Sprintf("https://files.example.com/%02d/", i) + strings.Repeat("x", 220)
	}
	attJSON, _ := json.Marshal(attachments)
	args := json.RawMessage(`{"body":` + string(mustJSON(t, body)) + `,"attachments":` + string(attJSON) + `,"subject":"Your invoice","to":"mallory@evil.example"}`)
	id, _ := h.ask(t, events.Requested{Tool: "send_email", Args: args, Hint: "Sends the monthly invoice.\nNothing else."})
	m := h.mailTo(t, "alice@example.com", id)

	keys := []struct{ key, start string }{
		{"body", "Dear customer, please find"},
		{"attachments", `["https://files.example.com/00/`},
		{"subject", "Your invoice"},
		{"to", "mallory@evil.example"},
	}
	first := screenful(m.Text, 80, 50)
	at := 0
	for _, k := range keys {
		i := strings.Index(first[at:], k.key+":")
		if i < 0 {
			t.Fatalf("the first 50 lines of the text part lack %q after the keys before it:\n%s", k.key+":", first)
		}
		at += i
		if !strings.Contains(first[at:], k.start) {
			t.Errorf("the first screenful lacks the start of %s, %q:\n%s", k.key, k.start, first)
		}
	}
	for _, more := range []string{"3140 more characters", fmt.Sprint(len(attJSON)-160) + " more characters"} {
		if !strings.Contains(first, more) {
			t.Errorf("the first screenful lacks %q:\n%s", more, first)
		}
	}
	if !strings.Contains(m.Text, body) || !strings.Contains(m.Text, string(attJSON)) {
		t.Errorf("the text part lacks the whole values below the list:\n%s", m.Text)
	}

	doc := html.UnescapeString(m.HTML)
	full := strings.Index(doc, body)
	if full < 0 || !strings.Contains(doc, string(attJSON)) {
		t.Fatalf("the HTML part lacks the whole values")
	}
	at = 0
	for _, k := range keys {
		i := strings.Index(doc[at:], ">"+k.key+"<")
		if i < 0 || at+i > full {
			t.Fatalf("the HTML part's list lacks %q before the whole values", k.key)
		}
		at += i
		if !strings.Contains(doc[at:full], k.start) {
			t.Errorf("the HTML list lacks the start of %s, %q", k.key, k.start)
		}
	}
	if !strings.Contains(doc[:full], "3140 more characters") {
		t.Errorf("the HTML list does not say how much of body it leaves out")
	}

	status, page, _ := get(t, m.Approve(t))
	page = html.UnescapeString(page)
	wantPage(t, "GET approve", status, page, http.StatusOK, "3140 more characters", body, string(attJSON), ">to<", "mallory@evil.example")
}

// screenful returns the start of a text as a window of rows of width
// columns shows it: long lines wrap.
func screenful(text string, width, rows int) string {
	var b strings.Builder
	for _, l := range strings.Split(text, "\n") {
		for {
			if rows == 0 {
				return b.String()
			}
			rows--
			r := []rune(l)
			if len(r) <= width {
				b.WriteString(l + "\n")
				break
			}
			b.WriteString(string(r[:width]) + "\n")
			l = string(r[width:])
		}
	}
	return b.String()
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestInsecurePlaintext: with tls none and insecure_plaintext, mail goes
// in plain text to a server that is not on loopback, as to a mail catcher
// in Compose, and the channel warns that it does.
func TestInsecurePlaintext(t *testing.T) {
	host := smtptest.ExternalIP(t)
	h := setupWith(t, teamPolicy, 0, smtptest.StartPlain(t, host))
	w := h.adapter.Warnings()
	if len(w) != 1 || !strings.Contains(w[0], "unencrypted") || !strings.Contains(w[0], host) || !strings.Contains(w[0], "development only") {
		t.Errorf("warnings %q", w)
	}
	id, decided := h.ask(t, events.Requested{Tool: "deploy", Args: json.RawMessage(`{"service":"api"}`)})
	m := h.mailTo(t, "alice@example.com", id)
	if m.TLS || m.Auth {
		t.Errorf("mail submitted with TLS %v, AUTH %v; want neither", m.TLS, m.Auth)
	}
	status, body := post(t, m.Approve(t), "")
	wantPage(t, "POST approve", status, body, http.StatusOK, "You approved deploy")
	if d := brokertest.Decision(t, decided); !d.Approved() {
		t.Fatalf("decision %+v", d)
	}
}

// TestMailedAgainAfterACrash: a mail the bot sent but did not record (it
// died in between) goes out again when the notice comes again. The second
// mail has the first's Message-ID, so that mail clients thread it with the
// first or drop it, and the same links; each link works once across both
// mails, and the first answer decides.
func TestMailedAgainAfterACrash(t *testing.T) {
	h := setup(t, teamPolicy, 0)
	ctx := context.Background()
	id, decided := h.ask(t, events.Requested{Tool: "deploy", Args: json.RawMessage(`{"service":"api"}`)})
	first := h.mailTo(t, "alice@example.com", id)
	for deadline := time.Now().Add(10 * time.Second); !h.adapter.MailedForTest(ctx, id, "alice") || !h.adapter.MailedForTest(ctx, id, "bob"); {
		if time.Now().After(deadline) {
			t.Fatal("the mails to alice and bob are not recorded after 10s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := h.adapter.ForgetMailedForTest(ctx, id, "alice"); err != nil {
		t.Fatal(err)
	}
	n, _, ok, err := h.channel.Lookup(ctx, id)
	if err != nil || !ok {
		t.Fatalf("lookup %s: %v, %v", id, ok, err)
	}
	if _, err := h.adapter.Notify(ctx, n); err != nil {
		t.Fatal(err)
	}
	ms := h.mailsTo(t, "alice@example.com", id, 2)
	if len(ms) != 2 {
		t.Fatalf("alice got %d mails, want 2", len(ms))
	}
	again := ms[1]
	if got, want := again.Header.Get("Message-Id"), first.Header.Get("Message-Id"); got != want || want != "<assent."+id+".alice@example.com>" {
		t.Errorf("Message-ID %q again, first %q", got, want)
	}
	if again.Subject != first.Subject || again.Approve(t) != first.Approve(t) || again.Deny(t) != first.Deny(t) {
		t.Errorf("the mail again differs: %q, %s; first %q, %s", again.Subject, again.Approve(t), first.Subject, first.Approve(t))
	}
	if n := len(h.mailsTo(t, "bob@example.com", id, 1)); n != 1 {
		t.Errorf("bob got %d mails, want 1: only the unrecorded mail goes again", n)
	}
	status, body := post(t, again.Deny(t), "no")
	wantPage(t, "POST deny from the mail again", status, body, http.StatusOK, "You denied deploy")
	status, body = post(t, first.Approve(t), "")
	wantPage(t, "POST approve from the first mail", status, body, http.StatusConflict, "already denied by alice via email")
	if d := brokertest.Decision(t, decided); d.Outcome != events.Denied {
		t.Fatalf("decision %+v", d)
	}
}
