package events

import (
	"bytes"
	"fmt"
	"unicode"
	"unicode/utf8"
)

// Text checks. Assent refuses text it could only pass on by changing it:
// decoders in Go replace invalid UTF-8 and lone UTF-16 surrogates with
// U+FFFD, decoders in other languages keep or reject them, so an approver
// could see (and a digest could cover) something other than what an agent
// runs. Identifiers are also refused control and invisible format characters,
// which a display cannot show as what they are.

// CheckJSONText reports text in raw that cannot travel unchanged: bytes that
// are not valid UTF-8 (anywhere in raw), and \u escapes of a lone UTF-16
// surrogate inside strings (a high surrogate \ud800-\udbff not followed by a
// low one \udc00-\udfff, or a low one on its own). A proper pair such as
// "\ud83d\ude00" is fine. The error wraps ErrBadText and says at which byte
// the problem starts; it names no field, so callers wrap it (this package
// uses a *FieldError).
//
// raw is expected to be JSON, but its syntax is not checked: use json.Valid
// for that.
func CheckJSONText(raw []byte) error {
	if !utf8.Valid(raw) {
		i := invalidUTF8(raw)
		return fmt.Errorf("%w: invalid UTF-8 (0x%02x) at byte %d", ErrBadText, raw[i], i)
	}
	// In JSON a backslash occurs only inside strings, and starts an escape:
	// two bytes, or six for \uXXXX. Walking from backslash to backslash, each
	// escape taken whole, visits exactly the escapes of the strings.
	for i := 0; i < len(raw); {
		j := bytes.IndexByte(raw[i:], '\\')
		if j < 0 {
			break
		}
		i += j
		r := uEscape(raw, i)
		switch {
		case r < 0: // \" \\ \n ..., or broken (json.Valid refuses that)
			i += 2
		case r >= 0xD800 && r < 0xDC00: // high surrogate: a low one must follow
			if lo := uEscape(raw, i+6); lo >= 0xDC00 && lo < 0xE000 {
				i += 12
				continue
			}
			return loneSurrogate(r, i)
		case r >= 0xDC00 && r < 0xE000:
			return loneSurrogate(r, i)
		default:
			i += 6
		}
	}
	return nil
}

func loneSurrogate(r rune, at int) error {
	return fmt.Errorf("%w: lone surrogate \\u%04x at byte %d", ErrBadText, r, at)
}

// uEscape returns the code unit of the escape \uXXXX at raw[i:], or -1 if
// there is none.
func uEscape(raw []byte, i int) rune {
	if i+6 > len(raw) || raw[i] != '\\' || raw[i+1] != 'u' {
		return -1
	}
	var r rune
	for _, c := range raw[i+2 : i+6] {
		switch {
		case c >= '0' && c <= '9':
			r = r<<4 | rune(c-'0')
		case c >= 'a' && c <= 'f':
			r = r<<4 | rune(c-'a'+10)
		case c >= 'A' && c <= 'F':
			r = r<<4 | rune(c-'A'+10)
		default:
			return -1
		}
	}
	return r
}

// invalidUTF8 returns the offset of the first byte of b that does not start
// valid UTF-8, or -1.
func invalidUTF8(b []byte) int {
	for i := 0; i < len(b); {
		r, size := utf8.DecodeRune(b[i:])
		if r == utf8.RuneError && size == 1 {
			return i
		}
		i += size
	}
	return -1
}

// identifierProblem describes the first character of s that has no place in
// an identifier (tool, session, user, call id, label): invalid UTF-8, a
// control character (Unicode category Cc: C0, DEL, C1) or a format character
// (Cf: bidirectional controls, zero-width characters, U+FEFF, ...). The
// character is shown escaped, with its byte offset. It returns "" when s is
// fine.
func identifierProblem(s string) string {
	for i, r := range s {
		switch {
		case r == utf8.RuneError:
			if _, size := utf8.DecodeRuneInString(s[i:]); size == 1 {
				return fmt.Sprintf("invalid UTF-8 (0x%02x) at byte %d", s[i], i)
			}
		case r < utf8.RuneSelf:
			if r < 0x20 || r == 0x7f {
				return fmt.Sprintf("control character %U at byte %d", r, i)
			}
		case unicode.Is(unicode.Cc, r):
			return fmt.Sprintf("control character %U at byte %d", r, i)
		case unicode.Is(unicode.Cf, r):
			return fmt.Sprintf("format character %U at byte %d", r, i)
		}
	}
	return ""
}

// CheckIdentifier reports the first character of s that has no place in a
// name shown to people (a tool, a session, a user, a label, who cancels):
// invalid UTF-8, a control character (Cc: C0, DEL, C1) or an invisible format
// character (Cf: bidirectional controls, zero-width characters, U+FEFF). The
// error names field, wraps ErrBadText and shows the character escaped with
// its byte offset. Emptiness and length are the caller's to check.
func CheckIdentifier(field, s string) error {
	if p := identifierProblem(s); p != "" {
		return fieldErr(field, fmt.Errorf("%w: %s", ErrBadText, p))
	}
	return nil
}
