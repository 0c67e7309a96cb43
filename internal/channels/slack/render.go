package slack

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/slack-go/slack"

	"github.com/assent-dev/assent/internal/argview"
	"github.com/assent-dev/assent/internal/channels"
	humanize "github.com/assent-dev/assent/internal/human"
	"github.com/assent-dev/assent/internal/textsafe"
	"github.com/assent-dev/assent/pkg/events"
	"github.com/assent-dev/assent/pkg/handler"
)

// Action ids of the request message's buttons; each button's value is the
// request id.
const (
	actionApprove  = "assent.approve"
	actionDeny     = "assent.deny"
	actionEdit     = "assent.edit"
	actionRemember = "assent.remember"
)

// Callback ids of the modals, and the block (and action) ids of their inputs.
const (
	viewDeny     = "assent.deny"
	viewEdit     = "assent.edit"
	viewRemember = "assent.remember"

	inputReason = "reason"
	inputArgs   = "args"
	inputScope  = "scope"
)

// Limits of what a message shows, well inside Slack's (3000 characters a
// text block, 150 a header, 3000 a text input).
const (
	maxField     = 200
	maxHint      = 1000
	maxReason    = 1000
	maxEditChars = 3000
	maxMentions  = 2000
)

// ref is what a notification made, kept by the runtime for the request's
// later notices and its outcome: the request's messages, the first in
// Channel and TS (as refs were before there could be more), the others in
// More (a direct message to each approver, or the messages an attempt cut
// short left).
type ref struct {
	Channel string    `json:"channel"`
	TS      string    `json:"ts"`
	More    []message `json:"more,omitempty"`
}

// message is one Slack message.
type message struct {
	Channel string `json:"channel"`
	TS      string `json:"ts"`
}

// messages lists every message of r.
func (r ref) messages() []message {
	return append([]message{{r.Channel, r.TS}}, r.More...)
}

// refOf is the ref of messages, nil for none.
func refOf(ms []message) (json.RawMessage, error) {
	if len(ms) == 0 {
		return nil, nil
	}
	r := ref{Channel: ms[0].Channel, TS: ms[0].TS}
	if len(ms) > 1 {
		r.More = ms[1:]
	}
	return json.Marshal(r)
}

// parseRef reads a ref; ok is false for none or one this package did not make.
func parseRef(raw json.RawMessage) (r ref, ok bool) {
	if len(raw) == 0 || json.Unmarshal(raw, &r) != nil {
		return ref{}, false
	}
	return r, r.Channel != "" && r.TS != ""
}

// modalMeta is a modal's private_metadata: which request it answers, the
// channel it was opened from, and the ts of the message whose button opened
// it (when the approver was shown the request).
type modalMeta struct {
	ID      string `json:"id"`
	Channel string `json:"channel,omitempty"`
	TS      string `json:"ts,omitempty"`
}

func (m modalMeta) String() string {
	b, _ := json.Marshal(m)
	return string(b)
}

func parseMeta(s string) (modalMeta, error) {
	var m modalMeta
	if err := json.Unmarshal([]byte(s), &m); err != nil {
		return m, fmt.Errorf("modal metadata: %w", err)
	}
	if err := events.CheckToken("request_id", m.ID); err != nil {
		return m, fmt.Errorf("modal metadata: %w", err)
	}
	return m, nil
}

var mrkdwnEscaper = strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;")

// maxQuoteLines bounds the lines of a quoted text (each costs "> ").
const maxQuoteLines = 20

// esc makes untrusted text (from agents and approvers) safe as one line of
// mrkdwn, of at most n characters: control and invisible characters shown as
// escapes, and &, < and > escaped, so that no mention, link or broadcast
// (<!channel>) can be smuggled into a message. A cut, marked with an
// ellipsis, never splits an escape.
func esc(s string, n int) string { return fit(s, n, escLine) }

func escLine(s string) string { return mrkdwnEscaper.Replace(textsafe.Line(s)) }
func escText(s string) string { return mrkdwnEscaper.Replace(textsafe.Text(s)) }

