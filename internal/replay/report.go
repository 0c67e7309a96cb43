package replay

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/assent-dev/assent/internal/textsafe"
	"github.com/assent-dev/assent/pkg/events"
	"github.com/assent-dev/assent/pkg/policy"
)

// Report is what a replay found.
type Report struct {
	// Policy is the replayed policy's file; Stream the stream read.
	Policy string `json:"policy"`
	Stream string `json:"stream,omitempty"`
	// Since and Until are the window of requests reported (zero: open).
	Since time.Time `json:"since,omitzero"`
	Until time.Time `json:"until,omitzero"`
	// FirstSeq and LastSeq are the stream sequences read, Messages how many
	// messages.
	FirstSeq uint64 `json:"first_seq"`
	LastSeq  uint64 `json:"last_seq"`
	Messages uint64 `json:"messages"`
	// Replayed counts the requests the policy was evaluated for, those
	// before the window included.
	Replayed int `json:"replayed"`
	// Requests counts the decided requests of the window; Unchanged and
	// Changed split them. Open counts the requests of the window with no
	// decision stored: still waiting, or a message the broker could not
	// read.
	Requests  int `json:"requests"`
	Unchanged int `json:"unchanged"`
	Changed   int `json:"changed"`
	Open      int `json:"open"`
	// Kinds counts the changed requests by kind.
	Kinds map[Kind]int `json:"kinds"`
	// Rules counts them by the replayed policy's rule that made the
	// change ("remembered" for every remembered choice), by name.
	Rules []RuleCount `json:"rules"`
	// Changes lists the changed requests, first stored first, up to
	// Config.List of them; Listed says how many are.
	Changes []Change `json:"changes"`
	Listed  int      `json:"listed"`
	// Elapsed is how long the replay took.
	Elapsed time.Duration `json:"-"`

	byRule map[string]map[Kind]int
	list   int
}

// RuleCount counts the changes one rule makes, by kind.
type RuleCount struct {
	Rule    string       `json:"rule"`
	Changed int          `json:"changed"`
	Kinds   map[Kind]int `json:"kinds"`
}

// Change is one request whose outcome the replayed policy changes.
type Change struct {
	ID    string    `json:"id"`
	Seq   uint64    `json:"seq"`
	Time  time.Time `json:"time"`
	Tool  string    `json:"tool"`
	Agent string    `json:"agent"`
	Kind  Kind      `json:"kind"`
	// Recorded is the stored decision; Replayed what the policy would do.
	Recorded Recorded `json:"recorded"`
	Replayed Replayed `json:"replayed"`
}

// Recorded is what a stored decision says.
type Recorded struct {
	Outcome events.Outcome `json:"outcome"`
	// Auto: no person decided. Waited: the request waited for people.
	Auto         bool     `json:"auto,omitempty"`
	Waited       bool     `json:"waited,omitempty"`
	Rule         string   `json:"rule,omitempty"`
	ApprovalRule string   `json:"approval_rule,omitempty"`
	DecidedBy    []string `json:"decided_by,omitempty"`
	Reason       string   `json:"reason,omitempty"`
}

// Replayed is what the replayed policy does with a request.
type Replayed struct {
	// Action is allow, deny, require_approval, or expired (the deadline
	// had passed before the broker saw the request, as recorded).
	Action       policy.Action `json:"action"`
	Rule         string        `json:"rule,omitempty"`
	ApprovalRule string        `json:"approval_rule,omitempty"`
	Reason       string        `json:"reason,omitempty"`
}

