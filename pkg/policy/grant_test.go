package policy_test

import (
	"encoding/json"
	"errors"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/assent-dev/assent/pkg/events"
	"github.com/assent-dev/assent/pkg/policy"
)

func TestNewGrant(t *testing.T) {
	p := mustParse(t, readExample(t, "session-remember.yaml"))
	changes, _ := approvalFor(t, p, `{"tool":"write_file"}`)
	deletions, _ := approvalFor(t, p, `{"tool":"delete_file"}`)
	manual := p.ModeApproval()
	full := `{"tool":"write_file","session":"s-1","agent":"a1","user":"u1","args":{"path":"/tmp/x"}}`
	tests := []struct {
		name  string
		a     *policy.Approval
		req   string
		rem   events.Remember
		want  error
		value string
		ttl   time.Duration
	}{
		{"session", changes, full, events.Remember{Scope: "session", TTL: events.Duration(30 * time.Minute)}, nil, "s-1", 30 * time.Minute},
		{"session default ttl", changes, full, events.Remember{Scope: "session"}, nil, "s-1", time.Hour},
		{"call", changes, full, events.Remember{Scope: "call"}, nil, "sha256:", time.Hour},
		{"ttl too long", changes, full, events.Remember{Scope: "session", TTL: events.Duration(2 * time.Hour)}, policy.ErrNotRememberable, "", 0},
		{"ttl negative", changes, full, events.Remember{Scope: "session", TTL: events.Duration(-time.Second)}, policy.ErrBadGrant, "", 0},
		{"scope not allowed", changes, full, events.Remember{Scope: "agent"}, policy.ErrNotRememberable, "", 0},
		{"scope unknown", changes, full, events.Remember{Scope: "forever"}, policy.ErrBadGrant, "", 0},
		{"not rememberable", deletions, full, events.Remember{Scope: "session"}, policy.ErrNotRememberable, "", 0},
		{"no session", changes, `{"tool":"write_file"}`, events.Remember{Scope: "session"}, policy.ErrBadGrant, "", 0},
		{"agent under defaults", manual, full, events.Remember{Scope: "agent"}, nil, "a1", time.Hour},
		{"user under defaults", manual, full, events.Remember{Scope: "user", TTL: events.Duration(time.Minute)}, nil, "u1", time.Minute},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			in := input(t, tc.req)
			g, err := tc.a.NewGrant("g-1", events.Approve, tc.rem, in, "alice", t0)
			if !errors.Is(err, tc.want) || (tc.want == nil) != (err == nil) {
				t.Fatalf("NewGrant: %v, want %v", err, tc.want)
			}
			if err != nil {
				return
			}
			if g.ID != "g-1" || g.Verdict != events.Approve || g.Tool != in.Tool || g.Scope != tc.rem.Scope ||
				!strings.HasPrefix(g.ScopeValue, tc.value) || g.CreatedBy != "alice" || !g.CreatedAt.Equal(t0) ||
				g.ExpiresAt.Sub(g.CreatedAt) != tc.ttl || g.Rule != tc.a.Rule {
				t.Errorf("grant %+v", g)
			}
			if !g.Matches(in, t0) || g.Matches(in, g.ExpiresAt) {
				t.Error("grant does not match its own request until it expires")
			}
			// Round trip through JSON, as the broker stores it.
			b, _ := json.Marshal(g)
			var back policy.Grant
			if err := json.Unmarshal(b, &back); err != nil || back.Key() != g.Key() || !back.Matches(in, t0) {
				t.Errorf("JSON round trip: %s, %v", b, err)
			}
		})
	}
}

