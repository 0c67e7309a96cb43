package ops

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
	"go.uber.org/zap"

	"github.com/assent-dev/assent/integration/itest"
	"github.com/assent-dev/assent/internal/app"
	"github.com/assent-dev/assent/internal/broker"
	"github.com/assent-dev/assent/internal/httpapi"
	"github.com/assent-dev/assent/internal/testenv"
	"github.com/assent-dev/assent/pkg/events"
)

// The operations guide's dashboard and alerts, relative to this package.
const (
	dashboardFile = "../../deploy/grafana/assent-dashboard.json"
	alertsFile    = "../../deploy/prometheus/alerts.yaml"
	opsGuide      = "../../docs/operations.md"
	// runbooks is where an alert's runbook_url points, before the heading.
	runbooks = "https://github.com/assent-dev/assent/blob/main/docs/operations.md#"
)

// notExported are the names the dashboard and alerts may use that no broker
// exports: Prometheus makes them itself for every target it scrapes.
var notExported = []string{"up"}

// metricFamilies parses the Prometheus text format of GET /metrics.
func metricFamilies(t *testing.T, api string) map[string]familyInfo {
	t.Helper()
	r := itest.Call(t, http.MethodGet, api+"/metrics", nil)
	if r.Status != http.StatusOK {
		t.Fatalf("GET /metrics: %d %s", r.Status, r.Body)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(r.Body))
	if err != nil {
		t.Fatalf("parse /metrics: %v", err)
	}
	out := map[string]familyInfo{}
	for name, f := range fams {
		info := familyInfo{typ: f.GetType().String(), labels: map[string]bool{}}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				info.labels[l.GetName()] = true
			}
			switch {
			case m.GetCounter() != nil:
				info.value = m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				info.value = m.GetGauge().GetValue()
			case m.GetHistogram() != nil:
				info.value = float64(m.GetHistogram().GetSampleCount())
			}
		}
		out[name] = info
	}
	return out
}

// familyInfo is what the checks need of one scraped metric family: its
// type, the label names of its series, and the value of its last series (a
// histogram's count).
type familyInfo struct {
	typ    string
	labels map[string]bool
	value  float64
}

// seriesNames are the names a query can select from fams: a histogram's
// _bucket, _sum and _count series, a summary's _sum and _count, every other
// family under its own name.
func seriesNames(fams map[string]familyInfo) map[string]bool {
	names := map[string]bool{}
	for name, f := range fams {
		switch f.typ {
		case "HISTOGRAM":
			names[name+"_bucket"], names[name+"_sum"], names[name+"_count"] = true, true, true
		case "SUMMARY":
			names[name], names[name+"_sum"], names[name+"_count"] = true, true, true
		default:
			names[name] = true
		}
	}
	for _, n := range notExported {
		names[n] = true
	}
	return names
}

