package policy

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"slices"
	"strings"
	"time"

	"github.com/assent-dev/assent/pkg/events"
)

// Grant is a remembered choice: an approver's answer reused for later requests
// for the same tool in the same scope. The broker stores grants (as JSON) under
// Key, with a per-key TTL that ends at ExpiresAt.
type Grant struct {
	ID      string         `json:"id"`
	Verdict events.Verdict `json:"verdict"`
	Tool    string         `json:"tool"`
	// Scope is events.ScopeCall, ScopeSession, ScopeAgent or ScopeUser;
	// ScopeValue the request's session, agent or user, or for call scope its
	// args digest (so only a request with the very same arguments matches).
	Scope      string `json:"scope"`
	ScopeValue string `json:"scope_value"`
	// ArgsPattern optionally narrows the grant: a JSON object whose keys must
	// all be present in the request's args with equal values. String values in
	// the pattern are globs (path.Match syntax); nested objects match as subsets,
	// arrays element by element.
	ArgsPattern json.RawMessage `json:"args_pattern,omitempty"`
	// Rule is the rule whose approval the grant answered.
	Rule      string    `json:"rule,omitempty"`
	RequestID string    `json:"request_id,omitempty"`
	CreatedBy string    `json:"created_by"`
	CreatedAt time.Time `json:"created_at"`
	ExpiresAt time.Time `json:"expires_at"`
}

// Remembered gives Evaluate the grants that may apply to a request. The broker
// implements it over its grant index (see GrantKeys). Grants it returns are
// checked again (Grant.Matches), so returning extra ones is harmless.
type Remembered interface {
	Grants(in Input) []Grant
}

// GrantSet is a fixed list of grants, for tests and offline evaluation.
type GrantSet []Grant

// Grants implements Remembered.
func (s GrantSet) Grants(Input) []Grant { return s }

// ScopeValue returns the value a grant in scope is bound to for in: the
// session, agent or user, or the args digest for call scope. It is "" when the
// request has no such value, or when scope is unknown.
func ScopeValue(scope string, in Input) string {
	switch scope {
	case events.ScopeCall:
		return in.ArgsDigest
	case events.ScopeSession:
		return in.Session
	case events.ScopeAgent:
		return in.Agent
	case events.ScopeUser:
		return in.User
	}
	return ""
}

// GrantKey returns the key prefix under which grants of scope for in's tool are
// stored: "<scope>.<value>.<tool>", each part kept as is when it is a subject
// token and written as "=" + unpadded base64url otherwise. The result is a
// valid NATS KV key; a grant's own key adds "." and its id (Grant.Key). If in
// has no value for scope, the error wraps ErrBadGrant.
func GrantKey(scope string, in Input) (string, error) {
	if !slices.Contains(scopes[:], scope) {
		return "", fmt.Errorf("%w: scope %q: want call, session, agent or user", ErrBadGrant, truncate(scope, 40))
	}
	v := ScopeValue(scope, in)
	if v == "" {
		return "", fmt.Errorf("%w: the request has no %s to remember the answer for", ErrBadGrant, scopeWhat(scope))
	}
	if in.Tool == "" {
		return "", fmt.Errorf("%w: no tool", ErrBadGrant)
	}
	return scope + "." + KeyToken(v) + "." + KeyToken(in.Tool), nil
}

// GrantKeys returns the key prefixes (GrantKey) of every scope in has a value
// for, narrowest scope first: what a Remembered implementation looks up.
func GrantKeys(in Input) []string {
	keys := make([]string, 0, len(scopes))
	if in.Tool == "" {
		return keys
	}
	// GrantKey for each scope, without building an error for every scope
	// the request has no value for.
	tool := KeyToken(in.Tool)
	for _, s := range scopes {
		if v := ScopeValue(s, in); v != "" {
			keys = append(keys, s+"."+KeyToken(v)+"."+tool)
		}
	}
	return keys
}

// Key returns the grant's storage key: its GrantKey prefix, ".", its id.
func (g *Grant) Key() string {
	return g.Scope + "." + KeyToken(g.ScopeValue) + "." + KeyToken(g.Tool) + "." + KeyToken(g.ID)
}

// KeyToken makes s safe as one token of a NATS subject or KV key: a subject
// token (A-Z a-z 0-9 _ -, at most 128 bytes) stays as it is, anything else
// becomes "=" followed by its unpadded base64url encoding. Distinct inputs give
// distinct tokens.
func KeyToken(s string) string {
	if events.ValidToken(s) {
		return s
	}
	return "=" + base64.RawURLEncoding.EncodeToString([]byte(s))
}

