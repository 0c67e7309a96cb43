package slack

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/slack-go/slack"

	"github.com/assent-dev/assent/internal/channels"
	"github.com/assent-dev/assent/pkg/events"
	"github.com/assent-dev/assent/pkg/handler"
	"github.com/assent-dev/assent/pkg/policy"
)

func TestEsc(t *testing.T) {
	tests := []struct {
		in   string
		n    int
		want string
	}{
		{"deploy", 10, "deploy"},
		{"<!channel> & <@U1|x>", 100, "&lt;!channel&gt; &amp; &lt;@U1|x&gt;"},
		{"<http://evil|click me>", 100, "&lt;http://evil|click me&gt;"},
		{"a\x1b[2Jb", 100, `a\x1b[2Jb`},
		{"two\nlines", 100, `two\nlines`},
		{"abcdef", 4, "abc…"},
		{"a&&&", 8, "a&amp;…"}, // never half an escape
		{"ééééé", 3, "éé…"},
	}
	for _, tt := range tests {
		if got := esc(tt.in, tt.n); got != tt.want {
			t.Errorf("esc(%q, %d) = %q, want %q", tt.in, tt.n, got, tt.want)
		}
	}
	if got := code("a`b", 10); got != "`aˋb`" {
		t.Errorf("code: %q", got)
	}
	if got := quote("one\ntwo <b>", 100); got != "> one\n> two &lt;b&gt;" {
		t.Errorf("quote: %q", got)
	}
	if got := quote(strings.Repeat("x\n", 100), 1000); strings.Count(got, "\n") != maxQuoteLines-1 {
		t.Errorf("quote of 100 lines has %d lines", strings.Count(got, "\n")+1)
	}
}

func TestArgsText(t *testing.T) {
	many := `{"k1":1`
	for i := 2; i <= 12; i++ {
		many += fmt.Sprintf(`,"k%d":%d`, i, i)
	}
	many += "}"
	tests := []struct {
		name, args, page string
		want             []string
		not              []string
	}{
		{"none", ``, "", []string{"*Arguments*: none"}, nil},
		{"empty object", `{}`, "", []string{"*Arguments*: none"}, nil},
		{"in order", `{"z":"last?","a":1,"m":{"k":[1, 2]}}`, "", []string{"*Arguments* (3)\n• `z`: `last?`\n• `a`: `1`\n• `m`: `{\"k\":[1,2]}`"}, []string{"Full", "more"}},
		{"empty string", `{"s":""}`, "", []string{"• `s`: _(empty)_"}, nil},
		{"link", `{"a":1}`, "https://ui/approvals/x", []string{"<https://ui/approvals/x|Full request>"}, nil},
		{"every key", many, "https://ui/a", []string{"• `k8`: `8`", "• `k12`: `12`", "|Full request>"}, []string{"more"}},
		{"cut", `{"big":"` + strings.Repeat("x", 1000) + `","after":1}`, "https://ui/a", []string{"• `big`: `" + strings.Repeat("x", 300) + "` _(700 more characters)_\n• `after`: `1`", "|Full arguments>"}, nil},
		{"long name", `{"` + strings.Repeat("k", 100) + `":1}`, "", []string{"`" + strings.Repeat("k", 60) + "…`: `1` _(the name 40 more characters)_"}, nil},
		{"not an object", `[1,2]`, "", []string{"`[1,2]`"}, nil},
		{"odd names", `{"":1,"a` + "`" + `b":2,"a":1,"a":2}`, "", []string{"• _(empty name)_: `1`", "• `aˋb`: `2`", "• `a`: `1`\n• `a`: `2`"}, nil},
	}
	for _, tt := range tests {
		got := strings.Join(argsText("Arguments", json.RawMessage(tt.args), tt.page), "\n")
		for _, w := range tt.want {
			if !strings.Contains(got, w) {
				t.Errorf("%s: %q lacks %q", tt.name, got, w)
			}
		}
		for _, w := range tt.not {
			if strings.Contains(got, w) {
				t.Errorf("%s: %q has %q", tt.name, got, w)
			}
		}
	}
}