func TestGrantMatches(t *testing.T) {
	in := input(t, `{"tool":"write_file","session":"s-1","agent":"a1","user":"u1","args":{"path":"/tmp/x.txt","n":5,"f":2.5,"opts":{"mode":"w","flags":[1,2]},"ok":true,"nil":null}}`)
	base := grant("g", events.Approve, "write_file", events.ScopeSession, "s-1")
	with := func(pattern string) policy.Grant {
		g := base
		g.ArgsPattern = json.RawMessage(pattern)
		return g
	}
	other := func(f func(*policy.Grant)) policy.Grant { g := base; f(&g); return g }
	tests := []struct {
		name string
		g    policy.Grant
		want bool
	}{
		{"scope session", base, true},
		{"other session", other(func(g *policy.Grant) { g.ScopeValue = "s-2" }), false},
		{"other tool", other(func(g *policy.Grant) { g.Tool = "write" }), false},
		{"agent scope", other(func(g *policy.Grant) { g.Scope, g.ScopeValue = events.ScopeAgent, "a1" }), true},
		{"user scope", other(func(g *policy.Grant) { g.Scope, g.ScopeValue = events.ScopeUser, "u1" }), true},
		{"user scope other", other(func(g *policy.Grant) { g.Scope, g.ScopeValue = events.ScopeUser, "u2" }), false},
		{"call scope", other(func(g *policy.Grant) { g.Scope, g.ScopeValue = events.ScopeCall, in.ArgsDigest }), true},
		{"call scope other args", other(func(g *policy.Grant) { g.Scope, g.ScopeValue = events.ScopeCall, "sha256:00" }), false},
		{"bad scope", other(func(g *policy.Grant) { g.Scope = "forever" }), false},
		{"expired", other(func(g *policy.Grant) { g.ExpiresAt = t0 }), false},
		{"no expiry", other(func(g *policy.Grant) { g.ExpiresAt = time.Time{} }), false},
		{"pattern exact", with(`{"path":"/tmp/x.txt"}`), true},
		{"pattern glob", with(`{"path":"/tmp/*.txt"}`), true},
		{"pattern glob no match", with(`{"path":"/srv/*"}`), false},
		{"pattern glob no slash crossing", with(`{"path":"/*"}`), false},
		{"pattern missing key", with(`{"mode":"w"}`), false},
		{"pattern number", with(`{"n":5}`), true},
		{"pattern number as float", with(`{"n":5.0}`), true},
		{"pattern number other", with(`{"n":6}`), false},
		{"pattern float", with(`{"f":2.5}`), true},
		{"pattern string vs number", with(`{"n":"5"}`), false},
		{"pattern nested subset", with(`{"opts":{"mode":"w"}}`), true},
		{"pattern nested array", with(`{"opts":{"flags":[1,2]}}`), true},
		{"pattern array length", with(`{"opts":{"flags":[1]}}`), false},
		{"pattern bool", with(`{"ok":true}`), true},
		{"pattern bool other", with(`{"ok":false}`), false},
		{"pattern null", with(`{"nil":null}`), true},
		{"pattern empty", with(`{}`), true},
		{"pattern not object", with(`[1]`), false},
		{"pattern bad glob", with(`{"path":"["}`), false},
	}
	for _, tc := range tests {
		if got := tc.g.Matches(in, t0); got != tc.want {
			t.Errorf("%s: Matches = %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestGrantValidate(t *testing.T) {
	ok := grant("g-1", events.Approve, "t", events.ScopeSession, "s")
	if err := ok.Validate(); err != nil {
		t.Fatalf("valid grant: %v", err)
	}
	for name, f := range map[string]func(*policy.Grant){
		"id":         func(g *policy.Grant) { g.ID = "a.b" },
		"verdict":    func(g *policy.Grant) { g.Verdict = "maybe" },
		"tool":       func(g *policy.Grant) { g.Tool = "" },
		"scope":      func(g *policy.Grant) { g.Scope = "x" },
		"value":      func(g *policy.Grant) { g.ScopeValue = "" },
		"created_by": func(g *policy.Grant) { g.CreatedBy = "" },
		"expiry":     func(g *policy.Grant) { g.ExpiresAt = g.CreatedAt },
		"pattern":    func(g *policy.Grant) { g.ArgsPattern = json.RawMessage(`"x"`) },
		"glob":       func(g *policy.Grant) { g.ArgsPattern = json.RawMessage(`{"a":["["]}`) },
	} {
		g := ok
		f(&g)
		if err := g.Validate(); !errors.Is(err, policy.ErrBadGrant) {
			t.Errorf("%s: Validate = %v, want ErrBadGrant", name, err)
		}
	}
}

var kvKey = regexp.MustCompile(`^[-/_=.a-zA-Z0-9]+$`)

func TestGrantKeys(t *testing.T) {
	in := input(t, `{"tool":"fs.write","session":"s-1","agent":"a1","user":"carol@example.com","args":{"x":1}}`)
	keys := policy.GrantKeys(in)
	if len(keys) != 4 {
		t.Fatalf("GrantKeys = %v", keys)
	}
	seen := map[string]bool{}
	for i, scope := range []string{"call", "session", "agent", "user"} {
		k, err := policy.GrantKey(scope, in)
		if err != nil || k != keys[i] {
			t.Errorf("GrantKey(%s) = %q, %v; GrantKeys has %q", scope, k, err, keys[i])
		}
		if !kvKey.MatchString(k) || !strings.HasPrefix(k, scope+".") || strings.Count(k, ".") != 2 {
			t.Errorf("key %q is not a 3-token KV key", k)
		}
		seen[k] = true
	}
	if keys[1] != "session.s-1.="+strings.TrimPrefix(policy.KeyToken("fs.write"), "=") {
		t.Errorf("session key %q", keys[1])
	}
	if _, err := policy.GrantKey(events.ScopeSession, input(t, `{"tool":"t"}`)); !errors.Is(err, policy.ErrBadGrant) {
		t.Errorf("GrantKey without session: %v", err)
	}
	if _, err := policy.GrantKey("x", in); !errors.Is(err, policy.ErrBadGrant) {
		t.Errorf("GrantKey bad scope: %v", err)
	}
	if got := policy.GrantKeys(input(t, `{"tool":"t"}`)); len(got) != 1 || !strings.HasPrefix(got[0], "call.") {
		t.Errorf("GrantKeys of a bare request = %v", got)
	}
	// GrantKeys is GrantKey for every scope the request has a value for.
	for _, data := range []string{`{"tool":"t"}`, `{"tool":"t.x","user":"u@x"}`, `{"tool":"t","agent":"a","session":"s"}`} {
		in := input(t, data)
		var want []string
		for _, scope := range []string{"call", "session", "agent", "user"} {
			if k, err := policy.GrantKey(scope, in); err == nil {
				want = append(want, k)
			}
		}
		if got := policy.GrantKeys(in); !slices.Equal(got, want) {
			t.Errorf("GrantKeys(%s) = %v, want %v", data, got, want)
		}
	}
	if got := policy.GrantKeys(policy.Input{Session: "s", ArgsDigest: "d"}); len(got) != 0 {
		t.Errorf("GrantKeys without a tool = %v", got)
	}
	g, err := policy.Default().ModeApproval().NewGrant("0193a5b2-7c1e-7d3a-9f1e-3c2b1a0f9e8d", events.Deny, events.Remember{Scope: "user"}, in, "bob", t0)
	if err != nil {
		t.Fatal(err)
	}
	if want := keys[3] + ".0193a5b2-7c1e-7d3a-9f1e-3c2b1a0f9e8d"; g.Key() != want {
		t.Errorf("Key = %q, want %q", g.Key(), want)
	}
	for _, s := range []string{"", "a", "a.b", "a b", "=", strings.Repeat("x", 129), "ünï", "*", ">"} {
		k := policy.KeyToken(s)
		if !kvKey.MatchString(k) || strings.Contains(k, ".") {
			t.Errorf("KeyToken(%q) = %q", s, k)
		}
	}
	if policy.KeyToken("a.b") == policy.KeyToken("a_b") {
		t.Error("KeyToken collides")
	}
}

func TestRememberedFlow(t *testing.T) {
	// A session may remember approvals for an hour: the first request needs a
	// person, whose answer says remember; the next is approved at once, until
	// the hour is up.
	p := mustParse(t, readExample(t, "session-remember.yaml"))
	in := input(t, `{"tool":"write_file","session":"s-9","user":"carol","args":{"path":"/tmp/a"}}`)
	first := p.Evaluate(in, t0, policy.GrantSet{})
	if first.Action != policy.RequireApproval {
		t.Fatalf("first: %+v", first)
	}
	g, err := first.Approval.NewGrant("g-9", events.Approve, events.Remember{Scope: "session", TTL: events.Duration(time.Hour)}, in, "alice", t0)
	if err != nil {
		t.Fatal(err)
	}
	store := policy.GrantSet{g}
	next := input(t, `{"tool":"write_file","session":"s-9","user":"carol","args":{"path":"/tmp/b"}}`)
	if res := p.Evaluate(next, t0.Add(59*time.Minute), store); res.Action != policy.Allow || !res.Auto || res.Rule != "remembered:g-9" || res.Grant.ID != "g-9" {
		t.Errorf("within the hour: %+v", res)
	}
	if res := p.Evaluate(next, t0.Add(time.Hour), store); res.Action != policy.RequireApproval {
		t.Errorf("after the hour: %+v", res)
	}
	other := input(t, `{"tool":"write_file","session":"s-10","args":{"path":"/tmp/b"}}`)
	if res := p.Evaluate(other, t0, store); res.Action != policy.RequireApproval {
		t.Errorf("other session: %+v", res)
	}
	del := input(t, `{"tool":"delete_file","session":"s-9"}`)
	delGrant := g
	delGrant.Tool = "delete_file"
	if res := p.Evaluate(del, t0, policy.GrantSet{delGrant}); res.Action != policy.RequireApproval {
		t.Errorf("deletion with a grant: %+v", res)
	}
}
