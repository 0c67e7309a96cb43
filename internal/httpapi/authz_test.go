package httpapi_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/assent-dev/assent/internal/auth"
	"github.com/assent-dev/assent/internal/authtest"
	"github.com/assent-dev/assent/internal/broker"
	"github.com/assent-dev/assent/internal/brokertest"
	"github.com/assent-dev/assent/internal/httpapi"
	"github.com/assent-dev/assent/internal/testenv"
	"github.com/assent-dev/assent/pkg/events"
	"github.com/assent-dev/assent/pkg/policy"
)

// authzPolicy: reads are allowed without anyone; alice answers deletes,
// bob (the approver bot's principal) answers payments, carol (the MCP
// gateway's elicitation principal) answers nothing of a rule, and anyone what
// falls to the manual mode.
const authzPolicy = `version: 1
mode: manual
principals:
  alice: {}
  bob: {}
  carol: {}
rules:
  - name: reads
    tools: ["read_*"]
    action: allow
  - name: deletes
    tools: ["delete_*"]
    action: require_approval
    approvers: [alice]
  - name: payments
    tools: ["pay_*"]
    action: require_approval
    approvers: [bob]
`

// The roles of the HTTP API's callers, as tokens of the auth file: an agent
// (coder), an approver (alice), the approver bot's principal (bob), the MCP
// gateway's (agent desktop, principal carol), an admin, nobody, and a token
// the broker does not know.
const (
	roleAgent    = "agent"
	roleApprover = "approver"
	roleBot      = "bot"
	roleGateway  = "gateway"
	roleAdmin    = "admin"
	roleNone     = "none"
	roleBad      = "bad"
)

var authzRoles = []string{roleAgent, roleApprover, roleBot, roleGateway, roleAdmin, roleNone, roleBad}

// authzEnv is a broker behind the real authentication and the gateway, as
// the broker process composes them.
type authzEnv struct {
	b      *broker.Broker
	url    string
	tokens map[string]string // by role
	n      atomic.Int64
}

func newAuthzEnv(t *testing.T) *authzEnv {
	t.Helper()
	ns := testenv.Server(t)
	pol, err := policy.Parse([]byte(authzPolicy), "policy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := brokertest.Run(t, testenv.Conn(t, ns), broker.Config{Policy: pol})
	tokens, authn := authtest.New(t, b, map[string]authtest.Token{
		roleAgent:    {Agent: "coder"},
		roleApprover: {Principal: "alice"},
		roleBot:      {Principal: "bob"},
		roleGateway:  {Agent: "desktop", Principal: "carol"},
		roleAdmin:    {Admin: true},
	})
	e := &authzEnv{b: b, tokens: tokens}
	e.tokens[roleBad] = "assent_not-a-token"
	api := httpapi.New(b, httpapi.Config{Identify: func(r *http.Request) (httpapi.Identity, bool) {
		id, ok := auth.FromContext(r.Context())
		return httpapi.Identity{Principal: id.Principal, Agent: id.Agent, Admin: id.Admin, Name: id.Name}, ok
	}, Heartbeat: 50 * time.Millisecond}, testenv.Logger(t))
	// Each role calls from an address of its own (X-Role): the bad token's
	// failures must not get the others rate limited.
	// The bad token calls from a new address each time, so that it is
	// refused for itself, not rate limited.
	h := authn.Middleware(api)
	var bad atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.RemoteAddr = fmt.Sprintf("192.0.2.%d:4000", 1+slices.Index(authzRoles, r.Header.Get("X-Role")))
		if r.Header.Get("X-Role") == roleBad {
			n := bad.Add(1)
			r.RemoteAddr = fmt.Sprintf("198.51.%d.%d:4000", n/250, n%250+1)
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	e.url = srv.URL
	return e
}

// call makes one request as role and returns its status and body.
func (e *authzEnv) call(t *testing.T, role, method, path string, body any) (int, []byte) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			t.Fatal(err)
		}
		rd = bytes.NewReader(b)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, e.url+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	if rd != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if tok := e.tokens[role]; tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	req.Header.Set("X-Role", role)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		return resp.StatusCode, nil // an open stream: the status is what is asked
	}
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, out
}

// submit makes a pending request of agent for tool, in session.
func (e *authzEnv) submit(t *testing.T, agent, tool, session string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	id := fmt.Sprintf("authz-%s-%d", agent, e.n.Add(1))
	rec, err := e.b.Submit(ctx, id, "test", events.Requested{Agent: agent, Tool: tool, Session: session, Args: []byte(`{"secret":"` + agent + `"}`)})
	if err != nil || rec.State != broker.StatePending {
		t.Fatalf("submit %s: %v (%s)", id, err, rec.State)
	}
	return id
}

