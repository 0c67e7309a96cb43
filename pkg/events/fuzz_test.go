package events_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"sort"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/assent-dev/assent/pkg/events"
)

// Header modes of FuzzDecode, chosen by mode%4.
const (
	fuzzNoHeaders  = iota // body alone: the decoder falls back to structured mode
	fuzzStructured        // Content-Type: application/cloudevents+json
	fuzzHeaderText        // headers parsed from hdr, one "Key: value" per line
	fuzzBinary            // valid ce- headers, Content-Type taken from hdr
)

// fuzzHeader builds the message header for one FuzzDecode input.
func fuzzHeader(mode byte, hdr string) events.Header {
	switch mode % 4 {
	case fuzzStructured:
		return events.Header{"Content-Type": {events.ContentTypeStructured}}
	case fuzzHeaderText:
		h := events.Header{}
		for line := range strings.SplitSeq(hdr, "\n") {
			k, v, _ := strings.Cut(line, ":")
			k = strings.TrimSpace(k)
			h[k] = append(h[k], strings.TrimSpace(v))
		}
		return h
	case fuzzBinary:
		h := binaryHeader(testID, events.TypeRequested)
		h["Content-Type"] = []string{hdr}
		return h
	}
	return nil
}

// headerText is the inverse of fuzzHeader for mode fuzzHeaderText.
func headerText(h events.Header) string {
	var lines []string
	for k, vs := range h {
		for _, v := range vs {
			lines = append(lines, k+": "+v)
		}
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}

func fuzzBinarySeed(f *testing.F, id, typ, data string) {
	h := binaryHeader(id, typ)
	h["ce-time"] = []string{"2025-01-02T03:04:05Z"}
	f.Add(byte(fuzzHeaderText), headerText(h), []byte(data))
}

func FuzzDecode(f *testing.F) {
	for _, ev := range []struct{ typ, data string }{
		{events.TypeRequested, requestedData},
		{events.TypeResponded, respondedData},
		{events.TypeDecided, decidedData},
		{events.TypeCancel, `{"reason":"stop"}`},
		{events.TypePending, `{"request_id":"` + testID + `","request":` + requestedData + `,"deadline":"2025-01-02T03:06:05Z"}`},
		{events.TypeEscalated, `{"request_id":"` + testID + `","request":{"tool":"t"},"level":1,"deadline":"2025-01-02T03:06:05Z"}`},
	} {
		f.Add(byte(fuzzStructured), "", structured(testID, ev.typ, ev.data))
		f.Add(byte(fuzzNoHeaders), "", structured(testID, ev.typ, ev.data))
		fuzzBinarySeed(f, testID, ev.typ, ev.data)
	}
	f.Add(byte(fuzzBinary), "application/json", []byte(requestedData))
	f.Add(byte(fuzzBinary), "application/json; charset=utf-8", []byte(`{"tool":"t","args":{"n":12345678901234567890}}`))
	f.Add(byte(fuzzStructured), "", []byte(`{"specversion":"1.0","id":"a","type":"`+events.TypeRequested+
		`","source":"agent/a","time":"2025-01-02T03:04:05.123+02:00","subject":"s","assentext":"x","data_base64":"eyJ0b29sIjoidCJ9"}`))
	f.Add(byte(fuzzStructured), "", []byte(`{"specversion":"1.0","id":"a","type":"`+events.TypeCancel+`","source":"s"}`))
	// Malformed inputs.
	f.Add(byte(fuzzStructured), "", []byte(``))
	f.Add(byte(fuzzStructured), "", []byte(`{`))
	f.Add(byte(fuzzStructured), "", []byte(`null`))
	f.Add(byte(fuzzStructured), "", []byte(`[{"specversion":"1.0"}]`))
	f.Add(byte(fuzzNoHeaders), "", []byte(requestedData))
	f.Add(byte(fuzzStructured), "", []byte(`{"specversion":"0.3","id":"a","type":"t","source":"s","datacontentencoding":"base64","data":"e30="}`))
	f.Add(byte(fuzzStructured), "", structured("a.b", events.TypeRequested, requestedData))
	f.Add(byte(fuzzStructured), "", structured(testID, events.TypeRequested, `{"tool":5}`))
	f.Add(byte(fuzzStructured), "", structured(testID, events.TypeRequested, `{"tool":"t","args":[1]}`))
	f.Add(byte(fuzzStructured), "", structured(testID, events.TypeResponded, `{"decision":"maybe","remember":{"scope":"x","ttl":5}}`))
	f.Add(byte(fuzzStructured), "", []byte(`{"specversion":"1.0","id":"a","type":"t","source":"s","datacontenttype":"text/plain","data":"hi"}`))
	f.Add(byte(fuzzStructured), "", []byte(`{"specversion":"1.0","specversion":"1.0","id":"a"}`))
	f.Add(byte(fuzzHeaderText), "ce-specversion: 0.3\nce-id: a\nce-type: t\nce-source: s", []byte(`{}`))
	f.Add(byte(fuzzHeaderText), "CE-SPECVERSION: 1.0\nCe-Id: a%2Eb\nce-type: t\nce-source: %zz\nce-time: x", []byte(`{}`))
	f.Add(byte(fuzzBinary), "text/plain", []byte(`hello`))
	// Text that cannot travel unchanged: invalid UTF-8 and lone surrogates.
	f.Add(byte(fuzzStructured), "", structured(testID, events.TypeRequested, `{"tool":"t","args":{"path":"/tmp/`+"\xff\xfe"+`"}}`))
	f.Add(byte(fuzzStructured), "", structured(testID, events.TypeRequested, `{"tool":"t","args":{"path":"/tmp/\ud800x"},"hint":"\udc00"}`))
	f.Add(byte(fuzzStructured), "", structured(testID, events.TypeRequested, `{"tool":"t","args":{"s":"\ud83d\ude00","e":"\\ud800"}}`))
	f.Add(byte(fuzzStructured), "", structured(testID, events.TypeCancel, `{"reason":"\ud800\u0041"}`))
	f.Add(byte(fuzzStructured), "", structured(testID, events.TypeResponded, `{"decision":"approve","payload":"`+"\xed\xa0\x80"+`","remember":{"scope":"call","args":{"p":"\udfff"}}}`))
	f.Add(byte(fuzzStructured), "", []byte(`{"specversion":"1.0","id":"a","type":"t","source":"`+"s\xff"+`","subject":"\ud800"}`))
	f.Add(byte(fuzzBinary), "application/json", []byte(`{"tool":"t","args":{"p":"`+"\xc3"+`"}}`))
	// Control and format characters in identifiers; free text keeps them.
	f.Add(byte(fuzzStructured), "", structured(testID, events.TypeRequested, `{"tool":"rm\u001b[2J","user":"alice\u202e","session":"s\n1"}`))
	f.Add(byte(fuzzStructured), "", structured(testID, events.TypeRequested, `{"tool":"r\u200bm","call_id":"\ufeffc","labels":{"env":"prod\u0007","e\u2066":"v"}}`))
	f.Add(byte(fuzzStructured), "", structured(testID, events.TypeRequested, `{"tool":"t\u007f\u0085","hint":"line 1\nline 2 \u202e"}`))
	// Response schemas that can never accept an answer.
	f.Add(byte(fuzzStructured), "", structured(testID, events.TypeRequested, `{"tool":"ask","response_schema":{"type":5}}`))
	f.Add(byte(fuzzStructured), "", structured(testID, events.TypeRequested, `{"tool":"ask","response_schema":{"$ref":"#/$defs/missing"}}`))
	f.Add(byte(fuzzStructured), "", structured(testID, events.TypeRequested, `{"tool":"ask","response_schema":{"$ref":"https://example.com/s.json"}}`))
	f.Add(byte(fuzzStructured), "", structured(testID, events.TypeRequested, `{"tool":"ask","response_schema":{"$defs":{"n":{"type":"integer"}},"$ref":"#/$defs/n"}}`))
	f.Add(byte(fuzzStructured), "", structured(testID, events.TypePending, `{"request_id":"a","request":{"tool":"ask","response_schema":{"pattern":"("}}}`))
	f.Add(byte(fuzzStructured), "", structured(testID, events.TypeRequested, `{"tool":"ask","response_schema":`+
		strings.Repeat(`{"items":`, events.MaxSchemaDepth)+`{}`+strings.Repeat(`}`, events.MaxSchemaDepth)+`}`))
	f.Add(byte(fuzzStructured), "", structured(testID, events.TypeRequested, `{"tool":"ask","response_schema":{"title":"{[\"]}","allOf":[{},{"not":{}}]}}`))
	// Input schemas: shown to approvers, not compiled.
	f.Add(byte(fuzzStructured), "", structured(testID, events.TypeRequested, `{"tool":"t","input_schema":{"type":"object","properties":{"path":{"type":"string","description":"<b>&"}}}}`))
	f.Add(byte(fuzzStructured), "", structured(testID, events.TypeRequested, `{"tool":"t","input_schema":[1],"hint":"x"}`))
	f.Add(byte(fuzzStructured), "", structured(testID, events.TypePending, `{"request_id":"a","request":{"tool":"t","input_schema":{"description":"\ud800"}}}`))
	// HTML-significant characters, raw and escaped.
	f.Add(byte(fuzzStructured), "", structured(testID, events.TypeRequested, `{"tool":"t","args":{"q":"<a&b>","e":"\u003c\u0026\u003e"}}`))
	f.Add(byte(fuzzHeaderText), "ce-specversion: 1.0\nce-id: a\nce-type: t\nce-source: a<b>&c\nce-x: \\u003c", []byte(`{ "q" : "<x>" }`))

	f.Fuzz(func(t *testing.T, mode byte, hdr string, body []byte) {
		h := fuzzHeader(mode, hdr)
		e, err := events.Decode(h, body)
		if err != nil {
			if !errors.Is(err, events.ErrInvalid) {
				t.Fatalf("Decode error does not match ErrInvalid: %v", err)
			}
			return
		}
		if e.SpecVersion() != "1.0" || !events.ValidToken(e.ID()) || e.Type() == "" || e.Source() == "" {
			t.Fatalf("Decode accepted a bad envelope: %s %q %q %q", e.SpecVersion(), e.ID(), e.Type(), e.Source())
		}
		if structuredMode(h) && !json.Valid(body) {
			t.Fatalf("Decode accepted a structured body that is not JSON: %q", body)
		}
		if len(e.Data()) > 0 && !json.Valid(e.Data()) {
			t.Fatalf("Decode accepted data that is not JSON: %q", e.Data())
		}

		checkDataErr := func(name string, err error) {
			t.Helper()
			if err != nil && !errors.Is(err, events.ErrInvalid) {
				t.Fatalf("%s error does not match ErrInvalid: %v", name, err)
			}
		}
		r, err := events.DecodeRequested(&e)
		checkDataErr("DecodeRequested", err)
		if err == nil {
			_, err := events.ArgsDigest(r.Args)
			checkDataErr("ArgsDigest", err)
			for _, id := range []string{r.Tool, r.Session, r.User, r.CallID} {
				if !cleanIdentifier(id) {
					t.Fatalf("DecodeRequested accepted identifier %q", id)
				}
			}
			for k, v := range r.Labels {
				if !cleanIdentifier(k) || !cleanIdentifier(v) {
					t.Fatalf("DecodeRequested accepted label %q: %q", k, v)
				}
			}
			if len(r.ResponseSchema) > 0 && string(r.ResponseSchema) != "null" {
				if _, err := events.CompileSchema(r.ResponseSchema); err != nil {
					t.Fatalf("DecodeRequested accepted a schema that does not compile: %v", err)
				}
			}
		}
		// Data with bad text is refused by every decoder, never rewritten.
		if textErr := events.CheckJSONText(e.Data()); textErr != nil {
			if !errors.Is(textErr, events.ErrBadText) {
				t.Fatalf("CheckJSONText error does not match ErrBadText: %v", textErr)
			}
			for name, decode := range map[string]func(*events.Event) error{
				"DecodeRequested": func(e *events.Event) error { _, err := events.DecodeRequested(e); return err },
				"DecodeResponded": func(e *events.Event) error { _, err := events.DecodeResponded(e); return err },
				"DecodeCancel":    func(e *events.Event) error { _, err := events.DecodeCancel(e); return err },
				"DecodeDecided":   func(e *events.Event) error { _, err := events.DecodeDecided(e); return err },
				"DecodePending":   func(e *events.Event) error { _, err := events.DecodePending(e); return err },
				"DecodeEscalated": func(e *events.Event) error { _, err := events.DecodeEscalated(e); return err },
			} {
				if err := decode(&e); err == nil {
					t.Fatalf("%s accepted data with bad text (%v): %q", name, textErr, e.Data())
				}
			}
		}
		_, err = events.DecodeResponded(&e)
		checkDataErr("DecodeResponded", err)
		_, err = events.DecodeCancel(&e)
		checkDataErr("DecodeCancel", err)
		d, err := events.DecodeDecided(&e)
		checkDataErr("DecodeDecided", err)
		if err == nil {
			checkDataErr("VerifyArgs", d.VerifyArgs())
		}
		_, err = events.DecodePending(&e)
		checkDataErr("DecodePending", err)
		_, err = events.DecodeEscalated(&e)
		checkDataErr("DecodeEscalated", err)

		// Whatever Decode accepts, Assent can re-publish in structured mode and
		// read back unchanged. The limit is raised because re-encoding may add
		// envelope bytes the original (binary) message did not have.
		codec := events.Codec{MaxSize: 4 * events.DefaultMaxEventSize}
		h2, b2, err := events.Encode(&e)
		if err != nil {
			t.Fatalf("Encode of a decoded event: %v", err)
		}
		// Encode writes what the SDK writes, compacted.
		raw, err := e.MarshalJSON()
		if err != nil {
			t.Fatal(err)
		}
		var compact bytes.Buffer
		if err := json.Compact(&compact, raw); err != nil {
			t.Fatalf("the SDK wrote an event that is not JSON: %v", err)
		}
		if !bytes.Equal(b2, compact.Bytes()) {
			t.Fatalf("Encode wrote\n%q\nnot the compacted\n%q", b2, compact.Bytes())
		}
		e2, err := codec.Decode(h2, b2)
		if err != nil {
			t.Fatalf("Decode of re-encoded event: %v\nbody: %s", err, b2)
		}
		if e2.ID() != e.ID() || e2.Type() != e.Type() || e2.Source() != e.Source() {
			t.Fatalf("round trip changed the envelope: %q %q %q -> %q %q %q",
				e.ID(), e.Type(), e.Source(), e2.ID(), e2.Type(), e2.Source())
		}
		if !sameJSON(e2.Data(), e.Data()) {
			t.Fatalf("round trip changed the data: %q -> %q\nbody: %s", e.Data(), e2.Data(), b2)
		}
		// Encode adds no HTML escapes: the re-encoded body has no more of them
		// than the message had.
		for _, esc := range [][]byte{[]byte(`\u003c`), []byte(`\u003e`), []byte(`\u0026`)} {
			if n, was := bytes.Count(b2, esc), bytes.Count(body, esc)+strings.Count(hdr, string(esc)); n > was {
				t.Fatalf("Encode added %s escapes (%d, was %d): %s", esc, n, was, b2)
			}
		}
	})
}

// cleanIdentifier reports whether s is valid UTF-8 without control or format
// characters.
func cleanIdentifier(s string) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if unicode.In(r, unicode.Cc, unicode.Cf) {
			return false
		}
	}
	return true
}

