package terminal

import (
	"context"
	"encoding/json"
	"io"
	"strings"
	"testing"
	"time"

	tea "github.com/charmbracelet/bubbletea"
	"github.com/charmbracelet/x/ansi"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/assent-dev/assent/pkg/events"
	"github.com/assent-dev/assent/pkg/handler"
)

// histNow is the clock of these tests.
var histNow = time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)

// monthOfApprovals is the history the tests show.
var monthOfApprovals = &events.History{Window: events.Duration(30 * 24 * time.Hour), Approved: 41, Exact: 3,
	Principals: []string{"alice", "bob"}, LastDenied: histNow.Add(-4 * 24 * time.Hour)}

const monthLine = "approved 41 of 41 times in 30 days (3 with these exact arguments), by alice and bob; last denied 4 days ago"

// histModel is a model of 100x30 whose answers land in sent, and whose
// clock is *clock.
func histModel(t *testing.T, clock *time.Time) (*model, *[]events.Responded) {
	t.Helper()
	var sent []events.Responded
	m := newModel(context.Background(), config{
		principal: "alice",
		out:       io.Discard,
		status:    func() nats.Status { return nats.CONNECTED },
		answer: func(_ context.Context, _ string, r events.Responded) tea.Cmd {
			sent = append(sent, r)
			return nil
		},
		styles: newStyles(io.Discard),
		log:    zap.NewNop(),
		clock:  func() time.Time { return *clock },
	})
	m.now = histNow
	m.Update(tea.WindowSizeMsg{Width: 100, Height: 30})
	return m, &sent
}

func histNotice(id, tool string, args json.RawMessage, hint string, h *events.History) noticeMsg {
	return noticeMsg{notice: handler.Notice{Request: handler.Request{ID: id, Requested: events.Requested{Tool: tool, Agent: "coder", Args: args, Hint: hint},
		Deadline: histNow.Add(time.Hour)}, Rule: "deploys"}, history: h}
}

func keys(m *model, ks ...string) {
	for _, k := range ks {
		msg := tea.KeyMsg{Type: tea.KeyRunes, Runes: []rune(k)}
		switch k {
		case "enter":
			msg = tea.KeyMsg{Type: tea.KeyEnter}
		case "esc":
			msg = tea.KeyMsg{Type: tea.KeyEsc}
		}
		m.Update(msg)
	}
}

// TestHistoryLine: the selected request's history line is in the list,
// between its columns and the arguments and hint the agent wrote, and in
// its details and prompts above them; a request whose pending event had
// none shows none.
func TestHistoryLine(t *testing.T) {
	clock := histNow
	m, _ := histModel(t, &clock)
	long := `{"cmd":"` + strings.Repeat("rm -rf / ", 400) + `"}`
	m.Update(batchMsg{snapshotMsg{
		histNotice("r1", "deploy", json.RawMessage(long), strings.Repeat("Trust me. ", 300), monthOfApprovals),
		histNotice("r2", "restart", json.RawMessage(`{"svc":"db"}`), "", nil),
	}})
	list := m.View()
	t.Logf("the list:\n%s", list)
	rows := strings.Split(list, "\n")
	at := -1
	for i, r := range rows {
		if strings.HasPrefix(r, "> deploy") {
			at = i
		}
	}
	if at < 0 || at+3 >= len(rows) || !strings.HasPrefix(rows[at+1], "    history: approved 41 of 41 times in 30 days") ||
		!strings.HasSuffix(strings.TrimSpace(rows[at+2]), "last denied 4 days ago") || !strings.HasPrefix(rows[at+3], `    cmd="rm -rf`) {
		t.Fatalf("the history line is not right under the selected row, whole, above the arguments:\n%s", list)
	}
	if strings.Count(list, "history:") != 1 {
		t.Fatalf("want one history line, for the selected request:\n%s", list)
	}

	keys(m, "enter")
	detail := m.View()
	t.Logf("the details:\n%s", detail)
	hist, args := strings.Index(detail, "History    approved 41 of 41"), strings.Index(detail, "Arguments")
	if hist < 0 || args < 0 || hist > args {
		t.Fatalf("the details do not show the history above the arguments:\n%s", detail)
	}
	if !strings.Contains(ansi.Strip(strings.Join(strings.Fields(detail), " ")), "by alice and bob; last denied 4 days ago") {
		t.Fatalf("the details cut the history line:\n%s", detail)
	}
	keys(m, "d")
	prompt := m.View()
	t.Logf("the deny prompt:\n%s", prompt)
	if h, hint := strings.Index(prompt, "History: "+monthLine[:40]), strings.Index(prompt, "Hint: "); h < 0 || hint < 0 || h > hint {
		t.Fatalf("the prompt does not show the history above the hint:\n%s", prompt)
	}
	keys(m, "esc", "j")
	if v := m.View(); strings.Contains(v, "history") || !strings.Contains(v, "> restart") {
		t.Fatalf("a request without history shows a history line:\n%s", v)
	}
	keys(m, "enter")
	if v := m.View(); strings.Contains(v, "History") {
		t.Fatalf("the details of a request without history show one:\n%s", v)
	}
}

