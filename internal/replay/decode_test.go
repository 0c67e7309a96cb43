package replay

import (
	"bytes"
	"encoding/json"
	"errors"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/assent-dev/assent/pkg/events"
	"github.com/assent-dev/assent/pkg/policy"
)

var structured = map[string][]string{"Content-Type": {events.ContentTypeStructured}}

func encode(t testing.TB, typ, id string, data any) []byte {
	t.Helper()
	e, err := events.New(typ, id, "agent/a", data)
	if err != nil {
		t.Fatal(err)
	}
	_, body, err := events.Encode(&e)
	if err != nil {
		t.Fatal(err)
	}
	return body
}

// requestBodies are request events as agents publish them, some odd.
func requestBodies(t testing.TB) [][]byte {
	id := "0193a5b2-7c1e-7d3a-9f1e-3c2b1a0f9e8d"
	out := [][]byte{
		encode(t, events.TypeRequested, id, events.Requested{Tool: "pay", Agent: "a", Args: json.RawMessage(`{"amount": 5, "to": "b\u00e9"}`)}),
		encode(t, events.TypeRequested, id, events.Requested{Tool: "write_file", Agent: "a", Session: "s-1", User: "carol", CallID: "c1", Hint: "Write \"it\"\n<now>",
			Timeout: events.Duration(90 * time.Second), Labels: map[string]string{"env": "prod", "team": "pay\tments"},
			Args: json.RawMessage(`{"path":"/srv/a","nested":{"x":[1,2,{"y":null}]},"s":"a\"b\\c"}`)}),
		encode(t, events.TypeRequested, id, events.Requested{Tool: "resize", Args: json.RawMessage(`{"size":"big"}`),
			InputSchema: json.RawMessage(`{"type":"object","properties":{"size":{"type":"integer"}}}`), ResponseSchema: json.RawMessage(`{"type":"object"}`)}),
		encode(t, events.TypeRequested, id, map[string]any{"tool": "t", "args": nil, "labels": nil, "timeout": nil}),
		[]byte(`{"specversion":"1.0","id":"` + id + `","source":"agent/a","type":"dev.assent.approval.requested","datacontenttype":"application/json","data":{"tool":"x","Tool":"y"}}`),
		[]byte(`{"specversion":"1.0","id":"` + id + `","source":"agent/a","type":"dev.assent.approval.requested","data":{"tool":"x"},"data":{"tool":"y"}}`),
		[]byte(`{"specversion":"1.0","id":"` + id + `","source":"agent/a","type":"dev.assent.approval.requested","data_base64":"e30="}`),
		[]byte(`{"specversion":"0.3","id":"` + id + `","source":"agent/a","type":"dev.assent.approval.requested","data":{"tool":"x"}}`),
		[]byte(` { "specversion" : "1.0" , "id" : "` + id + `" , "source" : "agent/a" , "type" : "dev.assent.approval.requested" , "data" : { "tool" : "x" , "args" : { "a" : 1 } } } `),
		[]byte(`{"specversion":"1.0","id":"` + id + `","source":"agent/a","type":"dev.assent.approval.requested","data":{"tool":"x","timeout":"soon"}}`),
		[]byte(`{"specversion":"1.0","id":"` + id + `","source":"agent/a","type":"dev.assent.approval.requested","data":{"tool":"x\ud800"}}`),
		[]byte(`{"specversion":"1.0","id":"` + id + `","source":"agent/a","type":"dev.assent.approval.requested","data":{"tool":"x","agent":"b"}}`),
		[]byte(`{"specversion":"1.0","id":"` + id + `","source":"agent/a","type":"dev.assent.approval.requested","data":{"tool":"x"}} trailing`),
		[]byte(`{"specversion":"1.0","id":"` + id + `","source":"","type":"dev.assent.approval.requested","data":{"tool":"x"}}`),
	}
	return out
}

