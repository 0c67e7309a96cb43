package insights

import (
	"errors"
	"fmt"
	"math"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/assent-dev/assent/pkg/events"
	"github.com/assent-dev/assent/pkg/policy"
)

// SuggestOptions say which rules Suggest writes and how.
type SuggestOptions struct {
	// Prefix starts every rule's name, which goes on with the action, the
	// tool and the agent: "suggested-allow-deploy-coder". Empty means
	// "suggested". At most 64 characters of A-Z a-z 0-9 _ -.
	Prefix string
	// Only limits the rules to one action: policy.Allow for the groups
	// people always approved, policy.Deny for those they always denied.
	// Empty means both.
	Only policy.Action
	// Document makes the output a whole policy file ("version: 1" and the
	// rules) that loads on its own; otherwise it is a "rules:" list to
	// paste into a policy.
	Document bool
}

// DefaultSuggestPrefix is the name prefix of suggested rules.
const DefaultSuggestPrefix = "suggested"

// Validate reports every problem with o at once.
func (o SuggestOptions) Validate() error {
	var errs []error
	if o.Prefix != "" && (len(o.Prefix) > 64 || !events.ValidToken(o.Prefix)) {
		errs = append(errs, fmt.Errorf("prefix %q: want 1-64 characters of A-Z a-z 0-9 _ -", o.Prefix))
	}
	switch o.Only {
	case "", policy.Allow, policy.Deny:
	default:
		errs = append(errs, fmt.Errorf("only %q: want allow, deny or nothing (both)", o.Only))
	}
	return errors.Join(errs...)
}

// Suggest writes a policy fragment for the candidates of r: an allow rule for
// each group people always approved (r.AlwaysApproved) and a deny rule for
// each group they always denied (r.AlwaysDenied), in that order, each under a
// comment with its evidence. With opts.Document the output is a whole policy
// file; otherwise it is a "rules:" list. Either way it is YAML that
// policy.Parse loads (as a whole file with "version: 1" before it).
//
// A rule is never broader than its evidence, except where the record shows
// the values varied (docs/policy.md, "Suggested rules"): it names the exact
// tool and agent, and its condition requires each argument field the group
// always had, one of the values seen for a field that took at most
// MaxValues of them, the common prefix of a varied string field, the range
// of a varied number field; an allow rule also refuses fields the group
// never had. Conditions are written so that they never fail at run time.
// A candidate that cannot be written exactly (an inconsistent pattern, a
// number no policy can compare, a condition CEL will not compile) is left
// out, with a comment saying why.
//
// An error is returned for invalid options, or if the output would not load
// (a bug).
func Suggest(r Report, opts SuggestOptions) ([]byte, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	if opts.Prefix == "" {
		opts.Prefix = DefaultSuggestPrefix
	}
	s := &suggester{opts: opts, names: map[string]bool{}}
	var items []string
	rules := 0
	add := func(cs []Candidate, action policy.Action) error {
		for _, c := range cs {
			text, ok, err := s.rule(c, action)
			if err != nil {
				return err
			}
			if ok {
				rules++
			}
			items = append(items, text)
		}
		return nil
	}
	if opts.Only != policy.Deny {
		if err := add(r.AlwaysApproved, policy.Allow); err != nil {
			return nil, err
		}
	}
	if opts.Only != policy.Allow {
		if err := add(r.AlwaysDenied, policy.Deny); err != nil {
			return nil, err
		}
	}

	var b strings.Builder
	suggestHeader(&b, r, opts)
	if opts.Document {
		b.WriteString("version: 1\n")
	}
	if rules == 0 {
		b.WriteString("rules: []\n")
	} else {
		b.WriteString("rules:\n")
	}
	for i, it := range items {
		if i > 0 {
			b.WriteString("\n")
		}
		b.WriteString(it)
	}
	out := []byte(b.String())
	doc := out
	if !opts.Document {
		doc = append([]byte("version: 1\n"), out...)
	}
	if _, err := policy.Parse(doc, "suggested.yaml"); err != nil {
		return nil, fmt.Errorf("insights: the suggested rules do not load (a bug): %w", err)
	}
	return out, nil
}

