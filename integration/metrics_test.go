package integration

import (
	"net/http"
	"os"
	"path/filepath"
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

// TestMetricsPerRole: who reads GET /metrics, for every role of the HTTP
// API's callers (tokens of an agent, an approver, the approver bot, the MCP
// gateway and an admin; no credential; a token the broker does not know)
// and for the holder of the metrics token, under each way of serving it:
// open on the API's listener as every replica did before (an unknown
// token is refused there as on every route); with --metrics-token,
// the token's holder only, whatever their role; with --metrics-listen,
// nobody on the API's listener, everybody on its own; with both, the
// token's holder on its own listener only.
func TestMetricsPerRole(t *testing.T) {
	const (
		roleAgent, roleApprover, roleBot, roleGateway, roleAdmin = "agent", "approver", "bot", "gateway", "admin"
		roleNone, roleBad, roleMetrics                           = "none", "bad", "metrics token"
	)
	roles := []string{roleAgent, roleApprover, roleBot, roleGateway, roleAdmin, roleNone, roleBad, roleMetrics}
	dir := t.TempDir()
	pol := filepath.Join(dir, "policy.yaml")
	authFile := filepath.Join(dir, "auth.yaml")
	tokenFile := filepath.Join(dir, "metrics-token")
	if err := os.WriteFile(pol, []byte("version: 1\nmode: manual\nprincipals:\n  alice: {}\n  bob: {}\n  carol: {}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	const metricsToken = "3f1c9a7e5b2d4f608e1a2b3c4d5e6f70"
	if err := os.WriteFile(tokenFile, []byte(metricsToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	bearer := map[string]string{roleBad: "assent_not-a-token", roleMetrics: metricsToken}
	for role, flags := range map[string][]string{
		roleAgent:    {"--agent", "coder"},
		roleApprover: {"--principal", "alice"},
		roleBot:      {"--principal", "bob"},
		roleGateway:  {"--agent", "desktop", "--principal", "carol"},
		roleAdmin:    {"--admin"},
	} {
		bearer[role] = strings.TrimSpace(itest.CLI(t, app.ExitOK, append([]string{"token", "create", role, "--auth", authFile}, flags...)...))
	}
	// all answers status to every role; but, the same with the exceptions.
	all := func(status int) map[string]int {
		m := map[string]int{}
		for _, r := range roles {
			m[r] = status
		}
		return m
	}
	but := func(m map[string]int, status int, roles ...string) map[string]int {
		for _, r := range roles {
			m[r] = status
		}
		return m
	}
	for _, tt := range []struct {
		name         string
		token        bool
		own          bool
		api, ownWant map[string]int // by role: GET /metrics on the API's listener, on its own
	}{
		{"open, as before", false, false, but(all(200), 401, roleBad, roleMetrics), nil},
		{"--metrics-token", true, false, but(all(401), 200, roleMetrics), nil},
		{"--metrics-listen", false, true, but(all(404), 401, roleBad, roleMetrics), all(200)},
		{"both", true, true, but(all(404), 401, roleBad, roleMetrics), but(all(401), 200, roleMetrics)},
	} {
		t.Run(tt.name, func(t *testing.T) {
			o := app.Options{NATSListen: "127.0.0.1:0", DataDir: t.TempDir(), HTTPListen: "127.0.0.1:0", PolicyFile: pol, AuthFile: authFile}
			if tt.token {
				o.MetricsTokenFile = tokenFile
			}
			if tt.own {
				o.MetricsListen = "127.0.0.1:0"
			}
			a := itest.StartApp(t, o)
			check := func(listener, base string, want map[string]int) {
				t.Helper()
				for _, role := range roles {
					h := http.Header{}
					if tok := bearer[role]; tok != "" {
						h.Set("Authorization", "Bearer "+tok)
					}
					ctx, cancel := itest.OpCtx()
					r, err := itest.DoHTTPWith(ctx, http.MethodGet, base+"/metrics", h, nil)
					cancel()
					if err != nil {
						t.Fatal(err)
					}
					if r.Status != want[role] {
						t.Errorf("%s: GET /metrics as %s: %d, want %d: %.120s", listener, role, r.Status, want[role], r.Body)
					}
					if r.Status == http.StatusOK && !strings.Contains(string(r.Body), "assent_requests_total") {
						t.Errorf("%s: GET /metrics as %s: 200 without the metrics: %.120s", listener, role, r.Body)
					}
				}
			}
			check("the API's listener", a.HTTP, tt.api)
			if tt.own {
				check("its own listener", a.Metrics, tt.ownWant)
			}
		})
	}
}
