package events_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nkeys"

	"github.com/assent-dev/assent/pkg/events"
)

// The golden tests pin bytes that other programs see or store: the encoded
// events, the canonical forms and the digests. The wanted values were made by
// the code before any of it was optimised; a change here changes the wire.

// goldenSeed is the decision key of the golden signed decision.
const goldenSeed = "SAAH27GX3RSC6LTXWHMROTVTAXQ5HRQOLNR5ZYLVCKJAEMSJH233VIEYIE"

var goldenTime = time.Date(2026, 5, 1, 12, 0, 0, 123456789, time.UTC)

// goldenEvents are events as Assent builds or receives them.
func goldenEvents(t *testing.T) []struct {
	name string
	e    events.Event
} {
	t.Helper()
	var out []struct {
		name string
		e    events.Event
	}
	add := func(name string, e events.Event) {
		out = append(out, struct {
			name string
			e    events.Event
		}{name, e})
	}
	newEvent := func(typ, id, source string, data any) events.Event {
		t.Helper()
		e, err := events.New(typ, id, source, data)
		if err != nil {
			t.Fatal(err)
		}
		e.SetTime(goldenTime)
		return e
	}
	decided := events.Decided{
		RequestID: testID, Outcome: events.Approved, Reason: "auto-approve mode", Args: json.RawMessage(`{"n":1}`),
		ArgsDigest: "sha256:0000000000000000000000000000000000000000000000000000000000000001",
		Rule:       "mode:auto-approve", Auto: true, DecidedAt: goldenTime,
		RequestDigest: "sha256:0000000000000000000000000000000000000000000000000000000000000002",
	}
	add("decided", newEvent(events.TypeDecided, testDecided, "broker/b1", &decided))

	edited := decided
	edited.Args = json.RawMessage("{ \"b\" : \"<x> & y\",\n \"a\": [1, 2.50, -0, 1e3], \"u\": \"\\u2028\u00e9\\u00e9\\/\", \"z\": null }")
	edited.Edited = true
	edited.Payload = json.RawMessage(`{"ok": true}`)
	edited.DecidedBy = []events.DecidedBy{{Principal: "alice <a@b>", Channel: "cli", Decision: events.Approve, At: goldenTime}}
	edited.Reason = "fine & \"dandy\"\n\t<ok>"
	add("decided edited", newEvent(events.TypeDecided, testDecided, "broker/b1", edited))

	kp, err := nkeys.FromSeed([]byte(goldenSeed))
	if err != nil {
		t.Fatal(err)
	}
	signer, err := events.NewSigner(kp)
	if err != nil {
		t.Fatal(err)
	}
	signed := newEvent(events.TypeDecided, testDecided, "broker/b1", &decided)
	if err := signer.Sign(&signed); err != nil {
		t.Fatal(err)
	}
	add("decided signed", signed)

	req := events.Requested{
		Tool: "delete_file", Args: json.RawMessage(`{"path": "/srv/<q3>.csv", "n": 12345678901234567890}`),
		Agent: "file-manager", Session: "s-42", User: "carol", CallID: "call_1", Hint: "<b>Delete</b> & more",
		ResponseSchema: json.RawMessage(`{"type": "object"}`), Timeout: events.Duration(2 * time.Minute),
		Labels: map[string]string{"team": "finance", "env": "prod & <test>"}, InputSchema: json.RawMessage(`{}`),
	}
	withExt := newEvent(events.TypeRequested, testID, "agent/file-manager", req)
	withExt.SetSubject("delete_file")
	withExt.SetExtension("assenttrace", "abc")
	add("requested", withExt)

	add("pending", newEvent(events.TypePending, testAnswer, "broker/b1", events.Pending{RequestID: testID, Request: req, Deadline: goldenTime, Approvers: []string{"role:finance"}, Rule: "r1"}))
	add("pending with history", newEvent(events.TypePending, testAnswer, "broker/b1", events.Pending{RequestID: testID, Request: events.Requested{Tool: "delete_file"}, Deadline: goldenTime,
		History: &events.History{Window: events.Duration(30 * 24 * time.Hour), Approved: 41, Denied: 1, Expired: 2, Exact: 3, Principals: []string{"alice", "bob"}, LastDenied: goldenTime}}))
	add("pending first time", newEvent(events.TypePending, testAnswer, "broker/b1", events.Pending{RequestID: testID, Request: events.Requested{Tool: "delete_file"}, Deadline: goldenTime,
		History: &events.History{Window: events.Duration(30 * 24 * time.Hour)}}))
	add("responded shown", newEvent(events.TypeResponded, testAnswer, "approver/alice", events.Responded{Decision: events.Approve, Channel: "web", ShownAt: goldenTime, Detail: true}))
	e := newEvent(events.TypeCancel, testAnswer, "agent/a", nil)
	add("cancel without data", e)

	// Received with white space, in either mode.
	spaced := "{ \"tool\" : \"t\",\n  \"args\": {\"q\": \"<x>\", \"n\": [1, 2.50]} }"
	bin, err := events.Decode(binaryHeader(testID, events.TypeRequested), []byte(spaced))
	if err != nil {
		t.Fatal(err)
	}
	add("binary with white space", bin)
	st, err := events.Decode(structuredHeader, []byte("{\"specversion\": \"1.0\", \"id\": \""+testID+"\",\n \"type\": \""+events.TypeRequested+
		"\", \"source\": \"agent/x\", \"time\": \"2026-05-01T12:00:00.5+02:00\", \"data\": "+spaced+", \"assenttrace\": \"t1\"}"))
	if err != nil {
		t.Fatal(err)
	}
	add("structured with white space", st)
	return out
}

