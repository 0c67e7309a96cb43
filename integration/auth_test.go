package integration

import (
	"bytes"
	"context"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/assent-dev/assent/internal/app"
	"github.com/assent-dev/assent/internal/broker"
	"github.com/assent-dev/assent/pkg/events"
)

const authPolicy = `version: 1
mode: manual
principals:
  alice: {email: alice@example.com}
  bob:   {email: bob@example.com}
rules:
  - name: deletes
    tools: ["delete_*"]
    action: require_approval
    approvers: [alice]
`

// authApp is the whole broker process with --auth, and the tokens made for
// it with "broker token create".
type authApp struct {
	api    string
	file   string            // the auth file
	tokens map[string]string // by token name
}

// startAuthApp writes a policy and an auth file (trusting a proxy on
// loopback), makes tokens with the CLI, and runs the broker with --auth.
func startAuthApp(t *testing.T) *authApp {
	t.Helper()
	dir := t.TempDir()
	pol := filepath.Join(dir, "policy.yaml")
	file := filepath.Join(dir, "auth.yaml")
	if err := os.WriteFile(pol, []byte(authPolicy), 0o600); err != nil {
		t.Fatal(err)
	}
	proxy := "proxy:\n  header: X-Forwarded-Email\n  trusted: [127.0.0.1]\nadmins: [carol]\n"
	if err := os.WriteFile(file, []byte(proxy), 0o600); err != nil {
		t.Fatal(err)
	}
	a := &authApp{file: file, tokens: map[string]string{}}
	for name, flags := range map[string][]string{
		"deployer": {"--agent", "deployer"},
		"alice":    {"--principal", "alice"},
		"bob":      {"--principal", "bob"},
		"intruder": {"--agent", "intruder"},
		"ops":      {"--admin"},
		"carol":    {"--principal", "carol"}, // an admin by the auth file's admins
	} {
		out := cli(t, app.ExitOK, append([]string{"token", "create", name, "--auth", file}, flags...)...)
		a.tokens[name] = strings.TrimSpace(out)
	}
	addrs := startApp(t, app.Options{NATSListen: "127.0.0.1:0", DataDir: filepath.Join(dir, "data"), HTTPListen: "127.0.0.1:0", PolicyFile: pol, AuthFile: file})
	a.api = addrs.HTTP
	return a
}

// cli runs the broker's CLI with args, wants exit code want, and returns what
// it printed on stdout.
func cli(t *testing.T, want int, args ...string) string {
	t.Helper()
	var out, errOut bytes.Buffer
	if code := (app.CLI{Stdout: &out, Stderr: &errOut}).Run(context.Background(), args); code != want {
		t.Fatalf("broker %s: exit %d, want %d\n%s%s", strings.Join(args, " "), code, want, out.String(), errOut.String())
	}
	return out.String()
}

// as calls the app with the bearer token of name ("" for none, or a literal
// "assent_..." token).
func (a *authApp) as(t *testing.T, name, method, path string, body any) httpResp {
	t.Helper()
	tok := a.tokens[name]
	if tok == "" {
		tok = name
	}
	h := http.Header{}
	if tok != "" {
		h.Set("Authorization", "Bearer "+tok)
	}
	return a.with(t, h, method, path, body)
}

