package app

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/assent-dev/assent/internal/insights"
	"github.com/assent-dev/assent/internal/textsafe"
	"github.com/assent-dev/assent/pkg/policy"
)

// InsightsQuery is what "broker insights" and "broker policy suggest" ask
// GET /v1/insights for; empty fields are left to the broker.
type InsightsQuery struct {
	Since, Until                string // RFC 3339, or a duration back from until (7d, 24h)
	Agent, Tool, Rule, Approver string
}

// flags defines q's flags on fs, since defaulting to since.
func (q *InsightsQuery) flags(fs *flag.FlagSet, since string) {
	fs.StringVar(&q.Since, "since", since, "the window's start: an RFC 3339 `time`, or a duration before --until such as 7d, 24h or 90m")
	fs.StringVar(&q.Until, "until", "", "the window's end: an RFC 3339 `time`, or a duration before now (default now)")
	fs.StringVar(&q.Agent, "agent", "", "requests of this `agent`")
	fs.StringVar(&q.Tool, "tool", "", "requests for this `tool`")
	fs.StringVar(&q.Rule, "rule", "", "requests this policy `rule` decided or asked people about")
	fs.StringVar(&q.Approver, "approver", "", "requests this `principal` answered")
}

// path is q as the API's path and query.
func (q InsightsQuery) path() string {
	v := url.Values{}
	for name, val := range map[string]string{"since": q.Since, "until": q.Until, "agent": q.Agent, "tool": q.Tool, "rule": q.Rule, "approver": q.Approver} {
		if val != "" {
			v.Set(name, val)
		}
	}
	if len(v) == 0 {
		return "/v1/insights"
	}
	return "/v1/insights?" + v.Encode()
}

// FetchInsights reads the report q selects from a running broker, through
// its HTTP API (GET /v1/insights), and returns it with its JSON as sent.
// With authentication on, the token (TokenEnv) decides what the report may
// cover: an admin's the whole record, a principal's its own answers, an
// agent's its own requests.
func FetchInsights(ctx context.Context, api API, q InsightsQuery) (insights.Report, json.RawMessage, error) {
	var raw json.RawMessage
	if err := api.call(ctx, http.MethodGet, q.path(), nil, &raw); err != nil {
		return insights.Report{}, nil, err
	}
	var rep insights.Report
	if err := json.Unmarshal(raw, &rep); err != nil {
		return insights.Report{}, nil, fmt.Errorf("read the report: %w", err)
	}
	return rep, raw, nil
}

// Insights prints the report q selects from a running broker: as a
// terminal report (PrintInsights), or with asJSON as the API's JSON,
// indented.
func Insights(ctx context.Context, w io.Writer, api API, q InsightsQuery, asJSON bool) error {
	rep, raw, err := FetchInsights(ctx, api, q)
	if err != nil {
		return err
	}
	if asJSON {
		var buf bytes.Buffer
		if err := json.Indent(&buf, raw, "", "  "); err != nil {
			return err
		}
		buf.WriteByte('\n')
		_, err := buf.WriteTo(w)
		return err
	}
	return PrintInsights(w, rep, time.Now())
}

// PolicySuggest prints the policy fragment that insights.Suggest writes
// from the candidates of the report q selects from a running broker.
func PolicySuggest(ctx context.Context, w io.Writer, api API, q InsightsQuery, opts insights.SuggestOptions) error {
	if err := opts.Validate(); err != nil {
		return err
	}
	rep, _, err := FetchInsights(ctx, api, q)
	if err != nil {
		return err
	}
	out, err := insights.Suggest(rep, opts)
	if err != nil {
		return err
	}
	_, err = w.Write(out)
	return err
}

