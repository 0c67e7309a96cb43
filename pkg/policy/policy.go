package policy

import (
	"slices"
	"time"

	"github.com/assent-dev/assent/pkg/events"
	"github.com/google/cel-go/cel"
)

// Mode is what happens to a request no rule and no remembered choice decides.
type Mode string

// Modes.
const (
	ModeManual      Mode = "manual"       // people decide: anyone may approve, with the defaults
	ModeAutoApprove Mode = "auto-approve" // approve at once
	ModeAutoDeny    Mode = "auto-deny"    // deny at once
)

// Action is what a rule, and the evaluation as a whole, does with a request.
type Action string

// Actions.
const (
	Allow           Action = "allow"
	Deny            Action = "deny"
	RequireApproval Action = "require_approval"
)

// NoApprover is what happens to a request when no eligible approver is
// reachable through a live channel.
type NoApprover string

// No-approver outcomes.
const (
	NoApproverDeny NoApprover = "deny" // deny at once, with reason ReasonNoApprover
	NoApproverWait NoApprover = "wait" // wait for an approver or the timeout
)

// ReasonNoApprover is the decision reason the broker should use when
// on_no_approver is deny and Approval.Reachable reports false.
const ReasonNoApprover = "no_approver_available"

// Built-in defaults, used when the policy file does not set them.
const (
	DefaultTimeout     = 5 * time.Minute
	DefaultMaxRemember = 720 * time.Hour
	// AnyApprover in an approvers list means anyone may approve.
	AnyApprover = "any"
	// RolePrefix marks an approver entry that names a role: "role:finance".
	RolePrefix = "role:"
)

// scopes lists the remember scopes, narrowest first.
var scopes = [...]string{events.ScopeCall, events.ScopeSession, events.ScopeAgent, events.ScopeUser}

// allScopes returns a fresh list of the four remember scopes.
func allScopes() []string { return slices.Clone(scopes[:]) }

// Policy is a parsed, validated policy. It is immutable and safe for concurrent
// use; evaluate requests with Evaluate. Build one with Parse or Default.
type Policy struct {
	Version    int
	Mode       Mode
	Defaults   Defaults
	Principals map[string]*Principal
	Rules      []*Rule
	Limits     []*Limit
	// File is the file name given to Parse ("" for Default).
	File string

	deny, allow, require []*Rule
	mode                 *Approval         // the approval of the manual-mode fallback
	identities           map[string]string // "slack:U024BE7LH" -> principal name
}

// Defaults apply to every approval rule that does not set its own value, and to
// the manual-mode fallback.
type Defaults struct {
	Timeout           time.Duration  // timeout; default 5m
	OnTimeout         events.Verdict // on_timeout; default deny
	OnNoApprover      NoApprover     // on_no_approver; default deny
	AllowSelfApproval bool           // allow_self_approval; default false
	Rememberable      bool           // rememberable; default true
	MaxRemember       time.Duration  // max_remember: the longest a grant may live; default 720h
}

// Principal is a person or program that may approve, with its roles and the
// identities channels know it by.
type Principal struct {
	Name  string
	Roles []string
	Slack string
	Email string
	// Identities maps other channel names to the principal's id there.
	Identities map[string]string
}

// Rule is one entry of the rules list. Exactly one of the three actions;
// Approval is set only for require_approval rules.
type Rule struct {
	Name     string
	Tools    []string          // globs; empty matches any tool
	Agents   []string          // globs; empty matches any agent
	Labels   map[string]string // label -> glob; every one must be present and match
	When     string            // CEL condition; empty is true
	Action   Action
	Reason   string
	Approval *Approval
	Line     int // line of the rule in the policy file

	index  int // position in Policy.Rules
	tools  globs
	agents globs
	labels []labelGlob
	prg    cel.Program
}

// Approval says who must approve a request and how. Results carry a copy whose
// Timeout is already the one for that request.
type Approval struct {
	// Rule is the rule the approval comes from, or "mode:manual".
	Rule string
	// Approvers as written: principal names and "role:<role>"; empty means
	// anyone.
	Approvers         []string
	Quorum            int
	Timeout           time.Duration
	OnTimeout         events.Verdict
	OnNoApprover      NoApprover
	AllowSelfApproval bool
	Rememberable      bool
	// RememberScopes are the scopes answers may be remembered in; all four by
	// default.
	RememberScopes []string
	// MaxRemember is the longest a remembered answer may live.
	MaxRemember time.Duration
	Escalation  []Step

	// levels[i] holds the principals named (directly or through a role) by
	// level i (0: Approvers, i: Escalation[i-1]); anyone[i] is true when that
	// level is open to anyone.
	levels   []map[string]bool
	anyone   []bool
	eligible map[string]bool // union of levels; nil when some level is open to anyone
	open     bool            // some level is open to anyone
}

