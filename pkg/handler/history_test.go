package handler_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/assent-dev/assent/internal/broker"
	"github.com/assent-dev/assent/internal/brokertest"
	"github.com/assent-dev/assent/internal/testenv"
	"github.com/assent-dev/assent/pkg/events"
	"github.com/assent-dev/assent/pkg/handler"
)

// TestNoticeOfHistory: a pending event's history is its notice's; an
// escalated event carries none.
func TestNoticeOfHistory(t *testing.T) {
	h := &events.History{Window: events.Duration(30 * 24 * time.Hour), Approved: 41, Exact: 3, Principals: []string{"alice"}}
	req := events.Requested{Tool: "deploy", Agent: "coder"}
	id := events.NewID()
	for _, tt := range []struct {
		typ  string
		data any
		want *events.History
	}{
		{events.TypePending, events.Pending{RequestID: id, Request: req, Deadline: time.Now(), History: h}, h},
		{events.TypePending, events.Pending{RequestID: id, Request: req, Deadline: time.Now()}, nil},
		{events.TypeEscalated, events.Escalated{RequestID: id, Request: req, Level: 1, Deadline: time.Now()}, nil},
	} {
		e, err := events.New(tt.typ, "", "broker/b1", tt.data)
		if err != nil {
			t.Fatal(err)
		}
		n, ok, err := handler.NoticeOf(&e)
		if err != nil || !ok {
			t.Fatalf("%s: %v %v", tt.typ, ok, err)
		}
		if (n.History == nil) != (tt.want == nil) || n.History != nil && n.History.Approved != tt.want.Approved {
			t.Errorf("%s: history %+v, want %+v", tt.typ, n.History, tt.want)
		}
	}
}

// TestChannelAnswerShown: an answer through a channel carries when the
// channel showed the request and whether its detail was opened; an
// escalation's notice keeps the history of the request's first.
func TestChannelAnswerShown(t *testing.T) {
	ns := testenv.Server(t)
	runBroker(t, testenv.Conn(t, ns), broker.Config{})
	r := newRecorder("r")
	c, _ := brokertest.RunChannel(t, testenv.Conn(t, ns), handler.ChannelConfig{Channel: "slack", Principals: []string{"alice"}}, r)
	client, _ := handler.NewClient(testenv.Conn(t, ns), handler.Config{Agent: "bank"})
	id, decided := ask(t, client, events.Requested{Tool: "deploy"})
	r.wait(t, "notified", func() bool { return len(r.notices[id]) == 1 })
	shown := time.Date(2026, 11, 22, 10, 0, 0, 123456789, time.UTC)
	if err := c.Answer(context.Background(), "alice", id, handler.Response{Decision: events.Approve, ShownAt: shown, Detail: true}); err != nil {
		t.Fatal(err)
	}
	<-decided
	js, err := jetstream.New(testenv.Conn(t, ns))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, events.StreamName)
	if err != nil {
		t.Fatal(err)
	}
	m, err := s.GetLastMsgForSubject(ctx, events.ResponsePrefix+"alice."+id)
	if err != nil {
		t.Fatal(err)
	}
	e, err := events.Decode(events.Header(m.Header), m.Data)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := events.DecodeResponded(&e)
	if err != nil {
		t.Fatal(err)
	}
	if !resp.ShownAt.Equal(shown) || !resp.Detail || resp.Channel != "slack" {
		t.Fatalf("the answer on the stream: %+v", resp)
	}
}
