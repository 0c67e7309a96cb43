package terminal

import (
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"
)

// screen is the little of a VT100 the tests need to know what a terminal
// shows: printable text, CR, LF, backspace, tab, cursor moves and
// positioning, erasing in line and in display, and the alternate screen,
// which starts blank. Colors and other attributes are dropped; so are the
// sequences it does not know. Text past the right margin is dropped, as the
// program truncates its lines to the width anyway.
type screen struct {
	w, h     int
	cells    [][]rune
	row, col int
	saved    [2]int

	state  int // one of the st* constants
	params []byte
	utf    []byte
}

const (
	stGround = iota
	stEsc
	stCSI
	stString    // OSC, DCS, PM, APC: up to BEL or ESC \
	stStringEsc // ESC inside a string
	stCharset   // ESC ( and friends: one more byte
)

func newScreen(w, h int) *screen {
	s := &screen{w: w, h: h}
	s.clear()
	return s
}

func (s *screen) clear() {
	s.cells = make([][]rune, s.h)
	for i := range s.cells {
		s.cells[i] = blank(s.w)
	}
}

func blank(w int) []rune {
	l := make([]rune, w)
	for i := range l {
		l[i] = ' '
	}
	return l
}

// write interprets b; sequences may be split across calls.
func (s *screen) write(b []byte) {
	for _, c := range b {
		s.byte(c)
	}
}

func (s *screen) byte(c byte) {
	switch s.state {
	case stEsc:
		s.escape(c)
		return
	case stCSI:
		if c >= 0x40 && c <= 0x7e {
			s.csi(string(s.params), c)
			s.state = stGround
			return
		}
		s.params = append(s.params, c)
		return
	case stString:
		switch c {
		case 0x07:
			s.state = stGround
		case 0x1b:
			s.state = stStringEsc
		}
		return
	case stStringEsc:
		s.state = stString
		if c == '\\' {
			s.state = stGround
		}
		return
	case stCharset:
		s.state = stGround
		return
	}
	if len(s.utf) > 0 || c >= 0x80 {
		s.utf = append(s.utf, c)
		if utf8.FullRune(s.utf) {
			r, _ := utf8.DecodeRune(s.utf)
			s.utf = s.utf[:0]
			s.put(r)
		}
		return
	}
	switch c {
	case 0x1b:
		s.state = stEsc
	case '\r':
		s.col = 0
	case '\n':
		s.lineFeed()
	case '\b':
		s.col = max(s.col-1, 0)
	case '\t':
		s.col = min((s.col/8+1)*8, s.w-1)
	default:
		if c >= 0x20 && c != 0x7f {
			s.put(rune(c))
		}
	}
}

func (s *screen) put(r rune) {
	if s.col < s.w && s.row < s.h {
		s.cells[s.row][s.col] = r
	}
	s.col = min(s.col+1, s.w)
}

func (s *screen) lineFeed() {
	if s.row < s.h-1 {
		s.row++
		return
	}
	s.cells = append(s.cells[1:], blank(s.w))
}

func (s *screen) escape(c byte) {
	s.state = stGround
	switch c {
	case '[':
		s.state, s.params = stCSI, s.params[:0]
	case ']', 'P', 'X', '^', '_':
		s.state = stString
	case '(', ')', '*', '+', '#', '%':
		s.state = stCharset
	case '7':
		s.saved = [2]int{s.row, s.col}
	case '8':
		s.row, s.col = s.saved[0], s.saved[1]
	case 'M':
		s.row = max(s.row-1, 0)
	case 'D':
		s.lineFeed()
	case 'E':
		s.col = 0
		s.lineFeed()
	case 'c':
		s.clear()
		s.row, s.col = 0, 0
	}
}

func (s *screen) csi(params string, final byte) {
	private := strings.HasPrefix(params, "?")
	params = strings.TrimLeft(params, "?<=>")
	var nums []int
	for _, p := range strings.Split(params, ";") {
		n, _ := strconv.Atoi(p)
		nums = append(nums, n)
	}
	arg := func(i, def int) int {
		if i < len(nums) && nums[i] > 0 {
			return nums[i]
		}
		return def
	}
	switch final {
	case 'H', 'f':
		s.row, s.col = min(arg(0, 1), s.h)-1, min(arg(1, 1), s.w)-1
	case 'A':
		s.row = max(s.row-arg(0, 1), 0)
	case 'B':
		s.row = min(s.row+arg(0, 1), s.h-1)
	case 'C':
		s.col = min(s.col+arg(0, 1), s.w-1)
	case 'D':
		s.col = max(s.col-arg(0, 1), 0)
	case 'E':
		s.row, s.col = min(s.row+arg(0, 1), s.h-1), 0
	case 'F':
		s.row, s.col = max(s.row-arg(0, 1), 0), 0
	case 'G':
		s.col = min(arg(0, 1), s.w) - 1
	case 'd':
		s.row = min(arg(0, 1), s.h) - 1
	case 'K':
		line := s.cells[s.row]
		from, to := s.col, s.w
		switch arg(0, 0) {
		case 1:
			from, to = 0, min(s.col+1, s.w)
		case 2:
			from = 0
		}
		for i := from; i < to; i++ {
			line[i] = ' '
		}
	case 'J':
		switch arg(0, 0) {
		case 0:
			s.csi("0", 'K')
			for r := s.row + 1; r < s.h; r++ {
				s.cells[r] = blank(s.w)
			}
		case 1:
			s.csi("1", 'K')
			for r := 0; r < s.row; r++ {
				s.cells[r] = blank(s.w)
			}
		default:
			s.clear()
		}
	case 'h', 'l':
		if private && (arg(0, 0) == 1049 || arg(0, 0) == 47 || arg(0, 0) == 1047) {
			s.clear()
			s.row, s.col = 0, 0
		}
	}
}

// String returns the screen's lines, trailing blanks removed.
func (s *screen) String() string {
	lines := make([]string, len(s.cells))
	for i, l := range s.cells {
		lines[i] = strings.TrimRight(string(l), " ")
	}
	return strings.TrimRight(strings.Join(lines, "\n"), "\n")
}

func TestScreen(t *testing.T) {
	s := newScreen(10, 3)
	s.write([]byte("\x1b[?1049h\x1b[Hhello\x1b[1;31mX\x1b[0m\r\nwor"))
	s.write([]byte("ld\x1b[K\r\n\x1b]0;title\x07abc\x1b[2;1Hxy\x1b[K"))
	if got, want := s.String(), "helloX\nxy\nabc"; got != want {
		t.Fatalf("screen:\n%q\nwant\n%q", got, want)
	}
	s.write([]byte("\x1b[1;3H\x1b[J"))
	if got, want := s.String(), "he"; got != want {
		t.Fatalf("after erase below: %q, want %q", got, want)
	}
	s.write([]byte("\x1b[3;1H1\n2\n3"))
	// LF keeps the column, as on a terminal in raw mode.
	if got, want := s.String(), "1\n 2\n  3"; got != want {
		t.Fatalf("after scrolling: %q, want %q", got, want)
	}
	s.write([]byte("\x1b[2J\x1b[H\xe2\x80"))
	s.write([]byte("\xa6ok"))
	if got, want := s.String(), "…ok"; got != want {
		t.Fatalf("split UTF-8: %q, want %q", got, want)
	}
}
