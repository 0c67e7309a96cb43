// Package policy decides what happens to an approval request: allow it, deny
// it, or ask people, and if so whom, how many, for how long, and what then.
//
// It is pure: no I/O, no clock (callers pass now), no NATS. The broker owns the
// state (pending requests, votes, remembered choices, running totals) and asks
// this package what the policy file says about it.
//
// # Policy files
//
// Parse reads a YAML policy (docs/policy.md is the reference); Default is the
// policy of a broker without a file. Every problem in a file is reported at once,
// each as an *Error with file, line and place ("rules[2] (big-reimbursements)"),
// matching ErrInvalid and a specific sentinel. CEL conditions are compiled once,
// at Parse; a *Policy is immutable and safe for concurrent use.
//
// # Evaluating a request
//
//	in, err := policy.InputFrom(req)      // req is an events.Requested
//	res := p.Evaluate(in, now, grants)   // grants implements Remembered, or nil
//
// Precedence, strongest first: deny rules, allow rules, remembered choices,
// require_approval rules, the mode. Within each class the first matching rule
// in file order wins. A condition that fails at run time counts as a match for
// deny and require_approval rules and as no match for allow rules (fail closed);
// the errors are in Result.Errors for the caller to log. Trace is Evaluate with
// an explanation, for `broker policy test`; Explain prints either.
//
// # What the broker does with a Result
//
//   - Allow or Deny: decide at once with Auto set and Rule as the decision's rule.
//     For Allow, first add Limit.Amount to each of Result.Limits' running totals
//     (at Limit.Key) atomically; if one would pass its maximum, or the amount
//     cannot be computed, decide by Result.Exceeded instead.
//   - RequireApproval: Result.Approval says who may answer (Approval.Eligible),
//     how answers combine (Approval.Tally), when to escalate and the deadline
//     (Approval.At), and whether anyone can answer at all
//     (Approval.Reachable; if not, apply OnNoApprover at once).
//   - An answer that asks to be remembered becomes a Grant through
//     Approval.NewGrant; store it under Grant.Key until ExpiresAt, and give
//     Evaluate the grants stored under GrantKeys(in).
//   - Shadow mode: evaluate a second policy beside the live one and record
//     Diff's disagreements; never act on them.
package policy
