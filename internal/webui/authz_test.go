package webui_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/assent-dev/assent/internal/auth"
	"github.com/assent-dev/assent/internal/authtest"
	"github.com/assent-dev/assent/internal/broker"
	"github.com/assent-dev/assent/internal/webui"
	"github.com/assent-dev/assent/pkg/events"
	"github.com/assent-dev/assent/pkg/policy"
)

// authzPolicy: reads are allowed without anyone; alice and dave answer
// deletes, bob payments. authzPolicyLater is the same after dave stopped
// answering deletes.
const authzPolicy = `version: 1
mode: manual
principals:
  alice: {}
  bob: {}
  dave: {}
rules:
  - name: reads
    tools: ["read_*"]
    action: allow
  - name: deletes
    tools: ["delete_*"]
    action: require_approval
    approvers: [alice, dave]
  - name: payments
    tools: ["pay_*"]
    action: require_approval
    approvers: [bob]
`

var authzPolicyLater = strings.Replace(authzPolicy, "approvers: [alice, dave]", "approvers: [alice]", 1)

// Who looks at the pages, signed in with an API token (the UI takes the
// same credentials as the API) or not at all.
const (
	roleApprover = "approver" // alice: may answer deletes
	roleOther    = "other"    // bob: may answer payments, not deletes
	roleAnswered = "answered" // dave: answered a delete, answers none now
	roleAdmin    = "admin"
	roleAgent    = "agent" // agent coder's token
	roleNone     = "none"  // no credential
)

var uiRoles = []string{roleApprover, roleOther, roleAnswered, roleAdmin, roleAgent, roleNone}

// What a role gets of a route and the request (or remembered choice) a case
// is about.
type seen int

const (
	shown   seen = iota + 1 // 200, with the target on it
	hidden                  // 200, with nothing of the target on it
	missing                 // 404, the same as for a request there is none of
	signIn                  // 303 to sign in (a page)
	unauth                  // 401 (a fragment the script fetches)
	served                  // 200 (a static file)
	refused                 // 403, with nothing of the target on it
)

func (s seen) String() string {
	return [...]string{"?", "shown", "hidden", "missing", "signIn", "unauth", "served", "refused"}[s]
}

// uiTargets are what the cases look for, made once.
type uiTargets struct {
	pending      string // victim's delete, waiting for alice
	own          string // agent coder's payment, waiting for bob
	denied       string // a delete dave denied
	auto         string // agent coder's read, which the allow rule decided
	grant        string // a remembered choice of the deletes rule, alice's
	grantRequest string
}

// secret is what a request's arguments hold: no page may show it to one
// who may not see the request.
func secret(id string) string { return "s3cret-of-" + id }

func newAuthzSite(t *testing.T) (*site, uiTargets) {
	t.Helper()
	b := runBroker(t, authzPolicy)
	tokens, authn := authtest.New(t, b, map[string]authtest.Token{
		roleApprover: {Principal: "alice"},
		roleOther:    {Principal: "bob"},
		roleAnswered: {Principal: "dave"},
		roleAdmin:    {Admin: true},
		roleAgent:    {Agent: "coder"},
	})
	// As the broker process composes them (internal/app).
	cfg := webui.Config{Identify: func(r *http.Request) (webui.Identity, bool) {
		id, ok := auth.FromContext(r.Context())
		return webui.Identity{Principal: id.Principal, Agent: id.Agent, Admin: id.Admin, Method: id.Method}, ok
	}, CSRFToken: func(r *http.Request) string { return auth.CSRFToken(r.Context()) },
		Now: func() time.Time { return time.Date(2026, 11, 26, 9, 0, 0, 0, time.UTC) }}
	s := serve(t, b, cfg, authn.Middleware)
	s.tokens = tokens

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	n := 0
	submit := func(agent, tool, session string) broker.Record {
		t.Helper()
		n++
		id := fmt.Sprintf("ui-%s-%d", agent, n)
		rec, err := b.Submit(ctx, id, "test", events.Requested{Agent: agent, Tool: tool, Session: session, Args: []byte(`{"secret":"` + secret(id) + `"}`)})
		if err != nil {
			t.Fatalf("submit %s: %v", id, err)
		}
		return rec
	}
	var ts uiTargets
	ts.pending = submit("victim", "delete_db", "").ID
	ts.own = submit("coder", "pay_x", "").ID
	ts.denied = submit("victim", "delete_old", "").ID
	if _, err := b.Respond(ctx, "dave", ts.denied, events.Responded{Decision: events.Deny, Reason: "not today"}); err != nil {
		t.Fatal(err)
	}
	if rec := submit("coder", "read_x", ""); rec.State != broker.StateApproved {
		t.Fatalf("a read: %s, want approved by its rule", rec.State)
	} else {
		ts.auto = rec.ID
	}
	ts.grantRequest = submit("victim", "delete_tmp", "s-grant").ID
	if _, err := b.Respond(ctx, "alice", ts.grantRequest, events.Responded{Decision: events.Approve, Remember: &events.Remember{Scope: events.ScopeSession}}); err != nil {
		t.Fatal(err)
	}
	for _, g := range b.Remembered() {
		if g.RequestID == ts.grantRequest {
			ts.grant = g.ID
		}
	}
	if ts.grant == "" {
		t.Fatal("no remembered choice")
	}
	later, err := policy.Parse([]byte(authzPolicyLater), "policy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	b.SetPolicy(later)
	// The history follows the replica's reading of the stream: wait for the
	// decisions to reach it.
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		_, body, _ := s.get(t, roleAdmin, "/history")
		if strings.Contains(body, ts.denied) && strings.Contains(body, ts.auto) && strings.Contains(body, ts.grantRequest) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the history lacks the decisions:\n%s", body)
		}
	}
	return s, ts
}

