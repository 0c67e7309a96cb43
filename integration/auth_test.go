package integration

import (
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/assent-dev/assent/integration/itest"
	"github.com/assent-dev/assent/internal/app"
	"github.com/assent-dev/assent/internal/broker"
	"github.com/assent-dev/assent/pkg/events"
)

// TestAuthThroughTheApp: with --auth, every caller of the HTTP API is
// somebody. An agent asks only as its own agent, a person answers only as
// themselves and only what they may answer, a refused call changes nothing,
// and a revoked token stops working without a restart.
func TestAuthThroughTheApp(t *testing.T) {
	a := itest.StartAuthApp(t)

	itest.WantError(t, a.As(t, "", http.MethodGet, "/v1/approvals", nil), http.StatusUnauthorized, "unauthenticated")
	itest.WantError(t, a.As(t, "assent_not-a-token", http.MethodGet, "/v1/approvals", nil), http.StatusUnauthorized, "unauthenticated")
	if r := a.As(t, "", http.MethodGet, "/v1/approvals", nil); r.Header.Get("WWW-Authenticate") == "" {
		t.Errorf("401 without WWW-Authenticate")
	}

	// Asking: only as the token's own agent.
	req := events.Requested{Agent: "deployer", Tool: "delete_repo", Args: []byte(`{"repo":"x"}`)}
	rec := itest.ApprovalOf(t, a.As(t, "deployer", http.MethodPost, "/v1/approvals", req), http.StatusCreated)
	if rec.State != broker.StatePending {
		t.Fatalf("request: %+v", rec)
	}
	other := req
	other.Agent = "intruder"
	itest.WantError(t, a.As(t, "deployer", http.MethodPost, "/v1/approvals", other), http.StatusForbidden, "agent_mismatch")
	itest.WantError(t, a.As(t, "alice", http.MethodPost, "/v1/approvals", req), http.StatusForbidden, "agent_mismatch")

	// Answering: as yourself, and only what you may answer.
	path := "/v1/approvals/" + rec.ID + "/decision"
	itest.WantError(t, a.As(t, "bob", http.MethodPost, path, events.Responded{Decision: events.Approve}), http.StatusForbidden, "not_eligible")
	itest.WantError(t, a.As(t, "alice", http.MethodPost, path, itest.DecisionBody{Principal: "bob", Responded: events.Responded{Decision: events.Deny}}), http.StatusForbidden, "principal_mismatch")
	itest.WantError(t, a.As(t, "deployer", http.MethodPost, path, events.Responded{Decision: events.Approve}), http.StatusForbidden, "no_principal")
	itest.WantError(t, a.As(t, "bob", http.MethodPost, "/v1/decisions", map[string]any{"ids": []string{rec.ID}, "decision": "approve", "principal": "alice"}), http.StatusForbidden, "principal_mismatch")
	itest.WantError(t, a.As(t, "deployer", http.MethodPost, "/v1/approvals/"+rec.ID+"/cancel", map[string]string{"by": "alice"}), http.StatusForbidden, "principal_mismatch")
	itest.WantError(t, a.As(t, "bob", http.MethodPost, "/v1/approvals/"+rec.ID+"/cancel", nil), http.StatusForbidden, "agent_mismatch")
	itest.WantError(t, a.As(t, "alice", http.MethodPost, "/v1/approvals/"+rec.ID+"/cancel", nil), http.StatusForbidden, "agent_mismatch")
	itest.WantError(t, a.As(t, "intruder", http.MethodPost, "/v1/approvals/"+rec.ID+"/cancel", nil), http.StatusForbidden, "agent_mismatch")

	// Reading: an agent's token sees its own agent's requests, a principal
	// what it may answer, an admin everything.
	itest.WantError(t, a.As(t, "intruder", http.MethodGet, "/v1/approvals/"+rec.ID, nil), http.StatusNotFound, "not_found")
	itest.WantError(t, a.As(t, "intruder", http.MethodGet, "/v1/approvals?agent=deployer", nil), http.StatusForbidden, "agent_mismatch")
	itest.WantError(t, a.As(t, "intruder", http.MethodGet, "/v1/audit?agent=deployer", nil), http.StatusForbidden, "agent_mismatch")
	itest.WantError(t, a.As(t, "bob", http.MethodGet, "/v1/approvals/"+rec.ID, nil), http.StatusNotFound, "not_found")
	for _, who := range []string{"deployer", "alice", "ops", "carol"} {
		if got := itest.ApprovalOf(t, a.As(t, who, http.MethodGet, "/v1/approvals/"+rec.ID, nil), http.StatusOK); got.ID != rec.ID {
			t.Fatalf("%s reads %s: %+v", who, rec.ID, got)
		}
	}
	if got := itest.ApprovalOf(t, a.As(t, "alice", http.MethodGet, "/v1/approvals/"+rec.ID, nil), http.StatusOK); got.State != broker.StatePending {
		t.Fatalf("a refused answer changed the request: %+v", got)
	}
	done := itest.ApprovalOf(t, a.As(t, "alice", http.MethodPost, path, events.Responded{Decision: events.Approve}), http.StatusOK)
	if done.State != broker.StateApproved || len(done.Decision.DecidedBy) != 1 || done.Decision.DecidedBy[0].Principal != "alice" {
		t.Fatalf("answer: %+v", done)
	}

	// A trusted proxy's header signs a person in; their changes need the
	// session's CSRF token, which a page of the broker hands out.
	proxied := http.Header{"X-Forwarded-Email": {"alice@example.com"}}
	if r := a.With(t, proxied, http.MethodGet, "/v1/approvals?state=approved", nil); r.Status != http.StatusOK {
		t.Fatalf("proxied listing: %d %s", r.Status, r.Body)
	}
	itest.WantError(t, a.With(t, http.Header{"X-Forwarded-Email": {"mallory@example.com"}}, http.MethodGet, "/v1/approvals", nil), http.StatusUnauthorized, "unauthenticated")
	second := itest.ApprovalOf(t, a.As(t, "deployer", http.MethodPost, "/v1/approvals", req), http.StatusCreated)
	itest.WantError(t, a.With(t, proxied, http.MethodPost, "/v1/approvals/"+second.ID+"/decision", events.Responded{Decision: events.Deny}), http.StatusForbidden, "csrf")

	// The agent withdraws its own request.
	if got := itest.ApprovalOf(t, a.As(t, "deployer", http.MethodPost, "/v1/approvals/"+second.ID+"/cancel", map[string]string{"reason": "done"}), http.StatusOK); got.State != broker.StateCancelled {
		t.Fatalf("cancel: %+v", got)
	}

	// Revoked: refused from the next call on, with the broker still running.
	itest.CLI(t, app.ExitOK, "token", "revoke", "alice", "--auth", a.File)
	for deadline := time.Now().Add(itest.Patience); ; time.Sleep(50 * time.Millisecond) {
		r := a.As(t, "alice", http.MethodGet, "/v1/approvals", nil)
		if r.Status == http.StatusUnauthorized {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a revoked token still works after %s: %d", itest.Patience, r.Status)
		}
	}
	if r := a.As(t, "bob", http.MethodGet, "/v1/approvals", nil); r.Status != http.StatusOK {
		t.Fatalf("another token stopped working with the revocation: %d %s", r.Status, r.Body)
	}

	// Failed attempts are counted, and too many from one address are refused
	// for a while, even with a good token.
	var limited bool
	for range 20 {
		r := a.As(t, "assent_guess", http.MethodGet, "/v1/approvals", nil)
		if r.Status == http.StatusTooManyRequests {
			limited = true
			if r.Header.Get("Retry-After") == "" {
				t.Errorf("429 without Retry-After")
			}
			break
		}
	}
	if !limited {
		t.Fatal("20 failed attempts from one address were never rate limited")
	}
	itest.WantError(t, a.As(t, "bob", http.MethodGet, "/v1/approvals", nil), http.StatusTooManyRequests, "rate_limited")
	metrics := string(itest.Call(t, http.MethodGet, a.API+"/metrics", nil).Body)
	total := 0
	for _, m := range regexp.MustCompile(`assent_auth_failures_total\{reason="([a-z_]+)"\} (\d+)`).FindAllStringSubmatch(metrics, -1) {
		n, _ := strconv.Atoi(m[2])
		total += n
	}
	if total < 10 {
		t.Fatalf("%d failed authentications in /metrics, want at least 10:\n%s", total, metrics)
	}
}

