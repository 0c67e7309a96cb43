// Package insights reads the record of approvals for what it says about
// them: how many requests and with what outcome, how fast people decide,
// who answers faster than they could have read, what people always approve
// or always deny, and where policy and people disagree. An Aggregator folds
// the stream's events into hourly buckets as they arrive, so that a Query
// over any window and filter sums buckets and costs the same whether the
// record holds a thousand requests or a million (docs/insights.md).
package insights

import (
	"encoding/json"
	"time"

	"github.com/assent-dev/assent/pkg/events"
)

// Filter selects the requests a Report covers. Zero fields match anything.
type Filter struct {
	// Since and Until bound when the requests were decided; Until zero is
	// now, Since zero is Until minus DefaultWindow.
	Since time.Time `json:"since,omitzero"`
	Until time.Time `json:"until,omitzero"`
	Agent string    `json:"agent,omitempty"`
	Tool  string    `json:"tool,omitempty"`
	// Rule matches the rule that decided or asked (a decision's rule or
	// approval rule).
	Rule string `json:"rule,omitempty"`
	// Approver matches requests a principal answered.
	Approver string `json:"approver,omitempty"`
}

// DefaultWindow is the window of a Filter that names none.
const DefaultWindow = 30 * 24 * time.Hour

// RubberStampUnder is how soon after a request was shown to (or, failing
// that, announced for) an approver an answer counts as given faster than a
// person could have read it.
const RubberStampUnder = 2 * time.Second

// Report is what the record says about the requests a Filter selects.
type Report struct {
	Filter Filter `json:"filter"`
	// Since and Until are the window the report covers (Filter's, defaults
	// applied).
	Since time.Time `json:"since"`
	Until time.Time `json:"until"`
	// Through is the stream sequence the aggregator had read when it
	// answered; Complete is false while it is still reading the stream
	// from its start (Progress, 0 to 1, says how far).
	Through  uint64  `json:"through"`
	Complete bool    `json:"complete"`
	Progress float64 `json:"progress"`

	// Totals counts the window's decisions by outcome.
	Totals Counts `json:"totals"`
	// Hours counts them per hour, oldest first, every hour of the window
	// present (zero counts included), so that a chart needs no gaps filled.
	Hours []HourCounts `json:"hours"`

	// ByRule and ByApprover are the time people took to decide, from the
	// request's announcement (its pending event) to the decision, with how
	// many expired waiting; sorted by Decided, most first.
	ByRule     []Latency `json:"by_rule"`
	ByApprover []Latency `json:"by_approver"`

	// RubberStamps are, per approver, the answers given sooner than
	// RubberStampUnder after the request was shown to them; sorted by
	// Share, highest first.
	RubberStamps []RubberStamp `json:"rubber_stamps"`
	// Unexamined counts approvals by people given without an edit and
	// without a look at the request's detail.
	Unexamined Unexamined `json:"unexamined"`

	// AlwaysApproved are (tool, agent, argument pattern) groups people
	// approved every time, at least MinEvidence times: candidates for an
	// allow rule or a remembered choice. AlwaysDenied the same for denials:
	// candidates for a deny rule. Most evidence first.
	AlwaysApproved []Candidate `json:"always_approved"`
	AlwaysDenied   []Candidate `json:"always_denied"`

	// Disagreements are where the shadow policy would have decided
	// otherwise than the live one, by pair of outcomes; EditedFields the
	// top-level argument fields people changed when approving with an edit,
	// most often first.
	Disagreements []Disagreement `json:"disagreements"`
	EditedFields  []FieldCount   `json:"edited_fields"`
}

// Counts counts decisions by outcome. Approved, Denied: by people;
// AutoApproved, AutoDenied: by the policy (rules, remembered choices,
// limits, the input schema) without a person.
type Counts struct {
	Approved     int `json:"approved"`
	Denied       int `json:"denied"`
	Expired      int `json:"expired"`
	Cancelled    int `json:"cancelled"`
	AutoApproved int `json:"auto_approved"`
	AutoDenied   int `json:"auto_denied"`
}

// Total is the sum of c's counts.
func (c Counts) Total() int {
	return c.Approved + c.Denied + c.Expired + c.Cancelled + c.AutoApproved + c.AutoDenied
}

