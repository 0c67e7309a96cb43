package broker_test

import (
	"context"
	"testing"
	"time"

	"github.com/assent-dev/assent/internal/broker"
	"github.com/assent-dev/assent/internal/brokertest"
	"github.com/assent-dev/assent/internal/testenv"
	"github.com/assent-dev/assent/pkg/events"
)

// TestRequestLookup: the broker answers assent-broker.lookup.<id> for any
// agent's request with where it stands, its agent, deadline and request
// digest, and never with its args or decision; unknown for an id no request
// has.
func TestRequestLookup(t *testing.T) {
	ns := testenv.Server(t)
	nc := testenv.Conn(t, ns)
	b, _ := brokertest.Run(t, nc, broker.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pending, err := b.Submit(ctx, "", "test", events.Requested{Agent: "coder", Tool: "deploy", Args: []byte(`{"secret":"s3"}`), Timeout: events.Duration(time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	decided, err := b.Submit(ctx, "", "test", events.Requested{Agent: "other", Tool: "rm", Args: []byte(`{"secret":"s4"}`), Timeout: events.Duration(time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	if decided, err = b.Respond(ctx, "alice", decided.ID, events.Responded{Decision: events.Deny, Reason: "no"}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, id      string
		status, agent string
		rec           *broker.Record
	}{
		{"pending", pending.ID, events.LookupPending, "coder", &pending},
		{"decided", decided.ID, events.LookupDecided, "other", &decided},
		{"unknown", events.NewID(), events.LookupUnknown, "", nil},
		{"not a request id", "a%b", events.LookupUnknown, "", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := nc.RequestWithContext(ctx, events.BrokerLookupPrefix+tc.id, nil)
			if err != nil {
				t.Fatal(err)
			}
			if got := m.Header.Get(events.LookupStatus); got != tc.status {
				t.Errorf("status %q, want %q", got, tc.status)
			}
			if got := m.Header.Get(events.LookupAgent); got != tc.agent {
				t.Errorf("agent %q, want %q", got, tc.agent)
			}
			if len(m.Data) != 0 {
				t.Errorf("the answer has a body: %s", m.Data)
			}
			for k := range m.Header {
				switch k {
				case events.LookupStatus, events.LookupAgent, events.LookupDeadline, events.LookupRequestDigest:
				default:
					t.Errorf("the answer has header %s: %q", k, m.Header.Values(k))
				}
			}
			if tc.rec == nil {
				if len(m.Header) != 1 {
					t.Errorf("headers %v, want the status alone", m.Header)
				}
				return
			}
			if got := m.Header.Get(events.LookupRequestDigest); got != tc.rec.RequestDigest || got == "" {
				t.Errorf("request digest %q, want %q", got, tc.rec.RequestDigest)
			}
			if got, err := time.Parse(time.RFC3339Nano, m.Header.Get(events.LookupDeadline)); err != nil || !got.Equal(tc.rec.Deadline) {
				t.Errorf("deadline %v (%v), want %v", got, err, tc.rec.Deadline)
			}
		})
	}
}
