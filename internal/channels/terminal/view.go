package terminal

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/charmbracelet/lipgloss"
	"github.com/charmbracelet/x/ansi"
	"github.com/muesli/termenv"
	"github.com/nats-io/nats.go"

	"github.com/assent-dev/assent/internal/argview"
	"github.com/assent-dev/assent/internal/human"
	"github.com/assent-dev/assent/internal/textsafe"
	"github.com/assent-dev/assent/pkg/events"
)

// styles are the terminal's text styles. Without a terminal every style is
// plain; with NO_COLOR set, bold, faint and reverse video remain but no
// color. Nothing on the screen depends on a style alone: the selection has
// a marker, refusals and errors say so in words.
type styles struct {
	plain, bold, dim, sel, cursor, title, err, ok, warn lipgloss.Style
}

func newStyles(out io.Writer) styles {
	r := lipgloss.NewRenderer(out)
	profile := termenv.NewOutput(out).ColorProfile() // a terminal's, NO_COLOR aside
	r.SetColorProfile(profile)
	s := styles{
		plain:  r.NewStyle(),
		bold:   r.NewStyle().Bold(true),
		dim:    r.NewStyle().Faint(true),
		sel:    r.NewStyle().Reverse(true),
		cursor: r.NewStyle(),
		title:  r.NewStyle().Bold(true),
		err:    r.NewStyle().Bold(true),
		ok:     r.NewStyle(),
		warn:   r.NewStyle(),
	}
	if os.Getenv("NO_COLOR") == "" && profile != termenv.Ascii {
		// The 16 basic colors, which every theme maps to something legible.
		s.title = s.title.Foreground(lipgloss.Color("6"))
		s.err = s.err.Foreground(lipgloss.Color("1"))
		s.ok = s.ok.Foreground(lipgloss.Color("2"))
		s.warn = s.warn.Foreground(lipgloss.Color("3"))
	}
	return s
}

// View implements tea.Model.
func (m *model) View() string {
	var body []string
	footer := m.footer()
	room := m.height - len(footer)
	switch m.mode {
	case modeDetail:
		body = m.scrolled(m.detailLines(), room, m.title("Request details"))
	case modeConfirm:
		title := "Approve with edited arguments?"
		if m.draft.refused != "" {
			title = "Edited arguments refused by the input schema"
		}
		body = m.scrolled(m.confirmLines(), room, m.title(title))
	case modeReason, modePayload, modeRemember:
		body = m.promptLines(room)
	case modeEditing:
		body = []string{m.title("Editing the arguments in " + textsafe.Line(m.cfg.editor) + "...")}
	case modeHelp:
		body = m.helpLines()
	default:
		body = m.listLines(room)
	}
	if len(body) > room {
		body = body[:room]
	}
	for len(body) < room {
		body = append(body, "")
	}
	out := append(body, footer...)
	for i, l := range out {
		out[i] = ansi.Truncate(l, m.width, "…")
	}
	return strings.Join(out, "\n")
}

func (m *model) title(s string) string {
	return m.st.title.Render(s)
}

// footer is the message, the status line and the keys.
func (m *model) footer() []string {
	var out []string
	if m.msg != "" {
		st := m.st.ok
		prefix := ""
		if m.msgErr {
			st, prefix = m.st.err, "! "
		}
		for _, l := range wrap(prefix+m.msg, m.width, 2) {
			out = append(out, st.Render(l))
		}
	}
	out = append(out, m.statusLine(), m.st.dim.Render(m.keysLine()))
	return out
}

