// Package argview lays out a tool call's arguments for the person asked to
// approve it.
//
// The agent chooses its arguments: their order, their number and their
// length. Shown as one block of JSON, a long first value pushes the others
// out of sight (below a fixed-height box, past a message's size limit, off
// a terminal's screen), so a prompt-injected agent could choose what the
// approver sees above Approve. A View instead lists every top-level key, in
// the order written, each with only the start of its value: at most a few
// lines and a bounded number of characters, and a count of the characters
// left out, so that every key and how much of each value is hidden are in
// sight at once. Surfaces (the web page, Slack, email, the terminal) render
// a View and offer the whole value behind a visible "N more characters"
// control or link.
//
// Keys and values are made safe with textsafe: control and invisible
// characters come out as visible escapes.
package argview

import (
	"bytes"
	"encoding/json"
	"io"
	"strings"
	"unicode/utf8"

	"github.com/assent-dev/assent/internal/textsafe"
)

// Limits bound what a View shows of each argument.
type Limits struct {
	// Value is the most characters (runes) of a value's start; 0 means 160.
	Value int
	// Lines is the most lines of a value's start; 0 means 3.
	Lines int
	// Key is the most characters of a key; 0 means 64.
	Key int
	// Total, when set, shares this many characters among the values: with
	// many keys each value's start gets Total/keys characters, never fewer
	// than MinValue (0 means 24) nor more than Value.
	Total    int
	MinValue int
}

func (l Limits) withDefaults() Limits {
	if l.Value <= 0 {
		l.Value = 160
	}
	if l.Lines <= 0 {
		l.Lines = 3
	}
	if l.Key <= 0 {
		l.Key = 64
	}
	if l.MinValue <= 0 {
		l.MinValue = 24
	}
	return l
}

// Arg is one top-level argument.
type Arg struct {
	// Key is the argument's name, cut to Limits.Key characters; KeyMore
	// counts the characters cut.
	Key     string
	KeyMore int
	// Head is the start of the value: a string as written (without
	// quotes), anything else as compact JSON. More counts the characters
	// of Value left out of Head; 0 when Head is the whole value.
	Head string
	More int
	// Value is the whole value, in the same form as Head.
	Value string
	// String says the value is a JSON string.
	String bool
}

// Cut says some of the argument is not in its Head or Key.
func (a Arg) Cut() bool { return a.More > 0 || a.KeyMore > 0 }

// View is a request's arguments laid out for reading.
type View struct {
	// Args are every top-level key, in the order written (a key written
	// twice appears twice).
	Args []Arg
	// Object is false when the arguments are not a JSON object; Raw is then
	// their text, made safe, and Args is empty.
	Object bool
	Raw    string
}

// Empty says there are no arguments to show.
func (v View) Empty() bool { return v.Object && len(v.Args) == 0 }

// Cut says some argument is shown only in part.
func (v View) Cut() bool {
	for _, a := range v.Args {
		if a.Cut() {
			return true
		}
	}
	return false
}

// Hidden counts the characters left out of the Heads and Keys.
func (v View) Hidden() int {
	n := 0
	for _, a := range v.Args {
		n += a.More + a.KeyMore
	}
	return n
}

// Of lays out args (the JSON of a request's arguments, or of an approver's
// edit) within lim. Empty or null arguments give an empty object View.
func Of(args json.RawMessage, lim Limits) View {
	lim = lim.withDefaults()
	trimmed := bytes.TrimSpace(args)
	if len(trimmed) == 0 || string(trimmed) == "null" {
		return View{Object: true}
	}
	members, ok := split(trimmed)
	if !ok {
		return View{Raw: textsafe.Text(string(trimmed))}
	}
	per := lim.Value
	if lim.Total > 0 && len(members) > 0 {
		per = min(lim.Value, max(lim.MinValue, lim.Total/len(members)))
	}
	out := View{Object: true, Args: make([]Arg, 0, len(members))}
	for _, kv := range members {
		a := Arg{String: kv.str}
		a.Key, a.KeyMore = head(textsafe.Line(kv.key), lim.Key, 1)
		if kv.str {
			a.Value = textsafe.Text(kv.value)
		} else {
			a.Value = string(textsafe.JSON([]byte(kv.value)))
		}
		a.Head, a.More = head(a.Value, per, lim.Lines)
		out.Args = append(out.Args, a)
	}
	return out
}

// head returns the start of s, at most n runes and lines lines, and how
// many runes of s it left out.
func head(s string, n, lines int) (string, int) {
	end, runes := 0, 0
	for i, r := range s {
		if runes == n {
			break
		}
		if r == '\n' {
			lines--
			if lines == 0 {
				break
			}
		}
		runes++
		end = i + utf8.RuneLen(r)
	}
	if end == len(s) {
		return s, 0
	}
	cut := strings.TrimRight(s[:end], " \n")
	return cut, utf8.RuneCountInString(s) - utf8.RuneCountInString(cut)
}

type pair struct {
	key, value string
	str        bool
}

// split reads a JSON object's top-level members in order: string values
// decoded, others compacted. ok is false if raw is not exactly one object.
func split(raw []byte) (out []pair, ok bool) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return nil, false
	}
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return nil, false
		}
		key, _ := t.(string)
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, false
		}
		p := pair{key: key}
		if len(v) > 0 && v[0] == '"' && json.Unmarshal(v, &p.value) == nil {
			p.str = true
		} else {
			var buf bytes.Buffer
			if json.Compact(&buf, v) != nil {
				return nil, false
			}
			p.value = buf.String()
		}
		out = append(out, p)
	}
	if t, err := dec.Token(); err != nil || t != json.Delim('}') {
		return nil, false
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, false
	}
	return out, true
}
