package integration

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/assent-dev/assent/integration/itest"
	"github.com/assent-dev/assent/internal/app"
	"github.com/assent-dev/assent/internal/broker"
	"github.com/assent-dev/assent/internal/brokertest"
	slackch "github.com/assent-dev/assent/internal/channels/slack"
	"github.com/assent-dev/assent/internal/channels/webhook"
	"github.com/assent-dev/assent/internal/creds"
	"github.com/assent-dev/assent/internal/natsconn"
	"github.com/assent-dev/assent/internal/natsembed"
	"github.com/assent-dev/assent/internal/slacktest"
	"github.com/assent-dev/assent/internal/testcerts"
	"github.com/assent-dev/assent/internal/testenv"
	"github.com/assent-dev/assent/pkg/events"
	"github.com/assent-dev/assent/pkg/handler"
)

// permsPolicy: alice and bob are ops.
const permsPolicy = `version: 1
principals:
  alice: {roles: [ops]}
  bob:   {roles: [ops]}
rules:
  - name: deploys
    tools: [deploy]
    action: require_approval
    approvers: ["role:ops"]
`

// violations records the permission violations the server reports to a
// connection.
type violations struct {
	mu   sync.Mutex
	errs []string
}

func (v *violations) add(err error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.errs = append(v.errs, err.Error())
}

// wait waits until the server refused a publish on subject.
func (v *violations) wait(t *testing.T, subject string) {
	t.Helper()
	v.waitFor(t, "Publish", subject)
}

// waitFor waits until the server reported a violation of kind (Publish,
// Subscription) on subject.
func (v *violations) waitFor(t *testing.T, kind, subject string) {
	t.Helper()
	itest.Eventually(t, itest.Patience, func() (bool, string) {
		v.mu.Lock()
		defer v.mu.Unlock()
		for _, e := range v.errs {
			if strings.Contains(e, "Permissions Violation for "+kind) && strings.Contains(e, subject) {
				return true, ""
			}
		}
		return false, "no " + kind + " violation for " + subject + " in " + strings.Join(v.errs, "; ")
	})
}

// none fails t if the server reported any violation.
func (v *violations) none(t *testing.T, who string) {
	t.Helper()
	v.mu.Lock()
	defer v.mu.Unlock()
	if len(v.errs) > 0 {
		t.Fatalf("%s was refused: %v", who, v.errs)
	}
}

// refused publishes m on subject through nc, and waits until the server
// refused it.
func (v *violations) refused(t *testing.T, nc *nats.Conn, subject string, m *nats.Msg) {
	t.Helper()
	if err := nc.PublishMsg(&nats.Msg{Subject: subject, Header: m.Header, Data: m.Data}); err != nil {
		t.Fatal(err)
	}
	_ = nc.Flush()
	v.wait(t, subject)
}

// refusedSub subscribes to subject through nc, and waits until the server
// refused it.
func (v *violations) refusedSub(t *testing.T, nc *nats.Conn, subject string) {
	t.Helper()
	if _, err := nc.SubscribeSync(subject); err != nil {
		t.Fatal(err)
	}
	_ = nc.Flush()
	v.waitFor(t, "Subscription", subject)
}

// operatorBroker starts an operator-mode server trusting a new authority,
// and a broker called name on its credentials under permsPolicy. js is the
// broker's connection's.
func operatorBroker(t *testing.T, name string) (*creds.Authority, *testenv.NATS, *broker.Broker, jetstream.JetStream) {
	t.Helper()
	a, ns, brokerNC := operatorServer(t)
	b, _ := itest.RunBroker(t, brokerNC, broker.Config{Name: name, Policy: itest.MustPolicy(t, permsPolicy, "perms.yaml")})
	return a, ns, b, itest.NewJS(t, brokerNC)
}

// operatorServer starts an operator-mode server trusting a new authority,
// and connects to it with broker credentials.
func operatorServer(t *testing.T) (*creds.Authority, *testenv.NATS, *nats.Conn) {
	t.Helper()
	a, _, err := creds.Init(filepath.Join(t.TempDir(), "keys"))
	if err != nil {
		t.Fatal(err)
	}
	ns := testenv.OperatorServer(t, a.Embedded())
	brokerNC, _ := connectAs(t, ns, a, creds.Identity{Role: creds.RoleBroker, Name: "broker-1"})
	return a, ns, brokerNC
}

