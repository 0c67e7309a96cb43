package insights_test

import (
	"encoding/json"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/assent-dev/assent/internal/insights"
	"github.com/assent-dev/assent/pkg/policy"
)

var suggestShow = flag.Bool("suggest.show", false, "print Suggest's output for the golden cases")

func suggestF(f float64) *float64 { return &f }

func suggestRaw(vs ...string) []json.RawMessage {
	out := make([]json.RawMessage, len(vs))
	for i, v := range vs {
		out[i] = json.RawMessage(v)
	}
	return out
}

var (
	suggestDay = func(d int) time.Time { return time.Date(2026, 10, 28+d, 9, 30, 0, 0, time.UTC) }

	suggestDeploy = insights.Candidate{
		Tool: "deploy", Agent: "coder",
		Args: []insights.ArgPattern{
			{Field: "env", Values: suggestRaw(`"staging"`)},
			{Field: "replicas", Varied: true, Min: suggestF(1), Max: suggestF(5)},
			{Field: "ref", Varied: true, Prefix: "release-"},
			{Field: "note", Varied: true, Optional: true},
			{Field: "dry_run", Values: suggestRaw(`true`, `false`), Optional: true},
		},
		Count: 41, Principals: []string{"alice", "bob"},
		First: suggestDay(0), Last: suggestDay(29),
		Examples: []string{"0193a5b2-0001", "0193a5b2-0002", "0193a5b2-0003", "0193a5b2-0004"},
	}
	suggestTricky = insights.Candidate{
		Tool: "fs/read*[x]?", Agent: "",
		Args: []insights.ArgPattern{
			{Field: "path", Values: suggestRaw(`"a \"quoted\" \\ back'slash"`, `"café ☕ 😀"`, `"line\nbreak\ttab\u2028\u0000"`)},
			{Field: "my-field", Values: suggestRaw(`1.5`, `-2`, `1e3`, `12345678901234567890`, `1e400`)},
			{Field: "in", Values: suggestRaw(`null`)},
			{Field: "", Values: suggestRaw(`{"b": [1, "x", null], "a": {}}`, `[]`)},
			{Field: "name", Varied: true, Prefix: "r\xc3"}, // cut inside "é"/"è"
		},
		Count: 5, Principals: []string{"carol"},
		First: suggestDay(3), Last: suggestDay(3), LastOther: suggestDay(1),
	}
	suggestDrop = insights.Candidate{
		Tool: "drop_table", Agent: "sql-bot",
		Args: []insights.ArgPattern{
			{Field: "table", Values: suggestRaw(`"users"`, `"payments"`)},
			{Field: "cascade", Values: suggestRaw(`true`), Optional: true},
		},
		Count: 7, Principals: []string{"alice", "bob", "carol", "dave", "erin", "frank", "grace"},
		First: suggestDay(2), Last: suggestDay(20), LastOther: suggestDay(-40),
		Examples: []string{"0193a5b2-00aa"},
	}
	suggestBroken = insights.Candidate{
		Tool: "deploy", Agent: "coder",
		Args:  []insights.ArgPattern{{Field: "env", Varied: true, Min: suggestF(1)}},
		Count: 9,
	}
	suggestReport = insights.Report{
		Filter: insights.Filter{Agent: "coder\nrm -rf"},
		Since:  suggestDay(0), Until: suggestDay(30),
		Complete: true, Progress: 1,
		AlwaysApproved: []insights.Candidate{suggestDeploy, suggestTricky, suggestBroken},
		AlwaysDenied:   []insights.Candidate{suggestDrop},
	}
)

const suggestHeaderGolden = `# Rules suggested by the record of decisions from 2026-10-28T09:30:00Z to 2026-11-27T09:30:00Z.
# Only requests with agent "coder\nrm -rf".
# Each rule is a group of requests people decided the same way every time, at
# least 5 times: allow rules for the approved, deny rules for the denied. A rule
# matches only what the record shows, widened only where the values varied
# (docs/policy.md, "Suggested rules").
# An allow rule decides without a person: read each one before you use it.
# A remembered choice with an args pattern (remember.args) is an alternative that expires.
`

