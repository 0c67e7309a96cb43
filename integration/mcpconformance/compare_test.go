package mcpconformance_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/assent-dev/assent/integration/mcpconformance"
)

// transcript builds a transcript from lines: "> MSG" sent, "< MSG"
// received, "> [step] MSG" a step's request or notification.
func transcript(t *testing.T, name, session string, lines ...string) mcpconformance.Transcript {
	t.Helper()
	tr := mcpconformance.Transcript{Name: name, Session: session}
	for _, l := range lines {
		dir := mcpconformance.Sent
		if strings.HasPrefix(l, "< ") {
			dir = mcpconformance.Received
		} else if !strings.HasPrefix(l, "> ") {
			t.Fatalf("line %q: want > or <", l)
		}
		l = l[2:]
		step := ""
		if strings.HasPrefix(l, "[") {
			end := strings.Index(l, "] ")
			step, l = l[1:end], l[end+2:]
		}
		if !json.Valid([]byte(l)) {
			t.Fatalf("line %q: not JSON", l)
		}
		tr.Entries = append(tr.Entries, mcpconformance.Entry{Dir: dir, Msg: json.RawMessage(l), Step: step})
	}
	return tr
}

// Messages the cases share.
const (
	callSlow   = `> [slow] {"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"slow","_meta":{"progressToken":"p"}}}`
	progress1  = `< {"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":"p","progress":1}}`
	progress2  = `< {"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":"p","progress":2}}`
	logA       = `< {"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","data":"a"}}`
	logB       = `< {"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","data":"b"}}`
	slowResult = `< {"jsonrpc":"2.0","id":7,"result":{"content":[{"type":"text","text":"done"}]}}`
	updated    = `< {"jsonrpc":"2.0","method":"notifications/resources/updated","params":{"uri":"demo://x"}}`
)