// untouched checks that request id, which others tried to decide, is still
// pending once the broker is idle, with no decision on the stream.
func untouched(t *testing.T, b *broker.Broker, js jetstream.JetStream, id string) {
	t.Helper()
	itest.WaitBrokerIdle(t, js)
	if rec := itest.WaitState(t, b, id, broker.StatePending); rec.Decision != nil {
		t.Fatalf("the victim's request changed: %+v", rec.Decision)
	}
	if n := itest.CountDecisions(t, js, id); n != 0 {
		t.Fatalf("%d decisions on the stream for the untouched request", n)
	}
}

// eventMsg is an event of typ from source about data, as a message without
// a subject.
func eventMsg(t *testing.T, typ, source string, data any) *nats.Msg {
	t.Helper()
	e, err := events.New(typ, "", source, data)
	if err != nil {
		t.Fatal(err)
	}
	h, body, err := events.Encode(&e)
	if err != nil {
		t.Fatal(err)
	}
	return &nats.Msg{Header: nats.Header(h), Data: body}
}

// askPending publishes a request of agent's through nc, and waits until b
// holds it pending. It returns the request's id and message.
func askPending(t *testing.T, b *broker.Broker, nc *nats.Conn, agent string) (string, *nats.Msg) {
	t.Helper()
	id := events.NewID()
	req, _ := events.New(events.TypeRequested, id, "agent/"+agent, events.Requested{Tool: "deploy", Args: json.RawMessage(`{"v":2}`), Timeout: events.Duration(time.Minute)})
	h, body, _ := events.Encode(&req)
	m := &nats.Msg{Subject: events.RequestPrefix + agent, Header: nats.Header(h), Data: body}
	if _, err := itest.NewJS(t, nc).PublishMsg(itest.TestCtx(t, itest.Patience), m); err != nil {
		t.Fatal(err)
	}
	itest.WaitState(t, b, id, broker.StatePending)
	return id, m
}

// forgeries are what others publish against request id: a decision the
// broker did not make, and principal's approval.
func forgeries(t *testing.T, id, principal string) (decided, answer *nats.Msg) {
	t.Helper()
	return eventMsg(t, events.TypeDecided, "broker/evil", events.Decided{RequestID: id, Outcome: events.Approved}),
		eventMsg(t, events.TypeResponded, "approver/"+principal, events.Responded{Decision: events.Approve})
}

// credsFile writes the credentials issued to who to a file of t's, and
// returns its path.
func credsFile(t *testing.T, a *creds.Authority, who creds.Identity) string {
	t.Helper()
	data, err := a.Issue(who)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), string(who.Role)+"-"+who.Name+".creds")
	if err := os.WriteFile(file, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return file
}

// connectAs connects to ns with the credentials issued to who, recording the
// permission violations the server reports.
func connectAs(t *testing.T, ns *testenv.NATS, a *creds.Authority, who creds.Identity) (*nats.Conn, *violations) {
	t.Helper()
	file := credsFile(t, a, who)
	v := &violations{}
	nc, err := nats.Connect(ns.ClientURL(), nats.UserCredentials(file), nats.MaxReconnects(-1),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { v.add(err) }))
	if err != nil {
		t.Fatalf("connect as %s %s: %v", who.Role, who.Name, err)
	}
	t.Cleanup(nc.Close)
	return nc, v
}

