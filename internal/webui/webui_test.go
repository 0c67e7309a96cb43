package webui_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/assent-dev/assent/internal/broker"
	"github.com/assent-dev/assent/internal/brokertest"
	"github.com/assent-dev/assent/internal/testenv"
	"github.com/assent-dev/assent/internal/webui"
	"github.com/assent-dev/assent/pkg/events"
	"github.com/assent-dev/assent/pkg/policy"
)

const testPolicy = `version: 1
mode: manual
principals:
  alice: {roles: [ops]}
  bob:   {roles: [finance]}
rules:
  - name: payments
    tools: [wire_money]
    action: require_approval
    approvers: [bob]
  - name: rest
    tools: ["*"]
    action: require_approval
    approvers: ["role:ops"]
    remember_scopes: [session]
    max_remember: 2h
`

// site is the UI over a real broker, served with a viewer given by the
// X-Test-User header ("" with authentication on means nobody), or by the API
// token of that name.
type site struct {
	b      *broker.Broker
	url    string
	tokens map[string]string // by user
}

func newSite(t *testing.T, withAuth bool, pageSize int) *site {
	t.Helper()
	return newSiteWith(t, testPolicy, withAuth, pageSize)
}

func newSiteWith(t *testing.T, pol string, withAuth bool, pageSize int) *site {
	t.Helper()
	b := runBroker(t, pol)
	cfg := webui.Config{PageSize: pageSize}
	if withAuth {
		cfg.Identify = func(r *http.Request) (webui.Identity, bool) {
			u := r.Header.Get("X-Test-User")
			return webui.Identity{Principal: u, Method: "test"}, u != ""
		}
		cfg.CSRFToken = func(*http.Request) string { return "csrf-of-" + "session" }
	}
	return serve(t, b, cfg, nil)
}

// runBroker runs a broker with policy pol on an embedded NATS server.
func runBroker(t *testing.T, pol string) *broker.Broker {
	t.Helper()
	p, err := policy.Parse([]byte(pol), "policy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := brokertest.Run(t, testenv.Conn(t, testenv.Server(t)), broker.Config{Policy: p})
	return b
}

// serve serves the UI over b, behind wrap if it is not nil.
func serve(t *testing.T, b *broker.Broker, cfg webui.Config, wrap func(http.Handler) http.Handler) *site {
	t.Helper()
	ui, err := webui.New(b, cfg, testenv.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	ui.Register(mux)
	var h http.Handler = mux
	if wrap != nil {
		h = wrap(h)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return &site{b: b, url: srv.URL}
}

func (s *site) submit(t *testing.T, req events.Requested) broker.Record {
	t.Helper()
	if req.Agent == "" {
		req.Agent = "agent-1"
	}
	rec, err := s.b.Submit(context.Background(), "", "test/ui", req)
	if err != nil {
		t.Fatal(err)
	}
	return rec
}

// get fetches path as user and returns the status, body and headers; it does
// not follow redirects.
func (s *site) get(t *testing.T, user, path string) (int, string, http.Header) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, s.url+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if tok := s.tokens[user]; tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	} else if user != "" {
		req.Header.Set("X-Test-User", user)
	}
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }, Timeout: 20 * time.Second}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), resp.Header
}

func TestPagesShowWhatAgentsSentSafely(t *testing.T) {
	s := newSite(t, false, 0)
	rec := s.submit(t, events.Requested{
		Tool: "delete_file",
		Hint: `<script>alert("x")</script> and a` + "\u202e" + `reversed`,
		Args: json.RawMessage(`{"path":"/tmp/report\u202egnp.exe","note":"<img src=x onerror=alert(1)>"}`),
	})
	code, body, h := s.get(t, "", "/")
	if code != http.StatusOK {
		t.Fatalf("status %d", code)
	}
	for _, bad := range []string{"<script>alert", "<img src=x", "\u202e"} {
		if strings.Contains(body, bad) {
			t.Errorf("the page contains %q as it is", bad)
		}
	}
	for _, want := range []string{"&lt;script&gt;", `\u202e`, "control or invisible characters", rec.ID} {
		if !strings.Contains(body, want) {
			t.Errorf("the page lacks %q", want)
		}
	}
	if csp := h.Get("Content-Security-Policy"); !strings.Contains(csp, "script-src 'self'") || !strings.Contains(csp, "frame-ancestors 'none'") {
		t.Errorf("Content-Security-Policy %q", csp)
	}
	if h.Get("X-Content-Type-Options") != "nosniff" {
		t.Error("no X-Content-Type-Options: nosniff")
	}
}

