package webui

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/assent-dev/assent/internal/broker"
	"github.com/assent-dev/assent/internal/httpapi"
	"github.com/assent-dev/assent/internal/human"
	"github.com/assent-dev/assent/internal/insights"
	"github.com/assent-dev/assent/internal/textsafe"
	"github.com/assent-dev/assent/pkg/events"
)

// The Insights tab (docs/web.md, "Insights"): what the record says about
// approvals over a window, filtered by agent, tool, rule and approver, read
// from the broker's aggregator (internal/insights) and drawn on the server:
// the volume per hour (or day) by outcome as stacked bars in inline SVG,
// time to decide by rule and by approver, rubber stamps, approvals without
// an edit or a look, the groups always approved or always denied, shadow
// policy disagreements and the fields people edit. Every count links to the
// requests behind it: /insights/requests lists them from the audit log with
// the same filters (or the example ids the report carries). Who reads which
// report is httpapi.ScopeInsights's to decide, as on the API.

// defaultInsightsWindow is the window the tab shows when the address names
// none.
const defaultInsightsWindow = "7d"

// insightsWindows are the windows the form offers.
var insightsWindows = []option{{"24h", "last 24 hours"}, {"7d", "last 7 days"}, {"30d", "last 30 days"}, {"90d", "last 90 days"}}

type option struct{ Value, Label string }

// insightsView is the Insights tab's page: the report, or the requests
// behind one of its numbers.
type insightsView struct {
	Form     insightsForm
	Report   *reportView
	Requests *requestsView
}

// insightsForm is the filter form, as the address filled it.
type insightsForm struct {
	Since, Until, Agent, Tool, Rule, Approver string
	Windows                                   []option
	// Scope says whose answers or requests the report is narrowed to, when
	// the viewer sees only some ("" for all).
	Scope string
	// Back is the report's address, from the requests behind a number.
	Back string
}

// reportView is a report laid out for the page.
type reportView struct {
	Since, Until time.Time
	Complete     bool
	Progress     int // percent read, while not Complete
	Total        int
	TotalHref    string
	Totals       []outcomeCount
	Chart        chart
	ByRule       latencyTable
	ByApprover   latencyTable
	Stamps       []stampRow
	Unexamined   unexaminedView
	Approved     []candidateRow
	Denied       []candidateRow
	Disagree     []disagreeRow
	Edited       []fieldRow
	// Suggest is the command that writes rules from the candidates.
	Suggest string
}

// outcomeCount is one outcome's count, with where its requests are listed.
type outcomeCount struct {
	Label, Class string
	N            int
	Href         string
}

// outcomeKinds are the outcomes a report counts, in the order the bars
// stack them (bottom first) and the legend lists them.
var outcomeKinds = []struct {
	class, label string
	n            func(insights.Counts) int
	query        []string // for /insights/requests
}{
	{"approved", "approved by people", func(c insights.Counts) int { return c.Approved }, []string{"outcome", "approved", "by", "people"}},
	{"auto-approved", "approved by policy", func(c insights.Counts) int { return c.AutoApproved }, []string{"outcome", "approved", "by", "policy"}},
	{"denied", "denied by people", func(c insights.Counts) int { return c.Denied }, []string{"outcome", "denied", "by", "people"}},
	{"auto-denied", "denied by policy", func(c insights.Counts) int { return c.AutoDenied }, []string{"outcome", "denied", "by", "policy"}},
	{"expired", "expired", func(c insights.Counts) int { return c.Expired }, []string{"outcome", "expired"}},
	{"cancelled", "cancelled", func(c insights.Counts) int { return c.Cancelled }, []string{"outcome", "cancelled"}},
}

// chart is the volume chart: stacked bars, one per hour or day, drawn in
// SVG whose horizontal positions are percentages (the chart takes its
// container's width, its text keeps its size) and vertical ones pixels.
type chart struct {
	Per     string // "hour" or "day"
	Height  int    // of the plot's SVG, labels included
	Base    int    // the y of the zero line
	Bars    []bar
	YTicks  []yTick
	XLabels []xLabel
	// Dense: too many bars to read on a phone's width; the chart scrolls
	// sideways there.
	Dense   bool
	Summary string
}

