package httpapi_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/assent-dev/assent/internal/access"
	"github.com/assent-dev/assent/internal/auth"
	"github.com/assent-dev/assent/internal/authtest"
	"github.com/assent-dev/assent/internal/broker"
	"github.com/assent-dev/assent/internal/brokertest"
	"github.com/assent-dev/assent/internal/httpapi"
	"github.com/assent-dev/assent/internal/insights"
	"github.com/assent-dev/assent/internal/testenv"
	"github.com/assent-dev/assent/pkg/events"
	"github.com/assent-dev/assent/pkg/policy"
)

func TestParseInsightsQuery(t *testing.T) {
	now := time.Date(2026, 11, 26, 9, 30, 0, 0, time.UTC)
	at := func(s string) time.Time {
		v, err := time.Parse(time.RFC3339, s)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	tests := []struct {
		query string
		want  insights.Filter
		err   []string // in the message, all of them
	}{
		{"", insights.Filter{}, nil},
		{"since=7d", insights.Filter{Since: now.Add(-7 * 24 * time.Hour)}, nil},
		{"since=24h&until=2026-11-20T00:00:00Z", insights.Filter{Since: at("2026-11-19T00:00:00Z"), Until: at("2026-11-20T00:00:00Z")}, nil},
		{"since=2026-11-01T00:00:00Z&until=1d", insights.Filter{Since: at("2026-11-01T00:00:00Z"), Until: now.Add(-24 * time.Hour)}, nil},
		{"until=2026-11-20T00:00:00%2B01:00", insights.Filter{Until: at("2026-11-20T00:00:00+01:00")}, nil},
		{"agent=coder&tool=fs.delete_file&rule=mode:manual&approver=alice", insights.Filter{Agent: "coder", Tool: "fs.delete_file", Rule: "mode:manual", Approver: "alice"}, nil},
		{"since=yesterday", insights.Filter{}, []string{`since: "yesterday" is neither an RFC 3339 time`, "7d, 24h or 90m"}},
		{"until=2026-13-01", insights.Filter{}, []string{"until: "}},
		{"since=2026-11-27T00:00:00Z", insights.Filter{}, []string{"is not before until", "empty"}},
		{"since=400d", insights.Filter{}, []string{"400d", "longer than the 366 days"}},
		{"agent=a.b&approver=alice%20smith", insights.Filter{}, []string{`agent: "a.b" is not a name`, `approver: "alice smith" is not a name`}},
		{"tool=" + url.QueryEscape("rm\u202e"), insights.Filter{}, []string{"tool", "format character U+202E"}},
		{"rule=" + strings.Repeat("r", 257), insights.Filter{}, []string{"rule: longer than 256 bytes"}},
		{"agent=a&agent=b", insights.Filter{}, []string{"agent: given 2 times"}},
	}
	for _, tt := range tests {
		q, err := url.ParseQuery(tt.query)
		if err != nil {
			t.Fatal(err)
		}
		got, err := httpapi.ParseInsightsQuery(q, now)
		if tt.err == nil {
			if err != nil || !got.Since.Equal(tt.want.Since) || !got.Until.Equal(tt.want.Until) ||
				got.Agent != tt.want.Agent || got.Tool != tt.want.Tool || got.Rule != tt.want.Rule || got.Approver != tt.want.Approver {
				t.Errorf("%s: %+v, %v; want %+v", tt.query, got, err, tt.want)
			}
			continue
		}
		for _, w := range tt.err {
			if err == nil || !strings.Contains(err.Error(), w) {
				t.Errorf("%s: error %v, want one saying %q", tt.query, err, w)
			}
		}
	}
}

// TestScopeInsights: who reads which insights (docs/security.md, "Who
// reads insights"): the filter each caller's report is narrowed to, or the
// code of the refusal.
func TestScopeInsights(t *testing.T) {
	var (
		open     = access.Caller{Open: true}
		admin    = access.Caller{Admin: true}
		alice    = access.Caller{Principal: "alice"}
		coder    = access.Caller{Agent: "coder"}
		gateway  = access.Caller{Agent: "desktop", Principal: "carol"}
		nobody   = access.Caller{}
		adminBob = access.Caller{Admin: true, Principal: "bob"}
	)
	f := func(agent, approver string) insights.Filter {
		return insights.Filter{Agent: agent, Approver: approver, Tool: "t"}
	}
	tests := []struct {
		name   string
		c      access.Caller
		in     insights.Filter
		want   insights.Filter
		refuse string
	}{
		{"open: all", open, f("", ""), f("", ""), ""},
		{"open: any filter", open, f("victim", "bob"), f("victim", "bob"), ""},
		{"admin: all", admin, f("", ""), f("", ""), ""},
		{"admin with a principal: all, not only its own", adminBob, f("", ""), f("", ""), ""},
		{"approver: its own answers", alice, f("", ""), f("", "alice"), ""},
		{"approver: its own answers, of an agent", alice, f("victim", ""), f("victim", "alice"), ""},
		{"approver naming itself", alice, f("", "alice"), f("", "alice"), ""},
		{"approver naming another", alice, f("", "bob"), insights.Filter{}, "principal_mismatch"},
		{"agent: its own requests", coder, f("", ""), f("coder", ""), ""},
		{"agent: its own requests, one approver's answers", coder, f("", "bob"), f("coder", "bob"), ""},
		{"agent naming itself", coder, f("coder", ""), f("coder", ""), ""},
		{"agent naming another", coder, f("victim", ""), insights.Filter{}, "agent_mismatch"},
		{"agent naming another, and an approver", coder, f("victim", "bob"), insights.Filter{}, "agent_mismatch"},
		{"gateway: its principal's answers", gateway, f("", ""), f("", "carol"), ""},
		{"gateway naming its agent", gateway, f("desktop", ""), f("desktop", ""), ""},
		{"gateway naming another approver: its agent's requests", gateway, f("", "bob"), f("desktop", "bob"), ""},
		{"gateway naming another agent: its answers there", gateway, f("victim", ""), f("victim", "carol"), ""},
		{"gateway naming another agent and approver", gateway, f("victim", "bob"), insights.Filter{}, "principal_mismatch"},
		{"neither", nobody, f("", ""), insights.Filter{}, "no_principal"},
	}
	for _, tt := range tests {
		got, err := httpapi.ScopeInsights(tt.c, tt.in)
		var refused *httpapi.InsightsRefusal
		switch {
		case tt.refuse != "":
			if !errors.As(err, &refused) || refused.Code != tt.refuse {
				t.Errorf("%s: %+v, %v; want refused %s", tt.name, got, err, tt.refuse)
			}
		case err != nil || got != tt.want:
			t.Errorf("%s: %+v, %v; want %+v", tt.name, got, err, tt.want)
		}
	}
}

// insightsBroker is a real broker whose Insights answers with a report made
// here and records the filters it was asked for.
type insightsBroker struct {
	*broker.Broker
	mu     sync.Mutex
	asked  []insights.Filter
	report insights.Report
	err    error
}

func (b *insightsBroker) Insights(_ context.Context, f insights.Filter) (insights.Report, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.asked = append(b.asked, f)
	rep := b.report
	rep.Filter = f
	return rep, b.err
}

// last returns the filter the broker was last asked for, and forgets it.
func (b *insightsBroker) last() (insights.Filter, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.asked) == 0 {
		return insights.Filter{}, false
	}
	f := b.asked[len(b.asked)-1]
	b.asked = nil
	return f, true
}

