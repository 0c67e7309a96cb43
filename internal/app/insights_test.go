package app_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/assent-dev/assent/internal/app"
	"github.com/assent-dev/assent/internal/insights"
	"github.com/assent-dev/assent/pkg/events"
	"github.com/assent-dev/assent/pkg/policy"
)

// cliReport is a report with some of everything, and evil where agents and
// approvers write.
func cliReport() insights.Report {
	h := func(n int) time.Time { return time.Date(2026, 11, 26, 6+n, 0, 0, 0, time.UTC) }
	lo, hi := 1.0, 20.0
	return insights.Report{
		Filter: insights.Filter{Agent: "coder"},
		Since:  h(0), Until: h(3), Complete: false, Progress: 0.5,
		Totals: insights.Counts{Approved: 6, Denied: 1, AutoApproved: 4, Expired: 1},
		Hours: []insights.HourCounts{
			{Hour: h(0), Counts: insights.Counts{Approved: 2, AutoApproved: 3}},
			{Hour: h(1)},
			{Hour: h(2), Counts: insights.Counts{Approved: 4, Denied: 1, AutoApproved: 1, Expired: 1}},
		},
		ByRule:       []insights.Latency{{Key: "deletes" + evil, Decided: 7, P50: events.Duration(4200 * time.Millisecond), P90: events.Duration(95 * time.Second), Expired: 1}},
		ByApprover:   []insights.Latency{{Key: "alice", Decided: 7, P50: events.Duration(800 * time.Millisecond), P90: events.Duration(2 * time.Hour)}},
		RubberStamps: []insights.RubberStamp{{Approver: "alice", Answers: 7, Fast: 3, Share: 3.0 / 7, Examples: []string{"r-1", "r-2" + evil}}},
		Unexamined:   insights.Unexamined{Approved: 6, Unedited: 5, Unlooked: 2, Share: 2.0 / 6},
		AlwaysApproved: []insights.Candidate{{Tool: "read" + evil, Agent: "coder", Count: 6, Principals: []string{"alice"},
			Args: []insights.ArgPattern{{Field: "path", Varied: true, Prefix: "/srv/"}, {Field: "n", Varied: true, Min: &lo, Max: &hi, Optional: true},
				{Field: "mode", Values: []json.RawMessage{json.RawMessage(`"r"`), json.RawMessage(`"rb"`)}}},
			First: h(0), Last: h(2), Examples: []string{"r-3"}}},
		Disagreements: []insights.Disagreement{{Live: "require_approval by deletes", Shadow: "allow by tmp", Count: 2}},
		EditedFields:  []insights.FieldCount{{Field: "to", Count: 3}},
	}
}

func TestPrintInsights(t *testing.T) {
	var out bytes.Buffer
	if err := app.PrintInsights(&out, cliReport(), time.Now()); err != nil {
		t.Fatal(err)
	}
	s := out.String()
	checkEscaped(t, s,
		"Insights from 2026-11-26 06:00 to 2026-11-26 09:00 UTC (3h), agent coder\n",
		"Still reading the record: 50% read.",
		"Decisions: 12\n",
		"  approved by people  6  50%\n",
		"  approved by policy  4  33%\n",
		"Per hour (UTC):\n",
		"  Nov 26 06:00  5  AAaaa\n",
		"  Nov 26 07:00  0\n",
		"  Nov 26 08:00  7  AAAAaDx\n",
		"A approved by people, a approved by policy, D denied by people",
		"  RULE                         DECIDED   P50    P90  EXPIRED\n",
		"  deletes"+evilShown+"        7  4.2s  1m35s   1 of 8\n",
		"  alice           7  0.8s  2h0m\n",
		"  alice           7          3    43%  r-1 r-2"+evilShown+"\n",
		"Of 6 approvals by people, 5 kept the arguments as asked and 2 (33%) were also given without a look",
		"  read"+evilShown+" (agent coder): 6 times by alice, Nov 26 06:00 to Nov 26 08:00; never decided otherwise by a person\n",
		`    path  varied, each starting with "/srv/"`,
		"    n     varied, from 1 to 20 (sometimes absent)\n",
		`    mode  "r" or "rb"`,
		"Always denied (candidates for deny rules)\n  none",
		"  require_approval by deletes  allow by tmp         2\n",
		"  to         3\n",
	)

	// Many decisions an hour: the bars are scaled, each outcome still seen.
	rep := cliReport()
	rep.Hours[0].Counts = insights.Counts{Approved: 400, Expired: 1}
	out.Reset()
	if err := app.PrintInsights(&out, rep, time.Now()); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "a character for about 8.02 decisions") || !strings.Contains(out.String(), "  Nov 26 06:00  401  "+strings.Repeat("A", 50)+"x\n") {
		t.Errorf("scaled:\n%s", out.String())
	}
	// Beyond two days: per day.
	rep.Hours = nil
	for i := range 72 {
		rep.Hours = append(rep.Hours, insights.HourCounts{Hour: time.Date(2026, 11, 24, i, 0, 0, 0, time.UTC), Counts: insights.Counts{Denied: 1}})
	}
	out.Reset()
	if err := app.PrintInsights(&out, rep, time.Now()); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "Per day (UTC):\n  Tue Nov 24  24  "+strings.Repeat("D", 24)+"\n  Wed Nov 25  24") {
		t.Errorf("per day:\n%s", out.String())
	}
}

