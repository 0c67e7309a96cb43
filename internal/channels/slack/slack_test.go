package slack_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/assent-dev/assent/internal/broker"
	"github.com/assent-dev/assent/internal/brokertest"
	"github.com/assent-dev/assent/internal/channels"
	slackch "github.com/assent-dev/assent/internal/channels/slack"
	"github.com/assent-dev/assent/internal/slacktest"
	"github.com/assent-dev/assent/internal/testenv"
	"github.com/assent-dev/assent/pkg/events"
	"github.com/assent-dev/assent/pkg/handler"
	"github.com/assent-dev/assent/pkg/policy"
)

const (
	botToken      = "xoxb-1-test-bot"
	appToken      = "xapp-1-test-app"
	signingSecret = "8f742231b10e8888abcd99yyyzzz85a5"
	slackChannel  = "CAPPROVALS"
	webUI         = "https://assent.example.com"

	// The environment variables the tests' configurations name.
	envBot    = "ASSENT_TEST_SLACK_BOT_TOKEN"
	envSecret = "ASSENT_TEST_SLACK_SIGNING_SECRET"
	envApp    = "ASSENT_TEST_SLACK_APP_TOKEN"
)

// testPolicy: alice and carol are ops (carol is not on Slack), bob is a
// developer, erin the CFO. Deploys need ops and are never remembered; reads
// need ops and may be remembered; wires escalate to the CFO.
const testPolicy = `version: 1
principals:
  alice: {slack: UALICE, roles: [ops]}
  bob:   {slack: UBOB, roles: [dev]}
  carol: {roles: [ops]}
  erin:  {slack: UERIN, roles: [cfo]}
rules:
  - name: deploys
    tools: [deploy]
    action: require_approval
    approvers: ["role:ops"]
    rememberable: false
  - name: reads
    tools: [read_file]
    action: require_approval
    approvers: ["role:ops"]
    rememberable: true
    remember_scopes: [call, session, user]
    max_remember: 1h
  - name: wires
    tools: [wire]
    action: require_approval
    approvers: ["role:ops"]
    timeout: 10s
    escalation:
      - after: 1s
        approvers: ["role:cfo"]
`

// harness is a broker on embedded NATS, a local Slack, and the Slack
// channel running on the channel runtime, with the bot's HTTP server.
type harness struct {
	broker  *broker.Broker
	slack   *slacktest.Server
	adapter *slackch.Adapter
	rt      *handler.Channel
	agent   *handler.Client
	js      jetstream.JetStream
	web     *httptest.Server
	answers *answerLog
}

type setup struct {
	mode   string
	remind time.Duration
	// config changes the channel's configuration.
	config func(*slackch.Config)
	// probe is how often refused targets are checked again; default 30s.
	probe time.Duration
	// announcedOnly makes the broker count only announced principals as
	// reachable (as one without an open HTTP API does).
	announcedOnly bool
	// slack, if set, prepares the local Slack before the channel starts.
	slack func(*slacktest.Server)
}