// checkRequest fails t if the fast decoder reads body otherwise than the
// broker's decoder, for a request the broker takes as valid.
func checkRequest(t *testing.T, body []byte) {
	fast, ok := fastRequest("a", body, map[string]string{})
	if !ok {
		return
	}
	exact, eok := exactRequest("a", structured, body)
	if !eok || exact.invalid != "" {
		return // the recorded decision, or the held check, settles it
	}
	if fast.invalid != "" {
		t.Fatalf("fast finds %q invalid, the broker takes it: %s", fast.invalid, body)
	}
	f, e := fast.req, exact.req
	if fast.id != exact.id || f.Tool != e.Tool || f.Agent != e.Agent || f.Session != e.Session || f.User != e.User ||
		f.CallID != e.CallID || f.Hint != e.Hint || f.Timeout != e.Timeout || !maps.Equal(f.Labels, e.Labels) ||
		!sameJSON(f.Args, e.Args) || !sameJSON(f.InputSchema, e.InputSchema) || !sameJSON(f.ResponseSchema, e.ResponseSchema) {
		t.Fatalf("fast and exact differ for %s:\nfast  %q %+v\nexact %q %+v", body, fast.id, f, exact.id, e)
	}
}

func sameJSON(a, b json.RawMessage) bool {
	if events.EmptyJSON(a) && events.EmptyJSON(b) {
		return true
	}
	var x, y bytes.Buffer
	if json.Compact(&x, a) != nil || json.Compact(&y, b) != nil {
		return bytes.Equal(a, b)
	}
	return bytes.Equal(x.Bytes(), y.Bytes())
}

func TestFastRequestAgrees(t *testing.T) {
	for _, body := range requestBodies(t) {
		checkRequest(t, body)
	}
	// The odd ones go the broker's way.
	for i, body := range requestBodies(t)[4:8] {
		if _, ok := fastRequest("a", body, nil); ok {
			t.Errorf("odd body %d read by the fast decoder: %s", i+4, body)
		}
	}
	if m, ok := fastRequest("a", requestBodies(t)[11], nil); !ok || m.invalid != ruleValidation {
		t.Errorf("a request naming another agent: %+v %v", m, ok)
	}
}

func FuzzDecodeRequest(f *testing.F) {
	for _, b := range requestBodies(f) {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		decodeRequest("a", structured, body, map[string]string{})
		checkRequest(t, body)
	})
}

func decisionBodies(t testing.TB) [][]byte {
	id := "0193a5b2-7c1e-7d3a-9f1e-3c2b1a0f9e8d"
	at := time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)
	return [][]byte{
		encode(t, events.TypeDecided, "", events.Decided{RequestID: id, Outcome: events.Approved, Rule: "reads", Auto: true, DecidedAt: at, RequestSeq: 7, Args: json.RawMessage(`{"a":"}"}`)}),
		encode(t, events.TypeDecided, "", events.Decided{RequestID: id, Outcome: events.Denied, Reason: "no \"way\"", Rule: "limit:x", ApprovalRule: "mode:manual",
			DecidedBy: []events.DecidedBy{{Principal: "alice", Decision: events.Approve, At: at}, {Principal: "bob", Decision: events.Deny, At: at}}, Trail: []uint64{9, 12, 15}, DecidedAt: at}),
		encode(t, events.TypeDecided, "", events.Decided{RequestID: id, Outcome: events.Expired, Auto: true, Trail: []uint64{3}}),
		encode(t, events.TypeDecided, "", map[string]any{"request_id": id, "outcome": "approved", "auto": "yes"}),
		encode(t, events.TypeDecided, "", map[string]any{"request_id": id, "outcome": "maybe"}),
		encode(t, events.TypeDecided, "", map[string]any{"request_id": id, "outcome": "denied", "decided_by": nil, "trail": nil, "rule": nil}),
	}
}

func TestFastDecisionAgrees(t *testing.T) {
	for _, body := range decisionBodies(t) {
		checkDecision(t, body)
	}
	for i, body := range decisionBodies(t)[3:5] {
		if _, ok := fastDecision(body, nil); ok {
			t.Errorf("odd decision %d read by the fast decoder", i+3)
		}
	}
}