// uiCase is one look at a route, by each role in turn.
type uiCase struct {
	name   string
	path   func(uiTargets) string
	target func(uiTargets) string // what is looked for on the page
	want   map[string]seen        // by role
}

// pageWant is a page's: want for the roles named, other for the other roles
// signed in, and a sign-in for the one who is not.
func pageWant(want, other seen, roles ...string) map[string]seen {
	m := map[string]seen{roleNone: signIn}
	for _, r := range uiRoles[:len(uiRoles)-1] {
		m[r] = other
	}
	for _, r := range roles {
		m[r] = want
	}
	return m
}

// fragmentWant is a fragment's: as a page's, but 401 for the one who is not
// signed in.
func fragmentWant(want, other seen, roles ...string) map[string]seen {
	m := pageWant(want, other, roles...)
	m[roleNone] = unauth
	return m
}

func at(p string) func(uiTargets) string { return func(uiTargets) string { return p } }

func pendingOf(ts uiTargets) string { return ts.pending }
func ownOf(ts uiTargets) string     { return ts.own }
func deniedOf(ts uiTargets) string  { return ts.denied }
func autoOf(ts uiTargets) string    { return ts.auto }

// TestUIRoutesPerRole: every route of the web UI, looked at by every role:
// what each is shown of others' requests and remembered choices, the same as
// the HTTP API shows it (docs/web.md, "Who sees what"). A route added without
// cases here fails.
func TestUIRoutesPerRole(t *testing.T) {
	s, ts := newAuthzSite(t)
	page := func(prefix string, id func(uiTargets) string) func(uiTargets) string {
		return func(ts uiTargets) string { return prefix + id(ts) }
	}
	cases := map[string][]uiCase{
		"GET /{$}": {
			{"another agent's delete", at("/"), pendingOf, pageWant(shown, hidden, roleApprover, roleAdmin)},
			{"the agent's own payment", at("/"), ownOf, pageWant(shown, hidden, roleOther, roleAgent, roleAdmin)},
			{"?agent=victim", at("/?agent=victim"), pendingOf, pageWant(shown, hidden, roleApprover, roleAdmin)},
		},
		"GET /history": {
			{"a delete dave denied", at("/history"), deniedOf, pageWant(shown, hidden, roleApprover, roleAnswered, roleAdmin)},
			{"what an allow rule decided", at("/history"), autoOf, pageWant(shown, hidden, roleAgent, roleAdmin)},
			{"?state=denied", at("/history?state=denied"), deniedOf, pageWant(shown, hidden, roleApprover, roleAnswered, roleAdmin)},
		},
		"GET /approvals/{id}": {
			{"a delete dave denied", page("/approvals/", deniedOf), deniedOf, pageWant(shown, missing, roleApprover, roleAnswered, roleAdmin)},
			{"another agent's delete", page("/approvals/", pendingOf), pendingOf, pageWant(shown, missing, roleApprover, roleAdmin)},
			{"the agent's own payment", page("/approvals/", ownOf), ownOf, pageWant(shown, missing, roleOther, roleAgent, roleAdmin)},
			{"what an allow rule decided", page("/approvals/", autoOf), autoOf, pageWant(shown, missing, roleAgent, roleAdmin)},
		},
		"GET /remembered": {
			{"a choice of the deletes rule", at("/remembered"), func(ts uiTargets) string { return ts.grant }, pageWant(shown, hidden, roleApprover, roleAdmin)},
		},
		// Insights: everyone signed in reads a report, narrowed to what it
		// sees (an approver its own answers, an agent its own requests),
		// and is refused another's; the requests behind its numbers are
		// those the viewer sees (httpapi.TestInsightsPerRole has the
		// scopes).
		"GET /insights": {
			{"the report", at("/insights"), at("Decisions per"), pageWant(shown, shown)},
			{"?agent=victim", at("/insights?agent=victim"), at("Decisions per"), also(pageWant(shown, shown), roleAgent, refused)},
			{"?approver=dave", at("/insights?approver=dave"), at("Decisions per"), pageWant(shown, refused, roleAnswered, roleAdmin, roleAgent)},
		},
		"GET /insights/requests": {
			{"a delete dave denied", lastDay("/insights/requests?outcome=denied"), deniedOf, pageWant(shown, hidden, roleAnswered, roleAdmin)},
			{"what an allow rule decided", lastDay("/insights/requests?by=policy"), autoOf, pageWant(shown, hidden, roleAgent, roleAdmin)},
			{"a report's examples", func(ts uiTargets) string { return "/insights/requests?ids=" + ts.denied + "," + ts.auto }, deniedOf,
				pageWant(shown, hidden, roleApprover, roleAnswered, roleAdmin)},
		},
		"GET /ui/cards": {
			{"another agent's delete", at("/ui/cards"), pendingOf, fragmentWant(shown, hidden, roleApprover, roleAdmin)},
			{"the agent's own payment", at("/ui/cards"), ownOf, fragmentWant(shown, hidden, roleOther, roleAgent, roleAdmin)},
		},
		"GET /ui/cards/{id}": {
			{"a delete dave denied", page("/ui/cards/", deniedOf), deniedOf, fragmentWant(shown, missing, roleApprover, roleAnswered, roleAdmin)},
			{"the agent's own payment", page("/ui/cards/", ownOf), ownOf, fragmentWant(shown, missing, roleOther, roleAgent, roleAdmin)},
			{"what an allow rule decided", page("/ui/cards/", autoOf), autoOf, fragmentWant(shown, missing, roleAgent, roleAdmin)},
		},
		"GET /static/": {
			{"the styles", at("/static/app.css"), at(""), map[string]seen{roleApprover: served, roleOther: served, roleAnswered: served, roleAdmin: served, roleAgent: served, roleNone: served}},
		},
	}
	ui, err := webui.New(nil, webui.Config{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	const nobody = "ui-nobody-0" // no request has this id
	for _, route := range ui.Routes() {
		tcs, ok := cases[route]
		if !ok {
			t.Errorf("%s: no cases: say what each role gets", route)
			continue
		}
		for _, tc := range tcs {
			path, target := tc.path(ts), tc.target(ts)
			for _, role := range uiRoles {
				want := tc.want[role]
				if want == 0 {
					t.Fatalf("%s (%s): no want for %s", route, tc.name, role)
				}
				code, body, h := s.get(t, role, path)
				on := target != "" && (strings.Contains(body, target) || strings.Contains(body, secret(target)))
				var wrong string
				switch want {
				case shown:
					if code != http.StatusOK || !on {
						wrong = "not shown"
					}
				case hidden:
					if code != http.StatusOK || on {
						wrong = "not hidden"
					}
				case missing:
					// Exactly what one gets for a request that does not
					// exist: its ids are not a viewer's to probe.
					_, none, _ := s.get(t, role, strings.Replace(path, target, nobody, 1))
					if code != http.StatusNotFound || strings.Contains(body, secret(target)) || strings.ReplaceAll(body, target, nobody) != none {
						wrong = "not as missing as an unknown id"
					}
				case signIn:
					if code != http.StatusSeeOther || !strings.HasPrefix(h.Get("Location"), "/login?next=") {
						wrong = "not sent to sign in"
					}
				case unauth:
					if code != http.StatusUnauthorized || on {
						wrong = "not refused"
					}
				case served:
					if code != http.StatusOK {
						wrong = "not served"
					}
				case refused:
					if code != http.StatusForbidden || on {
						wrong = "not refused"
					}
				}
				if wrong != "" {
					t.Errorf("%s (%s) as %s: %s, want %s (status %d)", route, tc.name, role, wrong, want, code)
				}
			}
		}
	}
}

// TestUICountsWhatTheViewerSees: the pending count (the page's title, the
// cards' X-Total) is of the requests the viewer sees.
func TestUICountsWhatTheViewerSees(t *testing.T) {
	s, _ := newAuthzSite(t)
	for role, want := range map[string]int{roleApprover: 1, roleOther: 1, roleAnswered: 0, roleAgent: 1, roleAdmin: 2} {
		_, _, h := s.get(t, role, "/ui/cards")
		_, body, _ := s.get(t, role, "/")
		title := "<title>Pending · "
		if want > 0 {
			title = fmt.Sprintf("<title>Pending (%d) · ", want)
		}
		if h.Get("X-Total") != fmt.Sprint(want) || !strings.Contains(body, title) {
			t.Errorf("%s: X-Total %q and the page's title, want %d pending", role, h.Get("X-Total"), want)
		}
	}
}

// TestUIWithoutAuthSeesAll: without authentication (loopback only), every
// page shows everything, as before.
func TestUIWithoutAuthSeesAll(t *testing.T) {
	s := newSiteWith(t, authzPolicy, false, 0)
	ctx := context.Background()
	auto, err := s.b.Submit(ctx, "ui-open-auto", "test", events.Requested{Agent: "coder", Tool: "read_x", Args: []byte(`{}`)})
	if err != nil {
		t.Fatal(err)
	}
	pay := s.submit(t, events.Requested{Tool: "pay_x", Args: []byte(`{}`)})
	for _, path := range []string{"/", "/ui/cards", "/approvals/" + pay.ID, "/ui/cards/" + pay.ID, "/approvals/" + auto.ID} {
		if code, body, _ := s.get(t, "", path); code != http.StatusOK || !strings.Contains(body, pay.ID) && !strings.Contains(body, auto.ID) {
			t.Errorf("%s: %d", path, code)
		}
	}
}