// sampleReport is a report with a little of everything, and nil lists where
// the aggregator might leave them nil.
func sampleReport() insights.Report {
	hour := time.Date(2026, 11, 26, 8, 0, 0, 0, time.UTC)
	lo, hi := 1.0, 20.0
	return insights.Report{
		Since: hour.Add(-time.Hour), Until: hour.Add(time.Hour), Through: 42, Complete: true, Progress: 1,
		Totals: insights.Counts{Approved: 3, Denied: 1, Expired: 1, AutoApproved: 4},
		Hours: []insights.HourCounts{{Hour: hour.Add(-time.Hour)},
			{Hour: hour, Counts: insights.Counts{Approved: 3, Denied: 1, Expired: 1, AutoApproved: 4}}},
		ByRule:       []insights.Latency{{Key: "deletes", Decided: 4, P50: events.Duration(3 * time.Second), P90: events.Duration(time.Minute), Expired: 1}},
		RubberStamps: []insights.RubberStamp{{Approver: "alice", Answers: 4, Fast: 2, Share: 0.5, Examples: []string{"r-1", "r-2"}}},
		Unexamined:   insights.Unexamined{Approved: 3, Unedited: 2, Unlooked: 1, Share: 1.0 / 3},
		AlwaysApproved: []insights.Candidate{{Tool: "read_file", Agent: "coder", Count: 6, Principals: []string{"alice"},
			Args:  []insights.ArgPattern{{Field: "path", Varied: true, Prefix: "/srv/"}, {Field: "n", Varied: true, Min: &lo, Max: &hi, Optional: true}, {Field: "mode", Values: []json.RawMessage{json.RawMessage(`"r"`)}}},
			First: hour, Last: hour.Add(30 * time.Minute), Examples: []string{"r-3"}}},
		AlwaysDenied:  []insights.Candidate{{Tool: "drop_db", Agent: "coder", Count: 5, First: hour, Last: hour}},
		Disagreements: []insights.Disagreement{{Live: "require_approval by deletes", Shadow: "allow by tmp", Count: 2, Examples: []string{"r-4"}}},
	}
}