func scopeWhat(scope string) string {
	if scope == events.ScopeCall {
		return "args digest"
	}
	return scope
}

// NewGrant turns an approver's answer with remember into a grant for the
// request in. id must be a subject token (the broker makes a UUIDv7). A zero
// rem.TTL means the longest the approval allows (MaxRemember).
//
// If the approval's answers may not be remembered, in that scope or for that
// long, the error wraps ErrNotRememberable; if the scope is unknown, the TTL
// negative or the request has no value for the scope (no session, say), it
// wraps ErrBadGrant.
func (a *Approval) NewGrant(id string, verdict events.Verdict, rem events.Remember, in Input, principal string, now time.Time) (Grant, error) {
	if !slices.Contains(scopes[:], rem.Scope) {
		return Grant{}, fmt.Errorf("%w: scope %q: want call, session, agent or user", ErrBadGrant, truncate(rem.Scope, 40))
	}
	switch ttl := rem.TTL.Std(); {
	case !a.Rememberable:
		return Grant{}, fmt.Errorf("%w: rule %s is not rememberable", ErrNotRememberable, a.Rule)
	case !slices.Contains(a.RememberScopes, rem.Scope):
		return Grant{}, fmt.Errorf("%w: rule %s allows remembering only in scope %s, not %s", ErrNotRememberable, a.Rule, strings.Join(a.RememberScopes, ", "), rem.Scope)
	case ttl < 0:
		return Grant{}, fmt.Errorf("%w: ttl %s: negative", ErrBadGrant, ttl)
	case ttl > a.MaxRemember:
		return Grant{}, fmt.Errorf("%w: ttl %s: rule %s allows at most %s", ErrNotRememberable, ttl, a.Rule, a.MaxRemember)
	}
	ttl := rem.TTL.Std()
	if ttl == 0 {
		ttl = a.MaxRemember
	}
	g := Grant{
		ID:         id,
		Verdict:    verdict,
		Tool:       in.Tool,
		Scope:      rem.Scope,
		ScopeValue: ScopeValue(rem.Scope, in),
		Rule:       a.Rule,
		CreatedBy:  principal,
		CreatedAt:  now.UTC(),
		ExpiresAt:  now.Add(ttl).UTC(),
	}
	if err := g.Validate(); err != nil {
		return Grant{}, err
	}
	return g, nil
}

// Validate reports every problem with g at once; each wraps ErrBadGrant.
func (g *Grant) Validate() error {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{ErrBadGrant}, args...)...))
	}
	if !events.ValidToken(g.ID) {
		bad("id %q: not a subject token", truncate(g.ID, 40))
	}
	if g.Verdict != events.Approve && g.Verdict != events.Deny {
		bad("verdict %q: want approve or deny", truncate(string(g.Verdict), 40))
	}
	if g.Tool == "" {
		bad("no tool")
	}
	if !slices.Contains(scopes[:], g.Scope) {
		bad("scope %q: want call, session, agent or user", truncate(g.Scope, 40))
	} else if g.ScopeValue == "" {
		bad("the request has no %s to remember the answer for", scopeWhat(g.Scope))
	}
	if g.CreatedBy == "" {
		bad("no created_by")
	}
	if !g.ExpiresAt.After(g.CreatedAt) {
		bad("expires_at %s is not after created_at %s", g.ExpiresAt.Format(time.RFC3339), g.CreatedAt.Format(time.RFC3339))
	}
	if len(g.ArgsPattern) > 0 {
		if _, err := compilePattern(g.ArgsPattern); err != nil {
			bad("args_pattern: %v", err)
		}
	}
	return errors.Join(errs...)
}

// Matches reports whether g applies to in at now: not expired, same tool, same
// scope value, and the args pattern (if any) matches.
func (g *Grant) Matches(in Input, now time.Time) bool {
	if !now.Before(g.ExpiresAt) || g.Tool != in.Tool || g.ScopeValue == "" || ScopeValue(g.Scope, in) != g.ScopeValue {
		return false
	}
	if len(g.ArgsPattern) == 0 {
		return true
	}
	pat, err := compilePattern(g.ArgsPattern)
	if err != nil {
		return false
	}
	args, err := in.args()
	return err == nil && matchValue(pat, args)
}