var goldenBodies = map[string]string{
	"decided":                     "{\"specversion\":\"1.0\",\"id\":\"0193a5b3-0000-7000-8000-000000000002\",\"source\":\"broker/b1\",\"type\":\"dev.assent.approval.decided\",\"datacontenttype\":\"application/json\",\"time\":\"2026-05-01T12:00:00.123456789Z\",\"data\":{\"request_id\":\"0193a5b2-7c1e-7d3a-9f1e-3c2b1a0f9e8d\",\"outcome\":\"approved\",\"reason\":\"auto-approve mode\",\"args\":{\"n\":1},\"args_digest\":\"sha256:0000000000000000000000000000000000000000000000000000000000000001\",\"rule\":\"mode:auto-approve\",\"auto\":true,\"decided_at\":\"2026-05-01T12:00:00.123456789Z\",\"request_digest\":\"sha256:0000000000000000000000000000000000000000000000000000000000000002\"}}",
	"decided edited":              "{\"specversion\":\"1.0\",\"id\":\"0193a5b3-0000-7000-8000-000000000002\",\"source\":\"broker/b1\",\"type\":\"dev.assent.approval.decided\",\"datacontenttype\":\"application/json\",\"time\":\"2026-05-01T12:00:00.123456789Z\",\"data\":{\"request_id\":\"0193a5b2-7c1e-7d3a-9f1e-3c2b1a0f9e8d\",\"outcome\":\"approved\",\"reason\":\"fine & \\\"dandy\\\"\\n\\t<ok>\",\"args\":{\"b\":\"<x> & y\",\"a\":[1,2.50,-0,1e3],\"u\":\"\\u2028é\\u00e9\\/\",\"z\":null},\"edited\":true,\"args_digest\":\"sha256:0000000000000000000000000000000000000000000000000000000000000001\",\"payload\":{\"ok\":true},\"decided_by\":[{\"principal\":\"alice <a@b>\",\"channel\":\"cli\",\"decision\":\"approve\",\"at\":\"2026-05-01T12:00:00.123456789Z\"}],\"rule\":\"mode:auto-approve\",\"auto\":true,\"decided_at\":\"2026-05-01T12:00:00.123456789Z\",\"request_digest\":\"sha256:0000000000000000000000000000000000000000000000000000000000000002\"}}",
	"decided signed":              "{\"specversion\":\"1.0\",\"id\":\"0193a5b3-0000-7000-8000-000000000002\",\"source\":\"broker/b1\",\"type\":\"dev.assent.approval.decided\",\"datacontenttype\":\"application/json\",\"time\":\"2026-05-01T12:00:00.123456789Z\",\"data\":{\"request_id\":\"0193a5b2-7c1e-7d3a-9f1e-3c2b1a0f9e8d\",\"outcome\":\"approved\",\"reason\":\"auto-approve mode\",\"args\":{\"n\":1},\"args_digest\":\"sha256:0000000000000000000000000000000000000000000000000000000000000001\",\"rule\":\"mode:auto-approve\",\"auto\":true,\"decided_at\":\"2026-05-01T12:00:00.123456789Z\",\"request_digest\":\"sha256:0000000000000000000000000000000000000000000000000000000000000002\"},\"assentsig\":\"v1.ADCLTBQ7V2JE4DYHVUR7AS6J5LZIWZPIEV6CLI65JQBKXLLIZDUXDKD5.SGdNk0yxX9_JGvTomCt_9buFNew2B-pJMaifmTTn4xW3apJ8jwWih5DcqvTg9Jo4g5Z4pUwSlCElw9OVY3Q5Ag\"}",
	"requested":                   "{\"specversion\":\"1.0\",\"id\":\"0193a5b2-7c1e-7d3a-9f1e-3c2b1a0f9e8d\",\"source\":\"agent/file-manager\",\"type\":\"dev.assent.approval.requested\",\"subject\":\"delete_file\",\"datacontenttype\":\"application/json\",\"time\":\"2026-05-01T12:00:00.123456789Z\",\"data\":{\"tool\":\"delete_file\",\"args\":{\"path\":\"/srv/<q3>.csv\",\"n\":12345678901234567890},\"agent\":\"file-manager\",\"session\":\"s-42\",\"user\":\"carol\",\"call_id\":\"call_1\",\"hint\":\"<b>Delete</b> & more\",\"response_schema\":{\"type\":\"object\"},\"timeout\":\"2m0s\",\"labels\":{\"env\":\"prod & <test>\",\"team\":\"finance\"},\"input_schema\":{}},\"assenttrace\":\"abc\"}",
	"pending":                     "{\"specversion\":\"1.0\",\"id\":\"0193a5b3-0000-7000-8000-000000000001\",\"source\":\"broker/b1\",\"type\":\"dev.assent.approval.pending\",\"datacontenttype\":\"application/json\",\"time\":\"2026-05-01T12:00:00.123456789Z\",\"data\":{\"request_id\":\"0193a5b2-7c1e-7d3a-9f1e-3c2b1a0f9e8d\",\"request\":{\"tool\":\"delete_file\",\"args\":{\"path\":\"/srv/<q3>.csv\",\"n\":12345678901234567890},\"agent\":\"file-manager\",\"session\":\"s-42\",\"user\":\"carol\",\"call_id\":\"call_1\",\"hint\":\"<b>Delete</b> & more\",\"response_schema\":{\"type\":\"object\"},\"timeout\":\"2m0s\",\"labels\":{\"env\":\"prod & <test>\",\"team\":\"finance\"},\"input_schema\":{}},\"deadline\":\"2026-05-01T12:00:00.123456789Z\",\"approvers\":[\"role:finance\"],\"rule\":\"r1\"}}",
	"pending with history":        "{\"specversion\":\"1.0\",\"id\":\"0193a5b3-0000-7000-8000-000000000001\",\"source\":\"broker/b1\",\"type\":\"dev.assent.approval.pending\",\"datacontenttype\":\"application/json\",\"time\":\"2026-05-01T12:00:00.123456789Z\",\"data\":{\"request_id\":\"0193a5b2-7c1e-7d3a-9f1e-3c2b1a0f9e8d\",\"request\":{\"tool\":\"delete_file\"},\"deadline\":\"2026-05-01T12:00:00.123456789Z\",\"history\":{\"window\":\"720h0m0s\",\"approved\":41,\"denied\":1,\"expired\":2,\"exact\":3,\"principals\":[\"alice\",\"bob\"],\"last_denied\":\"2026-05-01T12:00:00.123456789Z\"}}}",
	"pending first time":          "{\"specversion\":\"1.0\",\"id\":\"0193a5b3-0000-7000-8000-000000000001\",\"source\":\"broker/b1\",\"type\":\"dev.assent.approval.pending\",\"datacontenttype\":\"application/json\",\"time\":\"2026-05-01T12:00:00.123456789Z\",\"data\":{\"request_id\":\"0193a5b2-7c1e-7d3a-9f1e-3c2b1a0f9e8d\",\"request\":{\"tool\":\"delete_file\"},\"deadline\":\"2026-05-01T12:00:00.123456789Z\",\"history\":{\"window\":\"720h0m0s\",\"approved\":0,\"denied\":0}}}",
	"responded shown":             "{\"specversion\":\"1.0\",\"id\":\"0193a5b3-0000-7000-8000-000000000001\",\"source\":\"approver/alice\",\"type\":\"dev.assent.approval.responded\",\"datacontenttype\":\"application/json\",\"time\":\"2026-05-01T12:00:00.123456789Z\",\"data\":{\"decision\":\"approve\",\"channel\":\"web\",\"shown_at\":\"2026-05-01T12:00:00.123456789Z\",\"detail\":true}}",
	"cancel without data":         "{\"specversion\":\"1.0\",\"id\":\"0193a5b3-0000-7000-8000-000000000001\",\"source\":\"agent/a\",\"type\":\"dev.assent.approval.cancel\",\"datacontenttype\":\"application/json\",\"time\":\"2026-05-01T12:00:00.123456789Z\"}",
	"binary with white space":     "{\"specversion\":\"1.0\",\"id\":\"0193a5b2-7c1e-7d3a-9f1e-3c2b1a0f9e8d\",\"source\":\"test/fixture\",\"type\":\"dev.assent.approval.requested\",\"datacontenttype\":\"application/json\",\"data\":{\"tool\":\"t\",\"args\":{\"q\":\"<x>\",\"n\":[1,2.50]}}}",
	"structured with white space": "{\"specversion\":\"1.0\",\"id\":\"0193a5b2-7c1e-7d3a-9f1e-3c2b1a0f9e8d\",\"source\":\"agent/x\",\"type\":\"dev.assent.approval.requested\",\"datacontenttype\":\"application/json\",\"time\":\"2026-05-01T10:00:00.5Z\",\"data\":{\"tool\":\"t\",\"args\":{\"q\":\"<x>\",\"n\":[1,2.50]}},\"assenttrace\":\"t1\"}",
}

