package events_test

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/assent-dev/assent/pkg/events"
)

func TestHistoryValidate(t *testing.T) {
	valid := func() events.History {
		return events.History{Window: events.Duration(30 * 24 * time.Hour), Approved: 41, Denied: 2, Expired: 1, Exact: 3,
			Principals: []string{"alice", "bob"}, LastDenied: goldenTime}
	}
	many := make([]string, events.MaxHistoryPrincipals+1)
	for i := range many {
		many[i] = "p" + strings.Repeat("x", i%5)
	}
	tests := []struct {
		name    string
		change  func(h *events.History)
		wantErr error
		field   string
	}{
		{"valid", func(*events.History) {}, nil, ""},
		{"nothing before", func(h *events.History) { *h = events.History{Window: events.Duration(time.Hour)} }, nil, ""},
		{"longest window", func(h *events.History) { h.Window = events.Duration(events.MaxHistoryWindow) }, nil, ""},
		{"most principals", func(h *events.History) { h.Principals = many[:events.MaxHistoryPrincipals] }, nil, ""},
		{"exact above the counts", func(h *events.History) { h.Exact = 99 }, nil, ""}, // not cross-checked
		{"zero window", func(h *events.History) { h.Window = 0 }, events.ErrBadValue, "window"},
		{"negative window", func(h *events.History) { h.Window = -1 }, events.ErrBadValue, "window"},
		{"window over a year", func(h *events.History) { h.Window = events.Duration(events.MaxHistoryWindow + time.Second) }, events.ErrBadValue, "window"},
		{"negative approved", func(h *events.History) { h.Approved = -1 }, events.ErrBadValue, "approved"},
		{"negative denied", func(h *events.History) { h.Denied = -1 }, events.ErrBadValue, "denied"},
		{"negative expired", func(h *events.History) { h.Expired = -1 }, events.ErrBadValue, "expired"},
		{"negative exact", func(h *events.History) { h.Exact = -5 }, events.ErrBadValue, "exact"},
		{"too many principals", func(h *events.History) { h.Principals = many }, events.ErrBadValue, "principals"},
		{"empty principal", func(h *events.History) { h.Principals = []string{"alice", ""} }, events.ErrBadToken, "principals"},
		{"principal with a space", func(h *events.History) { h.Principals = []string{"alice smith"} }, events.ErrBadToken, "principals"},
		{"principal with a bidi override", func(h *events.History) { h.Principals = []string{"al\u202eice"} }, events.ErrBadToken, "principals"},
		{"principal too long", func(h *events.History) { h.Principals = []string{strings.Repeat("a", events.MaxTokenLength+1)} }, events.ErrBadToken, "principals"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := valid()
			tt.change(&h)
			err := h.Validate()
			checkErr(t, err, tt.wantErr)
			checkField(t, err, tt.field)
			// Inside a pending event, the problem is the event's, under
			// "history".
			p := events.Pending{RequestID: testID, Request: events.Requested{Tool: "t"}, History: &h}
			perr := p.Validate()
			checkErr(t, perr, tt.wantErr)
			if tt.wantErr != nil {
				checkField(t, perr, "history")
				if !strings.Contains(perr.Error(), "history: "+tt.field+": ") {
					t.Errorf("pending error %q does not name history: %s", perr, tt.field)
				}
			}
		})
	}
}

func TestHistoryValidateReportsEveryProblem(t *testing.T) {
	h := events.History{Approved: -1, Denied: -2, Principals: []string{"a b"}}
	err := h.Validate()
	for _, field := range []string{"window: ", "approved: ", "denied: ", "principals: "} {
		if err == nil || !strings.Contains(err.Error(), field) {
			t.Errorf("error %v does not name %q", err, field)
		}
	}
}