const suggestRulesGolden = `rules:
  # approved 41 times by alice, bob between 2026-10-28 and 2026-11-26; last denied: never (examples: 0193a5b2-0001, 0193a5b2-0002, 0193a5b2-0003)
  # "note": widened to any value (values varied, with no common prefix or range)
  # "ref": widened to the strings starting with "release-" and without ".." (values varied)
  # "replicas": widened to the numbers from 1 to 5 (values varied)
  - name: suggested-allow-deploy-coder
    tools: [deploy]
    agents: [coder]
    when: >-
      args.all(k, k in ["dry_run", "env", "note", "ref", "replicas"])
      && (!has(args.dry_run) || args.dry_run in [true, false])
      && has(args.env) && args.env == "staging"
      && has(args.ref) && type(args.ref) == string && args.ref.startsWith("release-") && !args.ref.contains("..")
      && has(args.replicas) && type(args.replicas) in [int, uint, double] && args.replicas >= 1 && args.replicas <= 5
    action: allow

  # approved 5 times by carol on 2026-10-31; last denied: 2026-10-29
  # "my-field": left out values a condition cannot compare: 1e400
  # "name": widened to the strings starting with "r" and without ".." (values varied)
  - name: suggested-allow-fs-read-x
    tools: ['fs/read\*\[x\]\?']
    when: >-
      agent == ""
      && args.all(k, k in ["", "in", "my-field", "name", "path"])
      && ("" in args) && args[""] in [{"a": {}, "b": [1, "x", null]}, []]
      && ("in" in args) && args["in"] == null
      && ("my-field" in args) && args["my-field"] in [1.5, -2, 1000.0, 1.2345678901234567e+19]
      && has(args.name) && type(args.name) == string && args.name.startsWith("r") && !args.name.contains("..")
      && has(args.path) && args.path in ["a \"quoted\" \\ back'slash", "café ☕ 😀", "line\nbreak\ttab\u2028\u0000"]
    action: allow

  # approved 9 times; last denied: never
  # left out (tool deploy, agent coder): field "env": varied numbers with only one end of their range

  # denied 7 times by alice, bob, carol, dave, erin and 2 others between 2026-10-30 and 2026-11-17; last approved: 2026-09-18 (examples: 0193a5b2-00aa)
  - name: suggested-deny-drop_table-sql-bot
    tools: [drop_table]
    agents: [sql-bot]
    when: >-
      (!has(args.cascade) || args.cascade == true)
      && has(args.table) && args.table in ["users", "payments"]
    action: deny
`

func TestSuggestGolden(t *testing.T) {
	tests := []struct {
		name string
		r    insights.Report
		opts insights.SuggestOptions
		want string
	}{
		{"fragment", suggestReport, insights.SuggestOptions{}, suggestHeaderGolden + suggestRulesGolden},
		{"document", suggestReport, insights.SuggestOptions{Document: true}, suggestHeaderGolden + "version: 1\n" + suggestRulesGolden},
		{"only deny, prefix", insights.Report{Complete: false, Progress: 0.372, AlwaysApproved: []insights.Candidate{suggestDeploy}, AlwaysDenied: []insights.Candidate{suggestDrop}},
			insights.SuggestOptions{Prefix: "from-record", Only: policy.Deny}, `# Rules suggested by the record of decisions.
# WARNING: the record was still being read (37% of it): a decision not read yet is no evidence.
# Each rule is a group of requests people decided the same way every time, at
# least 5 times: allow rules for the approved, deny rules for the denied. A rule
# matches only what the record shows, widened only where the values varied
# (docs/policy.md, "Suggested rules").
rules:
  # denied 7 times by alice, bob, carol, dave, erin and 2 others between 2026-10-30 and 2026-11-17; last approved: 2026-09-18 (examples: 0193a5b2-00aa)
  - name: from-record-deny-drop_table-sql-bot
    tools: [drop_table]
    agents: [sql-bot]
    when: >-
      (!has(args.cascade) || args.cascade == true)
      && has(args.table) && args.table in ["users", "payments"]
    action: deny
`},
		{"same group twice, no args", insights.Report{Complete: true, AlwaysApproved: []insights.Candidate{
			{Tool: "list", Agent: "a", Count: 6, Principals: []string{"x"}},
			{Tool: "list", Agent: "a", Count: 5, Args: []insights.ArgPattern{{Field: "dir", Values: suggestRaw(`"/tmp"`)}}},
		}}, insights.SuggestOptions{Only: policy.Allow}, `# Rules suggested by the record of decisions.
# Each rule is a group of requests people decided the same way every time, at
# least 5 times: allow rules for the approved, deny rules for the denied. A rule
# matches only what the record shows, widened only where the values varied
# (docs/policy.md, "Suggested rules").
# An allow rule decides without a person: read each one before you use it.
# A remembered choice with an args pattern (remember.args) is an alternative that expires.
rules:
  # approved 6 times by x; last denied: never
  - name: suggested-allow-list-a
    tools: [list]
    agents: [a]
    when: 'size(args) == 0'
    action: allow

  # approved 5 times; last denied: never
  - name: suggested-allow-list-a-2
    tools: [list]
    agents: [a]
    when: 'args.all(k, k in ["dir"]) && has(args.dir) && args.dir == "/tmp"'
    action: allow
`},
		{"nothing", insights.Report{Complete: true}, insights.SuggestOptions{Document: true}, `# Rules suggested by the record of decisions.
# Each rule is a group of requests people decided the same way every time, at
# least 5 times: allow rules for the approved, deny rules for the denied. A rule
# matches only what the record shows, widened only where the values varied
# (docs/policy.md, "Suggested rules").
# An allow rule decides without a person: read each one before you use it.
# A remembered choice with an args pattern (remember.args) is an alternative that expires.
version: 1
rules: []
`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, err := insights.Suggest(tt.r, tt.opts)
			if err != nil {
				t.Fatal(err)
			}
			if *suggestShow {
				fmt.Printf("---- %s\n%s", tt.name, out)
			}
			if string(out) != tt.want {
				t.Errorf("Suggest:\n%s\nwant:\n%s", out, tt.want)
			}
			doc := out
			if !tt.opts.Document {
				doc = append([]byte("version: 1\n"), out...)
			}
			if _, err := policy.Parse(doc, "suggested.yaml"); err != nil {
				t.Errorf("the output does not load: %v", err)
			}
		})
	}
}

