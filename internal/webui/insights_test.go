package webui_test

import (
	"context"
	"encoding/json"
	"fmt"
	"html"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/assent-dev/assent/internal/broker"
	"github.com/assent-dev/assent/internal/insights"
	"github.com/assent-dev/assent/internal/testenv"
	"github.com/assent-dev/assent/internal/webui"
	"github.com/assent-dev/assent/pkg/events"
)

// madeInsights is a real broker whose Insights answers with a report made
// here, and records the filters it was asked for.
type madeInsights struct {
	*broker.Broker
	mu     sync.Mutex
	asked  []insights.Filter
	report insights.Report
}

func (b *madeInsights) Insights(_ context.Context, f insights.Filter) (insights.Report, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.asked = append(b.asked, f)
	rep := b.report
	rep.Filter = f
	return rep, nil
}

func (b *madeInsights) last(t *testing.T) insights.Filter {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.asked) == 0 {
		t.Fatal("the broker was not asked for insights")
	}
	return b.asked[len(b.asked)-1]
}

// serveInsightsUI serves the web UI over b as serve does, for a broker that is not
// only a *broker.Broker.
func serveInsightsUI(t *testing.T, b webui.Broker, cfg webui.Config) *site {
	t.Helper()
	ui, err := webui.New(b, cfg, testenv.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	ui.Register(mux)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return &site{url: srv.URL}
}

var insightsNow = time.Date(2026, 11, 26, 9, 20, 0, 0, time.UTC)

// madeReport is a report with some of everything, over the 3 hours before
// insightsNow; what agents wrote holds control characters and markup.
func madeReport() insights.Report {
	h := func(n int) time.Time { return time.Date(2026, 11, 26, 6+n, 0, 0, 0, time.UTC) }
	lo, hi := 1.0, 20.0
	return insights.Report{
		Since: h(0), Until: insightsNow, Through: 1234, Complete: true, Progress: 1,
		Totals: insights.Counts{Approved: 7, Denied: 2, Expired: 1, Cancelled: 1, AutoApproved: 12, AutoDenied: 3},
		Hours: []insights.HourCounts{
			{Hour: h(0), Counts: insights.Counts{Approved: 2, AutoApproved: 5}},
			{Hour: h(1)},
			{Hour: h(2), Counts: insights.Counts{Approved: 4, Denied: 2, Expired: 1, AutoApproved: 6, AutoDenied: 3}},
			{Hour: h(3), Counts: insights.Counts{Approved: 1, Cancelled: 1, AutoApproved: 1}},
		},
		ByRule: []insights.Latency{
			{Key: "deletes", Decided: 6, P50: events.Duration(4200 * time.Millisecond), P90: events.Duration(95 * time.Second), Expired: 1},
			{Key: "payments", Decided: 3, P50: events.Duration(12 * time.Minute), P90: events.Duration(40 * time.Minute)},
		},
		ByApprover: []insights.Latency{{Key: "alice", Decided: 8, P50: events.Duration(900 * time.Millisecond), P90: events.Duration(30 * time.Second)}},
		RubberStamps: []insights.RubberStamp{{Approver: "alice", Answers: 8, Fast: 3, Share: 0.375,
			Examples: []string{"0193a5b2-7c1e-7d3a-9f1e-3c2b1a0f9e01", "0193a5b2-7c1e-7d3a-9f1e-3c2b1a0f9e02", "0193a5b2-7c1e-7d3a-9f1e-3c2b1a0f9e03"}}},
		Unexamined: insights.Unexamined{Approved: 7, Unedited: 5, Unlooked: 3, Share: 3.0 / 7},
		AlwaysApproved: []insights.Candidate{{Tool: "read_file\u202e", Agent: "coder", Count: 9, Principals: []string{"alice", "bob"},
			Args: []insights.ArgPattern{
				{Field: "path", Varied: true, Prefix: "/srv/<b>reports</b>/"},
				{Field: "lines", Varied: true, Min: &lo, Max: &hi, Optional: true},
				{Field: "mode", Values: []json.RawMessage{json.RawMessage(`"r"`), json.RawMessage(`"rb"`)}},
			},
			First: h(0), Last: h(3), Examples: []string{"0193a5b2-7c1e-7d3a-9f1e-3c2b1a0f9e04"}}},
		AlwaysDenied: []insights.Candidate{{Tool: "drop_database", Agent: "coder", Count: 5, Principals: []string{"bob"},
			Args:  []insights.ArgPattern{{Field: "env", Values: []json.RawMessage{json.RawMessage(`"production"`)}}},
			First: h(0), Last: h(2), LastOther: h(0).Add(-48 * time.Hour),
			Examples: []string{"0193a5b2-7c1e-7d3a-9f1e-3c2b1a0f9e05", "0193a5b2-7c1e-7d3a-9f1e-3c2b1a0f9e06", "0193a5b2-7c1e-7d3a-9f1e-3c2b1a0f9e07",
				"0193a5b2-7c1e-7d3a-9f1e-3c2b1a0f9e08", "0193a5b2-7c1e-7d3a-9f1e-3c2b1a0f9e09"}}},
		Disagreements: []insights.Disagreement{{Live: "require_approval by deletes", Shadow: "allow by tmp-deletes", Count: 4,
			Examples: []string{"0193a5b2-7c1e-7d3a-9f1e-3c2b1a0f9e0a"}}},
		EditedFields: []insights.FieldCount{{Field: "to", Count: 3}, {Field: "subject", Count: 1}},
	}
}

// TestInsightsPage: the tab lays a report out: the chart's bars and the
// legend, every count a link to its requests with the report's filter, the
// tables, the candidates with what their arguments held (escaped), and
// the filter the broker is asked for, the last 7 days by default.
func TestInsightsPage(t *testing.T) {
	b := &madeInsights{Broker: runBroker(t, testPolicy), report: madeReport()}
	s := serveInsightsUI(t, b, webui.Config{Now: func() time.Time { return insightsNow }})

	code, body, _ := s.get(t, "", "/insights")
	if code != http.StatusOK {
		t.Fatalf("status %d\n%s", code, body)
	}
	if f := b.last(t); !f.Since.Equal(insightsNow.Add(-7*24*time.Hour)) || !f.Until.IsZero() || f.Agent != "" || f.Approver != "" {
		t.Errorf("by default the broker was asked for %+v, want the last 7 days", f)
	}
	for _, want := range []string{
		`<a href="/insights" aria-current="page">Insights</a>`,
		`<option value="7d" selected>last 7 days</option>`,
		"<h2 id=\"volume-h\">Decisions per hour</h2>",
		"26 decisions",
		"<strong>12</strong> approved by policy",
		"4.2 s", "1m 35s", "12m", "0.9 s",
		"of 7 asked",
		"38%",
		`&#34;/srv/&lt;b&gt;reports&lt;/b&gt;/&#34;`, "varied, from 1 to 20", "(sometimes absent)", `<code>&#34;r&#34;</code>`, `<code>&#34;rb&#34;</code>`,
		`read_file\u202e`,
		"never decided otherwise by a person", "last decided otherwise",
		"require_approval by deletes", "allow by tmp-deletes",
		"broker policy suggest --since 2026-11-26T06:00:00Z --until 2026-11-26T09:20:00Z",
		`href="/approvals/0193a5b2-7c1e-7d3a-9f1e-3c2b1a0f9e01"`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("the page lacks %q", want)
		}
	}
	if strings.Contains(body, "\u202e") || strings.Contains(body, "<b>reports") {
		t.Error("what an agent wrote is on the page as it is")
	}
	// The chart: a bar per hour, a segment per outcome with a count, each
	// linking to its requests.
	if n := strings.Count(body, `<g class="bar">`); n != 4 {
		t.Errorf("%d bars, want 4", n)
	}
	if n := strings.Count(body, `<rect class="s `); n != 2+5+3 {
		t.Errorf("%d bar segments, want 10", n)
	}
	if strings.Contains(body, "still reading the record") {
		t.Error("a complete report says the replica is still reading")
	}

	// Every count links to its requests, with the report's window.
	hrefs := regexp.MustCompile(`href="(/insights/requests\?[^"]*)"`).FindAllStringSubmatch(body, -1)
	if len(hrefs) < 20 {
		t.Fatalf("%d links to requests", len(hrefs))
	}
	want := map[string]bool{
		"outcome=approved&by=people": false, "outcome=denied&by=policy": false, "outcome=expired&rule=deletes": false,
		"approver=alice&by=people": false, "tool=drop_database&agent=coder&outcome=denied&by=people": false,
		"outcome=approved&by=people&edited=yes&field=to": false, "outcome=approved&by=people&edited=no": false,
		"ids=0193a5b2-7c1e-7d3a-9f1e-3c2b1a0f9e01,0193a5b2-7c1e-7d3a-9f1e-3c2b1a0f9e02,0193a5b2-7c1e-7d3a-9f1e-3c2b1a0f9e03": false,
		"since=2026-11-26T08:00:00Z&until=2026-11-26T09:00:00Z&outcome=expired":                                              false,
	}
	for _, h := range hrefs {
		u, err := url.Parse(html.UnescapeString(h[1]))
		if err != nil {
			t.Fatal(err)
		}
		q := u.Query()
		if q.Get("ids") == "" && (q.Get("since") == "" || q.Get("until") == "") {
			t.Errorf("a link without its window: %s", u)
		}
		for w := range want {
			wq, _ := url.ParseQuery(w)
			all := true
			for k := range wq {
				all = all && q.Get(k) == wq.Get(k)
			}
			if all {
				want[w] = true
			}
		}
	}
	for w, found := range want {
		if !found {
			t.Errorf("no link to the requests of %s", w)
		}
	}

	// The filters go to the broker; bad ones are a page saying what is
	// wrong.
	if code, _, _ := s.get(t, "", "/insights?since=30d&agent=coder&tool=read_file&rule=deletes&approver=alice"); code != http.StatusOK {
		t.Fatalf("filtered: %d", code)
	}
	if f := b.last(t); f.Agent != "coder" || f.Tool != "read_file" || f.Rule != "deletes" || f.Approver != "alice" || !f.Since.Equal(insightsNow.Add(-30*24*time.Hour)) {
		t.Errorf("filtered, the broker was asked for %+v", f)
	}
	code, body, _ = s.get(t, "", "/insights?since=forever")
	if code != http.StatusBadRequest || !strings.Contains(body, "since: &#34;forever&#34; is neither an RFC 3339 time") {
		t.Errorf("a bad window: %d\n%s", code, body)
	}

	// Still reading: says so, with how far.
	b.report.Complete, b.report.Progress = false, 0.424
	_, body, _ = s.get(t, "", "/insights")
	if !strings.Contains(body, "This replica is still reading the record</strong>: 42% read") || !strings.Contains(body, `<progress max="100" value="42"`) {
		t.Error("an incomplete report does not say how far the replica has read")
	}
	// Nothing in the window: each section says so.
	b.report = insights.Report{Since: insightsNow.Add(-24 * time.Hour), Until: insightsNow, Complete: true, Progress: 1}
	code, body, _ = s.get(t, "", "/insights?since=24h")
	if code != http.StatusOK || !strings.Contains(body, "0 decisions") || !strings.Contains(body, "No request in the window went to people.") ||
		!strings.Contains(body, "Nobody approved with edited arguments in the window.") {
		t.Errorf("an empty report: %d\n%s", code, body)
	}
	// A long window: per day.
	long := madeReport()
	long.Hours = nil
	for i := range 30 * 24 {
		long.Hours = append(long.Hours, insights.HourCounts{Hour: insightsNow.Add(time.Duration(i-30*24) * time.Hour).Truncate(time.Hour), Counts: insights.Counts{Approved: i % 3}})
	}
	b.report = long
	_, body, _ = s.get(t, "", "/insights?since=30d")
	if !strings.Contains(body, "Decisions per day") || strings.Count(body, `<g class="bar">`) != 31 || strings.Contains(body, "chart-scroll dense") {
		t.Errorf("30 days: not 31 bars per day (%d), or too dense for a phone", strings.Count(body, `<g class="bar">`))
	}
	// A week: per hour, too many for a phone's width.
	long.Hours = long.Hours[len(long.Hours)-7*24:]
	b.report = long
	_, body, _ = s.get(t, "", "/insights")
	if !strings.Contains(body, "Decisions per hour") || strings.Count(body, `<g class="bar">`) != 7*24 || !strings.Contains(body, "chart-scroll dense") {
		t.Errorf("7 days: not 168 bars per hour (%d) that scroll on a phone", strings.Count(body, `<g class="bar">`))
	}
}