// remembered makes a remembered choice of rule deletes (alice's) and returns
// its id.
func (e *authzEnv) remembered(t *testing.T) string {
	t.Helper()
	session := fmt.Sprintf("grant-%d", e.n.Add(1))
	id := e.submit(t, "victim", "delete_db", session)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := e.b.Respond(ctx, "alice", id, events.Responded{Decision: events.Approve, Remember: &events.Remember{Scope: events.ScopeSession}}); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		for _, g := range e.b.Remembered() {
			if g.RequestID == id {
				return g.ID
			}
		}
	}
	t.Fatalf("no remembered choice from %s", id)
	return ""
}

// authzCase is one call of a route, made by each role in turn.
type authzCase struct {
	name string
	// call returns the method's path and body for role; fresh requests and
	// choices are made for calls that change them.
	call func(t *testing.T, e *authzEnv, role string) (path string, body any)
	want map[string]int // by role
}

// everyone answers status to every role with a credential, 401 to the rest.
func everyone(status int) map[string]int {
	return map[string]int{roleAgent: status, roleApprover: status, roleBot: status, roleGateway: status, roleAdmin: status, roleNone: 401, roleBad: 401}
}

// only answers status to the roles named, other to the rest with a
// credential, and 401 without one.
func only(status, other int, roles ...string) map[string]int {
	m := everyone(other)
	for _, r := range roles {
		m[r] = status
	}
	return m
}

// with returns m with role's status set.
func with(m map[string]int, role string, status int) map[string]int {
	m[role] = status
	return m
}

// open200 is an open route's: 200 without a credential too, and 401 for a
// credential the broker does not know.
func open200() map[string]int {
	m := everyone(200)
	m[roleNone] = 200
	return m
}