// structuredMode reports whether Decode reads h and its body in structured mode.
func structuredMode(h events.Header) bool {
	var ct, spec string
	for k, vs := range h {
		if len(vs) == 0 {
			continue
		}
		switch {
		case strings.EqualFold(k, "Content-Type") && ct == "":
			ct = vs[0]
		case strings.EqualFold(k, "ce-specversion") && spec == "":
			spec = vs[0]
		}
	}
	mt, _, _ := strings.Cut(ct, ";")
	return strings.EqualFold(strings.TrimSpace(mt), events.ContentTypeStructured) || spec == ""
}

// sameJSON reports whether a and b are the same JSON value, or both empty.
// Numbers are compared as written.
func sameJSON(a, b []byte) bool {
	if len(a) == 0 || len(b) == 0 {
		return len(a) == len(b)
	}
	var va, vb any
	for _, p := range []struct {
		raw []byte
		v   *any
	}{{a, &va}, {b, &vb}} {
		dec := json.NewDecoder(bytes.NewReader(p.raw))
		dec.UseNumber()
		if err := dec.Decode(p.v); err != nil {
			return false
		}
	}
	return reflect.DeepEqual(va, vb)
}

func FuzzParseSubject(f *testing.F) {
	for _, s := range []string{
		"assent.request.file-manager",
		"assent.pending.file-manager",
		"assent.response.alice." + testID,
		"assent.cancel." + testID,
		"assent.decision." + testID,
		"", "assent", "assent.", "assent.>", "assent.request.*", "assent.request.a.b",
		"assent.response.alice", "assent.unknown.a", "assent.request. ", "other.request.a",
		"assent.decision." + strings.Repeat("x", events.MaxTokenLength+1),
		"assent.request.a\u202e", "assent.request.a\u200bb", "assent.request.\ufeffa", "assent.cancel.a\x00",
		"assent.request.\xff", "assent.response.al\xc3.id", "assent.request.a\x1b[2J", "assent.request.é",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		sub, err := events.ParseSubject(s)
		if err != nil {
			if !errors.Is(err, events.ErrBadSubject) && !errors.Is(err, events.ErrBadToken) {
				t.Fatalf("error matches neither ErrBadSubject nor ErrBadToken: %v", err)
			}
			if !errors.Is(err, events.ErrInvalid) {
				t.Fatalf("error does not match ErrInvalid: %v", err)
			}
			return
		}
		// A parsed subject is rebuilt, byte for byte, by its builder.
		var again string
		switch sub.Kind {
		case events.KindRequest:
			again, err = events.RequestSubject(sub.Agent)
		case events.KindPending:
			again, err = events.PendingSubject(sub.Agent)
		case events.KindResponse:
			again, err = events.ResponseSubject(sub.Principal, sub.RequestID)
		case events.KindCancel:
			again, err = events.CancelSubject(sub.RequestID)
			if sub.Agent != "" {
				again, err = events.AgentCancelSubject(sub.Agent, sub.RequestID)
			}
		case events.KindDecision:
			again, err = events.DecisionSubject(sub.RequestID)
		default:
			t.Fatalf("parsed %q to kind %v", s, sub.Kind)
		}
		if err != nil {
			t.Fatalf("builder rejects the parts of %q (%+v): %v", s, sub, err)
		}
		if again != s {
			t.Fatalf("parsed %q, rebuilt %q", s, again)
		}
		if strings.ContainsAny(s, " \t\r\n*>") {
			t.Fatalf("accepted %q", s)
		}
	})
}

