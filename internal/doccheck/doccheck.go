// Package doccheck reads the code blocks out of Markdown, so that tests can
// check every policy, configuration and command the documentation shows:
// docs_test.go here checks README.md and docs/*.md (docs/testing.md, "The
// docs test", says what each kind of block must pass).
//
// A block is a fenced code block (``` or ~~~, indented as in a list item or
// not). Its info string says what it is: the first word is its language
// (sh, console, yaml, json, conf, go, ...), the other words are attributes.
// A block without an info string is refused. A block that cannot be
// checked says so:
//
//   - the language "text", for output, diagrams and usage lines;
//   - the attribute "excerpt" (```yaml excerpt) for part of a file, or
//     "excerpt FILE" (```yaml excerpt examples/policies/read-only.yaml) to
//     have its lines found in FILE, and FILE checked in its place;
//   - or an HTML comment on the line before the fence, with the reason:
//     <!-- not checked: REASON -->.
//
// Such blocks are counted and listed, never silently passed.
package doccheck

import (
	"strconv"
	"strings"
)

// Block is one fenced code block of a Markdown file.
type Block struct {
	// File is the Markdown file's name, as given to Extract; Line is the
	// line of the opening fence (1-based).
	File string
	Line int
	// Lang is the first word of the info string ("yaml"); Attrs the others.
	Lang  string
	Attrs []string
	// Text is the block's content, with the fence's indentation removed,
	// each line ending in a newline.
	Text string
	// NotChecked is the reason given by a <!-- not checked: REASON -->
	// comment on the line before the fence; "" if there is none.
	NotChecked string
}

// Where is "FILE:LINE", for messages.
func (b Block) Where() string {
	return b.File + ":" + strconv.Itoa(b.Line)
}

// Has reports whether attr is one of b's attributes.
func (b Block) Has(attr string) bool {
	for _, a := range b.Attrs {
		if a == attr {
			return true
		}
	}
	return false
}

// TextLine returns the line of the file that holds line i (0-based) of Text.
func (b Block) TextLine(i int) int { return b.Line + 1 + i }

// notChecked is how a comment before a fence starts.
const notChecked = "<!-- not checked:"

// Extract returns the fenced code blocks of the Markdown text data, read
// from file (for Block.File). An unclosed fence runs to the end, as
// CommonMark has it.
func Extract(file string, data string) []Block {
	lines := strings.Split(data, "\n")
	var blocks []Block
	for i := 0; i < len(lines); i++ {
		indent, fence, info, ok := openFence(lines[i])
		if !ok {
			continue
		}
		b := Block{File: file, Line: i + 1}
		if f := strings.Fields(info); len(f) > 0 {
			b.Lang = f[0]
			if len(f) > 1 {
				b.Attrs = f[1:]
			}
		}
		if i > 0 {
			prev := strings.TrimSpace(lines[i-1])
			if rest, ok := strings.CutPrefix(prev, notChecked); ok {
				b.NotChecked = strings.TrimSpace(strings.TrimSuffix(rest, "-->"))
				if b.NotChecked == "" {
					b.NotChecked = "(no reason given)"
				}
			}
		}
		var text strings.Builder
		for i++; i < len(lines); i++ {
			if closes(lines[i], fence) {
				break
			}
			text.WriteString(dedent(lines[i], indent) + "\n")
		}
		b.Text = text.String()
		blocks = append(blocks, b)
	}
	return blocks
}

// openFence reports whether line opens a fenced code block, with its
// indentation, its fence (``` or ~~~~, ...) and its info string.
func openFence(line string) (indent int, fence, info string, ok bool) {
	trimmed := strings.TrimLeft(line, " ")
	indent = len(line) - len(trimmed)
	if trimmed == "" || trimmed[0] != '`' && trimmed[0] != '~' {
		return 0, "", "", false
	}
	n := 0
	for n < len(trimmed) && trimmed[n] == trimmed[0] {
		n++
	}
	if n < 3 {
		return 0, "", "", false
	}
	info = strings.TrimSpace(trimmed[n:])
	if trimmed[0] == '`' && strings.Contains(info, "`") {
		return 0, "", "", false // inline code, not a fence
	}
	return indent, trimmed[:n], info, true
}

// closes reports whether line closes a block opened by fence: the same
// character, at least as many, nothing after.
func closes(line, fence string) bool {
	t := strings.TrimSpace(line)
	return len(t) >= len(fence) && strings.Trim(t, fence[:1]) == ""
}

// dedent removes up to n leading spaces from line.
func dedent(line string, n int) string {
	for n > 0 && strings.HasPrefix(line, " ") {
		line, n = line[1:], n-1
	}
	return line
}