// TestArgsTextKeepsEveryKey: whatever the agent sends (a long first value,
// hundreds of keys, long names, markup), every key is shown with the start
// of its value, in texts within Slack's limits; only past what a message
// can hold are keys left out, and the first line says so.
func TestArgsTextKeepsEveryKey(t *testing.T) {
	obj := func(n int, key func(int) string, val func(int) string) (json.RawMessage, []string) {
		m := "{"
		var keys []string
		for i := range n {
			k, _ := json.Marshal(key(i))
			v, _ := json.Marshal(val(i))
			if i > 0 {
				m += ","
			}
			m += string(k) + ":" + string(v)
			keys = append(keys, key(i))
		}
		return json.RawMessage(m + "}"), keys
	}
	for _, c := range []struct {
		name     string
		n        int
		key, val func(int) string
	}{
		{"long first", 5, func(i int) string { return fmt.Sprint("key", i) }, func(i int) string {
			if i == 0 {
				return strings.Repeat("a", 3300)
			}
			return "v"
		}},
		{"every value long", 40, func(i int) string { return fmt.Sprint("key", i) }, func(int) string { return strings.Repeat("<&>", 2000) }},
		{"many keys", 300, func(i int) string { return fmt.Sprint("k", i) }, func(int) string { return strings.Repeat("x", 100) }},
	} {
		args, keys := obj(c.n, c.key, c.val)
		texts := argsText("Arguments", args, "https://ui/approvals/x")
		if len(texts) > maxArgBlocks {
			t.Errorf("%s: %d sections, over %d", c.name, len(texts), maxArgBlocks)
		}
		all := strings.Join(texts, "\n")
		for _, k := range keys {
			if !strings.Contains(all, "• `"+k+"`: `") {
				t.Errorf("%s: key %s not shown", c.name, k)
			}
		}
		for _, text := range texts {
			if n := utf8.RuneCountInString(text); n > 3000 {
				t.Errorf("%s: a section of %d characters", c.name, n)
			}
		}
	}
	// More keys than a message holds: the first line says how many are
	// not shown, with the link.
	args, _ := obj(3000, func(i int) string { return fmt.Sprint("key-number-", i) }, func(int) string { return "value" })
	texts := argsText("Arguments", args, "https://ui/approvals/x")
	first, _, _ := strings.Cut(texts[0], "\n")
	if !strings.Contains(first, "of 3000 arguments fit in a Slack message") || !strings.Contains(first, "|see every argument>") {
		t.Errorf("first line %q: want how many are not shown, and the link", first)
	}
	if len(texts) > maxArgBlocks {
		t.Errorf("%d sections", len(texts))
	}
}
func TestHuman(t *testing.T) {
	for d, want := range map[time.Duration]string{
		-time.Second:                 "0 seconds",
		45 * time.Second:             "45 seconds",
		90 * time.Second:             "90 seconds",
		12 * time.Minute:             "12 minutes",
		time.Hour:                    "60 minutes",
		24 * time.Hour:               "24 hours",
		2*time.Hour + 30*time.Minute: "2h30m",
	} {
		if got := human(d); got != want {
			t.Errorf("human(%s) = %q, want %q", d, got, want)
		}
	}
}

func TestRememberScopes(t *testing.T) {
	terms := &events.Terms{Remember: &events.RememberTerms{Scopes: []string{"call", "session", "agent", "user", "session"}, MaxTTL: events.Duration(time.Hour)}}
	tests := []struct {
		name string
		n    handler.Notice
		want string
	}{
		{"no terms", handler.Notice{}, ""},
		{"not rememberable", handler.Notice{Terms: &events.Terms{}}, ""},
		{"everything", notice(events.Requested{Agent: "a", Session: "s", User: "u"}, terms), "call,session,agent,user"},
		{"no session or user", notice(events.Requested{Agent: "a"}, terms), "call,agent"},
	}
	for _, tt := range tests {
		if got := strings.Join(rememberScopes(tt.n), ","); got != tt.want {
			t.Errorf("%s: %q, want %q", tt.name, got, tt.want)
		}
	}
}

