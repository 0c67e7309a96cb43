package doccheck

import (
	"strings"
)

// Command is one simple command of a shell block: what a pipe, a list
// (; && || &) or a new line separates.
type Command struct {
	// Line is the line of the block's Text the command starts on (0-based).
	Line int
	// Env holds the leading assignments (and those of export): NAME=VALUE.
	Env []string
	// Args are the words, unquoted; a word that expands something ($X,
	// $(...), `...`) keeps its $ or backquote, so that Expands sees it.
	Args []string
	// Synopsis is set when the command has [optional] parts: a usage line
	// rather than a command to run.
	Synopsis bool
}

// Expands reports whether word has a shell expansion in it: it cannot be
// known without running a shell.
func Expands(word string) bool {
	return strings.ContainsAny(word, "$`*?~")
}

// keywords start or continue compound commands; the command after them is
// a command of its own.
var keywords = map[string]bool{"do": true, "then": true, "else": true, "done": true, "fi": true, "{": true, "}": true, "!": true}

// Commands splits the shell text into simple commands. It knows quotes,
// backslashes, comments, line continuations, $(...) and the operators
// | || & && ; and new lines, which is what documentation needs; for and
// while headers are dropped, keywords (do, then, ...) and subshell
// parentheses are removed. Inside [ ... ] (a usage line), | is a word.
func Commands(text string) []Command {
	var cmds []Command
	var cur Command
	var word strings.Builder
	inWord, quoted, redirect := false, false, false
	line, depth := 0, 0
	endWord := func() {
		if !inWord {
			return
		}
		w := word.String()
		word.Reset()
		inWord = false
		wasQuoted := quoted
		quoted = false
		if redirect {
			redirect = false
			return
		}
		if !wasQuoted {
			if strings.HasPrefix(w, "[") {
				depth++
				cur.Synopsis = true
			}
			if strings.HasSuffix(w, "]") && depth > 0 {
				depth--
			}
			if len(cur.Args) == 0 && keywords[w] {
				return
			}
		}
		if len(cur.Args) == 0 && isAssignment(w) {
			cur.Env = append(cur.Env, w)
			return
		}
		if len(cur.Args) == 0 && w == "export" {
			return
		}
		cur.Args = append(cur.Args, w)
	}
	endCmd := func() {
		endWord()
		if len(cur.Args) > 0 || len(cur.Env) > 0 {
			if !(len(cur.Args) > 0 && (cur.Args[0] == "for" || cur.Args[0] == "while" || cur.Args[0] == "until" || cur.Args[0] == "if")) {
				cmds = append(cmds, cur)
			}
		}
		cur = Command{Line: line}
		depth = 0
	}
	cur.Line = 0
	for i := 0; i < len(text); i++ {
		c := text[i]
		switch {
		case c == '\\' && i+1 < len(text) && text[i+1] == '\n':
			i++
			line++
		case c == '\\' && i+1 < len(text):
			word.WriteByte(text[i+1])
			inWord = true
			i++
		case c == '\'':
			j := strings.IndexByte(text[i+1:], '\'')
			if j < 0 {
				j = len(text) - i - 1
			}
			s := text[i+1 : i+1+j]
			line += strings.Count(s, "\n")
			word.WriteString(s)
			inWord, quoted = true, true
			i += j + 1
		case c == '"':
			i++
			for ; i < len(text) && text[i] != '"'; i++ {
				if text[i] == '\\' && i+1 < len(text) && strings.IndexByte("\"\\$`\n", text[i+1]) >= 0 {
					i++
					if text[i] == '\n' {
						line++
						continue
					}
				} else if text[i] == '$' && i+1 < len(text) && text[i+1] == '(' {
					j := subst(text, i+1)
					word.WriteString(text[i:j])
					line += strings.Count(text[i:j], "\n")
					i = j - 1
					continue
				}
				if text[i] == '\n' {
					line++
				}
				word.WriteByte(text[i])
			}
			inWord, quoted = true, true
		case c == '$' && i+1 < len(text) && text[i+1] == '(':
			j := subst(text, i+1)
			word.WriteString(text[i:j])
			line += strings.Count(text[i:j], "\n")
			inWord = true
			i = j - 1
		case c == '#' && !inWord:
			for i+1 < len(text) && text[i+1] != '\n' {
				i++
			}
		case c == '\n':
			endCmd()
			line++
			cur.Line = line
		case c == ' ' || c == '\t':
			endWord()
		case c == '|' && depth > 0:
			endWord()
			cur.Args = append(cur.Args, "|")
		case c == '&' && i+1 < len(text) && text[i+1] == '>' || c == '>' || c == '<':
			// A redirection operator (2>, &>, >>, <): the word after it is
			// its file.
			if inWord && !quoted && strings.Trim(word.String(), "0123456789") == "" {
				word.Reset()
				inWord = false
			}
			endWord()
			for i+1 < len(text) && strings.IndexByte("<>&", text[i+1]) >= 0 {
				i++
			}
			redirect = true
		case c == ';' || c == '&' || c == '|':
			if i+1 < len(text) && (text[i+1] == c) {
				i++
			}
			endCmd()
			cur.Line = line
		case c == '(' || c == ')':
			// A subshell's: the commands in it are commands.
			endWord()
		default:
			word.WriteByte(c)
			inWord = true
		}
	}
	endCmd()
	return cmds
}

// subst returns the index just after the parenthesis that closes the one
// at text[open], skipping quoted text.
func subst(text string, open int) int {
	depth := 0
	for i := open; i < len(text); i++ {
		switch text[i] {
		case '(':
			depth++
		case ')':
			depth--
			if depth == 0 {
				return i + 1
			}
		case '\'', '"':
			if j := strings.IndexByte(text[i+1:], text[i]); j >= 0 {
				i += j + 1
			}
		}
	}
	return len(text)
}

// isAssignment reports whether w is NAME=VALUE.
func isAssignment(w string) bool {
	name, _, ok := strings.Cut(w, "=")
	if !ok || name == "" {
		return false
	}
	for i, r := range name {
		if !(r == '_' || r >= 'A' && r <= 'Z' || r >= 'a' && r <= 'z' || i > 0 && r >= '0' && r <= '9') {
			return false
		}
	}
	return true
}