// TestCompare checks each normalisation and comparison rule on small
// transcripts: what must compare equal does, and what must not is
// reported where it differs.
func TestCompare(t *testing.T) {
	base := []string{callSlow, progress1, progress2, logA, logB, slowResult}
	cases := []struct {
		name string
		a, b mcpconformance.Transcript
		want []string // paths or units of the differences, in order; none: equal
	}{
		{name: "identical", a: transcript(t, "a", "", base...), b: transcript(t, "b", "", base...)},
		{
			name: "notifications of different streams interleave freely",
			a:    transcript(t, "a", "", base...),
			b:    transcript(t, "b", "", callSlow, logA, progress1, logB, progress2, slowResult),
		},
		{
			name: "order within a stream is strict",
			a:    transcript(t, "a", "", base...),
			b:    transcript(t, "b", "", callSlow, progress1, progress2, logB, logA, slowResult),
			// The longest run in common is one message: the other one is
			// missing where A has it and extra where B has it.
			want: []string{"(the whole exchange)", "(the whole exchange)"},
		},
		{
			name: "progress after the response to its request",
			a:    transcript(t, "a", "", base...),
			b:    transcript(t, "b", "", callSlow, progress1, logA, logB, slowResult, progress2),
			want: []string{"(order)"},
		},
		{
			name: "one extra notification is one difference",
			a:    transcript(t, "a", "", base...),
			b: transcript(t, "b", "", callSlow, progress1, progress2, logA,
				`< {"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","data":"extra"}}`, logB, slowResult),
			want: []string{"(the whole exchange)"},
		},
		{
			name: "numbers by value, keys in any order",
			a:    transcript(t, "a", "", `> [n] {"jsonrpc":"2.0","id":1,"method":"x"}`, `< {"jsonrpc":"2.0","id":1,"result":{"n":1,"m":0.5}}`),
			b:    transcript(t, "b", "", `> [n] {"jsonrpc":"2.0","id":1,"method":"x"}`, `< {"result":{"m":5e-1,"n":1.0},"id":1,"jsonrpc":"2.0"}`),
		},
		{
			name: "a number that differs",
			a:    transcript(t, "a", "", `> [n] {"jsonrpc":"2.0","id":1,"method":"x"}`, `< {"jsonrpc":"2.0","id":1,"result":{"n":1}}`),
			b:    transcript(t, "b", "", `> [n] {"jsonrpc":"2.0","id":1,"method":"x"}`, `< {"jsonrpc":"2.0","id":1,"result":{"n":2}}`),
			want: []string{"response $.result.n"},
		},
		{
			name: "list entries matched by name",
			a: transcript(t, "a", "", `> [list] {"jsonrpc":"2.0","id":1,"method":"tools/list"}`,
				`< {"jsonrpc":"2.0","id":1,"result":{"tools":[{"name":"a","title":"A"},{"name":"b","title":"B"},{"name":"c"}]}}`),
			b: transcript(t, "b", "", `> [list] {"jsonrpc":"2.0","id":1,"method":"tools/list"}`,
				`< {"jsonrpc":"2.0","id":1,"result":{"tools":[{"name":"a","title":"A"},{"name":"c"},{"name":"b"}]}}`),
			want: []string{"response $.result.tools[name=b].title", "response $.result.tools (order)"},
		},
		{
			name: "the client's request ids, and the server's",
			a: transcript(t, "a", "", `> [s] {"jsonrpc":"2.0","id":3,"method":"tools/call"}`,
				`< {"jsonrpc":"2.0","id":0,"method":"sampling/createMessage","params":{}}`, `> {"jsonrpc":"2.0","id":0,"result":{"role":"assistant"}}`,
				`< {"jsonrpc":"2.0","id":3,"result":{}}`),
			b: transcript(t, "b", "", `> [s] {"jsonrpc":"2.0","id":"x-9","method":"tools/call"}`,
				`< {"jsonrpc":"2.0","id":"gw-42","method":"sampling/createMessage","params":{}}`, `> {"jsonrpc":"2.0","id":"gw-42","result":{"role":"assistant"}}`,
				`< {"jsonrpc":"2.0","id":"x-9","result":{}}`),
		},
		{
			name: "a response to a request the client cancelled",
			a: transcript(t, "a", "", `> [slow] {"jsonrpc":"2.0","id":4,"method":"tools/call"}`,
				`> [cancel] {"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":4}}`),
			b: transcript(t, "b", "", `> [slow] {"jsonrpc":"2.0","id":4,"method":"tools/call"}`,
				`> [cancel] {"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":4}}`,
				`< {"jsonrpc":"2.0","id":4,"error":{"code":0,"message":"context canceled"}}`),
			want: []string{"response $"},
		},
		{
			name: "session, task ids, timestamps and times",
			a: transcript(t, "a", "",
				`> [task] {"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"task":{}}}`,
				`< {"jsonrpc":"2.0","id":1,"result":{"task":{"taskId":"aaaa","createdAt":"2026-11-27T10:41:09.316Z"}}}`,
				`> [get] {"jsonrpc":"2.0","id":2,"method":"tasks/get","params":{"taskId":"aaaa"}}`,
				`< {"jsonrpc":"2.0","id":2,"result":{"text":"for session undefined at 10:41:09 AM; URI: x ","blob":"dGFzayBhYWFhIGF0IDEwOjQxOjA5IEFN"}}`),
			b: transcript(t, "b", "5c1e-77",
				`> [task] {"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"task":{}}}`,
				`< {"jsonrpc":"2.0","id":1,"result":{"task":{"taskId":"bbbb","createdAt":"2027-01-02T03:04:05Z"}}}`,
				`> [get] {"jsonrpc":"2.0","id":2,"method":"tasks/get","params":{"taskId":"bbbb"}}`,
				`< {"jsonrpc":"2.0","id":2,"result":{"text":"for session 5c1e-77 at 9:01:02 PM; URI: x from session 5c1e-77","blob":"dGFzayBiYmJiIGF0IDIxOjAxOjAy"}}`),
		},
		{
			name: "pings from the server and an approval's own messages",
			a:    transcript(t, "a", "", base...),
			b: transcript(t, "b", "", callSlow,
				`< {"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":"p","progress":1,"message":"waiting for approval (Assent request 01a2)"}}`,
				`< {"jsonrpc":"2.0","id":90,"method":"ping"}`, `> {"jsonrpc":"2.0","id":90,"result":{}}`,
				`< {"jsonrpc":"2.0","id":91,"method":"elicitation/create","params":{"message":"Approve this tool call? Accept approves it"}}`,
				`> {"jsonrpc":"2.0","id":91,"result":{"action":"accept"}}`,
				`< {"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","data":"asked","_meta":{"dev.assent/approval":"01a2"}}}`,
				progress1, progress2, logA, logB,
				`< {"jsonrpc":"2.0","id":7,"result":{"content":[{"type":"text","text":"done"}],"_meta":{"dev.assent/decision":{"outcome":"approved"}}}}`),
		},
		{
			name: "a run of identical resource updates counts as one",
			a:    transcript(t, "a", "", updated, logA),
			b:    transcript(t, "b", "", updated, updated, logA, updated),
		},
		{
			name: "an update of another resource does not",
			a:    transcript(t, "a", "", updated),
			b:    transcript(t, "b", "", updated, `< {"jsonrpc":"2.0","method":"notifications/resources/updated","params":{"uri":"demo://y"}}`),
			want: []string{"(the whole exchange)"},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := mcpconformance.Compare(tc.a, tc.b)
			var got []string
			for _, d := range r.Differences {
				got = append(got, d.Path)
			}
			if strings.Join(got, "\n") != strings.Join(tc.want, "\n") {
				t.Errorf("differences at\n  %s\nwant\n  %s\n%s", strings.Join(got, "\n  "), strings.Join(tc.want, "\n  "), r)
			}
		})
	}
}

// TestFillSchema: the elicitation answer takes defaults, the first choice
// of an enum or oneOf, and a value of each type and format.
func TestFillSchema(t *testing.T) {
	var schema map[string]any
	if err := json.Unmarshal([]byte(`{"type":"object","properties":{
		"name":{"type":"string"},
		"email":{"type":"string","format":"email"},
		"pick":{"type":"string","oneOf":[{"const":"x","title":"X"},{"const":"y"}]},
		"fish":{"type":"array","items":{"anyOf":[{"const":"fish-1"}]}},
		"n":{"type":"integer","minimum":3},
		"ok":{"type":"boolean"},
		"line":{"type":"string","default":"It was"}}}`), &schema); err != nil {
		t.Fatal(err)
	}
	got, _ := json.Marshal(mcpconformance.FillSchema(schema))
	want := `{"email":"ada@example.com","fish":["fish-1"],"line":"It was","n":3,"name":"Ada Lovelace","ok":true,"pick":"x"}`
	if string(got) != want {
		t.Errorf("FillSchema = %s, want %s", got, want)
	}
}