// TestSuggestMatches evaluates the golden rules on requests in and out of
// their evidence.
func TestSuggestMatches(t *testing.T) {
	out, err := insights.Suggest(suggestReport, insights.SuggestOptions{Document: true})
	if err != nil {
		t.Fatal(err)
	}
	p, err := policy.Parse(out, "suggested.yaml")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		tool, agent, args string
		want              string // the rule that decides; "" for none
	}{
		{"deploy", "coder", `{"env": "staging", "replicas": 3, "ref": "release-1.2"}`, "suggested-allow-deploy-coder"},
		{"deploy", "coder", `{"env": "staging", "replicas": 1.5, "ref": "release-", "note": {"x": 1}, "dry_run": false}`, "suggested-allow-deploy-coder"},
		{"deploy", "coder", `{"env": "prod", "replicas": 3, "ref": "release-1.2"}`, ""},
		{"deploy", "coder", `{"env": "staging", "replicas": 6, "ref": "release-1.2"}`, ""},
		{"deploy", "coder", `{"env": "staging", "replicas": "3", "ref": "release-1.2"}`, ""},
		{"deploy", "coder", `{"env": "staging", "replicas": 3, "ref": "main"}`, ""},
		{"deploy", "coder", `{"env": "staging", "replicas": 3, "ref": 7}`, ""},
		{"deploy", "coder", `{"env": "staging", "replicas": 3}`, ""},
		{"deploy", "coder", `{"env": "staging", "replicas": 3, "ref": "release-1", "dry_run": "no"}`, ""},
		{"deploy", "coder", `{"env": "staging", "replicas": 3, "ref": "release-1", "force": true}`, ""},
		{"deploy", "coder2", `{"env": "staging", "replicas": 3, "ref": "release-1"}`, ""},
		{"deploy2", "coder", `{"env": "staging", "replicas": 3, "ref": "release-1"}`, ""},

		{"fs/read*[x]?", "", `{"path": "café ☕ 😀", "my-field": 1000, "in": null, "": [], "name": "ré"}`, "suggested-allow-fs-read-x"},
		{"fs/read*[x]?", "", `{"path": "line\nbreak\ttab\u2028\u0000", "my-field": -2.0, "in": null, "": {"b": [1, "x", null], "a": {}}, "name": "rè"}`, "suggested-allow-fs-read-x"},
		{"fs/read*[x]?", "", `{"path": "a \"quoted\" \\ back'slash", "my-field": 1.5, "in": null, "": [], "name": "r"}`, "suggested-allow-fs-read-x"},
		{"fs/read*[x]?", "", `{"path": "a \"quoted\" \\ back'slash", "my-field": 1.5, "in": null, "": [1], "name": "r"}`, ""},
		{"fs/read*[x]?", "", `{"path": "café", "my-field": 1.5, "in": null, "": [], "name": "r"}`, ""},
		{"fs/read*[x]?", "", `{"path": "café ☕ 😀", "my-field": 1e400, "in": null, "": [], "name": "r"}`, ""},
		{"fs/read*[x]?", "", `{"path": "café ☕ 😀", "my-field": 1.5, "in": false, "": [], "name": "r"}`, ""},
		{"fs/read*[x]?", "", `{"path": "café ☕ 😀", "my-field": 1.5, "in": null, "": [], "name": "s"}`, ""},
		{"fs/read*[x]?", "a", `{"path": "café ☕ 😀", "my-field": 1.5, "in": null, "": [], "name": "r"}`, ""},
		{"fs/readZ[x]?", "", `{"path": "café ☕ 😀", "my-field": 1.5, "in": null, "": [], "name": "r"}`, ""},
		{"fs/read*x?", "", `{"path": "café ☕ 😀", "my-field": 1.5, "in": null, "": [], "name": "r"}`, ""},

		{"drop_table", "sql-bot", `{"table": "users"}`, "suggested-deny-drop_table-sql-bot"},
		{"drop_table", "sql-bot", `{"table": "payments", "cascade": true, "other": 1}`, "suggested-deny-drop_table-sql-bot"},
		{"drop_table", "sql-bot", `{"table": "payments", "cascade": false}`, ""},
		{"drop_table", "sql-bot", `{"table": "logs"}`, ""},
		{"drop_table", "sql-bot", `{}`, ""},
	}
	for _, tt := range tests {
		args, err := policy.DecodeArgs([]byte(tt.args))
		if err != nil {
			t.Fatal(err)
		}
		res := p.Evaluate(policy.Input{Tool: tt.tool, Agent: tt.agent, Args: args}, time.Now(), nil)
		got := res.Rule
		if strings.HasPrefix(got, "mode:") {
			got = ""
		}
		if got != tt.want || len(res.Errors) > 0 {
			t.Errorf("%s by %q %s: rule %q, errors %v; want rule %q", tt.tool, tt.agent, tt.args, got, res.Errors, tt.want)
		}
	}
}