func TestParseEditedArgs(t *testing.T) {
	tests := []struct {
		in, want, problem string
	}{
		{`{"a": 1}`, `{"a":1}`, ""},
		{"  {\n\"a\": [1, 2]\n}\n", `{"a":[1,2]}`, ""},
		{`{}`, `{}`, ""},
		{``, "", "Enter the arguments"},
		{`{"a":`, "", "Not valid JSON"},
		{`{"a":1} {"b":2}`, "", "Not valid JSON"},
		{`[1]`, "", "must be a JSON object"},
		{`"x"`, "", "must be a JSON object"},
		{`null`, "", "must be a JSON object"},
	}
	for _, tt := range tests {
		got, problem := parseEditedArgs(tt.in)
		if string(got) != tt.want || !strings.Contains(problem, tt.problem) || (tt.problem == "") != (problem == "") {
			t.Errorf("parseEditedArgs(%q) = %s, %q; want %s, %q", tt.in, got, problem, tt.want, tt.problem)
		}
	}
}

func TestReplayGuard(t *testing.T) {
	g := newReplayGuard(10*time.Minute, 3)
	t0 := time.Unix(1_700_000_000, 0)
	if !g.first("a", t0) || g.first("a", t0.Add(time.Minute)) {
		t.Fatal("a signature is taken once")
	}
	if g.first("a", t0.Add(9*time.Minute)) {
		t.Fatal("a signature is refused again inside the window")
	}
	if !g.first("a", t0.Add(11*time.Minute)) {
		t.Fatal("a signature is forgotten after the window")
	}
	for _, s := range []string{"b", "c", "d"} {
		g.first(s, t0.Add(12*time.Minute))
	}
	if n := g.len(); n != 3 {
		t.Fatalf("remembers %d signatures, want at most 3", n)
	}
	if !g.first("a", t0.Add(12*time.Minute)) {
		t.Fatal("the oldest signature is forgotten first when full")
	}
	if g.first("d", t0.Add(12*time.Minute)) {
		t.Fatal("a recent signature is remembered when full")
	}
}

// TestBlocksWithinSlackLimits: whatever an agent sends, every text of a
// message stays inside Slack's limits, and no markup gets through.
func TestBlocksWithinSlackLimits(t *testing.T) {
	p, err := policy.Parse([]byte("version: 1\nprincipals:\n  alice: {slack: UALICE}\n"), "p.yaml")
	if err != nil {
		t.Fatal(err)
	}
	a := &Adapter{env: channels.Env{Directory: channels.NewDirectory(p), WebUI: "https://assent.example.com"}, now: time.Now}
	nasty := strings.Repeat("<&>\u202e\x1b", 2000)
	args := map[string]string{}
	for _, k := range []string{"a", "b", "c", "d", "e", "f", "g", "h", "i"} {
		args[strings.Repeat(k, 500)+nasty[:100]] = nasty
	}
	raw, _ := json.Marshal(args)
	req := events.Requested{Tool: nasty, Agent: nasty, User: nasty, Session: nasty, Hint: nasty + strings.Repeat("\n", 500), Args: raw}
	n := notice(req, &events.Terms{Remember: &events.RememberTerms{Scopes: []string{"call", "session", "agent", "user"}, MaxTTL: events.Duration(time.Hour)}})
	n.Rule = nasty
	n.Approvers = []string{nasty}
	n.History = &events.History{Window: events.Duration(time.Hour), Approved: 1, Principals: []string{nasty, nasty, nasty, nasty}}
	d := handler.Decision{Outcome: events.Approved, Reason: nasty, Args: raw, Edited: true,
		DecidedBy: []events.DecidedBy{{Principal: nasty, Channel: nasty}}, DecidedAt: time.Now()}
	for name, blocks := range map[string][]slack.Block{
		"request":  a.requestBlocks(n),
		"outcome":  a.outcomeBlocks(handler.Outcome{RequestID: n.ID, Decision: d, Notice: n}),
		"deny":     denyModal(n, modalMeta{ID: n.ID}).Blocks.BlockSet,
		"remember": rememberModal(n, modalMeta{ID: n.ID}, rememberScopes(n)).Blocks.BlockSet,
	} {
		b, err := json.Marshal(blocks)
		if err != nil {
			t.Fatal(err)
		}
		var decoded any
		if err := json.Unmarshal(b, &decoded); err != nil {
			t.Fatal(err)
		}
		seen := 0
		walkTexts(decoded, func(typ, text string, limit int) {
			seen++
			if c := utf8.RuneCountInString(text); c > limit {
				t.Errorf("%s: a %s text of %d characters, over %d", name, typ, c, limit)
			}
			if typ == "mrkdwn" && (strings.Contains(text, "<&>") || strings.Contains(text, "\x1b") || strings.Contains(text, "\u202e")) {
				t.Errorf("%s: raw markup or control characters in %q", name, text[:min(len(text), 80)])
			}
		})
		if seen < 3 {
			t.Errorf("%s: only %d texts", name, seen)
		}
	}
}