// statusLine says whether NATS is connected, how many requests wait, and
// who answers.
func (m *model) statusLine() string {
	conn := m.st.ok.Render("connected")
	switch m.cfg.status() {
	case nats.CONNECTED:
	case nats.CLOSED:
		conn = m.st.err.Render("NATS connection closed: quit (q) and start again")
	case nats.DRAINING_SUBS, nats.DRAINING_PUBS:
		conn = m.st.warn.Render("closing")
	default:
		conn = m.st.warn.Render("reconnecting to NATS...")
	}
	parts := []string{conn}
	if !m.loaded {
		parts = append(parts, "loading...")
	} else {
		others := 0
		for _, it := range m.items {
			if it.why != "" {
				others++
			}
		}
		s := fmt.Sprintf("%d pending", len(m.items))
		if others > 0 {
			s += fmt.Sprintf(", %d not yours", others)
			if m.hide {
				s += " (hidden; h shows)"
			} else {
				s += " (h hides)"
			}
		}
		parts = append(parts, s)
	}
	if m.feedErr != "" && m.now.Sub(m.feedErrAt) < feedErrShown {
		parts = append(parts, m.st.warn.Render(textsafe.Line(m.feedErr)+"; retrying"))
	}
	parts = append(parts, "principal "+m.st.bold.Render(m.cfg.principal))
	return strings.Join(parts, " | ")
}

// keysLine lists the keys of the current mode.
func (m *model) keysLine() string {
	switch m.mode {
	case modeDetail:
		// Scrolling is on the screen: "... N more lines (down, pgdown)".
		if m.whole {
			return "a approve  d deny  e edit  s answer  r remember  v fold values  esc back"
		}
		return "a approve  d deny  e edit  s answer  r remember  v whole values  esc back"
	case modeReason:
		return "enter deny  esc cancel  ctrl+c quit"
	case modePayload:
		return "enter approve with this answer  esc cancel  ctrl+c quit"
	case modeRemember:
		return "up/down scope  a approve and remember  d deny and remember  esc cancel"
	case modeConfirm:
		if m.draft.refused != "" {
			return "e edit again (your text is kept)  n discard  up/down scroll"
		}
		return "y approve these arguments  n discard  e edit again  up/down scroll"
	case modeEditing:
		return "save and quit the editor to come back"
	case modeHelp:
		return "any key: back"
	}
	return "a approve  d deny  e edit  s answer  r remember  enter details  ? help  q quit"
}

// Column widths of the list, at 80 columns; the tool's grows with the
// terminal.
const (
	colTool    = 20
	colToolMax = 48
	colAgent   = 14
	colUser    = 10
	colLeft    = 7
	colLevel   = 3
)

// listLines is the list of pending requests, two lines each, scrolled to
// keep the selection in view, then the notices.
func (m *model) listLines(room int) []string {
	notes := m.noticeLines()
	if keep := max(room-3, 0); len(notes) > keep {
		notes = notes[len(notes)-keep:]
	}
	room = max(room-len(notes), 1)
	head := m.title("Pending approvals") + m.st.dim.Render(" for "+m.cfg.principal)
	out := []string{head}
	vis := m.visible()
	switch {
	case !m.loaded:
		out = append(out, "", m.st.dim.Render("  Reading the stream for pending requests..."))
	case len(vis) == 0 && len(m.items) > 0:
		out = append(out, "", m.st.dim.Render(fmt.Sprintf("  Nothing for you; %d hidden that you may not answer: press h to show.", len(m.items))))
	case len(vis) == 0:
		out = append(out, "", m.st.dim.Render("  Nothing waits for an answer. New requests appear here as they arrive."))
	default:
		out = append(out, m.st.dim.Render("  "+m.row("TOOL", "AGENT", "USER", "LEFT", "LV", "RULE")))
		per, extra := 2, 0
		at := 0
		for i, it := range vis {
			if it.ID == m.sel {
				at = i
				extra = len(m.historyLines(it, "    history: ")) // the selected request's
			}
		}
		slots := max((room-len(out)-extra)/per, 1)
		first := 0
		if at >= slots {
			first = at - slots + 1
		}
		for _, it := range vis[first:min(first+slots, len(vis))] {
			out = append(out, m.itemLines(it, it.ID == m.sel)...)
		}
		if rest := len(vis) - min(first+slots, len(vis)); rest > 0 {
			out = append(out, m.st.dim.Render(fmt.Sprintf("  ... %d more below", rest)))
		}
	}
	for len(out) < room {
		out = append(out, "")
	}
	return append(out[:room], notes...)
}

// row lays out the list's columns.
func (m *model) row(tool, agent, user, left, level, rule string) string {
	toolWidth := min(max(colTool+(m.width-80)/2, colTool), colToolMax)
	return pad(tool, toolWidth) + " " + pad(agent, colAgent) + " " + pad(user, colUser) + " " + pad(left, colLeft) + " " + pad(level, colLevel) + " " + rule
}