// suggestHeader writes the comment that opens the output: where the rules
// come from and how to read them.
func suggestHeader(b *strings.Builder, r Report, opts SuggestOptions) {
	b.WriteString("# Rules suggested by the record of decisions")
	if !r.Since.IsZero() && !r.Until.IsZero() {
		fmt.Fprintf(b, " from %s to %s", r.Since.UTC().Format(time.RFC3339), r.Until.UTC().Format(time.RFC3339))
	}
	b.WriteString(".\n")
	var filter []string
	for _, f := range []struct{ name, value string }{
		{"agent", r.Filter.Agent}, {"tool", r.Filter.Tool}, {"rule", r.Filter.Rule}, {"approver", r.Filter.Approver},
	} {
		if f.value != "" {
			filter = append(filter, f.name+" "+suggestSafe(f.value))
		}
	}
	if len(filter) > 0 {
		fmt.Fprintf(b, "# Only requests with %s.\n", strings.Join(filter, ", "))
	}
	if !r.Complete {
		fmt.Fprintf(b, "# WARNING: the record was still being read (%.0f%% of it): a decision not read yet is no evidence.\n", r.Progress*100)
	}
	fmt.Fprintf(b, "# Each rule is a group of requests people decided the same way every time, at\n")
	fmt.Fprintf(b, "# least %d times: allow rules for the approved, deny rules for the denied. A rule\n", MinEvidence)
	b.WriteString("# matches only what the record shows, widened only where the values varied\n")
	b.WriteString("# (docs/policy.md, \"Suggested rules\").\n")
	if opts.Only != policy.Deny {
		b.WriteString("# An allow rule decides without a person: read each one before you use it.\n")
		b.WriteString("# A remembered choice with an args pattern (remember.args) is an alternative that expires.\n")
	}
}

// suggester writes the rules of one output.
type suggester struct {
	opts  SuggestOptions
	names map[string]bool
}

// rule writes the rule for c, with its comments, and reports ok; or, if c
// cannot be written exactly, a comment saying why. err is a bug.
func (s *suggester) rule(c Candidate, action policy.Action) (text string, ok bool, err error) {
	evidence := suggestEvidence(c, action)
	cond, notes, why := suggestCondition(c, action)
	if why != "" {
		return suggestSkipped(c, evidence, why), false, nil
	}
	name := s.name(c, action)
	tool := suggestGlob(c.Tool)
	var agent string
	if c.Agent != "" {
		agent = suggestGlob(c.Agent)
	}
	var b strings.Builder
	b.WriteString(evidence)
	for _, n := range notes {
		b.WriteString("  # " + n + "\n")
	}
	fmt.Fprintf(&b, "  - name: %s\n", name)
	fmt.Fprintf(&b, "    tools: [%s]\n", suggestYAMLString(tool))
	if agent != "" {
		fmt.Fprintf(&b, "    agents: [%s]\n", suggestYAMLString(agent))
	}
	when := strings.Join(cond, " && ")
	switch {
	case len(cond) == 0:
	case len(when) <= 80:
		fmt.Fprintf(&b, "    when: '%s'\n", strings.ReplaceAll(when, "'", "''"))
	default:
		b.WriteString("    when: >-\n")
		for i, cl := range cond {
			if i > 0 {
				cl = "&& " + cl
			}
			b.WriteString("      " + cl + "\n")
		}
	}
	fmt.Fprintf(&b, "    action: %s\n", action)
	text = b.String()

	// Check the rule loads, and reads back as it was meant.
	p, perr := policy.Parse([]byte("version: 1\nrules:\n"+text), "suggested.yaml")
	if perr != nil {
		// A value CEL cannot take (nested too deep, too long) is a
		// reason to leave the candidate out; anything else is a bug,
		// which the parse of the whole output reports.
		var pe *policy.Error
		if errors.Is(perr, policy.ErrBadCEL) && errors.As(perr, &pe) {
			return suggestSkipped(c, evidence, "the condition does not compile: "+suggestTruncate(strings.TrimPrefix(pe.Msg, "when: "), 200)), false, nil
		}
		return "", false, fmt.Errorf("insights: suggested rule %s does not load (a bug): %w", name, perr)
	}
	got := p.Rules[0]
	if got.Name != name || got.When != when || !slices.Equal(got.Tools, []string{tool}) ||
		(agent == "") != (len(got.Agents) == 0) || (agent != "" && !slices.Equal(got.Agents, []string{agent})) {
		return "", false, fmt.Errorf("insights: suggested rule %s reads back as name %q, tools %q, agents %q, when %q (a bug)",
			name, got.Name, got.Tools, got.Agents, got.When)
	}
	s.names[name] = true
	return text, true, nil
}

