package argview

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestOfEveryKeyInSight(t *testing.T) {
	body := strings.Repeat("Dear customer, ", 220) // 3,300 characters
	// Written with body first, as an agent hiding the recipient would
	// (body is ASCII, so Go's quoting is JSON's).
	args := json.RawMessage(`{"body":` + strconv.Quote(body) + `,"subject":"Invoice","to":"mallory@example.com","cc":["a","b"]}`)
	v := Of(args, Limits{})
	if !v.Object || len(v.Args) != 4 {
		t.Fatalf("view %+v: want an object of 4 args", v)
	}
	want := []struct {
		key, head string
		more      int
	}{
		{"body", body[:160], 3300 - 160},
		{"subject", "Invoice", 0},
		{"to", "mallory@example.com", 0},
		{"cc", `["a","b"]`, 0},
	}
	for i, w := range want {
		a := v.Args[i]
		if a.Key != w.key || a.More != w.more || a.Head != strings.TrimRight(w.head, " ") {
			t.Errorf("arg %d = {%q %q more %d}, want {%q %q more %d}", i, a.Key, a.Head, a.More, w.key, w.head, w.more)
		}
		if utf8.RuneCountInString(a.Head)+a.More != utf8.RuneCountInString(a.Value) {
			t.Errorf("arg %d: head %d + more %d != value %d", i, utf8.RuneCountInString(a.Head), a.More, utf8.RuneCountInString(a.Value))
		}
	}
	if !v.Cut() || v.Hidden() != 3300-160 {
		t.Errorf("Cut %v Hidden %d", v.Cut(), v.Hidden())
	}
}

func TestOfLines(t *testing.T) {
	v := Of(json.RawMessage(`{"script":"a\nb\nc\nd\ne","x":1}`), Limits{Lines: 2})
	if a := v.Args[0]; a.Head != "a\nb" || a.More != 6 || !a.String {
		t.Errorf("script: %+v", a)
	}
	if a := v.Args[1]; a.Head != "1" || a.More != 0 || a.String {
		t.Errorf("x: %+v", a)
	}
}

func TestOfTotalSharedAmongKeys(t *testing.T) {
	var b strings.Builder
	b.WriteString("{")
	for i := range 50 {
		if i > 0 {
			b.WriteString(",")
		}
		b.WriteString(`"k` + strings.Repeat("x", i%3) + `":"` + strings.Repeat("v", 100) + `"`)
	}
	b.WriteString("}")
	v := Of(json.RawMessage(b.String()), Limits{Total: 1000})
	if len(v.Args) != 50 {
		t.Fatalf("%d args, want 50", len(v.Args))
	}
	for i, a := range v.Args {
		if utf8.RuneCountInString(a.Head) != 24 || a.More != 76 {
			t.Fatalf("arg %d: head %q more %d, want 24 characters and 76 more", i, a.Head, a.More)
		}
	}
}

func TestOfKeysAndUnsafe(t *testing.T) {
	long := strings.Repeat("k", 100)
	v := Of(json.RawMessage(`{"`+long+`":1,"a\u202eb":"x\u001by","a":1,"a":2}`), Limits{})
	if a := v.Args[0]; len(a.Key) != 64 || a.KeyMore != 36 {
		t.Errorf("long key: %q more %d", a.Key, a.KeyMore)
	}
	if a := v.Args[1]; a.Key != `a\u202eb` || a.Value != `x\x1by` {
		t.Errorf("unsafe: key %q value %q", a.Key, a.Value)
	}
	if len(v.Args) != 4 || v.Args[2].Value != "1" || v.Args[3].Value != "2" {
		t.Errorf("a key written twice must show twice: %+v", v.Args)
	}
}

func TestOfNotAnObject(t *testing.T) {
	for _, tc := range []struct {
		in    string
		empty bool
		raw   string
	}{
		{"", true, ""},
		{"null", true, ""},
		{"{}", true, ""},
		{"[1,2]", false, "[1,2]"},
		{`"s"`, false, `"s"`},
		{`{"a":1} {"b":2}`, false, `{"a":1} {"b":2}`},
		{`{"a":`, false, `{"a":`},
	} {
		v := Of(json.RawMessage(tc.in), Limits{})
		if v.Empty() != tc.empty || v.Raw != tc.raw || (tc.raw != "" && v.Object) {
			t.Errorf("Of(%q) = %+v", tc.in, v)
		}
	}
}
