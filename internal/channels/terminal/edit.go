package terminal

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"sort"
	"strings"

	tea "github.com/charmbracelet/bubbletea"

	"github.com/assent-dev/assent/internal/channels"
	"github.com/assent-dev/assent/internal/textsafe"
	"github.com/assent-dev/assent/pkg/events"
)

// startEdit opens the request's arguments in the editor; editedMsg brings
// the result back.
func (m *model) startEdit(it *item) tea.Cmd {
	if it.Terms != nil && it.Terms.Quorum > 1 {
		m.mode, m.focus = modeList, ""
		m.fail("%s needs %d approvals of the same call, so its arguments cannot be edited: approve them as they are (a) or deny (d).", textsafe.Line(it.Tool), it.Terms.Quorum)
		return nil
	}
	text := it.edit
	if text == nil {
		text = append(pretty(it.Args), '\n')
	}
	f, err := os.CreateTemp("", "assent-args-*.json")
	if err != nil {
		m.fail("Cannot make a file to edit (%v): free space in %s or set TMPDIR, then press e again.", err, os.TempDir())
		return nil
	}
	path := f.Name()
	_, werr := f.Write(text)
	if err := f.Close(); werr == nil {
		werr = err
	}
	if werr != nil {
		_ = os.Remove(path)
		m.fail("Cannot write the file to edit (%v): free space in %s or set TMPDIR, then press e again.", werr, os.TempDir())
		return nil
	}
	cmd := editorCommand(m.cfg.editor, path)
	cmd.Stderr = m.cfg.out
	m.mode, m.focus = modeEditing, it.ID
	id := it.ID
	return tea.ExecProcess(cmd, func(err error) tea.Msg { return editedMsg{id: id, path: path, err: err} })
}

// editorCommand runs editor on path: editor is a program's path, or a shell
// command line ("code --wait") that gets path as its last argument.
func editorCommand(editor, path string) *exec.Cmd {
	if fi, err := os.Stat(editor); err == nil && !fi.IsDir() {
		return exec.Command(editor, path)
	}
	return exec.Command("/bin/sh", "-c", editor+` "$1"`, "editor", path)
}

// edited takes the file the editor returned: edited arguments are shown as a
// diff to confirm before anything is sent.
func (m *model) edited(e editedMsg) tea.Cmd {
	text, rerr := os.ReadFile(e.path)
	_ = os.Remove(e.path)
	m.mode, m.focus, m.top = modeList, "", 0
	it := m.byID[e.id]
	switch {
	case it == nil:
		m.fail("Your edit was not sent: the request was decided or expired while you edited (see the notices).")
		return nil
	case e.err != nil:
		m.fail("The editor %q failed (%v): nothing was sent. Set $VISUAL or $EDITOR to an editor that takes the file as its last argument, then press e again.", m.cfg.editor, e.err)
		return nil
	case rerr != nil:
		m.fail("Cannot read the edited file (%v): nothing was sent; press e to edit again.", rerr)
		return nil
	}
	trimmed := bytes.TrimSpace(text)
	if len(trimmed) == 0 {
		m.fail("You left the arguments empty: nothing was sent. Press e to edit again, or a to approve them unchanged.")
		return nil
	}
	edited, err := readArgs(trimmed)
	if err != nil {
		it.edit = text
		m.fail("The edited arguments are not a JSON object (%v): nothing was sent. Press e to fix them (your text is kept), or a to approve the original.", err)
		return nil
	}
	before, _ := events.CanonicalArgs(it.Args)
	after, _ := events.CanonicalArgs(edited)
	if bytes.Equal(before, after) {
		it.edit = nil
		m.info("You did not change the arguments: nothing was sent. Press a to approve them as they are.")
		return nil
	}
	it.edit = text
	m.diff = lineDiff(lines(pretty(it.Args)), lines(pretty(edited)))
	// Checked as the broker will check them, so that a refusal shows here,
	// with the edit, rather than after it was sent.
	m.draft = draft{id: it.ID, verdict: events.Approve, args: edited, refused: channels.ArgsProblem(it.InputSchema, edited)}
	m.mode, m.focus, m.top = modeConfirm, it.ID, 0
	return nil
}

// readArgs reads edited arguments: one JSON object, valid as args, compacted.
func readArgs(b []byte) (json.RawMessage, error) {
	if !json.Valid(b) {
		var v any
		err := json.Unmarshal(b, &v)
		return nil, err
	}
	if b[0] != '{' {
		return nil, fmt.Errorf("the file holds a JSON %s; the arguments must be an object {...}", jsonKind(b[0]))
	}
	if _, err := events.CanonicalArgs(b); err != nil {
		return nil, err
	}
	var out bytes.Buffer
	if err := json.Compact(&out, b); err != nil {
		return nil, err
	}
	return out.Bytes(), nil
}

func jsonKind(c byte) string {
	switch c {
	case '[':
		return "array"
	case '"':
		return "string"
	case 't', 'f':
		return "boolean"
	case 'n':
		return "null"
	}
	return "number"
}

// pretty returns args indented, keys sorted, as the terminal shows them
// (not yet made safe to print).
func pretty(args json.RawMessage) []byte {
	c, err := events.CanonicalArgs(args)
	if err != nil {
		c = args
	}
	var out bytes.Buffer
	if err := json.Indent(&out, c, "", "  "); err != nil {
		return c
	}
	return out.Bytes()
}

// prettyJSON indents any JSON value, keys as they are.
func prettyJSON(raw json.RawMessage) []byte {
	var out bytes.Buffer
	if err := json.Indent(&out, raw, "", "  "); err != nil {
		return raw
	}
	return out.Bytes()
}