// walkTexts calls f with every text object in v, with Slack's limit for it.
func walkTexts(v any, f func(typ, text string, limit int)) {
	switch v := v.(type) {
	case map[string]any:
		if typ, ok := v["type"].(string); ok && (typ == "mrkdwn" || typ == "plain_text") {
			if text, ok := v["text"].(string); ok {
				f(typ, text, 3000)
			}
		}
		if v["type"] == "header" {
			if t, ok := v["text"].(map[string]any); ok {
				f("header", t["text"].(string), 150)
			}
		}
		for _, e := range v {
			walkTexts(e, f)
		}
	case []any:
		for _, e := range v {
			walkTexts(e, f)
		}
	}
}

func notice(req events.Requested, terms *events.Terms) handler.Notice {
	return handler.Notice{Request: handler.Request{ID: "01a20956-53af-79a6-b840-ea4b43db981d", Requested: req, Deadline: time.Now().Add(time.Minute)}, Terms: terms}
}

func FuzzArgsText(f *testing.F) {
	for _, s := range []string{`{"a":1}`, `{"a":"<b>","c":[1,{"d":null}]}`, `[]`, `{"a":1`, `{"a":1}{`, `"x"`, ``, `{"":""}`, "{\"a\":\"\u202e`\\n\"}"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		texts := argsText("Arguments", raw, "https://ui/approvals/x")
		if len(texts) == 0 || len(texts) > maxArgBlocks {
			t.Fatalf("%d sections", len(texts))
		}
		for _, text := range texts {
			if c := utf8.RuneCountInString(text); c > 3000 {
				t.Fatalf("%d characters", c)
			}
			if strings.Contains(text, "<&>") {
				t.Fatalf("raw markup in %q", text)
			}
		}
	})
}

func FuzzParseEditedArgs(f *testing.F) {
	for _, s := range []string{`{"a":1}`, ` { } `, `[1]`, `{"a":`, `null`, "{\"a\":\"\u202e\"}"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		args, problem := parseEditedArgs(s)
		if problem != "" {
			if args != nil {
				t.Fatalf("arguments %s with problem %q", args, problem)
			}
			return
		}
		var m map[string]any
		if err := json.Unmarshal(args, &m); err != nil || m == nil {
			t.Fatalf("accepted %q as %s: %v", s, args, err)
		}
	})
}

func FuzzParseMeta(f *testing.F) {
	for _, s := range []string{`{"id":"01a20956-53af-79a6-b840-ea4b43db981d","channel":"C1"}`, `{"id":"a.b"}`, `{}`, `x`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		m, err := parseMeta(s)
		if err == nil && events.CheckToken("request_id", m.ID) != nil {
			t.Fatalf("accepted request id %q", m.ID)
		}
		if _, ok := parseRef(json.RawMessage(s)); ok && !json.Valid([]byte(s)) {
			t.Fatalf("ref from invalid JSON %q", s)
		}
	})
}

