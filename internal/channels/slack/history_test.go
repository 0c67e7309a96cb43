package slack_test

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/assent-dev/assent/internal/brokertest"
	"github.com/assent-dev/assent/internal/insights"
	"github.com/assent-dev/assent/internal/slacktest"
	"github.com/assent-dev/assent/pkg/events"
)

// readRecord waits until the broker has read the whole record, so that
// the pending events it writes carry their history.
func (h *harness) readRecord(t *testing.T) {
	t.Helper()
	h.slack.Wait(t, "the broker has read the record", func() bool {
		r, err := h.broker.Insights(context.Background(), insights.Filter{})
		return err == nil && r.Complete
	})
}

// answerOf returns the answer principal published to request id.
func (h *harness) answerOf(t *testing.T, principal, id string) events.Responded {
	t.Helper()
	s, err := h.js.Stream(t.Context(), events.StreamName)
	if err != nil {
		t.Fatal(err)
	}
	m, err := s.GetLastMsgForSubject(t.Context(), events.ResponsePrefix+principal+"."+id)
	if err != nil {
		t.Fatalf("%s's answer to %s: %v", principal, id, err)
	}
	e, err := events.Decode(events.Header(m.Header), m.Data)
	if err != nil {
		t.Fatal(err)
	}
	r, err := events.DecodeResponded(&e)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// posted is when Slack posted m: its ts, seconds and microseconds.
func posted(t *testing.T, m slacktest.Message) time.Time {
	t.Helper()
	sec, us, _ := strings.Cut(m.TS, ".")
	s, err1 := strconv.ParseInt(sec, 10, 64)
	u, err2 := strconv.ParseInt(us, 10, 64)
	if err1 != nil || err2 != nil || len(us) != 6 {
		t.Fatalf("ts %q", m.TS)
	}
	return time.Unix(s, u*1000)
}

// TestHistoryLineAndShown: the request's message has the record's line
// right under its header, above everything the agent wrote; an answer says
// when its message was posted, and, from the edit form (which shows every
// argument whole), that the approver had the detail in view.
func TestHistoryLineAndShown(t *testing.T) {
	h := start(t, setup{})
	h.readRecord(t)
	id, ch := h.ask(t, events.Requested{Tool: "deploy", User: "dan", Hint: strings.Repeat("Routine. ", 200),
		Args: json.RawMessage(`{"script":"` + strings.Repeat("x", 3000) + `"}`)})
	m := h.message(t, id)
	t.Logf("the message's blocks: %s", m.Blocks)
	bs := parseBlocks(t, m.Blocks)
	if len(bs) < 3 || bs[0].Type != "header" || bs[1].Text == nil ||
		!strings.HasPrefix(bs[1].Text.Text, ":warning: *History:* first time: no earlier requests of this tool by this agent in 30 days") {
		t.Fatalf("the message does not have the history line under its header:\n%s", m.Blocks)
	}
	if n, _, _, _ := h.rt.Lookup(t.Context(), id); n.History == nil {
		t.Fatalf("the notice has no history")
	}
	h.interact(t, slacktest.Click("UALICE", "assent.approve", id, m))
	brokertest.Decision(t, ch)
	if r := h.answerOf(t, "alice", id); !r.ShownAt.Equal(posted(t, m)) || r.Detail {
		t.Errorf("approve: shown_at %s, detail %v; want %s (the message's ts %s), false", r.ShownAt, r.Detail, posted(t, m), m.TS)
	}
	// The outcome has no history line: it is about the asking.
	if m = h.resolved(t, id, "*Approved by* alice via slack"); strings.Contains(m.Blocks, "History:") {
		t.Errorf("the outcome keeps the history line:\n%s", m.Blocks)
	}

	// After a decision of deploy by a person: the line counts it.
	id, ch = h.ask(t, events.Requested{Tool: "deploy", User: "dan", Args: json.RawMessage(`{"script":"ls"}`)})
	m = h.message(t, id)
	if !strings.Contains(m.Blocks, "*History:* approved 1 of 1 time in 30 days (none with these exact arguments), by alice; last denied never") {
		t.Errorf("the second request's line:\n%s", m.Blocks)
	}
	h.interact(t, slacktest.Click("UALICE", "assent.edit", id, m))
	views := h.slack.Views()
	h.interact(t, slacktest.Submit("UALICE", views[len(views)-1], map[string]any{"args": slacktest.Text(`{"script":"ls -l"}`)}))
	brokertest.Decision(t, ch)
	if r := h.answerOf(t, "alice", id); !r.ShownAt.Equal(posted(t, m)) || !r.Detail {
		t.Errorf("edit: shown_at %s, detail %v; want %s, true", r.ShownAt, r.Detail, posted(t, m))
	}

	id, ch = h.ask(t, events.Requested{Tool: "deploy", User: "dan"})
	m = h.message(t, id)
	h.interact(t, slacktest.Click("UALICE", "assent.deny", id, m))
	views = h.slack.Views()
	h.interact(t, slacktest.Submit("UALICE", views[len(views)-1], map[string]any{"reason": slacktest.Text("no")}))
	brokertest.Decision(t, ch)
	if r := h.answerOf(t, "alice", id); !r.ShownAt.Equal(posted(t, m)) || r.Detail {
		t.Errorf("deny: shown_at %s, detail %v; want %s, false", r.ShownAt, r.Detail, posted(t, m))
	}
}
