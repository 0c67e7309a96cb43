package httpapi

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/assent-dev/assent/internal/access"
	"github.com/assent-dev/assent/internal/human"
	"github.com/assent-dev/assent/internal/insights"
	"github.com/assent-dev/assent/pkg/events"
)

// InsightsParams are the query parameters that select a report of GET
// /v1/insights (and of the web UI's Insights tab): the window and the
// filters of insights.Filter.
var InsightsParams = []string{"since", "until", "agent", "tool", "rule", "approver"}

// MaxInsightsWindow bounds the window of one report: a report holds every
// hour of its window.
const MaxInsightsWindow = insights.MaxWindow

// maxRuleLength bounds a rule name in a query.
const maxRuleLength = 256

// insights answers GET /v1/insights: what the record says about the
// requests the query selects, within what the caller may read
// (ScopeInsights).
func (s *Server) insights(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	var unknown []string
	for name := range q {
		if !slices.Contains(InsightsParams, name) {
			unknown = append(unknown, strconv.Quote(name))
		}
	}
	if len(unknown) > 0 {
		slices.Sort(unknown)
		writeError(w, http.StatusBadRequest, "invalid_request", fmt.Sprintf("unknown query parameter %s (the parameters are %s)", strings.Join(unknown, ", "), strings.Join(InsightsParams, ", ")))
		return
	}
	f, err := ParseInsightsQuery(q, time.Now())
	if err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request", err.Error())
		return
	}
	f, err = ScopeInsights(s.caller(r).access(), f)
	if err != nil {
		var refused *InsightsRefusal
		if errors.As(err, &refused) {
			writeError(w, http.StatusForbidden, refused.Code, refused.Message)
			return
		}
		s.fail(w, err)
		return
	}
	rep, err := s.b.Insights(r.Context(), f)
	if err != nil {
		s.fail(w, err)
		return
	}
	writeJSON(w, http.StatusOK, withEmptyLists(rep))
}

// withEmptyLists returns rep with its nil lists empty, so that its JSON
// holds [] where a client reads a list, never null. rep's own lists are not
// changed (the broker may share them).
func withEmptyLists(rep insights.Report) insights.Report {
	rep.Hours = orEmpty(rep.Hours)
	rep.ByRule, rep.ByApprover = orEmpty(rep.ByRule), orEmpty(rep.ByApprover)
	rep.RubberStamps = orEmpty(rep.RubberStamps)
	rep.Disagreements, rep.EditedFields = orEmpty(rep.Disagreements), orEmpty(rep.EditedFields)
	candidates := func(cs []insights.Candidate) []insights.Candidate {
		out := make([]insights.Candidate, len(cs))
		for i, c := range cs {
			c.Args, c.Principals = orEmpty(c.Args), orEmpty(c.Principals)
			out[i] = c
		}
		return out
	}
	rep.AlwaysApproved, rep.AlwaysDenied = candidates(rep.AlwaysApproved), candidates(rep.AlwaysDenied)
	return rep
}

