package terminal

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/charmbracelet/bubbles/cursor"
	"github.com/charmbracelet/bubbles/textinput"
	tea "github.com/charmbracelet/bubbletea"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/assent-dev/assent/internal/channels"
	"github.com/assent-dev/assent/internal/textsafe"
	"github.com/assent-dev/assent/pkg/events"
	"github.com/assent-dev/assent/pkg/handler"
	"github.com/assent-dev/assent/pkg/policy"
)

// waitNotice is how long after an answer was sent, without a decision, the
// screen says the broker has not decided.
const waitNotice = 3 * time.Second

// Bounds on what the screen keeps.
const (
	maxNotices   = 3
	lapseMemory  = 2 * time.Minute  // a request past its deadline, for its decision
	goneMemory   = time.Hour        // a decided request, against late notices
	feedErrShown = 15 * time.Second // a trouble reading the stream, unless it recurs
)

// config is what the model needs from Run.
type config struct {
	principal string
	dir       *channels.Directory
	editor    string
	out       io.Writer
	status    func() nats.Status
	// answer returns a command that publishes r as the principal's answer
	// to request id and yields a sentMsg.
	answer func(ctx context.Context, id string, r events.Responded) tea.Cmd
	styles styles
	log    *zap.Logger
	// clock says when a request is drawn (an answer's shown_at); nil is
	// time.Now.
	clock func() time.Time
}

// inflight tracks answers being published, so that Run waits for them.
type inflight struct {
	mu     sync.Mutex
	wg     sync.WaitGroup
	closed bool
}

func (f *inflight) start() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return false
	}
	f.wg.Add(1)
	return true
}

// Wait waits for the answers in flight; none start after it is called.
func (f *inflight) Wait() {
	f.mu.Lock()
	f.closed = true
	f.mu.Unlock()
	f.wg.Wait()
}

// answerTimeout bounds publishing one answer.
const answerTimeout = 10 * time.Second

// answerer publishes answers as principal, each tracked by sends.
func answerer(js jetstream.JetStream, principal string, sends *inflight) func(context.Context, string, events.Responded) tea.Cmd {
	return func(ctx context.Context, id string, r events.Responded) tea.Cmd {
		return func() tea.Msg {
			if !sends.start() {
				return sentMsg{id: id, verdict: r.Decision, err: errors.New("the terminal is closing")}
			}
			defer sends.wg.Done()
			// An answer the user gave is finished even if the terminal
			// is closing meanwhile.
			actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), answerTimeout)
			defer cancel()
			return sentMsg{id: id, verdict: r.Decision, err: handler.Answer(actx, js, principal, id, r)}
		}
	}
}

// Messages the model gets besides the feed's.
type (
	tickMsg time.Time
	sentMsg struct {
		id      string
		verdict events.Verdict
		err     error
	}
	editedMsg struct {
		id, path string
		err      error
	}
)

// item is a pending request on the screen.
type item struct {
	handler.Notice
	// why says why the principal may not answer ("" if they may); short is
	// the same for the list.
	why, short string
	sending    bool
	sentAt     time.Time
	sent       events.Verdict
	waiting    bool
	// edit is the user's last edit of the arguments, kept for another try.
	edit []byte
	// history is the record's line about requests like it (nil: none).
	history *events.History
	// drawn is when the screen first showed it (the answer's shown_at),
	// looked that the user opened its details (the answer's detail).
	drawn  time.Time
	looked bool
	// line is the list's line of the arguments, for a width.
	line struct {
		width int
		text  *string
	}
}

// argsKey says for which request, width and fold the detail view's lines
// of arguments were made.
type argsKey struct {
	id    string
	width int
	whole bool
}

func (it *item) hasSchema() bool {
	s := strings.TrimSpace(string(it.ResponseSchema))
	return s != "" && s != "null"
}

// mode is what the screen shows.
type mode int

const (
	modeList     mode = iota
	modeDetail        // one request in full
	modeReason        // a denial's reason
	modePayload       // a structured answer
	modeConfirm       // edited arguments, before approving
	modeRemember      // the scope of a remembered answer
	modeEditing       // the editor runs
	modeHelp
)

// draft is an answer being put together.
type draft struct {
	id       string
	verdict  events.Verdict
	args     json.RawMessage
	payload  json.RawMessage
	remember *events.Remember
	reason   string
	asked    bool // the reason was asked for
	// refused says why the broker would refuse args (they break the
	// request's input_schema): the edit is shown, and cannot be sent.
	refused string
}