func checkDecision(t *testing.T, body []byte) {
	fast, ok := fastDecision(body, map[string]string{})
	if !ok {
		return
	}
	e, err := events.Decode(structured, body)
	if err != nil {
		return
	}
	d, err := events.DecodeDecided(&e)
	if err != nil {
		return
	}
	var by []string
	for _, x := range d.DecidedBy {
		by = append(by, x.Principal)
	}
	trigger := uint64(0)
	if n := len(d.Trail); n > 0 {
		trigger = d.Trail[n-1]
	}
	if string(fast.id) != d.RequestID || fast.outcome != d.Outcome || fast.reason != d.Reason || fast.rule != d.Rule || fast.approvalRule != d.ApprovalRule ||
		fast.auto != d.Auto || !slices.Equal(fast.by, by) || fast.trigger != trigger || fast.requestSeq != d.RequestSeq {
		t.Fatalf("fast and exact differ for %s:\nfast  %+v\nexact %+v", body, fast, d)
	}
}

func FuzzDecodeDecision(f *testing.F) {
	for _, b := range decisionBodies(f) {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		decodeDecision(structured, body, map[string]string{})
		checkDecision(t, body)
	})
}

func TestFastPending(t *testing.T) {
	id := "0193a5b2-7c1e-7d3a-9f1e-3c2b1a0f9e8d"
	p := events.Pending{RequestID: id, Request: events.Requested{Tool: "w", Args: json.RawMessage(`{"request_id":"x"}`)}, Rule: "limit:l", ApprovalRule: "writes",
		Terms: &events.Terms{Quorum: 1, Remember: &events.RememberTerms{Scopes: []string{"call"}, MaxTTL: events.Duration(time.Hour)}}}
	m, ok := fastPending(encode(t, events.TypePending, "", p), nil)
	if !ok || string(m.id) != id || m.rule != "writes" || m.maxTTL != time.Hour || m.escalated {
		t.Errorf("pending: %+v %v", m, ok)
	}
	m, ok = fastPending(encode(t, events.TypeEscalated, "", events.Escalated{RequestID: id, Level: 1}), nil)
	if !ok || string(m.id) != id || !m.escalated {
		t.Errorf("escalated: %+v %v", m, ok)
	}
}

func TestParseTime(t *testing.T) {
	now := time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)
	tests := []struct {
		in   string
		want time.Time
		err  error
	}{
		{"", time.Time{}, nil},
		{"7d", now.Add(-7 * 24 * time.Hour), nil},
		{"1d12h", now.Add(-36 * time.Hour), nil},
		{"90m", now.Add(-90 * time.Minute), nil},
		{"2026-11-01T00:00:00Z", time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC), nil},
		{"2026-11-01T02:00:00+02:00", time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC), nil},
		{"last week", time.Time{}, ErrBadTime},
		{"-5m", time.Time{}, ErrBadTime},
		{"d", time.Time{}, ErrBadTime},
		{"7x", time.Time{}, ErrBadTime},
	}
	for _, tt := range tests {
		got, err := ParseTime(tt.in, now)
		if !errors.Is(err, tt.err) || !got.Equal(tt.want) {
			t.Errorf("ParseTime(%q) = %v, %v; want %v, %v", tt.in, got, err, tt.want, tt.err)
		}
	}
}

func TestParseKinds(t *testing.T) {
	got, err := ParseKinds(" allow-what-people-denied,,other-rule,allow-what-people-denied")
	if err != nil || !slices.Equal(got, []Kind{AllowWhatPeopleDenied, OtherRule}) {
		t.Errorf("got %v, %v", got, err)
	}
	if _, err := ParseKinds("allow-everything"); !errors.Is(err, ErrUnknownKind) {
		t.Errorf("unknown kind: %v", err)
	}
}