// name returns a name for c's rule that no other rule of the output has.
func (s *suggester) name(c Candidate, action policy.Action) string {
	base := s.opts.Prefix + "-" + string(action)
	for _, part := range []string{suggestNamePart(c.Tool), suggestNamePart(c.Agent)} {
		if part != "" {
			base += "-" + part
		}
	}
	if len(base) > 120 {
		base = strings.TrimRight(base[:120], "-")
	}
	name := base
	for i := 2; s.names[name]; i++ {
		name = base + "-" + strconv.Itoa(i)
	}
	return name
}

// suggestNamePart is s with every run of characters a name cannot hold
// replaced by "-".
func suggestNamePart(s string) string {
	var b strings.Builder
	dash := false
	for _, r := range s {
		if r < utf8.RuneSelf && (r == '_' || r == '-' || '0' <= r && r <= '9' || 'a' <= r && r <= 'z' || 'A' <= r && r <= 'Z') {
			b.WriteRune(r)
			dash = r == '-'
			continue
		}
		if !dash {
			b.WriteByte('-')
			dash = true
		}
	}
	return strings.Trim(b.String(), "-")
}

// suggestEvidence is the comment over c's rule:
// "# approved 41 times by alice, bob between 2026-10-28 and 2026-11-26;
// last denied: never (examples: id1, id2)".
func suggestEvidence(c Candidate, action policy.Action) string {
	did, other := "approved", "denied"
	if action == policy.Deny {
		did, other = "denied", "approved"
	}
	var b strings.Builder
	b.WriteString("  # " + did + " ")
	if c.Count == 1 {
		b.WriteString("once")
	} else {
		fmt.Fprintf(&b, "%d times", c.Count)
	}
	if len(c.Principals) > 0 {
		const most = 5
		ps := make([]string, 0, most)
		for _, p := range c.Principals[:min(len(c.Principals), most)] {
			ps = append(ps, suggestSafe(p))
		}
		b.WriteString(" by " + strings.Join(ps, ", "))
		if n := len(c.Principals) - most; n > 0 {
			fmt.Fprintf(&b, " and %d other", n)
			if n > 1 {
				b.WriteString("s")
			}
		}
	}
	const day = "2006-01-02"
	switch first, last := c.First.UTC().Format(day), c.Last.UTC().Format(day); {
	case c.First.IsZero() || c.Last.IsZero():
	case first == last:
		b.WriteString(" on " + first)
	default:
		b.WriteString(" between " + first + " and " + last)
	}
	b.WriteString("; last " + other + ": ")
	if c.LastOther.IsZero() {
		b.WriteString("never")
	} else {
		b.WriteString(c.LastOther.UTC().Format(day))
	}
	if len(c.Examples) > 0 {
		const most = 3
		ex := make([]string, 0, most)
		for _, e := range c.Examples[:min(len(c.Examples), most)] {
			ex = append(ex, suggestSafe(e))
		}
		b.WriteString(" (examples: " + strings.Join(ex, ", ") + ")")
	}
	b.WriteString("\n")
	return b.String()
}