// TestOperationsDashboardAndAlerts: the Grafana dashboard and the Prometheus
// rules of docs/operations.md parse, and every metric they query is one a
// broker exports. The broker runs with --auth and does the work that makes
// each labelled family appear (a vector without children is not in a
// scrape): a failed sign-in, an answered request, a timeout. A family the
// traffic missed makes the check fail, never pass, and every assent_ family
// scraped must be described in the guide.
func TestOperationsDashboardAndAlerts(t *testing.T) {
	a := itest.StartAuthApp(t)
	itest.WantError(t, a.As(t, "assent_not-a-token", http.MethodGet, "/v1/approvals", nil), http.StatusUnauthorized, "unauthenticated")
	answered := itest.ApprovalOf(t, a.As(t, "deployer", http.MethodPost, "/v1/approvals", map[string]any{"agent": "deployer", "tool": "delete_repo", "args": map[string]any{"repo": "x"}}), http.StatusCreated)
	itest.ApprovalOf(t, a.As(t, "alice", http.MethodPost, "/v1/approvals/"+answered.ID+"/decision", map[string]any{"decision": "approve"}), http.StatusOK)
	itest.ApprovalOf(t, a.As(t, "deployer", http.MethodPost, "/v1/approvals", map[string]any{"agent": "deployer", "tool": "delete_repo", "timeout": "1s"}), http.StatusCreated)
	var fams map[string]familyInfo
	itest.Eventually(t, itest.Patience, func() (bool, string) {
		fams = metricFamilies(t, a.API)
		late := fams["assent_timeout_lateness_seconds"]
		return late.value == 1, fmt.Sprintf("timeouts timed: %v", late.value)
	})
	for name, labels := range map[string][]string{
		"assent_decision_latency_seconds": {"outcome", "channel"},
		"assent_auth_failures_total":      {"reason"},
	} {
		for _, l := range labels {
			if !fams[name].labels[l] {
				t.Errorf("%s has no series with label %q: the traffic above should have made one", name, l)
			}
		}
	}
	if fams["assent_ready"].value != 1 || fams["assent_nats_connected"].value != 1 {
		t.Errorf("assent_ready %v, assent_nats_connected %v; want 1 and 1 on a broker that answers /readyz", fams["assent_ready"].value, fams["assent_nats_connected"].value)
	}
	exported := seriesNames(fams)

	t.Run("alerts", func(t *testing.T) {
		groups, errs := rulefmt.ParseFile(alertsFile, false)
		if len(errs) > 0 {
			t.Fatalf("%s: %v", alertsFile, joinErrors(errs))
		}
		n := 0
		for _, g := range groups.Groups {
			for _, r := range g.Rules {
				n++
				if r.Alert == "" {
					t.Errorf("group %s: a recording rule (%s); the file holds alerts only", g.Name, r.Record)
					continue
				}
				for _, k := range []string{"summary", "runbook_url"} {
					if r.Annotations[k] == "" {
						t.Errorf("alert %s has no %s annotation", r.Alert, k)
					}
				}
				if r.Labels["severity"] == "" {
					t.Errorf("alert %s has no severity label", r.Alert)
				}
				if anchor, ok := strings.CutPrefix(r.Annotations["runbook_url"], runbooks); !ok || !hasAnchor(t, anchor) {
					t.Errorf("alert %s: runbook_url %q is not a heading of %s", r.Alert, r.Annotations["runbook_url"], opsGuide)
				}
				checkQuery(t, "alert "+r.Alert, r.Expr, exported)
			}
		}
		if n == 0 {
			t.Fatalf("%s holds no rules", alertsFile)
		}
	})

	t.Run("dashboard", func(t *testing.T) {
		data, err := os.ReadFile(dashboardFile)
		if err != nil {
			t.Fatal(err)
		}
		var d dashboard
		if err := json.Unmarshal(data, &d); err != nil {
			t.Fatalf("%s: %v", dashboardFile, err)
		}
		if d.Title == "" || d.UID == "" || d.SchemaVersion < 39 {
			t.Errorf("title %q, uid %q, schemaVersion %d: want a title, a uid and a schema of Grafana 10 or later (39+)", d.Title, d.UID, d.SchemaVersion)
		}
		var dsVar string
		for _, v := range d.Templating.List {
			if v.Type == "datasource" && v.Query == "prometheus" {
				dsVar = v.Name
			}
			if v.Type == "query" {
				if q, ok := v.Query.(map[string]any); ok {
					v.Query = q["query"]
				}
				m := regexp.MustCompile(`^label_values\(([a-zA-Z_:][a-zA-Z0-9_:]*)\s*,\s*\w+\)$`).FindStringSubmatch(fmt.Sprint(v.Query))
				if m == nil || !exported[m[1]] {
					t.Errorf("variable %s: query %v is not label_values(<exported metric>, <label>)", v.Name, v.Query)
				}
			}
		}
		if dsVar == "" {
			t.Fatalf("no datasource variable of type prometheus in templating.list")
		}
		wantDS := "${" + dsVar + "}"
		ids := map[int]bool{}
		var panels []panel
		for _, p := range d.Panels {
			panels = append(panels, p)
			panels = append(panels, p.Panels...)
		}
		queries := 0
		for _, p := range panels {
			if ids[p.ID] {
				t.Errorf("panel %q: id %d used twice", p.Title, p.ID)
			}
			ids[p.ID] = true
			if p.GridPos.W == 0 || p.GridPos.H == 0 {
				t.Errorf("panel %q has no gridPos", p.Title)
			}
			if p.Type == "row" {
				continue
			}
			if p.Datasource.UID != wantDS || p.Datasource.Type != "prometheus" {
				t.Errorf("panel %q: datasource %+v, want prometheus %s", p.Title, p.Datasource, wantDS)
			}
			if len(p.Targets) == 0 {
				t.Errorf("panel %q has no targets", p.Title)
			}
			for _, tg := range p.Targets {
				if tg.Datasource.UID != "" && tg.Datasource.UID != wantDS {
					t.Errorf("panel %q: target %s names datasource %q, want %s", p.Title, tg.RefID, tg.Datasource.UID, wantDS)
				}
				queries++
				checkQuery(t, fmt.Sprintf("panel %q target %s", p.Title, tg.RefID), grafanaVars.ReplaceAllStringFunc(tg.Expr, grafanaValue), exported)
			}
		}
		if queries == 0 {
			t.Fatalf("%s holds no queries", dashboardFile)
		}
	})

	t.Run("guide", func(t *testing.T) {
		guide, err := os.ReadFile(opsGuide)
		if err != nil {
			t.Fatal(err)
		}
		for name := range fams {
			if strings.HasPrefix(name, "assent_") && !bytes.Contains(guide, []byte("`"+name+"`")) {
				t.Errorf("%s does not describe %s", opsGuide, name)
			}
		}
	})
}