// with calls the app with header.
func (a *authApp) with(t *testing.T, h http.Header, method, path string, body any) httpResp {
	t.Helper()
	ctx, cancel := opCtx()
	defer cancel()
	r, err := doHTTPWith(ctx, method, a.api+path, h, body)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestAuthThroughTheApp: with --auth, every caller of the HTTP API is
// somebody. An agent asks only as its own agent, a person answers only as
// themselves and only what they may answer, a refused call changes nothing,
// and a revoked token stops working without a restart.
func TestAuthThroughTheApp(t *testing.T) {
	a := startAuthApp(t)

	wantError(t, a.as(t, "", http.MethodGet, "/v1/approvals", nil), http.StatusUnauthorized, "unauthenticated")
	wantError(t, a.as(t, "assent_not-a-token", http.MethodGet, "/v1/approvals", nil), http.StatusUnauthorized, "unauthenticated")
	if r := a.as(t, "", http.MethodGet, "/v1/approvals", nil); r.header.Get("WWW-Authenticate") == "" {
		t.Errorf("401 without WWW-Authenticate")
	}

	// Asking: only as the token's own agent.
	req := events.Requested{Agent: "deployer", Tool: "delete_repo", Args: []byte(`{"repo":"x"}`)}
	rec := approvalOf(t, a.as(t, "deployer", http.MethodPost, "/v1/approvals", req), http.StatusCreated)
	if rec.State != broker.StatePending {
		t.Fatalf("request: %+v", rec)
	}
	other := req
	other.Agent = "intruder"
	wantError(t, a.as(t, "deployer", http.MethodPost, "/v1/approvals", other), http.StatusForbidden, "agent_mismatch")
	wantError(t, a.as(t, "alice", http.MethodPost, "/v1/approvals", req), http.StatusForbidden, "agent_mismatch")

	// Answering: as yourself, and only what you may answer.
	path := "/v1/approvals/" + rec.ID + "/decision"
	wantError(t, a.as(t, "bob", http.MethodPost, path, events.Responded{Decision: events.Approve}), http.StatusForbidden, "not_eligible")
	wantError(t, a.as(t, "alice", http.MethodPost, path, decisionBody{"bob", events.Responded{Decision: events.Deny}}), http.StatusForbidden, "principal_mismatch")
	wantError(t, a.as(t, "deployer", http.MethodPost, path, events.Responded{Decision: events.Approve}), http.StatusForbidden, "no_principal")
	wantError(t, a.as(t, "bob", http.MethodPost, "/v1/decisions", map[string]any{"ids": []string{rec.ID}, "decision": "approve", "principal": "alice"}), http.StatusForbidden, "principal_mismatch")
	wantError(t, a.as(t, "deployer", http.MethodPost, "/v1/approvals/"+rec.ID+"/cancel", map[string]string{"by": "alice"}), http.StatusForbidden, "principal_mismatch")
	wantError(t, a.as(t, "bob", http.MethodPost, "/v1/approvals/"+rec.ID+"/cancel", nil), http.StatusForbidden, "agent_mismatch")
	wantError(t, a.as(t, "alice", http.MethodPost, "/v1/approvals/"+rec.ID+"/cancel", nil), http.StatusForbidden, "agent_mismatch")
	wantError(t, a.as(t, "intruder", http.MethodPost, "/v1/approvals/"+rec.ID+"/cancel", nil), http.StatusForbidden, "agent_mismatch")

	// Reading: an agent's token sees its own agent's requests, a principal
	// what it may answer, an admin everything.
	wantError(t, a.as(t, "intruder", http.MethodGet, "/v1/approvals/"+rec.ID, nil), http.StatusNotFound, "not_found")
	wantError(t, a.as(t, "intruder", http.MethodGet, "/v1/approvals?agent=deployer", nil), http.StatusForbidden, "agent_mismatch")
	wantError(t, a.as(t, "intruder", http.MethodGet, "/v1/audit?agent=deployer", nil), http.StatusForbidden, "agent_mismatch")
	wantError(t, a.as(t, "bob", http.MethodGet, "/v1/approvals/"+rec.ID, nil), http.StatusNotFound, "not_found")
	for _, who := range []string{"deployer", "alice", "ops", "carol"} {
		if got := approvalOf(t, a.as(t, who, http.MethodGet, "/v1/approvals/"+rec.ID, nil), http.StatusOK); got.ID != rec.ID {
			t.Fatalf("%s reads %s: %+v", who, rec.ID, got)
		}
	}
	if got := approvalOf(t, a.as(t, "alice", http.MethodGet, "/v1/approvals/"+rec.ID, nil), http.StatusOK); got.State != broker.StatePending {
		t.Fatalf("a refused answer changed the request: %+v", got)
	}
	done := approvalOf(t, a.as(t, "alice", http.MethodPost, path, events.Responded{Decision: events.Approve}), http.StatusOK)
	if done.State != broker.StateApproved || len(done.Decision.DecidedBy) != 1 || done.Decision.DecidedBy[0].Principal != "alice" {
		t.Fatalf("answer: %+v", done)
	}

	// A trusted proxy's header signs a person in; their changes need the
	// session's CSRF token, which a page of the broker hands out.
	proxied := http.Header{"X-Forwarded-Email": {"alice@example.com"}}
	if r := a.with(t, proxied, http.MethodGet, "/v1/approvals?state=approved", nil); r.status != http.StatusOK {
		t.Fatalf("proxied listing: %d %s", r.status, r.body)
	}
	wantError(t, a.with(t, http.Header{"X-Forwarded-Email": {"mallory@example.com"}}, http.MethodGet, "/v1/approvals", nil), http.StatusUnauthorized, "unauthenticated")
	second := approvalOf(t, a.as(t, "deployer", http.MethodPost, "/v1/approvals", req), http.StatusCreated)
	wantError(t, a.with(t, proxied, http.MethodPost, "/v1/approvals/"+second.ID+"/decision", events.Responded{Decision: events.Deny}), http.StatusForbidden, "csrf")

	// The agent withdraws its own request.
	if got := approvalOf(t, a.as(t, "deployer", http.MethodPost, "/v1/approvals/"+second.ID+"/cancel", map[string]string{"reason": "done"}), http.StatusOK); got.State != broker.StateCancelled {
		t.Fatalf("cancel: %+v", got)
	}

	// Revoked: refused from the next call on, with the broker still running.
	cli(t, app.ExitOK, "token", "revoke", "alice", "--auth", a.file)
	for deadline := time.Now().Add(patience); ; time.Sleep(50 * time.Millisecond) {
		r := a.as(t, "alice", http.MethodGet, "/v1/approvals", nil)
		if r.status == http.StatusUnauthorized {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a revoked token still works after %s: %d", patience, r.status)
		}
	}
	if r := a.as(t, "bob", http.MethodGet, "/v1/approvals", nil); r.status != http.StatusOK {
		t.Fatalf("another token stopped working with the revocation: %d %s", r.status, r.body)
	}

	// Failed attempts are counted, and too many from one address are refused
	// for a while, even with a good token.
	var limited bool
	for range 20 {
		r := a.as(t, "assent_guess", http.MethodGet, "/v1/approvals", nil)
		if r.status == http.StatusTooManyRequests {
			limited = true
			if r.header.Get("Retry-After") == "" {
				t.Errorf("429 without Retry-After")
			}
			break
		}
	}
	if !limited {
		t.Fatal("20 failed attempts from one address were never rate limited")
	}
	wantError(t, a.as(t, "bob", http.MethodGet, "/v1/approvals", nil), http.StatusTooManyRequests, "rate_limited")
	metrics := string(call(t, http.MethodGet, a.api+"/metrics", nil).body)
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
	a := startAuthApp(t)
	ask := func(session string) string {
		t.Helper()
		req := events.Requested{Agent: "deployer", Tool: "delete_repo", Session: session, Args: []byte(`{"repo":"x"}`)}
		return approvalOf(t, a.as(t, "deployer", http.MethodPost, "/v1/approvals", req), http.StatusCreated).ID
	}
	s1, s2, other := ask("s-1"), ask("s-1"), ask("s-2")
	cancelledBy := func(id string) string {
		t.Helper()
		got := approvalOf(t, a.as(t, "ops", http.MethodGet, "/v1/approvals/"+id, nil), http.StatusOK)
		if got.State != broker.StateCancelled {
			return ""
		}
		return got.Decision.DecidedBy[0].Principal
	}

	t.Setenv(app.TokenEnv, a.tokens["intruder"])
	out := cli(t, app.ExitFailed, "cancel", "--agent", "deployer", "--http", a.api)
	if cancelledBy(s1) != "" {
		t.Fatalf("another agent's token cancelled: %s", out)
	}
	t.Setenv(app.TokenEnv, a.tokens["deployer"])
	out = cli(t, app.ExitOK, "cancel", "--session", "s-1", "--reason", "the user stopped", "--http", a.api)
	if !strings.Contains(out, "cancelled 2 of 2") || cancelledBy(s1) != "agent/deployer" || cancelledBy(s2) != "agent/deployer" || cancelledBy(other) != "" {
		t.Fatalf("the agent cancels its session: %s", out)
	}
	t.Setenv(app.TokenEnv, a.tokens["ops"])
	out = cli(t, app.ExitOK, "cancel", "--agent", "deployer", "--http", a.api)
	if !strings.Contains(out, "cancelled 1 of 1") || cancelledBy(other) != "admin/ops" {
		t.Fatalf("an admin cancels an agent's: %s", out)
	}
}