// TestRoutesPerRole: every route of the API, called by every role, on
// another agent's request (and, where a role may act on its own, on its
// own): the status each role gets. A route added without cases here fails.
// GET /metrics is the broker process's, not the API's: its roles, under
// each way of serving it, are integration's TestMetricsPerRole.
func TestRoutesPerRole(t *testing.T) {
	e := newAuthzEnv(t)
	victim := func(t *testing.T, e *authzEnv, _ string) string {
		return e.submit(t, "victim", "delete_db", "s-victim")
	}
	own := map[string]string{roleAgent: "coder", roleGateway: "desktop"}
	cases := map[string][]authzCase{
		"POST /v1/approvals": {
			{"another agent's", func(*testing.T, *authzEnv, string) (string, any) {
				return "/v1/approvals", map[string]any{"agent": "victim", "tool": "delete_db"}
			}, only(0, 403)},
			{"its own agent's", func(_ *testing.T, _ *authzEnv, role string) (string, any) {
				return "/v1/approvals", map[string]any{"agent": cmpOr(own[role], "coder"), "tool": "delete_x"}
			}, only(201, 403, roleAgent, roleGateway)},
		},
		"GET /v1/approvals": {
			{"?agent=another", func(*testing.T, *authzEnv, string) (string, any) { return "/v1/approvals?agent=victim", nil },
				only(200, 403, roleApprover, roleBot, roleGateway, roleAdmin)},
		},
		"GET /v1/approvals/{id}": {
			{"another agent's", func(t *testing.T, e *authzEnv, role string) (string, any) {
				return "/v1/approvals/" + victim(t, e, role), nil
			}, only(200, 404, roleApprover, roleAdmin)},
			{"its own agent's", func(t *testing.T, e *authzEnv, role string) (string, any) {
				return "/v1/approvals/" + e.submit(t, cmpOr(own[role], "coder"), "pay_x", ""), nil
			}, only(200, 404, roleAgent, roleGateway, roleBot, roleAdmin)},
		},
		"POST /v1/approvals/{id}/decision": {
			{"another agent's", func(t *testing.T, e *authzEnv, role string) (string, any) {
				return "/v1/approvals/" + victim(t, e, role) + "/decision", map[string]any{"decision": "deny"}
			}, only(200, 403, roleApprover)},
		},
		"POST /v1/approvals/{id}/cancel": {
			{"another agent's", func(t *testing.T, e *authzEnv, role string) (string, any) {
				return "/v1/approvals/" + victim(t, e, role) + "/cancel", nil
			}, only(200, 403, roleAdmin)},
			{"its own agent's", func(t *testing.T, e *authzEnv, role string) (string, any) {
				return "/v1/approvals/" + e.submit(t, cmpOr(own[role], "coder"), "delete_x", "") + "/cancel", nil
			}, only(200, 403, roleAgent, roleGateway, roleAdmin)},
		},
		"POST /v1/decisions": {
			{"another agent's session", func(t *testing.T, e *authzEnv, role string) (string, any) {
				victim(t, e, role)
				return "/v1/decisions", map[string]any{"session": "s-victim", "decision": "deny"}
			}, only(403, 200, roleAgent, roleAdmin)},
		},
		"POST /v1/cancels": {
			{"another agent's", func(t *testing.T, e *authzEnv, role string) (string, any) {
				victim(t, e, role)
				return "/v1/cancels", map[string]any{"agent": "victim"}
			}, only(200, 403, roleAdmin)},
			{"its own agent's", func(t *testing.T, e *authzEnv, role string) (string, any) {
				e.submit(t, cmpOr(own[role], "coder"), "delete_x", "")
				return "/v1/cancels", map[string]any{"reason": "done"}
			}, with(only(200, 403, roleAgent, roleGateway), roleAdmin, 400)}, // an admin names whose

		},
		"GET /v1/events": {
			{"?agent=another", func(*testing.T, *authzEnv, string) (string, any) { return "/v1/events?agent=victim&after=0", nil },
				only(200, 403, roleApprover, roleBot, roleGateway, roleAdmin)},
		},
		"GET /v1/audit": {
			{"?agent=another", func(*testing.T, *authzEnv, string) (string, any) { return "/v1/audit?agent=victim", nil },
				only(200, 403, roleApprover, roleBot, roleGateway, roleAdmin)},
		},
		"GET /v1/insights": {
			// Everyone with a credential reads insights, each narrowed to
			// what it sees (TestInsightsPerRole has the scopes).
			{"all", func(*testing.T, *authzEnv, string) (string, any) { return "/v1/insights", nil }, everyone(200)},
			{"?agent=another", func(*testing.T, *authzEnv, string) (string, any) { return "/v1/insights?agent=victim", nil },
				only(200, 403, roleApprover, roleBot, roleGateway, roleAdmin)},
			{"?approver=another", func(*testing.T, *authzEnv, string) (string, any) { return "/v1/insights?approver=alice", nil },
				only(403, 200, roleBot)},
		},
		"GET /v1/remembered": {
			{"all", func(*testing.T, *authzEnv, string) (string, any) { return "/v1/remembered", nil }, everyone(200)},
		},
		"DELETE /v1/remembered/{id}": {
			{"alice's rule's", func(t *testing.T, e *authzEnv, _ string) (string, any) {
				return "/v1/remembered/" + e.remembered(t), nil
			},
				only(200, 403, roleApprover, roleAdmin)},
		},
		"GET /v1/openapi.json": {{"", func(*testing.T, *authzEnv, string) (string, any) { return "/v1/openapi.json", nil }, open200()}},
		"GET /healthz":         {{"", func(*testing.T, *authzEnv, string) (string, any) { return "/healthz", nil }, open200()}},
		"GET /readyz":          {{"", func(*testing.T, *authzEnv, string) (string, any) { return "/readyz", nil }, open200()}},
	}
	for _, route := range httpapi.New(nil, httpapi.Config{}, nil).Routes() {
		tcs, ok := cases[route]
		if !ok {
			t.Errorf("%s: no cases: say what each role gets", route)
			continue
		}
		method, _, _ := strings.Cut(route, " ")
		for _, tc := range tcs {
			for _, role := range authzRoles {
				want := tc.want[role]
				if want == 0 {
					want = 403
				}
				path, body := tc.call(t, e, role)
				if got, out := e.call(t, role, method, path, body); got != want {
					t.Errorf("%s (%s) as %s: %d %s, want %d", route, tc.name, role, got, out, want)
				}
			}
		}
	}
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// TestWhoSeesWhat: what each role's listing, audit log, event stream and
// remembered choices hold of others' requests, and that filters cannot widen
// them.
func TestWhoSeesWhat(t *testing.T) {
	e := newAuthzEnv(t)
	del := e.submit(t, "victim", "delete_db", "s-1") // alice's to answer
	pay := e.submit(t, "victim", "pay_rent", "s-1")  // bob's
	mine := e.submit(t, "coder", "pay_coffee", "")   // the agent's own, bob's to answer
	desk := e.submit(t, "desktop", "other_tool", "") // the gateway's own; anyone answers under manual mode
	grant := e.remembered(t)                         // alice's rule
	all := []string{del, pay, mine, desk}

	list := func(role, query string) []string {
		t.Helper()
		status, body := e.call(t, role, "GET", "/v1/approvals?state=pending&limit=1000"+query, nil)
		if status != 200 {
			t.Fatalf("%s lists %s: %d %s", role, query, status, body)
		}
		var page struct {
			Approvals []httpapi.Approval `json:"approvals"`
			Total     int                `json:"total"`
		}
		if err := json.Unmarshal(body, &page); err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, a := range page.Approvals {
			if slices.Contains(all, a.ID) {
				ids = append(ids, a.ID)
			}
		}
		if page.Total != len(page.Approvals) {
			t.Errorf("%s lists %s: total %d, %d approvals", role, query, page.Total, len(page.Approvals))
		}
		slices.Sort(ids)
		return ids
	}
	sorted := func(ids ...string) []string { slices.Sort(ids); return ids }
	// What each role sees, in listings and in the audit log alike.
	sees := []struct {
		role string
		want []string
	}{
		{roleAgent, sorted(mine)},
		{roleApprover, sorted(del, desk)},
		{roleBot, sorted(pay, mine, desk)},
		{roleGateway, sorted(desk)},
		{roleAdmin, sorted(all...)},
	}
	for _, tc := range sees {
		if got := list(tc.role, ""); !slices.Equal(got, tc.want) {
			t.Errorf("%s lists %v, want %v", tc.role, got, tc.want)
		}
		// A filter narrows what a role sees; it never widens it.
		var victims []string
		for _, id := range tc.want {
			if id == del || id == pay {
				victims = append(victims, id)
			}
		}
		if tc.role != roleAgent {
			if got := list(tc.role, "&agent=victim"); !slices.Equal(got, victims) {
				t.Errorf("%s lists ?agent=victim: %v, want %v", tc.role, got, victims)
			}
		}
	}
	// An approver's page of one holds one it sees, with a next.
	status, body := e.call(t, roleApprover, "GET", "/v1/approvals?state=pending&limit=1", nil)
	var page struct {
		Approvals []httpapi.Approval `json:"approvals"`
		Next      string             `json:"next"`
	}
	if err := json.Unmarshal(body, &page); status != 200 || err != nil || len(page.Approvals) != 1 || page.Next == "" {
		t.Errorf("a page of one: %d %s", status, body)
	}

	// The audit log and the event stream hold the events of the same
	// requests.
	audit := func(role string) []string {
		t.Helper()
		status, body := e.call(t, role, "GET", "/v1/audit?limit=1000", nil)
		if status != 200 {
			t.Fatalf("%s audit: %d %s", role, status, body)
		}
		var page broker.AuditPage
		if err := json.Unmarshal(body, &page); err != nil {
			t.Fatal(err)
		}
		return requestsOf(page.Events, all)
	}
	for _, tc := range sees {
		if got := audit(tc.role); !slices.Equal(got, tc.want) {
			t.Errorf("%s's audit log has events of %v, want %v", tc.role, got, tc.want)
		}
		// The stream from its start, up to the last of the requests the
		// role sees.
		until := desk
		if tc.role == roleAgent {
			until = mine
		}
		if got := e.follow(t, tc.role, "/v1/events?after=0", until, all); !slices.Equal(got, tc.want) {
			t.Errorf("%s's event stream has events of %v, want %v", tc.role, got, tc.want)
		}
	}

	// A request the policy decided was nobody's to answer: only its agent
	// and an admin see it.
	rec, err := e.b.Submit(context.Background(), "authz-auto", "test", events.Requested{Agent: "victim", Tool: "read_db", Args: []byte(`{}`)})
	if err != nil || rec.State != broker.StateApproved {
		t.Fatalf("an allowed request: %v %s", err, rec.State)
	}
	for role, want := range map[string]int{roleAgent: 404, roleApprover: 404, roleBot: 404, roleGateway: 404, roleAdmin: 200} {
		if status, body := e.call(t, role, "GET", "/v1/approvals/authz-auto", nil); status != want {
			t.Errorf("%s reads a request an allow rule decided: %d %s, want %d", role, status, body, want)
		}
	}

	// Remembered choices: the ones a role may revoke.
	for role, want := range map[string]bool{roleAgent: false, roleApprover: true, roleBot: false, roleGateway: false, roleAdmin: true} {
		_, body := e.call(t, role, "GET", "/v1/remembered", nil)
		if got := strings.Contains(string(body), grant); got != want {
			t.Errorf("%s sees remembered choice %s: %v, want %v (%s)", role, grant, got, want, body)
		}
	}

	// What a principal answered stays its to see when the policy no longer
	// lets it answer; what it did not answer does not.
	var answered string
	for _, g := range e.b.Remembered() {
		if g.ID == grant {
			answered = g.RequestID
		}
	}
	moved, err := policy.Parse([]byte(strings.Replace(authzPolicy, "approvers: [alice]", "approvers: [bob]", 1)), "policy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	e.b.SetPolicy(moved)
	for id, want := range map[string]int{answered: 200, del: 404} {
		if status, body := e.call(t, roleApprover, "GET", "/v1/approvals/"+id, nil); status != want {
			t.Errorf("alice, no longer an approver of deletes, reads %s: %d %s, want %d", id, status, body, want)
		}
	}
}

// requestsOf lists the requests among ids that evs are about, sorted.
func requestsOf(evs []*broker.Event, ids []string) []string {
	var out []string
	for _, ev := range evs {
		if slices.Contains(ids, ev.RequestID) && !slices.Contains(out, ev.RequestID) {
			out = append(out, ev.RequestID)
		}
	}
	slices.Sort(out)
	return out
}

// follow reads the event stream at path as role until an event of request
// until has come (or a deadline), and returns the requests among ids that
// the events were about.
func (e *authzEnv) follow(t *testing.T, role, path, until string, ids []string) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, "GET", e.url+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+e.tokens[role])
	req.Header.Set("X-Role", role)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("%s follows %s: %d", role, path, resp.StatusCode)
	}
	var evs []*broker.Event
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		var ev broker.Event
		if err := json.Unmarshal([]byte(data), &ev); err != nil {
			t.Fatal(err)
		}
		evs = append(evs, &ev)
		if ev.RequestID == until {
			break
		}
	}
	return requestsOf(evs, ids)
}