// TestCancelCommand: "broker cancel" cancels every pending request of an
// agent's session with the agent's token, or an agent's with an admin's,
// each recorded as theirs, and is refused another agent's.
func TestCancelCommand(t *testing.T) {
	a := itest.StartAuthApp(t)
	ask := func(session string) string {
		t.Helper()
		req := events.Requested{Agent: "deployer", Tool: "delete_repo", Session: session, Args: []byte(`{"repo":"x"}`)}
		return itest.ApprovalOf(t, a.As(t, "deployer", http.MethodPost, "/v1/approvals", req), http.StatusCreated).ID
	}
	s1, s2, other := ask("s-1"), ask("s-1"), ask("s-2")
	cancelledBy := func(id string) string {
		t.Helper()
		got := itest.ApprovalOf(t, a.As(t, "ops", http.MethodGet, "/v1/approvals/"+id, nil), http.StatusOK)
		if got.State != broker.StateCancelled {
			return ""
		}
		return got.Decision.DecidedBy[0].Principal
	}

	t.Setenv(app.TokenEnv, a.Tokens["intruder"])
	out := itest.CLI(t, app.ExitFailed, "cancel", "--agent", "deployer", "--http", a.API)
	if cancelledBy(s1) != "" {
		t.Fatalf("another agent's token cancelled: %s", out)
	}
	t.Setenv(app.TokenEnv, a.Tokens["deployer"])
	out = itest.CLI(t, app.ExitOK, "cancel", "--session", "s-1", "--reason", "the user stopped", "--http", a.API)
	if !strings.Contains(out, "cancelled 2 of 2") || cancelledBy(s1) != "agent/deployer" || cancelledBy(s2) != "agent/deployer" || cancelledBy(other) != "" {
		t.Fatalf("the agent cancels its session: %s", out)
	}
	t.Setenv(app.TokenEnv, a.Tokens["ops"])
	out = itest.CLI(t, app.ExitOK, "cancel", "--agent", "deployer", "--http", a.API)
	if !strings.Contains(out, "cancelled 1 of 1") || cancelledBy(other) != "admin/ops" {
		t.Fatalf("an admin cancels an agent's: %s", out)
	}
}