// suggestSkipped is the comment that stands for a candidate left out.
func suggestSkipped(c Candidate, evidence, why string) string {
	who := "tool " + suggestSafe(c.Tool)
	if c.Agent != "" {
		who += ", agent " + suggestSafe(c.Agent)
	}
	return evidence + "  # left out (" + who + "): " + suggestSafe(why) + "\n"
}

// suggestCondition returns the clauses of c's condition, to be joined with
// &&, notes on what it widens or drops, and why c cannot be written if it
// cannot.
func suggestCondition(c Candidate, action policy.Action) (clauses, notes []string, why string) {
	switch {
	case c.Tool == "":
		return nil, nil, "no tool name"
	case !utf8.ValidString(c.Tool) || !utf8.ValidString(c.Agent):
		return nil, nil, "the tool or agent name is not UTF-8"
	}
	if ok, _ := path.Match(suggestGlob(c.Tool), c.Tool); !ok {
		return nil, nil, "the tool name cannot be written as a glob"
	}
	if c.Agent == "" {
		// An empty glob is no glob: requests without an agent are
		// selected by the condition.
		clauses = append(clauses, `agent == ""`)
	} else if ok, _ := path.Match(suggestGlob(c.Agent), c.Agent); !ok {
		return nil, nil, "the agent name cannot be written as a glob"
	}
	args := slices.Clone(c.Args)
	slices.SortFunc(args, func(a, b ArgPattern) int { return strings.Compare(a.Field, b.Field) })
	fields := make([]string, 0, len(args))
	for i, a := range args {
		if i > 0 && a.Field == args[i-1].Field {
			return nil, nil, fmt.Sprintf("field %s appears twice in the pattern", strconv.Quote(a.Field))
		}
		if !utf8.ValidString(a.Field) {
			return nil, nil, fmt.Sprintf("field %s is not UTF-8", strconv.Quote(a.Field))
		}
		fields = append(fields, suggestCELString(a.Field))
	}
	if action == policy.Allow {
		// The fields the group had, and no other.
		if len(fields) == 0 {
			clauses = append(clauses, "size(args) == 0")
		} else {
			clauses = append(clauses, "args.all(k, k in ["+strings.Join(fields, ", ")+"])")
		}
	}
	for _, a := range args {
		cl, note, why := suggestArg(a, action == policy.Allow)
		if why != "" {
			return nil, nil, fmt.Sprintf("field %s: %s", strconv.Quote(a.Field), why)
		}
		if cl != "" {
			clauses = append(clauses, cl)
		}
		if note != "" {
			notes = append(notes, note)
		}
	}
	return clauses, notes, ""
}