// HourCounts are the decisions of the hour that starts at Hour.
type HourCounts struct {
	Hour time.Time `json:"hour"`
	Counts
}

// Latency is how long people took to decide the requests of one rule or
// one approver.
type Latency struct {
	Key     string `json:"key"` // the rule's or the approver's name
	Decided int    `json:"decided"`
	// P50 and P90 of the time from announcement to decision (for an
	// approver: to their answer), within the histogram's resolution.
	P50     events.Duration `json:"p50"`
	P90     events.Duration `json:"p90"`
	Expired int             `json:"expired"` // expired with nobody deciding (rules only)
}

// RubberStamp is one approver's fast answers.
type RubberStamp struct {
	Approver string  `json:"approver"`
	Answers  int     `json:"answers"`
	Fast     int     `json:"fast"`
	Share    float64 `json:"share"` // Fast / Answers
	// Examples are request ids of fast answers, most recent first (at most
	// MaxExamples).
	Examples []string `json:"examples,omitempty"`
}

// Unexamined counts approvals by people.
type Unexamined struct {
	Approved int `json:"approved"`
	// Unedited: approved with the arguments as asked; Unlooked: approved
	// with the arguments as asked and without opening the request's detail
	// (as far as the channel reports it: see docs/insights.md).
	Unedited int     `json:"unedited"`
	Unlooked int     `json:"unlooked"`
	Share    float64 `json:"share"` // Unlooked / Approved
	// Examples are request ids of unlooked approvals, most recent first
	// (at most MaxExamples).
	Examples []string `json:"examples,omitempty"`
}

// MinEvidence is how many decisions a group needs to be a Candidate.
const MinEvidence = 5

// MaxExamples bounds the request ids a Report item carries.
const MaxExamples = 20

// Candidate is a group of requests people decided the same way every time.
type Candidate struct {
	Tool  string `json:"tool"`
	Agent string `json:"agent"`
	// Args is the argument pattern: one entry per top-level field seen,
	// by field name.
	Args []ArgPattern `json:"args"`
	// Count is how many decisions of the group there were, all the same
	// way, by Principals.
	Count      int       `json:"count"`
	Principals []string  `json:"principals"`
	First      time.Time `json:"first"`
	Last       time.Time `json:"last"`
	// LastOther is the last time, in all the record the aggregator holds,
	// that a request of the group was decided the other way by a person;
	// zero if never.
	LastOther time.Time `json:"last_other,omitzero"`
	Examples  []string  `json:"examples,omitempty"`
}

// MaxValues is how many distinct values of a field an ArgPattern lists
// before it calls the field varied.
const MaxValues = 8

// ArgPattern is what the record shows of one top-level argument field in a
// group: the values it took, or, once more than MaxValues, how they varied.
type ArgPattern struct {
	Field string `json:"field"`
	// Values are the distinct values seen, as JSON, at most MaxValues; nil
	// when Varied.
	Values []json.RawMessage `json:"values,omitempty"`
	Varied bool              `json:"varied,omitempty"`
	// For a varied field: Prefix is the longest prefix every value shared
	// when all were strings; Min and Max the range when all were numbers.
	Prefix string   `json:"prefix,omitempty"`
	Min    *float64 `json:"min,omitempty"`
	Max    *float64 `json:"max,omitempty"`
	// Optional: some requests of the group did not have the field.
	Optional bool `json:"optional,omitempty"`
	// DotDot: some string value of the field held "..". Without it, a
	// suggested allow rule keeps a varied path-like value from climbing
	// out of its prefix ("/srv/kb/../../etc").
	DotDot bool `json:"dot_dot,omitempty"`
}

// Disagreement counts where the shadow policy's outcome differed from the
// live one's.
type Disagreement struct {
	Live     string   `json:"live"`   // "require_approval by deploys"
	Shadow   string   `json:"shadow"` // "allow by staging-deploys"
	Count    int      `json:"count"`
	Examples []string `json:"examples,omitempty"`
}

// FieldCount is how often one argument field was changed by an edit.
type FieldCount struct {
	Field string `json:"field"`
	Count int    `json:"count"`
}