// errorCode reads the code of a JSON error body.
func errorCode(t *testing.T, body []byte) string {
	t.Helper()
	var e struct {
		Error httpapi.Error `json:"error"`
	}
	if err := json.Unmarshal(body, &e); err != nil {
		t.Fatalf("not a JSON error: %s", body)
	}
	return e.Error.Code
}

// TestCancelWhoAndCodes: a cancel is the request's agent's or an admin's,
// recorded as who asked; everyone else is told agent_mismatch, and a body
// "by" naming someone else principal_mismatch. POST /v1/cancels applies the
// same to each request it selects.
func TestCancelWhoAndCodes(t *testing.T) {
	e := newAuthzEnv(t)
	refused := []struct {
		name, role, agent string
		body              any
		code              string
	}{
		{"an agent, another agent's request", roleAgent, "victim", nil, "agent_mismatch"},
		{"the approver who may answer it", roleApprover, "victim", nil, "agent_mismatch"},
		{"a gateway, another agent's request", roleGateway, "coder", nil, "agent_mismatch"},
		{"an agent naming a principal", roleAgent, "coder", map[string]string{"by": "alice"}, "principal_mismatch"},
		{"an admin naming someone", roleAdmin, "coder", map[string]string{"by": "alice"}, "principal_mismatch"},
	}
	for _, tc := range refused {
		id := e.submit(t, tc.agent, "delete_x", "")
		status, body := e.call(t, tc.role, "POST", "/v1/approvals/"+id+"/cancel", tc.body)
		if status != http.StatusForbidden || errorCode(t, body) != tc.code {
			t.Errorf("%s: %d %s, want 403 %s", tc.name, status, body, tc.code)
		}
		if rec, err := e.b.Get(context.Background(), id); err != nil || rec.State != broker.StatePending {
			t.Errorf("%s: a refused cancel changed the request: %v %s", tc.name, err, rec.State)
		}
	}
	recorded := func(id string) string {
		t.Helper()
		rec, err := e.b.Get(context.Background(), id)
		if err != nil || rec.State != broker.StateCancelled || rec.Decision == nil || len(rec.Decision.DecidedBy) != 1 {
			t.Fatalf("%s: %v %+v", id, err, rec)
		}
		return rec.Decision.DecidedBy[0].Principal
	}
	for role, want := range map[string]string{roleAgent: "agent/coder", roleGateway: "agent/desktop", roleAdmin: "admin/admin"} {
		id := e.submit(t, cmpOr(map[string]string{roleGateway: "desktop"}[role], "coder"), "delete_x", "")
		if status, body := e.call(t, role, "POST", "/v1/approvals/"+id+"/cancel", map[string]string{"reason": "done"}); status != http.StatusOK {
			t.Fatalf("%s cancels: %d %s", role, status, body)
		}
		if got := recorded(id); got != want {
			t.Errorf("%s's cancel recorded as %q, want %q", role, got, want)
		}
	}

	// Many at once: an agent's session, its own requests only.
	a1, a2 := e.submit(t, "coder", "delete_a", "s-9"), e.submit(t, "coder", "delete_b", "s-9")
	other := e.submit(t, "victim", "delete_c", "s-9")
	elsewhere := e.submit(t, "coder", "delete_d", "s-10")
	var out struct {
		Results []httpapi.Result `json:"results"`
		Total   int              `json:"total"`
		Done    int              `json:"cancelled"`
	}
	status, body := e.call(t, roleAgent, "POST", "/v1/cancels", map[string]string{"session": "s-9", "reason": "the user stopped"})
	if err := json.Unmarshal(body, &out); status != http.StatusOK || err != nil || out.Done != 2 || out.Total != 2 {
		t.Fatalf("an agent cancels its session: %d %s", status, body)
	}
	for _, id := range []string{a1, a2} {
		if got := recorded(id); got != "agent/coder" {
			t.Errorf("%s recorded as %q", id, got)
		}
	}
	for _, id := range []string{other, elsewhere} {
		if rec, _ := e.b.Get(context.Background(), id); rec.State != broker.StatePending {
			t.Errorf("%s (not the agent's, or another session) was cancelled", id)
		}
	}
	// By ids: each one the agent's own or refused.
	mine := e.submit(t, "coder", "delete_e", "")
	status, body = e.call(t, roleAgent, "POST", "/v1/cancels", map[string]any{"ids": []string{mine, other, "no-such"}})
	if err := json.Unmarshal(body, &out); status != http.StatusOK || err != nil || out.Done != 1 || out.Total != 3 {
		t.Fatalf("an agent cancels by ids: %d %s", status, body)
	}
	for i, want := range []string{"cancelled", "agent_mismatch", "not_found"} {
		if out.Results[i].Status != want {
			t.Errorf("result %d: %+v, want %s", i, out.Results[i], want)
		}
	}
	// Another agent's, by name: refused whole. An admin's: done.
	if status, body := e.call(t, roleAgent, "POST", "/v1/cancels", map[string]string{"agent": "victim"}); status != http.StatusForbidden || errorCode(t, body) != "agent_mismatch" {
		t.Errorf("an agent cancels another agent's: %d %s", status, body)
	}
	status, body = e.call(t, roleAdmin, "POST", "/v1/cancels", map[string]string{"agent": "victim", "session": "s-9"})
	if err := json.Unmarshal(body, &out); status != http.StatusOK || err != nil || out.Done != 1 || recorded(other) != "admin/admin" {
		t.Fatalf("an admin cancels another agent's session: %d %s", status, body)
	}
}