// compilePattern decodes an args pattern and checks its globs.
func compilePattern(raw json.RawMessage) (map[string]any, error) {
	pat, err := DecodeArgs(raw)
	if err != nil {
		return nil, errors.New("must be a JSON object")
	}
	if err := checkGlobs(pat); err != nil {
		return nil, err
	}
	return pat, nil
}

func checkGlobs(v any) error {
	switch x := v.(type) {
	case string:
		if _, err := path.Match(x, ""); err != nil {
			return fmt.Errorf("%q: not a glob pattern", truncate(x, 40))
		}
	case map[string]any:
		for _, e := range x {
			if err := checkGlobs(e); err != nil {
				return err
			}
		}
	case []any:
		for _, e := range x {
			if err := checkGlobs(e); err != nil {
				return err
			}
		}
	}
	return nil
}

// matchValue reports whether value matches pattern (both as DecodeArgs gives
// them).
func matchValue(pattern, value any) bool {
	switch p := pattern.(type) {
	case string:
		s, ok := value.(string)
		if !ok {
			return false
		}
		m, err := path.Match(p, s)
		return err == nil && m
	case int64, float64:
		pf, _ := toFloat(p)
		vf, ok := toFloat(value)
		if !ok {
			return false
		}
		if pi, ok := p.(int64); ok {
			if vi, ok := value.(int64); ok {
				return pi == vi
			}
		}
		return pf == vf
	case map[string]any:
		m, ok := value.(map[string]any)
		if !ok {
			return false
		}
		for k, pv := range p {
			v, ok := m[k]
			if !ok || !matchValue(pv, v) {
				return false
			}
		}
		return true
	case []any:
		l, ok := value.([]any)
		if !ok || len(l) != len(p) {
			return false
		}
		for i := range p {
			if !matchValue(p[i], l[i]) {
				return false
			}
		}
		return true
	default: // nil, bool
		return pattern == value
	}
}

func toFloat(v any) (float64, bool) {
	switch x := v.(type) {
	case int64:
		return float64(x), true
	case float64:
		return x, true
	}
	return 0, false
}

// pickGrant chooses the grant that decides in under approval a, from the
// candidates: a denial beats an approval, then a narrower scope beats a wider
// one, then the smaller id. Grants that do not match, are in a scope the
// approval does not allow, or live longer than it allows are skipped; trace
// (if not nil) collects why.
func pickGrant(cands []Grant, in Input, now time.Time, a *Approval, trace *[]string) *Grant {
	var best *Grant
	for i := range cands {
		g := &cands[i]
		why := ""
		switch {
		case g.Verdict != events.Approve && g.Verdict != events.Deny:
			why = "bad verdict"
		case !now.Before(g.ExpiresAt):
			why = "expired at " + g.ExpiresAt.UTC().Format(time.RFC3339)
		case !g.Matches(in, now):
			why = "does not match this request"
		case !slices.Contains(a.RememberScopes, g.Scope):
			why = fmt.Sprintf("scope %s not allowed by %s (allows %s)", g.Scope, a.Rule, strings.Join(a.RememberScopes, ", "))
		case !g.CreatedAt.IsZero() && g.ExpiresAt.Sub(g.CreatedAt) > a.MaxRemember:
			why = fmt.Sprintf("lives %s, longer than %s allows (%s)", g.ExpiresAt.Sub(g.CreatedAt), a.Rule, a.MaxRemember)
		}
		if trace != nil {
			if why != "" {
				*trace = append(*trace, fmt.Sprintf("  grant %s (%s, %s scope, by %s): skipped, %s", g.ID, g.Verdict, g.Scope, g.CreatedBy, why))
			} else {
				*trace = append(*trace, fmt.Sprintf("  grant %s (%s, %s scope, by %s): matches", g.ID, g.Verdict, g.Scope, g.CreatedBy))
			}
		}
		if why == "" && (best == nil || grantBefore(g, best)) {
			best = g
		}
	}
	if best == nil {
		return nil
	}
	out := *best
	return &out
}

func grantBefore(a, b *Grant) bool {
	if (a.Verdict == events.Deny) != (b.Verdict == events.Deny) {
		return a.Verdict == events.Deny
	}
	ai, bi := slices.Index(scopes[:], a.Scope), slices.Index(scopes[:], b.Scope)
	if ai != bi {
		return ai < bi
	}
	return a.ID < b.ID
}
