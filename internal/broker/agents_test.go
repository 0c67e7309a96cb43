package broker_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/assent-dev/assent/internal/broker"
	"github.com/assent-dev/assent/internal/brokertest"
	"github.com/assent-dev/assent/internal/testenv"
	"github.com/assent-dev/assent/pkg/events"
)

// TestAgentQueries: the broker answers an agent's list and cancel of its own
// requests for that agent alone, and says what is wrong with a query it
// cannot answer instead of leaving the agent to time out.
func TestAgentQueries(t *testing.T) {
	ns := testenv.Server(t)
	nc := testenv.Conn(t, ns)
	b, _ := brokertest.Run(t, nc, broker.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, r := range []events.Requested{{Agent: "coder", Tool: "a", Session: "s1"}, {Agent: "other", Tool: "b", Session: "s1"}} {
		if _, err := b.Submit(ctx, "", "test", r); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name, subject, body string
		wantErr             string // in the reply's error; "" for none
		wantPending         int
		wantCancelled       int
	}{
		{"list", "assent-private.coder.list", "", "", 1, 0},
		{"list a session", "assent-private.coder.list", `{"session":"s1"}`, "", 1, 0},
		{"list another session", "assent-private.coder.list", `{"session":"s2"}`, "", 0, 0},
		{"not JSON", "assent-private.coder.list", `{`, "invalid query", 0, 0},
		{"a session that is no token", "assent-private.coder.cancel", `{"session":"a b"}`, "invalid query", 0, 0},
		{"a reason too long", "assent-private.coder.cancel", `{"reason":"` + strings.Repeat("x", 5000) + `"}`, "invalid query", 0, 0},
		{"an unknown kind", "assent-private.coder.purge", "", "unknown kind", 0, 0},
		{"cancel", "assent-private.coder.cancel", `{"reason":"done"}`, "", 0, 1},
		{"cancel again: nothing left", "assent-private.coder.cancel", "", "", 0, 0},
		{"the other agent's are its own", "assent-private.other.list", "", "", 1, 0},
	} {
		m, err := nc.RequestWithContext(ctx, tc.subject, []byte(tc.body))
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		var r events.AgentReply
		if err := json.Unmarshal(m.Data, &r); err != nil {
			t.Fatalf("%s: %s: %v", tc.name, m.Data, err)
		}
		if (tc.wantErr == "") != (r.Error == "") || !strings.Contains(r.Error, tc.wantErr) {
			t.Errorf("%s: error %q, want %q", tc.name, r.Error, tc.wantErr)
		}
		if len(r.Pending) != tc.wantPending || len(r.Cancelled) != tc.wantCancelled {
			t.Errorf("%s: %d pending, %d cancelled; want %d and %d", tc.name, len(r.Pending), len(r.Cancelled), tc.wantPending, tc.wantCancelled)
		}
	}
}
