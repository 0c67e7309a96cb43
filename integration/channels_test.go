package integration

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/assent-dev/assent/integration/itest"
	"github.com/assent-dev/assent/internal/bot"
	"github.com/assent-dev/assent/internal/broker"
	"github.com/assent-dev/assent/internal/brokertest"
	slackch "github.com/assent-dev/assent/internal/channels/slack"
	"github.com/assent-dev/assent/internal/channels/webhook"
	"github.com/assent-dev/assent/internal/clustertest"
	"github.com/assent-dev/assent/internal/slacktest"
	"github.com/assent-dev/assent/internal/smtptest"
	"github.com/assent-dev/assent/internal/testenv"
	"github.com/assent-dev/assent/pkg/events"
	"github.com/assent-dev/assent/pkg/handler"
)

// channelsPolicy: four ops, each answering on a channel of their own: alice
// on Slack, bob by email, carol through the HTTP API, ci-bot through a signed
// inbound webhook.
const channelsPolicy = `version: 1
principals:
  alice:  {slack: UALICE, roles: [ops]}
  bob:    {email: bob@example.com, roles: [ops]}
  carol:  {roles: [ops]}
  ci-bot: {roles: [ops]}
rules:
  - name: deploys
    tools: [deploy]
    action: require_approval
    approvers: ["role:ops"]
    timeout: 5m
`

// The secrets of the bots' channels, in the environment variables their
// configuration names.
const (
	itSlackBot    = "xoxb-1-itest"
	itSlackSecret = "itest-slack-signing-secret"
	itSlackRoom   = "CAPPROVALS"
)

// channelWorld is a broker with its HTTP API on embedded NATS, a local Slack,
// a real SMTP server, a webhook receiver, and the configuration of approver
// bots running every channel against them.
type channelWorld struct {
	ns    *testenv.NATS
	js    jetstream.JetStream
	b     *broker.Broker
	api   string
	agent *handler.Client

	slack *slacktest.Server
	smtp  *smtptest.Server
	hooks *hookReceiver
	ciKey []byte // the inbound endpoint ci's secret

	dir    string
	policy string
	creds  string            // the bots' NATS credentials file, if any
	env    map[string]string // the bots' secrets
	// trusted are the decision keys the bots trust, if any.
	trusted []string
}

func newChannelWorld(t testing.TB) *channelWorld {
	t.Helper()
	ns := testenv.Server(t)
	return newChannelWorldOn(t, ns, testenv.Conn(t, ns), testenv.Conn(t, ns), broker.Config{})
}

// newChannelWorldOn is newChannelWorld on server ns, the broker (with cfg,
// its policy the world's) on brokerNC and the agent on agentNC.
func newChannelWorldOn(t testing.TB, ns *testenv.NATS, brokerNC, agentNC *nats.Conn, cfg broker.Config) *channelWorld {
	t.Helper()
	w := &channelWorld{dir: t.TempDir(), env: map[string]string{}, ns: ns}
	w.policy = filepath.Join(w.dir, "policy.yaml")
	if err := os.WriteFile(w.policy, []byte(channelsPolicy), 0o600); err != nil {
		t.Fatal(err)
	}
	w.js = itest.NewJS(t, brokerNC)
	cfg.Name, cfg.Policy = "itest", itest.MustPolicy(t, channelsPolicy, w.policy)
	w.b, _ = brokertest.Run(t, brokerNC, cfg)
	w.api = itest.ServeAPI(t, w.b)
	var err error
	w.agent, err = handler.NewClient(agentNC, handler.Config{Agent: "coder", Logger: quietLogger(t)})
	if err != nil {
		t.Fatal(err)
	}

	w.slack = slacktest.New(t, itSlackBot, "xapp-unused")
	w.smtp = smtptest.Start(t)
	var outSecret string
	outSecret, outKey := webhookSecret(t)
	w.hooks = newHookReceiver(t, outKey)
	var inSecret string
	inSecret, w.ciKey = webhookSecret(t)
	linkKey := make([]byte, 32)
	if _, err := rand.Read(linkKey); err != nil {
		t.Fatal(err)
	}
	w.env = map[string]string{
		"IT_SLACK_BOT_TOKEN":      itSlackBot,
		"IT_SLACK_SIGNING_SECRET": itSlackSecret,
		"IT_SMTP_PASSWORD":        smtptest.Password,
		"IT_EMAIL_LINK_SECRET":    base64.StdEncoding.EncodeToString(linkKey),
		"IT_HOOK_AUDIT":           outSecret,
		"IT_HOOK_CI":              inSecret,
	}
	return w
}

