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

	"github.com/assent-dev/assent/internal/argview"
	"github.com/assent-dev/assent/internal/human"
	"github.com/assent-dev/assent/internal/textsafe"
	"github.com/assent-dev/assent/pkg/handler"
)

//go:embed templates
var templateFS embed.FS

var (
	mailHTML = htmltemplate.Must(htmltemplate.New("mail.html").Funcs(htmltemplate.FuncMap{"shown": shown, "valueCell": valueCell}).ParseFS(templateFS, "templates/mail.html"))
	mailText = texttemplate.Must(texttemplate.ParseFS(templateFS, "templates/mail.txt"))
)

// Bounds of what a mail or a page shows of a request.
const (
	// mailFull is how many characters of the values cut in the list a
	// mail shows in full below it, all values together; the link page
	// shows pageFull.
	mailFull = 16_000
	pageFull = 1 << 20
	// maxField bounds one line of the summary (tool, agent, ...).
	maxField = 200
)

// listLimits bound each value's start in the list of arguments: a few lines
// each, less for each value when there are many.
var listLimits = argview.Limits{Value: 160, Lines: 3, Total: 2400, MinValue: 40}

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
	Args      args
	Quorum    int
	Deadline  string // "Mon 2 Jan 2006 15:04 UTC"
	Remaining string // "in 4m 10s"
	// History is the record's line about requests like this one, from its
	// pending event (human.History); "" without one. Notable marks a first
	// request of its kind, or one of a kind people denied.
	History string
	Notable bool
}

// summarize lays out n for people at now, with at most full characters of
// the cut arguments' values in full.
func summarize(n handler.Notice, now time.Time, full int) summary {
	s := summary{
		ID:       textsafe.Line(n.ID),
		Tool:     line(n.Tool),
		Agent:    line(n.Agent),
		User:     line(n.User),
		Session:  line(n.Session),
		Rule:     line(n.Rule),
		Hint:     cut(textsafe.Text(strings.TrimSpace(n.Hint)), 2000),
		Args:     layoutArgs(n.Args, full),
		Deadline: n.Deadline.UTC().Format("Mon 2 Jan 2006 15:04:05 UTC"),
	}
	if s.Agent == "" {
		s.Agent = "(unnamed agent)"
	}
	if h := n.History; h != nil {
		s.History = cut(textsafe.Line(human.History(h, now)), 1000)
		s.Notable = h.Approved+h.Denied+h.Expired <= 0 || h.Denied > 0
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

// args are a request's arguments as a mail or a page shows them: first a
// list of every key, in the order written, with its value's start (the
// argview); then, below, the values the list cuts, in full as far as a
// budget goes.
type args struct {
	argview.View
	Full []fullValue
}

// fullValue is one value the list cuts, shown in full below it.
type fullValue struct {
	Key string
	// Value is the whole value, or its start when the budget ran out;
	// More counts the characters left out, Len those of the whole value.
	Value     string
	Len, More int
	index     int // in the list
}

// layoutArgs lays out raw with at most budget characters of the full
// values.
func layoutArgs(raw json.RawMessage, budget int) args {
	a := args{View: argview.Of(raw, listLimits)}
	if !a.Object {
		a.Raw, a.Full = "", []fullValue{cutValue("", a.View.Raw, budget)}
		return a
	}
	for i, arg := range a.Args {
		if arg.More == 0 || budget <= 0 {
			continue
		}
		f := cutValue(arg.Key, arg.Value, budget)
		f.index = i
		budget -= f.Shown()
		a.Full = append(a.Full, f)
	}
	return a
}

// Where says where the rest of the i-th argument's value is: below, or
// (when the mail's budget ran out) on the link's page.
func (a args) Where(i int) string {
	for _, f := range a.Full {
		if f.index == i {
			return "below"
		}
	}
	return "not in this mail: open Approve or Deny to read it"
}

// cutValue returns v with at most budget characters of it.
func cutValue(key, v string, budget int) fullValue {
	f := fullValue{Key: key, Value: v, Len: utf8.RuneCountInString(v)}
	if f.Len <= budget {
		return f
	}
	i := 0
	for range max(budget, 0) {
		_, size := utf8.DecodeRuneInString(v[i:])
		i += size
	}
	f.Value, f.More = v[:i], f.Len-max(budget, 0)
	return f
}

// shown returns a's value start as the list shows it: "" for an empty
// string would show nothing.
func shown(a argview.Arg) string {
	if a.String && a.Value == "" {
		return `""`
	}
	return a.Head
}

// cell is one value of the HTML part's list.
type cell struct {
	Arg   argview.Arg
	Line  bool // a rule above it
	Where string
}

func valueCell(a args, i int, line bool) cell {
	return cell{Arg: a.Args[i], Line: line, Where: a.Where(i)}
}

// Text is the list of the arguments in the text part: one key a line, the
// values aligned, a cut value's last line saying how much is left out.
func (a args) Text() string {
	switch {
	case !a.Object:
		return "  (not a JSON object; in full below)"
	case a.Empty():
		return "  (none)"
	}
	col := 0 // the keys' column: as wide as the longest key of up to 16 characters
	for _, arg := range a.Args {
		if n := utf8.RuneCountInString(arg.Key); n <= 16 {
			col = max(col, n)
		}
	}
	var b strings.Builder
	for i, arg := range a.Args {
		if i > 0 {
			b.WriteByte('\n')
		}
		key := arg.Key
		if arg.KeyMore > 0 {
			key += fmt.Sprintf("… (%d more characters)", arg.KeyMore)
		}
		key += ":"
		pad := strings.Repeat(" ", max(col+1-utf8.RuneCountInString(key), 0)+1)
		indent := "\n  " + strings.Repeat(" ", col+2)
		b.WriteString("  " + key + pad + strings.ReplaceAll(shown(arg), "\n", indent))
		if arg.More > 0 {
			fmt.Fprintf(&b, " … [%d more characters, %s]", arg.More, a.Where(i))
		}
	}
	return b.String()
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

// Shown counts the characters of Value.
func (f fullValue) Shown() int { return f.Len - f.More }

// Title names a full value: its key and its length.
func (f fullValue) Title() string {
	name := f.Key
	if name == "" {
		name = "The arguments (not a JSON object)"
	}
	if f.More > 0 {
		return fmt.Sprintf("%s: the first %d of %d characters", name, f.Len-f.More, f.Len)
	}
	return fmt.Sprintf("%s, in full (%d characters)", name, f.Len)
}
