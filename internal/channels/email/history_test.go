package email_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/assent-dev/assent/internal/brokertest"
	"github.com/assent-dev/assent/internal/insights"
	"github.com/assent-dev/assent/internal/testenv"
	"github.com/assent-dev/assent/pkg/events"
)

// TestHistoryLineAndShown: the mail and the link's page have the record's
// line above everything the agent wrote; the answer from the page says when
// the mail was sent, with the detail in view (the page shows the whole
// request).
func TestHistoryLineAndShown(t *testing.T) {
	h := setup(t, teamPolicy, 0)
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if r, err := h.broker.Insights(context.Background(), insights.Filter{}); err == nil && r.Complete {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the broker did not read the record")
		}
	}
	asked := time.Now()
	id, decided := h.ask(t, events.Requested{Tool: "deploy", Hint: strings.Repeat("Routine, approve. ", 100),
		Args: json.RawMessage(`{"script":"` + strings.Repeat("x", 5000) + `"}`)})
	m := h.mailTo(t, "alice@example.com", id)
	line := "first time: no earlier requests of this tool by this agent in 30 days"
	if at := strings.Index(m.Text, "History: "+line); at < 0 || at > strings.Index(m.Text, "Approve: ") {
		t.Errorf("the text part lacks the line above the links:\n%s", m.Text)
	}
	if at := strings.Index(m.HTML, line); at < 0 || at > strings.Index(m.HTML, "Routine, approve.") || at > strings.Index(m.HTML, "xxxxxxxx") {
		t.Errorf("the HTML part lacks the line above the agent's text:\n%s", m.HTML)
	}
	status, body, _ := get(t, m.Approve(t))
	wantPage(t, "GET approve", status, body, http.StatusOK, `<p class="record notable"><span>History</span> `+line+`</p>`)
	if strings.Index(body, line) > strings.Index(body, "<dl>") {
		t.Errorf("the page has the line below the request's fields:\n%s", body)
	}
	status, body = post(t, m.Approve(t), "")
	answered := time.Now()
	wantPage(t, "POST approve", status, body, http.StatusOK, "You approved deploy")
	brokertest.Decision(t, decided)

	js, err := jetstream.New(testenv.Conn(t, h.ns))
	if err != nil {
		t.Fatal(err)
	}
	s, err := js.Stream(t.Context(), events.StreamName)
	if err != nil {
		t.Fatal(err)
	}
	msg, err := s.GetLastMsgForSubject(t.Context(), events.ResponsePrefix+"alice."+id)
	if err != nil {
		t.Fatal(err)
	}
	e, err := events.Decode(events.Header(msg.Header), msg.Data)
	if err != nil {
		t.Fatal(err)
	}
	r, err := events.DecodeResponded(&e)
	if err != nil {
		t.Fatal(err)
	}
	// Recorded once the SMTP server took it: after the ask, before the answer.
	if r.ShownAt.Before(asked) || r.ShownAt.After(answered) || !r.Detail || r.Channel != "email" {
		t.Errorf("the answer: shown_at %s (want between %s and %s), detail %v, channel %q", r.ShownAt, asked, answered, r.Detail, r.Channel)
	}
}