// insightsCommands are "broker insights" and "broker policy suggest".
func insightsCommands() []*command {
	return []*command{
		{
			name: "insights", synopsis: "[--since WINDOW] [--until TIME] [--agent A] [--tool T] [--rule R] [--approver P] [--json] [--http URL]",
			summary: "print what the record says about approvals",
			about: `Prints what a running broker's record says about the approvals of a window
(by default the last 7 days), filtered by agent, tool, rule and approver:
decisions by outcome, per hour (per day beyond two days) as a text chart,
time to decide by rule and by approver, rubber stamps (answers under 2 s),
approvals without an edit or a look, what people always approve or always
deny (candidates for rules: "broker policy suggest" writes them), shadow
policy disagreements and the argument fields people edit (docs/insights.md).
--since takes an RFC 3339 time or a duration (7d, 24h). --json prints the
API's JSON (GET /v1/insights). With authentication on, set ` + TokenEnv + ` to an
API token: an admin's reads the whole record, a principal's its own answers,
an agent's its own requests.`,
			define: func(fs *flag.FlagSet) func(context.Context, CLI, []string) error {
				target := apiFlags(fs)
				var q InsightsQuery
				q.flags(fs, "7d")
				asJSON := fs.Bool("json", false, "print the report as JSON, as the API answers it")
				return func(ctx context.Context, c CLI, _ []string) error {
					api, err := target.api()
					if err != nil {
						return err
					}
					ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
					defer cancel()
					return Insights(ctx, c.Stdout, api, q, *asJSON)
				}
			},
		},
		{
			name: "policy suggest", synopsis: "[--since WINDOW] [--until TIME] [--agent A] [--tool T] [--rule R] [--approver P] [--only allow|deny] [--prefix NAME] [--document] [--http URL]",
			summary: "write rules for what people always approve or deny",
			about: `Reads what a running broker's record says about the approvals of a window (by
default the last 30 days; the filters as for "broker insights") and prints a
policy fragment (YAML, with CEL conditions): an allow rule for each group of
requests (tool, agent, argument pattern) people approved every time, and a
deny rule for each they denied every time, each under a comment with its
evidence. Read them before you paste them into a policy: a rule is as broad
as the record's evidence, no broader (docs/policy.md). With authentication
on, set ` + TokenEnv + ` to an API token (an admin's, for the whole record).`,
			define: func(fs *flag.FlagSet) func(context.Context, CLI, []string) error {
				target := apiFlags(fs)
				var q InsightsQuery
				q.flags(fs, "30d")
				var opts insights.SuggestOptions
				fs.Func("only", "write only the rules of this `kind`: allow or deny (default both)", func(v string) error {
					opts.Only = policy.Action(v)
					if v != string(policy.Allow) && v != string(policy.Deny) {
						return fmt.Errorf("want allow or deny")
					}
					return nil
				})
				fs.StringVar(&opts.Prefix, "prefix", "", "start every rule's `name` with this (default "+insights.DefaultSuggestPrefix+")")
				fs.BoolVar(&opts.Document, "document", false, "print a whole policy file (version: 1 and the rules) instead of a rules: list")
				return func(ctx context.Context, c CLI, _ []string) error {
					api, err := target.api()
					if err != nil {
						return err
					}
					ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
					defer cancel()
					return PolicySuggest(ctx, c.Stdout, api, q, opts)
				}
			},
		},
	}
}

// chartWidth is the most characters a bar of the text chart takes.
const chartWidth = 50