func TestSuggestOptions(t *testing.T) {
	for _, o := range []insights.SuggestOptions{
		{Prefix: "no spaces"}, {Prefix: strings.Repeat("x", 65)}, {Only: "require_approval"},
	} {
		if _, err := insights.Suggest(insights.Report{}, o); err == nil {
			t.Errorf("Suggest with %+v: no error", o)
		}
	}
	err := insights.SuggestOptions{Prefix: "a b", Only: "x"}.Validate()
	if err == nil || !strings.Contains(err.Error(), "prefix") || !strings.Contains(err.Error(), "only") {
		t.Errorf("Validate: %v, want both problems", err)
	}
}

// TestSuggestSkips checks candidates that cannot be written are left out
// with a reason, and the rest still loads.
func TestSuggestSkips(t *testing.T) {
	deep := strings.Repeat("[", 300) + strings.Repeat("]", 300)
	for _, tt := range []struct {
		c    insights.Candidate
		want string
	}{
		{insights.Candidate{Tool: ""}, "no tool name"},
		{insights.Candidate{Tool: "t\xff"}, "not UTF-8"},
		{insights.Candidate{Tool: "t", Args: []insights.ArgPattern{{Field: "a"}}}, "neither values nor how they varied"},
		{insights.Candidate{Tool: "t", Args: []insights.ArgPattern{{Field: "a", Values: suggestRaw(`1`)}, {Field: "a", Values: suggestRaw(`2`)}}}, "appears twice"},
		{insights.Candidate{Tool: "t", Args: []insights.ArgPattern{{Field: "a", Varied: true, Values: suggestRaw(`1`)}}}, "varied, yet with values"},
		{insights.Candidate{Tool: "t", Args: []insights.ArgPattern{{Field: "a", Varied: true, Prefix: "x", Min: suggestF(1), Max: suggestF(2)}}}, "both as strings and as numbers"},
		{insights.Candidate{Tool: "t", Args: []insights.ArgPattern{{Field: "a", Varied: true, Min: suggestF(3), Max: suggestF(2)}}}, "cannot be written"},
		{insights.Candidate{Tool: "t", Args: []insights.ArgPattern{{Field: "a", Values: suggestRaw(`1e999`)}}}, "no value a condition can compare"},
		{insights.Candidate{Tool: "t", Args: []insights.ArgPattern{{Field: "a", Values: suggestRaw(`nope`)}}}, "no value a condition can compare"},
		{insights.Candidate{Tool: "t", Args: []insights.ArgPattern{{Field: "a", Values: suggestRaw(deep)}}}, "the condition does not compile"},
	} {
		for _, deny := range []bool{false, true} {
			r := insights.Report{Complete: true, AlwaysApproved: []insights.Candidate{tt.c, suggestDeploy}}
			if deny {
				r = insights.Report{Complete: true, AlwaysDenied: []insights.Candidate{tt.c, suggestDrop}}
			}
			out, err := insights.Suggest(r, insights.SuggestOptions{Document: true})
			if err != nil {
				t.Fatalf("%+v: %v", tt.c, err)
			}
			p, err := policy.Parse(out, "suggested.yaml")
			if err != nil {
				t.Fatalf("%+v: the output does not load: %v", tt.c, err)
			}
			if len(p.Rules) != 1 || !strings.Contains(string(out), "# left out (") || !strings.Contains(string(out), tt.want) {
				t.Errorf("%+v: want one rule and the other left out with %q, got\n%s", tt.c, tt.want, out)
			}
		}
	}
}