func start(t *testing.T, s setup) *harness {
	t.Helper()
	p, err := policy.Parse([]byte(testPolicy), "policy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	ns := testenv.Server(t)
	b, _ := brokertest.Run(t, testenv.Conn(t, ns), broker.Config{Policy: p, AnnouncedOnly: s.announcedOnly})
	h := &harness{slack: slacktest.New(t, botToken, appToken), broker: b}
	if s.slack != nil {
		s.slack(h.slack)
	}
	t.Setenv(envBot, botToken)
	t.Setenv(envSecret, signingSecret)
	t.Setenv(envApp, appToken)
	nc := testenv.Conn(t, ns)
	h.js, _ = jetstream.New(nc)
	h.answers = logAnswers(t, testenv.Conn(t, ns))
	cfg := slackch.Config{
		BotTokenEnv: envBot, SigningSecretEnv: envSecret, AppTokenEnv: envApp,
		Mode: s.mode, Channel: slackChannel, APIURL: h.slack.URL(),
	}
	if s.config != nil {
		s.config(&cfg)
	}
	h.adapter, err = slackch.New(cfg, channels.Env{NATS: nc, Directory: channels.NewDirectory(p), WebUI: webUI, Logger: testenv.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	if s.probe > 0 {
		slackch.SetProbeEvery(h.adapter, s.probe)
	}
	mux := http.NewServeMux()
	h.web = httptest.NewServer(mux)
	t.Cleanup(h.web.Close)
	h.rt, _ = brokertest.RunAdapter(t, nc, handler.ChannelConfig{Remind: s.remind}, h.adapter, mux)
	h.agent, err = handler.NewClient(testenv.Conn(t, ns), handler.Config{Agent: "coder"})
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// answerLog records every answer published on NATS, by any channel.
type answerLog struct {
	mu       sync.Mutex
	subjects []string
	nc       *nats.Conn
}

func logAnswers(t *testing.T, nc *nats.Conn) *answerLog {
	t.Helper()
	l := &answerLog{nc: nc}
	if _, err := nc.Subscribe(events.ResponsePrefix+">", func(m *nats.Msg) {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.subjects = append(l.subjects, m.Subject)
	}); err != nil {
		t.Fatal(err)
	}
	return l
}

// by returns how many answers principal published.
func (l *answerLog) by(principal string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, s := range l.subjects {
		if strings.HasPrefix(s, events.ResponsePrefix+principal+".") {
			n++
		}
	}
	return n
}

// none fails if any answer was published, once whatever was in flight had
// time to arrive.
func (l *answerLog) none(t *testing.T, what string) {
	t.Helper()
	_ = l.nc.Flush()
	time.Sleep(300 * time.Millisecond)
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.subjects) > 0 {
		t.Fatalf("%s: answers were published: %v", what, l.subjects)
	}
}

// ask makes a request without waiting for it; its decision arrives on the
// returned channel. The request is withdrawn when the test ends.
func (h *harness) ask(t *testing.T, req events.Requested) (string, <-chan handler.Decision) {
	t.Helper()
	if req.Timeout == 0 {
		req.Timeout = events.Duration(time.Minute)
	}
	return brokertest.Ask(t, h.agent, handler.Request{Requested: req})
}

// message waits for the request's message, and for the runtime to have
// recorded it.
func (h *harness) message(t *testing.T, id string) slacktest.Message {
	t.Helper()
	var m slacktest.Message
	h.slack.Wait(t, "message of "+id, func() bool {
		var ok bool
		m, ok = h.slack.Message(id)
		return ok
	})
	h.slack.Wait(t, "notice of "+id+" recorded", func() bool {
		n, _, ok, err := h.rt.Lookup(t.Context(), id)
		return err == nil && ok && n.Ref != nil
	})
	return m
}

// resolved waits for the request's message to show an outcome.
func (h *harness) resolved(t *testing.T, id, want string) slacktest.Message {
	t.Helper()
	var m slacktest.Message
	h.slack.Wait(t, "message of "+id+" showing "+want, func() bool {
		m, _ = h.slack.Message(id)
		return strings.Contains(m.Blocks, want)
	})
	if len(buttons(t, m.Blocks)) != 0 {
		t.Fatalf("a decided request's message keeps its buttons: %s", m.Blocks)
	}
	return m
}

// element and block are what tests read of Block Kit JSON.
type element struct {
	Type         string `json:"type"`
	ActionID     string `json:"action_id"`
	Value        string `json:"value"`
	InitialValue string `json:"initial_value"`
	Options      []struct {
		Value string `json:"value"`
	} `json:"options"`
}

type block struct {
	Type string `json:"type"`
	Text *struct {
		Text string `json:"text"`
	} `json:"text"`
	BlockID  string    `json:"block_id"`
	Elements []element `json:"elements"`
	Element  *element  `json:"element"`
}

func parseBlocks(t *testing.T, raw string) []block {
	t.Helper()
	var bs []block
	if err := json.Unmarshal([]byte(raw), &bs); err != nil {
		t.Fatalf("blocks %s: %v", raw, err)
	}
	return bs
}

// buttons returns the elements of a message's actions blocks.
func buttons(t *testing.T, raw string) []element {
	t.Helper()
	var out []element
	for _, b := range parseBlocks(t, raw) {
		if b.Type == "actions" {
			out = append(out, b.Elements...)
		}
	}
	return out
}

// input returns the element of a modal's input block id.
func input(t *testing.T, v slacktest.View, id string) element {
	t.Helper()
	var view struct {
		Blocks json.RawMessage `json:"blocks"`
	}
	if err := json.Unmarshal([]byte(v.Raw), &view); err != nil {
		t.Fatal(err)
	}
	for _, b := range parseBlocks(t, string(view.Blocks)) {
		if b.Type == "input" && b.BlockID == id && b.Element != nil {
			return *b.Element
		}
	}
	t.Fatalf("modal %s has no input %s: %s", v.CallbackID, id, v.Raw)
	return element{}
}

// send posts body to the interactions endpoint with header.
func (h *harness) send(t *testing.T, body string, header http.Header) (int, string) {
	t.Helper()
	return slacktest.Post(t, h.web.URL+slackch.InteractionsPath, body, header)
}

// interact posts payload as Slack would, signed now, and wants it taken.
func (h *harness) interact(t *testing.T, payload any) string {
	t.Helper()
	body := slacktest.Form(t, payload)
	status, resp := h.send(t, body, slacktest.SignedHeader(signingSecret, time.Now(), body))
	if status != http.StatusOK {
		t.Fatalf("interaction refused: %d %s", status, resp)
	}
	return resp
}

// modalErrors reads a view submission response; nil for none (the modal
// closes).
func modalErrors(t *testing.T, body string) map[string]string {
	t.Helper()
	if strings.TrimSpace(body) == "" {
		return nil
	}
	var r struct {
		ResponseAction string            `json:"response_action"`
		Errors         map[string]string `json:"errors"`
	}
	if err := json.Unmarshal([]byte(body), &r); err != nil || r.ResponseAction != "errors" {
		t.Fatalf("view submission response %q: want errors", body)
	}
	return r.Errors
}

// TestNotifyPostsRequest: a request posts one message in the channel with
// what the approver needs, untrusted text escaped, long arguments cut, the
// eligible approvers mentioned, and the buttons the policy allows.
func TestNotifyPostsRequest(t *testing.T) {
	h := start(t, setup{})
	// Twelve keys, in this order: all are shown.
	raw := `{"path":"/srv/app","note":"<!channel> & <@UBOB>","big":"` + strings.Repeat("x", 1000) + `"`
	for i := range 9 {
		raw += fmt.Sprintf(`,"k%d":%d`, i, i)
	}
	raw += "}"
	id, _ := h.ask(t, events.Requested{Tool: "deploy", Args: json.RawMessage(raw), User: "dan", Session: "s-42", Hint: "Ship release 4.2"})
	m := h.message(t, id)

	if posts := h.slack.Calls("chat.postMessage"); len(posts) != 1 || posts[0].Form.Get("channel") != slackChannel {
		t.Fatalf("want one message in %s, got %+v", slackChannel, posts)
	}
	for _, want := range []string{
		"Approval needed: deploy", "coder", "dan", "s-42", "deploys", "Ship release 4.2",
		"<!date^", "{date_short_pretty}", "<@UALICE>",
		"&lt;!channel&gt; &amp; &lt;@UBOB&gt;",
		strings.Repeat("x", 300) + "` _(700 more characters)_",
		"• `k8`: `8`",
		"<" + webUI + "/approvals/" + id + "|Full arguments>",
	} {
		if !strings.Contains(m.Blocks, want) {
			t.Errorf("message lacks %q:\n%s", want, m.Blocks)
		}
	}
	for _, bad := range []string{"<!channel>", "<@UBOB>", "<@UERIN>", strings.Repeat("x", 301), "more_"} {
		if strings.Contains(m.Blocks, bad) {
			t.Errorf("message has %q:\n%s", bad, m.Blocks)
		}
	}
	if m.Text != "Approval needed: deploy for agent coder" {
		t.Errorf("notification text %q", m.Text)
	}
	var actions []string
	for _, b := range buttons(t, m.Blocks) {
		actions = append(actions, b.ActionID)
		if b.Value != id {
			t.Errorf("button %s carries %q, want the request id", b.ActionID, b.Value)
		}
	}
	if !slices.Equal(actions, []string{"assent.approve", "assent.deny", "assent.edit"}) {
		t.Errorf("buttons %v: want approve, deny, edit, and no remember (the rule forbids it)", actions)
	}
	n, _, ok, err := h.rt.Lookup(context.Background(), id)
	if err != nil || !ok {
		t.Fatalf("lookup: %v %v", ok, err)
	}
	if want := fmt.Sprintf(`{"channel":%q,"ts":%q}`, m.Channel, m.TS); string(n.Ref) != want {
		t.Errorf("ref %s, want %s", n.Ref, want)
	}
}

// TestLongArgumentHidesNoKey: a request whose first argument is 3,300
// characters long, with others after it, is posted with every argument's
// name and the start of its value, the count of characters left out, and
// the link to the whole request (issue 22.1).
func TestLongArgumentHidesNoKey(t *testing.T) {
	h := start(t, setup{})
	args := map[string]any{"script": strings.Repeat("echo ok; ", 366) + "rm", "host": "prod-db-1", "sudo": true, "dry_run": false}
	keys := []string{"script", "host", "sudo", "dry_run"}
	for i := range 10 {
		k := fmt.Sprintf("opt%d", i)
		args[k] = i
		keys = append(keys, k)
	}
	raw := `{"script":` + mustJSON(t, args["script"])
	for _, k := range keys[1:] {
		raw += `,"` + k + `":` + mustJSON(t, args[k])
	}
	raw += "}"
	id, _ := h.ask(t, events.Requested{Tool: "run_shell", Args: json.RawMessage(raw), User: "dan", Hint: strings.Repeat("Routine maintenance. ", 50)})
	m := h.message(t, id)
	var texts []string
	for _, b := range parseBlocks(t, m.Blocks) {
		if b.Text != nil {
			texts = append(texts, b.Text.Text)
		}
	}
	all := strings.Join(texts, "\n")
	for _, want := range []string{
		"• `script`: `echo ok; echo ok;", "` _(2,996 more characters)_\n• `host`",
		"• `host`: `prod-db-1`", "• `sudo`: `true`", "• `dry_run`: `false`", "• `opt9`: `9`",
		"<" + webUI + "/approvals/" + id + "|Full arguments>",
	} {
		if !strings.Contains(all, want) {
			t.Errorf("message lacks %q:\n%s", want, all)
		}
	}
	for _, k := range keys {
		if !strings.Contains(all, "• `"+k+"`: ") {
			t.Errorf("key %s not shown", k)
		}
	}
	// The arguments come before the agent's hint.
	if a, h := strings.Index(all, "*Arguments*"), strings.Index(all, "Routine maintenance"); a < 0 || h < a {
		t.Errorf("the hint comes before the arguments:\n%s", all)
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestApproveOverHTTP: a signed click on Approve decides the request as the
// clicking user's principal, on channel slack, and the message shows it.
func TestApproveOverHTTP(t *testing.T) {
	h := start(t, setup{})
	id, ch := h.ask(t, events.Requested{Tool: "deploy", Args: json.RawMessage(`{"env":"prod"}`), User: "dan"})
	m := h.message(t, id)
	if resp := h.interact(t, slacktest.Click("UALICE", "assent.approve", id, m)); resp != "" {
		t.Fatalf("click answered %q", resp)
	}
	d := brokertest.Decision(t, ch)
	if !d.Approved() || len(d.DecidedBy) != 1 || d.DecidedBy[0].Principal != "alice" || d.DecidedBy[0].Channel != "slack" {
		t.Fatalf("decision %+v", d)
	}
	m = h.resolved(t, id, "*Approved by* alice via slack")
	if !strings.HasPrefix(m.Text, "Approved: deploy") {
		t.Errorf("notification text %q", m.Text)
	}

	// Resolve again (a redelivery): the same message.
	n, _, _, _ := h.rt.Lookup(context.Background(), id)
	if err := h.adapter.Resolve(context.Background(), handler.Outcome{RequestID: id, Decision: d, Notice: n}); err != nil {
		t.Fatal(err)
	}
	again, _ := h.slack.Message(id)
	if again.Blocks != m.Blocks || again.Updates <= m.Updates {
		t.Fatalf("resolve again changed the message: %s\nwas %s", again.Blocks, m.Blocks)
	}
	if len(h.slack.Messages()) != 1 {
		t.Fatalf("messages %+v: want only the request's", h.slack.Messages())
	}
}

// TestDenyWithReason: Deny opens a modal asking why; submitting it denies
// with that reason.
func TestDenyWithReason(t *testing.T) {
	h := start(t, setup{})
	id, ch := h.ask(t, events.Requested{Tool: "deploy", User: "dan"})
	m := h.message(t, id)
	h.interact(t, slacktest.Click("UALICE", "assent.deny", id, m))
	views := h.slack.Views()
	if len(views) != 1 || views[0].CallbackID != "assent.deny" || views[0].TriggerID != "trigger-UALICE-assent.deny" {
		t.Fatalf("views %+v: want the deny modal, opened with the click's trigger", views)
	}
	input(t, views[0], "reason")
	h.answers.none(t, "deny modal opened")

	if errs := modalErrors(t, h.interact(t, slacktest.Submit("UALICE", views[0], map[string]any{"reason": slacktest.Text("Not on a Friday & not <!here>")}))); errs != nil {
		t.Fatalf("submission refused: %v", errs)
	}
	d := brokertest.Decision(t, ch)
	if d.Outcome != events.Denied || d.Reason != "Not on a Friday & not <!here>" || d.DecidedBy[0].Principal != "alice" {
		t.Fatalf("decision %+v", d)
	}
	m = h.resolved(t, id, "*Denied by* alice via slack")
	if !strings.Contains(m.Blocks, "Not on a Friday &amp; not &lt;!here&gt;") {
		t.Fatalf("reason not shown, escaped: %s", m.Blocks)
	}
}

// TestEditArgs: Edit opens the arguments as JSON; anything but a JSON object
// is refused in the modal with nothing answered; an object approves with
// those arguments.
func TestEditArgs(t *testing.T) {
	h := start(t, setup{})
	id, ch := h.ask(t, events.Requested{Tool: "deploy", Args: json.RawMessage(`{"path":"/srv/app","replicas":3}`), User: "dan"})
	m := h.message(t, id)
	h.interact(t, slacktest.Click("UALICE", "assent.edit", id, m))
	views := h.slack.Views()
	if len(views) != 1 || views[0].CallbackID != "assent.edit" {
		t.Fatalf("views %+v", views)
	}
	if got, want := input(t, views[0], "args").InitialValue, "{\n  \"path\": \"/srv/app\",\n  \"replicas\": 3\n}"; got != want {
		t.Fatalf("initial arguments %q, want %q", got, want)
	}
	for _, c := range []struct{ typed, want string }{
		{`{"path": "/srv/app/staging"`, "Not valid JSON"},
		{`["/srv"]`, "must be a JSON object"},
		{`null`, "must be a JSON object"},
		{`   `, "Enter the arguments"},
	} {
		errs := modalErrors(t, h.interact(t, slacktest.Submit("UALICE", views[0], map[string]any{"args": slacktest.Text(c.typed)})))
		if !strings.Contains(errs["args"], c.want) {
			t.Errorf("args %q: errors %v, want %q on args", c.typed, errs, c.want)
		}
	}
	h.answers.none(t, "invalid arguments")

	resp := h.interact(t, slacktest.Submit("UALICE", views[0], map[string]any{"args": slacktest.Text("{\n \"path\": \"/srv/app/staging\", \"replicas\": 1}"), "reason": slacktest.Text("staging first")}))
	if errs := modalErrors(t, resp); errs != nil {
		t.Fatalf("valid arguments refused: %v", errs)
	}
	d := brokertest.Decision(t, ch)
	if !d.Approved() || !d.Edited || string(d.Args) != `{"path":"/srv/app/staging","replicas":1}` || d.Reason != "staging first" {
		t.Fatalf("decision %+v args %s", d, d.Args)
	}
	m = h.resolved(t, id, "Approved with edited arguments")
	if !strings.Contains(m.Blocks, "/srv/app/staging") {
		t.Fatalf("edited arguments not shown: %s", m.Blocks)
	}
}

// TestEditArgsBreaksInputSchema: edited arguments that break the request's
// input_schema are refused in the modal, with the schema's words on the
// arguments' block and nothing answered, as the broker would refuse them;
// arguments that fit approve.
func TestEditArgsBreaksInputSchema(t *testing.T) {
	h := start(t, setup{})
	schema := json.RawMessage(`{"type":"object","properties":{"path":{"type":"string"},"replicas":{"type":"integer","minimum":1}},"required":["path"],"additionalProperties":false}`)
	id, ch := h.ask(t, events.Requested{Tool: "deploy", Args: json.RawMessage(`{"path":"/srv/app","replicas":3}`), InputSchema: schema, User: "dan"})
	m := h.message(t, id)
	h.interact(t, slacktest.Click("UALICE", "assent.edit", id, m))
	views := h.slack.Views()
	if len(views) != 1 || views[0].CallbackID != "assent.edit" {
		t.Fatalf("views %+v", views)
	}
	for _, c := range []struct{ typed, want string }{
		{`{"path": "/srv/app", "replicas": "two"}`, "The tool's input schema refuses these arguments: /replicas: got string, want integer"},
		{`{"path": "/srv/app", "replicas": 0}`, "/replicas: minimum: got 0, want 1"},
		{`{"replicas": 2}`, "missing property 'path'"},
		{`{"path": "/srv/app", "force": true}`, "additional properties 'force' not allowed"},
		{`{"path": "/srv/app"`, "Not valid JSON"}, // JSON first, then the schema
	} {
		errs := modalErrors(t, h.interact(t, slacktest.Submit("UALICE", views[0], map[string]any{"args": slacktest.Text(c.typed)})))
		if !strings.Contains(errs["args"], c.want) || len(errs) != 1 {
			t.Errorf("args %q: errors %v, want %q on args alone", c.typed, errs, c.want)
		}
	}
	h.answers.none(t, "arguments the input schema refuses")

	resp := h.interact(t, slacktest.Submit("UALICE", views[0], map[string]any{"args": slacktest.Text(`{"path": "/srv/app", "replicas": 1}`)}))
	if errs := modalErrors(t, resp); errs != nil {
		t.Fatalf("arguments that fit refused: %v", errs)
	}
	if d := brokertest.Decision(t, ch); !d.Approved() || !d.Edited || string(d.Args) != `{"path":"/srv/app","replicas":1}` {
		t.Fatalf("decision %+v args %s", d, d.Args)
	}
}

// TestRemember: the Remember button is offered where the rule lets answers
// be remembered, with the scopes the rule allows and the request has; the
// approval is remembered for the rule's max_remember, and the next request
// in that scope is approved without asking.
func TestRemember(t *testing.T) {
	h := start(t, setup{})
	id, ch := h.ask(t, events.Requested{Tool: "read_file", Args: json.RawMessage(`{"path":"/etc/hosts"}`), User: "dan", Session: "s-1"})
	m := h.message(t, id)
	var actions []string
	for _, b := range buttons(t, m.Blocks) {
		actions = append(actions, b.ActionID)
	}
	if !slices.Contains(actions, "assent.remember") {
		t.Fatalf("buttons %v: no remember though the rule allows it", actions)
	}
	h.interact(t, slacktest.Click("UALICE", "assent.remember", id, m))
	views := h.slack.Views()
	if len(views) != 1 || views[0].CallbackID != "assent.remember" {
		t.Fatalf("views %+v", views)
	}
	var scopes []string
	for _, o := range input(t, views[0], "scope").Options {
		scopes = append(scopes, o.Value)
	}
	if !slices.Equal(scopes, []string{"call", "session", "user"}) {
		t.Fatalf("scopes offered %v, want the rule's: call, session, user", scopes)
	}
	if errs := modalErrors(t, h.interact(t, slacktest.Submit("UALICE", views[0], map[string]any{"scope": slacktest.Radio("agent")}))); errs["scope"] == "" {
		t.Fatalf("a scope the rule forbids was taken: %v", errs)
	}
	h.answers.none(t, "forbidden scope")
	if errs := modalErrors(t, h.interact(t, slacktest.Submit("UALICE", views[0], map[string]any{"scope": slacktest.Radio("session")}))); errs != nil {
		t.Fatalf("remember refused: %v", errs)
	}
	if d := brokertest.Decision(t, ch); !d.Approved() || d.DecidedBy[0].Principal != "alice" {
		t.Fatalf("decision %+v", d)
	}

	kv, err := h.js.KeyValue(t.Context(), broker.GrantBucket)
	if err != nil {
		t.Fatal(err)
	}
	var g policy.Grant
	h.slack.Wait(t, "grant stored", func() bool {
		keys, _ := kv.Keys(t.Context())
		for _, k := range keys {
			if e, err := kv.Get(t.Context(), k); err == nil && json.Unmarshal(e.Value(), &g) == nil {
				return true
			}
		}
		return false
	})
	if g.Scope != "session" || g.ScopeValue != "s-1" || g.CreatedBy != "alice" || g.Tool != "read_file" {
		t.Fatalf("grant %+v", g)
	}
	if ttl := g.ExpiresAt.Sub(g.CreatedAt); ttl < time.Hour-time.Second || ttl > time.Hour {
		t.Fatalf("remembered for %s, want the rule's max_remember 1h", ttl)
	}
	_, next := h.ask(t, events.Requested{Tool: "read_file", Args: json.RawMessage(`{"path":"/etc/passwd"}`), User: "dan", Session: "s-1"})
	if d := brokertest.Decision(t, next); !d.Approved() || !d.Auto {
		t.Fatalf("next request in the session: %+v", d)
	}
}

// TestRefusesUnauthenticated: interactions with a forged or malformed
// signature, a stale or future timestamp, or none at all, and replays of a
// signed one, are refused with 401 and change nothing.
func TestRefusesUnauthenticated(t *testing.T) {
	h := start(t, setup{})
	id, ch := h.ask(t, events.Requested{Tool: "deploy", User: "dan"})
	m := h.message(t, id)
	body := slacktest.Form(t, slacktest.Click("UALICE", "assent.approve", id, m))
	tests := []struct {
		name   string
		header http.Header
		code   string
	}{
		{"forged", slacktest.SignedHeader("not-the-secret", time.Now(), body), "bad_signature"},
		{"signed over another body", slacktest.SignedHeader(signingSecret, time.Now(), body+"&x=1"), "bad_signature"},
		{"stale", slacktest.SignedHeader(signingSecret, time.Now().Add(-6*time.Minute), body), "stale_timestamp"},
		{"future", slacktest.SignedHeader(signingSecret, time.Now().Add(6*time.Minute), body), "stale_timestamp"},
		{"unsigned", http.Header{"Content-Type": {"application/x-www-form-urlencoded"}}, "missing_signature"},
		{"malformed signature", func() http.Header {
			hd := slacktest.SignedHeader(signingSecret, time.Now(), body)
			hd.Set("X-Slack-Signature", "v0=zz")
			return hd
		}(), "bad_signature"},
	}
	for _, tt := range tests {
		status, resp := h.send(t, body, tt.header)
		var e struct {
			Error struct{ Code, Message string } `json:"error"`
		}
		_ = json.Unmarshal([]byte(resp), &e)
		if status != http.StatusUnauthorized || e.Error.Code != tt.code || e.Error.Message == "" {
			t.Errorf("%s: %d %s, want 401 %s with a message", tt.name, status, resp, tt.code)
		}
	}

	// A replay: the first delivery opens the deny modal, the second is
	// refused and opens nothing.
	deny := slacktest.Form(t, slacktest.Click("UALICE", "assent.deny", id, m))
	header := slacktest.SignedHeader(signingSecret, time.Now(), deny)
	if status, resp := h.send(t, deny, header); status != http.StatusOK {
		t.Fatalf("first delivery: %d %s", status, resp)
	}
	status, resp := h.send(t, deny, header)
	if status != http.StatusUnauthorized || !strings.Contains(resp, `"replayed"`) {
		t.Fatalf("replay: %d %s, want 401 replayed", status, resp)
	}
	upper := header.Clone()
	upper.Set("X-Slack-Signature", "v0="+strings.ToUpper(strings.TrimPrefix(header.Get("X-Slack-Signature"), "v0=")))
	if status, resp := h.send(t, deny, upper); status != http.StatusUnauthorized || !strings.Contains(resp, `"replayed"`) {
		t.Fatalf("replay with the signature in upper case: %d %s, want 401 replayed", status, resp)
	}
	if v := h.slack.Views(); len(v) != 1 {
		t.Fatalf("the replay opened a modal again: %+v", v)
	}
	h.answers.none(t, "refused interactions")
	if _, ok, _ := h.rt.Decision(t.Context(), id); ok {
		t.Fatal("decided by a refused interaction")
	}

	// The same click, signed now, is taken.
	h.interact(t, slacktest.Click("UALICE", "assent.approve", id, m))
	if d := brokertest.Decision(t, ch); !d.Approved() {
		t.Fatalf("decision %+v", d)
	}
}

// TestRefusesUnmappedAndIneligible: a Slack user the policy does not know,
// a principal the rule does not let answer, and the request's own user are
// told why, privately, and nothing changes.
func TestRefusesUnmappedAndIneligible(t *testing.T) {
	h := start(t, setup{})
	id, ch := h.ask(t, events.Requested{Tool: "deploy", User: "alice"})
	m := h.message(t, id)
	if !strings.Contains(m.Blocks, "no one on Slack (role:ops)") || strings.Contains(m.Blocks, "<@UALICE>") {
		t.Fatalf("approvers: alice may not answer her own request and carol is not on Slack: %s", m.Blocks)
	}
	for _, c := range []struct{ user, action, want string }{
		{"UNOBODY", "assent.approve", "Your Slack account is not mapped to an Assent principal; ask an operator to add `slack: UNOBODY`"},
		{"UBOB", "assent.approve", "bob is not among the approvers of rule deploys"},
		{"UBOB", "assent.deny", "bob is not among the approvers of rule deploys"},
		{"UBOB", "assent.edit", "bob is not among the approvers of rule deploys"},
		{"UALICE", "assent.approve", "self-approval is not allowed"},
	} {
		before := len(h.slack.Ephemerals(c.user))
		h.interact(t, slacktest.Click(c.user, c.action, id, m))
		got := h.slack.Ephemerals(c.user)
		if len(got) != before+1 || !strings.Contains(got[before], c.want) {
			t.Errorf("%s %s: ephemerals %q, want one saying %q", c.user, c.action, got[before:], c.want)
		}
	}
	for _, e := range h.slack.Calls("chat.postEphemeral") {
		if e.Form.Get("channel") != slackChannel {
			t.Errorf("ephemeral in %q, want the request's channel", e.Form.Get("channel"))
		}
	}
	if v := h.slack.Views(); len(v) != 0 {
		t.Fatalf("a modal opened for an ineligible user: %+v", v)
	}
	h.answers.none(t, "refused users")
	if _, ok, _ := h.rt.Decision(t.Context(), id); ok {
		t.Fatal("decided")
	}
	if m2, _ := h.slack.Message(id); m2.Updates != 0 {
		t.Fatalf("message changed: %s", m2.Blocks)
	}

	// A modal submitted by someone who may not answer is refused in it.
	h.interact(t, slacktest.Click("UALICE", "assent.deny", id, m)) // refused: no modal
	forged := slacktest.View{CallbackID: "assent.deny", PrivateMetadata: `{"id":"` + id + `"}`}
	errs := modalErrors(t, h.interact(t, slacktest.Submit("UBOB", forged, map[string]any{"reason": slacktest.Text("no")})))
	if !strings.Contains(errs["reason"], "not among the approvers") {
		t.Fatalf("submission by bob: errors %v", errs)
	}
	h.answers.none(t, "refused submission")
	select {
	case d := <-ch:
		t.Fatalf("decided: %+v", d)
	default:
	}
}

// TestDecidedElsewhere: a request decided through another channel updates
// the Slack message, and a click on it after says who decided.
func TestDecidedElsewhere(t *testing.T) {
	h := start(t, setup{})
	id, ch := h.ask(t, events.Requested{Tool: "deploy", User: "dan"})
	m := h.message(t, id)
	if err := handler.Answer(t.Context(), h.js, "carol", id, events.Responded{Decision: events.Approve, Reason: "checked the diff", Channel: "web"}); err != nil {
		t.Fatal(err)
	}
	if d := brokertest.Decision(t, ch); !d.Approved() || d.DecidedBy[0].Channel != "web" {
		t.Fatalf("decision %+v", d)
	}
	got := h.resolved(t, id, "*Approved by* carol via web")
	if !strings.Contains(got.Blocks, "checked the diff") {
		t.Fatalf("reason not shown: %s", got.Blocks)
	}
	h.interact(t, slacktest.Click("UALICE", "assent.approve", id, m))
	if e := h.slack.Ephemerals("UALICE"); len(e) != 1 || e[0] != "This request was already approved by carol via web." {
		t.Fatalf("ephemerals %q", e)
	}
	if n := h.answers.by("alice"); n != 0 {
		t.Fatalf("alice's click on a decided request answered %d times", n)
	}
}

// TestEscalationAndReminder: an escalation updates the message and mentions
// its approvers in the thread; a reminder nudges in the thread; the
// escalation's approver can answer.
func TestEscalationAndReminder(t *testing.T) {
	h := start(t, setup{remind: 4 * time.Second})
	id, ch := h.ask(t, events.Requested{Tool: "wire", Args: json.RawMessage(`{"amount":120000}`), User: "dan"})
	m := h.message(t, id)
	h.slack.Wait(t, "escalation and reminder in the thread", func() bool {
		var esc, rem bool
		for _, r := range h.slack.Replies(m.TS) {
			esc = esc || strings.HasPrefix(r.Text, "Escalated (level 1): <@UERIN>, you may now answer")
			rem = rem || strings.HasPrefix(r.Text, "Still waiting for an answer: the deadline is <!date^")
		}
		return esc && rem
	})
	if got, _ := h.slack.Message(id); got.Updates == 0 || !strings.Contains(got.Blocks, "*Escalated (level 1) to* <@UERIN>") {
		t.Fatalf("message not updated for the escalation: %s", got.Blocks)
	}
	if n := len(h.slack.Calls("chat.postMessage")); n != 3 {
		t.Fatalf("%d messages posted, want the request, the escalation and the reminder", n)
	}
	h.interact(t, slacktest.Click("UERIN", "assent.approve", id, m))
	if d := brokertest.Decision(t, ch); !d.Approved() || d.DecidedBy[0].Principal != "erin" {
		t.Fatalf("decision %+v", d)
	}
	h.resolved(t, id, "*Approved by* erin via slack")
}

// TestSocketMode: over a Socket Mode websocket, each envelope is
// acknowledged, a click approves, and the edit modal's errors come back in
// the acknowledgement. No HTTP route is served.
func TestSocketMode(t *testing.T) {
	h := start(t, setup{mode: slackch.ModeSocket})
	h.slack.Wait(t, "Socket Mode connection", h.slack.Connected)
	if status, _ := h.send(t, "payload=%7B%7D", http.Header{}); status == http.StatusOK || status == http.StatusUnauthorized {
		t.Fatalf("socket mode serves %s: %d", slackch.InteractionsPath, status)
	}

	id, ch := h.ask(t, events.Requested{Tool: "deploy", User: "dan"})
	m := h.message(t, id)
	if ack := h.slack.Ack(t, h.slack.Send(t, slacktest.Click("UALICE", "assent.approve", id, m))); len(ack) != 0 {
		t.Fatalf("click acknowledged with %s", ack)
	}
	if d := brokertest.Decision(t, ch); !d.Approved() || d.DecidedBy[0].Principal != "alice" || d.DecidedBy[0].Channel != "slack" {
		t.Fatalf("decision %+v", d)
	}
	h.resolved(t, id, "*Approved by* alice via slack")

	id, ch = h.ask(t, events.Requested{Tool: "deploy", Args: json.RawMessage(`{"path":"/srv/app"}`), User: "dan"})
	m = h.message(t, id)
	h.slack.Ack(t, h.slack.Send(t, slacktest.Click("UALICE", "assent.edit", id, m)))
	h.slack.Wait(t, "edit modal", func() bool { return len(h.slack.Views()) > 0 })
	views := h.slack.Views()
	if len(views) != 1 || views[0].CallbackID != "assent.edit" {
		t.Fatalf("views %+v", views)
	}
	ack := h.slack.Ack(t, h.slack.Send(t, slacktest.Submit("UALICE", views[0], map[string]any{"args": slacktest.Text("{oops")})))
	if errs := modalErrors(t, string(ack)); !strings.Contains(errs["args"], "Not valid JSON") {
		t.Fatalf("invalid arguments acknowledged with %s", ack)
	}
	if n := h.answers.by("alice"); n != 1 {
		t.Fatalf("alice answered %d times, want once (the first request)", n)
	}
	if ack := h.slack.Ack(t, h.slack.Send(t, slacktest.Submit("UALICE", views[0], map[string]any{"args": slacktest.Text(`{"path":"/srv/staging"}`)}))); len(ack) != 0 {
		t.Fatalf("valid arguments acknowledged with %s", ack)
	}
	if d := brokertest.Decision(t, ch); !d.Approved() || string(d.Args) != `{"path":"/srv/staging"}` {
		t.Fatalf("decision %+v", d)
	}
}

// TestNew: configuration problems are reported all at once, each saying what
// to set.
func TestNew(t *testing.T) {
	t.Setenv(envBot, botToken)
	t.Setenv(envSecret, signingSecret)
	t.Setenv(envApp, appToken)
	t.Setenv("ASSENT_TEST_APP_IN_BOT", appToken)
	t.Setenv("ASSENT_TEST_EMPTY", "")
	dir := channels.NewDirectory(mustPolicy(t))
	ok := slackch.Config{BotTokenEnv: envBot, SigningSecretEnv: envSecret, AppTokenEnv: envApp, Channel: "C1"}
	with := func(f func(*slackch.Config)) slackch.Config {
		c := ok
		f(&c)
		return c
	}
	tests := []struct {
		name    string
		cfg     slackch.Config
		wantErr error
		want    []string
	}{
		{"http", ok, nil, nil},
		{"socket", with(func(c *slackch.Config) { c.Mode = slackch.ModeSocket; c.SigningSecretEnv = "ASSENT_TEST_EMPTY" }), nil, nil},
		{"no channel", with(func(c *slackch.Config) { c.Channel = "" }), slackch.ErrConfig, []string{"channel: missing"}},
		{"channel with spaces", with(func(c *slackch.Config) { c.Channel = "# approvals" }), slackch.ErrConfig, []string{"no spaces"}},
		{"bad mode", with(func(c *slackch.Config) { c.Mode = "webhook" }), slackch.ErrConfig, []string{`mode "webhook"`}},
		{"bot token unset", with(func(c *slackch.Config) { c.BotTokenEnv = "ASSENT_TEST_EMPTY" }), slackch.ErrConfig, []string{"environment variable ASSENT_TEST_EMPTY is not set", "xoxb-"}},
		{"app token as bot token", with(func(c *slackch.Config) { c.BotTokenEnv = "ASSENT_TEST_APP_IN_BOT" }), slackch.ErrConfig, []string{"holds an app-level token"}},
		{"no signing secret", with(func(c *slackch.Config) { c.SigningSecretEnv = "ASSENT_TEST_EMPTY" }), slackch.ErrConfig, []string{"ASSENT_TEST_EMPTY is not set", "Signing Secret"}},
		{"socket without app token", with(func(c *slackch.Config) { c.Mode = slackch.ModeSocket; c.AppTokenEnv = "ASSENT_TEST_EMPTY" }), slackch.ErrConfig, []string{"ASSENT_TEST_EMPTY is not set", "connections:write"}},
		{"socket with a bot token", with(func(c *slackch.Config) { c.Mode = slackch.ModeSocket; c.AppTokenEnv = envBot }), slackch.ErrConfig, []string{"does not hold an app-level token"}},
		{"secret instead of its name", with(func(c *slackch.Config) { c.BotTokenEnv = "xoxb-123-456" }), slackch.ErrConfig, []string{"bot_token_env", "not its value"}},
		{"bad api_url", with(func(c *slackch.Config) { c.APIURL = "slack.com/api" }), slackch.ErrConfig, []string{"api_url"}},
		{"every problem at once", slackch.Config{Mode: "x", BotTokenEnv: "ASSENT_TEST_EMPTY"}, slackch.ErrConfig, []string{"channel: missing", `mode "x"`, "ASSENT_TEST_EMPTY is not set"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, err := slackch.New(tt.cfg, channels.Env{Directory: dir})
			if !errors.Is(err, tt.wantErr) || (tt.wantErr == nil) != (err == nil) {
				t.Fatalf("New: %v, want %v", err, tt.wantErr)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error lacks %q:\n%v", w, err)
				}
			}
			if err == nil && (a.Name() != "slack" || !slices.Equal(a.Reaches(), []string{"alice", "bob", "erin"})) {
				t.Errorf("Name %q, Reaches %v", a.Name(), a.Reaches())
			}
		})
	}
	if err := (slackch.Config{Channel: "C1", Mode: "x"}).Validate(); !errors.Is(err, slackch.ErrConfig) || !strings.Contains(err.Error(), `mode "x"`) {
		t.Errorf("Validate: %v", err)
	}
}

// TestSlackRefusals: a bot token Slack refuses stops Start, naming the
// variable; a channel Slack does not know fails Notify, saying what to check.
func TestSlackRefusals(t *testing.T) {
	fake := slacktest.New(t, botToken, appToken)
	t.Setenv(envBot, "xoxb-revoked")
	t.Setenv(envSecret, signingSecret)
	dir := channels.NewDirectory(mustPolicy(t))
	cfg := slackch.Config{BotTokenEnv: envBot, SigningSecretEnv: envSecret, Channel: "C1", APIURL: fake.URL()}
	a, err := slackch.New(cfg, channels.Env{Directory: dir})
	if err != nil {
		t.Fatal(err)
	}
	err = a.Start(t.Context(), &handler.Channel{}, http.NewServeMux())
	if err == nil || !strings.Contains(err.Error(), "refused the bot token in "+envBot) {
		t.Fatalf("Start with a revoked token: %v", err)
	}

	t.Setenv(envBot, botToken)
	cfg.Channel = "CMISSING"
	a, err = slackch.New(cfg, channels.Env{Directory: dir})
	if err != nil {
		t.Fatal(err)
	}
	_, err = a.Notify(t.Context(), handler.Notice{Request: handler.Request{ID: events.NewID(), Requested: events.Requested{Tool: "deploy"}, Deadline: time.Now().Add(time.Minute)}})
	if err == nil || !strings.Contains(err.Error(), "channel_not_found") || !strings.Contains(err.Error(), "in CMISSING: channel_not_found: check that the channel id") {
		t.Fatalf("Notify to a missing channel: %v", err)
	}
}

func mustPolicy(t *testing.T) *policy.Policy {
	t.Helper()
	p, err := policy.Parse([]byte(testPolicy), "policy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	return p
}