// TestInsightsScopeOnPage: with authentication on, a principal's report
// is of its own answers and says so; naming another approver is refused.
func TestInsightsScopeOnPage(t *testing.T) {
	b := &madeInsights{Broker: runBroker(t, testPolicy), report: madeReport()}
	s := serveInsightsUI(t, b, webui.Config{Now: func() time.Time { return insightsNow }, Identify: func(r *http.Request) (webui.Identity, bool) {
		u := r.Header.Get("X-Test-User")
		return webui.Identity{Principal: u, Method: "test"}, u != ""
	}})
	code, body, _ := s.get(t, "alice", "/insights")
	if code != http.StatusOK || b.last(t).Approver != "alice" || !strings.Contains(body, "You see the requests alice answered") {
		t.Errorf("alice's insights: %d, asked for %+v", code, b.last(t))
	}
	code, body, _ = s.get(t, "alice", "/insights?approver=bob")
	if code != http.StatusForbidden || !strings.Contains(body, "Not yours to read") || !strings.Contains(body, "not of another approver") {
		t.Errorf("alice asking for bob's: %d\n%s", code, body)
	}
	code, _, h := s.get(t, "", "/insights")
	if code != http.StatusSeeOther || !strings.HasPrefix(h.Get("Location"), "/login?next=%2Finsights") {
		t.Errorf("nobody: %d %s", code, h.Get("Location"))
	}
}