func TestEncodeGolden(t *testing.T) {
	for _, g := range goldenEvents(t) {
		h, body, err := events.Encode(&g.e)
		if err != nil {
			t.Fatalf("%s: %v", g.name, err)
		}
		if len(h) != 1 || len(h["Content-Type"]) != 1 || h["Content-Type"][0] != events.ContentTypeStructured {
			t.Errorf("%s: header %v", g.name, h)
		}
		want, ok := goldenBodies[g.name]
		if !ok {
			t.Errorf("%q: %q,", g.name, body)
			continue
		}
		if got := string(body); got != want {
			t.Errorf("%s: body\n%s\nwant\n%s", g.name, got, want)
		}
	}
}

// goldenRequests are requests whose canonical forms and digests
// TestDigestGolden pins.
var goldenRequests = []struct {
	name string
	r    events.Requested
}{
	{"design", designRequest},
	{"bench", events.Requested{Tool: "noop", Args: json.RawMessage(`{"n":1}`), Agent: "bench"}},
	{"no args", events.Requested{Tool: "noop"}},
	{"null args", events.Requested{Tool: "noop", Args: json.RawMessage(" null ")}},
	{"empty object", events.Requested{Tool: "noop", Args: json.RawMessage(" { } ")}},
	{"every field", events.Requested{
		Tool: "t<1>", Agent: "a", Session: "s & t", User: "u\u2028v", CallID: "c\"1\"", Hint: "ignored",
		Args:           json.RawMessage("{\"b\":2,\"a\":{\"d\":[1,{\"z\":null,\"y\":true}],\"c\":\"<&>\"}, \"s\":\"\\u2028\\u00e9\\ud83d\\ude00\\\"\\\\\\/\\t\x7f\"}"),
		ResponseSchema: json.RawMessage(`{"type": "object", "properties": {"b": {}, "a": {"type":"string"}}}`),
		Labels:         map[string]string{"z": "1", "a": "<x>", "m": "é"},
		InputSchema:    json.RawMessage(`{"x":1}`), Timeout: events.Duration(time.Second),
	}},
	{"numbers", events.Requested{Tool: "n", Args: json.RawMessage(`{"n":12345678901234567890,"f":1.50e-3,"neg":-0,"e":1E+2,"z":0.0}`)}},
	{"duplicate keys", events.Requested{Tool: "d", Args: json.RawMessage(`{"a":1,"b":{"x":1,"x":[2]},"a":2}`)}},
	{"unicode keys", events.Requested{Tool: "u", Args: json.RawMessage(`{"é":1,"e":2,"\u00e9x":3,"Z":4,"\ud83d\ude00":5,"~":6}`)}},
	{"controls", events.Requested{Tool: "c", Args: json.RawMessage(`{"s":"\u0000\u001f\b\f\n\r\t\u007f\u0080\u202e\u2029"}`)}},
	{"deep", events.Requested{Tool: "deep", Args: json.RawMessage(`{"a":[[[[{"b":[[]]}]]]],"c":{},"d":[]}`)}},
	{"schema null", events.Requested{Tool: "s", ResponseSchema: json.RawMessage(" null"), Labels: map[string]string{}}},
	{"not an object", events.Requested{Tool: "x", Args: json.RawMessage(`[1]`)}},
	{"not JSON", events.Requested{Tool: "x", Args: json.RawMessage(`{"a":}`)}},
	{"trailing data", events.Requested{Tool: "x", Args: json.RawMessage(`{"a":1} {}`)}},
	{"bad text", events.Requested{Tool: "x", Args: json.RawMessage("{\"s\":\"\xff\"}")}},
	{"lone surrogate", events.Requested{Tool: "x", Args: json.RawMessage(`{"s":"\ud800"}`)}},
	{"bad schema", events.Requested{Tool: "x", ResponseSchema: json.RawMessage(`[`)}},
}