type bar struct {
	X, W, Mid string // percentages
	Label     string // "Nov 26, 14:00–15:00 UTC"
	Total     int
	// Top is the y of the bar's top, where its total is written when the
	// bars are few enough to have room (ShowTotal).
	Top         int
	ShowTotal   bool
	TotalX      string // where the total is written, and how it is
	TotalAnchor string // anchored: not past the chart's edges

	Href string
	Segs []seg
}

type seg struct {
	Y, H         int
	Class, Title string
	Href         string
}

type yTick struct {
	Y     int
	Label string
}

type xLabel struct {
	X, Anchor, Label string
}

// latencyTable is time to decide, by rule or by approver.
type latencyTable struct {
	Rows []latencyRow
	// Max is the longest p90 of the rows, the scale of their bars.
	Max time.Duration
}

type latencyRow struct {
	Key, KeyHref       string
	Decided            int
	DecidedHref        string
	P50, P90           string
	P50W, P90W         string // bar widths, percentages of the table's Max
	Expired            int
	ExpiredHref        string
	ExpiredOfAll       string // "3 of 12 asked"
	HasExpired, IsRule bool
}

type stampRow struct {
	Approver    string
	Answers     int
	AnswersHref string
	Fast        int
	FastHref    string
	Share       string
	ShareW      string
	Examples    []exampleLink
}

type exampleLink struct{ ID, Short string }

type unexaminedView struct {
	Approved, Unedited, Unlooked      int
	ApprovedHref, UneditedHref, Share string
	UneditedShare                     string
	// UnlookedHref lists the most recent unlooked approvals (the report's
	// examples): no filter of the record selects them all.
	UnlookedHref string
}

type candidateRow struct {
	Outcome          string // approved or denied
	Tool, Agent      string
	Args             []argPatternView
	Count            int
	CountHref        string
	AllHref          string
	Principals       string
	First, Last      time.Time
	LastOther        time.Time
	Examples         []exampleLink
	MoreThanExamples bool
}

type argPatternView struct {
	Field    string
	Values   []string
	Varied   string // how a varied field varied: "starts with /srv/", "1 to 20", "varied"
	Optional bool
}

type disagreeRow struct {
	Live, Shadow string
	Count        int
	Href         string
	Examples     []exampleLink
}

type fieldRow struct {
	Field string
	Count int
	Href  string
	W     string
}

// insightsFilter reads the tab's filter from r, the window defaulting to
// the last defaultInsightsWindow, and narrows it to what v may read. A
// filter v may not read is an *httpapi.InsightsRefusal.
func (u *UI) insightsFilter(r *http.Request, v viewer) (insightsForm, insights.Filter, error) {
	q := r.URL.Query()
	form := insightsForm{Since: q.Get("since"), Until: q.Get("until"), Agent: q.Get("agent"), Tool: q.Get("tool"), Rule: q.Get("rule"), Approver: q.Get("approver")}
	if form.Since == "" && form.Until == "" {
		form.Since = defaultInsightsWindow
		q.Set("since", form.Since)
	}
	form.Windows = insightsWindows
	if !slices.ContainsFunc(form.Windows, func(o option) bool { return o.Value == form.Since }) {
		label := "since " + textsafe.Line(form.Since)
		if form.Since == "" {
			label = "30 days before until"
		}
		form.Windows = append(slices.Clone(form.Windows), option{form.Since, label})
	}
	f, err := httpapi.ParseInsightsQuery(q, u.cfg.Now())
	if err != nil {
		return form, f, &badInput{textsafe.Line(err.Error())}
	}
	scoped, err := httpapi.ScopeInsights(v.who, f)
	if err != nil {
		return form, f, err
	}
	switch {
	case scoped.Approver != f.Approver && scoped.Agent != f.Agent:
		form.Scope = fmt.Sprintf("agent %s's requests that %s answered", scoped.Agent, scoped.Approver)
	case scoped.Approver != f.Approver:
		form.Scope = "the requests " + scoped.Approver + " answered"
	case scoped.Agent != f.Agent:
		form.Scope = "agent " + scoped.Agent + "'s requests"
	}
	return form, scoped, nil
}

