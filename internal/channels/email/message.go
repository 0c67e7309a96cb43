package email

import (
	"bytes"
	"embed"
	"encoding/json"
	"fmt"
	htmltemplate "html/template"
	"sort"
	"strconv"
	"strings"
	texttemplate "text/template"
	"time"
	"unicode/utf8"

	"github.com/assent-dev/assent/internal/human"
	"github.com/assent-dev/assent/internal/textsafe"
	"github.com/assent-dev/assent/pkg/handler"
)

//go:embed templates
var templateFS embed.FS

var (
	mailHTML = htmltemplate.Must(htmltemplate.ParseFS(templateFS, "templates/mail.html"))
	mailText = texttemplate.Must(texttemplate.ParseFS(templateFS, "templates/mail.txt"))
)

// Limits of what a mail or a page shows of a request.
const (
	// maxValue is the longest string value of the arguments shown whole,
	// in characters; longer ones are cut.
	maxValue = 300
	// maxItems is how many elements of an array are shown.
	maxItems = 50
	// maxArgs bounds the arguments as shown, in bytes; the rest is cut at
	// a line boundary.
	maxArgs = 8 << 10
	// maxField bounds one line of the summary (tool, agent, ...).
	maxField = 200
)

// field is one labelled line of a request's summary.
type field struct {
	Label, Value string
}

// summary is a pending request as people read it, made safe to show: every
// text from the request has its control and invisible characters made
// visible and is cut to a readable length. Templates escape it on top.
type summary struct {
	ID        string
	Tool      string
	Agent     string
	User      string
	Session   string
	Rule      string
	Hint      string
	Labels    string
	Args      string
	Quorum    int
	Deadline  string // "Mon 2 Jan 2006 15:04 UTC"
	Remaining string // "in 4m 10s"
}

func summarize(n handler.Notice, now time.Time) summary {
	s := summary{
		ID:       textsafe.Line(n.ID),
		Tool:     line(n.Tool),
		Agent:    line(n.Agent),
		User:     line(n.User),
		Session:  line(n.Session),
		Rule:     line(n.Rule),
		Hint:     cut(textsafe.Text(strings.TrimSpace(n.Hint)), 2000),
		Args:     formatArgs(n.Args),
		Deadline: n.Deadline.UTC().Format("Mon 2 Jan 2006 15:04:05 UTC"),
	}
	if s.Agent == "" {
		s.Agent = "(unnamed agent)"
	}
	if n.Terms != nil {
		s.Quorum = n.Terms.Quorum
	}
	if len(n.Labels) > 0 {
		keys := make([]string, 0, len(n.Labels))
		for k := range n.Labels {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		parts := make([]string, len(keys))
		for i, k := range keys {
			parts[i] = k + "=" + n.Labels[k]
		}
		s.Labels = line(strings.Join(parts, ", "))
	}
	if d := n.Deadline.Sub(now); d > 0 {
		s.Remaining = "in " + human.Duration(d)
	} else {
		s.Remaining = "passed"
	}
	return s
}

// Fields lists the summary's labelled lines that have a value.
func (s summary) Fields() []field {
	var out []field
	add := func(label, v string) {
		if v != "" {
			out = append(out, field{label, v})
		}
	}
	add("Tool", s.Tool)
	add("Agent", s.Agent)
	add("User", s.User)
	add("Session", s.Session)
	add("Labels", s.Labels)
	add("Rule", s.Rule)
	if s.Quorum > 1 {
		add("Approvals", strconv.Itoa(s.Quorum)+" needed")
	}
	add("Deadline", s.Deadline+" ("+s.Remaining+")")
	add("Request", s.ID)
	return out
}

// line returns s as one safe line of at most maxField bytes.
func line(s string) string { return cut(textsafe.Line(s), maxField) }

// cut returns s cut to at most n bytes on a character boundary, marked.
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	i := n
	for i > 0 && !utf8.RuneStart(s[i]) {
		i--
	}
	return s[:i] + "…"
}

