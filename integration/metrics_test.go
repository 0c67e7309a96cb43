package integration

import (
	"net/http"
	"strings"
	"testing"

	"github.com/assent-dev/assent/internal/app"
	"github.com/assent-dev/assent/internal/broker"
)

// TestMetrics: /metrics serves the broker's counters in the Prometheus text
// format, and they move with the work done.
func TestMetrics(t *testing.T) {
	a := startApp(t, app.Options{NATSListen: "127.0.0.1:0", DataDir: t.TempDir(), HTTPListen: "127.0.0.1:0", Broker: broker.Config{Mode: broker.ModeAutoApprove}})
	for range 3 {
		approvalOf(t, call(t, http.MethodPost, a.HTTP+"/v1/approvals", map[string]any{"agent": "m", "tool": "x"}), http.StatusCreated)
	}
	r := call(t, http.MethodGet, a.HTTP+"/metrics", nil)
	if r.status != http.StatusOK {
		t.Fatalf("GET /metrics: %d", r.status)
	}
	body := string(r.body)
	for _, want := range []string{"assent_requests_total 3", "assent_approved_total 3", "assent_automatic_decisions_total 3", "assent_shadow_disagreements_total 0", "go_goroutines"} {
		if !strings.Contains(body, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
}