// TestInsightsRequests: the requests behind a number, from a real broker's
// record: by outcome, by people or by policy, by rule, tool and approver,
// edited or not and which field, and the example ids of a report.
func TestInsightsRequests(t *testing.T) {
	const pol = `version: 1
mode: manual
principals:
  alice: {roles: [ops]}
  bob:   {roles: [ops]}
rules:
  - name: reads
    tools: ["read_*"]
    action: allow
  - name: drops
    tools: ["drop_*"]
    action: deny
  - name: changes
    tools: ["*"]
    action: require_approval
    approvers: ["role:ops"]
`
	b := runBroker(t, pol)
	s := serveInsightsUI(t, b, webui.Config{})
	ctx := context.Background()
	submit := func(id, tool, args string) broker.Record {
		t.Helper()
		rec, err := b.Submit(ctx, id, "test", events.Requested{Agent: "coder", Tool: tool, Args: json.RawMessage(args)})
		if err != nil {
			t.Fatal(err)
		}
		return rec
	}
	answer := func(id, who string, r events.Responded) {
		t.Helper()
		if _, err := b.Respond(ctx, who, id, r); err != nil {
			t.Fatal(err)
		}
	}
	submit("ins-read", "read_file", `{"path":"/a"}`)
	submit("ins-drop", "drop_db", `{}`)
	submit("ins-send", "send_email", `{"to":"all@example.com","subject":"hi"}`)
	answer("ins-send", "alice", events.Responded{Decision: events.Approve, Args: json.RawMessage(`{"to":"team@example.com","subject":"hi"}`)})
	submit("ins-post", "post_note", `{"text":"x"}`)
	answer("ins-post", "bob", events.Responded{Decision: events.Approve})
	submit("ins-rm", "rm_file", `{"path":"/b"}`)
	answer("ins-rm", "bob", events.Responded{Decision: events.Deny, Reason: "no"})
	submit("ins-stop", "stop_vm", `{}`)
	if _, err := b.Cancel(ctx, "ins-stop", "agent/coder", "changed my mind"); err != nil {
		t.Fatal(err)
	}

	list := func(query string) []string {
		t.Helper()
		var ids []string
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			code, body, _ := s.get(t, "", "/insights/requests?since=1h&"+query)
			if code != http.StatusOK {
				t.Fatalf("%s: %d\n%s", query, code, body)
			}
			ids = regexp.MustCompile(`href="/approvals/(ins-[a-z]+)"`).FindAllString(body, -1)
			for i, m := range ids {
				ids[i] = strings.TrimSuffix(strings.TrimPrefix(m, `href="/approvals/`), `"`)
			}
			// The record is read as it grows: the cancel, stored last, says
			// every decision is in.
			if strings.Contains(query, "ids=") || time.Now().After(deadline) {
				break
			}
			if _, all, _ := s.get(t, "", "/insights/requests?since=1h&outcome=cancelled"); strings.Contains(all, "ins-stop") {
				break
			}
		}
		return ids
	}
	tests := []struct {
		query string
		want  string
	}{
		{"", "ins-read ins-drop ins-send ins-post ins-rm ins-stop"},
		{"outcome=approved", "ins-read ins-send ins-post"},
		{"outcome=approved&by=people", "ins-send ins-post"},
		{"outcome=approved&by=policy", "ins-read"},
		{"outcome=denied&by=policy", "ins-drop"},
		{"outcome=denied&by=people", "ins-rm"},
		{"outcome=cancelled", "ins-stop"},
		{"by=people", "ins-send ins-post ins-rm"},
		{"rule=changes", "ins-send ins-post ins-rm ins-stop"},
		{"approver=bob", "ins-post ins-rm"},
		{"tool=send_email", "ins-send"},
		{"outcome=approved&by=people&edited=yes", "ins-send"},
		{"outcome=approved&by=people&edited=no", "ins-post"},
		{"edited=yes&field=to", "ins-send"},
		{"edited=yes&field=subject", ""},
		{"ids=ins-rm,ins-read,nosuch", "ins-rm ins-read"},
	}
	for _, tt := range tests {
		if got := strings.Join(list(tt.query), " "); got != tt.want {
			t.Errorf("%s: %q, want %q", tt.query, got, tt.want)
		}
	}
	for _, bad := range []string{"outcome=maybe", "by=robots", "edited=perhaps", "ids=a%20b", "after=x", "since=1x"} {
		if code, body, _ := s.get(t, "", "/insights/requests?"+bad); code != http.StatusBadRequest {
			t.Errorf("%s: %d\n%s", bad, code, body)
		}
	}
	_, body, _ := s.get(t, "", "/insights/requests?since=1h&outcome=approved&by=people&agent=coder")
	if !strings.Contains(body, "approved by people · agent coder · ") || !strings.Contains(body, `href="/insights?agent=coder"`) {
		t.Errorf("the list does not say what it holds, or where it came from:\n%s", body)
	}
	_, body, _ = s.get(t, "", "/insights/requests?since=2026-11-26T08:00:00Z&until=2026-11-26T09:00:00Z&outcome=expired&window=30d&rule=changes")
	if !strings.Contains(body, `href="/insights?rule=changes&amp;since=30d"`) {
		t.Errorf("the list does not say what it holds, or where it came from:\n%s", body)
	}
}