// refused is the page of a filter the viewer may not read.
func refused(err error) (string, string, string, any, error) {
	var no *httpapi.InsightsRefusal
	if !errors.As(err, &no) {
		return "", "", "", nil, err
	}
	return "problem", "Not yours to read", "insights", problemPage{Status: http.StatusForbidden, Heading: "Not yours to read",
		Message: no.Message, Hint: "Leave out the agent or approver, and the page shows what you may read."}, nil
}

func (u *UI) insights(r *http.Request, v viewer) (string, string, string, any, error) {
	form, f, err := u.insightsFilter(r, v)
	if err != nil {
		return refused(err)
	}
	rep, err := u.b.Insights(r.Context(), f)
	if err != nil {
		return "", "", "", nil, err
	}
	return "insights", "Insights", "insights", insightsView{Form: form, Report: u.reportView(rep, f, form.Since)}, nil
}

// reportView lays rep out; f is the filter it answers (the viewer's scope
// included), which the links to its requests keep, and window the tab's
// window, for their way back.
func (u *UI) reportView(rep insights.Report, f insights.Filter, window string) *reportView {
	link := func(since, until time.Time, kv ...string) string {
		q := url.Values{}
		for k, v := range map[string]string{"agent": f.Agent, "tool": f.Tool, "rule": f.Rule, "approver": f.Approver} {
			if v != "" {
				q.Set(k, v)
			}
		}
		q.Set("since", since.UTC().Format(time.RFC3339Nano))
		q.Set("until", until.UTC().Format(time.RFC3339Nano))
		if window != "" {
			q.Set("window", window)
		}
		for i := 0; i+1 < len(kv); i += 2 {
			q.Set(kv[i], kv[i+1])
		}
		return "/insights/requests?" + q.Encode()
	}
	ids := func(list []string) string {
		return "/insights/requests?" + url.Values{"ids": {strings.Join(list, ",")}}.Encode()
	}
	whole := func(kv ...string) string { return link(rep.Since, rep.Until, kv...) }
	rv := &reportView{Since: rep.Since, Until: rep.Until, Complete: rep.Complete, Total: rep.Totals.Total(), TotalHref: whole()}
	if !rep.Complete {
		rv.Progress = int(math.Floor(min(max(rep.Progress, 0), 1) * 100))
	}
	for _, k := range outcomeKinds {
		rv.Totals = append(rv.Totals, outcomeCount{Label: k.label, Class: k.class, N: k.n(rep.Totals), Href: whole(k.query...)})
	}
	rv.Chart = volumeChart(rep.Hours, link)

	rv.ByRule = latencies(rep.ByRule, true, func(key string, kv ...string) string { return whole(append([]string{"rule", key}, kv...)...) })
	rv.ByApprover = latencies(rep.ByApprover, false, func(key string, kv ...string) string {
		return whole(append([]string{"approver", key}, kv...)...)
	})

	for _, s := range rep.RubberStamps {
		row := stampRow{Approver: textsafe.Line(s.Approver), Answers: s.Answers, AnswersHref: whole("approver", s.Approver, "by", "people"),
			Fast: s.Fast, Share: percent(s.Share), ShareW: barWidth(s.Share), Examples: examples(s.Examples, 3)}
		if len(s.Examples) > 0 {
			row.FastHref = ids(s.Examples)
		}
		rv.Stamps = append(rv.Stamps, row)
	}
	ux := rep.Unexamined
	rv.Unexamined = unexaminedView{Approved: ux.Approved, Unedited: ux.Unedited, Unlooked: ux.Unlooked,
		ApprovedHref: whole("outcome", "approved", "by", "people"), UneditedHref: whole("outcome", "approved", "by", "people", "edited", "no"),
		Share: percent(ux.Share)}
	if ux.Approved > 0 {
		rv.Unexamined.UneditedShare = percent(float64(ux.Unedited) / float64(ux.Approved))
	}
	if len(ux.Examples) > 0 {
		rv.Unexamined.UnlookedHref = ids(ux.Examples)
	}
	candidates := func(cs []insights.Candidate, outcome string) []candidateRow {
		var out []candidateRow
		for _, c := range cs {
			row := candidateRow{Outcome: outcome, Tool: textsafe.Line(c.Tool), Agent: textsafe.Line(c.Agent), Count: c.Count,
				AllHref:    link(rep.Since, rep.Until, "tool", c.Tool, "agent", c.Agent, "outcome", outcome, "by", "people"),
				Principals: textsafe.Line(strings.Join(c.Principals, ", ")), First: c.First, Last: c.Last, LastOther: c.LastOther,
				Examples: examples(c.Examples, 3), MoreThanExamples: c.Count > len(c.Examples)}
			row.CountHref = row.AllHref
			if len(c.Examples) > 0 && c.Count <= len(c.Examples) {
				row.CountHref = ids(c.Examples)
			}
			for _, a := range c.Args {
				row.Args = append(row.Args, argPattern(a))
			}
			out = append(out, row)
		}
		return out
	}
	rv.Approved = candidates(rep.AlwaysApproved, "approved")
	rv.Denied = candidates(rep.AlwaysDenied, "denied")
	for _, d := range rep.Disagreements {
		row := disagreeRow{Live: textsafe.Line(d.Live), Shadow: textsafe.Line(d.Shadow), Count: d.Count, Examples: examples(d.Examples, 3)}
		if len(d.Examples) > 0 {
			row.Href = ids(d.Examples)
		}
		rv.Disagree = append(rv.Disagree, row)
	}
	most := 0
	for _, e := range rep.EditedFields {
		most = max(most, e.Count)
	}
	for _, e := range rep.EditedFields {
		rv.Edited = append(rv.Edited, fieldRow{Field: textsafe.Line(e.Field), Count: e.Count,
			Href: whole("outcome", "approved", "by", "people", "edited", "yes", "field", e.Field), W: barWidth(float64(e.Count) / float64(max(most, 1)))})
	}
	if len(rep.AlwaysApproved)+len(rep.AlwaysDenied) > 0 {
		rv.Suggest = suggestCommand(f, rep)
	}
	return rv
}