// PrintInsights writes rep as a terminal report: aligned tables and a text
// chart of the decisions per hour (per day for windows over two days).
// What came from requests and answers is printed with terminal controls
// escaped (textsafe.Line).
func PrintInsights(w io.Writer, rep insights.Report, now time.Time) error {
	p := &printer{w: w}
	f := rep.Filter
	head := fmt.Sprintf("Insights from %s to %s UTC (%s)", rep.Since.UTC().Format("2006-01-02 15:04"), rep.Until.UTC().Format("2006-01-02 15:04"), spanOf(rep.Until.Sub(rep.Since)))
	for _, kv := range [][2]string{{"agent", f.Agent}, {"tool", f.Tool}, {"rule", f.Rule}, {"approver", f.Approver}} {
		if kv[1] != "" {
			head += ", " + kv[0] + " " + textsafe.Line(kv[1])
		}
	}
	p.line(head)
	if !rep.Complete {
		p.line(fmt.Sprintf("Still reading the record: %d%% read. The numbers are of what this replica has read so far.", int(math.Floor(min(max(rep.Progress, 0), 1)*100))))
	}

	t := rep.Totals
	p.section(fmt.Sprintf("Decisions: %d", t.Total()))
	rows := [][]string{}
	for _, k := range cliOutcomes {
		rows = append(rows, []string{k.label, strconv.Itoa(k.n(t)), share(k.n(t), t.Total())})
	}
	p.table(nil, rows, 1, 2)

	p.chart(rep.Hours)

	latency := func(title, key string, ls []insights.Latency, expired bool) {
		p.section(title)
		if len(ls) == 0 {
			p.line("  none in the window")
			return
		}
		header := []string{strings.ToUpper(key), "DECIDED", "P50", "P90"}
		if expired {
			header = append(header, "EXPIRED")
		}
		var rows [][]string
		for _, l := range ls {
			row := []string{textsafe.Line(l.Key), strconv.Itoa(l.Decided), cliLatency(l.P50.Std()), cliLatency(l.P90.Std())}
			if l.Decided == 0 {
				row[2], row[3] = "-", "-"
			}
			if expired {
				row = append(row, fmt.Sprintf("%d of %d", l.Expired, l.Decided+l.Expired))
			}
			rows = append(rows, row)
		}
		p.table(header, rows, 1, 2, 3, 4)
	}
	latency("Time to decide, by rule (from the request's announcement to its decision)", "rule", rep.ByRule, true)
	latency("Time to decide, by approver (to their answer)", "approver", rep.ByApprover, false)

	p.section("Rubber stamps: answers given under 2 s after the request was shown")
	if len(rep.RubberStamps) == 0 {
		p.line("  nobody answered in the window")
	} else {
		var rows [][]string
		for _, s := range rep.RubberStamps {
			rows = append(rows, []string{textsafe.Line(s.Approver), strconv.Itoa(s.Answers), strconv.Itoa(s.Fast), percentOf(s.Share), strings.Join(safeIDs(s.Examples, 3), " ")})
		}
		p.table([]string{"APPROVER", "ANSWERS", "UNDER 2 S", "SHARE", "EXAMPLES"}, rows, 1, 2, 3)
	}
	u := rep.Unexamined
	p.line(fmt.Sprintf("  Of %d approvals by people, %d kept the arguments as asked and %d (%s) were also given without a look at the detail.",
		u.Approved, u.Unedited, u.Unlooked, percentOf(u.Share)))

	candidates := func(title string, cs []insights.Candidate) {
		p.section(title)
		if len(cs) == 0 {
			p.line("  none: no group was decided the same way 5 times or more")
			return
		}
		for _, c := range cs {
			other := "never decided otherwise by a person"
			if !c.LastOther.IsZero() {
				other = "last decided otherwise " + c.LastOther.UTC().Format("2006-01-02 15:04")
			}
			by := ""
			if len(c.Principals) > 0 {
				by = " by " + textsafe.Line(strings.Join(c.Principals, ", "))
			}
			p.line(fmt.Sprintf("  %s (agent %s): %d times%s, %s to %s; %s", textsafe.Line(c.Tool), textsafe.Line(c.Agent), c.Count, by,
				c.First.UTC().Format("Jan 2 15:04"), c.Last.UTC().Format("Jan 2 15:04"), other))
			var rows [][]string
			for _, a := range c.Args {
				rows = append(rows, []string{"  " + textsafe.Line(a.Field), patternWords(a)})
			}
			p.table(nil, rows)
			if ids := safeIDs(c.Examples, 3); len(ids) > 0 {
				p.line("    e.g. " + strings.Join(ids, " "))
			}
		}
	}
	candidates("Always approved (candidates for allow rules: broker policy suggest)", rep.AlwaysApproved)
	candidates("Always denied (candidates for deny rules)", rep.AlwaysDenied)

	p.section("Shadow policy disagreements")
	if len(rep.Disagreements) == 0 {
		p.line("  none in the window")
	} else {
		var rows [][]string
		for _, d := range rep.Disagreements {
			rows = append(rows, []string{textsafe.Line(d.Live), textsafe.Line(d.Shadow), strconv.Itoa(d.Count), strings.Join(safeIDs(d.Examples, 2), " ")})
		}
		p.table([]string{"LIVE", "SHADOW", "REQUESTS", "EXAMPLES"}, rows, 2)
	}

	p.section("Arguments people change when they approve")
	if len(rep.EditedFields) == 0 {
		p.line("  none in the window")
	} else {
		var rows [][]string
		for _, e := range rep.EditedFields {
			rows = append(rows, []string{textsafe.Line(e.Field), strconv.Itoa(e.Count)})
		}
		p.table([]string{"FIELD", "EDITS"}, rows, 1)
	}
	return p.err
}