func TestMentions(t *testing.T) {
	p, err := policy.Parse([]byte(`version: 1
principals:
  alice: {slack: UALICE, roles: [ops]}
  bob:   {slack: UBOB, roles: [ops]}
  carol: {roles: [ops]}
  dan:   {slack: UDAN, roles: [dev]}
`), "p.yaml")
	if err != nil {
		t.Fatal(err)
	}
	off := false
	dir := channels.NewDirectory(p)
	ops := notice(events.Requested{User: "bob"}, &events.Terms{})
	ops.Approvers = []string{"role:ops"}
	tests := []struct {
		name    string
		mention *bool
		n       handler.Notice
		want    string
	}{
		{"mentions, not the requester", nil, ops, "*Approvers:* <@UALICE>"},
		{"names when mentions are off", &off, ops, "*Approvers:* alice"},
		{"no one on Slack", nil, func() handler.Notice { n := ops; n.Approvers = []string{"carol"}; return n }(), "*Approvers:* no one on Slack (carol)"},
		{"escalation", nil, func() handler.Notice { n := ops; n.Approvers = []string{"dan"}; n.Level = 2; return n }(), "*Escalated (level 2) to* <@UDAN>; earlier approvers may still answer."},
	}
	for _, tt := range tests {
		a := &Adapter{cfg: Config{Mention: tt.mention}, env: channels.Env{Directory: dir}}
		if got := a.approversText(tt.n); got != tt.want {
			t.Errorf("%s: %q, want %q", tt.name, got, tt.want)
		}
	}
}

func TestSlackTime(t *testing.T) {
	for ts, want := range map[string]time.Time{
		"1700000000.000247":  time.Unix(1700000000, 247000).UTC(),
		"1700000000.5":       time.Unix(1700000000, 500000000).UTC(),
		"1700000000":         time.Unix(1700000000, 0).UTC(),
		"":                   {},
		"abc.def":            {},
		"1700000000.1234567": {},
		"-5.000001":          {},
		"1700000000.-00001":  {},
	} {
		got, ok := slackTime(ts)
		if !got.Equal(want) || ok == want.IsZero() {
			t.Errorf("slackTime(%q) = %s, %v; want %s", ts, got, ok, want)
		}
	}
	// Without the clicked message's ts, the request's first message's.
	n := handler.Notice{Ref: json.RawMessage(`{"channel":"C1","ts":"1700000001.000002"}`)}
	if got := shownAt("", n); !got.Equal(time.Unix(1700000001, 2000)) {
		t.Errorf("shownAt from the ref: %s", got)
	}
	if got := shownAt("1700000009.000000", n); !got.Equal(time.Unix(1700000009, 0)) {
		t.Errorf("shownAt of the clicked message: %s", got)
	}
	if got := shownAt("", handler.Notice{}); !got.IsZero() {
		t.Errorf("shownAt of nothing: %s", got)
	}
}

func TestHistoryBlock(t *testing.T) {
	now := time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)
	month := events.Duration(30 * 24 * time.Hour)
	for _, tt := range []struct {
		h    *events.History
		want string
	}{
		{&events.History{Window: month, Approved: 41, Exact: 3, Principals: []string{"alice", "bob"}},
			"*History:* approved 41 of 41 times in 30 days (3 with these exact arguments), by alice and bob; last denied never"},
		{&events.History{Window: month},
			":warning: *History:* first time: no earlier requests of this tool by this agent in 30 days"},
		{&events.History{Window: month, Approved: 3, Denied: 1, LastDenied: now.Add(-2 * time.Hour)},
			":warning: *History:* approved 3 of 4 times in 30 days (1 denied; none with these exact arguments); last denied 2 hours ago"},
	} {
		b, err := json.Marshal(historyBlock(tt.h, now))
		if err != nil {
			t.Fatal(err)
		}
		var got struct {
			Type string `json:"type"`
			Text struct{ Type, Text string }
		}
		if err := json.Unmarshal(b, &got); err != nil || got.Type != "section" || got.Text.Type != "mrkdwn" || got.Text.Text != tt.want {
			t.Errorf("historyBlock = %s\nwant the section %q", b, tt.want)
		}
	}
	// Without history, a request's message has none.
	a := &Adapter{env: channels.Env{Directory: channels.NewDirectory(&policy.Policy{})}}
	b, _ := json.Marshal(a.requestBlocks(notice(events.Requested{Tool: "t"}, nil)))
	if strings.Contains(string(b), "History") {
		t.Errorf("a request without history: %s", b)
	}
}