// notice is a line about something that happened.
type notice struct {
	text string
	at   time.Time
}

type lapse struct {
	tool string
	at   time.Time
}

// model is the terminal's state. Only the program's event loop touches it.
type model struct {
	ctx context.Context
	cfg config
	st  styles

	items  []*item // in order of arrival
	byID   map[string]*item
	sel    string // selected request
	hide   bool   // hide requests the principal may not answer
	loaded bool   // the feed has caught up
	now    time.Time

	width, height int

	mode  mode
	back  mode   // where help returns to
	focus string // the request an open view or prompt is about
	draft draft
	top   int  // scroll offset of the detail and diff views
	whole bool // the detail view shows the arguments' values whole
	args  struct {
		key   argsKey
		lines []string
	}
	input  textinput.Model
	inErr  string
	scopes []string
	scope  int
	diff   []string

	notices   []notice
	msg       string
	msgErr    bool
	feedErr   string
	feedErrAt time.Time

	lapsed map[string]lapse
	gone   map[string]time.Time
}

func newModel(ctx context.Context, cfg config) *model {
	in := textinput.New()
	in.Prompt = "> "
	in.Cursor.Style = cfg.styles.cursor
	in.Cursor.TextStyle = cfg.styles.plain
	in.TextStyle = cfg.styles.plain
	in.PromptStyle = cfg.styles.bold
	in.PlaceholderStyle = cfg.styles.dim
	in.CompletionStyle = cfg.styles.dim
	in.Cursor.SetMode(cursor.CursorStatic)
	in.Width = 76
	return &model{
		ctx: ctx, cfg: cfg, st: cfg.styles,
		byID: map[string]*item{}, now: time.Now(),
		width: 80, height: 24,
		input:  in,
		lapsed: map[string]lapse{}, gone: map[string]time.Time{},
	}
}

// Init implements tea.Model.
func (m *model) Init() tea.Cmd { return nil }

// Update implements tea.Model.
func (m *model) Update(msg tea.Msg) (tea.Model, tea.Cmd) {
	switch msg := msg.(type) {
	case tea.WindowSizeMsg:
		m.width, m.height = max(msg.Width, 20), max(msg.Height, 6)
		m.input.Width = max(m.width-4, 10)
		return m, nil
	case tickMsg:
		m.tick(time.Time(msg))
		return m, nil
	case batchMsg:
		for _, x := range msg {
			m.apply(x)
		}
		return m, nil
	case sentMsg:
		m.sent(msg)
		return m, nil
	case editedMsg:
		return m, m.edited(msg)
	case tea.KeyMsg:
		return m.key(msg)
	}
	if m.mode == modeReason || m.mode == modePayload {
		var cmd tea.Cmd
		m.input, cmd = m.input.Update(msg)
		return m, cmd
	}
	return m, nil
}

// apply takes one message of the feed.
func (m *model) apply(x tea.Msg) {
	switch x := x.(type) {
	case snapshotMsg:
		m.loaded, m.feedErr = true, ""
		for i := range x {
			m.add(&x[i])
		}
	case *noticeMsg:
		m.feedErr = ""
		if it := m.byID[x.notice.ID]; it != nil {
			merge(&it.Notice, x)
			if x.history != nil {
				it.history = x.history
			}
			m.judge(it)
			return
		}
		m.add(x)
	case decidedMsg:
		m.feedErr = ""
		m.resolve(x.id, x.d)
	case feedErrMsg:
		m.feedErr, m.feedErrAt = x.err.Error(), m.now
	}
}

// add lists a request that is still open.
func (m *model) add(n *noticeMsg) {
	id := n.notice.ID
	if _, ok := m.gone[id]; ok || m.byID[id] != nil || !m.now.Before(n.notice.Deadline) {
		return
	}
	it := &item{Notice: n.notice, history: n.history}
	m.judge(it)
	m.items = append(m.items, it)
	m.byID[id] = it
	if m.sel == "" && m.shown(it) {
		m.sel = id
	}
}