// TestArgsSchemaShownSafely: a request's input_schema is on its card and
// page, collapsed, as a table of arguments and as JSON, with everything the
// agent wrote escaped.
func TestArgsSchemaShownSafely(t *testing.T) {
	s := newSite(t, false, 0)
	rec := s.submit(t, events.Requested{
		Tool: "delete_file",
		Args: json.RawMessage(`{"path":"/tmp/a"}`),
		InputSchema: json.RawMessage(`{"type":"object","required":["path"],"properties":{` +
			`"path":{"type":"string","description":"<script>alert(1)</script> the file"},` +
			`"<img src=x onerror=alert(2)>":{"type":["integer","null"]},` +
			`"mode":{"enum":["soft","hard"],"title":"How"}}}`),
	})
	for _, path := range []string{"/approvals/" + rec.ID, "/ui/cards/" + rec.ID} {
		code, body, _ := s.get(t, "", path)
		if code != http.StatusOK {
			t.Fatalf("%s: status %d", path, code)
		}
		for _, bad := range []string{"<script>alert", "<img src=x", `<details class="args-schema" open`} {
			if strings.Contains(body, bad) {
				t.Errorf("%s contains %q", path, bad)
			}
		}
		for _, want := range []string{
			`<details class="args-schema">`, "<summary>Arguments schema",
			`<code>path</code> <span class="req">required</span>`, "&lt;script&gt;alert(1)&lt;/script&gt; the file",
			"<code>&lt;img src=x onerror=alert(2)&gt;</code>", "integer or null",
			`one of &#34;soft&#34;, &#34;hard&#34;`, "How",
		} {
			if !strings.Contains(body, want) {
				t.Errorf("%s lacks %q", path, want)
			}
		}
	}
	// Without a schema, nothing about one.
	plain := s.submit(t, events.Requested{Tool: "delete_file", Args: json.RawMessage(`{"path":"/tmp/b"}`)})
	if _, body, _ := s.get(t, "", "/ui/cards/"+plain.ID); strings.Contains(body, "Arguments schema") {
		t.Error("a request without input_schema shows an arguments schema")
	}
}

func TestSignInRequired(t *testing.T) {
	s := newSite(t, true, 0)
	for _, path := range []string{"/", "/history?state=denied", "/remembered", "/approvals/x"} {
		code, _, h := s.get(t, "", path)
		if code != http.StatusSeeOther || h.Get("Location") != "/login?next="+url.QueryEscape(path) {
			t.Errorf("%s as nobody: %d to %q", path, code, h.Get("Location"))
		}
	}
	if code, _, _ := s.get(t, "", "/ui/cards"); code != http.StatusUnauthorized {
		t.Errorf("a fragment as nobody: %d", code)
	}
	if code, body, _ := s.get(t, "alice", "/"); code != http.StatusOK || !strings.Contains(body, `data-csrf="csrf-of-session"`) || !strings.Contains(body, `class="me"`) {
		t.Errorf("signed in: %d", code)
	}
}

// TestEligibility: a card offers answers only to those who may give them, and
// says why not to the others who see it (here, the user it was asked on
// behalf of); one who may neither answer nor otherwise see it does not see
// it at all.
func TestEligibility(t *testing.T) {
	s := newSite(t, true, 0)
	pay := s.submit(t, events.Requested{Tool: "wire_money", User: "alice", Args: json.RawMessage(`{"amount":5}`)})
	_, alice, _ := s.get(t, "alice", "/ui/cards/"+pay.ID)
	if strings.Contains(alice, `data-act="approve"`) || !strings.Contains(alice, "not an approver") {
		t.Errorf("alice sees answers to a payment only bob may answer:\n%s", alice)
	}
	bobs := s.submit(t, events.Requested{Tool: "wire_money", Args: json.RawMessage(`{"amount":6}`)})
	if code, _, _ := s.get(t, "alice", "/ui/cards/"+bobs.ID); code != http.StatusNotFound {
		t.Errorf("alice, neither its approver nor its user, gets a payment's card: %d, want 404", code)
	}
	_, bob, _ := s.get(t, "bob", "/ui/cards/"+pay.ID)
	if !strings.Contains(bob, `data-act="approve"`) {
		t.Errorf("bob may answer but sees no button:\n%s", bob)
	}
	other := s.submit(t, events.Requested{Tool: "write_file", Session: "s1"})
	_, card, _ := s.get(t, "alice", "/ui/cards/"+other.ID)
	if !strings.Contains(card, `value="session"`) || !strings.Contains(card, "2 hours (the most allowed)") {
		t.Errorf("the remember choices do not follow the rule:\n%s", card)
	}
}

