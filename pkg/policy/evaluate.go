package policy

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/assent-dev/assent/pkg/events"
)

// Result is the outcome of evaluating one request.
type Result struct {
	// Action is Allow or Deny (decided at once) or RequireApproval.
	Action Action
	// Auto is true when the policy decided without a person: Allow and Deny.
	Auto bool
	// Rule names what decided: a rule's name, "mode:<mode>",
	// "remembered:<grant id>", or "limit:<name>" (see Exceeded).
	Rule string
	// Limit names the limit that held an automatic approval back (see
	// Exceeded); the approval, if people decide, is Approval.Rule's.
	Limit  string
	Reason string
	// Grant is the remembered choice that decided, if one did.
	Grant *Grant
	// Approval says who must approve, for RequireApproval. Its Timeout is the
	// one for this request (see Approval.TimeoutFor).
	Approval *Approval
	// Limits lists the limits an automatic approval counts against, in file
	// order. The broker must add Limit.Amount to each running total (at
	// Limit.Key) atomically, and if any would pass its maximum, decide by
	// Exceeded instead.
	Limits []*Limit
	// Trace explains the evaluation line by line; only Policy.Trace fills it.
	Trace []string
	// Errors lists the CEL runtime errors met (each wraps ErrCondition), for the
	// caller to log. They were already applied fail-closed.
	Errors []error

	// fallback is the approval a request needs if a limit is exceeded: the
	// first matching require_approval rule's, else the mode fallback's.
	fallback *Approval
}

// Evaluate decides what happens to the request in at now. rem may be nil (no
// remembered choices). Precedence, strongest first:
//
//  1. the first matching deny rule,
//  2. the first matching allow rule,
//  3. a remembered choice (a denial beats an approval), unless the first
//     matching require_approval rule, or with none the defaults, are not
//     rememberable,
//  4. the first matching require_approval rule,
//  5. the mode: manual requires approval by anyone with the defaults,
//     auto-approve allows, auto-deny denies.
//
// A rule matches when the tool, agent and labels match its globs and its
// condition is true. A condition that fails at run time counts as a match for
// deny and require_approval rules and as no match for allow rules (fail
// closed); the error is in Result.Errors. Evaluate does no I/O besides calling
// rem, and is safe for concurrent use.
func (p *Policy) Evaluate(in Input, now time.Time, rem Remembered) Result {
	return p.evaluate(&in, now, rem, false)
}

// Trace is Evaluate that also explains itself in Result.Trace: it evaluates
// every rule (not just until the decision is clear), so the trace shows every
// match. The decision is the same as Evaluate's. It is meant for `broker policy
// test`, not for the request path.
func (p *Policy) Trace(in Input, now time.Time, rem Remembered) Result {
	return p.evaluate(&in, now, rem, true)
}

type evaluator struct {
	p     *Policy
	in    *Input
	res   *Result
	act   *activation // built on the first condition, shared by the rest
	trace bool
	memo  []int8 // trace mode: 0 not evaluated, 1 no match, 2 match
}

func (p *Policy) evaluate(in *Input, now time.Time, rem Remembered, trace bool) Result {
	var res Result
	e := &evaluator{p: p, in: in, res: &res, trace: trace}
	if trace {
		e.memo = make([]int8, len(p.Rules))
		e.tracef("request: tool %q, agent %q, session %q, user %q, labels %v", in.Tool, in.Agent, in.Session, in.User, in.Labels)
		for _, r := range p.Rules {
			e.matches(r)
		}
	}
	e.decide(now, rem)
	if trace {
		e.tracef("decision: %s by %s", res.Action, res.Rule)
	}
	return res
}

// decide fills e.res.
func (e *evaluator) decide(now time.Time, rem Remembered) {
	p, in, res := e.p, e.in, e.res
	if r := e.first(p.deny); r != nil {
		res.Action, res.Auto, res.Rule = Deny, true, r.Name
		res.Reason = reasonOr(r.Reason, "denied by rule "+r.Name)
		return
	}
	if r := e.first(p.allow); r != nil {
		res.Action, res.Auto, res.Rule = Allow, true, r.Name
		res.Reason = reasonOr(r.Reason, "allowed by rule "+r.Name)
		e.limits(nil, false)
		return
	}
	req := e.first(p.require)
	appr := p.mode
	if req != nil {
		appr = req.Approval
	}
	res.fallback = appr
	if g := e.grant(rem, appr, now); g != nil {
		res.Auto, res.Rule, res.Grant = true, "remembered:"+g.ID, g
		if g.Verdict == events.Approve {
			res.Action = Allow
			res.Reason = fmt.Sprintf("remembered approval by %s (%s scope, until %s)", g.CreatedBy, g.Scope, g.ExpiresAt.UTC().Format(time.RFC3339))
			e.limits(appr, true)
		} else {
			res.Action = Deny
			res.Reason = fmt.Sprintf("remembered denial by %s (%s scope, until %s)", g.CreatedBy, g.Scope, g.ExpiresAt.UTC().Format(time.RFC3339))
		}
		return
	}
	if req != nil {
		res.Action, res.Rule = RequireApproval, req.Name
		res.Reason = reasonOr(req.Reason, "rule "+req.Name+" requires approval")
		res.Approval = forRequest(req.Approval, in)
		return
	}
	res.Rule = "mode:" + string(p.Mode)
	switch p.Mode {
	case ModeAutoApprove:
		res.Action, res.Auto, res.Reason = Allow, true, "auto-approve mode"
		e.limits(appr, true)
	case ModeAutoDeny:
		res.Action, res.Auto, res.Reason = Deny, true, "auto-deny mode"
	default:
		res.Action, res.Reason = RequireApproval, "manual mode: no rule matched"
		res.Approval = forRequest(p.mode, in)
	}
}