// A pending event's history and an answer's shown_at and detail travel
// unchanged, and are left out when absent, as older peers wrote them.
func TestHistoryAndShownRoundTrip(t *testing.T) {
	p := events.Pending{RequestID: testID, Request: events.Requested{Tool: "delete_file"}, Deadline: goldenTime,
		History: &events.History{Window: events.Duration(30 * 24 * time.Hour), Approved: 41, Denied: 0, Exact: 3,
			Principals: []string{"alice", "bob"}, LastDenied: goldenTime.Add(-96 * time.Hour)}}
	e, err := events.New(events.TypePending, testAnswer, "broker/b1", p)
	if err != nil {
		t.Fatal(err)
	}
	got, err := events.DecodePending(&e)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got.History, p.History) {
		t.Fatalf("history = %+v, want %+v", got.History, p.History)
	}

	r := events.Responded{Decision: events.Approve, Channel: "web", ShownAt: goldenTime, Detail: true}
	e, err = events.New(events.TypeResponded, testAnswer, "approver/alice", r)
	if err != nil {
		t.Fatal(err)
	}
	gotR, err := events.DecodeResponded(&e)
	if err != nil {
		t.Fatal(err)
	}
	if !gotR.ShownAt.Equal(r.ShownAt) || !gotR.Detail {
		t.Fatalf("responded = %+v, want shown_at %s and detail", gotR, r.ShownAt)
	}

	// Absent: nothing written; an older peer's event reads as none.
	for _, v := range []any{events.Pending{RequestID: testID, Request: events.Requested{Tool: "t"}}, events.Responded{Decision: events.Deny}} {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range []string{"history", "shown_at", "detail"} {
			if strings.Contains(string(b), `"`+k+`"`) {
				t.Errorf("%s holds %q", b, k)
			}
		}
	}
	old := []byte(`{"request_id":"` + testID + `","request":{"tool":"t"},"deadline":"2026-05-01T12:00:00Z"}`)
	var op events.Pending
	if err := json.Unmarshal(old, &op); err != nil || op.History != nil || op.Validate() != nil {
		t.Fatalf("an older broker's pending event: %+v, %v", op, err)
	}
}

// A pending event whose history breaks the bounds is refused on decode.
func TestDecodePendingBadHistory(t *testing.T) {
	data := `{"request_id":"` + testID + `","request":{"tool":"t"},"deadline":"2026-05-01T12:00:00Z",` +
		`"history":{"window":"720h","approved":-1,"denied":0}}`
	e, err := events.Decode(structuredHeader, []byte(`{"specversion":"1.0","id":"`+testAnswer+`","type":"`+events.TypePending+
		`","source":"broker/b1","datacontenttype":"application/json","data":`+data+`}`))
	if err != nil {
		t.Fatal(err)
	}
	_, err = events.DecodePending(&e)
	checkErr(t, err, events.ErrBadValue)
	checkField(t, err, "history")
	// A window written as a number is malformed, as every duration.
	e2, err := events.Decode(structuredHeader, []byte(strings.Replace(string(mustEncode(t, &e)), `"720h"`, `2592000`, 1)))
	if err != nil {
		t.Fatal(err)
	}
	_, err = events.DecodePending(&e2)
	checkErr(t, err, events.ErrMalformed)
}

func mustEncode(t *testing.T, e *events.Event) []byte {
	t.Helper()
	_, body, err := events.Encode(e)
	if err != nil {
		t.Fatal(err)
	}
	return body
}

func TestRespondedViewed(t *testing.T) {
	at := goldenTime
	tests := []struct {
		name  string
		shown time.Time
		want  time.Duration
		ok    bool
	}{
		{"absent", time.Time{}, 0, false},
		{"before the answer", at.Add(-90 * time.Second), 90 * time.Second, true},
		{"at the answer", at, 0, true},
		{"a little after (a clock ahead)", at.Add(30 * time.Second), 0, true},
		{"at the skew", at.Add(events.MaxShownSkew), 0, true},
		{"beyond the skew", at.Add(events.MaxShownSkew + time.Second), 0, false},
		{"a year ahead", at.AddDate(1, 0, 0), 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := events.Responded{Decision: events.Approve, ShownAt: tt.shown}
			// Whatever its clock said, the answer itself is valid.
			if err := r.Validate(); err != nil {
				t.Fatalf("Validate: %v", err)
			}
			d, ok := r.Viewed(at)
			if d != tt.want || ok != tt.ok {
				t.Fatalf("Viewed = %s, %v; want %s, %v", d, ok, tt.want, tt.ok)
			}
		})
	}
}