// compare counts q, decided by d, unchanged or changed.
func (r *Replayer) compare(q *request, d *decisionMsg) {
	rec := recordedClass(d, q.waited)
	rp := q.replayed
	switch {
	case q.invalid != "":
		rp = verdict{action: policy.Deny, rule: q.invalid}
	case !q.waited && (d.rule == ruleValidation || d.rule == ruleInputSchema):
		// Checks before any policy: as the broker found then.
		rp = verdict{action: policy.Deny, rule: d.rule, reason: d.reason}
	case rec == expiredUnseen:
		rp.action = actionExpired
	case rp.action == policy.RequireApproval && rp.noApprover && rec == denied && d.reason == policy.ReasonNoApprover:
		// Nobody could answer then: presence is not in the stream, and
		// the recorded denial is the fact of the time.
		rp.action, rp.reason = policy.Deny, policy.ReasonNoApprover
	}
	r.rep.Requests++
	kind, changed := kindOf(rec, d.rule, d.approvalRule, &rp)
	if !changed {
		r.rep.Unchanged++
		return
	}
	r.rep.Changed++
	r.rep.Kinds[kind]++
	rule := rp.rule
	if strings.HasPrefix(rule, "remembered:") {
		rule = "remembered"
	}
	if r.rep.byRule == nil {
		r.rep.byRule = map[string]map[Kind]int{}
	}
	if r.rep.byRule[rule] == nil {
		r.rep.byRule[rule] = map[Kind]int{}
	}
	r.rep.byRule[rule][kind]++
	if r.cfg.List > 0 && len(r.rep.Changes) >= r.cfg.List {
		return
	}
	r.rep.Changes = append(r.rep.Changes, Change{
		ID: q.id, Seq: q.seq, Time: q.at.UTC(), Tool: q.tool, Agent: q.agent, Kind: kind,
		Recorded: Recorded{Outcome: d.outcome, Auto: d.auto, Waited: q.waited, Rule: d.rule, ApprovalRule: d.approvalRule, DecidedBy: d.by, Reason: d.reason},
		Replayed: Replayed{Action: rp.action, Rule: rp.rule, ApprovalRule: rp.approvalRule, Reason: rp.reason},
	})
}

// The rules of the broker's denials before any policy: of a request it
// cannot take (invalid), and of one whose args break its own input_schema
// (broker.RuleInputSchema).
const (
	ruleValidation  = "validation"
	ruleInputSchema = "input-schema"
)

// Report returns what the replay found in the messages applied so far. A
// request held back (see Apply) is checked the broker's way first, and the
// messages after it applied.
func (r *Replayer) Report() *Report {
	r.release(true)
	rep := r.rep
	rep.Kinds = maps.Clone(r.rep.Kinds)
	rep.Open = r.pending
	rep.Changes = slices.Clone(r.rep.Changes)
	rep.Listed = len(rep.Changes)
	rep.Elapsed = time.Since(r.start)
	rep.Rules = nil
	for rule, kinds := range r.rep.byRule {
		rc := RuleCount{Rule: rule, Kinds: maps.Clone(kinds)}
		for _, n := range kinds {
			rc.Changed += n
		}
		rep.Rules = append(rep.Rules, rc)
	}
	slices.SortFunc(rep.Rules, func(a, b RuleCount) int { return strings.Compare(a.Rule, b.Rule) })
	rep.byRule = nil
	if rep.Changes == nil {
		rep.Changes = []Change{}
	}
	if rep.Rules == nil {
		rep.Rules = []RuleCount{}
	}
	return &rep
}

// Broken returns, of guards, the kinds of change the report has, with how
// many requests each, in the order of Kinds.
func (rep *Report) Broken(guards []Kind) []KindCount {
	var out []KindCount
	for _, k := range Kinds() {
		if n := rep.Kinds[k]; n > 0 && slices.Contains(guards, k) {
			out = append(out, KindCount{k, n})
		}
	}
	return out
}

// KindCount is a kind of change and how many requests have it.
type KindCount struct {
	Kind     Kind `json:"kind"`
	Requests int  `json:"requests"`
}