// itemLines shows one request: its columns, then its hint (or arguments)
// and its state.
func (m *model) itemLines(it *item, selected bool) []string {
	marker := "  "
	if selected {
		marker = "> "
	}
	rule := it.Rule
	if rule == "" {
		rule = "-"
	}
	first := marker + m.row(textsafe.Line(it.Tool), textsafe.Line(orDash(it.Agent)), textsafe.Line(orDash(it.User)),
		left(it.Deadline.Sub(m.now)), fmt.Sprint(it.Level), textsafe.Line(rule))
	second := "    "
	switch {
	case it.why != "":
		second += "not yours: " + it.short + " | "
	case it.sending:
		second += "sending... | "
	case it.waiting:
		second += "sent; waiting for the broker | "
	case !it.sentAt.IsZero():
		second += "sent | "
	}
	switch args := it.argsLine(m.width - ansi.StringWidth(second)); {
	case args == "":
		second += textsafe.Line(it.Hint)
	case it.Hint != "" && m.width-ansi.StringWidth(second+args) > 24:
		second += args + " | " + textsafe.Line(it.Hint)
	default:
		second += args
	}
	first, second = ansi.Truncate(first, m.width, "…"), ansi.Truncate(second, m.width, "…")
	m.drew(it)
	// The selected request's history line comes between its columns and
	// what the agent wrote, so that nothing the agent wrote can push it
	// off.
	var hist []string
	if selected {
		hist = m.historyLines(it, "    history: ")
	}
	switch {
	case it.why != "":
		return append(append([]string{m.st.dim.Render(first)}, dimAll(m.st, hist)...), m.st.dim.Render(second))
	case selected:
		return append(append([]string{m.st.sel.Render(pad(first, m.width))}, hist...), second)
	}
	return []string{first, m.st.dim.Render(second)}
}

// historyLines are the record's line about it, after prefix, on at most
// two lines of the screen's width (the next indented as the first); none
// when its pending event had none.
func (m *model) historyLines(it *item, prefix string) []string {
	line := human.History(it.history, m.now)
	if line == "" {
		return nil
	}
	indent := strings.Repeat(" ", ansi.StringWidth(prefix))
	out := wrap(prefix+textsafe.Line(line), m.width, 2)
	for i := 1; i < len(out); i++ {
		out[i] = ansi.Truncate(indent+out[i], m.width, "…")
	}
	return out
}

// dimAll renders lines faint.
func dimAll(st styles, lines []string) []string {
	for i, l := range lines {
		lines[i] = st.dim.Render(l)
	}
	return lines
}

// drew notes that the screen shows it now, the first time it does: the
// shown_at of an answer to it.
func (m *model) drew(it *item) {
	if !it.drawn.IsZero() {
		return
	}
	if m.cfg.clock != nil {
		it.drawn = m.cfg.clock()
	} else {
		it.drawn = time.Now()
	}
}

