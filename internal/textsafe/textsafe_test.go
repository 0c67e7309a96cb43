package textsafe_test

import (
	"encoding/json"
	"testing"

	"github.com/assent-dev/assent/internal/textsafe"
)

func TestLineAndText(t *testing.T) {
	tests := []struct {
		name     string
		in       string
		wantLine string
		wantText string
	}{
		{"plain", "delete_file /srv/q3.csv", "delete_file /srv/q3.csv", "delete_file /srv/q3.csv"},
		{"empty", "", "", ""},
		{"accents", "café crème", "café crème", "café crème"},
		{"CJK", "删除文件 ファイル", "删除文件 ファイル", "删除文件 ファイル"},
		{"emoji", "ok 👍", "ok 👍", "ok 👍"},
		{"backslash kept", `C:\dir\x1b`, `C:\dir\x1b`, `C:\dir\x1b`},
		{"CSI colour", "\x1b[31mred\x1b[0m", `\x1b[31mred\x1b[0m`, `\x1b[31mred\x1b[0m`},
		{"clear screen", "\x1b[2J", `\x1b[2J`, `\x1b[2J`},
		{"OSC title", "\x1b]0;title\x07", `\x1b]0;title\x07`, `\x1b]0;title\x07`},
		{"NUL and DEL", "a\x00b\x7f", `a\x00b\x7f`, `a\x00b\x7f`},
		{"CR", "approved\rdenied", `approved\rdenied`, `approved\rdenied`},
		{"LF and TAB", "a\nb\tc", `a\nb\tc`, "a\nb\tc"},
		{"C1 CSI", "a\u009b31mb", `a\u009b31mb`, `a\u009b31mb`},
		{"C1 NEL", "a\u0085b", `a\u0085b`, `a\u0085b`},
		{"RLO", "report\u202Efdp.exe", `report\u202efdp.exe`, `report\u202efdp.exe`},
		{"LRI and PDI", "\u2066x\u2069", `\u2066x\u2069`, `\u2066x\u2069`},
		{"LRM RLM ALM", "\u200E\u200F\u061C", `\u200e\u200f\u061c`, `\u200e\u200f\u061c`},
		{"embeddings", "\u202A\u202B\u202C\u202D", `\u202a\u202b\u202c\u202d`, `\u202a\u202b\u202c\u202d`},
		{"zero width", "de\u200Blete\u200C\u200D", `de\u200blete\u200c\u200d`, `de\u200blete\u200c\u200d`},
		{"BOM", "\uFEFFx", `\ufeffx`, `\ufeffx`},
		{"line separators", "a\u2028b\u2029c", `a\u2028b\u2029c`, `a\u2028b\u2029c`},
		{"tag character", "x\U000E0041", `x\U000e0041`, `x\U000e0041`},
		{"invalid UTF-8", "a\xffb\xc3", `a\xffb\xc3`, `a\xffb\xc3`},
		{"mixed", "é\x1b[2J\u202Eé", `é\x1b[2J\u202eé`, `é\x1b[2J\u202eé`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := textsafe.Line(tt.in); got != tt.wantLine {
				t.Errorf("Line(%q) = %q, want %q", tt.in, got, tt.wantLine)
			}
			if got := textsafe.Text(tt.in); got != tt.wantText {
				t.Errorf("Text(%q) = %q, want %q", tt.in, got, tt.wantText)
			}
		})
	}
}

func TestJSON(t *testing.T) {
	tests := []struct {
		name string
		v    any
		want string
	}{
		{"plain", map[string]string{"tool": "café 删除"}, `{"tool":"café 删除"}`},
		{"escape and RLO", map[string]string{"tool": "\x1b[2J\u202Ex"}, `{"tool":"\u001b[2J\u202ex"}`},
		{"DEL and C1", []string{"a\x7fb\u009bc"}, `["a\u007fb\u009bc"]`},
		{"astral format character", []string{"\U000E0041"}, `["\udb40\udc41"]`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := json.Marshal(tt.v)
			if err != nil {
				t.Fatal(err)
			}
			got := textsafe.JSON(b)
			if string(got) != tt.want {
				t.Errorf("JSON(%s) = %s, want %s", b, got, tt.want)
			}
			// The same value, decoded.
			var before, after any
			if err := json.Unmarshal(b, &before); err != nil {
				t.Fatal(err)
			}
			if err := json.Unmarshal(got, &after); err != nil {
				t.Fatalf("JSON output does not decode: %v", err)
			}
			if bs, as := mustMarshal(t, before), mustMarshal(t, after); bs != as {
				t.Errorf("value changed: %s, want %s", as, bs)
			}
		})
	}
}

func mustMarshal(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// Nothing to replace: the string is returned as it is, without copying.
func TestLineNoAllocation(t *testing.T) {
	s := "delete_file /srv/reports/q3.csv for carol (é, 删除)"
	if n := testing.AllocsPerRun(100, func() { _ = textsafe.Line(s) }); n != 0 {
		t.Errorf("Line allocates %.0f times for safe text", n)
	}
}