// cliOutcomes are the outcomes a report counts, with the character each
// draws in the chart.
var cliOutcomes = []struct {
	label string
	mark  byte
	n     func(insights.Counts) int
}{
	{"approved by people", 'A', func(c insights.Counts) int { return c.Approved }},
	{"approved by policy", 'a', func(c insights.Counts) int { return c.AutoApproved }},
	{"denied by people", 'D', func(c insights.Counts) int { return c.Denied }},
	{"denied by policy", 'd', func(c insights.Counts) int { return c.AutoDenied }},
	{"expired", 'x', func(c insights.Counts) int { return c.Expired }},
	{"cancelled", 'c', func(c insights.Counts) int { return c.Cancelled }},
}

// printer writes a report, keeping the first error.
type printer struct {
	w   io.Writer
	err error
}

func (p *printer) line(s string) {
	if p.err == nil {
		_, p.err = fmt.Fprintln(p.w, s)
	}
}

func (p *printer) section(title string) {
	p.line("")
	p.line(title)
}

// table writes rows under header (nil for none), two spaces in, columns
// two spaces apart, the columns numbered in right aligned.
func (p *printer) table(header []string, rows [][]string, right ...int) {
	if header != nil {
		rows = append([][]string{header}, rows...)
	}
	var widths []int
	for _, r := range rows {
		for i, cell := range r {
			if i >= len(widths) {
				widths = append(widths, 0)
			}
			widths[i] = max(widths[i], utf8.RuneCountInString(cell))
		}
	}
	isRight := func(i int) bool {
		for _, r := range right {
			if r == i {
				return true
			}
		}
		return false
	}
	for _, r := range rows {
		var b strings.Builder
		b.WriteString("  ")
		for i, cell := range r {
			pad := strings.Repeat(" ", widths[i]-utf8.RuneCountInString(cell))
			if i > 0 {
				b.WriteString("  ")
			}
			if isRight(i) {
				b.WriteString(pad + cell)
			} else if i < len(r)-1 {
				b.WriteString(cell + pad)
			} else {
				b.WriteString(cell)
			}
		}
		p.line(strings.TrimRight(b.String(), " "))
	}
}