// argsLine lays out a request's arguments on one line of at most width
// cells: every key, in the order written, with its value's start (strings
// quoted) and how many characters are left out. Short values show whole,
// shortest first, as long as the others keep room for a start; those share
// what is left. When even that leaves no room for every key, the line has
// the keys alone, as many as fit, and how many more there are. It is "" for
// no arguments.
func argsLine(args json.RawMessage, width int) string {
	whole := argview.Of(args, argview.Limits{Lines: 1, Key: 24, Value: width})
	if !whole.Object {
		return ansi.Truncate(textsafe.Line(whole.Raw), width, "…")
	}
	if whole.Empty() {
		return ""
	}
	room := width + 1 // the last key needs no space after it
	need := make([]int, len(whole.Args))
	for i, a := range whole.Args {
		room -= ansi.StringWidth(a.Key) + 2 // key=, a space
		if a.KeyMore > 0 {
			room--
		}
		if a.String {
			room -= 2
		}
		need[i] = ansi.StringWidth(a.Head)
		if a.More > 0 {
			need[i] += cutMark
		}
	}
	cut := share(need, room, cutMark+8)
	short := argview.Of(args, argview.Limits{Lines: 1, Key: 24, Value: max(cut-cutMark, 8)})
	parts := make([]string, len(whole.Args))
	for i, a := range whole.Args {
		if need[i] > cut {
			a = short.Args[i]
		}
		s := textsafe.Line(a.Head)
		if a.More > 0 {
			s += "…"
		}
		if a.String {
			s = `"` + s + `"`
		}
		if a.More > 0 {
			s += fmt.Sprintf("(%d more)", a.More)
		}
		key := a.Key
		if a.KeyMore > 0 {
			key += "…"
		}
		parts[i] = key + "=" + s
	}
	if line := strings.Join(parts, " "); ansi.StringWidth(line) <= width {
		return line
	}
	// Too many keys for their values: the keys alone, as many as fit.
	line := fmt.Sprintf("%d args:", len(whole.Args))
	for i, a := range whole.Args {
		rest := ""
		if left := len(whole.Args) - i - 1; left > 0 {
			rest = fmt.Sprintf(" +%d (enter)", left)
		}
		if ansi.StringWidth(line+" "+a.Key+rest) > width {
			return line + fmt.Sprintf(" +%d (enter)", len(whole.Args)-i)
		}
		line += " " + a.Key
	}
	return line
}

// argsLine is argsLine of the request's arguments, kept for the width:
// the screen is drawn every second, and the arguments may be long.
func (it *item) argsLine(width int) string {
	if it.line.width != width || it.line.text == nil {
		s := argsLine(it.Args, width)
		it.line.width, it.line.text = width, &s
	}
	return *it.line.text
}

// cutMark is the room argsLine keeps for the mark of a cut value: "…(1234 more)".
const cutMark = 12