// The property test: for random groups of requests, the candidate the
// aggregator would describe, and Suggest's rule for it, the rule matches
// every request of the group and none outside the evidence.

// suggestGroup is a group of requests decided the same way.
type suggestGroup struct {
	tool, agent string
	args        []string // each request's args, a JSON object
}

// suggestReference describes g as the aggregator does (ArgPattern's
// definition), from the requests alone.
func suggestReference(t *testing.T, g suggestGroup) insights.Candidate {
	t.Helper()
	type field struct {
		values  []string // distinct, as JSON
		strs    []string // every value, when all are strings
		nums    []float64
		notStr  bool
		notNum  bool
		present int
	}
	fields := map[string]*field{}
	for _, a := range g.args {
		dec := json.NewDecoder(strings.NewReader(a))
		dec.UseNumber()
		var m map[string]any
		if err := dec.Decode(&m); err != nil {
			t.Fatalf("%s: %v", a, err)
		}
		for k, v := range m {
			f := fields[k]
			if f == nil {
				f = &field{}
				fields[k] = f
			}
			f.present++
			b, err := json.Marshal(v)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Contains(f.values, string(b)) {
				f.values = append(f.values, string(b))
			}
			switch x := v.(type) {
			case string:
				f.strs = append(f.strs, x)
				f.notNum = true
			case json.Number:
				n, err := strconv.ParseFloat(string(x), 64)
				if err != nil {
					t.Fatal(err)
				}
				f.nums = append(f.nums, n)
				f.notStr = true
			default:
				f.notStr, f.notNum = true, true
			}
		}
	}
	c := insights.Candidate{Tool: g.tool, Agent: g.agent, Count: len(g.args)}
	for _, k := range slices.Sorted(func(yield func(string) bool) {
		for k := range fields {
			if !yield(k) {
				return
			}
		}
	}) {
		f := fields[k]
		p := insights.ArgPattern{Field: k, Optional: f.present < len(g.args)}
		switch {
		case len(f.values) <= insights.MaxValues:
			for _, v := range f.values {
				p.Values = append(p.Values, json.RawMessage(v))
			}
		case !f.notStr:
			p.Varied = true
			p.Prefix = f.strs[0]
			for _, s := range f.strs[1:] {
				n := 0
				for n < len(p.Prefix) && n < len(s) && p.Prefix[n] == s[n] {
					n++
				}
				p.Prefix = p.Prefix[:n] // bytewise: it may end inside a character
			}
			for _, s := range f.strs {
				p.DotDot = p.DotDot || strings.Contains(s, "..")
			}
		case !f.notNum:
			p.Varied = true
			lo, hi := slices.Min(f.nums), slices.Max(f.nums)
			p.Min, p.Max = &lo, &hi
		default:
			p.Varied = true
		}
		c.Args = append(c.Args, p)
	}
	return c
}

// suggestGen makes random groups and requests.
type suggestGen struct{ r *rand.Rand }

var suggestRunes = []rune("abcXYZ019 _-./:#'\"\\\n\t\x00\x7féèê☕😀\u2028\ufeff{}[],&*?|>%@`")

func (g suggestGen) str(n int) string {
	var b strings.Builder
	for range g.r.IntN(n + 1) {
		b.WriteRune(suggestRunes[g.r.IntN(len(suggestRunes))])
	}
	return b.String()
}

func (g suggestGen) pick(s []string) string { return s[g.r.IntN(len(s))] }