// goldenDigest is what TestDigestGolden pins for one request: the canonical
// request and its digest, the canonical args and their digest, or the error
// they give.
type goldenDigest struct {
	canonical, digest, args, argsDigest string
	err                                 error
}

var goldenDigests = map[string]goldenDigest{
	"design":         {"{\"agent\":\"file-manager\",\"args\":{\"path\":\"/srv/reports/q3.csv\"},\"session\":\"s-42\",\"tool\":\"delete_file\",\"user\":\"carol\"}", "sha256:81b1fa218536b0078493d9de4ecbd9ed86f1728d83b8cd4b0ff0ed67458e5da3", "{\"path\":\"/srv/reports/q3.csv\"}", "sha256:d6332b046e61c7409695ff14bdd1058696deb1c9972784449d0a021592710205", nil},
	"bench":          {"{\"agent\":\"bench\",\"args\":{\"n\":1},\"tool\":\"noop\"}", "sha256:e192042e0fb7b5d7d78028ea40689c4a6b78e38712e5cfd56eb9e435b210d1ea", "{\"n\":1}", "sha256:2bfd14f43d17fc7cea24e0917a8879b4b2f880b8baeec1b9d90fbaad655e71bd", nil},
	"no args":        {"{\"args\":{},\"tool\":\"noop\"}", "sha256:8685b816cc16dea76ec5c8e81755900b9f7597dce0bd024bc773352a9b2dad2d", "{}", "sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a", nil},
	"null args":      {"{\"args\":{},\"tool\":\"noop\"}", "sha256:8685b816cc16dea76ec5c8e81755900b9f7597dce0bd024bc773352a9b2dad2d", "{}", "sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a", nil},
	"empty object":   {"{\"args\":{},\"tool\":\"noop\"}", "sha256:8685b816cc16dea76ec5c8e81755900b9f7597dce0bd024bc773352a9b2dad2d", "{}", "sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a", nil},
	"every field":    {"{\"agent\":\"a\",\"args\":{\"a\":{\"c\":\"<&>\",\"d\":[1,{\"y\":true,\"z\":null}]},\"b\":2,\"s\":\"\\u2028é😀\\\"\\\\/\\t\x7f\"},\"call_id\":\"c\\\"1\\\"\",\"labels\":{\"a\":\"<x>\",\"m\":\"é\",\"z\":\"1\"},\"response_schema\":{\"properties\":{\"a\":{\"type\":\"string\"},\"b\":{}},\"type\":\"object\"},\"session\":\"s & t\",\"tool\":\"t<1>\",\"user\":\"u\\u2028v\"}", "sha256:025efd18f809d341373031b1b4c5233d8dfc8d5b87e20007bb9f8c5c82138e65", "{\"a\":{\"c\":\"<&>\",\"d\":[1,{\"y\":true,\"z\":null}]},\"b\":2,\"s\":\"\\u2028é😀\\\"\\\\/\\t\x7f\"}", "sha256:c2a4241b623eefcfa6cddf14a3cc478efe4be18b7bb473dc20380fdadc370a5e", nil},
	"numbers":        {"{\"args\":{\"e\":1E+2,\"f\":1.50e-3,\"n\":12345678901234567890,\"neg\":-0,\"z\":0.0},\"tool\":\"n\"}", "sha256:c3afa76a95df204e753266da6c39e304bdf9194d30126087276ab2021270e5ac", "{\"e\":1E+2,\"f\":1.50e-3,\"n\":12345678901234567890,\"neg\":-0,\"z\":0.0}", "sha256:301143d3561fefc531cdb0d7bd70afa2da747d187c57fd765362100739ab76a7", nil},
	"duplicate keys": {"{\"args\":{\"a\":2,\"b\":{\"x\":[2]}},\"tool\":\"d\"}", "sha256:010bcb1e0df7b253cc077fd421defe8174bb385547ab8cff1bb206941203b1ee", "{\"a\":2,\"b\":{\"x\":[2]}}", "sha256:cbb4b5122afdd6a5eee5b0003ce373bedeb8cbf12b93dc8cbd2b77737d97c0e1", nil},
	"unicode keys":   {"{\"args\":{\"Z\":4,\"e\":2,\"~\":6,\"é\":1,\"éx\":3,\"😀\":5},\"tool\":\"u\"}", "sha256:ae76e93b90c98dff331274fd83dd28d5026b411826fa01c67f3b874889f7594a", "{\"Z\":4,\"e\":2,\"~\":6,\"é\":1,\"éx\":3,\"😀\":5}", "sha256:82e453c5b6414398d5f014021e267a56f2acdea6e6e8f3c84fb7403ced4d393f", nil},
	"controls":       {"{\"args\":{\"s\":\"\\u0000\\u001f\\b\\f\\n\\r\\t\x7f\u0080\u202e\\u2029\"},\"tool\":\"c\"}", "sha256:37e7322444f57b76cf3873bf04633c9300f4df36446ac8d0adedaaf13d807846", "{\"s\":\"\\u0000\\u001f\\b\\f\\n\\r\\t\x7f\u0080\u202e\\u2029\"}", "sha256:a1fd918090118839eeae4ee2c33d3485edc49e304841be4fdac4960bc6cf2bb2", nil},
	"deep":           {"{\"args\":{\"a\":[[[[{\"b\":[[]]}]]]],\"c\":{},\"d\":[]},\"tool\":\"deep\"}", "sha256:2801ef4e415297509be65c2cb11af0d9518451b4e21e40b7effbfecf43659378", "{\"a\":[[[[{\"b\":[[]]}]]]],\"c\":{},\"d\":[]}", "sha256:b50fc637fd388068232a88ae3d15e701e551585bc0c70dc8a9bbff6fd769c73d", nil},
	"schema null":    {"{\"args\":{},\"tool\":\"s\"}", "sha256:b0df0f51bb28ce23985040154e953458e036fa0cbad07af99f8cf40288e4baa5", "{}", "sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a", nil},
	"not an object":  {err: events.ErrArgsNotObject},
	"not JSON":       {err: events.ErrMalformed},
	"trailing data":  {err: events.ErrMalformed},
	"bad text":       {err: events.ErrBadText},
	"lone surrogate": {err: events.ErrBadText},
	"bad schema":     {err: events.ErrMalformed},
}