// quietLogger logs through t, except in a benchmark, which would print
// every line.
func quietLogger(t testing.TB) *zap.Logger {
	if _, bench := t.(*testing.B); bench {
		return zap.NewNop()
	}
	return testenv.Logger(t)
}

// webhookSecret makes a Standard Webhooks secret and returns it with its key.
func webhookSecret(t testing.TB) (string, []byte) {
	t.Helper()
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		t.Fatal(err)
	}
	return webhook.SecretPrefix + base64.StdEncoding.EncodeToString(key), key
}

// config writes a bot configuration serving on listen and returns its file.
func (w *channelWorld) config(t testing.TB, name, listen string) string {
	t.Helper()
	src := fmt.Sprintf(`nats:
  url: %s
  creds: %q
policy: %s
http:
  listen: %s
web_ui: %s
remind: 0
trusted_decision_keys: [%s]
slack:
  channel: %s
  api_url: %s
  bot_token_env: IT_SLACK_BOT_TOKEN
  signing_secret_env: IT_SLACK_SIGNING_SECRET
email:
  from: "Assent <assent@example.com>"
  link_secret_env: IT_EMAIL_LINK_SECRET
  smtp:
    host: %s
    port: %d
    username: %s
    password_env: IT_SMTP_PASSWORD
    ca_file: %s
webhooks:
  endpoints:
    - name: audit
      url: %s
      secret_env: IT_HOOK_AUDIT
  inbound:
    - name: ci
      secret_env: IT_HOOK_CI
      principal: ci-bot
`, w.ns.ClientURL(), w.creds, w.policy, listen, w.api, strings.Join(w.trusted, ", "), itSlackRoom, w.slack.URL(),
		w.smtp.Host, w.smtp.Port, smtptest.User, w.smtp.CAFile, w.hooks.URL())
	file := filepath.Join(w.dir, name+".yaml")
	if err := os.WriteFile(file, []byte(src), 0o600); err != nil {
		t.Fatal(err)
	}
	return file
}

// runBot runs an approver bot in this process, as `approver-bot run` does,
// until the test ends; it returns the bot's base URL.
func (w *channelWorld) runBot(t testing.TB, name string) string {
	t.Helper()
	for k, v := range w.env {
		t.Setenv(k, v)
	}
	listen := net.JoinHostPort("127.0.0.1", strconv.Itoa(clustertest.FreePort(t)))
	cfg, err := bot.LoadConfig(w.config(t, name, listen))
	if err != nil {
		t.Fatal(err)
	}
	b, err := bot.New(cfg, quietLogger(t).Named(name))
	if err != nil {
		t.Fatal(err)
	}
	ready := make(chan string, 1)
	b.Ready = func(addr string) { ready <- addr }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- b.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("bot %s: Run: %v", name, err)
			}
		case <-time.After(itest.Patience):
			t.Errorf("bot %s: Run did not return %s after its context ended", name, itest.Patience)
		}
	})
	select {
	case addr := <-ready:
		return "http://" + addr
	case err := <-done:
		t.Fatalf("bot %s stopped: %v", name, err)
	case <-time.After(itest.Patience):
		t.Fatalf("bot %s not serving after %s", name, itest.Patience)
	}
	return ""
}

