package replay

import (
	"time"

	"github.com/assent-dev/assent/pkg/events"
	"github.com/assent-dev/assent/pkg/policy"
)

// grants are the remembered choices as they stood: each made when an
// answer that asked to remember decided its request, until it expires. It
// implements policy.Remembered for one evaluation at a time (now).
type grants struct {
	by    map[grantKey][]policy.Grant
	tools map[string]int // tool -> grants of it
	calls map[string]int // tool -> call-scoped grants of it
	now   time.Time
	buf   []policy.Grant
}

type grantKey struct{ scope, value, tool string }

func newGrants() *grants {
	return &grants{by: map[grantKey][]policy.Grant{}, tools: map[string]int{}, calls: map[string]int{}}
}

func (g *grants) add(gr policy.Grant) {
	k := grantKey{gr.Scope, gr.ScopeValue, gr.Tool}
	g.by[k] = append(g.by[k], gr)
	g.tools[gr.Tool]++
	if gr.Scope == events.ScopeCall {
		g.calls[gr.Tool]++
	}
}

// has reports whether any grant of tool is held; needsDigest whether a
// call-scoped one is, which only the args digest can match.
func (g *grants) has(tool string) bool         { return g.tools[tool] > 0 }
func (g *grants) needsDigest(tool string) bool { return g.calls[tool] > 0 }

var grantScopes = [...]string{events.ScopeCall, events.ScopeSession, events.ScopeAgent, events.ScopeUser}

// Grants implements policy.Remembered: the grants held under in's scope
// values, those expired by now dropped for good. The slice is reused by
// the next call (Evaluate keeps a copy of the one it picks).
func (g *grants) Grants(in policy.Input) []policy.Grant {
	g.buf = g.buf[:0]
	if !g.has(in.Tool) {
		return nil
	}
	for _, scope := range grantScopes {
		v := policy.ScopeValue(scope, in)
		if v == "" {
			continue
		}
		k := grantKey{scope, v, in.Tool}
		held := g.by[k]
		live := held[:0]
		for _, gr := range held {
			if g.now.Before(gr.ExpiresAt) {
				live = append(live, gr)
				continue
			}
			g.tools[gr.Tool]--
			if gr.Scope == events.ScopeCall {
				g.calls[gr.Tool]--
			}
		}
		switch {
		case len(live) == 0:
			delete(g.by, k)
		default:
			clear(held[len(live):])
			g.by[k] = live
		}
		g.buf = append(g.buf, live...)
	}
	return g.buf
}

// totals are the running totals of the replayed policy's limits, charged by
// the automatic approvals of the replay as the broker charges them
// (internal/broker/limits.go): a total starts over when its window has
// passed since it started, and is gone once nothing charged it for the
// stream's retention (the limits bucket's TTL).
type totals struct {
	m         map[string]*total
	retention time.Duration
}

type total struct {
	sum            float64
	since, written time.Time
}

type charged struct {
	l      *policy.Limit
	amount float64
}

func newTotals(retention time.Duration) *totals {
	return &totals{m: map[string]*total{}, retention: retention}
}

// charge counts the automatic approval res of in against every limit it
// names; if one would pass its maximum (or its amount cannot be computed),
// the charges made are taken back and the limit's outcome replaces res.
func (t *totals) charge(res policy.Result, in policy.Input, now time.Time) policy.Result {
	var done []charged
	for _, l := range res.Limits {
		amount, err := l.Amount(in)
		if err != nil || !t.add(l, in, amount, now) {
			for _, c := range done {
				t.add(c.l, in, -c.amount, now)
			}
			return res.Exceeded(l, in)
		}
		done = append(done, charged{l, amount})
	}
	return res
}

// add adds amount to l's total for in if it stays within the limit (a
// negative amount always applies), and reports whether it did.
func (t *totals) add(l *policy.Limit, in policy.Input, amount float64, now time.Time) bool {
	key := l.Key(in)
	var cur total
	if held := t.m[key]; held != nil && (t.retention <= 0 || now.Sub(held.written) < t.retention) {
		cur = *held
	}
	if cur.since.IsZero() || (l.Window > 0 && now.Sub(cur.since) >= l.Window) {
		cur = total{since: now}
	}
	if amount > 0 && !l.Allows(cur.sum, amount) {
		return false
	}
	cur.sum = max(cur.sum+amount, 0)
	cur.written = now
	if held := t.m[key]; held != nil {
		*held = cur
	} else {
		t.m[key] = &cur
	}
	return true
}