func TestListingsAndErrors(t *testing.T) {
	s := newSite(t, false, 2)
	var ids []string
	for range 5 {
		ids = append(ids, s.submit(t, events.Requested{Tool: "write_file", Session: "s-list"}).ID)
	}
	_, body, _ := s.get(t, "", "/")
	if !strings.Contains(body, ids[0]) || !strings.Contains(body, ids[1]) || strings.Contains(body, ids[2]) || !strings.Contains(body, "?after="+ids[1]) {
		t.Fatalf("first page of two:\n%s", body)
	}
	_, body, _ = s.get(t, "", "/?after="+ids[1])
	if !strings.Contains(body, ids[2]) || strings.Contains(body, ids[1]) {
		t.Fatalf("second page")
	}
	if !strings.Contains(body, `data-session="s-list"`) || !strings.Contains(body, "Approve all") {
		t.Errorf("no way to answer the whole session")
	}
	if _, err := s.b.Respond(context.Background(), "alice", ids[0], events.Responded{Decision: events.Deny, Reason: "nope"}); err != nil {
		t.Fatal(err)
	}
	// The listing follows the replica's reading of the stream: wait for the
	// denial to reach it.
	var code int
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		code, body, _ = s.get(t, "", "/history?state=denied")
		if code == http.StatusOK && strings.Contains(body, ids[0]) && strings.Contains(body, "nope") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("history: %d", code)
		}
	}
	if _, body, _ := s.get(t, "", "/history?state=approved"); strings.Contains(body, ids[0]) {
		t.Error("a denial among the approvals")
	}
	code, body, _ = s.get(t, "", "/approvals/"+ids[0])
	if code != http.StatusOK || !strings.Contains(body, "Timeline") || !strings.Contains(body, "Decided: denied") {
		t.Fatalf("detail: %d", code)
	}
	if code, body, _ := s.get(t, "", "/history?state=maybe"); code != http.StatusBadRequest || !strings.Contains(body, "approved, denied, expired or cancelled") {
		t.Errorf("bad state: %d", code)
	}
	if code, body, _ := s.get(t, "", "/?agent=a%20b"); code != http.StatusBadRequest || !strings.Contains(body, "letters, digits") {
		t.Errorf("bad agent: %d", code)
	}
	if code, body, _ := s.get(t, "", "/approvals/01a20000-0000-7000-8000-000000000000"); code != http.StatusNotFound || !strings.Contains(body, "No such request") {
		t.Errorf("unknown request: %d", code)
	}
	if code, _, _ := s.get(t, "", "/ui/cards/nope"); code != http.StatusNotFound {
		t.Errorf("unknown card: %d", code)
	}
}

func TestStaticFilesCached(t *testing.T) {
	s := newSite(t, false, 0)
	_, page, _ := s.get(t, "", "/")
	i := strings.Index(page, "/static/app.js?v=")
	if i < 0 {
		t.Fatal("no versioned script on the page")
	}
	src := page[i : i+strings.IndexByte(page[i:], '"')]
	code, js, h := s.get(t, "", src)
	if code != http.StatusOK || !strings.Contains(h.Get("Cache-Control"), "immutable") || !strings.Contains(js, "EventSource") {
		t.Fatalf("%s: %d %q", src, code, h.Get("Cache-Control"))
	}
	if _, _, h := s.get(t, "", "/static/app.css"); h.Get("Cache-Control") != "no-cache" {
		t.Errorf("unversioned file cached: %q", h.Get("Cache-Control"))
	}
}