// TestShownAndDetail: an answer says when its request was first drawn,
// and whether its details were opened.
func TestShownAndDetail(t *testing.T) {
	clock := histNow
	m, sent := histModel(t, &clock)
	m.Update(batchMsg{snapshotMsg{histNotice("r1", "deploy", nil, "", monthOfApprovals)}})
	_ = m.View() // drawn now
	clock = histNow.Add(5 * time.Second)
	m.Update(batchMsg{&noticeMsg{notice: histNotice("r2", "restart", nil, "", nil).notice}})
	clock = histNow.Add(9 * time.Second)
	_ = m.View() // r2 drawn now; r1 was before
	clock = histNow.Add(20 * time.Second)
	keys(m, "a") // r1, from the list
	keys(m, "j", "enter", "a")
	if len(*sent) != 2 {
		t.Fatalf("sent %d answers, want 2", len(*sent))
	}
	r1, r2 := (*sent)[0], (*sent)[1]
	if !r1.ShownAt.Equal(histNow) || r1.Detail {
		t.Errorf("answer from the list: shown_at %s, detail %v; want %s, false", r1.ShownAt, r1.Detail, histNow)
	}
	if !r2.ShownAt.Equal(histNow.Add(9*time.Second)) || !r2.Detail {
		t.Errorf("answer from the details: shown_at %s, detail %v; want %s, true", r2.ShownAt, r2.Detail, histNow.Add(9*time.Second))
	}
	for _, r := range *sent {
		if err := r.Validate(); err != nil {
			t.Errorf("answer %+v: %v", r, err)
		}
	}
}

// fakeMsg is a stream message, for the feed.
type fakeMsg struct {
	jetstream.Msg
	subject string
	data    []byte
	header  nats.Header
}

func (f fakeMsg) Subject() string      { return f.subject }
func (f fakeMsg) Data() []byte         { return f.data }
func (f fakeMsg) Headers() nats.Header { return f.header }

// TestFeedReadsHistory: the feed takes a pending event's history, and an
// escalation keeps the request's.
func TestFeedReadsHistory(t *testing.T) {
	f := newFeed(zap.NewNop(), events.Codec{})
	msg := func(typ string, data any) jetstream.Msg {
		e, err := events.New(typ, "", "broker/b1", data)
		if err != nil {
			t.Fatal(err)
		}
		h, body, err := events.Encode(&e)
		if err != nil {
			t.Fatal(err)
		}
		return fakeMsg{subject: events.PendingPrefix + "coder", data: body, header: nats.Header(h)}
	}
	req := events.Requested{Tool: "deploy", Agent: "coder"}
	id := events.NewID()
	p := f.decode(msg(events.TypePending, events.Pending{RequestID: id, Request: req, Deadline: histNow, History: monthOfApprovals}), 1)
	n, ok := p.(*noticeMsg)
	if !ok || n.history == nil || n.history.Approved != 41 {
		t.Fatalf("pending: %#v", p)
	}
	esc := f.decode(msg(events.TypeEscalated, events.Escalated{RequestID: id, Request: req, Level: 1, Deadline: histNow.Add(time.Minute)}), 2)
	f.collect(n)
	f.collect(esc.(*noticeMsg))
	if got := f.replay[id]; got.history == nil || got.history.Approved != 41 || got.notice.Level != 1 {
		t.Fatalf("after the escalation: %+v", got)
	}
	none := f.decode(msg(events.TypePending, events.Pending{RequestID: events.NewID(), Request: req, Deadline: histNow}), 3)
	if none.(*noticeMsg).history != nil {
		t.Fatalf("a pending event without history: %+v", none)
	}
}