// TestServerEnforcesRoles runs the broker, an agent and an approver on an
// operator-mode server, each with the credentials `broker creds` issues: the
// round trip works, and the server itself refuses an agent publishing as
// another agent, an approver answering as another principal, anyone but the
// broker publishing a decision, and an agent cancelling another agent's
// request; none of those reaches the stream.
func TestServerEnforcesRoles(t *testing.T) {
	a, ns, b, js := operatorBroker(t, "perms")
	if _, err := nats.Connect(ns.ClientURL()); err == nil {
		t.Fatal("a client without credentials connected")
	}

	agentNC, agentV := connectAs(t, ns, a, creds.Identity{Role: creds.RoleAgent, Name: "coder"})
	aliceNC, aliceV := connectAs(t, ns, a, creds.Identity{Role: creds.RoleApprover, Name: "alice"})
	otherNC, _ := connectAs(t, ns, a, creds.Identity{Role: creds.RoleAgent, Name: "other"})

	// The round trip, each with its own credentials.
	itest.RunApprover(t, aliceNC, "alice", "coder", func(_ context.Context, req handler.Request) (handler.Response, error) {
		if req.Tool != "deploy" || string(req.Args) != `{"v":1}` {
			return handler.Response{}, handler.ErrSkip
		}
		return handler.Response{Decision: events.Approve, Reason: "ok"}, nil
	})
	coder := itest.NewClient(t, agentNC, "coder")
	d, err := coder.Request(itest.TestCtx(t, itest.Patience), handler.Request{Requested: events.Requested{Tool: "deploy", Args: json.RawMessage(`{"v":1}`), Timeout: events.Duration(time.Minute)}})
	if err != nil || !d.Approved() || d.DecidedBy[0].Principal != "alice" {
		t.Fatalf("round trip: %+v %v", d, err)
	}

	// A request of coder's that others try to touch.
	victim, req := askPending(t, b, agentNC, "coder")
	decided, answer := forgeries(t, victim, "bob")
	cancel := eventMsg(t, events.TypeCancel, "agent/other", events.Cancel{Reason: "mine now"})
	for _, c := range []struct {
		what    string
		nc      *nats.Conn
		v       *violations
		subject string
		m       *nats.Msg
	}{
		{"an agent asking as another", agentNC, agentV, events.RequestPrefix + "other", req},
		{"an agent publishing a decision", agentNC, agentV, events.DecisionPrefix + victim, decided},
		{"an approver publishing a decision", aliceNC, aliceV, events.DecisionPrefix + victim, decided},
		{"an approver answering as another", aliceNC, aliceV, events.ResponsePrefix + "bob." + victim, answer},
		{"an approver asking", aliceNC, aliceV, events.RequestPrefix + "coder", req},
		{"an agent answering", agentNC, agentV, events.ResponsePrefix + "alice." + victim, answer},
		{"an agent cancelling by id alone", agentNC, agentV, events.CancelPrefix + victim, cancel},
		{"an approver announcing another's presence", aliceNC, aliceV, "$KV." + events.PresenceBucket + ".bob.sdk", &nats.Msg{Data: []byte(`{"principal":"bob","channel":"sdk"}`)}},
		{"an approver deleting the broker's consumer", aliceNC, aliceV, "$JS.API.CONSUMER.DELETE.ASSENT.assent-broker-requests", &nats.Msg{}},
		{"an agent reading the broker's consumer", agentNC, agentV, "$JS.API.CONSUMER.MSG.NEXT.ASSENT.assent-broker-requests", &nats.Msg{Data: []byte(`{"batch":1}`)}},
	} {
		t.Run(c.what, func(t *testing.T) { c.v.refused(t, c.nc, c.subject, c.m) })
	}
	// Another agent cancelling coder's request on its own cancel subject:
	// the server lets it publish there, the broker refuses it.
	otherJS := itest.NewJS(t, otherNC)
	if _, err := otherJS.PublishMsg(itest.TestCtx(t, itest.Patience), &nats.Msg{Subject: events.CancelPrefix + "other." + victim, Header: cancel.Header, Data: cancel.Data}); err != nil {
		t.Fatalf("cancel on its own subject: %v", err)
	}
	// ... and on coder's, the server refuses.
	_, err = otherJS.PublishMsg(itest.TestCtx(t, 2*time.Second), &nats.Msg{Subject: events.CancelPrefix + "coder." + victim, Header: cancel.Header, Data: cancel.Data})
	if err == nil || !errors.Is(err, context.DeadlineExceeded) && !strings.Contains(err.Error(), "ermission") && !errors.Is(err, nats.ErrNoResponders) {
		t.Fatalf("cancel on another agent's subject: %v", err)
	}
	untouched(t, b, js, victim)
	// coder cancels its own, through the SDK (assent.cancel.coder.<id>).
	if err := coder.Cancel(itest.TestCtx(t, itest.Patience), victim, "changed my mind"); err != nil {
		t.Fatal(err)
	}
	if rec := itest.WaitState(t, b, victim, broker.StateCancelled); rec.Decision.DecidedBy[0].Principal != "agent/coder" {
		t.Fatalf("cancelled by %+v", rec.Decision.DecidedBy)
	}
}