// checkQuery parses expr as PromQL and checks that every metric it selects
// is in exported.
func checkQuery(t *testing.T, where, expr string, exported map[string]bool) {
	t.Helper()
	if strings.TrimSpace(expr) == "" {
		t.Errorf("%s: empty query", where)
		return
	}
	e, err := parser.ParseExpr(expr)
	if err != nil {
		t.Errorf("%s: %v\n%s", where, err, expr)
		return
	}
	selectors := 0
	parser.Inspect(e, func(node parser.Node, _ []parser.Node) error {
		vs, ok := node.(*parser.VectorSelector)
		if !ok {
			return nil
		}
		selectors++
		name := vs.Name
		for _, m := range vs.LabelMatchers {
			if m.Name == model.MetricNameLabel {
				name = m.Value
			}
		}
		if !exported[name] {
			t.Errorf("%s: selects %q, which no broker exports", where, name)
		}
		return nil
	})
	if selectors == 0 {
		t.Errorf("%s: selects no metric: %s", where, expr)
	}
}

// grafanaVars are the dashboard's variables inside queries: Grafana's own
// intervals and the dashboard's label variables.
var grafanaVars = regexp.MustCompile(`\$(__rate_interval|__interval|__range|\{[a-zA-Z_]\w*\}|[a-zA-Z_]\w*)`)

// grafanaValue is what Grafana puts in place of a variable, near enough for
// PromQL to parse: a duration for the intervals, a regular expression for a
// label variable (used only in =~ matchers).
func grafanaValue(v string) string {
	if strings.HasPrefix(v, "$__") {
		return "5m"
	}
	return ".*"
}

// hasAnchor reports whether the operations guide has a heading whose
// GitHub anchor is anchor.
func hasAnchor(t *testing.T, anchor string) bool {
	t.Helper()
	guide, err := os.ReadFile(opsGuide)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(guide), "\n") {
		if h, ok := strings.CutPrefix(line, "#"); ok {
			h = strings.TrimLeft(h, "# ")
			slug := strings.Map(func(r rune) rune {
				switch {
				case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '-', r == '_':
					return r
				case r >= 'A' && r <= 'Z':
					return r + 'a' - 'A'
				case r == ' ':
					return '-'
				}
				return -1
			}, h)
			if slug == anchor {
				return true
			}
		}
	}
	return false
}