// chart writes the decisions of hours as a text chart: a row per hour, or
// per day (UTC) when there are more than 48 hours, each a bar of one
// character per decision by outcome (scaled down when the most in a row is
// more than chartWidth).
func (p *printer) chart(hours []insights.HourCounts) {
	type row struct {
		label string
		c     insights.Counts
	}
	var rows []row
	per := "hour"
	if len(hours) > 48 {
		per = "day"
		for _, h := range hours {
			label := h.Hour.UTC().Format("Mon Jan 2")
			if len(rows) == 0 || rows[len(rows)-1].label != label {
				rows = append(rows, row{label: label})
			}
			c := &rows[len(rows)-1].c
			c.Approved += h.Approved
			c.AutoApproved += h.AutoApproved
			c.Denied += h.Denied
			c.AutoDenied += h.AutoDenied
			c.Expired += h.Expired
			c.Cancelled += h.Cancelled
		}
	} else {
		for _, h := range hours {
			rows = append(rows, row{label: h.Hour.UTC().Format("Jan 2 15:04"), c: h.Counts})
		}
	}
	most := 0
	for _, r := range rows {
		most = max(most, r.c.Total())
	}
	scale := 1.0
	if most > chartWidth {
		scale = float64(chartWidth) / float64(most)
	}
	title := "Per " + per + " (UTC)"
	if scale < 1 {
		title += fmt.Sprintf(", a character for about %.3g decisions", 1/scale)
	}
	p.section(title + ":")
	if len(rows) == 0 {
		p.line("  no hours in the window")
		return
	}
	var table [][]string
	for _, r := range rows {
		var bar strings.Builder
		for _, k := range cliOutcomes {
			n := k.n(r.c)
			marks := int(math.Round(float64(n) * scale))
			if n > 0 {
				marks = max(marks, 1)
			}
			bar.WriteString(strings.Repeat(string(k.mark), marks))
		}
		table = append(table, []string{r.label, strconv.Itoa(r.c.Total()), bar.String()})
	}
	p.table(nil, table, 1)
	var legend []string
	for _, k := range cliOutcomes {
		legend = append(legend, string(k.mark)+" "+k.label)
	}
	p.line("  " + strings.Join(legend, ", "))
}

// spanOf says a window's length: "7d", "36h", "90m".
func spanOf(d time.Duration) string {
	switch {
	case d >= 48*time.Hour && d%(24*time.Hour) == 0:
		return fmt.Sprintf("%dd", d/(24*time.Hour))
	case d >= time.Hour:
		return strings.TrimSuffix(strings.TrimSuffix(d.Round(time.Minute).String(), "0s"), "0m")
	}
	return d.Round(time.Second).String()
}

// cliLatency says how long a decision took.
func cliLatency(d time.Duration) string {
	switch {
	case d < 10*time.Second:
		return strconv.FormatFloat(max(d, 0).Seconds(), 'f', 1, 64) + "s"
	case d < time.Hour:
		return d.Round(time.Second).String()
	}
	return strings.TrimSuffix(d.Round(time.Minute).String(), "0s")
}

func share(n, of int) string {
	if of == 0 {
		return ""
	}
	return percentOf(float64(n) / float64(of))
}

func percentOf(f float64) string {
	p := min(max(f, 0), 1) * 100
	if p > 0 && p < 1 {
		return "<1%"
	}
	return strconv.Itoa(int(math.Round(p))) + "%"
}

// safeIDs returns up to n of ids, escaped.
func safeIDs(ids []string, n int) []string {
	out := make([]string, 0, n)
	for _, id := range ids[:min(n, len(ids))] {
		out = append(out, textsafe.Line(id))
	}
	return out
}

// patternWords says what a group's argument field held.
func patternWords(a insights.ArgPattern) string {
	var s string
	switch {
	case !a.Varied:
		var vs []string
		for _, v := range a.Values {
			vs = append(vs, textsafe.Line(string(v)))
		}
		s = strings.Join(vs, " or ")
	case a.Prefix != "":
		s = "varied, each starting with " + strconv.Quote(textsafe.Line(a.Prefix))
	case a.Min != nil && a.Max != nil:
		s = "varied, from " + strconv.FormatFloat(*a.Min, 'g', -1, 64) + " to " + strconv.FormatFloat(*a.Max, 'g', -1, 64)
	default:
		s = "varied"
	}
	if a.Optional {
		s += " (sometimes absent)"
	}
	return s
}