// TestInsightsRequestsPages: a long list comes a page at a time, each
// request once.
func TestInsightsRequestsPages(t *testing.T) {
	b := runBroker(t, "version: 1\nmode: auto-approve\n")
	s := serveInsightsUI(t, b, webui.Config{})
	const n = 120
	for i := range n {
		if _, err := b.Submit(context.Background(), fmt.Sprintf("pg-%03d", i), "test", events.Requested{Agent: "coder", Tool: "t", Args: json.RawMessage(`{}`)}); err != nil {
			t.Fatal(err)
		}
	}
	seen := map[string]bool{}
	link := regexp.MustCompile(`href="/approvals/(pg-\d+)"`)
	more := regexp.MustCompile(`href="(/insights/requests\?[^"]*after=[^"]*)">More`)
	for deadline := time.Now().Add(10 * time.Second); len(seen) < n && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		clear(seen)
		path := "/insights/requests?since=1h"
		for pages := 0; path != ""; pages++ {
			if pages > 10 {
				t.Fatal("more than 10 pages")
			}
			_, body, _ := s.get(t, "", path)
			for _, m := range link.FindAllStringSubmatch(body, -1) {
				if seen[m[1]] {
					t.Fatalf("%s listed twice", m[1])
				}
				seen[m[1]] = true
			}
			path = ""
			if m := more.FindStringSubmatch(body); m != nil {
				path = html.UnescapeString(m[1])
			}
		}
	}
	if len(seen) != n {
		t.Errorf("%d of %d requests listed", len(seen), n)
	}
}