// joinErrors joins rulefmt's errors for a message.
func joinErrors(errs []error) string {
	var s []string
	for _, e := range errs {
		s = append(s, e.Error())
	}
	return strings.Join(s, "; ")
}

// dashboard is the part of a Grafana dashboard's JSON model the checks read.
type dashboard struct {
	Title         string  `json:"title"`
	UID           string  `json:"uid"`
	SchemaVersion int     `json:"schemaVersion"`
	Panels        []panel `json:"panels"`
	Templating    struct {
		List []struct {
			Name  string `json:"name"`
			Type  string `json:"type"`
			Query any    `json:"query"`
		} `json:"list"`
	} `json:"templating"`
}

type panel struct {
	ID         int        `json:"id"`
	Type       string     `json:"type"`
	Title      string     `json:"title"`
	Datasource datasource `json:"datasource"`
	GridPos    struct {
		H, W, X, Y int
	} `json:"gridPos"`
	Targets []struct {
		RefID      string     `json:"refId"`
		Expr       string     `json:"expr"`
		Datasource datasource `json:"datasource"`
	} `json:"targets"`
	Panels []panel `json:"panels"` // a collapsed row's
}

type datasource struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

// TestOperationsConnectionMetrics: the readiness and NATS connection gauges
// follow the connection: down while the server is stopped, up again with a
// reconnect counted once it is back.
func TestOperationsConnectionMetrics(t *testing.T) {
	s := testenv.Server(t)
	addrs := itest.StartApp(t, app.Options{NATSURL: s.ClientURL(), HTTPListen: "127.0.0.1:0"})
	gauges := func() (ready, connected, reconnects float64) {
		fams := metricFamilies(t, addrs.HTTP)
		return fams["assent_ready"].value, fams["assent_nats_connected"].value, fams["assent_nats_reconnects_total"].value
	}
	state := func(r, c, n float64) string { return fmt.Sprintf("ready %v, connected %v, reconnects %v", r, c, n) }
	itest.Eventually(t, itest.Patience, func() (bool, string) {
		r, c, n := gauges()
		return r == 1 && c == 1 && n == 0, state(r, c, n)
	})
	s.Stop()
	itest.Eventually(t, itest.Patience, func() (bool, string) {
		r, c, n := gauges()
		return r == 0 && c == 0, state(r, c, n)
	})
	s.Restart(t)
	itest.Eventually(t, itest.Patience, func() (bool, string) {
		r, c, n := gauges()
		return r == 1 && c == 1 && n == 1, state(r, c, n)
	})
}

// TestTimeoutLateness: what a timeout tells assent_timeout_lateness_seconds
// is measured from the request's own deadline, so the time from arrival to
// the decision is exactly the request's timeout plus its lateness; other
// outcomes are not late at all.
func TestTimeoutLateness(t *testing.T) {
	seen := make(chan broker.Decision, 4)
	e := itest.NewEnv(t, broker.Config{Observe: func(d broker.Decision) { seen <- d }})
	expiring := itest.Submit(t, e, events.Requested{Agent: "late", Tool: "t", Timeout: events.Duration(time.Second)})
	cancelled := itest.Submit(t, e, events.Requested{Agent: "late", Tool: "t", Timeout: events.Duration(time.Minute)})
	if _, err := e.B.Cancel(itest.TestCtx(t, itest.Patience), cancelled.ID, "late", "no longer needed"); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		var d broker.Decision
		select {
		case d = <-seen:
		case <-time.After(itest.Patience):
			t.Fatalf("no outcome observed within %s", itest.Patience)
		}
		switch d.Channel {
		case "timeout":
			if d.Late < 0 || d.Latency-d.Late != expiring.Deadline.Sub(expiring.ReceivedAt) {
				t.Errorf("timeout: latency %s, late %s; want late ≥ 0 and latency − late = the timeout, %s", d.Latency, d.Late, expiring.Deadline.Sub(expiring.ReceivedAt))
			}
		case "cancel":
			if d.Late != 0 {
				t.Errorf("cancel: late %s, want 0", d.Late)
			}
		default:
			t.Errorf("unexpected outcome %+v", d)
		}
	}
}