// judge works out whether the principal may answer it, as the broker will.
func (m *model) judge(it *item) {
	it.why, it.short = "", ""
	if m.cfg.dir != nil {
		if err := m.cfg.dir.MayAnswer(m.cfg.principal, it.Notice); err != nil {
			it.why = err.Error()
			switch {
			case errors.Is(err, policy.ErrSelfApproval):
				it.short = "your own request: self-approval is not allowed"
			case errors.Is(err, policy.ErrNotEligible) && len(it.Approvers) > 0:
				it.short = "only " + strings.Join(it.Approvers, ", ") + " may answer"
			default:
				it.short = it.why
			}
			it.why, it.short = textsafe.Line(it.why), textsafe.Line(it.short)
		}
		return
	}
	// Without the policy, the terms the broker sent still say this much.
	if it.Terms != nil && !it.Terms.AllowSelfApproval && it.User != "" && it.User == m.cfg.principal {
		it.why = "the request is made for you (" + m.cfg.principal + ") and its rule does not allow self-approval"
		it.short = "your own request: self-approval is not allowed"
	}
}

// shown reports whether it is in the list as filtered.
func (m *model) shown(it *item) bool { return !m.hide || it.why == "" }

// visible returns the listed requests.
func (m *model) visible() []*item {
	out := make([]*item, 0, len(m.items))
	for _, it := range m.items {
		if m.shown(it) {
			out = append(out, it)
		}
	}
	return out
}

// remove takes request id off the list, keeping the selection in place.
func (m *model) remove(id string) *item {
	it := m.byID[id]
	if it == nil {
		return nil
	}
	vis := m.visible()
	at := slices.Index(vis, it)
	delete(m.byID, id)
	m.items = slices.DeleteFunc(m.items, func(x *item) bool { return x == it })
	if m.sel == id {
		m.sel = ""
		vis = m.visible()
		if len(vis) > 0 {
			m.sel = vis[min(max(at, 0), len(vis)-1)].ID
		}
	}
	return it
}

// resolve handles a decision: the request leaves the list, with a notice,
// and a prompt open for it is withdrawn.
func (m *model) resolve(id string, d handler.Decision) {
	m.gone[id] = m.now
	it := m.remove(id)
	if it == nil {
		if l, ok := m.lapsed[id]; ok {
			delete(m.lapsed, id)
			m.notify(outcome(l.tool, d))
		}
		return
	}
	text := outcome(it.Tool, d)
	m.notify(text)
	if it.sending || !it.sentAt.IsZero() {
		m.msg = "" // "sent; waiting": the notice says how it ended
	}
	m.withdraw(id, "Withdrawn: "+text+".")
}

// withdraw closes the view or prompt open for request id, if any.
func (m *model) withdraw(id, why string) {
	if m.focus != id {
		return
	}
	switch m.mode {
	case modeEditing:
		return // editedMsg reports it when the editor returns
	case modeHelp:
		m.back = modeList
	default:
		m.mode = modeList
	}
	m.focus = ""
	m.input.Blur()
	m.fail("%s", why)
}

// outcome says how a request ended, for people: "deploy approved by bob via
// slack: fine".
func outcome(tool string, d handler.Decision) string {
	var s string
	switch d.Outcome {
	case events.Expired:
		s = "expired: nobody answered in time"
	case events.Approved:
		s = "approved"
		if d.Edited {
			s += " with edited arguments"
		}
		s += " by " + textsafe.Line(channels.Who(d))
	default:
		s = textsafe.Line(string(d.Outcome)) + " by " + textsafe.Line(channels.Who(d))
	}
	s = textsafe.Line(tool) + " " + s
	if d.Reason != "" && d.Outcome != events.Expired {
		s += ": " + textsafe.Line(d.Reason)
	}
	return s
}

func (m *model) notify(text string) {
	m.notices = append(m.notices, notice{text: text, at: m.now})
	if len(m.notices) > maxNotices {
		m.notices = m.notices[len(m.notices)-maxNotices:]
	}
}

func (m *model) info(format string, args ...any) {
	m.msg, m.msgErr = fmt.Sprintf(format, args...), false
}

func (m *model) fail(format string, args ...any) {
	m.msg, m.msgErr = fmt.Sprintf(format, args...), true
}