func orEmpty[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

// ParseInsightsQuery reads the Filter that q's InsightsParams select, and
// reports every problem with them at once:
//
//   - since: an RFC 3339 time, or a duration (Go's, with d for days and w
//     for weeks: 7d, 24h, 1d12h) meaning that long before until;
//   - until: an RFC 3339 time, or a duration meaning that long before now;
//     left out, now;
//   - agent, approver: names the broker uses (letters, digits, _ and -);
//   - tool, rule: names, without control or invisible characters.
//
// Each may be given once. A window that ends before it starts, or is longer
// than MaxInsightsWindow, is a problem. Parameters it does not know are
// left alone: the caller decides whether they are an error.
func ParseInsightsQuery(q url.Values, now time.Time) (insights.Filter, error) {
	var f insights.Filter
	var problems []string
	get := func(name string) string {
		vs := q[name]
		if len(vs) > 1 {
			problems = append(problems, fmt.Sprintf("%s: given %d times; give it once", name, len(vs)))
		}
		if len(vs) == 0 {
			return ""
		}
		return vs[0]
	}
	// until first: a since duration counts back from it.
	end := now
	if v := get("until"); v != "" {
		t, err := parseInsightsTime(v, now)
		if err != nil {
			problems = append(problems, "until: "+err.Error())
		} else {
			f.Until, end = t, t
		}
	}
	if v := get("since"); v != "" {
		t, err := parseInsightsTime(v, end)
		if err != nil {
			problems = append(problems, "since: "+err.Error())
		} else {
			f.Since = t
		}
	}
	if !f.Since.IsZero() {
		switch {
		case !f.Since.Before(end):
			problems = append(problems, fmt.Sprintf("since %s is not before until %s: the window is empty", f.Since.UTC().Format(time.RFC3339), end.UTC().Format(time.RFC3339)))
		case end.Sub(f.Since) > MaxInsightsWindow:
			problems = append(problems, fmt.Sprintf("the window from since to until is %s, longer than the %d days a report covers at most", spanWords(end.Sub(f.Since)), MaxInsightsWindow/(24*time.Hour)))
		}
	}
	for _, p := range []struct {
		name string
		dst  *string
	}{{"agent", &f.Agent}, {"approver", &f.Approver}} {
		v := get(p.name)
		if v != "" && !events.ValidToken(v) {
			problems = append(problems, fmt.Sprintf("%s: %q is not a name the broker uses (1 to %d letters, digits, _ or -)", p.name, v, events.MaxTokenLength))
			continue
		}
		*p.dst = v
	}
	for _, p := range []struct {
		name string
		max  int
		dst  *string
	}{{"tool", events.MaxToolLength, &f.Tool}, {"rule", maxRuleLength, &f.Rule}} {
		v := get(p.name)
		if v == "" {
			continue
		}
		if len(v) > p.max {
			problems = append(problems, fmt.Sprintf("%s: longer than %d bytes", p.name, p.max))
			continue
		}
		if err := events.CheckIdentifier(p.name, v); err != nil {
			problems = append(problems, err.Error())
			continue
		}
		*p.dst = v
	}
	if len(problems) > 0 {
		return insights.Filter{}, errors.New(strings.Join(problems, "; "))
	}
	return f, nil
}

// parseInsightsTime reads an RFC 3339 time, or a duration meaning that long
// before from.
func parseInsightsTime(v string, from time.Time) (time.Time, error) {
	if t, err := time.Parse(time.RFC3339, v); err == nil {
		return t, nil
	}
	d, err := human.ParseSpan(v)
	if err != nil {
		return time.Time{}, fmt.Errorf("%q is neither an RFC 3339 time such as 2026-11-22T10:00:00Z nor a duration such as 7d, 24h or 90m", v)
	}
	return from.Add(-d), nil
}

// spanWords writes d in days and hours, or as Go does under a day.
func spanWords(d time.Duration) string {
	if d < 24*time.Hour {
		return d.Round(time.Second).String()
	}
	days, hours := int(d/(24*time.Hour)), int(d%(24*time.Hour)/time.Hour)
	if hours == 0 {
		return fmt.Sprintf("%dd", days)
	}
	return fmt.Sprintf("%dd%dh", days, hours)
}

// InsightsRefusal says why a caller may not read the insights a filter
// asks for; Code is the API's error code.
type InsightsRefusal struct {
	Code, Message string
}

func (e *InsightsRefusal) Error() string { return e.Code + ": " + e.Message }

// ScopeInsights returns f narrowed to what c may read, or an
// *InsightsRefusal (docs/security.md, "Who reads insights"). A report sums
// many requests and names request ids and argument values, so it may cover
// only requests c sees anyway:
//
//   - an admin, or anyone without authentication: the whole record, any
//     filter;
//   - a principal: the requests it answered (f.Approver is set to it);
//     naming another approver is principal_mismatch;
//   - an agent's credential: its own agent's requests (f.Agent is set to
//     it); naming another agent is agent_mismatch;
//   - a credential that is both (the MCP gateway's): either, the
//     principal's own answers unless the filter names its agent;
//   - a credential that is neither: no_principal.
//
// The filter's other fields narrow further and are kept.
func ScopeInsights(c access.Caller, f insights.Filter) (insights.Filter, error) {
	switch {
	case c.All():
		return f, nil
	case c.Agent != "" && f.Agent == c.Agent, c.Principal != "" && f.Approver == c.Principal:
		return f, nil
	case c.Principal != "" && f.Approver == "":
		f.Approver = c.Principal
		return f, nil
	case c.Agent != "" && f.Agent == "":
		f.Agent = c.Agent
		return f, nil
	case c.Principal == "" && c.Agent == "":
		return f, &InsightsRefusal{"no_principal", "this credential names neither a principal nor an agent, so it reads no insights (docs/security.md)"}
	case c.Principal != "":
		// f names another approver, and not this credential's agent.
		also := ""
		if c.Agent != "" {
			also = fmt.Sprintf(" (or of agent %q's requests)", c.Agent)
		}
		return f, &InsightsRefusal{"principal_mismatch", fmt.Sprintf("approver %q: this credential reads the insights of %s's own answers%s, not of another approver's; an admin reads everyone's (docs/security.md)", f.Approver, c.Principal, also)}
	}
	// An agent's credential, f naming another agent.
	return f, &InsightsRefusal{"agent_mismatch", fmt.Sprintf("agent %q: this credential reads the insights of agent %q's requests, not another agent's; an admin reads every agent's (docs/security.md)", f.Agent, c.Agent)}
}