// WriteText writes the report for a person: the counts, the changes by
// rule, and the listed requests. Text from the stream or the policy is
// escaped (textsafe).
func (rep *Report) WriteText(w io.Writer) error {
	var b strings.Builder
	stream := "the stream"
	if rep.Stream != "" {
		stream = "stream " + rep.Stream
	}
	fmt.Fprintf(&b, "policy %s replayed over %s, sequences %d to %d (%d messages)\n",
		textsafe.Line(rep.Policy), stream, rep.FirstSeq, rep.LastSeq, rep.Messages)
	window := "every request stored"
	switch {
	case !rep.Since.IsZero() && !rep.Until.IsZero():
		window = "requests stored from " + stamp(rep.Since) + " to " + stamp(rep.Until)
	case !rep.Since.IsZero():
		window = "requests stored since " + stamp(rep.Since)
	case !rep.Until.IsZero():
		window = "requests stored until " + stamp(rep.Until)
	}
	fmt.Fprintf(&b, "%s: %s decided, %d unchanged, %d changed", window, plural(rep.Requests, "request"), rep.Unchanged, rep.Changed)
	if rep.Open > 0 {
		fmt.Fprintf(&b, "; %d with no decision yet", rep.Open)
	}
	b.WriteString("\n")
	if rep.Changed == 0 {
		b.WriteString("no outcome changes\n")
		_, err := io.WriteString(w, b.String())
		return err
	}
	b.WriteString("\nchanges by kind:\n")
	tw := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	for _, k := range Kinds() {
		if n := rep.Kinds[k]; n > 0 {
			fmt.Fprintf(tw, "  %s\t%d\n", k, n)
		}
	}
	tw.Flush()
	b.WriteString("\nchanges by rule of the replayed policy:\n")
	tw = tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  RULE\tKIND\tREQUESTS")
	for _, rc := range rep.Rules {
		for _, k := range Kinds() {
			if n := rc.Kinds[k]; n > 0 {
				fmt.Fprintf(tw, "  %s\t%s\t%d\n", textsafe.Line(rc.Rule), k, n)
			}
		}
	}
	tw.Flush()
	if rep.Listed < rep.Changed {
		fmt.Fprintf(&b, "\nchanged requests, the first %d of %d (--limit):\n", rep.Listed, rep.Changed)
	} else {
		b.WriteString("\nchanged requests:\n")
	}
	tw = tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  TIME\tID\tTOOL\tAGENT\tRECORDED\tREPLAYED\tKIND")
	for _, c := range rep.Changes {
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\t%s\t%s\n", stamp(c.Time), c.ID, textsafe.Line(cut(c.Tool, 40)), textsafe.Line(c.Agent),
			textsafe.Line(c.Recorded.String()), textsafe.Line(c.Replayed.String()), c.Kind)
	}
	tw.Flush()
	_, err := io.WriteString(w, b.String())
	return err
}

// String describes a recorded outcome in a few words: "approved by alice
// (big-pay)", "allowed by reads", "expired (deploy)".
func (r Recorded) String() string {
	rule := r.Rule
	if r.ApprovalRule != "" {
		rule += ", " + r.ApprovalRule
	}
	switch {
	case r.Outcome == events.Cancelled:
		return "cancelled (" + rule + ")"
	case r.Outcome == events.Expired && !r.Waited:
		return "expired before it was seen (" + rule + ")"
	case r.Outcome == events.Expired:
		return "expired (" + rule + ")"
	case r.Waited && r.Auto && r.Outcome == events.Approved:
		return "approved by its timeout (" + rule + ")"
	case r.Waited && !r.Auto:
		who := strings.Join(r.DecidedBy, ", ")
		if who == "" {
			who = "people"
		}
		return string(r.Outcome) + " by " + who + " (" + rule + ")"
	case r.Outcome == events.Approved:
		return "allowed by " + rule
	case r.Reason == policy.ReasonNoApprover:
		return "denied, no approver (" + rule + ")"
	}
	return "denied by " + rule
}

// String describes a replayed outcome in a few words: "allow by reads",
// "ask big-pay", "deny, no approver (night-ops)".
func (r Replayed) String() string {
	switch {
	case r.Action == actionExpired:
		return "expired before it was seen (" + r.Rule + ")"
	case r.Action == policy.RequireApproval && r.ApprovalRule != "":
		return "ask " + r.ApprovalRule + " (" + r.Rule + ")"
	case r.Action == policy.RequireApproval:
		return "ask " + r.Rule
	case r.Reason == policy.ReasonNoApprover:
		return "deny, no approver (" + r.Rule + ")"
	}
	return string(r.Action) + " by " + r.Rule
}

func stamp(t time.Time) string { return t.UTC().Format(time.RFC3339) }

func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}

func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
