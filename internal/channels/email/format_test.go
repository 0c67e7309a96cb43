package email

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

func TestFormatArgs(t *testing.T) {
	long := strings.Repeat("é", maxValue+25)
	many := make([]int, maxItems+7)
	manyJSON, _ := json.Marshal(map[string]any{"ids": many})
	huge := map[string]string{}
	for i := range 200 {
		huge[strings.Repeat("k", 3)+string(rune('a'+i%26))+strings.Repeat("x", i)] = strings.Repeat("v", 200)
	}
	hugeJSON, _ := json.Marshal(huge)
	cases := []struct {
		name     string
		args     string
		want     []string
		wantNot  []string
		maxBytes int
	}{
		{"none", ``, []string{"(none)"}, nil, 0},
		{"null", `null`, []string{"(none)"}, nil, 0},
		{"empty", `{}`, []string{"(none)"}, nil, 0},
		{"indented, numbers kept", `{"b":1.50,"a":{"c":[1,2]}}`, []string{"{\n  \"a\": {\n    \"c\": [\n      1,\n      2\n    ]\n  },\n  \"b\": 1.50\n}"}, nil, 0},
		{"markup kept for templates to escape", `{"x":"<b>&"}`, []string{`"x": "<b>&"`}, []string{`\u003c`}, 0},
		{"long string cut", `{"s":"` + long + `"}`, []string{strings.Repeat("é", maxValue) + "… (25 more characters)"}, []string{strings.Repeat("é", maxValue+1)}, 0},
		{"long key cut", `{"` + long + `":1}`, []string{"… (25 more characters)"}, nil, 0},
		{"long array cut", string(manyJSON), []string{"… (7 more items)"}, nil, 0},
		{"huge cut at a line", string(hugeJSON), []string{"more lines not shown)"}, nil, maxArgs + 64},
		{"control characters made visible", `{"f":"a\u202eb\u0007"}`, []string{`a\u202eb\u0007`}, []string{"\u202e", "\a"}, 0},
		{"not JSON", `{"unterminated`, []string{`{"unterminated`}, nil, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := formatArgs(json.RawMessage(c.args))
			for _, w := range c.want {
				if !strings.Contains(got, w) {
					t.Errorf("lacks %q:\n%s", w, got)
				}
			}
			for _, w := range c.wantNot {
				if strings.Contains(got, w) {
					t.Errorf("has %q:\n%s", w, got)
				}
			}
			if c.maxBytes > 0 && len(got) > c.maxBytes {
				t.Errorf("%d bytes, want at most %d", len(got), c.maxBytes)
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