// tick moves the clock: requests past their deadline leave the list, and
// answers without a decision are reported.
func (m *model) tick(now time.Time) {
	m.now = now
	for _, it := range slices.Clone(m.items) {
		if now.Before(it.Deadline) {
			continue
		}
		m.remove(it.ID)
		m.lapsed[it.ID] = lapse{tool: it.Tool, at: now}
		m.withdraw(it.ID, "Withdrawn: "+textsafe.Line(it.Tool)+" passed its deadline.")
	}
	for _, it := range m.items {
		if it.sentAt.IsZero() || it.waiting || now.Sub(it.sentAt) < waitNotice {
			continue
		}
		it.waiting = true
		more := ""
		if it.Terms != nil && it.Terms.Quorum > 1 && it.sent == events.Approve {
			more = fmt.Sprintf(" (it needs %d approvals)", it.Terms.Quorum)
		}
		m.info("Sent; waiting for the broker: %s is still pending. It may wait for more approvals%s, or the broker refused your answer (see its log).", textsafe.Line(it.Tool), more)
	}
	for id, l := range m.lapsed {
		if now.Sub(l.at) > lapseMemory {
			delete(m.lapsed, id)
			m.notify(textsafe.Line(l.tool) + " passed its deadline and no decision came: is the broker running?")
		}
	}
	for id, at := range m.gone {
		if now.Sub(at) > goneMemory {
			delete(m.gone, id)
		}
	}
}

// selected returns the request keys act on: the one an open view is about,
// else the one selected in the list.
func (m *model) selected() *item {
	if m.focus != "" {
		return m.byID[m.focus]
	}
	if it := m.byID[m.sel]; it != nil && m.shown(it) {
		return it
	}
	return nil
}

// key handles a key press.
func (m *model) key(k tea.KeyMsg) (tea.Model, tea.Cmd) {
	switch k.String() {
	case "ctrl+c":
		return m, tea.Quit
	case "ctrl+z":
		return m, tea.Suspend // back with fg, as any terminal program
	}
	switch m.mode {
	case modeHelp:
		m.mode = m.back
		return m, nil
	case modeEditing:
		return m, nil
	case modeReason, modePayload:
		return m, m.promptKey(k)
	case modeConfirm:
		return m, m.confirmKey(k)
	case modeRemember:
		return m, m.rememberKey(k)
	case modeDetail:
		if cmd, ok := m.detailKey(k); ok {
			return m, cmd
		}
	}
	m.msg = ""
	switch k.String() {
	case "q":
		return m, tea.Quit
	case "?":
		m.back, m.mode = m.mode, modeHelp
	case "up", "k":
		m.move(-1)
	case "down", "j":
		m.move(1)
	case "home", "g":
		m.move(-len(m.items))
	case "end", "G":
		m.move(len(m.items))
	case "h":
		m.hide = !m.hide
		if it := m.byID[m.sel]; it == nil || !m.shown(it) {
			m.sel = ""
			if vis := m.visible(); len(vis) > 0 {
				m.sel = vis[0].ID
			}
		}
		if m.hide {
			m.info("Requests you may not answer are hidden; h shows them again.")
		} else {
			m.info("Showing requests you may not answer, dimmed; h hides them.")
		}
	case "enter":
		if it := m.selected(); it != nil {
			m.mode, m.focus, m.top, m.whole = modeDetail, it.ID, 0, false
			it.looked = true
		}
	case "a", "d", "e", "s", "r":
		return m, m.act(k.String())
	}
	return m, nil
}

// move moves the selection by delta, within the list.
func (m *model) move(delta int) {
	vis := m.visible()
	if len(vis) == 0 {
		return
	}
	at := slices.IndexFunc(vis, func(it *item) bool { return it.ID == m.sel })
	m.sel = vis[min(max(at+delta, 0), len(vis)-1)].ID
}

// detailKey handles the keys of the detail view; ok is false for the keys
// the list handles the same way.
func (m *model) detailKey(k tea.KeyMsg) (tea.Cmd, bool) {
	switch k.String() {
	case "esc", "enter", "backspace", "left":
		m.mode, m.focus = modeList, ""
	case "up", "k":
		m.top = max(m.top-1, 0)
	case "down", "j":
		m.top++
	case "pgup", "b":
		m.top = max(m.top-(m.height-4), 0)
	case "pgdown", " ", "f":
		m.top += m.height - 4
	case "home", "g":
		m.top = 0
	case "end", "G":
		m.top = 1 << 30
	case "v":
		m.whole = !m.whole
	default:
		return nil, false
	}
	return nil, true
}