// lines splits JSON text into lines safe to print: textsafe.JSON escapes
// what a terminal acts on inside strings; outside them only JSON's white
// space is left, of which a carriage return or a tab would move the cursor.
func lines(b []byte) []string {
	s := strings.NewReplacer("\r", "", "\t", "  ").Replace(string(textsafe.JSON(b)))
	return strings.Split(s, "\n")
}

// maxDiffCells bounds the work of a diff; beyond it the diff shows every
// line as removed and added.
const maxDiffCells = 4_000_000

// lineDiff returns the lines of a and b marked "  " (kept), "- " (only in
// a) and "+ " (only in b), from a longest common subsequence.
func lineDiff(a, b []string) []string {
	if len(a)*len(b) > maxDiffCells {
		out := make([]string, 0, len(a)+len(b))
		for _, l := range a {
			out = append(out, "- "+l)
		}
		for _, l := range b {
			out = append(out, "+ "+l)
		}
		return out
	}
	// lcs[i][j] is the length of the longest common subsequence of a[i:]
	// and b[j:].
	lcs := make([][]int, len(a)+1)
	for i := range lcs {
		lcs[i] = make([]int, len(b)+1)
	}
	for i := len(a) - 1; i >= 0; i-- {
		for j := len(b) - 1; j >= 0; j-- {
			if a[i] == b[j] {
				lcs[i][j] = lcs[i+1][j+1] + 1
			} else {
				lcs[i][j] = max(lcs[i+1][j], lcs[i][j+1])
			}
		}
	}
	var out []string
	i, j := 0, 0
	for i < len(a) && j < len(b) {
		switch {
		case a[i] == b[j]:
			out = append(out, "  "+a[i])
			i, j = i+1, j+1
		case lcs[i+1][j] >= lcs[i][j+1]:
			out = append(out, "- "+a[i])
			i++
		default:
			out = append(out, "+ "+b[j])
			j++
		}
	}
	for ; i < len(a); i++ {
		out = append(out, "- "+a[i])
	}
	for ; j < len(b); j++ {
		out = append(out, "+ "+b[j])
	}
	return out
}

// schemaInfo is what the terminal reads of a response schema to help with
// the answer: its top-level properties.
type schemaInfo struct {
	Type       any                        `json:"type"`
	Properties map[string]json.RawMessage `json:"properties"`
	Required   []string                   `json:"required"`
}

type propInfo struct {
	Type        any    `json:"type"`
	Enum        []any  `json:"enum"`
	Description string `json:"description"`
	Default     any    `json:"default"`
}

// schemaFields describes the schema's top-level properties, one line each,
// required ones first: "env (string, required): one of prod, staging".
func schemaFields(schema json.RawMessage) []string {
	var s schemaInfo
	if json.Unmarshal(schema, &s) != nil || len(s.Properties) == 0 {
		return nil
	}
	req := map[string]bool{}
	for _, r := range s.Required {
		req[r] = true
	}
	names := make([]string, 0, len(s.Properties))
	for name := range s.Properties {
		names = append(names, name)
	}
	sort.Slice(names, func(i, j int) bool {
		if req[names[i]] != req[names[j]] {
			return req[names[i]]
		}
		return names[i] < names[j]
	})
	var out []string
	for _, name := range names {
		var p propInfo
		_ = json.Unmarshal(s.Properties[name], &p)
		var attrs []string
		if t := typeName(p.Type); t != "" {
			attrs = append(attrs, t)
		}
		if req[name] {
			attrs = append(attrs, "required")
		}
		line := name
		if len(attrs) > 0 {
			line += " (" + strings.Join(attrs, ", ") + ")"
		}
		var notes []string
		if len(p.Enum) > 0 {
			vals := make([]string, len(p.Enum))
			for i, v := range p.Enum {
				b, _ := json.Marshal(v)
				vals[i] = string(b)
			}
			notes = append(notes, "one of "+strings.Join(vals, ", "))
		}
		if p.Description != "" {
			notes = append(notes, p.Description)
		}
		if len(notes) > 0 {
			line += ": " + strings.Join(notes, "; ")
		}
		out = append(out, textsafe.Line(line))
	}
	return out
}

func typeName(t any) string {
	switch t := t.(type) {
	case string:
		return t
	case []any:
		parts := make([]string, 0, len(t))
		for _, x := range t {
			if s, ok := x.(string); ok {
				parts = append(parts, s)
			}
		}
		return strings.Join(parts, "|")
	}
	return ""
}

// payloadTemplate is the start of a structured answer to schema: for an
// object schema, its required properties (all of them if none is required)
// with their defaults or empty values, for the user to fill in.
func payloadTemplate(schema json.RawMessage) string {
	var s schemaInfo
	if json.Unmarshal(schema, &s) != nil || len(s.Properties) == 0 {
		return ""
	}
	names := s.Required
	if len(names) == 0 {
		for name := range s.Properties {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	var b strings.Builder
	b.WriteByte('{')
	n := 0
	for _, name := range names {
		raw, ok := s.Properties[name]
		if !ok {
			continue
		}
		var p propInfo
		_ = json.Unmarshal(raw, &p)
		var v any
		switch {
		case p.Default != nil:
			v = p.Default
		default:
			switch typeName(p.Type) {
			case "string":
				v = ""
			case "integer", "number":
				v = 0
			case "boolean":
				v = false
			case "array":
				v = []any{}
			case "object":
				v = map[string]any{}
			default:
				v = nil
			}
		}
		key, _ := json.Marshal(name)
		val, _ := json.Marshal(v)
		if n > 0 {
			b.WriteString(", ")
		}
		b.Write(key)
		b.WriteString(": ")
		b.Write(val)
		n++
	}
	b.WriteByte('}')
	return textsafe.Line(b.String())
}