func FuzzCanonicalArgs(f *testing.F) {
	for _, s := range []string{
		`{"path":"/srv/reports/q3.csv"}`,
		`{"b":2,"a":{"d":[1,{"z":null,"y":true}],"c":"<&>"}}`,
		`{"n":12345678901234567890,"f":1.50e-3,"neg":-0}`,
		`{"s":"\u2028\u00e9\ud83d\ude00\"\\"}`,
		`{"a":1,"a":2}`,
		``, `null`, ` `, `{}`, `[]`, `"x"`, `1`, `{`, `{"a":1,}`,
		// Bad text: invalid UTF-8 and lone surrogates, in values and keys.
		"{\"s\":\"\xff\"}", "{\"\xfe\":1}", "{\"s\":\"\xed\xa0\x80\"}", "{\"s\":\"\xc3\"}", "\"\xff\"",
		`{"s":"\ud800"}`, `{"s":"\udc00"}`, `{"s":"\udc00\ud800"}`, `{"s":"\ud800\u0041"}`, `{"\udfff":1}`,
		`{"s":"\\ud800"}`, `{"s":"\\\ud800"}`, `{"s":"\ud800\\udc00"}`, `{"s":"\ud83d\ude00\ud83d"}`,
		// Good text that looks like it.
		`{"\ud83d\ude00":"\uD83D\uDE00"}`, "{\"s\":\"\ufffd\xef\xbf\xbd\"}", `{"s":"\u0000\u001b\u202e"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		c, err := events.CanonicalArgs(raw)
		if err != nil {
			if !errors.Is(err, events.ErrInvalid) {
				t.Fatalf("error does not match ErrInvalid: %v", err)
			}
			if json.Valid(raw) && events.CheckJSONText(raw) != nil && !errors.Is(err, events.ErrBadText) {
				t.Fatalf("bad text refused without ErrBadText: %v", err)
			}
			if _, err2 := events.ArgsDigest(raw); err2 == nil {
				t.Fatalf("CanonicalArgs fails (%v) but ArgsDigest does not", err)
			}
			return
		}
		if !events.EmptyJSON(raw) && !json.Valid(raw) {
			t.Fatalf("CanonicalArgs accepted input that is not JSON: %q -> %q", raw, c)
		}
		if err := events.CheckJSONText(raw); err != nil {
			t.Fatalf("CanonicalArgs accepted bad text (%v): %q -> %q", err, raw, c)
		}
		// Nothing is rewritten to U+FFFD: every one in the canonical form was
		// in the input, raw or escaped.
		if n, was := bytes.Count(c, []byte("\uFFFD")), bytes.Count(raw, []byte("\uFFFD"))+
			bytes.Count(bytes.ToLower(raw), []byte(`\ufffd`)); n > was {
			t.Fatalf("CanonicalArgs made %d U+FFFD of %d: %q -> %q", n, was, raw, c)
		}
		if !json.Valid(c) || len(c) == 0 || c[0] != '{' {
			t.Fatalf("canonical form %q is not a JSON object", c)
		}
		c2, err := events.CanonicalArgs(c)
		if err != nil {
			t.Fatalf("canonical form %q rejected: %v", c, err)
		}
		if !bytes.Equal(c, c2) {
			t.Fatalf("not idempotent:\n%q\n%q", c, c2)
		}
		d1, err := events.ArgsDigest(raw)
		if err != nil {
			t.Fatal(err)
		}
		d2, err := events.ArgsDigest(raw)
		if err != nil {
			t.Fatal(err)
		}
		d3, err := events.ArgsDigest(c)
		if err != nil {
			t.Fatal(err)
		}
		if d1 != d2 || d1 != d3 {
			t.Fatalf("digest not stable: %s %s %s", d1, d2, d3)
		}
		if !strings.HasPrefix(d1, "sha256:") || len(d1) != len("sha256:")+64 {
			t.Fatalf("digest %q has the wrong form", d1)
		}
	})
}

// canonicalRequestOracle is CanonicalRequest as it was first written: a map of
// the fields, marshalled. CanonicalRequest must give the same bytes.
func canonicalRequestOracle(r events.Requested) (json.RawMessage, error) {
	marshal := func(v any) (json.RawMessage, error) {
		var buf bytes.Buffer
		enc := json.NewEncoder(&buf)
		enc.SetEscapeHTML(false)
		if err := enc.Encode(v); err != nil {
			return nil, err
		}
		return bytes.TrimRight(buf.Bytes(), "\n"), nil
	}
	fields := map[string]json.RawMessage{}
	args, err := events.CanonicalArgs(r.Args)
	if err != nil {
		return nil, err
	}
	fields["args"] = args
	for name, v := range map[string]string{"agent": r.Agent, "call_id": r.CallID, "session": r.Session, "tool": r.Tool, "user": r.User} {
		if v != "" {
			fields[name], _ = marshal(v)
		}
	}
	if len(r.Labels) > 0 {
		fields["labels"], _ = marshal(r.Labels)
	}
	if len(bytes.TrimSpace(r.ResponseSchema)) > 0 && string(bytes.TrimSpace(r.ResponseSchema)) != "null" {
		schema, err := events.CanonicalArgs(r.ResponseSchema)
		if err != nil {
			return nil, err
		}
		fields["response_schema"] = schema
	}
	return marshal(fields)
}

func FuzzCanonicalRequest(f *testing.F) {
	for _, g := range goldenRequests {
		var k, v string
		for k, v = range g.r.Labels {
			break
		}
		f.Add(g.r.Tool, g.r.Agent, g.r.Session, g.r.User, g.r.CallID, k, v, []byte(g.r.Args), []byte(g.r.ResponseSchema))
	}
	f.Add("t\x00\x1f\x7f\x80", "a\"\\", "<s>&", "\u2028\u2029", "\xff", "k\n", "v\t", []byte(`{}`), []byte(` null`))
	f.Fuzz(func(t *testing.T, tool, agent, session, user, callID, k, v string, args, schema []byte) {
		r := events.Requested{Tool: tool, Agent: agent, Session: session, User: user, CallID: callID, Args: args, ResponseSchema: schema}
		if k != "" || v != "" {
			r.Labels = map[string]string{k: v, k + "2": v + "<", "a" + k: ""}
		}
		want, wantErr := canonicalRequestOracle(r)
		got, err := events.CanonicalRequest(r)
		if (err == nil) != (wantErr == nil) {
			t.Fatalf("error %v, want %v", err, wantErr)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("canonical form\n%q\nwant\n%q", got, want)
		}
		d, ad, err := events.RequestDigests(r)
		if (err == nil) != (wantErr == nil) {
			t.Fatalf("RequestDigests error %v, want %v", err, wantErr)
		}
		if err != nil {
			return
		}
		if want, _ := events.RequestDigest(r); d != want {
			t.Fatalf("request digest %s, want %s", d, want)
		}
		if want, _ := events.ArgsDigest(r.Args); ad != want {
			t.Fatalf("args digest %s, want %s", ad, want)
		}
	})
}

// FuzzCheckArgs: CheckArgs never panics, every error it returns matches
// ErrInvalid and names args or input_schema, a failure's message is
// readable and bounded, and args it accepts are judged the same in their
// canonical form, the one a decision carries.
func FuzzCheckArgs(f *testing.F) {
	for _, s := range [][2]string{
		{`{"type":"object","properties":{"path":{"type":"string"}},"required":["path"]}`, `{"path":"/srv/a"}`},
		{`{"type":"object","properties":{"path":{"type":"string"}},"required":["path"]}`, `{"path":5}`},
		{`{"properties":{"n":{"type":"integer","minimum":1}}}`, `{"n":1.0}`},
		{`{"properties":{"n":{"type":"integer","minimum":1}}}`, `{"n":1e400}`},
		{`{"properties":{"v":{"anyOf":[{"type":"string"},{"type":"boolean"}]}}}`, `{"v":null}`},
		{`{"properties":{"p":{"pattern":"^/srv/"}}}`, `{"p":"\u202e\u0007\n"}`},
		{`{"$defs":{"p":{"type":"string"}},"properties":{"a":{"$ref":"#/$defs/p"}}}`, `{"a":1,"a":"x"}`},
		{`{"$ref":"https://example.com/s.json"}`, `{}`},
		{`{"type":5}`, `{}`},
		{`{"properties":{"a":false},"additionalProperties":false}`, `{"a":1,"b":2}`},
		{`{"uniqueItems":true,"properties":{"l":{"type":"array","uniqueItems":true}}}`, `{"l":[1,1.0]}`},
		{``, `[]`}, {`null`, `{}`}, {`{}`, ``}, {`{}`, `null`}, {`{}`, `[1]`}, {`{}`, `{"s":"\ud800"}`}, {`[]`, `{}`}, {`true`, `{}`},
		{"{\"description\":\"\xff\"}", `{}`}, {`{"type":"object"}`, "{\"s\":\"\xff\"}"},
		// Schemas whose checks could run for ever: CheckArgs must refuse
		// them at once, whatever the fuzzer makes of them.
		{`{"$defs":{"a":{"anyOf":[{"type":"array","items":{"$ref":"#/$defs/a"}},{"type":"array","items":{"$ref":"#/$defs/a"}}]}},"properties":{"x":{"$ref":"#/$defs/a"}}}`, `{"x":[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]}`},
		{`{"$defs":{"a":{"allOf":[{"$ref":"#/$defs/b"},{"$ref":"#/$defs/b"}]},"b":{"allOf":[{"$ref":"#/$defs/c"},{"$ref":"#/$defs/c"}]},"c":{"oneOf":[{"$ref":"#/$defs/d"},{"$ref":"#/$defs/d"}]},"d":{"not":{"$ref":"#/$defs/a"}}},"$ref":"#/$defs/a"}`, `{"a":[1,[2,[3]]]}`},
		{`{"$dynamicAnchor":"n","properties":{"a":{"$dynamicRef":"#n"}}}`, `{"a":{"a":{}}}`},
		{`{"$schema":"https://json-schema.org/draft/2019-09/schema","$recursiveAnchor":true,"properties":{"a":{"$recursiveRef":"#"}}}`, `{"a":{}}`},
		{`{"$schema":"http://json-schema.org/draft-04/schema#","items":[{"type":"string"}],"additionalItems":{"$ref":"#"},"dependencies":{"a":{"required":["b"]}}}`, `{"a":1}`},
	} {
		f.Add([]byte(s[0]), []byte(s[1]))
	}
	f.Fuzz(func(t *testing.T, schema, args []byte) {
		err := events.CheckArgs(schema, args)
		if err == nil {
			if events.EmptyJSON(schema) {
				return
			}
			c, cerr := events.CanonicalArgs(args)
			if cerr != nil {
				t.Fatalf("CheckArgs accepted args CanonicalArgs refuses (%v): %q", cerr, args)
			}
			if err := events.CheckArgs(schema, c); err != nil {
				t.Fatalf("CheckArgs accepted %q but refuses its canonical form %q: %v", args, c, err)
			}
			return
		}
		if !errors.Is(err, events.ErrInvalid) {
			t.Fatalf("error does not match ErrInvalid: %v", err)
		}
		var fe *events.FieldError
		if !errors.As(err, &fe) || fe.Field != "args" && fe.Field != "input_schema" {
			t.Fatalf("error names no field args or input_schema: %v", err)
		}
		if fe.Field == "args" && errors.Is(err, events.ErrSchema) {
			msg := err.Error()
			if !utf8.ValidString(msg) || strings.ContainsFunc(msg, func(r rune) bool { return unicode.Is(unicode.Cc, r) || unicode.Is(unicode.Cf, r) }) || len(msg) > 500 {
				t.Fatalf("message not one readable bounded line: %q", msg)
			}
			// Args the schema refuses, in their canonical form too.
			if c, cerr := events.CanonicalArgs(args); cerr == nil {
				if err := events.CheckArgs(schema, c); err == nil {
					t.Fatalf("CheckArgs refused %q (%v) but accepts its canonical form %q", args, fe, c)
				}
			}
		}
	})
}