// BenchmarkStoredBytesPerRequest measures what a request leaves on disk, for
// the sizing section of docs/operations.md: the stream's bytes (the stream is
// the only state; no bucket holds a copy per request), and the embedded
// server's data directory once the process has stopped, each divided by the
// requests made. "auto" requests are approved by the mode at once (request,
// decision); "answered" ones wait and are approved over HTTP (request,
// pending notice, answer, decision, and the durable ticks of their
// deadlines). The request is the README's example.
//
//	flock /tmp/assent-bench.lock go test -run '^$' -bench StoredBytesPerRequest -benchtime 5000x ./integration/ops/
func BenchmarkStoredBytesPerRequest(b *testing.B) {
	for _, how := range []string{"auto", "answered"} {
		b.Run(how, func(b *testing.B) {
			cfg := broker.Config{Mode: broker.ModeManual}
			if how == "auto" {
				cfg.Mode = broker.ModeAutoApprove
			}
			dir := b.TempDir()
			ready := make(chan app.Addrs, 1)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			done := make(chan error, 1)
			go func() {
				done <- app.Run(ctx, app.Options{NATSListen: "127.0.0.1:0", DataDir: dir, Sync: "2m", HTTPListen: "127.0.0.1:0", Broker: cfg,
					Ready: func(a app.Addrs) { ready <- a }}, zap.NewNop())
			}()
			var addrs app.Addrs
			select {
			case addrs = <-ready:
			case err := <-done:
				b.Fatalf("app.Run: %v", err)
			}
			post := func(url string, body any, want int) httpapi.Approval {
				b.Helper()
				c, stop := itest.OpCtx()
				defer stop()
				r, err := itest.DoHTTP(c, http.MethodPost, url, body)
				if err != nil || r.Status != want {
					b.Fatalf("POST %s: %v %d %s", url, err, r.Status, r.Body)
				}
				var a httpapi.Approval
				if err := json.Unmarshal(r.Body, &a); err != nil {
					b.Fatal(err)
				}
				return a
			}
			request := map[string]any{"agent": "file-manager", "session": "s-42", "user": "carol", "tool": "delete_file",
				"args": map[string]any{"path": "/srv/reports/q3.csv"}, "hint": "Delete the Q3 report?", "timeout": "2m"}
			nc, err := nats.Connect(addrs.NATS)
			if err != nil {
				b.Fatal(err)
			}
			defer nc.Close()
			js := itest.NewJS(b, nc)
			streamBytes := func() uint64 {
				c, stop := itest.OpCtx()
				defer stop()
				s, err := js.Stream(c, broker.StreamName)
				if err != nil {
					b.Fatal(err)
				}
				return s.CachedInfo().State.Bytes
			}
			stream0 := streamBytes()
			b.ResetTimer()
			for range b.N {
				a := post(addrs.HTTP+"/v1/approvals", request, http.StatusCreated)
				if how == "answered" {
					post(addrs.HTTP+"/v1/approvals/"+a.ID+"/decision", map[string]any{"principal": "alice", "decision": "approve", "channel": "http"}, http.StatusOK)
				}
			}
			b.StopTimer()
			stream1 := streamBytes()
			nc.Close()
			cancel()
			if err := <-done; err != nil {
				b.Fatalf("app.Run: %v", err)
			}
			var disk int64
			err = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
				if err != nil || d.IsDir() {
					return err
				}
				info, err := d.Info()
				if err == nil {
					disk += info.Size()
				}
				return err
			})
			if err != nil {
				b.Fatal(err)
			}
			n := float64(b.N)
			b.ReportMetric(float64(stream1-stream0)/n, "stream-B/req")
			b.ReportMetric(float64(disk)/n, "dir-B/req")
		})
	}
}