// suggestArg returns the clause for one field (empty when a field that
// need not be there may hold anything), a note on what it widens or drops,
// and why the field cannot be written if it cannot. For an allow rule, a
// varied string that never held ".." must not hold it: a prefix is not a
// directory.
func suggestArg(a ArgPattern, allow bool) (clause, note, why string) {
	has, get := suggestField(a.Field)
	field := suggestSafe(strconv.Quote(a.Field))
	var test string
	switch {
	case a.Varied && len(a.Values) > 0:
		return "", "", "varied, yet with values"
	case a.Varied && a.Prefix != "" && (a.Min != nil || a.Max != nil):
		return "", "", "varied, both as strings and as numbers"
	case a.Varied && (a.Min == nil) != (a.Max == nil):
		return "", "", "varied numbers with only one end of their range"
	case a.Varied && a.Min != nil:
		lo, hi := *a.Min, *a.Max
		los, err1 := suggestNumber(lo)
		his, err2 := suggestNumber(hi)
		if err1 != nil || err2 != nil || lo > hi {
			return "", "", fmt.Sprintf("the range %v to %v cannot be written", lo, hi)
		}
		test = "type(" + get + ") in [int, uint, double] && " + get + " >= " + los + " && " + get + " <= " + his
		note = fmt.Sprintf("%s: widened to the numbers from %s to %s (values varied)", field, los, his)
	case a.Varied:
		// CEL compares strings by code point: a prefix that ends inside
		// a character is cut back to whole characters.
		p := a.Prefix
		for i := 0; i < utf8.UTFMax-1 && !utf8.ValidString(p); i++ {
			p = p[:len(p)-1]
		}
		if !utf8.ValidString(p) {
			return "", "", "a prefix that is not UTF-8"
		}
		if p == "" {
			note = fmt.Sprintf("%s: widened to any value (values varied, with no common prefix or range)", field)
			break
		}
		q := suggestCELString(p)
		test = "type(" + get + ") == string && " + get + ".startsWith(" + q + ")"
		note = fmt.Sprintf("%s: widened to the strings starting with %s (values varied)", field, q)
		if allow && !a.DotDot {
			test += " && !" + get + `.contains("..")`
			note = fmt.Sprintf(`%s: widened to the strings starting with %s and without ".." (values varied)`, field, q)
		}
	case len(a.Values) == 0:
		return "", "", "neither values nor how they varied"
	default:
		lits := make([]string, 0, len(a.Values))
		var dropped []string
		for _, raw := range a.Values {
			lit, err := suggestValue(raw)
			if err != nil {
				dropped = append(dropped, suggestTruncate(string(raw), 40))
				continue
			}
			if !slices.Contains(lits, lit) {
				lits = append(lits, lit)
			}
		}
		switch {
		case len(lits) == 0:
			return "", "", "no value a condition can compare: " + strings.Join(dropped, ", ")
		case len(lits) == 1:
			test = get + " == " + lits[0]
		default:
			test = get + " in [" + strings.Join(lits, ", ") + "]"
		}
		if len(dropped) > 0 {
			note = fmt.Sprintf("%s: left out values a condition cannot compare: %s", field, suggestSafe(strings.Join(dropped, ", ")))
		}
	}
	switch {
	case !a.Optional && test == "":
		return has, note, ""
	case !a.Optional:
		return has + " && " + test, note, ""
	case test == "":
		return "", note, ""
	case strings.Contains(test, "&&"):
		return "(!" + has + " || (" + test + "))", note, ""
	}
	return "(!" + has + " || " + test + ")", note, ""
}

// suggestField returns how a condition asks whether args has field f, and
// how it reads it: has(args.f) and args.f for an identifier, else
// "f" in args and args["f"].
func suggestField(f string) (has, get string) {
	if suggestIdent(f) {
		return "has(args." + f + ")", "args." + f
	}
	q := suggestCELString(f)
	return "(" + q + " in args)", "args[" + q + "]"
}

// suggestReserved are the words CEL does not take as identifiers.
var suggestReserved = []string{
	"false", "in", "null", "true",
	"as", "break", "const", "continue", "else", "for", "function", "if", "import",
	"let", "loop", "package", "namespace", "return", "var", "void", "while",
}

func suggestIdent(s string) bool {
	if s == "" || slices.Contains(suggestReserved, s) {
		return false
	}
	for i, r := range s {
		if !(r == '_' || 'a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || i > 0 && '0' <= r && r <= '9') {
			return false
		}
	}
	return true
}

// suggestValue renders a JSON value as the CEL literal equal to it, as a
// policy sees it: decoded as policy.DecodeArgs decodes arguments.
func suggestValue(raw []byte) (string, error) {
	m, err := policy.DecodeArgs([]byte(`{"v":` + string(raw) + `}`))
	if err != nil {
		return "", err
	}
	return suggestLiteral(m["v"])
}