// formatArgs returns a request's arguments as indented JSON for people:
// strings longer than maxValue characters and arrays longer than maxItems
// are cut, with a note saying how much was left out, and the whole is cut
// at maxArgs bytes. Control and invisible characters come out as \u
// escapes.
func formatArgs(raw json.RawMessage) string {
	t := bytes.TrimSpace(raw)
	if len(t) == 0 || string(t) == "null" || string(t) == "{}" {
		return "(none)"
	}
	dec := json.NewDecoder(bytes.NewReader(t))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return cut(textsafe.Text(string(t)), maxArgs)
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false) // templates escape; \u003c would only confuse
	enc.SetIndent("", "  ")
	if err := enc.Encode(shorten(v)); err != nil {
		return cut(textsafe.Text(string(t)), maxArgs)
	}
	out := string(textsafe.JSON(bytes.TrimRight(buf.Bytes(), "\n")))
	if len(out) <= maxArgs {
		return out
	}
	head := out[:maxArgs]
	if i := strings.LastIndexByte(head, '\n'); i > 0 {
		head = head[:i]
	}
	rest := strings.Count(out[len(head):], "\n")
	return head + fmt.Sprintf("\n… (%d more lines not shown)", rest)
}

// shorten cuts long strings and arrays in a decoded JSON value.
func shorten(v any) any {
	switch v := v.(type) {
	case string:
		return shortString(v)
	case []any:
		if len(v) > maxItems {
			more := len(v) - maxItems
			v = append(v[:maxItems:maxItems], fmt.Sprintf("… (%d more items)", more))
		}
		for i := range v {
			v[i] = shorten(v[i])
		}
		return v
	case map[string]any:
		out := make(map[string]any, len(v))
		for k, e := range v {
			out[shortString(k)] = shorten(e)
		}
		return out
	}
	return v
}

func shortString(s string) string {
	n := utf8.RuneCountInString(s)
	if n <= maxValue {
		return s
	}
	i := 0
	for range maxValue {
		_, size := utf8.DecodeRuneInString(s[i:])
		i += size
	}
	return s[:i] + fmt.Sprintf("… (%d more characters)", n-maxValue)
}

// ago says how long before now t was, as people say it: "just now",
// "2 minutes ago", "3 hours ago".
func ago(t, now time.Time) string {
	d := now.Sub(t)
	unit := func(n int, one string) string {
		if n == 1 {
			return "1 " + one + " ago"
		}
		return strconv.Itoa(n) + " " + one + "s ago"
	}
	switch {
	case d < 45*time.Second:
		return "just now"
	case d < 90*time.Second:
		return "a minute ago"
	case d < time.Hour:
		return unit(int(d.Round(time.Minute)/time.Minute), "minute")
	case d < 48*time.Hour:
		return unit(int(d/time.Hour), "hour")
	}
	return unit(int(d/(24*time.Hour)), "day")
}

// kind is what a mail is about.
type kind int

const (
	kindNew        kind = iota // a new request
	kindEscalation             // an escalation adds the recipient
	kindReminder               // the deadline is near
)

// String names the kind in sent markers and Message-IDs.
func (k kind) String() string {
	switch k {
	case kindEscalation:
		return "escalation"
	case kindReminder:
		return "reminder"
	}
	return "new"
}

// mailView is what the mail templates show to one recipient.
type mailView struct {
	summary
	Kind      kind
	Subject   string
	Preheader string
	Banner    string
	Principal string
	To        string
	Approve   string
	Deny      string
	WebUI     string
}

// Headline says what is asked, in one line.
func (v mailView) Headline() string {
	return v.Agent + " asks to run " + v.Tool
}

// subject returns a mail's subject.
func subject(prefix string, k kind, s summary) string {
	what := cut(s.Tool, 80) + " by " + cut(s.Agent, 60)
	switch k {
	case kindEscalation:
		return prefix + " Escalated to you: approve " + what + "?"
	case kindReminder:
		return prefix + " Reminder, deadline " + s.Remaining + ": approve " + what + "?"
	}
	return prefix + " Approve " + what + "?"
}

// banner is the line above a mail's headline that says why it came.
func banner(k kind, s summary) string {
	switch k {
	case kindEscalation:
		return "Escalated: this request waited without a decision and now asks you too."
	case kindReminder:
		return "Reminder: this request still waits, and its deadline is near (" + s.Remaining + "). Without a decision by then, it expires."
	}
	return ""
}

// render returns the text and HTML bodies of a mail.
func render(v mailView) (text, html string, err error) {
	var t, h bytes.Buffer
	if err := mailText.Execute(&t, v); err != nil {
		return "", "", fmt.Errorf("text part: %w", err)
	}
	if err := mailHTML.Execute(&h, v); err != nil {
		return "", "", fmt.Errorf("HTML part: %w", err)
	}
	return t.String(), h.String(), nil
}