func TestKindOf(t *testing.T) {
	allow := &verdict{action: "allow", rule: "r"}
	deny := &verdict{action: "deny", rule: "r"}
	ask := &verdict{action: "require_approval", rule: "r"}
	expired := &verdict{action: actionExpired, rule: "r"}
	d := func(o events.Outcome, auto bool) *decisionMsg { return &decisionMsg{outcome: o, auto: auto} }
	tests := []struct {
		d      *decisionMsg
		waited bool
		rule   string
		rp     *verdict
		want   Kind // "" no change
	}{
		{d(events.Approved, true), false, "r", allow, ""},
		{d(events.Approved, true), false, "other", allow, OtherRule},
		{d(events.Approved, true), false, "r", deny, DenyWhatWasAllowed},
		{d(events.Approved, true), false, "r", ask, AskWhatWasAllowed},
		{d(events.Denied, true), false, "r", allow, AllowWhatWasDenied},
		{d(events.Denied, true), false, "r", ask, AskWhatWasDenied},
		{d(events.Denied, true), false, "r", deny, ""},
		{d(events.Approved, false), true, "r", allow, AllowWhatPeopleApproved},
		{d(events.Approved, false), true, "r", deny, DenyWhatPeopleApproved},
		{d(events.Approved, false), true, "r", ask, ""},
		{d(events.Denied, false), true, "r", allow, AllowWhatPeopleDenied},
		{d(events.Denied, false), true, "r", deny, DenyWhatPeopleDenied},
		{d(events.Denied, false), true, "s", ask, OtherRule},
		{d(events.Expired, true), true, "r", allow, AllowWhatWentUnanswered},
		{d(events.Approved, true), true, "r", deny, DenyWhatWentUnanswered}, // approved by its timeout
		{d(events.Cancelled, false), true, "r", ask, ""},
		{d(events.Cancelled, false), false, "r", allow, AllowWhatWentUnanswered}, // cancelled while judged
		{d(events.Expired, true), false, "r", expired, ""},
	}
	for i, tt := range tests {
		got, changed := kindOf(recordedClass(tt.d, tt.waited), tt.rule, "", tt.rp)
		if got != tt.want || changed != (tt.want != "") {
			t.Errorf("%d: %s waited %v, %s by %s: got %q, want %q", i, tt.d.outcome, tt.waited, tt.rp.action, tt.rule, got, tt.want)
		}
	}
}

// A request charged against a limit waits for the broker's take on it;
// with none in the stream, it is checked the broker's way: one the broker
// could not read is dropped, a valid one charged.
func TestHeldRequests(t *testing.T) {
	p, err := policy.Parse([]byte(`version: 1
rules:
  - name: pay
    tools: [pay]
    action: allow
limits:
  - name: l
    tools: [pay]
    per: session
    sum: args.amount
    max: 100
`), "p.yaml")
	if err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)
	req := func(body string) Message {
		return Message{Subject: events.RequestPrefix + "a", Header: structured, Data: []byte(body), Time: at}
	}
	valid := func(id string) string {
		return string(encode(t, events.TypeRequested, id, events.Requested{Tool: "pay", Agent: "a", Session: "s", Args: json.RawMessage(`{"amount":60}`)}))
	}
	unreadable := `{"specversion":"1.0","id":"c","source":"","type":"dev.assent.approval.requested","data":{"tool":"pay","session":"s","args":{"amount":60}}}`
	r := New(p, Config{})
	for i, m := range []Message{req(valid("a")), req(unreadable), req(valid("b"))} {
		m.Seq = uint64(i + 1)
		r.Apply(m)
	}
	if r.hold == nil || len(r.held) != 2 {
		t.Fatalf("hold %v, %d held", r.hold, len(r.held))
	}
	rep := r.Report()
	if rep.Replayed != 2 || r.open["c"] != nil {
		t.Fatalf("replayed %d; the unreadable request: %+v", rep.Replayed, r.open["c"])
	}
	if a, b := r.open["a"].replayed, r.open["b"].replayed; a.rule != "pay" || b.rule != "limit:l" || b.action != policy.RequireApproval {
		t.Errorf("a %+v, b %+v", a, b)
	}
}
