package events_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/assent-dev/assent/pkg/events"
)

func TestCheckJSONText(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		wantErr error
		msg     string // part of the error message
	}{
		{"empty", ``, nil, ""},
		{"plain", `{"path":"/srv/reports/q3.csv"}`, nil, ""},
		{"raw non-ASCII", `{"s":"é 削除 😀"}`, nil, ""},
		{"raw U+FFFD", "{\"s\":\"\xef\xbf\xbd\"}", nil, ""},
		{"escaped BMP", `{"s":"\u00e9\u0041\uffff\ufffd\u0000"}`, nil, ""},
		{"surrogate pair", `{"s":"\ud83d\ude00"}`, nil, ""},
		{"surrogate pair upper-case hex", `{"s":"\uD83D\uDE00"}`, nil, ""},
		{"surrogate pair in a key", `{"\udbff\udfff":1}`, nil, ""},
		{"escaped backslash before u", `{"s":"\\ud800"}`, nil, ""},
		{"escaped backslash before pair", `{"s":"\\\ud83d\ude00"}`, nil, ""},
		{"other escapes", `{"s":"\"\\\/\b\f\n\r\t"}`, nil, ""},
		{"control bytes are not a text error", "{\"s\":\"\x01\"}", nil, ""},

		{"invalid byte", "{\"s\":\"ab\xff\"}", events.ErrBadText, "invalid UTF-8 (0xff) at byte 8"},
		{"invalid byte in a key", "{\"\xfe\":1}", events.ErrBadText, "at byte 2"},
		{"invalid byte outside strings", "{\"s\":1}\xff", events.ErrBadText, "at byte 7"},
		{"truncated sequence", "{\"s\":\"\xc3\"}", events.ErrBadText, "(0xc3) at byte 6"},
		{"overlong encoding", "{\"s\":\"\xc0\xaf\"}", events.ErrBadText, "at byte 6"},
		{"UTF-8 encoded surrogate", "{\"s\":\"\xed\xa0\x80\"}", events.ErrBadText, "at byte 6"},
		{"lone high surrogate", `{"s":"\ud800"}`, events.ErrBadText, `lone surrogate \ud800 at byte 6`},
		{"lone low surrogate", `{"s":"\udc00"}`, events.ErrBadText, `lone surrogate \udc00 at byte 6`},
		{"high surrogate then text", `{"s":"\ud800x"}`, events.ErrBadText, `\ud800`},
		{"high surrogate then BMP escape", `{"s":"\ud800\u0041"}`, events.ErrBadText, `\ud800`},
		{"two high surrogates", `{"s":"\ud800\ud800"}`, events.ErrBadText, `\ud800 at byte 6`},
		{"pair reversed", `{"s":"\udc00\ud800"}`, events.ErrBadText, `\udc00 at byte 6`},
		{"high surrogate then escaped backslash", `{"s":"\ud800\\udc00"}`, events.ErrBadText, `\ud800`},
		{"lone surrogate in a key", `{"\uDFFF":1}`, events.ErrBadText, `\udfff at byte 2`},
		{"lone surrogate after escaped backslash", `{"s":"\\\ud800"}`, events.ErrBadText, `at byte 8`},
		{"lone surrogate after a pair", `{"s":"\ud83d\ude00\ud83d"}`, events.ErrBadText, `\ud83d at byte 18`},
		{"lone surrogate at the end", `{"s":"\ud800`, events.ErrBadText, `\ud800`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := events.CheckJSONText([]byte(tt.in))
			checkErr(t, err, tt.wantErr)
			if err != nil && !strings.Contains(err.Error(), tt.msg) {
				t.Fatalf("error %q does not say %q", err, tt.msg)
			}
		})
	}
}