// forRequest copies a with the request's timeout.
func forRequest(a *Approval, in *Input) *Approval {
	c := *a
	c.Timeout = a.TimeoutFor(in.Timeout)
	return &c
}

func reasonOr(reason, def string) string {
	if reason != "" {
		return reason
	}
	return def
}

func (e *evaluator) tracef(format string, args ...any) {
	e.res.Trace = append(e.res.Trace, fmt.Sprintf(format, args...))
}

// first returns the first rule of class that matches.
func (e *evaluator) first(class []*Rule) *Rule {
	for _, r := range class {
		if e.matches(r) {
			return r
		}
	}
	return nil
}

func (e *evaluator) matches(r *Rule) bool {
	if e.memo != nil && e.memo[r.index] != 0 {
		return e.memo[r.index] == 2
	}
	m, why := e.match(r)
	if e.memo != nil {
		e.memo[r.index] = 1
		verdict := "no match"
		if m {
			e.memo[r.index] = 2
			verdict = "MATCH"
		}
		e.tracef("rules[%d] %s (%s): %s: %s", r.index, r.Name, r.Action, verdict, why)
	}
	return m
}

// Selects reports whether r's tools, agents and labels match in: whether r
// applies to in once its condition (When) holds.
func (r *Rule) Selects(in Input) bool {
	return r.tools.match(in.Tool) && r.agents.match(in.Agent) && matchLabels(r.labels, in.Labels)
}

// match evaluates one rule. why is only computed in trace mode.
func (e *evaluator) match(r *Rule) (ok bool, why string) {
	in := e.in
	switch {
	case !r.tools.match(in.Tool):
		if e.trace {
			why = fmt.Sprintf("tool %q is not one of %v", in.Tool, r.Tools)
		}
		return false, why
	case !r.agents.match(in.Agent):
		if e.trace {
			why = fmt.Sprintf("agent %q is not one of %v", in.Agent, r.Agents)
		}
		return false, why
	case !matchLabels(r.labels, in.Labels):
		if e.trace {
			why = fmt.Sprintf("labels %v do not match %v", in.Labels, r.Labels)
		}
		return false, why
	case r.prg == nil:
		if e.trace {
			why = "tool, agent and labels match; no condition"
		}
		return true, why
	}
	if e.act == nil {
		e.act = newActivation(in)
	}
	ok, err := evalBool(r.prg, e.act)
	if err != nil {
		e.res.Errors = append(e.res.Errors, fmt.Errorf("%w: rule %s: when %s: %v", ErrCondition, r.Name, r.When, err))
		ok = r.Action != Allow
		if e.trace {
			how := "counts as no match"
			if ok {
				how = "counts as a match"
			}
			why = fmt.Sprintf("condition %s failed (%v): %s (fail closed)", r.When, err, how)
		}
		return ok, why
	}
	if e.trace {
		why = fmt.Sprintf("condition %s is %v", r.When, ok)
	}
	return ok, why
}

// grant consults remembered choices under approval a.
func (e *evaluator) grant(rem Remembered, a *Approval, now time.Time) *Grant {
	if rem == nil {
		return nil
	}
	if !a.Rememberable {
		if e.trace {
			e.tracef("remembered choices: not consulted, %s is not rememberable", a.Rule)
		}
		return nil
	}
	cands := rem.Grants(*e.in)
	var tr *[]string
	if e.trace {
		e.tracef("remembered choices: %d candidate(s) under %s", len(cands), a.Rule)
		tr = &e.res.Trace
	}
	return pickGrant(cands, *e.in, now, a, tr)
}

// limits records the limits an automatic approval counts against. fallback is
// the approval to require if one is exceeded; known is false when the
// require_approval rules were not looked at yet.
func (e *evaluator) limits(fallback *Approval, known bool) {
	for _, l := range e.p.Limits {
		if l.Applies(*e.in) {
			e.res.Limits = append(e.res.Limits, l)
			if e.trace {
				e.tracef("limit %s applies", l.Describe())
			}
		}
	}
	if len(e.res.Limits) == 0 {
		return
	}
	if !known {
		fallback = e.p.mode
		if r := e.first(e.p.require); r != nil {
			fallback = r.Approval
		}
	}
	e.res.fallback = fallback
}