// ask makes a deploy request without waiting for its decision.
func (w *channelWorld) ask(t testing.TB, what string) (string, <-chan handler.Decision) {
	t.Helper()
	return brokertest.Ask(t, w.agent, handler.Request{Requested: events.Requested{
		Tool: "deploy", Args: json.RawMessage(`{"service":"` + what + `"}`), Timeout: events.Duration(5 * time.Minute)}})
}

// shown waits until every channel showed request id: its Slack message, its
// mail to bob, and its pending event at the webhook receiver.
func (w *channelWorld) shown(t testing.TB, id string) (slacktest.Message, smtptest.Mail) {
	t.Helper()
	var m slacktest.Message
	w.slack.Wait(t, "Slack message of "+id, func() bool {
		var ok bool
		m, ok = w.slack.Message(id)
		return ok
	})
	mail := w.smtp.MailsAbout(t, "bob@example.com", id, 1)[0]
	w.hooks.wait(t, id, events.TypePending)
	return m, mail
}

// outcome waits until request id's Slack message shows its outcome, who
// decided and no buttons, and returns the message.
func (w *channelWorld) outcome(t testing.TB, id, who string) slacktest.Message {
	t.Helper()
	var m slacktest.Message
	w.slack.Wait(t, "Slack message of "+id+" showing its decision by "+who, func() bool {
		m, _ = w.slack.Message(id)
		return strings.Contains(m.Blocks, "by* "+who)
	})
	if strings.Contains(m.Blocks, `"actions"`) {
		t.Fatalf("the decided request's Slack message keeps its buttons: %s", m.Blocks)
	}
	return m
}

// hookReceiver is a webhook receiver that verifies every delivery as
// docs/channels.md tells receivers to, and records the events.
type hookReceiver struct {
	t   testing.TB
	key []byte
	srv *httptest.Server

	mu  sync.Mutex
	got []hookEvent
}

// hookEvent is one delivery a receiver took.
type hookEvent struct {
	WebhookID, Type, RequestID string
	Data                       json.RawMessage
	At                         time.Time // when the receiver took it
}

func newHookReceiver(t testing.TB, key []byte) *hookReceiver {
	t.Helper()
	r := &hookReceiver{t: t, key: key}
	r.srv = httptest.NewServer(r)
	t.Cleanup(r.srv.Close)
	return r
}

func (r *hookReceiver) URL() string { return r.srv.URL + "/hook" }

