package integration

import (
	"bytes"
	"net/http"
	"regexp"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/assent-dev/assent/integration/itest"
	"github.com/assent-dev/assent/internal/broker"
	"github.com/assent-dev/assent/pkg/events"
)

// wireGolden lists requests decided at once and, for each, the decided event
// the broker stores and the approval GET /v1/approvals/{id} returns, byte for
// byte once the values that differ from run to run (times, the decision's
// event id, stream sequences) are masked. The decided events were made by
// the broker before its per-request work was optimised, and gained only
// request_seq when the stream became the state (docs/stream-decides.md,
// "The wire contract"); the approvals were checked against the state entries
// that broker stored, which agents and other brokers read then: the same
// request, state, deadline and decision. A change here changes what agents
// and other brokers read.
var wireGolden = []struct {
	name, policy, id, data string
	decided, approval      string
}{
	{
		name:     "auto-approve mode",
		id:       "0193a5b2-7c1e-7d3a-9f1e-000000000001",
		data:     `{"tool":"noop","args":{"n":1},"agent":"golden"}`,
		decided:  "{\"specversion\":\"1.0\",\"id\":\"<id>\",\"source\":\"broker/itest\",\"type\":\"dev.assent.approval.decided\",\"datacontenttype\":\"application/json\",\"time\":\"<time>\",\"data\":{\"request_id\":\"<request>\",\"outcome\":\"approved\",\"reason\":\"auto-approve mode\",\"args\":{\"n\":1},\"args_digest\":\"sha256:2bfd14f43d17fc7cea24e0917a8879b4b2f880b8baeec1b9d90fbaad655e71bd\",\"rule\":\"mode:auto-approve\",\"auto\":true,\"decided_at\":\"<time>\",\"request_digest\":\"sha256:fc7dad822d5740880488e6be605287ac085338f2f7270d84dd8f28602c398e3b\",\"request_seq\":<seq>}}",
		approval: "{\"id\":\"<request>\",\"state\":\"approved\",\"request\":{\"tool\":\"noop\",\"args\":{\"n\":1},\"agent\":\"golden\"},\"deadline\":\"<time>\",\"received_at\":\"<time>\",\"decision\":{\"request_id\":\"<request>\",\"outcome\":\"approved\",\"reason\":\"auto-approve mode\",\"args\":{\"n\":1},\"args_digest\":\"sha256:2bfd14f43d17fc7cea24e0917a8879b4b2f880b8baeec1b9d90fbaad655e71bd\",\"rule\":\"mode:auto-approve\",\"auto\":true,\"decided_at\":\"<time>\",\"request_digest\":\"sha256:fc7dad822d5740880488e6be605287ac085338f2f7270d84dd8f28602c398e3b\",\"request_seq\":<seq>}}",
	},
	{
		name: "args with white space, unsorted keys and HTML",
		id:   "0193a5b2-7c1e-7d3a-9f1e-000000000002",
		data: "{\"tool\": \"search\", \"args\": {\"q\": \"<a> & b\", \"n\": [1, 2.50], \"a\": {\"z\": null, \"\\u00e9\": \"\\u2028\"}},\n" +
			" \"session\": \"s-1\", \"user\": \"carol\", \"call_id\": \"c1\", \"hint\": \"<b>\", \"labels\": {\"env\": \"prod\", \"a\": \"<1>\"}," +
			" \"response_schema\": {\"type\": \"object\"}, \"timeout\": \"1m\"}",
		decided:  "{\"specversion\":\"1.0\",\"id\":\"<id>\",\"source\":\"broker/itest\",\"type\":\"dev.assent.approval.decided\",\"datacontenttype\":\"application/json\",\"time\":\"<time>\",\"data\":{\"request_id\":\"<request>\",\"outcome\":\"approved\",\"reason\":\"auto-approve mode\",\"args\":{\"q\":\"<a> & b\",\"n\":[1,2.50],\"a\":{\"z\":null,\"\\u00e9\":\"\\u2028\"}},\"args_digest\":\"sha256:3ab4ab56ae93f3935dd2e28ddee536d18ab5193038eb1c1c1cf50a0bc4fa9827\",\"rule\":\"mode:auto-approve\",\"auto\":true,\"decided_at\":\"<time>\",\"request_digest\":\"sha256:2f60cd45d307af4a48dc168b3bb476792f586c6ac272bf432f6b39746a7ac39c\",\"request_seq\":<seq>}}",
		approval: "{\"id\":\"<request>\",\"state\":\"approved\",\"request\":{\"tool\":\"search\",\"args\":{\"q\":\"<a> & b\",\"n\":[1,2.50],\"a\":{\"z\":null,\"\\u00e9\":\"\\u2028\"}},\"agent\":\"golden\",\"session\":\"s-1\",\"user\":\"carol\",\"call_id\":\"c1\",\"hint\":\"<b>\",\"response_schema\":{\"type\":\"object\"},\"timeout\":\"1m0s\",\"labels\":{\"a\":\"<1>\",\"env\":\"prod\"}},\"deadline\":\"<time>\",\"received_at\":\"<time>\",\"decision\":{\"request_id\":\"<request>\",\"outcome\":\"approved\",\"reason\":\"auto-approve mode\",\"args\":{\"q\":\"<a> & b\",\"n\":[1,2.50],\"a\":{\"z\":null,\"\\u00e9\":\"\\u2028\"}},\"args_digest\":\"sha256:3ab4ab56ae93f3935dd2e28ddee536d18ab5193038eb1c1c1cf50a0bc4fa9827\",\"rule\":\"mode:auto-approve\",\"auto\":true,\"decided_at\":\"<time>\",\"request_digest\":\"sha256:2f60cd45d307af4a48dc168b3bb476792f586c6ac272bf432f6b39746a7ac39c\",\"request_seq\":<seq>}}",
	},
	{
		name:     "allowed by a rule that reads args",
		policy:   "version: 1\nmode: manual\nrules:\n  - name: small\n    tools: [pay]\n    when: 'args.amount < 100'\n    action: allow\n  - name: big\n    tools: [pay]\n    when: 'args.amount >= 100'\n    action: deny\n",
		id:       "0193a5b2-7c1e-7d3a-9f1e-000000000003",
		data:     `{"tool":"pay","args":{"amount":5,"to":"bob"}}`,
		decided:  "{\"specversion\":\"1.0\",\"id\":\"<id>\",\"source\":\"broker/itest\",\"type\":\"dev.assent.approval.decided\",\"datacontenttype\":\"application/json\",\"time\":\"<time>\",\"data\":{\"request_id\":\"<request>\",\"outcome\":\"approved\",\"reason\":\"allowed by rule small\",\"args\":{\"amount\":5,\"to\":\"bob\"},\"args_digest\":\"sha256:29ddb7bbd60d67fa1591798dc16ecfeddfbfbb48c6353113c32659d4e76a6078\",\"rule\":\"small\",\"auto\":true,\"decided_at\":\"<time>\",\"request_digest\":\"sha256:d12dba404d83986b6c6401f8cc415e83869705a81039d3b7a1c22fb12ef9d257\",\"request_seq\":<seq>}}",
		approval: "{\"id\":\"<request>\",\"state\":\"approved\",\"request\":{\"tool\":\"pay\",\"args\":{\"amount\":5,\"to\":\"bob\"},\"agent\":\"golden\"},\"deadline\":\"<time>\",\"received_at\":\"<time>\",\"decision\":{\"request_id\":\"<request>\",\"outcome\":\"approved\",\"reason\":\"allowed by rule small\",\"args\":{\"amount\":5,\"to\":\"bob\"},\"args_digest\":\"sha256:29ddb7bbd60d67fa1591798dc16ecfeddfbfbb48c6353113c32659d4e76a6078\",\"rule\":\"small\",\"auto\":true,\"decided_at\":\"<time>\",\"request_digest\":\"sha256:d12dba404d83986b6c6401f8cc415e83869705a81039d3b7a1c22fb12ef9d257\",\"request_seq\":<seq>}}",
	},
	{
		name:     "denied by a rule that reads args",
		policy:   "version: 1\nmode: manual\nrules:\n  - name: small\n    tools: [pay]\n    when: 'args.amount < 100'\n    action: allow\n  - name: big\n    tools: [pay]\n    when: 'args.amount >= 100'\n    action: deny\n",
		id:       "0193a5b2-7c1e-7d3a-9f1e-000000000004",
		data:     `{"tool":"pay","args":{"to":"bob","amount":500}}`,
		decided:  "{\"specversion\":\"1.0\",\"id\":\"<id>\",\"source\":\"broker/itest\",\"type\":\"dev.assent.approval.decided\",\"datacontenttype\":\"application/json\",\"time\":\"<time>\",\"data\":{\"request_id\":\"<request>\",\"outcome\":\"denied\",\"reason\":\"denied by rule big\",\"args\":{\"to\":\"bob\",\"amount\":500},\"args_digest\":\"sha256:744d9488eacfdc80fab739b4b8d31dc76b15e8ac0e11ace236a09a31516d43ff\",\"rule\":\"big\",\"auto\":true,\"decided_at\":\"<time>\",\"request_digest\":\"sha256:4764feea2f524d800bcf1c3766da22eb4b25e7b1f8b60782fc0287921d1f9bc6\",\"request_seq\":<seq>}}",
		approval: "{\"id\":\"<request>\",\"state\":\"denied\",\"request\":{\"tool\":\"pay\",\"args\":{\"to\":\"bob\",\"amount\":500},\"agent\":\"golden\"},\"deadline\":\"<time>\",\"received_at\":\"<time>\",\"decision\":{\"request_id\":\"<request>\",\"outcome\":\"denied\",\"reason\":\"denied by rule big\",\"args\":{\"to\":\"bob\",\"amount\":500},\"args_digest\":\"sha256:744d9488eacfdc80fab739b4b8d31dc76b15e8ac0e11ace236a09a31516d43ff\",\"rule\":\"big\",\"auto\":true,\"decided_at\":\"<time>\",\"request_digest\":\"sha256:4764feea2f524d800bcf1c3766da22eb4b25e7b1f8b60782fc0287921d1f9bc6\",\"request_seq\":<seq>}}",
	},
	{
		name:     "args not an object",
		id:       "0193a5b2-7c1e-7d3a-9f1e-000000000005",
		data:     `{"tool":"noop","args":[1,2]}`,
		decided:  "{\"specversion\":\"1.0\",\"id\":\"<id>\",\"source\":\"broker/itest\",\"type\":\"dev.assent.approval.decided\",\"datacontenttype\":\"application/json\",\"time\":\"<time>\",\"data\":{\"request_id\":\"<request>\",\"outcome\":\"denied\",\"reason\":\"invalid_request: args: args must be a JSON object\",\"args\":{},\"args_digest\":\"sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a\",\"rule\":\"validation\",\"auto\":true,\"decided_at\":\"<time>\",\"request_seq\":<seq>}}",
		approval: "{\"id\":\"<request>\",\"state\":\"denied\",\"request\":{\"tool\":\"noop\",\"agent\":\"golden\"},\"deadline\":\"<time>\",\"received_at\":\"<time>\",\"decision\":{\"request_id\":\"<request>\",\"outcome\":\"denied\",\"reason\":\"invalid_request: args: args must be a JSON object\",\"args\":{},\"args_digest\":\"sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a\",\"rule\":\"validation\",\"auto\":true,\"decided_at\":\"<time>\",\"request_seq\":<seq>}}",
	},
}