// insightsServer answers GET /v1/insights with rep, or with an error for a
// query holding "bad", and records the queries.
func insightsServer(t *testing.T, rep insights.Report) (*httptest.Server, func() string) {
	t.Helper()
	var mu sync.Mutex
	var last string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/insights" {
			t.Errorf("unexpected %s %s", r.Method, r.URL)
			http.NotFound(w, r)
			return
		}
		mu.Lock()
		last = r.URL.RawQuery
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		if strings.Contains(r.URL.RawQuery, "bad") {
			w.WriteHeader(http.StatusBadRequest)
			fmt.Fprint(w, `{"error":{"code":"invalid_request","message":"since: \"bad\" is neither an RFC 3339 time such as 2026-11-22T10:00:00Z nor a duration such as 7d, 24h or 90m"}}`)
			return
		}
		_ = json.NewEncoder(w).Encode(rep)
	}))
	t.Cleanup(srv.Close)
	return srv, func() string { mu.Lock(); defer mu.Unlock(); return last }
}

// TestCLIInsights: the flags are the query; --json prints the report as the
// API sent it; the API's refusal is the command's, in its words.
func TestCLIInsights(t *testing.T) {
	srv, last := insightsServer(t, cliReport())
	code, out, errOut := run(t, "insights", "--http", srv.URL, "--since", "24h", "--until", "2026-11-26T09:00:00Z", "--agent", "coder", "--tool", "read_file", "--rule", "deletes", "--approver", "alice")
	if code != app.ExitOK || errOut != "" || !strings.Contains(out, "Decisions: 12") {
		t.Fatalf("exit %d\n%s%s", code, out, errOut)
	}
	if q := last(); q != "agent=coder&approver=alice&rule=deletes&since=24h&tool=read_file&until=2026-11-26T09%3A00%3A00Z" {
		t.Errorf("asked %s", q)
	}
	if code, _, _ := run(t, "insights", "--http", srv.URL); code != app.ExitOK || last() != "since=7d" {
		t.Errorf("by default: exit %d, asked %q, want the last 7 days", code, last())
	}
	code, out, _ = run(t, "insights", "--http", srv.URL, "--json")
	var rep insights.Report
	if err := json.Unmarshal([]byte(out), &rep); code != app.ExitOK || err != nil || rep.Totals.Approved != 6 || !strings.Contains(out, "\n  \"totals\": {") {
		t.Errorf("--json: exit %d, %v\n%s", code, err, out)
	}
	code, out, errOut = run(t, "insights", "--http", srv.URL, "--since", "bad")
	if code != app.ExitFailed || out != "" || !strings.Contains(errOut, `broker insights: invalid_request: since: "bad" is neither an RFC 3339 time`) {
		t.Errorf("a bad window: exit %d\n%s%s", code, out, errOut)
	}
}

