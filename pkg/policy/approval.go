package policy

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/assent-dev/assent/pkg/events"
)

// resolve computes the principals each level names. Roles resolve through
// p.Principals, so the approval keeps the eligibility it had when the policy was
// parsed even after a reload.
func (a *Approval) resolve(p *Policy) {
	lists := [][]string{a.Approvers}
	for _, s := range a.Escalation {
		lists = append(lists, s.Approvers)
	}
	a.levels = make([]map[string]bool, len(lists))
	a.anyone = make([]bool, len(lists))
	a.eligible = map[string]bool{}
	a.open = false
	for i, list := range lists {
		set := map[string]bool{}
		open := len(list) == 0
		for _, s := range list {
			switch {
			case s == AnyApprover:
				open = true
			case strings.HasPrefix(s, RolePrefix):
				role := s[len(RolePrefix):]
				for name := range p.Principals {
					if p.HasRole(name, role) {
						set[name] = true
					}
				}
			default:
				set[s] = true
			}
		}
		if open {
			set = nil
			a.open = true
		}
		a.levels[i], a.anyone[i] = set, open
		for name := range set {
			a.eligible[name] = true
		}
	}
}

// Anyone reports whether any principal may answer (some level of the ladder is
// open to anyone).
func (a *Approval) Anyone() bool { return a.open }

// Eligible reports whether principal may answer the request in. Escalation
// decides whom the broker notifies and when; everyone on any level of the
// ladder may answer from the start.
//
// If principal is the request's user and the rule does not allow self-approval,
// the error matches both ErrSelfApproval and ErrNotEligible; if principal is not
// among the approvers, ErrNotEligible.
func (a *Approval) Eligible(principal string, in Input) error {
	switch {
	case principal == "":
		return fmt.Errorf("%w: no principal", ErrNotEligible)
	case !a.AllowSelfApproval && in.User != "" && principal == in.User:
		return fmt.Errorf("%w: %w: %s is the user the request is made for (rule %s)", ErrNotEligible, ErrSelfApproval, principal, a.Rule)
	case a.open || a.eligible[principal]:
		return nil
	}
	return fmt.Errorf("%w: %s is not among the approvers of rule %s (%s)", ErrNotEligible, principal, a.Rule, strings.Join(a.allApprovers(), ", "))
}

func (a *Approval) allApprovers() []string {
	all := slices.Clone(a.Approvers)
	for _, s := range a.Escalation {
		all = append(all, s.Approvers...)
	}
	return all
}

// Vote is one principal's answer, as the broker has recorded it.
type Vote struct {
	Principal string
	Verdict   events.Verdict
}

// Tally is the state of a request's votes.
type Tally struct {
	// Decided is true once the votes decide the request; Verdict is then the
	// outcome.
	Decided bool
	Verdict events.Verdict
	// Approvals lists the distinct eligible principals who approved, in vote
	// order; Denials those who denied.
	Approvals []string
	Denials   []string
	// Need is the quorum.
	Need int
}

// Tally counts votes: the request is denied as soon as one eligible principal
// denies (even one who approved before), and approved once Quorum distinct
// eligible principals approve. Votes from principals who are not eligible (see
// Eligible) are ignored; a principal approving twice counts once.
func (a *Approval) Tally(in Input, votes []Vote) Tally {
	t := Tally{Need: a.Quorum}
	for _, v := range votes {
		if a.Eligible(v.Principal, in) != nil {
			continue
		}
		switch v.Verdict {
		case events.Deny:
			if !slices.Contains(t.Denials, v.Principal) {
				t.Denials = append(t.Denials, v.Principal)
			}
		case events.Approve:
			if !slices.Contains(t.Approvals, v.Principal) {
				t.Approvals = append(t.Approvals, v.Principal)
			}
		}
	}
	switch {
	case len(t.Denials) > 0:
		t.Decided, t.Verdict = true, events.Deny
	case len(t.Approvals) >= max(a.Quorum, 1):
		t.Decided, t.Verdict = true, events.Approve
	}
	return t
}

