package email

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/assent-dev/assent/pkg/events"
	"github.com/assent-dev/assent/pkg/handler"
)

// TestLayoutArgs: the list of the arguments names every key in the order
// written, with its value's start and how much of it is left out; the cut
// values follow in full as far as the budget goes, never beyond it.
func TestLayoutArgs(t *testing.T) {
	long := strings.Repeat("é", 500)
	many := `{` + strings.Repeat(`"k":"`+strings.Repeat("v", 300)+`",`, 99) + `"last":1}`
	cases := []struct {
		name    string
		args    string
		budget  int
		text    []string // in the list, in this order
		notText []string
		full    []string // the full values' titles, in order
	}{
		{"none", ``, 100, []string{"(none)"}, nil, nil},
		{"null", `null`, 100, []string{"(none)"}, nil, nil},
		{"empty", `{}`, 100, []string{"(none)"}, nil, nil},
		{"order written, aligned", `{"b":1.50,"aa":{"c":[1,2]},"s":""}`, 100, []string{"  b:  1.50\n  aa: {\"c\":[1,2]}\n  s:  \"\""}, nil, nil},
		{"markup kept for templates to escape", `{"x":"<b>&"}`, 100, []string{"x: <b>&"}, nil, nil},
		{"long value: its start, the rest counted and in full below", `{"s":"` + long + `","t":"x"}`, 1000, []string{"s: " + strings.Repeat("é", 160) + " … [340 more characters, below]", "\n  t: x"}, []string{strings.Repeat("é", 161)}, []string{"s, in full (500 characters)"}},
		{"full values within the budget", `{"a":"` + long + `","b":"` + long + `"}`, 700, []string{"a:", "b:"}, nil, []string{"a, in full (500 characters)", "b: the first 200 of 500 characters"}},
		{"many keys: every one listed, each shorter", many, 1000, []string{"k:    " + strings.Repeat("v", 40) + " … [260 more characters, below]", "k:    " + strings.Repeat("v", 40) + " … [260 more characters, not in this mail: open Approve or Deny to read it]", "last: 1"}, []string{strings.Repeat("v", 41)}, []string{"k, in full (300 characters)", "k, in full (300 characters)", "k, in full (300 characters)", "k: the first 100 of 300 characters"}},
		{"several lines indented", `{"script":"a\nb\nc\nd","x":1}`, 100, []string{"  script: a\n          b\n          c … [2 more characters, below]\n  x:      1"}, nil, []string{"script, in full (7 characters)"}},
		{"control characters made visible", `{"f":"a\u202eb\u0007"}`, 100, []string{`a\u202eb\x07`}, []string{"\u202e", "\a"}, nil},
		{"not an object", `{"unterminated`, 100, []string{"not a JSON object"}, nil, []string{"The arguments (not a JSON object), in full (14 characters)"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			a := layoutArgs(json.RawMessage(c.args), c.budget)
			got := a.Text()
			at := 0
			for _, w := range c.text {
				i := strings.Index(got[at:], w)
				if i < 0 {
					t.Fatalf("list lacks %q (after %d):\n%s", w, at, got)
				}
				at += i + len(w)
			}
			for _, w := range c.notText {
				if strings.Contains(got, w) {
					t.Errorf("list has %q:\n%s", w, got)
				}
			}
			shown := 0
			var titles []string
			for _, f := range a.Full {
				titles = append(titles, f.Title())
				shown += utf8.RuneCountInString(f.Value)
			}
			if strings.Join(titles, "|") != strings.Join(c.full, "|") {
				t.Errorf("full values %q, want %q", titles, c.full)
			}
			if shown > c.budget {
				t.Errorf("%d characters in full, over the budget of %d", shown, c.budget)
			}
		})
	}
}

func TestAgo(t *testing.T) {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		d    time.Duration
		want string
	}{
		{5 * time.Second, "just now"},
		{time.Minute, "a minute ago"},
		{2 * time.Minute, "2 minutes ago"},
		{119 * time.Second, "2 minutes ago"},
		{59 * time.Minute, "59 minutes ago"},
		{time.Hour, "1 hour ago"},
		{30 * time.Hour, "30 hours ago"},
		{72 * time.Hour, "3 days ago"},
	} {
		if got := ago(now.Add(-c.d), now); got != c.want {
			t.Errorf("ago(%s) = %q, want %q", c.d, got, c.want)
		}
	}
}

func TestSubjectIsOneLine(t *testing.T) {
	n := summary{Tool: line("deploy\r\nBcc: everyone@example.com"), Agent: line("coder"), Remaining: "in 4m"}
	for _, k := range []kind{kindNew, kindEscalation, kindReminder} {
		if s := subject("[Assent]", k, n); strings.ContainsAny(s, "\r\n") || !strings.HasPrefix(s, "[Assent] ") {
			t.Errorf("%s: subject %q", k, s)
		}
	}
}

// TestMailHistoryLine: a mail has the record's line right under what is
// asked, in both parts, above the links and everything the agent wrote; a
// request without history has none.
func TestMailHistoryLine(t *testing.T) {
	now := time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)
	n := handler.Notice{Request: handler.Request{ID: "r1", Deadline: now.Add(time.Hour),
		Requested: events.Requested{Tool: "deploy", Agent: "coder", Hint: "<b>trust me</b>", Args: json.RawMessage(`{"x":1}`)}}, Rule: "deploys"}
	mail := func(n handler.Notice) (string, string) {
		t.Helper()
		text, html, err := render(mailView{summary: summarize(n, now, mailFull), Approve: "https://bot/a", Deny: "https://bot/d", Principal: "alice", To: "alice@example.com"})
		if err != nil {
			t.Fatal(err)
		}
		return text, html
	}
	text, html := mail(n)
	if strings.Contains(text, "History") || strings.Contains(html, "History") {
		t.Errorf("a request without history has a history line:\n%s\n%s", text, html)
	}
	n.History = &events.History{Window: events.Duration(30 * 24 * time.Hour), Approved: 38, Denied: 2, Exact: 1,
		Principals: []string{"alice", "bob"}, LastDenied: now.Add(-4 * 24 * time.Hour)}
	line := "approved 38 of 40 times in 30 days (2 denied; 1 with these exact arguments), by alice and bob; last denied 4 days ago"
	text, html = mail(n)
	at := strings.Index(text, "\nHistory: "+line+"\n")
	if at < 0 || at > strings.Index(text, "Approve: ") || at > strings.Index(text, "Hint from the agent") || at > strings.Index(text, "Arguments") {
		t.Errorf("the text part lacks the line above the links and the agent's text:\n%s", text)
	}
	at = strings.Index(html, "History</span>&nbsp; "+line+"</div>")
	if at < 0 || at > strings.Index(html, "https://bot/a") || at > strings.Index(html, "&lt;b&gt;trust me") || !strings.Contains(html, "#fff7e6") {
		t.Errorf("the HTML part lacks the line, marked, above the buttons and the agent's text:\n%s", html)
	}
}