// share returns how many cells each value not shown whole may take, when
// values needing need cells each share room: the shortest show whole as long
// as each longer one keeps at least least cells, and the longer ones share
// the rest equally. A value shows whole when it needs no more than share.
func share(need []int, room, least int) int {
	sorted := slices.Sorted(slices.Values(need))
	for i, n := range sorted {
		if left := len(sorted) - i; n+(left-1)*least > room {
			return max(room/left, least)
		}
		room -= n
	}
	return sorted[len(sorted)-1]
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// noticeLines are the latest things that happened, newest last.
func (m *model) noticeLines() []string {
	var out []string
	for _, n := range m.notices {
		out = append(out, m.st.warn.Render(n.at.Format("15:04:05")+" "+n.text))
	}
	return out
}

// scrolled shows lines from the scroll offset under a title, with a marker
// where there is more.
func (m *model) scrolled(lines []string, room int, title string) []string {
	view := max(room-1, 1)
	m.top = min(m.top, max(len(lines)-view, 0))
	out := []string{title}
	end := min(m.top+view, len(lines))
	out = append(out, lines[m.top:end]...)
	if end < len(lines) && len(out) > 1 {
		out[len(out)-1] = m.st.dim.Render(fmt.Sprintf("... %d more lines (down, pgdown)", len(lines)-end))
	}
	return out
}

// maxDetailLines bounds the lines of each whole value in the detail view;
// the editor (e) shows them all.
const maxDetailLines = 2000

// argLines lists the arguments for the detail view: every key, in the order
// written, with a few lines of its value and how many characters are left
// out; with m.whole, the values whole.
func (m *model) argLines(args json.RawMessage) []string {
	title := "Arguments"
	if m.whole {
		title += m.st.dim.Render("   whole values (v folds them)")
	}
	out := []string{m.st.bold.Render(title)}
	v := argview.Of(args, argview.Limits{Key: 40})
	col := 0 // the keys' column: as wide as the longest key of up to 16 cells
	for _, a := range v.Args {
		if w := ansi.StringWidth(a.Key); w <= 16 {
			col = max(col, w)
		}
	}
	room := max(m.width-col-4, 16)
	switch {
	case !v.Object:
		return append(out, m.wrapped("  ", v.Raw, m.width-2, maxDetailLines)...)
	case v.Empty():
		return append(out, m.st.dim.Render("  (none)"))
	case !m.whole:
		// Each value gets three lines, fewer when there are many: about
		// twelve lines in all, never less than one each. A line holds less
		// than room: lines wrap at spaces, and the last keeps room for how
		// many characters are left out.
		line, most := max(room-24, 16), room*9/10*3-24
		v = argview.Of(args, argview.Limits{Key: 40, Lines: 3, Value: most, Total: room * 9 / 10 * 12, MinValue: line})
	}
	indent := strings.Repeat(" ", col+4)
	for _, a := range v.Args {
		key := a.Key
		if a.KeyMore > 0 {
			key += "…"
		}
		value := a.Head
		if m.whole {
			value = a.Value
		}
		if a.String && a.Value == "" {
			value = `""`
		}
		lines := m.wrapped(indent, value, room, maxDetailLines)
		if ansi.StringWidth(key) > col {
			out = append(out, "  "+m.st.bold.Render(key)) // a long key on a line of its own
		} else {
			lines[0] = "  " + m.st.bold.Render(pad(key, col)) + "  " + strings.TrimPrefix(lines[0], indent)
		}
		if !m.whole && a.More > 0 {
			// On the value's last line if it fits there, else below it.
			more := fmt.Sprintf("… %d more characters", a.More)
			if last := len(lines) - 1; ansi.StringWidth(lines[last])+1+len(more) <= m.width {
				lines[last] += " " + m.st.warn.Render(more)
			} else {
				lines = append(lines, indent+m.st.warn.Render(more+" (v shows whole values)"))
			}
		}
		out = append(out, lines...)
	}
	return out
}

// wrapped breaks s (made safe, of several lines) into lines of width cells,
// each after indent, at most maxLines of them.
func (m *model) wrapped(indent, s string, width, maxLines int) []string {
	var out []string
	for _, l := range strings.Split(ansi.Wrap(strings.ReplaceAll(s, "\t", "  "), width, " ,;"), "\n") {
		if len(out) == maxLines {
			out = append(out, indent+m.st.dim.Render("… more lines: press e to see them all in your editor"))
			break
		}
		out = append(out, indent+l)
	}
	return out
}

// detailLines are the request of the detail view, whole.
func (m *model) detailLines() []string {
	it := m.byID[m.focus]
	if it == nil {
		return []string{"The request is no longer pending."}
	}
	field := func(name, value string) string {
		return m.st.bold.Render(pad(name, 10)) + " " + value
	}
	out := []string{
		field("Tool", textsafe.Line(it.Tool)),
		field("Request", it.ID),
		field("Agent", textsafe.Line(orDash(it.Agent))+"   session "+textsafe.Line(orDash(it.Session))+"   user "+textsafe.Line(orDash(it.User))),
	}
	m.drew(it)
	out = append(out,
		field("Deadline", it.Deadline.Local().Format("2006-01-02 15:04:05")+" ("+left(it.Deadline.Sub(m.now))+" left)"),
		field("Rule", textsafe.Line(orDash(it.Rule))+fmt.Sprintf("   level %d", it.Level)),
	)
	// The record's line, from the broker: above all the agent wrote.
	if line := human.History(it.history, m.now); line != "" {
		for i, l := range wrap(textsafe.Line(line), max(m.width-11, 20), 4) {
			name := ""
			if i == 0 {
				name = "History"
			}
			out = append(out, field(name, l))
		}
	}
	out = append(out, field("Approvers", textsafe.Line(orDash(strings.Join(it.Approvers, ", ")))))
	if t := it.Terms; t != nil {
		terms := fmt.Sprintf("quorum %d", max(t.Quorum, 1))
		if t.AllowSelfApproval {
			terms += ", self-approval allowed"
		}
		if t.Remember != nil {
			terms += fmt.Sprintf(", may be remembered (%s, up to %s)", strings.Join(t.Remember.Scopes, ", "), t.Remember.MaxTTL.Std())
		} else {
			terms += ", may not be remembered"
		}
		out = append(out, field("Terms", terms))
	}
	if it.why != "" {
		out = append(out, "", m.st.err.Render("You may not answer this request: "+textsafe.Line(it.why)))
	}
	// The arguments come before what else the agent wrote (the hint), so
	// that a long hint cannot push them off the screen.
	key := argsKey{id: it.ID, width: m.width, whole: m.whole}
	if m.args.key != key {
		m.args.key, m.args.lines = key, m.argLines(it.Args)
	}
	out = append(out, "")
	out = append(out, m.args.lines...)
	if it.Hint != "" {
		out = append(out, "")
		for i, l := range strings.Split(strings.ReplaceAll(textsafe.Text(it.Hint), "\t", "  "), "\n") {
			name := ""
			if i == 0 {
				name = "Hint"
			}
			out = append(out, field(name, l))
		}
	}
	if it.CallID != "" {
		out = append(out, field("Call id", textsafe.Line(it.CallID)))
	}
	if len(it.Labels) > 0 {
		keys := make([]string, 0, len(it.Labels))
		for k := range it.Labels {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for i, k := range keys {
			keys[i] = textsafe.Line(k + "=" + it.Labels[k])
		}
		out = append(out, field("Labels", strings.Join(keys, " ")))
	}
	if it.hasSchema() {
		out = append(out, "", m.st.bold.Render("Response schema")+m.st.dim.Render(" (press s to answer)"))
		out = append(out, lines(prettyJSON(it.ResponseSchema))...)
	}
	return out
}

// confirmLines show the edit as a diff.
func (m *model) confirmLines() []string {
	it := m.byID[m.focus]
	if it == nil {
		return []string{"The request is no longer pending."}
	}
	from := ""
	if it.Agent != "" {
		from = " from " + textsafe.Line(it.Agent)
	}
	out := []string{
		"Approve " + m.st.bold.Render(textsafe.Line(it.Tool)) + from + " with your edit of its arguments?",
	}
	if m.draft.refused != "" {
		// Above the diff, so that it is in sight however long the diff.
		out[0] = "Your edit of the arguments of " + m.st.bold.Render(textsafe.Line(it.Tool)) + from + " cannot be sent:"
		for _, l := range wrap("! "+textsafe.Line(m.draft.refused), m.width, 6) {
			out = append(out, m.st.err.Render(l))
		}
		out = append(out, m.st.dim.Render("Nothing was sent. Press e to fix them (your text is kept), or n to discard them."))
	}
	out = append(out, m.st.dim.Render("(- as the agent asked, + as you edited)"), "")
	for _, l := range m.diff {
		switch {
		case strings.HasPrefix(l, "- "):
			out = append(out, m.st.err.Render(l))
		case strings.HasPrefix(l, "+ "):
			out = append(out, m.st.ok.Render(l))
		default:
			out = append(out, m.st.dim.Render(l))
		}
	}
	return out
}

// summary describes a request in a few lines, above a prompt.
func (m *model) summary(it *item) []string {
	head := m.st.bold.Render(textsafe.Line(it.Tool))
	if it.Agent != "" {
		head += " from " + textsafe.Line(it.Agent)
	}
	if it.User != "" {
		head += " for " + textsafe.Line(it.User)
	}
	out := []string{head + m.st.dim.Render("   "+left(it.Deadline.Sub(m.now))+" left   request "+it.ID)}
	m.drew(it)
	out = append(out, m.historyLines(it, "History: ")...)
	if it.Hint != "" {
		out = append(out, "Hint: "+textsafe.Line(it.Hint))
	}
	if args := it.argsLine(m.width - 6); args != "" {
		out = append(out, "Args: "+args)
	}
	return append(out, "")
}

// promptLines are the open prompt: a denial's reason, a structured answer,
// or a remembered answer's scope.
func (m *model) promptLines(room int) []string {
	it := m.byID[m.focus]
	if it == nil {
		return []string{"The request is no longer pending."}
	}
	var out []string
	switch m.mode {
	case modeReason:
		what := "Deny this request?"
		if m.draft.remember != nil {
			what = "Deny this request, and remember the denial (scope " + m.draft.remember.Scope + ")?"
		}
		out = append(out, m.title(what), "")
		out = append(out, m.summary(it)...)
		out = append(out, "Reason:", m.input.View())
	case modePayload:
		out = append(out, m.title("Answer the request's question"), "")
		out = append(out, m.summary(it)...)
		if fields := schemaFields(it.ResponseSchema); len(fields) > 0 {
			out = append(out, "Fields:")
			for _, f := range fields {
				out = append(out, "  "+f)
			}
		} else {
			out = append(out, "Schema: "+strings.Join(lines(it.ResponseSchema), " "))
		}
		out = append(out, "", "Your answer, as JSON (enter approves with it):", m.input.View())
	case modeRemember:
		out = append(out, m.title("Answer, and remember the answer"), "")
		out = append(out, m.summary(it)...)
		out = append(out, "Reuse the answer for later requests of "+m.st.bold.Render(textsafe.Line(it.Tool))+":")
		for i, s := range m.scopes {
			line := "  " + pad(s, 8) + " " + scopeText(it, s)
			if i == m.scope {
				line = m.st.sel.Render(">" + line[1:])
			}
			out = append(out, line)
		}
		if t := it.Terms.Remember; t != nil && t.MaxTTL > 0 {
			out = append(out, "", m.st.dim.Render("Kept for "+t.MaxTTL.Std().String()+", the longest the rule allows."))
		}
	}
	if m.inErr != "" {
		out = append(out, "")
		for _, l := range wrap("! "+m.inErr, m.width, 3) {
			out = append(out, m.st.err.Render(l))
		}
	}
	if room = max(room, 1); len(out) > room {
		out = out[len(out)-room:]
	}
	return out
}

// scopeText says which later requests a scope covers.
func scopeText(it *item, scope string) string {
	switch scope {
	case events.ScopeCall:
		return "the same call: exactly these arguments"
	case events.ScopeSession:
		return "in session " + textsafe.Line(it.Session)
	case events.ScopeAgent:
		return "from agent " + textsafe.Line(it.Agent)
	case events.ScopeUser:
		return "for user " + textsafe.Line(it.User)
	}
	return ""
}

func (m *model) helpLines() []string {
	return []string{
		m.title("Keys"),
		"",
		"  up/down, j/k  select a request          enter   show it in full",
		"  a             approve                   d       deny, with a reason",
		"  e             edit the arguments in $EDITOR, see the diff, then approve",
		"  s             answer the request's question (its response schema)",
		"  r             answer and remember the answer (where the rule allows)",
		"  h             hide or show requests you may not answer",
		"  v             in the details: the arguments' values whole, or folded",
		"  q, ctrl+c     quit                      ?       this help",
		"",
		"In prompts: enter confirms, esc cancels. Every answer goes to the broker,",
		"which decides; a request leaves the list when it is decided anywhere.",
		"",
		m.st.dim.Render("Principal: " + m.cfg.principal + "   Editor: " + textsafe.Line(m.cfg.editor)),
	}
}

// left formats the time left: "45s", "4m05s", "2h03m", "3d04h".
func left(d time.Duration) string {
	d = d.Truncate(time.Second)
	switch {
	case d <= 0:
		return "0s"
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm%02ds", int(d.Minutes()), int(d.Seconds())%60)
	case d < 24*time.Hour:
		return fmt.Sprintf("%dh%02dm", int(d.Hours()), int(d.Minutes())%60)
	}
	return fmt.Sprintf("%dd%02dh", int(d.Hours())/24, int(d.Hours())%24)
}

// pad truncates or pads s to w cells.
func pad(s string, w int) string {
	s = ansi.Truncate(s, w, "…")
	if n := ansi.StringWidth(s); n < w {
		s += strings.Repeat(" ", w-n)
	}
	return s
}

// wrap breaks s into at most maxLines lines of width cells, at spaces.
func wrap(s string, width, maxLines int) []string {
	var out []string
	for len(out) < maxLines {
		if ansi.StringWidth(s) <= width {
			return append(out, s)
		}
		cut := ansi.Truncate(s, width, "")
		if i := strings.LastIndexByte(cut, ' '); i > width/2 {
			cut = cut[:i]
		}
		out = append(out, cut)
		s = strings.TrimLeft(s[len(cut):], " ")
	}
	if s != "" && len(out) > 0 {
		out[len(out)-1] = ansi.Truncate(out[len(out)-1], width-1, "") + "…"
	}
	return out
}
