package adkassent

import (
	"encoding/json"
	"time"

	"github.com/assent-dev/assent/pkg/events"
	"github.com/assent-dev/assent/pkg/policy"
)

// Gate tells which calls need asking: those the policy the broker applies
// does not allow outright. It evaluates the policy in process (package
// policy: no I/O), before ADK would ask for a confirmation; the broker
// decides, and records, every call it lets through.
//
// A call needs no confirmation only when an allow rule allows it and nothing
// the Gate cannot see could change that: no limit counts the approval (those
// keep running totals in the broker), no condition failed, and neither the
// allow rule nor any deny rule that applies to the tool mentions session
// (unknown before the call) or user (unknown unless User is set). Remembered choices never spare a call
// asking. Give it the agent name and labels the Runner's Config has, so the
// Gate judges the request the broker will see.
type Gate struct {
	// Policy is the broker's policy; nil makes every call need asking.
	Policy *policy.Policy
	// Agent and Labels as in the Runner's Config.
	Agent  string
	Labels map[string]string
	// User is the user every call is made for, for an agent that serves one;
	// empty when it varies.
	User string
	// Now is the clock; nil is time.Now.
	Now func() time.Time
}

// Needs reports whether the call of tool with args needs a confirmation. Its
// signature is ADK's tool.ConfirmationProvider, for tool.WithConfirmation.
// Anything it cannot judge (args that do not encode as a JSON object, say)
// needs one.
func (g Gate) Needs(tool string, args any) bool {
	if g.Policy == nil {
		return true
	}
	raw, err := json.Marshal(args)
	if err != nil {
		return true
	}
	in, err := policy.InputFrom(events.Requested{Tool: tool, Args: raw, Agent: g.Agent, User: g.User, Labels: g.Labels})
	if err != nil {
		return true
	}
	now := time.Now
	if g.Now != nil {
		now = g.Now
	}
	res := g.Policy.Evaluate(in, now(), nil)
	if res.Action != policy.Allow || res.Grant != nil || len(res.Limits) > 0 || len(res.Errors) > 0 {
		return true
	}
	allowed := false
	for _, r := range g.Policy.Rules {
		switch {
		case r.Action == policy.Allow && r.Name == res.Rule:
			allowed = !g.unknowable(r.When)
		case r.Action == policy.Deny && g.unknowable(r.When) && r.Selects(in):
			return true // it might deny the call for its real user or session
		}
	}
	return !allowed // not allowed by a rule: by the mode, which a remembered denial would beat
}

// unknowable reports whether condition may depend on what the Gate does not
// know: it mentions session, or user while User is unset. It reads words, not
// CEL, so it errs towards asking (a string "user" counts too).
func (g Gate) unknowable(condition string) bool {
	return mentions(condition, "session") || g.User == "" && mentions(condition, "user")
}

// mentions reports whether s holds word as a whole identifier.
func mentions(s, word string) bool {
	ident := func(c byte) bool {
		return c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
	}
	for i := 0; i+len(word) <= len(s); i++ {
		if s[i:i+len(word)] != word {
			continue
		}
		if (i == 0 || !ident(s[i-1])) && (i+len(word) == len(s) || !ident(s[i+len(word)])) {
			return true
		}
	}
	return false
}

// RequireConfirmation returns g as a functiontool RequireConfirmationProvider
// for tool, whose arguments are a T:
//
//	functiontool.Config{Name: "reimburse", RequireConfirmationProvider: adkassent.RequireConfirmation[ReimburseArgs](gate, "reimburse")}
//
// It is true unless the policy allows the call outright (see Gate).
func RequireConfirmation[T any](g Gate, tool string) func(T) bool {
	return func(args T) bool { return g.Needs(tool, args) }
}
