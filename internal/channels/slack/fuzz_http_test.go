package slack_test

import (
	"context"
	"crypto/hmac"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/slack-go/slack"
	"go.uber.org/zap"

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

// interactionsFuzz is what FuzzInteractions runs against: a broker, a local
// Slack and the Slack channel in http mode on one embedded NATS server,
// shared by every input.
type interactionsFuzz struct {
	b   *broker.Broker
	rt  *handler.Channel
	mux *http.ServeMux
	// answers receives every answer put on the stream.
	answers *testenv.Tap
	// signed holds the signatures of the interactions taken so far, lower
	// case: a replay is one of them.
	signed  map[string]bool
	pending string // the request $PENDING stands for, while pending
	made    int
}

// slackUsers maps the Slack users of testPolicy to their principals.
var slackUsers = map[string]string{"UALICE": "alice", "UBOB": "bob", "UERIN": "erin"}

func newInteractionsFuzz(f *testing.F) *interactionsFuzz {
	p, err := policy.Parse([]byte(testPolicy), "policy.yaml")
	if err != nil {
		f.Fatal(err)
	}
	ns := testenv.Server(f)
	// Deadlines an hour away and no reminders: nothing but the inputs
	// makes the channel act.
	b, _ := brokertest.RunLogged(f, testenv.InProcessConn(f, ns), broker.Config{Name: "fuzz", Policy: p, MinTimeout: time.Hour, DefaultTimeout: time.Hour}, zap.NewNop())
	local := slacktest.New(f, botToken, appToken)
	f.Setenv(envBot, botToken)
	f.Setenv(envSecret, signingSecret)
	nc := testenv.InProcessConn(f, ns)
	a, err := slackch.New(slackch.Config{BotTokenEnv: envBot, SigningSecretEnv: envSecret, Mode: slackch.ModeHTTP, Channel: slackChannel, APIURL: local.URL()},
		channels.Env{NATS: nc, Directory: channels.NewDirectory(p), WebUI: webUI, Logger: zap.NewNop()})
	if err != nil {
		f.Fatal(err)
	}
	e := &interactionsFuzz{b: b, mux: http.NewServeMux(), answers: testenv.NewTap(f, ns, events.ResponsePrefix+">"), signed: map[string]bool{}}
	e.rt, _ = brokertest.RunAdapter(f, nc, handler.ChannelConfig{Logger: zap.NewNop()}, a, e.mux)
	return e
}

// pendingID returns the id of a request that is pending now and shown in
// Slack: the one made last, or a new one.
func (e *interactionsFuzz) pendingID(t *testing.T) string {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if e.pending != "" {
		if rec, err := e.b.Get(ctx, e.pending); err == nil && rec.State == broker.StatePending {
			return e.pending
		}
	}
	newID := func() string {
		e.made++
		return fmt.Sprintf("fuzz-%d-%d", os.Getpid(), e.made)
	}
	// Reads may be remembered, in the session or for the user.
	id := brokertest.SubmitPending(ctx, t, e.b, newID, events.Requested{Tool: "read_file", Agent: "coder", User: "dan", Session: "s-1",
		Args: json.RawMessage(`{"path":"/etc/hosts"}`)})
	for {
		if n, _, ok, err := e.rt.Lookup(ctx, id); err == nil && ok && n.Ref != nil {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("request %s not shown in Slack: %v", id, ctx.Err())
		case <-time.After(2 * time.Millisecond):
		}
	}
	e.pending = id
	return id
}

// slackValid is Slack's signature check, written from Slack's documentation
// (https://api.slack.com/authentication/verifying-requests-from-slack): the
// timestamp within 5 minutes of at, and the signature "v0=" + hex of
// HMAC-SHA256 over "v0:" + timestamp + ":" + body (hex in either case).
func slackValid(h http.Header, body string, at time.Time) bool {
	ts, sig := h.Get("X-Slack-Request-Timestamp"), h.Get("X-Slack-Signature")
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil || at.Sub(time.Unix(sec, 0)).Abs() > 5*time.Minute {
		return false
	}
	got, err := hex.DecodeString(strings.TrimPrefix(sig, "v0="))
	want, _ := hex.DecodeString(strings.TrimPrefix(slacktest.Sign(signingSecret, ts, body), "v0="))
	return err == nil && strings.HasPrefix(sig, "v0=") && hmac.Equal(got, want)
}

// How FuzzInteractions signs an input (mode % 4), and whether it posts the
// fuzzed body as is or as the payload of a form (mode / 4 % 2).
const (
	signAsGiven  = iota // the fuzzed headers as they are
	signNow             // a valid signature now
	signOffset          // valid, at now plus the fuzzed timestamp in seconds
	signOtherKey        // valid, with another secret
	signModes
)

// FuzzInteractions posts the Slack interactions endpoint any body (as is,
// or as the payload field of a form, as Slack posts interactions) with any
// X-Slack-Request-Timestamp and X-Slack-Signature, or a signature mode
// makes; $PENDING in the body becomes the id of a pending request shown in
// Slack. Whatever comes, the endpoint must not panic; refuse with 401 and an
// {"error": {"code", "message"}} what Slack did not sign within 5 minutes
// and what it signed but was taken before (replayed), and nothing else; take
// a signed interaction with 200 (or 400 malformed if it is no payload), an
// empty body or a view submission response; and put no answer on the stream
// for anything refused, and at most one, as the principal the interaction's
// Slack user maps to, for anything taken.
func FuzzInteractions(f *testing.F) {
	e := newInteractionsFuzz(f)
	click := func(user, action, id string) string {
		b, _ := json.Marshal(slacktest.Click(user, action, id, slacktest.Message{Channel: slackChannel, TS: "1700000000.000001"}))
		return string(b)
	}
	submit := func(user, callback, meta string, values map[string]any) string {
		b, _ := json.Marshal(slacktest.Submit(user, slacktest.View{CallbackID: callback, PrivateMetadata: meta}, values))
		return string(b)
	}
	meta := `{"id":"$PENDING","channel":"` + slackChannel + `"}`
	payloads := []string{
		click("UALICE", "assent.approve", "$PENDING"),
		click("UALICE", "assent.deny", "$PENDING"),
		click("UALICE", "assent.edit", "$PENDING"),
		click("UALICE", "assent.remember", "$PENDING"),
		click("UBOB", "assent.approve", "$PENDING"),
		click("UNOBODY", "assent.approve", "$PENDING"),
		click("UALICE", "assent.approve", "no-such-request"),
		click("UALICE", "assent.approve", "a.b"),
		click("UALICE", "other.action", "$PENDING"),
		submit("UALICE", "assent.deny", meta, map[string]any{"reason": slacktest.Text("not now")}),
		submit("UALICE", "assent.edit", meta, map[string]any{"args": slacktest.Text(`{"path":"/etc/motd"}`), "reason": slacktest.Text("narrower")}),
		submit("UALICE", "assent.edit", meta, map[string]any{"args": slacktest.Text(`{"path": "/etc`)}),
		submit("UALICE", "assent.edit", meta, map[string]any{"args": slacktest.Text(`[1]`)}),
		submit("UALICE", "assent.remember", meta, map[string]any{"scope": slacktest.Radio("session")}),
		submit("UALICE", "assent.remember", meta, map[string]any{"scope": slacktest.Radio("agent")}),
		submit("UERIN", "assent.deny", `{"id":"$PENDING"`, nil),
		submit("UALICE", "other.view", meta, nil),
		`{"type":"view_submission","user":{"id":"UALICE"},"view":{"callback_id":"assent.edit","private_metadata":"{\"id\":\"$PENDING\"}","state":{"values":{"args":null}}}}`,
		`{"type":"view_submission","user":{"id":"UALICE"},"view":{"callback_id":"assent.deny","private_metadata":7,"state":"x"}}`,
		`{"type":"block_actions","user":{"id":"UALICE"},"actions":[]}`,
		`{"type":"block_actions","user":{"id":"UALICE"},"actions":{"x":1}}`,
		`{"type":"shortcut"}`, `[]`, `null`, `{"type":"block_actions","user":{"id":"UALICE"},"actions":[{"action_id":"assent.approve","value":"\ud800"}]}`,
	}
	for i, p := range payloads {
		f.Add("", "", uint8(signNow+4), []byte(p))
		if i < 2 {
			f.Add("-301", "", uint8(signOffset+4), []byte(p))
			f.Add("", "", uint8(signOtherKey+4), []byte(p))
		}
	}
	for _, s := range []struct {
		ts, sig string
		mode    uint8
		body    string
	}{
		{"", "", signNow, "payload=%7B%22type%22%3A%22block_actions%22%7D&payload=2"},
		{"", "", signNow, "payload=%zz"},
		{"", "", signNow, "token=x"},
		{"", "", signNow, ""},
		{"1700000000", "v0=" + strings.Repeat("ab", 32), signAsGiven, "payload=%7B%7D"},
		{"1700000000", slacktest.Sign(signingSecret, "1700000000", "payload=%7B%7D"), signAsGiven, "payload=%7B%7D"},
		{"", "", signAsGiven, "payload=%7B%7D"},
		{"now", "v0=zz", signAsGiven, ""},
		{"99999999999999999999", "v0=", signAsGiven, ""},
		{"-9223372036854775808", "v1=00", signAsGiven, ""},
	} {
		f.Add(s.ts, s.sig, s.mode, []byte(s.body))
	}
	f.Fuzz(func(t *testing.T, ts, sig string, mode uint8, raw []byte) {
		body := string(raw)
		if strings.Contains(body, "$PENDING") {
			body = strings.ReplaceAll(body, "$PENDING", e.pendingID(t))
		}
		if mode/signModes%2 == 1 {
			body = url.Values{"payload": {body}}.Encode()
		}
		now := time.Now()
		switch mode % signModes {
		case signNow:
			ts = strconv.FormatInt(now.Unix(), 10)
			sig = slacktest.Sign(signingSecret, ts, body)
		case signOffset:
			off, _ := strconv.ParseInt(ts, 10, 32)
			ts = strconv.FormatInt(now.Unix()+off, 10)
			sig = slacktest.Sign(signingSecret, ts, body)
		case signOtherKey:
			ts = strconv.FormatInt(now.Unix(), 10)
			sig = slacktest.Sign(signingSecret+"-not", ts, body)
		}
		r := httptest.NewRequest(http.MethodPost, slackch.InteractionsPath, strings.NewReader(body))
		r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		for k, v := range map[string]string{"X-Slack-Request-Timestamp": ts, "X-Slack-Signature": sig} {
			if v == "" {
				continue
			}
			if !testenv.ValidHeaderValue(v) {
				return // the server answers 400 itself
			}
			r.Header.Set(k, strings.Trim(v, " \t"))
		}
		e.answers.Drain(t)
		before := time.Now()
		w := httptest.NewRecorder()
		e.mux.ServeHTTP(w, r)
		after := time.Now()
		answers := e.answers.Drain(t)

		input := fmt.Sprintf("(mode %d) X-Slack-Request-Timestamp %q X-Slack-Signature %q body %q", mode%(2*signModes), ts, sig, body)
		status, out := w.Code, w.Body.String()
		var refused struct {
			Error *struct {
				Code    string `json:"code"`
				Message string `json:"message"`
			} `json:"error"`
		}
		if status != http.StatusOK {
			if ct := w.Header().Get("Content-Type"); ct != "application/json" {
				t.Fatalf("%s: %d with Content-Type %q, want application/json", input, status, ct)
			}
			if err := testenv.StrictJSON([]byte(out), &refused); err != nil || refused.Error == nil || refused.Error.Message == "" {
				t.Fatalf("%s: %d with body %q, want {\"error\": {\"code\", \"message\"}} (%v)", input, status, out, err)
			}
			if len(answers) > 0 {
				t.Fatalf("%s: refused with %d %s, yet the stream got answers %v", input, status, out, answers)
			}
		}
		ok0, ok1 := slackValid(r.Header, body, before), slackValid(r.Header, body, after)
		key := strings.ToLower(r.Header.Get("X-Slack-Signature"))
		switch {
		case status == http.StatusUnauthorized:
			if code := refused.Error.Code; code == "replayed" {
				if !ok0 && !ok1 || !e.signed[key] {
					t.Fatalf("%s: refused as replayed, but it was not taken before: %s", input, out)
				}
			} else if ok0 && ok1 {
				t.Fatalf("%s: signed by Slack, yet refused: %s", input, out)
			}
			return
		case status == http.StatusRequestEntityTooLarge:
			// Read before the signature is checked.
			if refused.Error.Code != "too_large" {
				t.Fatalf("%s: 413 %s, want too_large", input, out)
			}
			return
		case !ok0 && !ok1:
			t.Fatalf("%s: not signed by Slack, yet %d %q", input, status, out)
		}
		e.signed[key] = true
		switch status {
		case http.StatusOK:
		case http.StatusBadRequest:
			if refused.Error.Code != "malformed" {
				t.Fatalf("%s: 400 %s, want malformed", input, out)
			}
			return
		default:
			t.Fatalf("%s: %d %q from the interactions endpoint", input, status, out)
		}
		if out != "" {
			var resp slack.ViewSubmissionResponse
			dec := json.NewDecoder(strings.NewReader(out))
			dec.DisallowUnknownFields()
			if ct := w.Header().Get("Content-Type"); ct != "application/json" || dec.Decode(&resp) != nil || resp.ResponseAction != "errors" || len(resp.Errors) == 0 {
				t.Fatalf("%s: 200 %q (Content-Type %q), want nothing or a view submission response with errors", input, out, ct)
			}
		}
		switch len(answers) {
		case 0:
		case 1:
			var cb slack.InteractionCallback
			form, _ := url.ParseQuery(body)
			_ = json.Unmarshal([]byte(form.Get("payload")), &cb)
			principal, mapped := slackUsers[cb.User.ID]
			if !mapped || !strings.HasPrefix(answers[0], events.ResponsePrefix+principal+".") {
				t.Fatalf("%s: answer %s, for Slack user %q (principal %q)", input, answers[0], cb.User.ID, principal)
			}
		default:
			t.Fatalf("%s: one interaction put %d answers on the stream: %v", input, len(answers), answers)
		}
	})
}
