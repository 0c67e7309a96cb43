package replay

import (
	"encoding/json"
	"strconv"
)

// scanner reads the JSON of one event in place: member names as slices of
// the input (no copies), values read or skipped as asked. It is lenient
// where a skipped value is concerned and strict about what it reads; on
// anything it does not expect it fails (ok false), and the caller takes the
// broker's own decoder instead, which decides.
type scanner struct {
	b  []byte
	i  int
	ok bool
}

func newScanner(b []byte) scanner { return scanner{b: b, ok: true} }

func (s *scanner) fail() bool {
	s.ok = false
	return false
}

func (s *scanner) ws() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

// peek returns the first byte of the next value (0 at the end).
func (s *scanner) peek() byte {
	s.ws()
	if s.i >= len(s.b) {
		return 0
	}
	return s.b[s.i]
}

// enter starts an object: it consumes its '{'. first is then true; pass it
// to member for each member.
func (s *scanner) enter() bool {
	if !s.ok || s.peek() != '{' {
		return s.fail()
	}
	s.i++
	return true
}

// member returns the name of the object's next member, its ':' consumed,
// and false at the object's end (its '}' consumed) or on an error (ok
// false). A name with escapes is an error.
func (s *scanner) member(first *bool) ([]byte, bool) {
	if !s.ok {
		return nil, false
	}
	c := s.peek()
	if c == '}' {
		s.i++
		return nil, false
	}
	if !*first {
		if c != ',' {
			return nil, s.fail()
		}
		s.i++
		c = s.peek()
	}
	*first = false
	if c != '"' {
		return nil, s.fail()
	}
	start := s.i + 1
	end := start
	for end < len(s.b) && s.b[end] != '"' {
		if s.b[end] == '\\' || s.b[end] < 0x20 {
			return nil, s.fail()
		}
		end++
	}
	if end >= len(s.b) {
		return nil, s.fail()
	}
	s.i = end + 1
	if s.peek() != ':' {
		return nil, s.fail()
	}
	s.i++
	return s.b[start:end], true
}

// str reads a string value; intern, if not nil, keeps one copy of each
// value it sees.
func (s *scanner) str(intern map[string]string) string {
	if !s.ok || s.peek() != '"' {
		s.fail()
		return ""
	}
	start := s.i
	escaped := false
	j := start + 1
	for ; j < len(s.b) && s.b[j] != '"'; j++ {
		switch c := s.b[j]; {
		case c == '\\':
			escaped = true
			j++
		case c < 0x20:
			s.fail()
			return ""
		}
	}
	if j >= len(s.b) {
		s.fail()
		return ""
	}
	s.i = j + 1
	if escaped {
		var v string
		if err := json.Unmarshal(s.b[start:s.i], &v); err != nil {
			s.fail()
		}
		return v
	}
	raw := s.b[start+1 : j]
	if intern != nil {
		if v, ok := intern[string(raw)]; ok {
			return v
		}
		if len(intern) >= 1<<16 {
			clear(intern)
		}
		v := string(raw)
		intern[v] = v
		return v
	}
	return string(raw)
}

// token reads a string value without escapes and returns its bytes (not a
// copy); one with escapes fails.
func (s *scanner) token() []byte {
	if !s.ok || s.peek() != '"' {
		s.fail()
		return nil
	}
	start := s.i + 1
	j := start
	for ; j < len(s.b) && s.b[j] != '"'; j++ {
		if s.b[j] == '\\' || s.b[j] < 0x20 {
			s.fail()
			return nil
		}
	}
	if j >= len(s.b) {
		s.fail()
		return nil
	}
	s.i = j + 1
	return s.b[start:j]
}

// raw returns the next value as it is in the input (not a copy).
func (s *scanner) raw() json.RawMessage {
	s.ws()
	start := s.i
	if !s.skip() {
		return nil
	}
	return s.b[start:s.i]
}

// skip passes over the next value.
func (s *scanner) skip() bool {
	if !s.ok {
		return false
	}
	switch s.peek() {
	case '"':
		j := s.i + 1
		for ; j < len(s.b) && s.b[j] != '"'; j++ {
			if s.b[j] == '\\' {
				j++
			}
		}
		if j >= len(s.b) {
			return s.fail()
		}
		s.i = j + 1
		return true
	case '{', '[':
		depth := 0
		for j := s.i; j < len(s.b); j++ {
			switch s.b[j] {
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					s.i = j + 1
					return true
				}
			case '"':
				j++
				for ; j < len(s.b) && s.b[j] != '"'; j++ {
					if s.b[j] == '\\' {
						j++
					}
				}
			}
		}
		return s.fail()
	case 0, ',', '}', ']', ':':
		return s.fail()
	}
	j := s.i
	for ; j < len(s.b); j++ {
		switch s.b[j] {
		case ',', '}', ']', ' ', '\t', '\n', '\r':
			s.i = j
			return true
		}
	}
	s.i = j
	return true
}

// literal reads the next value's bytes if it is not a string, object or
// array: a number, true, false or null.
func (s *scanner) literal() []byte {
	switch s.peek() {
	case '"', '{', '[':
		s.fail()
		return nil
	}
	return s.raw()
}

// boolean reads true or false.
func (s *scanner) boolean() bool {
	switch string(s.literal()) {
	case "true":
		return true
	case "false":
		return false
	}
	s.fail()
	return false
}

// uint reads a whole number of at least zero.
func (s *scanner) uint() uint64 {
	v, err := strconv.ParseUint(string(s.literal()), 10, 64)
	if err != nil {
		s.fail()
	}
	return v
}

// null reports whether the next value is null, and if so consumes it.
func (s *scanner) null() bool {
	if s.peek() != 'n' {
		return false
	}
	return string(s.literal()) == "null"
}

// array starts an array: it consumes its '['. first is then true; pass it
// to elem before each element.
func (s *scanner) array() bool {
	if !s.ok || s.peek() != '[' {
		return s.fail()
	}
	s.i++
	return true
}

// elem reports whether the array has another element, its ',' consumed;
// false at the array's end (its ']' consumed) or on an error.
func (s *scanner) elem(first *bool) bool {
	if !s.ok {
		return false
	}
	c := s.peek()
	if c == ']' {
		s.i++
		return false
	}
	if !*first {
		if c != ',' {
			return s.fail()
		}
		s.i++
	}
	*first = false
	return true
}

// end reports whether all the input was read well.
func (s *scanner) end() bool {
	return s.ok && s.peek() == 0
}