// TestBadTextRefused: data whose text is not valid UTF-8, or escapes a lone
// surrogate, is refused wherever it enters, never rewritten to U+FFFD.
func TestBadTextRefused(t *testing.T) {
	const (
		badByte   = "\xff"
		lone      = `\ud800`
		validPair = `\ud83d\ude00`
	)
	t.Run("Requested.Validate", func(t *testing.T) {
		tests := []struct {
			name    string
			r       events.Requested
			wantErr error
			field   string
		}{
			{"args pair", events.Requested{Tool: "t", Args: json.RawMessage(`{"s":"` + validPair + `"}`)}, nil, ""},
			{"args invalid UTF-8", events.Requested{Tool: "t", Args: json.RawMessage(`{"s":"` + badByte + `"}`)}, events.ErrBadText, "args"},
			{"args lone surrogate", events.Requested{Tool: "t", Args: json.RawMessage(`{"s":"` + lone + `"}`)}, events.ErrBadText, "args"},
			{"args lone surrogate key", events.Requested{Tool: "t", Args: json.RawMessage(`{"` + lone + `":1}`)}, events.ErrBadText, "args"},
			{"schema invalid UTF-8", events.Requested{Tool: "t", ResponseSchema: json.RawMessage(`{"description":"` + badByte + `"}`)}, events.ErrBadText, "response_schema"},
			{"schema lone surrogate", events.Requested{Tool: "t", ResponseSchema: json.RawMessage(`{"const":"` + lone + `"}`)}, events.ErrBadText, "response_schema"},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				err := tt.r.Validate()
				checkErr(t, err, tt.wantErr)
				checkField(t, err, tt.field)
			})
		}
	})
	t.Run("Responded.Validate", func(t *testing.T) {
		tests := []struct {
			name    string
			r       events.Responded
			wantErr error
			field   string
		}{
			{"payload pair", events.Responded{Decision: events.Approve, Payload: json.RawMessage(`"` + validPair + `"`)}, nil, ""},
			{"args invalid UTF-8", events.Responded{Decision: events.Approve, Args: json.RawMessage(`{"s":"` + badByte + `"}`)}, events.ErrBadText, "args"},
			{"args lone surrogate", events.Responded{Decision: events.Approve, Args: json.RawMessage(`{"s":"` + lone + `"}`)}, events.ErrBadText, "args"},
			{"payload invalid UTF-8", events.Responded{Decision: events.Approve, Payload: json.RawMessage(`"` + badByte + `"`)}, events.ErrBadText, "payload"},
			{"payload lone surrogate", events.Responded{Decision: events.Approve, Payload: json.RawMessage(`{"n":"` + lone + `"}`)}, events.ErrBadText, "payload"},
			{"remember args invalid UTF-8", events.Responded{Decision: events.Approve, Remember: &events.Remember{Scope: events.ScopeCall, Args: json.RawMessage(`{"p":"` + badByte + `*"}`)}}, events.ErrBadText, "remember.args"},
			{"remember args lone surrogate", events.Responded{Decision: events.Approve, Remember: &events.Remember{Scope: events.ScopeCall, Args: json.RawMessage(`{"p":"` + lone + `"}`)}}, events.ErrBadText, "remember.args"},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				err := tt.r.Validate()
				checkErr(t, err, tt.wantErr)
				checkField(t, err, tt.field)
			})
		}
	})
	t.Run("CanonicalArgs", func(t *testing.T) {
		tests := []struct {
			name    string
			in      string
			want    string
			wantErr error
		}{
			{"pair", `{"s":"` + validPair + `"}`, `{"s":"😀"}`, nil},
			{"escaped backslash", `{"s":"\\ud800"}`, `{"s":"\\ud800"}`, nil},
			{"invalid UTF-8 in a value", `{"s":"a` + badByte + `"}`, "", events.ErrBadText},
			{"invalid UTF-8 in a key", `{"` + badByte + `":1}`, "", events.ErrBadText},
			{"lone high surrogate", `{"s":"` + lone + `"}`, "", events.ErrBadText},
			{"lone low surrogate", `{"s":"\udc00"}`, "", events.ErrBadText},
			{"lone surrogate deep down", `{"a":[{"b":"x\udbff"}]}`, "", events.ErrBadText},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				got, err := events.CanonicalArgs(json.RawMessage(tt.in))
				checkErr(t, err, tt.wantErr)
				if err != nil {
					checkField(t, err, "args")
					if _, err := events.ArgsDigest(json.RawMessage(tt.in)); err == nil {
						t.Fatal("ArgsDigest accepts what CanonicalArgs refuses")
					}
					d := events.Decided{Args: json.RawMessage(tt.in), ArgsDigest: "sha256:" + strings.Repeat("0", 64)}
					checkErr(t, d.VerifyArgs(), tt.wantErr)
					return
				}
				if string(got) != tt.want {
					t.Fatalf("got %s, want %s", got, tt.want)
				}
			})
		}
	})
	t.Run("DecodeData", func(t *testing.T) {
		decode := map[string]func(*events.Event) error{
			events.TypeRequested: func(e *events.Event) error { _, err := events.DecodeRequested(e); return err },
			events.TypeResponded: func(e *events.Event) error { _, err := events.DecodeResponded(e); return err },
			events.TypeCancel:    func(e *events.Event) error { _, err := events.DecodeCancel(e); return err },
			events.TypeDecided:   func(e *events.Event) error { _, err := events.DecodeDecided(e); return err },
			events.TypePending:   func(e *events.Event) error { _, err := events.DecodePending(e); return err },
			events.TypeEscalated: func(e *events.Event) error { _, err := events.DecodeEscalated(e); return err },
			events.TypeRejected:  func(e *events.Event) error { _, err := events.DecodeRejected(e); return err },
		}
		tests := []struct {
			name string
			typ  string
			data string
		}{
			// Free text too: its bytes would be rewritten by the decoder.
			{"requested hint invalid UTF-8", events.TypeRequested, `{"tool":"t","hint":"` + badByte + `"}`},
			{"requested hint lone surrogate", events.TypeRequested, `{"tool":"t","hint":"` + lone + `"}`},
			{"requested args invalid UTF-8", events.TypeRequested, `{"tool":"t","args":{"path":"/tmp/` + badByte + `"}}`},
			{"requested args lone surrogate", events.TypeRequested, `{"tool":"t","args":{"path":"/tmp/` + lone + `x"}}`},
			{"requested unknown field", events.TypeRequested, `{"tool":"t","future":"` + lone + `"}`},
			{"responded reason", events.TypeResponded, `{"decision":"approve","reason":"` + badByte + `"}`},
			{"responded payload", events.TypeResponded, `{"decision":"approve","payload":"` + lone + `"}`},
			{"cancel reason invalid UTF-8", events.TypeCancel, `{"reason":"` + badByte + `"}`},
			{"cancel reason lone surrogate", events.TypeCancel, `{"reason":"\udc00"}`},
			{"decided args", events.TypeDecided, `{"request_id":"a","outcome":"approved","args":{"p":"` + lone + `"},"decided_at":"2025-01-02T03:04:05Z"}`},
			{"decided reason", events.TypeDecided, `{"request_id":"a","outcome":"denied","reason":"` + badByte + `","decided_at":"2025-01-02T03:04:05Z"}`},
			{"pending request args", events.TypePending, `{"request_id":"a","request":{"tool":"t","args":{"p":"` + badByte + `"}}}`},
			{"escalated request args", events.TypeEscalated, `{"request_id":"a","request":{"tool":"t","args":{"p":"` + lone + `"}},"level":1}`},
			{"rejected reason", events.TypeRejected, `{"request_id":"a","code":"id_conflict","reason":"` + badByte + `"}`},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				for mode, msg := range map[string]struct {
					h    events.Header
					body []byte
				}{
					"structured": {structuredHeader, structured(testID, tt.typ, tt.data)},
					"binary":     {binaryHeader(testID, tt.typ), []byte(tt.data)},
				} {
					e, err := events.Decode(msg.h, msg.body)
					if err != nil {
						t.Fatalf("%s: Decode: %v", mode, err)
					}
					err = decode[tt.typ](&e)
					checkErr(t, err, events.ErrBadText)
					checkField(t, err, "data")
				}
			})
		}
	})
}