// fit returns escape(s) if it has at most n characters, else the escapes of
// as many of s's first characters as fit in n-1, and an ellipsis.
func fit(s string, n int, escape func(string) string) string {
	if len(s) <= 4*n {
		if all := escape(s); utf8.RuneCountInString(all) <= n {
			return all
		}
	}
	var b strings.Builder
	count := 0
	for i := 0; i < len(s); {
		_, size := utf8.DecodeRuneInString(s[i:])
		e := escape(s[i : i+size])
		c := utf8.RuneCountInString(e)
		if count+c > n-1 {
			break
		}
		b.WriteString(e)
		count += c
		i += size
	}
	return b.String() + "…"
}

// quote is esc for text of several lines, as a block quote.
func quote(s string, n int) string {
	lines := strings.Split(fit(s, n, escText), "\n")
	if len(lines) > maxQuoteLines {
		lines = append(lines[:maxQuoteLines-1], "…")
	}
	return "> " + strings.Join(lines, "\n> ")
}

// code is esc as inline code. Code spans cannot hold a backtick; one is
// shown as U+02CB (ˋ).
func code(s string, n int) string {
	if s == "" {
		return "_(empty)_"
	}
	return "`" + strings.ReplaceAll(esc(s, n), "`", "ˋ") + "`"
}

// truncate cuts s to at most n runes, marking the cut with an ellipsis.
func truncate(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	return string(r[:n-1]) + "…"
}

func plain(s string, n int) *slack.TextBlockObject {
	return slack.NewTextBlockObject(slack.PlainTextType, truncate(textsafe.Line(s), n), true, false)
}

func mrkdwn(s string) *slack.TextBlockObject {
	return slack.NewTextBlockObject(slack.MarkdownType, s, false, false)
}

// slackTime reads a Slack message timestamp ("1700000000.000247": when
// Slack stored the message, to the microsecond); ok is false for anything
// else.
func slackTime(ts string) (t time.Time, ok bool) {
	sec, frac, _ := strings.Cut(ts, ".")
	s, err := strconv.ParseInt(sec, 10, 64)
	if err != nil || s <= 0 || len(frac) > 6 {
		return time.Time{}, false
	}
	var us int64
	if frac != "" {
		if us, err = strconv.ParseInt(frac+strings.Repeat("0", 6-len(frac)), 10, 64); err != nil || us < 0 {
			return time.Time{}, false
		}
	}
	return time.Unix(s, us*1000).UTC(), true
}

// shownAt is when Slack showed n's request to an approver who acted on the
// message ts: when that message was posted, else when the request's first
// message was; zero if neither is known.
func shownAt(ts string, n handler.Notice) time.Time {
	if t, ok := slackTime(ts); ok {
		return t
	}
	if r, ok := parseRef(n.Ref); ok {
		if t, ok := slackTime(r.TS); ok {
			return t
		}
	}
	return time.Time{}
}

// slackDate shows t in each reader's own time zone, with a UTC fallback.
func slackDate(t time.Time) string {
	return fmt.Sprintf("<!date^%d^{date_short_pretty} at {time}|%s>", t.Unix(), t.UTC().Format("2006-01-02 15:04 UTC"))
}

// human says a duration the way people do: "45 seconds", "12 minutes",
// "2h30m".
func human(d time.Duration) string {
	switch d = d.Round(time.Second); {
	case d < 0:
		return "0 seconds"
	case d < 2*time.Minute:
		return fmt.Sprintf("%d seconds", int(d.Seconds()))
	case d < 2*time.Hour:
		return fmt.Sprintf("%d minutes", int(d.Minutes()))
	case d%time.Hour == 0:
		return fmt.Sprintf("%d hours", int(d.Hours()))
	}
	return strings.TrimSuffix(d.Round(time.Minute).String(), "0s")
}

// How a message shows a request's arguments: every key in the order
// written, each with the start of its value and how many characters were
// left out (argview), over as many section blocks as that takes (Slack
// allows 3000 characters a section's text, 50 blocks a message).
const (
	// argBudget is shared among the values: with many keys each value's
	// start is shorter, never under minArgValue characters, so that every
	// key stays in sight.
	argBudget   = 6000
	maxArgValue = 300
	minArgValue = 8
	maxArgKey   = 60
	// maxSection is the most characters of a section's text (Slack's 3000,
	// with room for the link and the notes).
	maxSection = 2800
	// maxArgBlocks bounds the sections of one list of arguments: a decided
	// request's message shows two (the request's, the approver's edit)
	// besides eight blocks of its own, inside Slack's 50 blocks, and some
	// 30,000 characters in all, under the 40,000 Slack shows of a message.
	maxArgBlocks = 12
)