// suggestLiteral renders a decoded argument as a CEL literal.
func suggestLiteral(v any) (string, error) {
	switch x := v.(type) {
	case nil:
		return "null", nil
	case bool:
		return strconv.FormatBool(x), nil
	case string:
		return suggestCELString(x), nil
	case int64:
		return strconv.FormatInt(x, 10), nil
	case float64:
		if math.IsInf(x, 0) || math.IsNaN(x) {
			return "", fmt.Errorf("%v is beyond what a policy compares", x)
		}
		return suggestDouble(x), nil
	case []any:
		parts := make([]string, len(x))
		for i, e := range x {
			s, err := suggestLiteral(e)
			if err != nil {
				return "", err
			}
			parts[i] = s
		}
		return "[" + strings.Join(parts, ", ") + "]", nil
	case map[string]any:
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		parts := make([]string, len(keys))
		for i, k := range keys {
			s, err := suggestLiteral(x[k])
			if err != nil {
				return "", err
			}
			parts[i] = suggestCELString(k) + ": " + s
		}
		return "{" + strings.Join(parts, ", ") + "}", nil
	}
	return "", fmt.Errorf("a %T is not a JSON value", v)
}

// suggestNumber renders a range's end: an int literal for a whole number
// every int64 near it represents exactly, else a double literal.
func suggestNumber(f float64) (string, error) {
	if math.IsInf(f, 0) || math.IsNaN(f) {
		return "", fmt.Errorf("%v is not a finite number", f)
	}
	if f == math.Trunc(f) && math.Abs(f) <= 1<<53 {
		return strconv.FormatInt(int64(f), 10), nil
	}
	return suggestDouble(f), nil
}

// suggestDouble renders a finite float64 as a CEL double literal.
func suggestDouble(f float64) string {
	s := strconv.FormatFloat(f, 'g', -1, 64)
	if !strings.ContainsAny(s, ".e") {
		s += ".0"
	}
	return s
}

// suggestCELString renders s as a CEL string literal that holds only
// printable characters (so that it sits in YAML as it is).
func suggestCELString(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for _, r := range s {
		switch {
		case r == '"' || r == '\\':
			b.WriteByte('\\')
			b.WriteRune(r)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r == '\t':
			b.WriteString(`\t`)
		case unicode.IsPrint(r):
			b.WriteRune(r)
		case r <= 0xFFFF:
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			fmt.Fprintf(&b, `\U%08x`, r)
		}
	}
	b.WriteByte('"')
	return b.String()
}

// suggestGlob is the glob (path.Match syntax) that matches s and nothing
// else.
func suggestGlob(s string) string {
	var b strings.Builder
	for _, r := range s {
		if strings.ContainsRune(`*?[]\`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}

// suggestYAMLString renders s as a YAML scalar for a flow sequence: plain
// when it is a simple word, single-quoted when it is printable, else
// double-quoted with escapes.
func suggestYAMLString(s string) string {
	plain := s != "" && !slices.Contains([]string{"null", "true", "false", "yes", "no", "on", "off", "y", "n"}, strings.ToLower(s))
	for i, r := range s {
		if !(r == '_' || 'a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || i > 0 && (r == '-' || '0' <= r && r <= '9')) {
			plain = false
			break
		}
	}
	if plain {
		return s
	}
	if !strings.ContainsFunc(s, func(r rune) bool { return !unicode.IsPrint(r) }) {
		return "'" + strings.ReplaceAll(s, "'", "''") + "'"
	}
	var b strings.Builder
	b.WriteByte('"')
	for _, r := range s {
		switch {
		case r == '"' || r == '\\':
			b.WriteByte('\\')
			b.WriteRune(r)
		case unicode.IsPrint(r):
			b.WriteRune(r)
		case r <= 0xFFFF:
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			fmt.Fprintf(&b, `\U%08x`, r)
		}
	}
	b.WriteByte('"')
	return b.String()
}

// suggestSafe is s for a comment: as it is if it is printable on one line,
// else quoted.
func suggestSafe(s string) string {
	for _, r := range s {
		if r == utf8.RuneError || !unicode.IsPrint(r) {
			return strconv.QuoteToGraphic(s)
		}
	}
	return s
}

// suggestTruncate cuts s to at most n bytes, at a character boundary.
func suggestTruncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "..."
}