func (r *hookReceiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	body, err := io.ReadAll(req.Body)
	if err != nil {
		return
	}
	if err := webhook.Verify(r.key, req.Header, body, time.Now()); err != nil {
		r.t.Errorf("webhook delivery with a bad signature: %v", err)
		w.WriteHeader(http.StatusUnauthorized)
		return
	}
	e, err := events.Decode(events.Header(req.Header), body)
	if err != nil {
		r.t.Errorf("webhook delivery is not a CloudEvent: %v\n%s", err, body)
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	id, _ := e.Extensions()[webhook.ExtRequestID].(string)
	r.mu.Lock()
	r.got = append(r.got, hookEvent{WebhookID: req.Header.Get(webhook.HeaderID), Type: e.Type(), RequestID: id, Data: e.Data(), At: time.Now()})
	r.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

// events returns the deliveries about request id of type typ ("" for all).
func (r *hookReceiver) events(id, typ string) []hookEvent {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []hookEvent
	for _, e := range r.got {
		if e.RequestID == id && (typ == "" || e.Type == typ) {
			out = append(out, e)
		}
	}
	return out
}

// wait waits for a delivery about request id of type typ.
func (r *hookReceiver) wait(t testing.TB, id, typ string) hookEvent {
	t.Helper()
	var got []hookEvent
	itest.Eventually(t, itest.Patience, func() (bool, string) {
		got = r.events(id, typ)
		return len(got) > 0, "no " + typ + " event for " + id + " at the webhook receiver"
	})
	return got[0]
}

// duplicates returns the webhook ids delivered more than once.
func (r *hookReceiver) duplicates() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	seen := map[string]int{}
	var out []string
	for _, e := range r.got {
		if seen[e.WebhookID]++; seen[e.WebhookID] == 2 {
			out = append(out, e.WebhookID)
		}
	}
	return out
}

// answer is what one channel's answer got back.
type answer struct {
	channel string
	status  int
	body    string
	err     error
}

// TestFanOutRace: a request goes to every channel of two approver bots
// running side by side, once each; Slack, email, the HTTP API and a signed
// webhook then answer it at the same moment. There is one decision, and
// every channel shows it: the Slack message names who decided, the email
// link's page says it was already decided and by whom, the webhook receiver
// gets the decided event, and the losers get a clear answer. The first round
// sends the four answers at once; in each later one, one channel leads the
// others by a moment, so that each has its chance to win (the HTTP API, inside
// the broker's process, wins an even start).
func TestFanOutRace(t *testing.T) {
	w := newChannelWorld(t)
	bots := []string{w.runBot(t, "bot-a"), w.runBot(t, "bot-b")}
	verdicts := map[string]events.Verdict{"alice": events.Approve, "bob": events.Deny, "carol": events.Approve, "ci-bot": events.Deny}
	channelOf := map[string]string{"alice": "slack", "bob": "email", "carol": "http", "ci-bot": "webhook"}
	winners := map[string]int{}
	leaders := []string{"", "slack", "email", "webhook", "http"}
	for round, leader := range leaders {
		id, decided := w.ask(t, fmt.Sprintf("round-%d", round))
		m, mail := w.shown(t, id)
		deny := mail.Deny(t)
		if status, page := getPage(t, deny); status != http.StatusOK || !strings.Contains(page, "reason") {
			t.Fatalf("deny link: %d\n%s", status, page)
		}
		inbound := []byte(fmt.Sprintf(`{"request_id":%q,"decision":"deny","reason":"ci says no"}`, id))
		hookHeader := http.Header{}
		hookHeader.Set(webhook.HeaderID, "msg-"+id)
		now := time.Now()
		hookHeader.Set(webhook.HeaderTimestamp, strconv.FormatInt(now.Unix(), 10))
		hookHeader.Set(webhook.HeaderSignature, webhook.Sign(w.ciKey, "msg-"+id, now, inbound))
		hookHeader.Set("Content-Type", "application/json")
		click := slacktest.Form(t, slacktest.Click("UALICE", "assent.approve", id, m))

		start := make(chan struct{})
		answers := make(chan answer, 4)
		var wg sync.WaitGroup
		send := func(channel, method, u string, h http.Header, body string) {
			wg.Go(func() {
				<-start
				if leader != "" && channel != leader {
					time.Sleep(50 * time.Millisecond)
				}
				ctx, cancel := itest.OpCtx()
				defer cancel()
				r, err := itest.DoHTTPWith(ctx, method, u, h, body)
				answers <- answer{channel, r.Status, string(r.Body), err}
			})
		}
		slackBot := bots[round%2]
		send("slack", http.MethodPost, slackBot+slackch.InteractionsPath, slacktest.SignedHeader(itSlackSecret, now, click), click)
		send("email", http.MethodPost, deny, http.Header{"Content-Type": {"application/x-www-form-urlencoded"}}, url.Values{"reason": {"email says no"}}.Encode())
		send("http", http.MethodPost, w.api+"/v1/approvals/"+id+"/decision", nil, `{"principal":"carol","decision":"approve"}`)
		send("webhook", http.MethodPost, bots[(round+1)%2]+"/webhooks/in/ci", hookHeader, string(inbound))
		close(start)
		wg.Wait()
		close(answers)
		for a := range answers {
			if a.err != nil {
				t.Fatalf("%s: %v", a.channel, a.err)
			}
			if a.status >= 500 || (a.status >= 400 && a.status != http.StatusConflict) {
				t.Errorf("%s answered %d: %s", a.channel, a.status, a.body)
			}
			if a.status == http.StatusConflict && !strings.Contains(a.body, "already") {
				t.Errorf("%s: a lost race says %q; want it to say the request was already decided", a.channel, a.body)
			}
		}

		d := brokertest.Decision(t, decided)
		if len(d.DecidedBy) != 1 {
			t.Fatalf("round %d: decided by %+v; want one approver", round, d.DecidedBy)
		}
		by := d.DecidedBy[0]
		want, ok := verdicts[by.Principal]
		if !ok || by.Channel != channelOf[by.Principal] || d.Approved() != (want == events.Approve) {
			t.Fatalf("round %d: decision %s by %s via %s", round, d.Outcome, by.Principal, by.Channel)
		}
		winners[by.Principal]++
		if n := itest.CountDecisions(t, w.js, id); n != 1 {
			t.Fatalf("round %d: %d decided events on the stream, want 1", round, n)
		}
		who := by.Principal + " via " + by.Channel
		t.Logf("round %d: %s by %s", round, d.Outcome, who)

		// Slack: the one message of the request names who decided.
		w.outcome(t, id, who)
		// Email: bob's approve link, never used, says who decided.
		status, page := getPage(t, mail.Approve(t))
		if status != http.StatusOK || !strings.Contains(page, "already "+string(d.Outcome)+" by "+who) {
			t.Errorf("round %d: the approve link after the decision: %d\n%s", round, status, page)
		}
		// Webhooks: the decided event, once.
		got := w.hooks.wait(t, id, events.TypeDecided)
		var dd events.Decided
		if err := json.Unmarshal(got.Data, &dd); err != nil || dd.Outcome != d.Outcome || len(dd.DecidedBy) != 1 || dd.DecidedBy[0].Principal != by.Principal {
			t.Errorf("round %d: the webhook's decided event: %s (%v)", round, got.Data, err)
		}
		// Each channel showed the request once across the two bots.
		for _, c := range []struct {
			what string
			n    int
		}{
			{"Slack messages", w.countSlackMessages(id)},
			{"mails to bob", len(w.smtp.Matching(smtptest.About("bob@example.com", id)))},
			{"pending webhooks", len(w.hooks.events(id, events.TypePending))},
			{"decided webhooks", len(w.hooks.events(id, events.TypeDecided))},
		} {
			if c.n != 1 {
				t.Errorf("round %d: %d %s, want 1", round, c.n, c.what)
			}
		}
	}
	// Let late answers and retractions settle, then: nothing delivered twice.
	time.Sleep(500 * time.Millisecond)
	if d := w.hooks.duplicates(); len(d) > 0 {
		t.Errorf("webhook ids delivered twice: %v", d)
	}
	t.Logf("winners: %v", winners)
}

// countSlackMessages counts the top-level messages about request id.
func (w *channelWorld) countSlackMessages(id string) int {
	return len(slices.DeleteFunc(w.slack.Messages(), func(m slacktest.Message) bool {
		return m.ThreadTS != "" || !strings.Contains(m.Blocks, id)
	}))
}

// getPage fetches u and returns its status and body.
func getPage(t *testing.T, u string) (int, string) {
	t.Helper()
	r := itest.Call(t, http.MethodGet, u, nil)
	return r.Status, string(r.Body)
}

// startBotProc runs the built approver-bot with the configuration name on
// listen, with the world's secrets in its environment, and waits until it
// is ready.
func (w *channelWorld) startBotProc(t *testing.T, bin, name, listen string, log *itest.LockedBuffer) *itest.Proc {
	t.Helper()
	cfg := w.config(t, name, listen)
	env := os.Environ()
	for k, v := range w.env {
		env = append(env, k+"="+v)
	}
	return itest.StartProc(t, "approver-bot", func() *exec.Cmd {
		cmd := exec.Command(bin, "run", "--config", cfg, "--log-level", "warn")
		cmd.Env = env
		return cmd
	}, "http://"+listen, log)
}

// TestBotRestart runs the approver-bot program, stops it while requests are
// pending, and starts it again: a request that came while it was down is
// shown, one decided meanwhile has its Slack message updated, and one still
// pending is answered from its old Slack message; nothing is shown twice.
// Then the same after SIGKILL.
func TestBotRestart(t *testing.T) {
	bin := itest.Binary(t, "approver-bot")
	w := newChannelWorld(t)
	listen := net.JoinHostPort("127.0.0.1", strconv.Itoa(clustertest.FreePort(t)))
	var log itest.LockedBuffer
	p := w.startBotProc(t, bin, "bot", listen, &log)

	decidedWhileDown, _ := w.ask(t, "decided-while-down")
	stillPending, stillDecision := w.ask(t, "still-pending")
	w.shown(t, decidedWhileDown)
	old, _ := w.shown(t, stillPending)
	p.Stop(t)

	askedWhileDown, askedDecision := w.ask(t, "asked-while-down")
	itest.WaitState(t, w.b, askedWhileDown, broker.StatePending)
	itest.ApprovalOf(t, itest.Call(t, http.MethodPost, w.api+"/v1/approvals/"+decidedWhileDown+"/decision", `{"principal":"carol","decision":"approve"}`), http.StatusOK)

	p = w.startBotProc(t, bin, "bot", listen, &log)
	m, _ := w.shown(t, askedWhileDown)
	w.outcome(t, decidedWhileDown, "carol via http")
	w.hooks.wait(t, decidedWhileDown, events.TypeDecided)

	// The old message of the request still pending works with the new
	// process.
	click := slacktest.Form(t, slacktest.Click("UALICE", "assent.approve", stillPending, old))
	if status, body := slacktest.Post(t, "http://"+listen+slackch.InteractionsPath, click, slacktest.SignedHeader(itSlackSecret, time.Now(), click)); status != http.StatusOK {
		t.Fatalf("click after the restart: %d %s", status, body)
	}
	if d := brokertest.Decision(t, stillDecision); !d.Approved() || d.DecidedBy[0].Principal != "alice" {
		t.Fatalf("still-pending decided %+v", d)
	}
	w.outcome(t, stillPending, "alice via slack")
	w.hooks.wait(t, stillPending, events.TypeDecided)
	w.hooks.wait(t, decidedWhileDown, events.TypeDecided)
	p.Stop(t)
	if d := w.hooks.duplicates(); len(d) > 0 {
		t.Errorf("webhook ids delivered twice across a graceful restart: %v", d)
	}

	// SIGKILL, with a request pending and shown: the next process shows it
	// no second time, and a new one once.
	p = w.startBotProc(t, bin, "bot", listen, &log)
	p.Kill(t)
	afterKill, afterKillDecision := w.ask(t, "after-kill")
	p = w.startBotProc(t, bin, "bot", listen, &log)
	w.shown(t, afterKill)
	click = slacktest.Form(t, slacktest.Click("UALICE", "assent.approve", askedWhileDown, m))
	if status, body := slacktest.Post(t, "http://"+listen+slackch.InteractionsPath, click, slacktest.SignedHeader(itSlackSecret, time.Now(), click)); status != http.StatusOK {
		t.Fatalf("click after SIGKILL: %d %s", status, body)
	}
	if d := brokertest.Decision(t, askedDecision); !d.Approved() {
		t.Fatalf("asked-while-down decided %+v", d)
	}
	w.outcome(t, askedWhileDown, "alice via slack")
	itest.ApprovalOf(t, itest.Call(t, http.MethodPost, w.api+"/v1/approvals/"+afterKill+"/decision", `{"principal":"carol","decision":"approve"}`), http.StatusOK)
	brokertest.Decision(t, afterKillDecision)
	w.outcome(t, afterKill, "carol via http")

	for _, id := range []string{decidedWhileDown, stillPending, askedWhileDown, afterKill} {
		if n := w.countSlackMessages(id); n != 1 {
			t.Errorf("%d Slack messages for %s, want 1", n, id)
		}
		if n := len(w.smtp.Matching(smtptest.About("bob@example.com", id))); n != 1 {
			t.Errorf("%d mails to bob about %s, want 1", n, id)
		}
	}
	if t.Failed() {
		t.Logf("the bot's output:\n%s", log.String())
	}
}