// TestEventsFromTheStart: after=0 replays the stream from its start;
// without after, only the events stored since the stream said it is
// connected come, and every one of them.
func TestEventsFromTheStart(t *testing.T) {
	e := newAuthzEnv(t)
	old := e.submit(t, "coder", "delete_old", "")
	if got := e.follow(t, roleAdmin, "/v1/events?after=0", old, []string{old}); !slices.Equal(got, []string{old}) {
		t.Fatalf("after=0: events of %v, want %s's", got, old)
	}
	// Live only: the first request event that comes is a new one's.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", e.url+"/v1/events?type=requested", nil)
	req.Header.Set("Authorization", "Bearer "+e.tokens[roleAdmin])
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() && sc.Text() != ": connected" {
	}
	// Connected means following: a request made at once is the first
	// event.
	fresh := e.submit(t, "coder", "delete_new", "")
	for sc.Scan() {
		if data, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
			var ev broker.Event
			if err := json.Unmarshal([]byte(data), &ev); err != nil {
				t.Fatal(err)
			}
			if ev.RequestID != fresh {
				t.Fatalf("without after, the first event is %s's, want %s's (live only, from when it said connected)", ev.RequestID, fresh)
			}
			return
		}
	}
	t.Fatalf("no event: %v", sc.Err())
}