// Exceeded returns what happens to the request in instead of r (an automatic
// approval) when limit l would be exceeded, or its amount cannot be computed:
// l.Over, as rule "limit:<name>". For RequireApproval, the approval is that of
// the first require_approval rule matching the request, or the manual-mode
// fallback's.
func (r Result) Exceeded(l *Limit, in Input) Result {
	out := Result{
		Action: l.Over,
		Rule:   "limit:" + l.Name,
		Limit:  l.Name,
		Reason: "limit would be exceeded: " + l.Describe(),
		Trace:  r.Trace,
		Errors: r.Errors,
	}
	if l.Over == RequireApproval && r.fallback != nil {
		out.Approval = forRequest(r.fallback, &in)
		return out
	}
	out.Action, out.Auto = Deny, true
	return out
}

// Explain describes r in a few lines of plain text, for `broker policy test`
// and logs.
func Explain(r Result) string {
	var b strings.Builder
	fmt.Fprintf(&b, "decision: %s", r.Action)
	if r.Auto {
		b.WriteString(" (automatic)")
	}
	fmt.Fprintf(&b, "\nrule: %s\n", r.Rule)
	if r.Reason != "" {
		fmt.Fprintf(&b, "reason: %s\n", r.Reason)
	}
	if g := r.Grant; g != nil {
		fmt.Fprintf(&b, "remembered: %s %s of tool %s in %s scope (%s) by %s, until %s\n",
			g.ID, g.Verdict, g.Tool, g.Scope, g.ScopeValue, g.CreatedBy, g.ExpiresAt.UTC().Format(time.RFC3339))
	}
	if a := r.Approval; a != nil {
		writeApproval(&b, a)
	}
	if len(r.Limits) > 0 {
		b.WriteString("limits (the broker checks the running totals):\n")
		for _, l := range r.Limits {
			fmt.Fprintf(&b, "  %s\n", l.Describe())
		}
	}
	if len(r.Errors) > 0 {
		b.WriteString("errors (applied fail-closed):\n")
		for _, err := range r.Errors {
			fmt.Fprintf(&b, "  %v\n", err)
		}
	}
	if len(r.Trace) > 0 {
		b.WriteString("trace:\n")
		for _, l := range r.Trace {
			fmt.Fprintf(&b, "  %s\n", l)
		}
	}
	return b.String()
}

func writeApproval(b *strings.Builder, a *Approval) {
	approvers := "anyone"
	if len(a.Approvers) > 0 {
		approvers = strings.Join(a.Approvers, ", ")
	}
	fmt.Fprintf(b, "approvers: %s, quorum %d\n", approvers, a.Quorum)
	fmt.Fprintf(b, "timeout: %s, then %s; with no reachable approver: %s\n", a.Timeout, a.OnTimeout, a.OnNoApprover)
	self := "not allowed"
	if a.AllowSelfApproval {
		self = "allowed"
	}
	fmt.Fprintf(b, "self-approval: %s\n", self)
	if a.Rememberable {
		fmt.Fprintf(b, "remember: allowed in scope %s, for up to %s\n", strings.Join(a.RememberScopes, ", "), a.MaxRemember)
	} else {
		b.WriteString("remember: not allowed\n")
	}
	for i, s := range a.Escalation {
		fmt.Fprintf(b, "escalation %d: after %s notify %s", i+1, s.After, strings.Join(s.Approvers, ", "))
		if s.Extend > 0 {
			fmt.Fprintf(b, ", deadline +%s", s.Extend)
		}
		b.WriteString("\n")
	}
}

// Diff compares the results of two policies for the same request, the live one
// (a) and a shadow candidate (b). It reports whether they disagree, on the
// action, the deciding rule, or for approvals on approvers, quorum or timeout,
// and describes the disagreement in one line.
func Diff(a, b Result) (differ bool, summary string) {
	var parts []string
	if a.Action != b.Action {
		parts = append(parts, fmt.Sprintf("action %s vs %s", a.Action, b.Action))
	}
	if a.Rule != b.Rule {
		parts = append(parts, fmt.Sprintf("rule %s vs %s", a.Rule, b.Rule))
	}
	if x, y := a.Approval, b.Approval; a.Action == RequireApproval && b.Action == RequireApproval && x != nil && y != nil {
		if !slices.Equal(x.Approvers, y.Approvers) {
			parts = append(parts, fmt.Sprintf("approvers %v vs %v", x.Approvers, y.Approvers))
		}
		if x.Quorum != y.Quorum {
			parts = append(parts, fmt.Sprintf("quorum %d vs %d", x.Quorum, y.Quorum))
		}
		if x.Timeout != y.Timeout {
			parts = append(parts, fmt.Sprintf("timeout %s vs %s", x.Timeout, y.Timeout))
		}
	}
	if len(parts) == 0 {
		return false, ""
	}
	return true, strings.Join(parts, "; ")
}
