package policy

import (
	"fmt"
)

// Applies reports whether the limit covers requests like in (tool and agent
// globs; empty lists match anything).
func (l *Limit) Applies(in Input) bool {
	return l.tools.match(in.Tool) && l.agents.match(in.Agent)
}

// Amount returns how much in adds to the limit's running total: 1 when the
// limit counts requests, else the value of its sum expression. A CEL error, a
// non-number, a negative or non-finite amount gives an error wrapping
// ErrCondition; the broker should then treat the limit as exceeded (fail
// closed).
func (l *Limit) Amount(in Input) (float64, error) {
	if l.prg == nil {
		return 1, nil
	}
	f, err := evalNumber(l.prg, newActivation(&in))
	if err != nil {
		return 0, fmt.Errorf("%w: limit %s: sum %s: %v", ErrCondition, l.Name, l.Sum, err)
	}
	if f < 0 {
		return 0, fmt.Errorf("%w: limit %s: sum %s is negative (%v)", ErrCondition, l.Name, l.Sum, f)
	}
	return f, nil
}

// Scope returns the scope key of the running total in belongs to:
// "session:<id>", "agent:<name>", "user:<id>" or "global". A request without
// the value (no session, say) shares the total of every such request
// ("session:").
func (l *Limit) Scope(in Input) string {
	switch l.Per {
	case PerSession:
		return "session:" + in.Session
	case PerAgent:
		return "agent:" + in.Agent
	case PerUser:
		return "user:" + in.User
	}
	return PerGlobal
}

// Key returns a NATS KV key for the running total of in:
// "<limit>.<per>.<value>" (the value as KeyToken writes it) or
// "<limit>.global". Totals of different limits never share a key.
func (l *Limit) Key(in Input) string {
	switch l.Per {
	case PerSession:
		return l.Name + ".session." + KeyToken(in.Session)
	case PerAgent:
		return l.Name + ".agent." + KeyToken(in.Agent)
	case PerUser:
		return l.Name + ".user." + KeyToken(in.User)
	}
	return l.Name + ".global"
}

// Allows reports whether adding amount to total stays within the limit.
func (l *Limit) Allows(total, amount float64) bool { return total+amount <= l.Max }

// Describe returns a one-line summary, such as "session-spend: sum of
// args.amount per session at most 5000 over 24h, else require_approval".
func (l *Limit) Describe() string {
	what := "count"
	if l.Sum != "" {
		what = "sum of " + l.Sum
	}
	per := "per " + l.Per
	if l.Per == PerGlobal {
		per = "overall"
	}
	window := ""
	if l.Window > 0 {
		window = " over " + l.Window.String()
	}
	return fmt.Sprintf("%s: %s %s at most %v%s, else %s", l.Name, what, per, l.Max, window, l.Over)
}