// value is a random JSON value.
func (g suggestGen) value(depth int) any {
	switch g.r.IntN(8) {
	case 0, 1:
		return g.str(6)
	case 2:
		return g.r.IntN(21) - 10
	case 3:
		return float64(g.r.IntN(200)-100) / 8
	case 4:
		return g.r.IntN(2) == 0
	case 5:
		return nil
	case 6:
		if depth > 0 {
			var l []any
			for range g.r.IntN(3) {
				l = append(l, g.value(depth-1))
			}
			if l == nil {
				l = []any{}
			}
			return l
		}
	case 7:
		if depth > 0 {
			m := map[string]any{}
			for range g.r.IntN(3) {
				m[g.str(3)] = g.value(depth - 1)
			}
			return m
		}
	}
	return g.str(3)
}

var (
	suggestTools  = []string{"deploy", "fs/read", "rm*", "a?b", "[x]", `back\slash`, "café", "t-1", "null", "x y"}
	suggestAgents = []string{"", "coder", "bot*", "a/b", "ägent", "true", "[a-z]"}
	suggestFields = []string{"path", "amount", "in", "null", "my-field", "", "a.b", `q"uote`, "ünï", "k", "_x1", "while"}
)

// group makes a random group of requests.
func (g suggestGen) group() suggestGroup {
	type gen struct {
		name     string
		optional bool
		value    func() any
	}
	var gens []gen
	for _, name := range suggestFields {
		if g.r.IntN(3) != 0 {
			continue
		}
		f := gen{name: name, optional: g.r.IntN(3) == 0}
		switch g.r.IntN(5) {
		case 0: // one value
			v := g.value(2)
			f.value = func() any { return v }
		case 1: // a few values
			pool := make([]any, 1+g.r.IntN(insights.MaxValues+2))
			for i := range pool {
				pool[i] = g.value(1)
			}
			f.value = func() any { return pool[g.r.IntN(len(pool))] }
		case 2: // strings with a common prefix, maybe cut inside a character
			prefix, accents := g.str(4), []string{""}
			if g.r.IntN(2) == 0 {
				accents = []string{"é", "è", "ê"} // all three start with the byte 0xc3
			}
			f.value = func() any { return prefix + g.pick(accents) + g.str(6) }
		case 3: // numbers
			lo := g.r.IntN(100) - 50
			width := 1 + g.r.IntN(100)
			f.value = func() any {
				if g.r.IntN(2) == 0 {
					return lo + g.r.IntN(width)
				}
				return float64(lo) + g.r.Float64()*float64(width)
			}
		default: // anything
			f.value = func() any { return g.value(2) }
		}
		gens = append(gens, f)
	}
	grp := suggestGroup{tool: g.pick(suggestTools), agent: g.pick(suggestAgents)}
	for range insights.MinEvidence + g.r.IntN(30) {
		m := map[string]any{}
		for _, f := range gens {
			if f.optional && g.r.IntN(3) == 0 {
				continue
			}
			m[f.name] = f.value()
		}
		b, err := json.Marshal(m)
		if err != nil {
			panic(err)
		}
		grp.args = append(grp.args, string(b))
	}
	return grp
}

// suggestRequest is a request to evaluate, and whether the rule must match.
type suggestRequest struct {
	kind, why   string
	tool, agent string
	args        map[string]any
	match       bool
}