// TestIdentifierCharacters: identifiers refuse control and format characters
// and invalid UTF-8; free text keeps them.
func TestIdentifierCharacters(t *testing.T) {
	tests := []struct {
		name    string
		edit    func(*events.Requested)
		wantErr error
		field   string
		msg     string // part of the error message
	}{
		{"non-ASCII tool", func(r *events.Requested) { r.Tool = "résumé_削除" }, nil, "", ""},
		{"emoji user", func(r *events.Requested) { r.User = "Zoë 😀" }, nil, "", ""},
		{"space in session", func(r *events.Requested) { r.Session = "run 42" }, nil, "", ""},
		{"U+FFFD itself", func(r *events.Requested) { r.CallID = "call\uFFFD" }, nil, "", ""},
		{"hint keeps controls", func(r *events.Requested) { r.Hint = "line 1\nline 2\t\u202e\x1b[2J\u200b" }, nil, "", ""},
		{"labels with spaces and accents", func(r *events.Requested) { r.Labels = map[string]string{"équipe": "finance ops"} }, nil, "", ""},

		{"tool escape", func(r *events.Requested) { r.Tool = "rm\x1b[2J" }, events.ErrBadText, "tool", "U+001B at byte 2"},
		{"tool NUL", func(r *events.Requested) { r.Tool = "rm\x00" }, events.ErrBadText, "tool", "U+0000 at byte 2"},
		{"tool DEL", func(r *events.Requested) { r.Tool = "rm\x7f" }, events.ErrBadText, "tool", "U+007F at byte 2"},
		{"tool C1 control", func(r *events.Requested) { r.Tool = "rm\u0085" }, events.ErrBadText, "tool", "U+0085 at byte 2"},
		{"tool bidi override", func(r *events.Requested) { r.Tool = "delete\u202Efdp.exe" }, events.ErrBadText, "tool", "U+202E at byte 6"},
		{"tool bidi isolate", func(r *events.Requested) { r.Tool = "a\u2066b" }, events.ErrBadText, "tool", "U+2066 at byte 1"},
		{"tool pop isolate", func(r *events.Requested) { r.Tool = "a\u2069" }, events.ErrBadText, "tool", "U+2069"},
		{"tool zero width space", func(r *events.Requested) { r.Tool = "r\u200bm" }, events.ErrBadText, "tool", "U+200B at byte 1"},
		{"tool zero width joiner", func(r *events.Requested) { r.Tool = "r\u200dm" }, events.ErrBadText, "tool", "U+200D"},
		{"tool byte order mark", func(r *events.Requested) { r.Tool = "\ufeffrm" }, events.ErrBadText, "tool", "U+FEFF at byte 0"},
		{"tool word joiner", func(r *events.Requested) { r.Tool = "r\u2060m" }, events.ErrBadText, "tool", "U+2060"},
		{"tool soft hyphen", func(r *events.Requested) { r.Tool = "r\u00adm" }, events.ErrBadText, "tool", "U+00AD"},
		{"tool invalid UTF-8", func(r *events.Requested) { r.Tool = "rm\xff" }, events.ErrBadText, "tool", "invalid UTF-8 (0xff) at byte 2"},
		{"tool truncated UTF-8", func(r *events.Requested) { r.Tool = "r\xc3" }, events.ErrBadText, "tool", "at byte 1"},
		{"session newline", func(r *events.Requested) { r.Session = "s\n1" }, events.ErrBadText, "session", "U+000A at byte 1"},
		{"session invalid UTF-8", func(r *events.Requested) { r.Session = "\xed\xa0\x80" }, events.ErrBadText, "session", "at byte 0"},
		{"user bidi override", func(r *events.Requested) { r.User = "alice\u202e" }, events.ErrBadText, "user", "U+202E at byte 5"},
		{"call_id tab", func(r *events.Requested) { r.CallID = "call\t1" }, events.ErrBadText, "call_id", "U+0009 at byte 4"},
		{"label value bell", func(r *events.Requested) { r.Labels = map[string]string{"env": "prod\a"} }, events.ErrBadText, "labels", "U+0007 at byte 4"},
		{"label key bidi", func(r *events.Requested) { r.Labels = map[string]string{"e\u2067nv": "prod"} }, events.ErrBadText, "labels", "U+2067 at byte 1"},
		{"label key invalid UTF-8", func(r *events.Requested) { r.Labels = map[string]string{"\xfe": "prod"} }, events.ErrBadText, "labels", `label "\xfe"`},
		{"label value invalid UTF-8", func(r *events.Requested) { r.Labels = map[string]string{"env": "\xfe"} }, events.ErrBadText, "labels", "invalid UTF-8"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := events.Requested{Tool: "delete_file", Session: "s-42", User: "carol", CallID: "call_1", Labels: map[string]string{"team": "ops"}}
			tt.edit(&r)
			err := r.Validate()
			checkErr(t, err, tt.wantErr)
			checkField(t, err, tt.field)
			if err != nil && !strings.Contains(err.Error(), tt.msg) {
				t.Fatalf("error %q does not say %q", err, tt.msg)
			}
		})
	}

	// The message shows the character escaped, never as itself.
	r := events.Requested{Tool: "delete\u202Efdp.exe", Labels: map[string]string{"k\u202e": "v"}}
	if err := r.Validate(); err == nil || strings.ContainsRune(err.Error(), '\u202e') {
		t.Fatalf("error %q", err)
	}

	// Free text of answers and cancels keeps control characters.
	for _, reason := range []string{"no\n\tbecause\u202e", "\x1b[31mred\x1b[0m", "\u200b\ufeff"} {
		checkErr(t, (&events.Responded{Decision: events.Deny, Reason: reason}).Validate(), nil)
		checkErr(t, (&events.Cancel{Reason: reason}).Validate(), nil)
	}
}
