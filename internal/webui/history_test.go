package webui_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/assent-dev/assent/internal/broker"
	"github.com/assent-dev/assent/internal/testenv"
	"github.com/assent-dev/assent/internal/webui"
	"github.com/assent-dev/assent/pkg/events"
)

// pageNow is the pages' clock in these tests.
var pageNow = time.Date(2026, 11, 22, 10, 0, 0, 123456789, time.UTC)

// historian is a broker that says, for requests of a tool, what the record
// said of it (as a broker that keeps its pending events' history would).
type historian struct {
	*broker.Broker
	byTool map[string]*events.History
}

func (h historian) History(rec broker.Record) *events.History { return h.byTool[rec.Request.Tool] }

// auditAdding is a broker without History whose audit log holds, for each
// request, a pending event with history h (as a broker that writes it
// would store it).
type auditAdding struct {
	webui.Broker // the interface: *broker.Broker's History is not promoted
	h            *events.History
}

func (a auditAdding) Audit(ctx context.Context, q broker.AuditQuery) (broker.AuditPage, error) {
	page, err := a.Broker.Audit(ctx, q)
	if err != nil || q.RequestID == "" {
		return page, err
	}
	e, err := events.New(events.TypePending, "", "broker/test", events.Pending{RequestID: q.RequestID, Request: events.Requested{Tool: "t"}, History: a.h})
	if err != nil {
		return page, err
	}
	_, body, _ := events.Encode(&e)
	page.Events = append(page.Events, &broker.Event{Type: events.TypePending, RequestID: q.RequestID, Event: body, Time: pageNow})
	return page, nil
}

func serveUI(t *testing.T, b webui.Broker) string {
	t.Helper()
	ui, err := webui.New(b, webui.Config{Now: func() time.Time { return pageNow }}, testenv.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	ui.Register(mux)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv.URL
}

var month = events.Duration(30 * 24 * time.Hour)

// TestCardHistory: a pending request's card shows the record's line, above
// everything the agent wrote, where its pending event had one; and when the
// page made the card, for the answer's shown_at.
func TestCardHistory(t *testing.T) {
	b := runBroker(t, testPolicy)
	s := &site{b: b, url: serveUI(t, historian{b, map[string]*events.History{
		"deploy":     {Window: month, Approved: 41, Exact: 3, Principals: []string{"alice", "bob"}, LastDenied: pageNow.Add(-4 * 24 * time.Hour)},
		"drop_table": {Window: month},
		"restart":    {Window: month, Approved: 3, Denied: 2, Principals: []string{"bob"}, LastDenied: pageNow.Add(-time.Hour)},
	}})}
	long := strings.Repeat("Approve this, it is fine. ", 150)
	deploy := s.submit(t, events.Requested{Tool: "deploy", Hint: long, Args: json.RawMessage(`{"ref":"` + strings.Repeat("x", 5000) + `"}`)})
	drop := s.submit(t, events.Requested{Tool: "drop_table", Args: json.RawMessage(`{"table":"users"}`)})
	restart := s.submit(t, events.Requested{Tool: "restart"})
	none := s.submit(t, events.Requested{Tool: "write_file", Hint: "no history here"})

	for _, tt := range []struct {
		rec         broker.Record
		line, class string
	}{
		{deploy, "approved 41 of 41 times in 30 days (3 with these exact arguments), by alice and bob; last denied 4 days ago", `class="record"`},
		{drop, "first time: no earlier requests of this tool by this agent in 30 days", `class="record first"`},
		{restart, "approved 3 of 5 times in 30 days (2 denied; none with these exact arguments), by bob; last denied 1 hour ago", `class="record denied"`},
	} {
		for _, path := range []string{"/ui/cards/" + tt.rec.ID, "/approvals/" + tt.rec.ID} {
			code, body, _ := s.get(t, "", path)
			if code != http.StatusOK {
				t.Fatalf("%s: %d", path, code)
			}
			at := strings.Index(body, `<span class="record-line">`+tt.line+`</span>`)
			if at < 0 || !strings.Contains(body, tt.class) {
				t.Fatalf("%s lacks the line %q (%s):\n%s", path, tt.line, tt.class, body)
			}
			// Above the hint, the arguments and the meta the agent wrote.
			for _, after := range []string{`<dl class="meta">`, `class="hint"`, `<dl class="args"`, `class="actions"`} {
				if i := strings.Index(body, after); i >= 0 && i < at {
					t.Errorf("%s: %s comes before the history line", path, after)
				}
			}
			if !strings.Contains(body, `data-shown="2026-11-22T10:00:00.123456789Z"`) {
				t.Errorf("%s: the card does not say when the page made it", path)
			}
			if detail := strings.Contains(body, `data-detail="true"`); detail != strings.HasPrefix(path, "/approvals/") {
				t.Errorf("%s: data-detail %v", path, detail)
			}
		}
	}
	// The pending page has every line once.
	_, page, _ := s.get(t, "", "/")
	if n := strings.Count(page, `<p class="record`); n != 3 {
		t.Errorf("the pending page has %d history lines, want 3", n)
	}
	_, card, _ := s.get(t, "", "/ui/cards/"+none.ID)
	if strings.Contains(card, "record") || !strings.Contains(card, "no history here") {
		t.Errorf("a request without history has a history line:\n%s", card)
	}

	// Decided, the card is the decision's: no line, nothing to answer.
	if _, err := b.Respond(context.Background(), "alice", restart.ID, events.Responded{Decision: events.Deny}); err != nil {
		t.Fatal(err)
	}
	_, card, _ = s.get(t, "", "/ui/cards/"+restart.ID)
	if strings.Contains(card, `class="record`) || strings.Contains(card, "data-shown") {
		t.Errorf("a decided request's card has the history line or data-shown:\n%s", card)
	}
}

// TestDetailPageHistoryFromTimeline: with a broker that does not keep the
// history, the request's own page reads it from the pending event in the
// timeline; its cards in the list have none.
func TestDetailPageHistoryFromTimeline(t *testing.T) {
	b := runBroker(t, testPolicy)
	h := &events.History{Window: month, Approved: 7, Exact: 7, Principals: []string{"alice"}}
	s := &site{b: b, url: serveUI(t, auditAdding{b, h})}
	rec := s.submit(t, events.Requested{Tool: "deploy"})
	_, body, _ := s.get(t, "", "/approvals/"+rec.ID)
	if !strings.Contains(body, "approved 7 of 7 times in 30 days (7 with these exact arguments), by alice; last denied never") {
		t.Fatalf("the request's page lacks the line from its pending event:\n%s", body)
	}
	if _, card, _ := s.get(t, "", "/ui/cards/"+rec.ID); strings.Contains(card, `class="record`) {
		t.Errorf("a card has a history line its broker did not give")
	}
	// A history that breaks the bounds is not shown.
	s = &site{b: b, url: serveUI(t, auditAdding{b, &events.History{Window: month, Approved: -3, Exact: 2}})}
	if _, body, _ := s.get(t, "", "/approvals/"+rec.ID); strings.Contains(body, "2 with these exact arguments") {
		t.Errorf("an invalid history is shown")
	}
}