// outside returns requests that differ from an observed one in one way the
// candidate c does not allow.
func (g suggestGen) outside(t *testing.T, c insights.Candidate, base map[string]any, allow bool) []suggestRequest {
	t.Helper()
	with := func(k string, v any) map[string]any {
		m := map[string]any{}
		for bk, bv := range base {
			m[bk] = bv
		}
		if v == suggestDelete {
			delete(m, k)
		} else {
			m[k] = v
		}
		return m
	}
	var out []suggestRequest
	add := func(kind, field string, args map[string]any) {
		out = append(out, suggestRequest{kind: kind, why: strconv.Quote(field) + ": " + kind, tool: c.Tool, agent: c.Agent, args: args})
	}
	for _, tool := range []string{c.Tool + "x", "x" + c.Tool, strings.NewReplacer("*", "z", "?", "z", "[", "", "]", "", `\`, "").Replace(c.Tool)} {
		if tool != c.Tool {
			out = append(out, suggestRequest{kind: "another tool", why: "another tool", tool: tool, agent: c.Agent, args: base})
		}
	}
	for _, agent := range []string{c.Agent + "x", "", "a", strings.NewReplacer("*", "z", "[a-z]", "q").Replace(c.Agent)} {
		if agent != c.Agent {
			out = append(out, suggestRequest{kind: "another agent", why: "another agent", tool: c.Tool, agent: agent, args: base})
		}
	}
	if allow {
		extra := "never_seen"
		for slices.ContainsFunc(c.Args, func(p insights.ArgPattern) bool { return p.Field == extra }) {
			extra += "_"
		}
		add("a field never seen", extra, with(extra, g.value(1)))
	}
	for _, p := range c.Args {
		if !p.Optional {
			add("missing", p.Field, with(p.Field, suggestDelete))
		}
		switch {
		case !p.Varied:
			// A value none of the values seen equals (as CEL compares:
			// a new string, or a number above them all).
			seen := map[string]bool{}
			top := 0.0
			for _, v := range p.Values {
				var x any
				if err := json.Unmarshal(v, &x); err != nil {
					t.Fatal(err)
				}
				switch x := x.(type) {
				case string:
					seen[x] = true
				case float64:
					top = max(top, x)
				}
			}
			s := g.str(5)
			for seen[s] {
				s += "x"
			}
			add("a string never seen", p.Field, with(p.Field, s))
			add("a number never seen", p.Field, with(p.Field, top+1.25))
			add("an object never seen", p.Field, with(p.Field, map[string]any{"never": "seen"}))
		case p.Prefix != "":
			// What Suggest may require: the prefix cut back to whole
			// characters.
			pre := strings.ToValidUTF8(p.Prefix, "")
			if pre == "" || !strings.HasPrefix(p.Prefix, pre) {
				continue
			}
			_, size := utf8.DecodeLastRuneInString(pre)
			if pre != p.Prefix {
				add("a prefix cut inside a character", p.Field, nil)
			}
			add("the prefix less a character", p.Field, with(p.Field, pre[:len(pre)-size]))
			// No prefix starts with "~": suggestRunes has none.
			add("without the prefix", p.Field, with(p.Field, "~"+g.str(3)+pre))
			if allow && !p.DotDot {
				add("climbing out of the prefix", p.Field, with(p.Field, pre+"../"+g.str(3)))
			}
			add("not a string", p.Field, with(p.Field, 7))
		case p.Min != nil:
			add("below the range", p.Field, with(p.Field, *p.Min-0.5))
			add("above the range", p.Field, with(p.Field, *p.Max+1))
			add("not a number", p.Field, with(p.Field, fmt.Sprint(*p.Min)))
		}
	}
	return out
}

// suggestDelete asks with to delete the field.
var suggestDelete = &struct{}{}

func TestSuggestProperty(t *testing.T) {
	n := 300
	if testing.Short() {
		n = 60
	}
	g := suggestGen{r: rand.New(rand.NewPCG(27, 2))}
	kinds := map[string]int{}
	for i := range n {
		grp := g.group()
		c := suggestReference(t, grp)
		allow := i%2 == 0
		r := insights.Report{Complete: true, AlwaysDenied: []insights.Candidate{c}}
		if allow {
			r = insights.Report{Complete: true, AlwaysApproved: []insights.Candidate{c}}
		}
		out, err := insights.Suggest(r, insights.SuggestOptions{Document: true})
		if err != nil {
			t.Fatalf("group %d %+v: %v", i, grp, err)
		}
		p, err := policy.Parse(out, "suggested.yaml")
		if err != nil {
			t.Fatalf("group %d: the output does not load: %v\n%s", i, err, out)
		}
		if len(p.Rules) != 1 {
			t.Fatalf("group %d: %d rules, want 1:\n%s", i, len(p.Rules), out)
		}
		name := p.Rules[0].Name
		var reqs []suggestRequest
		for _, a := range grp.args {
			args, err := policy.DecodeArgs([]byte(a))
			if err != nil {
				t.Fatal(err)
			}
			reqs = append(reqs, suggestRequest{kind: "observed", why: "observed", tool: grp.tool, agent: grp.agent, args: args, match: true})
		}
		var base map[string]any
		if err := json.Unmarshal([]byte(grp.args[g.r.IntN(len(grp.args))]), &base); err != nil {
			t.Fatal(err)
		}
		reqs = append(reqs, g.outside(t, c, base, allow)...)
		for _, rq := range reqs {
			kinds[rq.kind]++
			if rq.args == nil {
				continue // only counted
			}
			// The args as a policy sees them: through JSON.
			b, err := json.Marshal(rq.args)
			if err != nil {
				t.Fatal(err)
			}
			args, err := policy.DecodeArgs(b)
			if err != nil {
				t.Fatal(err)
			}
			res := p.Evaluate(policy.Input{Tool: rq.tool, Agent: rq.agent, Args: args}, time.Now(), nil)
			if got := res.Rule == name; got != rq.match || len(res.Errors) > 0 {
				t.Fatalf("group %d, %s: tool %q agent %q args %s: matched %v, errors %v; want matched %v\ncandidate %+v\n%s",
					i, rq.why, rq.tool, rq.agent, b, got, res.Errors, rq.match, c, out)
			}
		}
	}
	t.Logf("%d groups, requests of each kind: %v", n, kinds)
	for _, k := range []string{"observed", "another tool", "another agent", "a field never seen", "missing",
		"a string never seen", "a number never seen", "an object never seen", "a prefix cut inside a character",
		"the prefix less a character", "without the prefix", "not a string", "below the range", "above the range", "not a number"} {
		if kinds[k] == 0 {
			t.Errorf("no request of kind %q: the generator misses a case", k)
		}
	}
}

// suggestDocReport is the report of the sample in docs/policy.md,
// "Suggested rules".
var suggestDocReport = insights.Report{
	Since:    time.Date(2026, 10, 28, 0, 0, 0, 0, time.UTC),
	Until:    time.Date(2026, 11, 27, 0, 0, 0, 0, time.UTC),
	Complete: true, Progress: 1,
	AlwaysApproved: []insights.Candidate{{
		Tool: "deploy", Agent: "coder",
		Args: []insights.ArgPattern{
			{Field: "env", Values: suggestRaw(`"staging"`)},
			{Field: "ref", Varied: true, Prefix: "release-"},
			{Field: "replicas", Values: suggestRaw(`1`, `2`, `3`)},
			{Field: "note", Varied: true, Optional: true},
		},
		Count: 41, Principals: []string{"alice", "bob"},
		First: time.Date(2026, 10, 28, 10, 2, 0, 0, time.UTC), Last: time.Date(2026, 11, 26, 16, 40, 0, 0, time.UTC),
		Examples: []string{"0193a5b2-7c1e-7d3a-9f1e-3c2b1a0f9e8d", "0193a4f0-1b2c-7a00-8e21-0c9d8e7f6a5b"},
	}, {
		Tool: "read_file", Agent: "support-bot",
		Args:  []insights.ArgPattern{{Field: "path", Varied: true, Prefix: "/srv/kb/"}},
		Count: 18, Principals: []string{"carol"},
		First: time.Date(2026, 11, 2, 8, 0, 0, 0, time.UTC), Last: time.Date(2026, 11, 25, 17, 0, 0, 0, time.UTC),
		LastOther: time.Date(2026, 9, 30, 12, 0, 0, 0, time.UTC),
	}},
	AlwaysDenied: []insights.Candidate{{
		Tool: "drop_table", Agent: "sql-bot",
		Args:  []insights.ArgPattern{{Field: "table", Values: suggestRaw(`"users"`, `"payments"`)}},
		Count: 7, Principals: []string{"alice", "dave"},
		First: time.Date(2026, 10, 30, 9, 0, 0, 0, time.UTC), Last: time.Date(2026, 11, 17, 11, 0, 0, 0, time.UTC),
		Examples: []string{"0193a6c1-0a1b-7c2d-8e3f-405162738495"},
	}},
}

// TestSuggestDocs checks the sample output in docs/policy.md is what
// Suggest prints for suggestDocReport (as a whole file).
func TestSuggestDocs(t *testing.T) {
	out, err := insights.Suggest(suggestDocReport, insights.SuggestOptions{Document: true})
	if err != nil {
		t.Fatal(err)
	}
	if *suggestShow {
		fmt.Printf("%s", out)
	}
	data, err := os.ReadFile("../../docs/policy.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(data), "\n## Suggested rules\n")
	if !ok {
		t.Fatal(`docs/policy.md has no section "Suggested rules"`)
	}
	section, _, _ = strings.Cut(section, "\n## ")
	const open = "\n```yaml\n"
	_, block, ok := strings.Cut(section, open)
	if !ok {
		t.Fatal(`docs/policy.md, "Suggested rules": no yaml block`)
	}
	block, _, _ = strings.Cut(block, "```\n")
	if block != string(out) {
		t.Errorf("docs/policy.md, \"Suggested rules\", shows\n%s\nSuggest prints\n%s", block, out)
	}
}