// argLimits are the argview limits of a message.
var argLimits = argview.Limits{Value: maxArgValue, Key: maxArgKey, Total: argBudget, MinValue: minArgValue}

// argLine shows one argument: its name and the start of its value as code,
// with the count of what is left out.
func argLine(a argview.Arg) string {
	key := "`" + strings.ReplaceAll(escLine(a.Key), "`", "ˋ") + "`"
	switch {
	case a.KeyMore > 0:
		key = "`" + strings.ReplaceAll(escLine(a.Key), "`", "ˋ") + "…`"
	case a.Key == "":
		key = "_(empty name)_"
	}
	line := "• " + key + ": " + code(a.Head, 6*maxArgValue)
	switch {
	case a.More > 0 && a.KeyMore > 0:
		line += fmt.Sprintf(" _(%s more characters; the name %s more)_", count(a.More), count(a.KeyMore))
	case a.More > 0:
		line += fmt.Sprintf(" _(%s more characters)_", count(a.More))
	case a.KeyMore > 0:
		line += fmt.Sprintf(" _(the name %s more characters)_", count(a.KeyMore))
	}
	return line
}

// count writes n with thousands separators: 12,345.
func count(n int) string {
	s := fmt.Sprint(n)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

// argsText shows args as mrkdwn under title, in one text per section block
// (each within Slack's limit): every key with the start of its value, the
// count of characters left out of each, and a link to page (the request in
// the web UI) when there is one. Only past maxArgBlocks sections (some
// hundreds of keys) are keys left out, and the title then says how many.
func argsText(title string, args json.RawMessage, page string) []string {
	lim := argLimits
	v := argview.Of(args, lim)
	head := "*" + title + "*"
	switch {
	case !v.Object:
		c := code(v.Raw, 4*maxArgValue)
		if n := utf8.RuneCountInString(v.Raw); n > 4*maxArgValue {
			c += fmt.Sprintf(" _(not a JSON object; %s characters)_", count(n))
		}
		return []string{head + withLink("\n"+c, page, "Full request")}
	case v.Empty():
		return []string{head + ": none"}
	}
	// The budget counts characters before escaping, which can make them
	// several times longer (& is &amp;): while the keys do not all fit,
	// share less among the values.
	texts, shown := packArgs(v, head, page)
	for shown < len(v.Args) && lim.Total/len(v.Args) > lim.MinValue {
		lim.Total /= 2
		v = argview.Of(args, lim)
		texts, shown = packArgs(v, head, page)
	}
	return texts
}

// packArgs lays v's arguments out in at most maxArgBlocks texts, each
// within maxSection, under head, and returns them with how many arguments
// they show (all, but for some thousands).
func packArgs(v argview.View, head, page string) (texts []string, shown int) {
	label := "Full request"
	if v.Cut() {
		label = "Full arguments"
	}
	link := ""
	if page != "" {
		link = "\n<" + page + "|" + label + ">"
	}
	var b strings.Builder
	size := 0
	reserve := utf8.RuneCountInString(link) + 200 // the title's note
	for _, a := range v.Args {
		l := argLine(a)
		n := utf8.RuneCountInString(l) + 1
		if size+n > maxSection-reserve && b.Len() > 0 {
			if len(texts) == maxArgBlocks-1 {
				break
			}
			texts = append(texts, b.String())
			b.Reset()
			size = 0
		}
		if b.Len() > 0 {
			b.WriteString("\n")
		}
		b.WriteString(l)
		size += n
		shown++
	}
	texts = append(texts, b.String())
	title := fmt.Sprintf("%s (%d)", head, len(v.Args))
	if left := len(v.Args) - shown; left > 0 {
		title = fmt.Sprintf("%s: ⚠ *only the first %d of %d arguments fit in a Slack message; %d more are not shown here*", head, shown, len(v.Args), left)
		if page != "" {
			title += ": <" + page + "|see every argument>"
		}
	}
	texts[0] = title + "\n" + texts[0]
	texts[len(texts)-1] += link
	return texts, shown
}

// withLink appends a link to page labelled label, when there is a page.
func withLink(text, page, label string) string {
	if page == "" {
		return text
	}
	return text + "\n<" + page + "|" + label + ">"
}

// argBlocks are the section blocks of argsText.
func argBlocks(title string, args json.RawMessage, page string) []slack.Block {
	texts := argsText(title, args, page)
	out := make([]slack.Block, len(texts))
	for i, t := range texts {
		out[i] = slack.NewSectionBlock(mrkdwn(t), nil, nil)
	}
	return out
}

// details are the blocks every message about a request starts with: who
// asks, for whom, under which rule (and until when, while it waits), the
// hint, and the arguments.
func details(req handler.Request, rule string, deadline bool, page string) []slack.Block {
	var fields []*slack.TextBlockObject
	for _, f := range []struct{ name, value string }{
		{"Agent", req.Agent}, {"User", req.User}, {"Session", req.Session}, {"Rule", rule},
	} {
		if f.value != "" {
			fields = append(fields, mrkdwn("*"+f.name+"*\n"+esc(f.value, maxField)))
		}
	}
	if deadline && !req.Deadline.IsZero() {
		fields = append(fields, mrkdwn("*Deadline*\n"+slackDate(req.Deadline)))
	}
	var blocks []slack.Block
	if len(fields) > 0 {
		blocks = append(blocks, slack.NewSectionBlock(nil, fields, nil))
	}
	// The arguments come before the hint: the agent writes both, and what
	// runs is what the approver reads first.
	blocks = append(blocks, argBlocks("Arguments", req.Args, page)...)
	if req.Hint != "" {
		blocks = append(blocks, slack.NewSectionBlock(mrkdwn("*Hint from the agent*\n"+quote(req.Hint, maxHint)), nil, nil))
	}
	return blocks
}

// footer names the request, with a link to its page.
func footer(id, page string) slack.Block {
	text := "Request " + code(id, maxField)
	if page != "" {
		text += " · <" + page + "|Open in Assent>"
	}
	return slack.NewContextBlock("", mrkdwn(text))
}

// mentions lists the Slack users of the principals n is for: <@U...> each,
// or their principal names when mentions are off. ok is false if none is
// on Slack.
func (a *Adapter) mentions(n handler.Notice) (text string, ok bool) {
	recipients := a.env.Directory.Recipients(n, channelName)
	names := make([]string, 0, len(recipients))
	for name := range recipients {
		names = append(names, name)
	}
	sort.Strings(names)
	var b strings.Builder
	for i, name := range names {
		part := esc(name, maxField)
		if a.cfg.mention() {
			part = "<@" + esc(recipients[name], maxField) + ">"
		}
		if b.Len()+len(part) > maxMentions {
			fmt.Fprintf(&b, " and %d more", len(names)-i)
			break
		}
		if i > 0 {
			b.WriteString(" ")
		}
		b.WriteString(part)
	}
	return b.String(), len(names) > 0
}

// approversText says who may answer n.
func (a *Adapter) approversText(n handler.Notice) string {
	who, ok := a.mentions(n)
	switch {
	case !ok && len(n.Approvers) == 0:
		who = "any principal of the policy"
	case !ok:
		who = "no one on Slack (" + esc(strings.Join(n.Approvers, ", "), 500) + ")"
	}
	if n.Level > 0 {
		return fmt.Sprintf("*Escalated (level %d) to* %s; earlier approvers may still answer.", n.Level, who)
	}
	return "*Approvers:* " + who
}

// rememberScopes lists the scopes n's answer may be remembered in that the
// request has a value for (a request without a session cannot be remembered
// for its session).
func rememberScopes(n handler.Notice) []string {
	if n.Terms == nil || n.Terms.Remember == nil {
		return nil
	}
	var out []string
	for _, s := range n.Terms.Remember.Scopes {
		switch {
		case s == events.ScopeCall,
			s == events.ScopeSession && n.Session != "",
			s == events.ScopeAgent && n.Agent != "",
			s == events.ScopeUser && n.User != "":
			if !slices.Contains(out, s) {
				out = append(out, s)
			}
		}
	}
	return out
}

// historyBlock is the record's line about requests like the one asked
// (its pending event's history, h, not nil). A first request of its kind,
// or one of a kind people denied, is marked.
func historyBlock(h *events.History, now time.Time) slack.Block {
	line := humanize.History(h, now)
	mark := ""
	if h.Approved+h.Denied+h.Expired <= 0 || h.Denied > 0 {
		mark = ":warning: "
	}
	return slack.NewSectionBlock(mrkdwn(mark+"*History:* "+esc(line, maxHint)), nil, nil)
}

// requestBlocks is the message of a pending request. The record's line
// comes right under the header, above everything the agent wrote, so that
// no argument or hint can push it down.
func (a *Adapter) requestBlocks(n handler.Notice) []slack.Block {
	page := a.env.RequestPage(n.ID)
	blocks := []slack.Block{slack.NewHeaderBlock(plain("Approval needed: "+n.Tool, 150))}
	if n.History != nil {
		blocks = append(blocks, historyBlock(n.History, a.now()))
	}
	blocks = append(blocks, details(n.Request, n.Rule, true, page)...)
	blocks = append(blocks, slack.NewSectionBlock(mrkdwn(a.approversText(n)), nil, nil))
	buttons := []slack.BlockElement{
		slack.NewButtonBlockElement(actionApprove, n.ID, plain("Approve", 75)).WithStyle(slack.StylePrimary),
		slack.NewButtonBlockElement(actionDeny, n.ID, plain("Deny…", 75)).WithStyle(slack.StyleDanger),
		slack.NewButtonBlockElement(actionEdit, n.ID, plain("Edit and approve…", 75)),
	}
	if len(rememberScopes(n)) > 0 {
		buttons = append(buttons, slack.NewButtonBlockElement(actionRemember, n.ID, plain("Approve and remember…", 75)))
	}
	blocks = append(blocks, slack.NewActionBlock("assent.actions", buttons...), footer(n.ID, page))
	return blocks
}

// requestText is the notification text of a pending request.
func requestText(n handler.Notice) string {
	text := "Approval needed: " + esc(n.Tool, maxField)
	if n.Agent != "" {
		text += " for agent " + esc(n.Agent, maxField)
	}
	return text
}

// verb says an outcome: "Approved".
func verb(o events.Outcome) (emoji, word string) {
	switch o {
	case events.Approved:
		return "✅", "Approved"
	case events.Denied:
		return "⛔", "Denied"
	case events.Expired:
		return "⌛", "Expired"
	case events.Cancelled:
		return "🚫", "Cancelled"
	}
	return "•", "Decided (" + string(o) + ")"
}

// outcomeBlocks is the message of a decided request: no buttons.
func (a *Adapter) outcomeBlocks(o handler.Outcome) []slack.Block {
	n, d := o.Notice, o.Decision
	page := a.env.RequestPage(o.RequestID)
	emoji, word := verb(d.Outcome)
	blocks := []slack.Block{slack.NewHeaderBlock(plain(emoji+" "+word+": "+n.Tool, 150))}
	blocks = append(blocks, details(n.Request, n.Rule, false, page)...)
	var by string
	switch {
	case d.Outcome == events.Expired && len(d.DecidedBy) == 0:
		by = "*Expired:* nobody answered before the deadline"
	default:
		by = "*" + word + " by* " + esc(channels.Who(d), 500)
	}
	if !d.DecidedAt.IsZero() {
		by += ", " + slackDate(d.DecidedAt)
	}
	blocks = append(blocks, slack.NewSectionBlock(mrkdwn(by), nil, nil))
	if d.Reason != "" {
		blocks = append(blocks, slack.NewSectionBlock(mrkdwn("*Reason*\n"+quote(d.Reason, maxReason)), nil, nil))
	}
	if d.Edited {
		blocks = append(blocks, argBlocks("Approved with edited arguments", d.Args, page)...)
	}
	return append(blocks, footer(o.RequestID, page))
}

// outcomeText is the notification text of a decided request.
func outcomeText(o handler.Outcome) string {
	_, word := verb(o.Decision.Outcome)
	return word + ": " + esc(o.Notice.Tool, maxField) + " (" + esc(channels.Who(o.Decision), maxField) + ")"
}

// escalationText is the thread reply that tells an escalation's approvers.
func (a *Adapter) escalationText(n handler.Notice) string {
	who, ok := a.mentions(n)
	if !ok {
		who = "No one on Slack"
	}
	return fmt.Sprintf("Escalated (level %d): %s, you may now answer this request. The deadline is %s.", n.Level, who, slackDate(n.Deadline))
}

// reminderText is the thread reply of a reminder.
func (a *Adapter) reminderText(n handler.Notice, now time.Time) string {
	text := fmt.Sprintf("Still waiting for an answer: the deadline is %s, in %s.", slackDate(n.Deadline), human(n.Deadline.Sub(now)))
	if who, ok := a.mentions(n); ok {
		text += " " + who
	}
	return text
}

// modalSummary opens every modal: what is being answered.
func modalSummary(n handler.Notice, what string) slack.Block {
	text := what + " *" + esc(n.Tool, maxField) + "*"
	if n.Agent != "" {
		text += " for agent " + esc(n.Agent, maxField)
	}
	return slack.NewSectionBlock(mrkdwn(text+"."), nil, nil)
}

func reasonInput(optional bool) *slack.InputBlock {
	in := slack.NewPlainTextInputBlockElement(plain("Why? The agent and the audit log see this.", 150), inputReason).
		WithMultiline(true).WithMaxLength(maxReason)
	return slack.NewInputBlock(inputReason, plain("Reason", 2000), nil, in).WithOptional(optional)
}

func modal(callback, title, submit string, meta modalMeta, blocks ...slack.Block) slack.ModalViewRequest {
	return slack.ModalViewRequest{
		Type:            slack.VTModal,
		CallbackID:      callback,
		Title:           plain(title, 24),
		Submit:          plain(submit, 24),
		Close:           plain("Cancel", 24),
		PrivateMetadata: meta.String(),
		Blocks:          slack.Blocks{BlockSet: blocks},
	}
}

// denyModal asks why a request is denied.
func denyModal(n handler.Notice, meta modalMeta) slack.ModalViewRequest {
	return modal(viewDeny, "Deny request", "Deny", meta, modalSummary(n, "Deny"), reasonInput(false))
}

// errArgsTooLong: the arguments do not fit in a Slack text input.
var errArgsTooLong = errors.New("arguments too long to edit in Slack")

// editModal shows the arguments as JSON to edit, and approves with them.
func editModal(n handler.Notice, meta modalMeta) (slack.ModalViewRequest, error) {
	initial := "{}"
	if trimmed := bytes.TrimSpace(n.Args); len(trimmed) > 0 && string(trimmed) != "null" {
		var buf bytes.Buffer
		if err := json.Indent(&buf, trimmed, "", "  "); err != nil {
			return slack.ModalViewRequest{}, fmt.Errorf("arguments: %w", err)
		}
		initial = buf.String()
	}
	if c := utf8.RuneCountInString(initial); c > maxEditChars {
		return slack.ModalViewRequest{}, fmt.Errorf("%w: %d characters, where Slack allows %d", errArgsTooLong, c, maxEditChars)
	}
	args := slack.NewPlainTextInputBlockElement(nil, inputArgs).WithMultiline(true).WithMaxLength(maxEditChars)
	args.InitialValue = initial
	return modal(viewEdit, "Edit and approve", "Approve", meta,
		modalSummary(n, "Approve"),
		slack.NewInputBlock(inputArgs, plain("Arguments (a JSON object)", 2000), plain("The call runs with exactly these arguments.", 150), args),
		reasonInput(true),
	), nil
}

// rememberModal lets the approver pick where the approval is remembered.
func rememberModal(n handler.Notice, meta modalMeta, scopes []string) slack.ModalViewRequest {
	tool := truncate(n.Tool, 40)
	options := make([]*slack.OptionBlockObject, len(scopes))
	for i, s := range scopes {
		var label, desc string
		switch s {
		case events.ScopeCall:
			label, desc = "This exact call", tool+" with these same arguments"
		case events.ScopeSession:
			label, desc = "This session", tool+" in session "+n.Session
		case events.ScopeAgent:
			label, desc = "This agent", tool+" from agent "+n.Agent
		case events.ScopeUser:
			label, desc = "This user", tool+" for user "+n.User
		}
		options[i] = slack.NewOptionBlockObject(s, plain(label, 75), plain(desc, 75))
	}
	radio := slack.NewRadioButtonsBlockElement(inputScope, options...)
	radio.InitialOption = options[0]
	intro := fmt.Sprintf("Approve *%s* now, and approve matching requests without asking", esc(tool, maxField))
	if ttl := n.Terms.Remember.MaxTTL.Std(); ttl > 0 {
		intro += " for the next " + human(ttl)
	}
	intro += "."
	return modal(viewRemember, "Approve and remember", "Approve", meta,
		slack.NewSectionBlock(mrkdwn(intro), nil, nil),
		slack.NewInputBlock(inputScope, plain("Remember for", 2000), nil, radio),
		reasonInput(true),
	)
}