// suggestCommand is the command line that writes rules from rep's
// candidates.
func suggestCommand(f insights.Filter, rep insights.Report) string {
	args := []string{"broker", "policy", "suggest", "--since", rep.Since.UTC().Format(time.RFC3339), "--until", rep.Until.UTC().Format(time.RFC3339)}
	for _, p := range [][2]string{{"agent", f.Agent}, {"tool", f.Tool}, {"rule", f.Rule}, {"approver", f.Approver}} {
		if p[1] != "" {
			args = append(args, "--"+p[0], shellWord(p[1]))
		}
	}
	return textsafe.Line(strings.Join(args, " "))
}

// shellWord quotes s for a POSIX shell when it needs it.
func shellWord(s string) string {
	if s != "" && strings.IndexFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_.:/@", r))
	}) < 0 {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// latencies lays out the time to decide of rows; href links to the
// requests of one key, with more query pairs.
func latencies(rows []insights.Latency, rules bool, href func(key string, kv ...string) string) latencyTable {
	var t latencyTable
	for _, l := range rows {
		t.Max = max(t.Max, l.P90.Std(), l.P50.Std())
	}
	for _, l := range rows {
		row := latencyRow{Key: textsafe.Line(l.Key), KeyHref: href(l.Key), Decided: l.Decided, DecidedHref: href(l.Key, "by", "people"),
			P50: latencyWords(l.P50.Std()), P90: latencyWords(l.P90.Std()), Expired: l.Expired, IsRule: rules}
		if l.Decided == 0 {
			row.P50, row.P90 = "–", "–"
		}
		if t.Max > 0 {
			row.P50W, row.P90W = barWidth(float64(l.P50)/float64(t.Max)), barWidth(float64(l.P90)/float64(t.Max))
		}
		if rules && l.Expired > 0 {
			row.HasExpired, row.ExpiredHref = true, href(l.Key, "outcome", "expired")
			row.ExpiredOfAll = fmt.Sprintf("of %d asked", l.Decided+l.Expired)
		}
		t.Rows = append(t.Rows, row)
	}
	return t
}

// latencyWords says how long a decision took: to the tenth of a second
// under ten seconds, then as the pages say durations.
func latencyWords(d time.Duration) string {
	switch {
	case d < 100*time.Millisecond:
		return "<0.1 s"
	case d < 10*time.Second:
		return strconv.FormatFloat(d.Seconds(), 'f', 1, 64) + " s"
	case d < time.Minute:
		return fmt.Sprintf("%d s", int(d.Round(time.Second).Seconds()))
	case d < time.Hour && d%time.Minute < time.Second:
		return fmt.Sprintf("%dm", int(d.Minutes()))
	}
	return human.Duration(d)
}

func percent(f float64) string {
	p := min(max(f, 0), 1) * 100
	if p > 0 && p < 1 {
		return "<1%"
	}
	return strconv.Itoa(int(math.Round(p))) + "%"
}

// barWidth is f, 0 to 1, as a percentage width; a bar of something is at
// least a sliver.
func barWidth(f float64) string {
	p := min(max(f, 0), 1) * 100
	if p > 0 && p < 1 {
		p = 1
	}
	return strconv.FormatFloat(p, 'f', 2, 64) + "%"
}

func examples(ids []string, n int) []exampleLink {
	var out []exampleLink
	for _, id := range ids[:min(n, len(ids))] {
		if events.ValidToken(id) {
			out = append(out, exampleLink{ID: id, Short: shortID(id)})
		}
	}
	return out
}

// argPattern says what a group's field held.
func argPattern(a insights.ArgPattern) argPatternView {
	v := argPatternView{Field: textsafe.Line(a.Field), Optional: a.Optional}
	for _, raw := range a.Values {
		v.Values = append(v.Values, string(textsafe.JSON(raw)))
	}
	switch {
	case !a.Varied:
	case a.Prefix != "":
		v.Varied = "varied, each starting with " + strconv.Quote(textsafe.Line(a.Prefix))
	case a.Min != nil && a.Max != nil:
		v.Varied = "varied, from " + strconv.FormatFloat(*a.Min, 'g', -1, 64) + " to " + strconv.FormatFloat(*a.Max, 'g', -1, 64)
	default:
		v.Varied = "varied"
	}
	return v
}

// chart geometry, in pixels: the plot's top, its height, and the labels'
// band below it.
const (
	chartTop    = 10
	chartPlot   = 180
	chartLabels = 26
)

// volumeChart draws hours as stacked bars, per hour for up to a week and
// per day (UTC) beyond; link lists the requests of a span, with more query
// pairs.
func volumeChart(hours []insights.HourCounts, link func(since, until time.Time, kv ...string) string) chart {
	type span struct {
		start, end time.Time
		c          insights.Counts
	}
	c := chart{Per: "hour", Height: chartTop + chartPlot + chartLabels, Base: chartTop + chartPlot}
	var spans []span
	if len(hours) > 7*24 {
		c.Per = "day"
		for _, h := range hours {
			day := h.Hour.UTC().Truncate(24 * time.Hour)
			if len(spans) == 0 || !spans[len(spans)-1].start.Equal(day) {
				spans = append(spans, span{start: day, end: day.Add(24 * time.Hour)})
			}
			add(&spans[len(spans)-1].c, h.Counts)
		}
	} else {
		for _, h := range hours {
			spans = append(spans, span{start: h.Hour.UTC(), end: h.Hour.UTC().Add(time.Hour), c: h.Counts})
		}
	}
	c.Dense = len(spans) > 48
	most := 0
	for _, s := range spans {
		most = max(most, s.c.Total())
	}
	step, top := yScale(most)
	for v := 0; v <= top; v += step {
		c.YTicks = append(c.YTicks, yTick{Y: c.Base - v*chartPlot/top, Label: count(v)})
	}
	n := len(spans)
	slot := 100 / float64(max(n, 1))
	pct := func(f float64) string { return strconv.FormatFloat(f, 'f', 3, 64) + "%" }
	labels := 6 // fit a phone's width
	if c.Dense {
		labels = 8 // the chart scrolls there
	}
	labelEvery := xLabelEvery(n, c.Per, labels)
	total := 0
	for i, s := range spans {
		b := bar{X: pct(slot*float64(i) + slot*0.15), W: pct(slot * 0.7), Mid: pct(slot*float64(i) + slot/2), Total: s.c.Total(), Href: link(s.start, s.end)}
		if c.Per == "hour" {
			b.Label = s.start.Format("Jan 2, 15:04") + "–" + s.end.Format("15:04") + " UTC"
		} else {
			b.Label = s.start.Format("Mon Jan 2") + " (UTC)"
		}
		y := c.Base
		for _, k := range outcomeKinds {
			v := k.n(s.c)
			if v == 0 {
				continue
			}
			h := int(math.Round(float64(v) * chartPlot / float64(top)))
			h = max(h, 2)
			y -= h
			b.Segs = append(b.Segs, seg{Y: y, H: h, Class: k.class, Title: fmt.Sprintf("%s: %s %s", b.Label, count(v), k.label), Href: link(s.start, s.end, k.query...)})
		}
		b.Top, b.ShowTotal = y, b.Total > 0 && n <= 48
		b.TotalX, b.TotalAnchor = b.Mid, "middle"
		switch {
		case slot*float64(i) < 3:
			b.TotalX, b.TotalAnchor = b.X, "start"
		case slot*float64(i+1) > 97:
			b.TotalX, b.TotalAnchor = pct(slot*float64(i)+slot*0.85), "end"
		}
		total += b.Total
		c.Bars = append(c.Bars, b)
		if labelEvery > 0 && onBoundary(s.start, c.Per, labelEvery) {
			l := xLabel{X: b.Mid, Anchor: "middle"}
			switch {
			case c.Per == "day" || s.start.Hour() == 0:
				l.Label = s.start.Format("Jan 2")
			default:
				l.Label = s.start.Format("15:04")
			}
			if slot*float64(i) < 4 {
				l.X, l.Anchor = pct(slot*float64(i)), "start"
			} else if slot*float64(i+1) > 96 {
				l.X, l.Anchor = pct(slot*float64(i+1)), "end"
			}
			c.XLabels = append(c.XLabels, l)
		}
	}
	if n > 0 {
		c.Summary = fmt.Sprintf("%s decisions from %s to %s UTC, per %s, stacked by outcome; the most in one %s: %s.",
			count(total), spans[0].start.Format("Jan 2 15:04"), spans[n-1].end.Format("Jan 2 15:04"), c.Per, c.Per, count(most))
	}
	return c
}

func add(dst *insights.Counts, c insights.Counts) {
	dst.Approved += c.Approved
	dst.Denied += c.Denied
	dst.Expired += c.Expired
	dst.Cancelled += c.Cancelled
	dst.AutoApproved += c.AutoApproved
	dst.AutoDenied += c.AutoDenied
}

// yScale returns the step of the value axis's lines and its top: a round
// step (1, 2 or 5 times a power of ten), at most five of them to the top.
func yScale(most int) (step, top int) {
	if most <= 0 {
		return 1, 1
	}
	for p := 1; ; p *= 10 {
		for _, m := range []int{1, 2, 5} {
			step = m * p
			if n := (most + step - 1) / step; n <= 5 {
				return step, n * step
			}
		}
	}
}

// xLabelEvery is how many hours (or days) apart the time axis's labels
// are, so that at most most of them fit.
func xLabelEvery(n int, per string, most int) int {
	steps := []int{1, 2, 3, 6, 12, 24, 48, 72, 168}
	if per == "day" {
		steps = []int{1, 2, 7, 14, 28, 56, 91, 182}
	}
	for _, s := range steps {
		if n/s <= most {
			return s
		}
	}
	return steps[len(steps)-1]
}

// onBoundary reports whether t starts a label's span: hours at multiples
// of every (counted from midnight, UTC), days every so many days from the
// Unix epoch's Monday-aligned weeks.
func onBoundary(t time.Time, per string, every int) bool {
	if per == "hour" {
		if every >= 24 {
			days := int(t.Unix() / 86400)
			return t.Hour() == 0 && days%(every/24) == 0
		}
		return t.Hour()%every == 0
	}
	days := int(t.Unix()/86400) + 3 // 1970-01-01 was a Thursday: Monday-aligned
	return days%every == 0
}

// requestsView lists the requests behind one of a report's numbers.
type requestsView struct {
	What  string // what they are: "approved by people · agent coder · ..."
	Rows  []card
	Next  string // the address of the rest, or ""
	Empty string
	// Unseen counts example ids the viewer may not see or the broker no
	// longer has.
	Unseen int
}

// requestsPage is how many requests /insights/requests lists at once, and
// requestsScans how many pages of the audit log it reads for them.
const (
	requestsPage  = 50
	requestsScans = 3
)

// requestQuery is what /insights/requests selects, besides the filter.
type requestQuery struct {
	outcome string // approved, denied, expired, cancelled
	by      string // people, policy
	edited  string // yes, no
	field   string // an argument field an edit changed
	ids     []string
	after   uint64
}

func (u *UI) insightsRequests(r *http.Request, v viewer) (string, string, string, any, error) {
	form, f, err := u.insightsFilter(r, v)
	if err != nil {
		return refused(err)
	}
	q := r.URL.Query()
	rq := requestQuery{outcome: q.Get("outcome"), by: q.Get("by"), edited: q.Get("edited"), field: q.Get("field")}
	var problems []string
	if !slices.Contains([]string{"", "approved", "denied", "expired", "cancelled"}, rq.outcome) {
		problems = append(problems, fmt.Sprintf("outcome %q: want approved, denied, expired or cancelled", rq.outcome))
	}
	if !slices.Contains([]string{"", "people", "policy"}, rq.by) {
		problems = append(problems, fmt.Sprintf("by %q: want people or policy", rq.by))
	}
	if !slices.Contains([]string{"", "yes", "no"}, rq.edited) {
		problems = append(problems, fmt.Sprintf("edited %q: want yes or no", rq.edited))
	}
	if ids := q.Get("ids"); ids != "" {
		rq.ids = strings.Split(ids, ",")
		if len(rq.ids) > requestsPage {
			problems = append(problems, fmt.Sprintf("ids: at most %d", requestsPage))
		}
		for _, id := range rq.ids {
			if !events.ValidToken(id) {
				problems = append(problems, fmt.Sprintf("ids: %q is not a request id", id))
				break
			}
		}
	}
	if a := q.Get("after"); a != "" {
		n, err := strconv.ParseUint(a, 10, 64)
		if err != nil {
			problems = append(problems, fmt.Sprintf("after %q: not a stream sequence", a))
		}
		rq.after = n
	}
	if len(problems) > 0 {
		return "", "", "", nil, &badInput{textsafe.Line(strings.Join(problems, "; "))}
	}
	// Back to the report the list came from: its filter and window (the
	// list's own since and until may be one hour's).
	back := url.Values{}
	for _, k := range httpapi.InsightsParams {
		if val := q.Get(k); val != "" && k != "since" && k != "until" {
			back.Set(k, val)
		}
	}
	if w := q.Get("window"); w != "" {
		back.Set("since", w)
	}
	form.Back = "/insights?" + back.Encode()
	var rv *requestsView
	if len(rq.ids) > 0 {
		rv, err = u.exampleRequests(r.Context(), v, rq.ids)
	} else {
		rv, err = u.decidedRequests(r.Context(), v, f, rq, q)
	}
	if err != nil {
		return "", "", "", nil, err
	}
	return "insights", "Requests · Insights", "insights", insightsView{Form: form, Requests: rv}, nil
}

// exampleRequests lists the requests of ids that v sees.
func (u *UI) exampleRequests(ctx context.Context, v viewer, ids []string) (*requestsView, error) {
	rv := &requestsView{What: plural(len(ids), "example request", "example requests") + " the report names, most recent first",
		Empty: "None of these requests is one you may see, or the broker still has."}
	for _, id := range ids {
		rec, err := u.get(ctx, v, id)
		switch {
		case errors.Is(err, broker.ErrNotFound):
			rv.Unseen++
			continue
		case err != nil:
			return nil, err
		}
		rv.Rows = append(rv.Rows, u.makeCard(rec, v))
	}
	return rv, nil
}

// decidedRequests lists, from the audit log, the decided requests that f
// and rq select and v sees, a page at a time.
func (u *UI) decidedRequests(ctx context.Context, v viewer, f insights.Filter, rq requestQuery, q url.Values) (*requestsView, error) {
	until := f.Until
	if until.IsZero() {
		until = u.cfg.Now()
	}
	since := f.Since
	if since.IsZero() {
		since = until.Add(-insights.DefaultWindow)
	}
	rv := &requestsView{What: describeRequests(f, rq, since, until) + ", oldest first", Empty: "No decided request matches."}
	aq := broker.AuditQuery{Types: []string{"decided"}, Agent: f.Agent, Rule: f.Rule, Principal: f.Approver,
		Since: since, Until: until, After: rq.after, Limit: 200}
	// next is the address of the rest, continuing after stream sequence
	// after.
	next := func(after uint64) string {
		n := url.Values{}
		for k, vs := range q {
			if k != "after" {
				n[k] = vs
			}
		}
		n.Set("after", strconv.FormatUint(after, 10))
		return "/insights/requests?" + n.Encode()
	}
	for range requestsScans {
		page, err := u.b.Audit(ctx, aq)
		if err != nil {
			return nil, err
		}
		for _, e := range page.Events {
			if len(rv.Rows) == requestsPage {
				rv.Next = next(aq.After)
				return rv, nil
			}
			aq.After = e.Seq
			if e.NotDecision != "" || !rq.matchEvent(e) {
				continue
			}
			rec, err := u.get(ctx, v, e.RequestID)
			switch {
			case errors.Is(err, broker.ErrNotFound):
				continue // not the viewer's to see, or gone from the store
			case err != nil:
				return nil, err
			}
			if f.Tool != "" && rec.Request.Tool != f.Tool || rq.field != "" && !changed(rec, rq.field) {
				continue
			}
			rv.Rows = append(rv.Rows, u.makeCard(rec, v))
		}
		if page.Next == 0 {
			return rv, nil
		}
		aq.After = page.Next
	}
	rv.Next = next(aq.After)
	return rv, nil
}

// matchEvent reports whether decided event e is one rq asks for.
func (rq requestQuery) matchEvent(e *broker.Event) bool {
	var ce struct {
		Data struct {
			Outcome string `json:"outcome"`
			Auto    bool   `json:"auto"`
			Edited  bool   `json:"edited"`
		} `json:"data"`
	}
	if json.Unmarshal(e.Event, &ce) != nil {
		return false
	}
	d := ce.Data
	switch {
	case rq.outcome != "" && d.Outcome != rq.outcome:
		return false
	case rq.by == "people" && (d.Auto || d.Outcome == "expired" || d.Outcome == "cancelled"):
		return false
	case rq.by == "policy" && !d.Auto:
		return false
	case rq.edited == "yes" && !d.Edited, rq.edited == "no" && d.Edited:
		return false
	case rq.field != "" && !d.Edited:
		return false
	}
	return true
}

// changed reports whether an approver's edit changed rec's top-level
// argument field.
func changed(rec broker.Record, field string) bool {
	if rec.Decision == nil || !rec.Decision.Edited {
		return false
	}
	var asked, approved map[string]any
	_ = json.Unmarshal(rec.Request.Args, &asked)
	_ = json.Unmarshal(rec.Decision.Args, &approved)
	a, inAsked := asked[field]
	b, inApproved := approved[field]
	return inAsked != inApproved || !reflect.DeepEqual(a, b)
}

// describeRequests says in words which requests a list holds.
func describeRequests(f insights.Filter, rq requestQuery, since, until time.Time) string {
	var parts []string
	what := "decided"
	switch {
	case rq.outcome != "" && rq.by != "":
		what = rq.outcome + " by " + rq.by
	case rq.outcome != "":
		what = rq.outcome
	case rq.by != "":
		what = "decided by " + rq.by
	}
	switch rq.edited {
	case "yes":
		what += ", with edited arguments"
	case "no":
		what += ", without an edit"
	}
	if rq.field != "" {
		what += " that changed " + strconv.Quote(rq.field)
	}
	parts = append(parts, what)
	for _, p := range [][2]string{{"agent", f.Agent}, {"tool", f.Tool}, {"rule", f.Rule}, {"approver", f.Approver}} {
		if p[1] != "" {
			parts = append(parts, p[0]+" "+p[1])
		}
	}
	layout := "Jan 2 15:04"
	parts = append(parts, since.UTC().Format(layout)+" to "+until.UTC().Format(layout)+" UTC")
	return textsafe.Line(strings.Join(parts, " · "))
}
