package integration

import (
	"net/http"
	"strings"
	"testing"

	"github.com/assent-dev/assent/integration/itest"
	"github.com/assent-dev/assent/internal/app"
	"github.com/assent-dev/assent/internal/broker"
)

// TestMetrics: /metrics serves the broker's counters in the Prometheus text
// format, and they move with the work done.
func TestMetrics(t *testing.T) {
	a := itest.StartApp(t, app.Options{NATSListen: "127.0.0.1:0", DataDir: t.TempDir(), HTTPListen: "127.0.0.1:0", Broker: broker.Config{Mode: broker.ModeAutoApprove}})
	for range 3 {
		itest.ApprovalOf(t, itest.Call(t, http.MethodPost, a.HTTP+"/v1/approvals", map[string]any{"agent": "m", "tool": "x"}), http.StatusCreated)
	}
	// A decision is counted by the handling whose publish stored it, which
	// may be the consumer's while the HTTP reply came from the gateway's:
	// the counts follow the reply by a moment.
	itest.Eventually(t, itest.Patience, func() (bool, string) {
		r := itest.Call(t, http.MethodGet, a.HTTP+"/metrics", nil)
		if r.Status != http.StatusOK {
			t.Fatalf("GET /metrics: %d", r.Status)
		}
		body := string(r.Body)
		for _, want := range []string{"assent_requests_total 3", "assent_approved_total 3", "assent_automatic_decisions_total 3", "assent_shadow_disagreements_total 0", "go_goroutines",
			`assent_decision_latency_seconds_count{channel="auto",outcome="approved"} 3`, "assent_pending_requests 0", "assent_event_stream_clients 0"} {
			if !strings.Contains(body, want) {
				return false, "metrics lack " + want
			}
		}
		return true, ""
	})
}

// TestMetricsLatencyAndGauges: answers are timed by the channel that gave
// them; pending requests and event stream clients are counted.
func TestMetricsLatencyAndGauges(t *testing.T) {
	a := itest.StartApp(t, app.Options{NATSListen: "127.0.0.1:0", DataDir: t.TempDir(), HTTPListen: "127.0.0.1:0"})
	var ids []string
	for range 2 {
		ids = append(ids, itest.ApprovalOf(t, itest.Call(t, http.MethodPost, a.HTTP+"/v1/approvals", map[string]any{"agent": "m", "tool": "x"}), http.StatusCreated).ID)
	}
	stream := openSSE(t, a.HTTP, "", 0)
	metric := func(name string) string {
		t.Helper()
		for _, line := range strings.Split(string(itest.Call(t, http.MethodGet, a.HTTP+"/metrics", nil).Body), "\n") {
			if strings.HasPrefix(line, name+" ") {
				return strings.TrimPrefix(line, name+" ")
			}
		}
		return ""
	}
	itest.Eventually(t, itest.Patience, func() (bool, string) {
		p, c := metric("assent_pending_requests"), metric("assent_event_stream_clients")
		return p == "2" && c == "1", "pending " + p + ", clients " + c
	})
	itest.ApprovalOf(t, itest.Call(t, http.MethodPost, a.HTTP+"/v1/approvals/"+ids[0]+"/decision", map[string]any{"principal": "alice", "decision": "approve", "channel": "slack"}), http.StatusOK)
	itest.Eventually(t, itest.Patience, func() (bool, string) {
		n := metric(`assent_decision_latency_seconds_count{channel="slack",outcome="approved"}`)
		return n == "1" && metric("assent_pending_requests") == "1", "slack approvals timed: " + n
	})
	stream.close()
	itest.Eventually(t, itest.Patience, func() (bool, string) {
		c := metric("assent_event_stream_clients")
		return c == "0", "clients " + c
	})
}
