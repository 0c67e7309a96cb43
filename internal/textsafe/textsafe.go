// Package textsafe makes untrusted text safe to show on a terminal.
//
// Tool names, arguments, reasons and principals come from agents and
// approvers. Printed as they are, a terminal would act on what they contain:
// escape sequences that clear the screen, move the cursor or set the window
// title, a carriage return that overwrites the line, bidirectional overrides
// (U+202E) that make "fdp.exe" read as "exe.pdf", zero-width characters that
// hide a difference between two names. Line and Text replace such characters
// with visible escapes (\x1b, \r, \u202e) and leave everything else,
// including non-ASCII letters, as it is.
//
// Backslashes are not escaped: the output is for people to read, not to be
// parsed back, so a literal "\x1b" in the input looks the same as an escaped
// ESC.
package textsafe

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Line returns s as one line of display: every control character (C0
// including TAB, CR and LF, DEL, C1), every invisible format character
// (Unicode category Cf: the bidirectional controls U+061C, U+200E, U+200F,
// U+202A-U+202E and U+2066-U+2069, zero-width characters U+200B-U+200D,
// U+FEFF, ...), the line and paragraph separators U+2028 and U+2029, and
// every byte that is not valid UTF-8 is replaced by a visible escape. If
// there is nothing to replace, s is returned as it is.
func Line(s string) string { return escape(s, false) }

// Text is Line for text of several lines: it keeps newlines and tabs.
func Text(s string) string { return escape(s, true) }

// JSON returns encoded JSON with the same characters Line replaces written
// as \u escapes: the same value, decoded, but nothing a terminal acts on.
// The encoding/json package already escapes C0 controls, U+2028 and U+2029,
// and replaces invalid UTF-8; JSON handles what it leaves, such as DEL, C1
// controls and bidirectional overrides. Outside strings valid JSON has only
// ASCII punctuation, digits, letters and whitespace, which are kept.
func JSON(b []byte) []byte {
	if safe(string(b), true) {
		return b
	}
	out := make([]byte, 0, len(b)+16)
	for i := 0; i < len(b); {
		r, size := utf8.DecodeRune(b[i:])
		if r == '\n' || r == '\t' || r == '\r' || !needsEscape(r, size) { // JSON whitespace, or fine
			out = append(out, b[i:i+size]...)
		} else if r == utf8.RuneError { // invalid UTF-8: not valid JSON either
			out = append(out, `\ufffd`...)
		} else {
			out = appendU(out, r)
		}
		i += size
	}
	return out
}

// appendU appends r as JSON \u escapes, as a surrogate pair above U+FFFF.
func appendU(out []byte, r rune) []byte {
	if r > 0xffff {
		r -= 0x10000
		return fmt.Appendf(out, `\u%04x\u%04x`, 0xd800+(r>>10), 0xdc00+(r&0x3ff))
	}
	return fmt.Appendf(out, `\u%04x`, r)
}

func escape(s string, multiline bool) string {
	if safe(s, multiline) {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + 16)
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case multiline && (r == '\n' || r == '\t'):
			b.WriteRune(r)
		case !needsEscape(r, size):
			b.WriteString(s[i : i+size])
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r == '\t':
			b.WriteString(`\t`)
		case r < utf8.RuneSelf || size == 1: // ASCII control, or a byte that is not UTF-8
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case r > 0xffff:
			fmt.Fprintf(&b, `\U%08x`, r)
		default:
			fmt.Fprintf(&b, `\u%04x`, r)
		}
		i += size
	}
	return b.String()
}

// safe reports whether s has nothing to replace.
func safe(s string, multiline bool) bool {
	for i := 0; i < len(s); {
		c := s[i]
		if c >= 0x20 && c < 0x7f || multiline && (c == '\n' || c == '\t') {
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if needsEscape(r, size) {
			return false
		}
		i += size
	}
	return true
}

// needsEscape reports whether rune r, decoded from size bytes, must be escaped.
func needsEscape(r rune, size int) bool {
	switch {
	case r == utf8.RuneError && size == 1:
		return true // not UTF-8
	case r < 0x20 || r == 0x7f:
		return true
	case r < utf8.RuneSelf:
		return false
	case r == '\u2028' || r == '\u2029':
		return true
	}
	return unicode.In(r, unicode.Cc, unicode.Cf)
}