// act starts the answer key asks for on the selected request.
func (m *model) act(key string) tea.Cmd {
	it := m.selected()
	if it == nil {
		m.fail("No request is selected: wait for one to arrive, or press h to show requests you may not answer.")
		return nil
	}
	if it.why != "" {
		who := "one of its approvers"
		if len(it.Approvers) > 0 {
			who = strings.Join(it.Approvers, ", ")
		}
		m.fail("You may not answer %s: %s. Nothing was sent; %s can answer it.", textsafe.Line(it.Tool), it.why, who)
		return nil
	}
	if it.sending {
		m.info("Your answer to %s is being sent; wait for it.", textsafe.Line(it.Tool))
		return nil
	}
	switch key {
	case "a":
		return m.proceed(draft{id: it.ID, verdict: events.Approve})
	case "d":
		return m.proceed(draft{id: it.ID, verdict: events.Deny})
	case "e":
		return m.startEdit(it)
	case "s":
		if !it.hasSchema() {
			m.fail("%s asks for no structured answer: press a to approve or d to deny.", textsafe.Line(it.Tool))
			return nil
		}
		return m.openPayload(draft{id: it.ID, verdict: events.Approve})
	case "r":
		m.openRemember(it)
	}
	return nil
}

// proceed takes a draft answer one step further: it asks what is still
// missing (a denial's reason, a structured answer), then sends it.
func (m *model) proceed(d draft) tea.Cmd {
	it := m.byID[d.id]
	if it == nil {
		m.mode, m.focus = modeList, ""
		m.fail("That request is no longer pending: nothing was sent.")
		return nil
	}
	switch {
	case d.verdict == events.Deny && !d.asked:
		m.draft, m.mode, m.focus, m.inErr = d, modeReason, d.id, ""
		m.input.Reset()
		m.input.Placeholder = "why (optional; the agent sees it)"
		m.input.CharLimit = events.MaxTextLength
		return m.input.Focus()
	case d.verdict == events.Approve && it.hasSchema() && d.payload == nil:
		return m.openPayload(d)
	}
	return m.send(it, d)
}

// send publishes the answer d to it.
func (m *model) send(it *item, d draft) tea.Cmd {
	r := events.Responded{Decision: d.verdict, Reason: d.reason, Args: d.args, Payload: d.payload, Remember: d.remember, Channel: Channel,
		ShownAt: it.drawn, Detail: it.looked}
	m.mode, m.focus = modeList, ""
	m.input.Blur()
	if err := r.Validate(); err != nil {
		m.fail("Your answer to %s is not valid (%v): nothing was sent; answer again.", textsafe.Line(it.Tool), err)
		return nil
	}
	it.sending, it.edit = true, nil
	m.info("Sending: %s %s...", verb(d.verdict), textsafe.Line(it.Tool))
	m.cfg.log.Debug("answer", zap.String("request_id", it.ID), zap.String("decision", string(d.verdict)))
	return m.cfg.answer(m.ctx, it.ID, r)
}

func verb(v events.Verdict) string {
	if v == events.Deny {
		return "deny"
	}
	return "approve"
}

// sent takes the result of publishing an answer.
func (m *model) sent(s sentMsg) {
	it := m.byID[s.id]
	if s.err != nil {
		m.cfg.log.Warn("publish answer", zap.String("request_id", s.id), zap.Error(s.err))
		if it != nil {
			it.sending = false
			m.fail("Could not send your answer to %s (%v). Check the connection in the status line, then answer again.", textsafe.Line(it.Tool), s.err)
		} else {
			m.fail("Could not send your answer (%v); the request is no longer pending anyway.", s.err)
		}
		return
	}
	if it == nil {
		return // decided already; the notice says how
	}
	it.sending, it.sentAt, it.sent, it.waiting = false, m.now, s.verdict, false
	m.info("Sent: %s %s; waiting for the decision.", verb(s.verdict), textsafe.Line(it.Tool))
}

// promptKey handles keys while a text prompt is open.
func (m *model) promptKey(k tea.KeyMsg) tea.Cmd {
	switch k.String() {
	case "esc":
		m.mode, m.focus, m.inErr = modeList, "", ""
		m.input.Blur()
		m.info("Cancelled: nothing was sent.")
		return nil
	case "enter":
		d := m.draft
		v := m.input.Value()
		if m.mode == modeReason {
			if len(v) > events.MaxTextLength {
				m.inErr = fmt.Sprintf("The reason is %d bytes; keep it under %d.", len(v), events.MaxTextLength)
				return nil
			}
			d.reason, d.asked = strings.TrimSpace(v), true
			return m.proceed(d)
		}
		it := m.byID[d.id]
		if it == nil {
			return m.proceed(d)
		}
		payload, problem := checkPayload(it.ResponseSchema, v)
		if problem != "" {
			m.inErr = problem
			return nil
		}
		d.payload = payload
		return m.proceed(d)
	}
	var cmd tea.Cmd
	m.input, cmd = m.input.Update(k)
	m.inErr = ""
	return cmd
}