// TestBotWithCredentials runs the approver bot (Slack, email, webhooks) with
// the credentials `broker creds bot` issues, on an operator-mode server with
// the agent and the broker on theirs: every channel shows requests, and an
// answer through each decides as its principal.
func TestBotWithCredentials(t *testing.T) {
	a, ns, brokerNC := operatorServer(t)
	agentNC, _ := connectAs(t, ns, a, creds.Identity{Role: creds.RoleAgent, Name: "coder"})
	w := newChannelWorldOn(t, ns, brokerNC, agentNC, broker.Config{})
	w.creds = credsFile(t, a, creds.Identity{Role: creds.RoleBot, Name: "bot-1", Principals: []string{"alice", "bob", "ci-bot"}})
	bot := w.runBot(t, "bot")

	// Slack: alice approves.
	id, decided := w.ask(t, "slack")
	m, _ := w.shown(t, id)
	click := slacktest.Form(t, slacktest.Click("UALICE", "assent.approve", id, m))
	if status, body := slacktest.Post(t, bot+slackch.InteractionsPath, click, slacktest.SignedHeader(itSlackSecret, time.Now(), click)); status != http.StatusOK {
		t.Fatalf("click: %d %s", status, body)
	}
	if d := brokertest.Decision(t, decided); !d.Approved() || d.DecidedBy[0].Principal != "alice" {
		t.Fatalf("Slack: %+v", d)
	}
	w.outcome(t, id, "alice via slack")
	w.hooks.wait(t, id, events.TypeDecided)

	// Email: bob denies.
	id, decided = w.ask(t, "email")
	_, mail := w.shown(t, id)
	resp, err := http.PostForm(mail.Deny(t), url.Values{"reason": {"not today"}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if d := brokertest.Decision(t, decided); d.Approved() || d.DecidedBy[0].Principal != "bob" {
		t.Fatalf("email: %+v", d)
	}

	// Webhook: ci-bot approves.
	id, decided = w.ask(t, "webhook")
	w.shown(t, id)
	body := []byte(`{"request_id":"` + id + `","decision":"approve"}`)
	h := http.Header{"Content-Type": {"application/json"}}
	now := time.Now()
	h.Set(webhook.HeaderID, "msg-"+id)
	h.Set(webhook.HeaderTimestamp, strconv.FormatInt(now.Unix(), 10))
	h.Set(webhook.HeaderSignature, webhook.Sign(w.ciKey, "msg-"+id, now, body))
	if r, err := itest.DoHTTPWith(itest.TestCtx(t, itest.Patience), http.MethodPost, bot+"/webhooks/in/ci", h, body); err != nil || r.Status != http.StatusAccepted {
		t.Fatalf("inbound webhook: %+v %v", r, err)
	}
	if d := brokertest.Decision(t, decided); !d.Approved() || d.DecidedBy[0].Principal != "ci-bot" {
		t.Fatalf("webhook: %+v", d)
	}
}

// TestEmbeddedTLS runs the broker process's embedded server over mutual TLS
// and in operator mode: an agent with its credentials, the CA and a client
// certificate gets its decision; without the certificate, or without TLS, it
// cannot connect.
func TestEmbeddedTLS(t *testing.T) {
	certs := testcerts.New(t)
	keys := filepath.Join(t.TempDir(), "keys")
	a, _, err := creds.Init(keys)
	if err != nil {
		t.Fatal(err)
	}
	addrs := itest.StartApp(t, app.Options{NATSListen: "127.0.0.1:0", DataDir: t.TempDir(), HTTPListen: "127.0.0.1:0",
		NATSOperator: keys, NATSTLS: &natsembed.TLS{CertFile: certs.ServerCertFile, KeyFile: certs.ServerKey, ClientCAFile: certs.CAFile},
		Broker: broker.Config{Mode: broker.ModeAutoApprove}})
	file := credsFile(t, a, creds.Identity{Role: creds.RoleAgent, Name: "coder"})
	url := strings.Replace(addrs.NATS, "nats://", "tls://", 1)
	s := natsconn.Settings{URL: url, Creds: file, CAFile: certs.CAFile, CertFile: certs.ClientCertFile, KeyFile: certs.ClientKey}
	nc, err := natsconn.Connect(s)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	d, err := itest.NewClient(t, nc, "coder").Request(itest.TestCtx(t, itest.Patience), handler.Request{Requested: events.Requested{Tool: "deploy"}})
	if err != nil || !d.Approved() {
		t.Fatalf("over mutual TLS: %+v %v", d, err)
	}
	for _, c := range []struct {
		what string
		s    natsconn.Settings
	}{
		{"no client certificate", natsconn.Settings{URL: url, Creds: file, CAFile: certs.CAFile}},
		{"no TLS", natsconn.Settings{URL: addrs.NATS, Creds: file}},
	} {
		if nc, err := natsconn.Connect(c.s, nats.Timeout(5*time.Second)); err == nil {
			nc.Close()
			t.Errorf("%s: connected", c.what)
		}
	}
	if r := itest.Call(t, http.MethodGet, addrs.HTTP+"/readyz", nil); r.Status != http.StatusOK {
		t.Fatalf("readyz: %d %s", r.Status, r.Body)
	}
}

// TestChannelsSkipForgedDecision: with the broker signing its decisions and
// the bot trusting its key, a decided event someone else publishes first
// neither updates the Slack message nor reaches the webhook receiver; the
// broker's own decision, after it, does both.
func TestChannelsSkipForgedDecision(t *testing.T) {
	key, err := events.NewDecisionKey()
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := key.PublicKey()
	ns := testenv.Server(t)
	w := newChannelWorldOn(t, ns, testenv.Conn(t, ns), testenv.Conn(t, ns), broker.Config{DecisionKey: key})
	w.trusted = []string{pub}
	// The forgery is stored first: an agent that trusted no key would take
	// it for the decision (and refuse it, its digests being wrong), so the
	// agent trusts the broker's key too, and takes the signed decision
	// stored after it.
	if w.agent, err = handler.NewClient(testenv.Conn(t, ns), handler.Config{Agent: "coder", TrustedKeys: w.trusted, Logger: quietLogger(t)}); err != nil {
		t.Fatal(err)
	}
	w.runBot(t, "bot")
	id, decided := w.ask(t, "forged")
	w.shown(t, id)

	forged, _ := events.New(events.TypeDecided, "", "broker/evil", events.Decided{RequestID: id, Outcome: events.Approved, DecidedBy: []events.DecidedBy{{Principal: "mallory", Channel: "evil"}}})
	itest.MustPublish(t, w.js, events.DecisionPrefix+id, mustEncode(t, &forged), "")
	itest.ApprovalOf(t, itest.Call(t, http.MethodPost, w.api+"/v1/approvals/"+id+"/decision", `{"principal":"carol","decision":"deny","reason":"no"}`), http.StatusOK)
	if d := brokertest.Decision(t, decided); d.Approved() || d.DecidedBy[0].Principal != "carol" {
		t.Fatalf("the agent got %+v", d)
	}
	w.outcome(t, id, "carol via http")
	got := w.hooks.wait(t, id, events.TypeDecided)
	if m, _ := w.slack.Message(id); strings.Contains(m.Blocks, "mallory") {
		t.Fatalf("the Slack message shows the forgery: %s", m.Blocks)
	}
	if n := len(w.hooks.events(id, events.TypeDecided)); n != 1 || strings.Contains(string(got.Data), "mallory") {
		t.Fatalf("the webhook got %d decided events, the first %s", n, got.Data)
	}
}

// mustEncode encodes e in structured mode.
func mustEncode(t *testing.T, e *events.Event) []byte {
	t.Helper()
	_, body, err := events.Encode(e)
	if err != nil {
		t.Fatal(err)
	}
	return body
}

// connectPrivate connects as agent with --private credentials and its own
// inbox prefix.
func connectPrivate(t *testing.T, ns *testenv.NATS, a *creds.Authority, agent string) (*nats.Conn, *violations) {
	t.Helper()
	file := credsFile(t, a, creds.Identity{Role: creds.RoleAgent, Name: agent, Private: true})
	v := &violations{}
	nc, err := nats.Connect(ns.ClientURL(), nats.UserCredentials(file), nats.CustomInboxPrefix(handler.PrivateInbox(agent)),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { v.add(err) }))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc, v
}

// TestPrivateReads: agents with --private credentials get their own
// decisions (live, and looked up after the fact) through the broker, and the
// server refuses them another agent's: the stream, the public decision
// subjects, another agent's private subjects; the broker answers a lookup of
// another agent's request as unknown.
func TestPrivateReads(t *testing.T) {
	a, ns, b, _ := operatorBroker(t, "private")
	aliceNC, _ := connectAs(t, ns, a, creds.Identity{Role: creds.RoleApprover, Name: "alice"})
	itest.RunApprover(t, aliceNC, "alice", "coder", func(_ context.Context, req handler.Request) (handler.Response, error) {
		return handler.Response{Decision: events.Approve, Reason: "fine"}, nil
	})
	coderNC, coderV := connectPrivate(t, ns, a, "coder")
	otherNC, otherV := connectPrivate(t, ns, a, "other")

	if _, err := handler.NewClient(otherNC, handler.Config{Agent: "coder", Private: true}); err == nil || !strings.Contains(err.Error(), "inbox prefix _INBOX_coder") {
		t.Fatalf("a Private client on another agent's inbox: %v", err)
	}
	coder, err := handler.NewClient(coderNC, handler.Config{Agent: "coder", Private: true, Logger: testenv.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	d, err := coder.Request(itest.TestCtx(t, itest.Patience), handler.Request{Requested: events.Requested{Tool: "deploy", Args: json.RawMessage(`{"v":1}`), Timeout: events.Duration(time.Minute)}})
	if err != nil || !d.Approved() || d.DecidedBy[0].Principal != "alice" {
		t.Fatalf("private round trip: %+v %v", d, err)
	}
	// Looked up after the fact, and a retry by id gets the same decision.
	got, ok, err := coder.Decision(itest.TestCtx(t, itest.Patience), d.RequestID)
	if err != nil || !ok || got.DecidedAt != d.DecidedAt {
		t.Fatalf("Decision by lookup: %+v %v %v", got, ok, err)
	}
	again, err := coder.Request(itest.TestCtx(t, itest.Patience), handler.Request{ID: d.RequestID, Requested: events.Requested{Tool: "deploy", Args: json.RawMessage(`{"v":1}`), Timeout: events.Duration(time.Minute)}})
	if err != nil || again.DecidedAt != d.DecidedAt {
		t.Fatalf("retry by id: %+v %v", again, err)
	}
	itest.WaitState(t, b, d.RequestID, broker.StateApproved)

	// other, for coder's request: the broker says unknown...
	m, err := otherNC.Request(events.PrivatePrefix+"other.lookup."+d.RequestID, nil, itest.Patience)
	if err != nil || m.Header.Get(events.LookupStatus) != events.LookupUnknown || len(m.Data) != 0 {
		t.Fatalf("other's lookup of coder's request: %v %v", m, err)
	}
	// ... and the server refuses the rest.
	if err := otherNC.Publish(events.PrivatePrefix+"coder.lookup."+d.RequestID, nil); err != nil {
		t.Fatal(err)
	}
	_ = otherNC.Flush()
	otherV.wait(t, events.PrivatePrefix+"coder.lookup."+d.RequestID)
	if err := otherNC.Publish("$JS.API.STREAM.MSG.GET.ASSENT", []byte(`{"last_by_subj":"assent.decision.`+d.RequestID+`"}`)); err != nil {
		t.Fatal(err)
	}
	_ = otherNC.Flush()
	otherV.wait(t, "$JS.API.STREAM.MSG.GET.ASSENT")
	for _, subj := range []string{events.DecisionPrefix + d.RequestID, events.PrivatePrefix + "coder.decided." + d.RequestID} {
		otherV.refusedSub(t, otherNC, subj)
	}
	coderV.none(t, "coder's own reads")
}