func TestDigestGolden(t *testing.T) {
	for _, g := range goldenRequests {
		var got goldenDigest
		c, cerr := events.CanonicalRequest(g.r)
		d, derr := events.RequestDigest(g.r)
		a, aerr := events.CanonicalArgs(g.r.Args)
		ad, aderr := events.ArgsDigest(g.r.Args)
		got.canonical, got.digest, got.args, got.argsDigest = string(c), d, string(a), ad
		if (cerr == nil) != (derr == nil) || (aerr == nil) != (aderr == nil) {
			t.Errorf("%s: errors %v, %v, %v, %v", g.name, cerr, derr, aerr, aderr)
		}
		if rd, rad, err := events.RequestDigests(g.r); (err == nil) != (derr == nil) || err == nil && (rd != d || rad != ad) {
			t.Errorf("%s: RequestDigests = %s, %s, %v; want %s, %s, %v", g.name, rd, rad, err, d, ad, derr)
		}
		want, ok := goldenDigests[g.name]
		if !ok {
			t.Errorf("%q: {%q, %q, %q, %q, %v, %v},", g.name, c, d, a, ad, cerr, aerr)
			continue
		}
		if cerr != nil || aerr != nil {
			for _, err := range []error{cerr, derr} {
				if !errors.Is(err, want.err) {
					t.Errorf("%s: error %v, want %v", g.name, err, want.err)
				}
			}
			if aerr != nil && !errors.Is(aerr, want.err) {
				t.Errorf("%s: args error %v, want %v", g.name, aerr, want.err)
			}
			continue
		}
		want.err = nil
		if got != want {
			t.Errorf("%s:\n got %+v\nwant %+v", g.name, got, want)
		}
		if !strings.HasPrefix(d, "sha256:") {
			t.Errorf("%s: digest %s", g.name, d)
		}
	}
}