// Escalation is where a request stands on its approval's escalation ladder at a
// moment.
type Escalation struct {
	// Level is 0 before the first step, n after the n-th step fired.
	Level int
	// Deadline is when the request times out, with the extensions of the steps
	// that fired.
	Deadline time.Time
	// Next is when the next step fires, zero if no further step will fire
	// before the deadline.
	Next time.Time
}

// At returns the escalation state at now of a request that started at started
// and times out at deadline unless a step extends it (zero: started plus the
// approval's Timeout, for a request that asked for no shorter timeout). Steps
// fire at started+After, in order; a step due at or after the deadline in
// force (deadline plus the extensions of the steps before it) never fires.
func (a *Approval) At(started, deadline, now time.Time) Escalation {
	if deadline.IsZero() {
		deadline = started.Add(a.Timeout)
	}
	e := Escalation{Deadline: deadline}
	for _, s := range a.Escalation {
		at := started.Add(s.After)
		if !at.Before(e.Deadline) {
			break
		}
		if now.Before(at) {
			e.Next = at
			break
		}
		e.Level++
		e.Deadline = e.Deadline.Add(s.Extend)
	}
	return e
}

// Level returns the escalation level at now (see At).
func (a *Approval) Level(started, deadline, now time.Time) int {
	return a.At(started, deadline, now).Level
}

// Deadline returns the deadline in force at now (see At).
func (a *Approval) Deadline(started, deadline, now time.Time) time.Time {
	return a.At(started, deadline, now).Deadline
}

// ApproversAt returns the approvers entries (as written) that level adds:
// Approvers for 0, the step's approvers for n. Nil means anyone. Out of range
// levels give nil.
func (a *Approval) ApproversAt(level int) []string {
	switch {
	case level == 0:
		return a.Approvers
	case level > 0 && level <= len(a.Escalation):
		return a.Escalation[level-1].Approvers
	}
	return nil
}

// Notify returns the principals to notify when level is reached, sorted, with
// roles resolved. ok is false when the level is open to anyone (notify every
// channel).
func (a *Approval) Notify(level int) (principals []string, ok bool) {
	if level < 0 || level >= len(a.levels) || a.anyone[level] {
		return nil, false
	}
	return sortedKeys(a.levels[level]), true
}

// Presence is what the broker knows about live approver channels. The broker
// implements it from the channels' presence announcements.
type Presence interface {
	// Everyone reports whether a live channel reaches every principal, like the
	// broker's HTTP gateway when it runs without authentication.
	Everyone() bool
	// Live lists the principals some live channel reaches.
	Live() []string
}

// StaticPresence is a fixed Presence, for tests and offline tools.
type StaticPresence struct {
	All        bool
	Principals []string
}

// Everyone implements Presence.
func (s StaticPresence) Everyone() bool { return s.All }

// Live implements Presence.
func (s StaticPresence) Live() []string { return s.Principals }

// Reachable reports whether at least Quorum distinct principals who may answer
// the request in (see Eligible) are reached by a live channel. When it is
// false the broker applies OnNoApprover at once.
func (a *Approval) Reachable(in Input, live Presence) bool {
	need := max(a.Quorum, 1)
	if live == nil {
		return false
	}
	count := func(names func(yield func(string) bool)) bool {
		n := 0
		for name := range names {
			if a.Eligible(name, in) == nil {
				if n++; n >= need {
					return true
				}
			}
		}
		return false
	}
	if live.Everyone() {
		if a.open {
			return true
		}
		return count(func(yield func(string) bool) {
			for name := range a.eligible {
				if !yield(name) {
					return
				}
			}
		})
	}
	return count(func(yield func(string) bool) {
		seen := map[string]bool{}
		for _, name := range live.Live() {
			if seen[name] {
				continue
			}
			seen[name] = true
			if !yield(name) {
				return
			}
		}
	})
}

// TimeoutFor returns the timeout of a request that asked for requested (zero:
// none). The approval's Timeout is both the default and the ceiling; a shorter
// request is honoured, except when a timeout approves (on_timeout: approve),
// where an agent must not be able to hasten its own approval.
func (a *Approval) TimeoutFor(requested time.Duration) time.Duration {
	if requested > 0 && requested < a.Timeout && a.OnTimeout != events.Approve {
		return requested
	}
	return a.Timeout
}