// TestInsightsHandler: the query reaches the broker as a Filter; bad and
// unknown parameters are 400 with what is wrong; the answer is the report,
// with [] for empty lists, as the OpenAPI document says.
func TestInsightsHandler(t *testing.T) {
	real, _ := brokertest.Run(t, testenv.Conn(t, testenv.Server(t)), broker.Config{})
	b := &insightsBroker{Broker: real, report: sampleReport()}
	srv := httptest.NewServer(httpapi.New(b, httpapi.Config{}, testenv.Logger(t)))
	t.Cleanup(srv.Close)
	_, doc := loadOpenAPI(t)
	get := func(query string) (int, []byte) {
		t.Helper()
		resp, err := http.Get(srv.URL + "/v1/insights" + query)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		if err := doc.CheckResponse("GET /v1/insights", resp.StatusCode, body); err != nil {
			t.Error(err)
		}
		return resp.StatusCode, body
	}

	before := time.Now()
	status, body := get("?since=7d&agent=coder&tool=read_file&rule=deletes&approver=alice")
	if status != http.StatusOK {
		t.Fatalf("%d %s", status, body)
	}
	f, ok := b.last()
	if !ok || f.Agent != "coder" || f.Tool != "read_file" || f.Rule != "deletes" || f.Approver != "alice" || !f.Until.IsZero() ||
		f.Since.Before(before.Add(-7*24*time.Hour)) || f.Since.After(time.Now().Add(-7*24*time.Hour)) {
		t.Errorf("the broker was asked for %+v", f)
	}
	var rep insights.Report
	if err := json.Unmarshal(body, &rep); err != nil {
		t.Fatal(err)
	}
	if rep.Totals != sampleReport().Totals || len(rep.Hours) != 2 || rep.RubberStamps[0].Examples[1] != "r-2" || rep.Filter.Approver != "alice" {
		t.Errorf("the report came back as %+v", rep)
	}
	for _, list := range []string{`"by_approver":[]`, `"edited_fields":[]`, `"principals":[]`, `"args":[]`} {
		if !strings.Contains(string(body), list) {
			t.Errorf("the body lacks %s: %s", list, body)
		}
	}

	bad := []struct {
		query string
		want  []string
	}{
		{"?since=last%20week", []string{`since: "last week" is neither an RFC 3339 time`}},
		{"?since=2026-11-20T00:00:00Z&until=2026-11-10T00:00:00Z", []string{"is not before until"}},
		{"?agent=no%20spaces&tool=%07bell", []string{`agent: "no spaces"`, "tool: invalid text: control character U+0007"}},
		{"?window=7d&Agent=coder", []string{`unknown query parameter "Agent", "window"`, "since, until, agent, tool, rule, approver"}},
	}
	for _, tt := range bad {
		status, body := get(tt.query)
		if status != http.StatusBadRequest || errorCode(t, body) != "invalid_request" {
			t.Errorf("%s: %d %s, want 400 invalid_request", tt.query, status, body)
		}
		for _, w := range tt.want {
			if msg := errorMessage(t, body); !strings.Contains(msg, w) {
				t.Errorf("%s: %q, want it to say %q", tt.query, msg, w)
			}
		}
		if f, asked := b.last(); asked {
			t.Errorf("%s: the broker was asked anyway, for %+v", tt.query, f)
		}
	}

	// The broker's failure is the API's: one that gives up is 503.
	b.err = fmt.Errorf("read the record: %w", context.DeadlineExceeded)
	if status, body := get(""); status != http.StatusServiceUnavailable || errorCode(t, body) != "unavailable" {
		t.Errorf("a broker that gave up: %d %s", status, body)
	}
}