// Step is one rung of an escalation ladder: After the request started, notify
// Approvers (who may then answer as well) and push the deadline out by Extend.
type Step struct {
	After     time.Duration
	Approvers []string
	Extend    time.Duration
}

// Limit is a stateful bound on automatic approvals: a count, or a running sum of
// a CEL expression, per session, agent, user or globally, over a window.
type Limit struct {
	Name   string
	Tools  []string
	Agents []string
	Per    string  // "session", "agent", "user" or "global"
	Sum    string  // CEL expression giving a number; empty counts requests
	Max    float64 // the total may not exceed this
	Window time.Duration
	// Over is what happens instead when the limit would be exceeded: Deny or
	// RequireApproval.
	Over Action
	Line int

	tools  globs
	agents globs
	prg    cel.Program
}

// Per values of a Limit.
const (
	PerSession = "session"
	PerAgent   = "agent"
	PerUser    = "user"
	PerGlobal  = "global"
)

// defaultDefaults is the defaults section a policy file starts from.
func defaultDefaults() Defaults {
	return Defaults{
		Timeout:      DefaultTimeout,
		OnTimeout:    events.Deny,
		OnNoApprover: NoApproverDeny,
		Rememberable: true,
		MaxRemember:  DefaultMaxRemember,
	}
}

// Default returns the policy used when no policy file is given: manual mode,
// anyone may approve (but not the request's own user), answers may be
// remembered for up to 720h, a 5 minute timeout that denies, and a request with
// no reachable approver is denied at once.
func Default() *Policy {
	p := &Policy{
		Version:    1,
		Mode:       ModeManual,
		Defaults:   defaultDefaults(),
		Principals: map[string]*Principal{},
	}
	p.finish()
	return p
}

// finish builds the derived indexes of a policy whose fields are set and valid.
func (p *Policy) finish() {
	p.deny, p.allow, p.require = nil, nil, nil
	for i, r := range p.Rules {
		r.index = i
		switch r.Action {
		case Deny:
			p.deny = append(p.deny, r)
		case Allow:
			p.allow = append(p.allow, r)
		case RequireApproval:
			p.require = append(p.require, r)
		}
	}
	p.mode = &Approval{
		Rule:              "mode:" + string(ModeManual),
		Quorum:            1,
		Timeout:           p.Defaults.Timeout,
		OnTimeout:         p.Defaults.OnTimeout,
		OnNoApprover:      p.Defaults.OnNoApprover,
		AllowSelfApproval: p.Defaults.AllowSelfApproval,
		Rememberable:      p.Defaults.Rememberable,
		RememberScopes:    allScopes(),
		MaxRemember:       p.Defaults.MaxRemember,
	}
	p.mode.resolve(p)
	p.identities = map[string]string{}
	for name, pr := range p.Principals {
		for ch, id := range pr.channels() {
			p.identities[ch+":"+id] = name
		}
	}
}

// channels returns every channel identity of pr, keyed by channel name.
func (pr *Principal) channels() map[string]string {
	m := make(map[string]string, len(pr.Identities)+2)
	for ch, id := range pr.Identities {
		m[ch] = id
	}
	if pr.Slack != "" {
		m["slack"] = pr.Slack
	}
	if pr.Email != "" {
		m["email"] = pr.Email
	}
	return m
}

// PrincipalFor returns the principal a channel knows by id ("slack",
// "U024BE7LH"), as declared in the principals section.
func (p *Policy) PrincipalFor(channel, id string) (string, bool) {
	name, ok := p.identities[channel+":"+id]
	return name, ok
}

// HasRole reports whether the principal is declared with role.
func (p *Policy) HasRole(principal, role string) bool {
	pr := p.Principals[principal]
	if pr == nil {
		return false
	}
	for _, r := range pr.Roles {
		if r == role {
			return true
		}
	}
	return false
}

// ModeApproval returns the approval that the manual-mode fallback uses: the
// defaults, anyone approving.
func (p *Policy) ModeApproval() *Approval { return p.mode }