// TestCLIPolicySuggest: the candidates of the report become rules.
func TestCLIPolicySuggest(t *testing.T) {
	rep := cliReport()
	rep.AlwaysApproved[0].Tool = "read_file"
	srv, last := insightsServer(t, rep)
	code, out, errOut := run(t, "policy", "suggest", "--http", srv.URL, "--agent", "coder", "--document")
	if code != app.ExitOK || errOut != "" || last() != "agent=coder&since=30d" {
		t.Fatalf("exit %d, asked %q\n%s%s", code, last(), out, errOut)
	}
	p, err := policy.Parse([]byte(out), "suggested.yaml")
	if err != nil {
		t.Fatalf("the suggestion does not load: %v\n%s", err, out)
	}
	if len(p.Rules) != 1 || p.Rules[0].Action != policy.Allow || !strings.Contains(out, "read_file") {
		t.Errorf("rules %+v\n%s", p.Rules, out)
	}
	if code, _, errOut := run(t, "policy", "suggest", "--http", srv.URL, "--only", "maybe"); code != app.ExitUsage || !strings.Contains(errOut, "want allow or deny") {
		t.Errorf("--only maybe: exit %d %s", code, errOut)
	}
}

// TestCLIInsightsFromBroker: "broker insights" and "broker policy suggest"
// against a running broker: what people decided, there as a report and as
// rules.
func TestCLIInsightsFromBroker(t *testing.T) {
	dir := t.TempDir()
	pol := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(pol, []byte(`version: 1
mode: manual
principals:
  alice: {}
rules:
  - name: reads
    tools: ["list_*"]
    action: allow
  - name: changes
    tools: ["*"]
    action: require_approval
    approvers: [alice]
`), 0o600); err != nil {
		t.Fatal(err)
	}
	addrs := runApp(t, app.Options{NATSListen: "127.0.0.1:0", DataDir: filepath.Join(dir, "data"), HTTPListen: "127.0.0.1:0", PolicyFile: pol})
	c := &http.Client{Timeout: patience}
	ask := func(tool, args string) string {
		t.Helper()
		status, body, err := call(t, c, http.MethodPost, addrs.HTTP+"/v1/approvals", `{"agent":"coder","tool":"`+tool+`","args":`+args+`}`)
		var created struct{ ID string }
		if err != nil || status != http.StatusCreated || json.Unmarshal(body, &created) != nil {
			t.Fatalf("ask: %d %s %v", status, body, err)
		}
		return created.ID
	}
	answer := func(id, decision string) {
		t.Helper()
		if status, body, err := call(t, c, http.MethodPost, addrs.HTTP+"/v1/approvals/"+id+"/decision", `{"principal":"alice","decision":"`+decision+`"}`); err != nil || status != http.StatusOK {
			t.Fatalf("answer: %d %s %v", status, body, err)
		}
	}
	for range 5 {
		answer(ask("rotate_logs", `{"service":"web"}`), "approve")
		answer(ask("drop_table", `{"table":"users"}`), "deny")
	}
	ask("list_files", `{}`)

	var out, errOut string
	for deadline := time.Now().Add(patience); ; time.Sleep(100 * time.Millisecond) {
		var code int
		code, out, errOut = run(t, "insights", "--http", addrs.HTTP)
		if code == app.ExitOK && strings.Contains(out, "approved by people  5") && strings.Contains(out, "approved by policy  1") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("broker insights: exit %d\n%s%s", code, out, errOut)
		}
	}
	for _, want := range []string{"Decisions: 11\n", "denied by people    5", "  rotate_logs (agent coder): 5 times by alice", `    service  "web"`, "  drop_table (agent coder): 5 times by alice", "  changes "} {
		if !strings.Contains(out, want) {
			t.Errorf("broker insights lacks %q:\n%s", want, out)
		}
	}
	code, out, errOut := run(t, "policy", "suggest", "--http", addrs.HTTP, "--document")
	if code != app.ExitOK {
		t.Fatalf("broker policy suggest: exit %d\n%s%s", code, out, errOut)
	}
	p, err := policy.Parse([]byte(out), "suggested.yaml")
	if err != nil {
		t.Fatalf("the suggestion does not load: %v\n%s", err, out)
	}
	actions := map[string]policy.Action{}
	for _, r := range p.Rules {
		actions[strings.Join(r.Tools, ",")] = r.Action
	}
	if actions["rotate_logs"] != policy.Allow || actions["drop_table"] != policy.Deny {
		t.Errorf("suggested %v\n%s", actions, out)
	}
}