// also returns m with role's want set.
func also(m map[string]seen, role string, want seen) map[string]seen {
	m[role] = want
	return m
}

// lastDay is path with the window of the day to now (the real clock: the
// record is written at real times, whatever the pages' clock says).
func lastDay(path string) func(uiTargets) string {
	return func(uiTargets) string {
		now := time.Now().UTC()
		return path + "&since=" + now.Add(-24*time.Hour).Format(time.RFC3339) + "&until=" + now.Add(time.Hour).Format(time.RFC3339)
	}
}

// TestInsightsPageFromBroker: the tab over a real broker's record: what
// people and the policy decided is counted and linked.
func TestInsightsPageFromBroker(t *testing.T) {
	const pol = `version: 1
mode: manual
principals:
  alice: {roles: [ops]}
rules:
  - name: reads
    tools: ["read_*"]
    action: allow
  - name: changes
    tools: ["*"]
    action: require_approval
    approvers: [alice]
`
	b := runBroker(t, pol)
	s := serveInsightsUI(t, b, webui.Config{})
	ctx := context.Background()
	for i := range 5 {
		rec, err := b.Submit(ctx, fmt.Sprintf("fb-rot-%d", i), "test", events.Requested{Agent: "coder", Tool: "rotate_logs", Args: json.RawMessage(`{"service":"web"}`)})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := b.Respond(ctx, "alice", rec.ID, events.Responded{Decision: events.Approve}); err != nil {
			t.Fatal(err)
		}
		if _, err := b.Submit(ctx, fmt.Sprintf("fb-read-%d", i), "test", events.Requested{Agent: "coder", Tool: "read_file", Args: json.RawMessage(`{}`)}); err != nil {
			t.Fatal(err)
		}
	}
	var body string
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		var code int
		code, body, _ = s.get(t, "", "/insights?since=24h")
		if code != http.StatusOK {
			t.Fatalf("status %d\n%s", code, body)
		}
		if strings.Contains(body, "10 decisions") && strings.Contains(body, "always approved") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the tab does not show the record:\n%s", body)
		}
	}
	for _, want := range []string{"<strong>5</strong> approved by people", "<strong>5</strong> approved by policy", "rotate_logs", "&#34;web&#34;", "<strong>5</strong> times</a>"} {
		if !strings.Contains(body, want) {
			t.Errorf("the tab lacks %q", want)
		}
	}
	if n := strings.Count(body, `<g class="bar">`); n < 24 || n > 25 {
		t.Errorf("%d bars for 24 hours", n)
	}
}