// TestInsightsPerRole: GET /v1/insights for every role, through the real
// authentication: who may read which report (the status), and the filter the
// broker is asked for (the caller's scope). TestRoutesPerRole has the same
// statuses against the broker's own Insights.
func TestInsightsPerRole(t *testing.T) {
	ns := testenv.Server(t)
	pol, err := policy.Parse([]byte(authzPolicy), "policy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	real, _ := brokertest.Run(t, testenv.Conn(t, ns), broker.Config{Policy: pol})
	b := &insightsBroker{Broker: real, report: sampleReport()}
	tokens, authn := authtest.New(t, real, map[string]authtest.Token{
		roleAgent:    {Agent: "coder"},
		roleApprover: {Principal: "alice"},
		roleBot:      {Principal: "bob"},
		roleGateway:  {Agent: "desktop", Principal: "carol"},
		roleAdmin:    {Admin: true},
	})
	tokens[roleBad] = "assent_not-a-token"
	api := httpapi.New(b, httpapi.Config{Identify: func(r *http.Request) (httpapi.Identity, bool) {
		id, ok := auth.FromContext(r.Context())
		return httpapi.Identity{Principal: id.Principal, Agent: id.Agent, Admin: id.Admin, Name: id.Name}, ok
	}}, testenv.Logger(t))
	h := authn.Middleware(api)
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Each call from an address of its own: the bad token's are not
		// rate limited.
		r.RemoteAddr = fmt.Sprintf("198.51.100.%d:4000", n.Add(1)%250+1)
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)

	type want struct {
		status          int
		agent, approver string // the scope the broker is asked for
	}
	refused := func(status int) want { return want{status: status} }
	tests := []struct {
		query string
		roles map[string]want
	}{
		{"", map[string]want{
			roleAgent: {200, "coder", ""}, roleApprover: {200, "", "alice"}, roleBot: {200, "", "bob"},
			roleGateway: {200, "", "carol"}, roleAdmin: {200, "", ""}, roleNone: refused(401), roleBad: refused(401)}},
		{"?agent=victim", map[string]want{
			roleAgent: refused(403), roleApprover: {200, "victim", "alice"}, roleBot: {200, "victim", "bob"},
			roleGateway: {200, "victim", "carol"}, roleAdmin: {200, "victim", ""}, roleNone: refused(401), roleBad: refused(401)}},
		{"?approver=alice", map[string]want{
			roleAgent: {200, "coder", "alice"}, roleApprover: {200, "", "alice"}, roleBot: refused(403),
			roleGateway: {200, "desktop", "alice"}, roleAdmin: {200, "", "alice"}, roleNone: refused(401), roleBad: refused(401)}},
		{"?agent=victim&approver=alice", map[string]want{
			roleAgent: refused(403), roleApprover: {200, "victim", "alice"}, roleBot: refused(403),
			roleGateway: refused(403), roleAdmin: {200, "victim", "alice"}, roleNone: refused(401), roleBad: refused(401)}},
	}
	for _, tt := range tests {
		for _, role := range authzRoles {
			w := tt.roles[role]
			req, err := http.NewRequest(http.MethodGet, srv.URL+"/v1/insights"+tt.query, nil)
			if err != nil {
				t.Fatal(err)
			}
			if tok := tokens[role]; tok != "" {
				req.Header.Set("Authorization", "Bearer "+tok)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			f, asked := b.last()
			switch {
			case resp.StatusCode != w.status:
				t.Errorf("%s as %s: %d %s, want %d", tt.query, role, resp.StatusCode, body, w.status)
			case w.status != 200 && asked:
				t.Errorf("%s as %s: refused, but the broker was asked for %+v", tt.query, role, f)
			case w.status == 200 && (!asked || f.Agent != w.agent || f.Approver != w.approver):
				t.Errorf("%s as %s: the broker was asked for agent %q approver %q, want %q %q", tt.query, role, f.Agent, f.Approver, w.agent, w.approver)
			}
			if w.status == 403 && !slices.Contains([]string{"agent_mismatch", "principal_mismatch"}, errorCode(t, body)) {
				t.Errorf("%s as %s: %s, want agent_mismatch or principal_mismatch", tt.query, role, body)
			}
		}
	}
}

// errorMessage reads the message of a JSON error body.
func errorMessage(t *testing.T, body []byte) string {
	t.Helper()
	var e struct {
		Error httpapi.Error `json:"error"`
	}
	if err := json.Unmarshal(body, &e); err != nil {
		t.Fatalf("not a JSON error: %s", body)
	}
	return e.Error.Message
}