// maskWire replaces what differs from run to run in an event or approval.
var maskWire = []struct {
	re   *regexp.Regexp
	with string
}{
	{regexp.MustCompile(`"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z"`), `"<time>"`},
	{regexp.MustCompile(`"(decision_event_id|id)":"[0-9a-f-]{36}"`), `"$1":"<id>"`},
	{regexp.MustCompile(`"(request_seq|trigger)":\d+`), `"$1":<seq>`},
}

func masked(b []byte, keepID string) string {
	s := string(b)
	s = regexp.MustCompile(regexp.QuoteMeta(`"`+keepID+`"`)).ReplaceAllString(s, `"<request>"`)
	for _, m := range maskWire {
		s = m.re.ReplaceAllString(s, m.with)
	}
	return s
}

func TestAutomaticDecisionWireGolden(t *testing.T) {
	for _, g := range wireGolden {
		t.Run(g.name, func(t *testing.T) {
			cfg := broker.Config{Mode: broker.ModeAutoApprove}
			if g.policy != "" {
				cfg = broker.Config{Policy: itest.MustPolicy(t, g.policy, "golden.yaml")}
			}
			e := itest.NewEnv(t, cfg)
			itest.MustPublish(t, e.JS, "assent.request.golden", itest.RawEvent(g.id, events.TypeRequested, "agent/golden", g.data), g.id)
			itest.WaitDecision(t, e.JS, g.id)

			ctx, cancel := itest.OpCtx()
			defer cancel()
			subj, _ := events.DecisionSubject(g.id)
			m, err := itest.StreamOf(t, e.JS).GetMsg(ctx, 1, jetstream.WithGetMsgSubject(subj))
			if err != nil {
				t.Fatal(err)
			}
			if ct := m.Header.Get("Content-Type"); ct != events.ContentTypeStructured {
				t.Errorf("decided Content-Type %q", ct)
			}
			got := itest.Call(t, "GET", e.API+"/v1/approvals/"+g.id, nil)
			if got.Status != http.StatusOK {
				t.Fatalf("GET /v1/approvals/%s: %d %s", g.id, got.Status, got.Body)
			}
			decided, approval := masked(m.Data, g.id), masked(bytes.TrimSpace(got.Body), g.id)
			if g.decided == "" || g.approval == "" {
				t.Errorf("want:\n{%q,\n%q},", decided, approval)
				return
			}
			if decided != g.decided {
				t.Errorf("decided event\n%s\nwant\n%s", decided, g.decided)
			}
			if approval != g.approval {
				t.Errorf("GET /v1/approvals/<request>\n%s\nwant\n%s", approval, g.approval)
			}
		})
	}
}