// openPayload asks for the structured answer of d.
func (m *model) openPayload(d draft) tea.Cmd {
	it := m.byID[d.id]
	m.draft, m.mode, m.focus, m.inErr = d, modePayload, d.id, ""
	m.input.Reset()
	m.input.CharLimit = 0
	m.input.Placeholder = "a JSON value that fits the schema"
	m.input.SetValue(payloadTemplate(it.ResponseSchema))
	m.input.CursorEnd()
	return m.input.Focus()
}

// checkPayload reads a structured answer and checks it against schema, as
// the broker will; problem says what is wrong with it, for the user.
func checkPayload(schema json.RawMessage, text string) (payload json.RawMessage, problem string) {
	text = strings.TrimSpace(text)
	if text == "" {
		return nil, "Type the answer as JSON, or press esc to cancel."
	}
	var v any
	if err := json.Unmarshal([]byte(text), &v); err != nil {
		return nil, fmt.Sprintf("Not JSON (%v): fix it, or press esc to cancel.", err)
	}
	if err := events.CheckPayload(schema, []byte(text)); err != nil {
		return nil, fmt.Sprintf("Does not fit the schema: %v. Fix it, or press esc to cancel.", err)
	}
	return json.RawMessage(text), ""
}

// openRemember offers the scopes an answer to it may be remembered in.
func (m *model) openRemember(it *item) {
	if it.Terms == nil {
		m.fail("The broker did not say whether answers to %s may be remembered (it predates v1.1): answer with a or d.", textsafe.Line(it.Tool))
		return
	}
	if it.Terms.Remember == nil {
		m.fail("Answers to %s may not be remembered: its rule does not allow it. Answer with a or d.", textsafe.Line(it.Tool))
		return
	}
	var scopes []string
	for _, s := range it.Terms.Remember.Scopes {
		switch {
		case s == events.ScopeSession && it.Session == "",
			s == events.ScopeAgent && it.Agent == "",
			s == events.ScopeUser && it.User == "":
			continue // the request has no value for the scope
		}
		scopes = append(scopes, s)
	}
	if len(scopes) == 0 {
		m.fail("None of the scopes the rule allows (%s) applies to %s: answer with a or d.", strings.Join(it.Terms.Remember.Scopes, ", "), textsafe.Line(it.Tool))
		return
	}
	m.mode, m.focus, m.scopes, m.scope = modeRemember, it.ID, scopes, 0
}

// rememberKey handles keys while choosing a scope.
func (m *model) rememberKey(k tea.KeyMsg) tea.Cmd {
	switch k.String() {
	case "esc", "q":
		m.mode, m.focus = modeList, ""
		m.info("Cancelled: nothing was sent.")
	case "up", "k":
		m.scope = max(m.scope-1, 0)
	case "down", "j":
		m.scope = min(m.scope+1, len(m.scopes)-1)
	case "a", "enter":
		return m.proceed(draft{id: m.focus, verdict: events.Approve, remember: &events.Remember{Scope: m.scopes[m.scope]}})
	case "d":
		return m.proceed(draft{id: m.focus, verdict: events.Deny, remember: &events.Remember{Scope: m.scopes[m.scope]}})
	}
	return nil
}

// confirmKey handles keys while edited arguments wait for confirmation.
func (m *model) confirmKey(k tea.KeyMsg) tea.Cmd {
	switch k.String() {
	case "y", "enter":
		if m.draft.refused != "" {
			m.fail("These arguments cannot be sent (%s). Press e to fix them, or n to discard them.", m.draft.refused)
			return nil
		}
		return m.proceed(m.draft)
	case "n", "esc", "q":
		m.mode, m.focus = modeList, ""
		m.info("Edit discarded: nothing was sent. Press e to edit again.")
	case "e":
		if it := m.byID[m.focus]; it != nil {
			return m.startEdit(it)
		}
	case "up", "k":
		m.top = max(m.top-1, 0)
	case "down", "j":
		m.top++
	case "pgup":
		m.top = max(m.top-(m.height-6), 0)
	case "pgdown", " ":
		m.top += m.height - 6
	}
	return nil
}
