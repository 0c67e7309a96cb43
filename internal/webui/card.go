package webui

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/assent-dev/assent/internal/argview"
	"github.com/assent-dev/assent/internal/broker"
	"github.com/assent-dev/assent/internal/human"
	"github.com/assent-dev/assent/internal/textsafe"
	"github.com/assent-dev/assent/pkg/events"
	"github.com/assent-dev/assent/pkg/policy"
)

// card is one request as the pages show it.
type card struct {
	ID, Short string
	State     string
	Pending   bool
	Tool      string
	Agent     string
	Session   string
	User      string
	Hint      string
	CallID    string
	Labels    [][2]string
	// Args is the arguments laid out for reading: every key in the order
	// the agent wrote, each value's start, and how much is folded away
	// (internal/argview). ArgsJSON is them as indented JSON, to edit. Both
	// have control and invisible characters as escapes; NoArgs says there
	// are none.
	Args     argList
	ArgsJSON string
	NoArgs   bool
	// ArgsSchema is the request's input_schema, to read; nil without one.
	ArgsSchema *argsSchema
	// Hidden says the request held control or invisible characters, now
	// shown as escapes.
	Hidden   bool
	Received time.Time
	Deadline time.Time

	Rule  string
	Limit string
	// WhoMay says in plain words who may approve and how many must:
	// "Anyone may approve", "Needs 2 of: alice, bob". RuleText names the
	// rule, or says no rule matched.
	WhoMay    string
	RuleText  string
	Quorum    int
	Votes     []vote
	Level     int
	OnTimeout string

	// CanAnswer says the viewer may answer; WhyNot says why not.
	CanAnswer bool
	WhyNot    string
	// CanEdit says arguments may be edited (a rule with a quorum of one).
	CanEdit  bool
	Remember *rememberForm
	Schema   *schemaForm

	// History is the record's line about requests like this one, from
	// its pending event (human.History); "" without one. Note marks a line
	// that should catch the eye: "first" (no earlier request of the tool
	// by the agent in the window), "denied" (some were denied).
	History     string
	HistoryNote string
	// Shown is when the page made the card for the viewer (RFC 3339, to
	// the nanosecond): the page sends it as an answer's shown_at.
	Shown string

	Decision *decision
	Forgery  string
	// Detail: the card is on the request's own page.
	Detail bool
}

// Historian is a Broker that says what the record says of requests like a
// given one (the same tool and agent), nil while it cannot tell yet; the
// broker's pending event carried the same line when the request was
// announced (events.Pending.History). Where the Broker is one, every card
// of a pending request shows it; otherwise the request's own page reads it
// from the pending event in the request's timeline.
type Historian interface {
	History(rec broker.Record) *events.History
}

// setHistory puts h's line on c.
func (c *card) setHistory(h *events.History, now time.Time) {
	c.History, c.HistoryNote = textsafe.Line(human.History(h, now)), ""
	switch {
	case h == nil:
	case h.Approved+h.Denied+h.Expired <= 0:
		c.HistoryNote = "first"
	case h.Denied > 0:
		c.HistoryNote = "denied"
	}
}

// pendingHistory returns the history of the last pending event among es
// (a request's events), nil if none has one.
func pendingHistory(es []*broker.Event) *events.History {
	var h *events.History
	for _, e := range es {
		if e.ShortType() != "pending" {
			continue
		}
		var ce struct {
			Data struct {
				History *events.History `json:"history"`
			} `json:"data"`
		}
		if json.Unmarshal(e.Event, &ce) == nil && ce.Data.History != nil && ce.Data.History.Validate() == nil {
			h = ce.Data.History
		}
	}
	return h
}

type vote struct {
	Principal, Channel string
	At                 time.Time
}

// rememberForm offers what a rule lets an answer remember.
type rememberForm struct {
	Scopes []scopeOption
	TTLs   []ttlOption
}

type scopeOption struct{ Value, Label string }

type ttlOption struct {
	Value, Label string
	Default      bool
}

// decision is how a request ended.
type decision struct {
	Outcome string
	Reason  string
	By      []vote
	At      time.Time
	Auto    bool
	Rule    string
	Edited  bool
	Args    argList // the approved arguments, when edited, marked where they differ from the request's
	Payload string
}

func (u *UI) makeCard(rec broker.Record, v viewer) card {
	req := rec.Request
	c := card{
		ID: rec.ID, Short: shortID(rec.ID), State: string(rec.State), Pending: rec.State == broker.StatePending,
		Tool: textsafe.Line(req.Tool), Agent: textsafe.Line(req.Agent), Session: textsafe.Line(req.Session),
		User: textsafe.Line(req.User), Hint: textsafe.Text(req.Hint), CallID: textsafe.Line(req.CallID),
		Received: rec.ReceivedAt, Deadline: rec.Deadline, Level: rec.Level, Forgery: textsafe.Line(rec.Forgery),
	}
	c.Hidden = c.Tool != req.Tool || c.Agent != req.Agent || c.Session != req.Session || c.User != req.User || c.Hint != req.Hint
	for k, val := range req.Labels {
		c.Labels = append(c.Labels, [2]string{textsafe.Line(k), textsafe.Line(val)})
		c.Hidden = c.Hidden || textsafe.Line(k) != k || textsafe.Line(val) != val
	}
	sort.Slice(c.Labels, func(i, j int) bool { return c.Labels[i][0] < c.Labels[j][0] })
	c.Args = argList{View: argview.Of(req.Args, argLimits)}
	c.ArgsJSON, c.NoArgs = prettyJSON(req.Args)
	if hidden(req.Args) || hidden(req.InputSchema) {
		c.Hidden = true
	}
	c.ArgsSchema = makeArgsSchema(req.InputSchema)
	for _, d := range rec.Votes {
		c.Votes = append(c.Votes, vote{Principal: textsafe.Line(d.Principal), Channel: textsafe.Line(d.Channel), At: d.At})
	}
	if rec.Decision != nil {
		c.Decision = makeDecision(rec.Decision, c.Args.View)
	}
	if !c.Pending {
		c.Rule = rec.Rule
		return c
	}
	now := u.cfg.Now()
	c.Shown = now.UTC().Format(time.RFC3339Nano)
	if h, ok := u.b.(Historian); ok {
		c.setHistory(h.History(rec), now)
	}
	info := u.b.RuleOf(rec)
	c.Rule, c.Limit, c.Quorum = info.Rule, info.Limit, max(info.Quorum, 1)
	c.WhoMay, c.RuleText = whoMay(info.Approvers, c.Quorum), ruleText(info.Rule)
	c.OnTimeout = "then denied if nobody answers"
	if info.OnTimeout == events.Approve {
		c.OnTimeout = "then approved if nobody answers"
	}
	c.CanEdit = c.Quorum == 1
	switch {
	case !v.Auth:
		c.CanAnswer = true // the broker checks the name the page sends
	case v.Principal == "":
		c.WhyNot = "You are signed in without a principal, so you cannot answer."
	default:
		err := u.b.Eligible(rec, v.Principal)
		c.CanAnswer = err == nil
		if err != nil {
			c.WhyNot = "You are not an approver of this request: " + eligibleReason(err)
		}
		if slices.ContainsFunc(rec.Votes, func(d events.DecidedBy) bool { return d.Principal == v.Principal }) {
			c.CanAnswer, c.WhyNot = false, "You approved this already; it needs more approvals."
		}
	}
	if info.Rememberable {
		c.Remember = rememberOptions(req, info)
	}
	c.Schema = makeSchemaForm(req.ResponseSchema)
	return c
}

// whoMay says who may approve, and how many must, in words an approver
// reads without knowing the policy's syntax.
func whoMay(approvers []string, quorum int) string {
	var names []string
	for _, a := range approvers {
		if role, ok := strings.CutPrefix(a, "role:"); ok {
			names = append(names, "anyone with role "+textsafe.Line(role))
		} else {
			names = append(names, textsafe.Line(a))
		}
	}
	switch {
	case quorum > 1 && len(names) == 0:
		return fmt.Sprintf("Needs %d approvals, from anyone", quorum)
	case quorum > 1:
		return fmt.Sprintf("Needs %d of: %s", quorum, strings.Join(names, ", "))
	case len(names) == 0:
		return "Anyone may approve"
	case len(names) == 1 && strings.HasPrefix(approvers[0], "role:"):
		return "A" + strings.TrimPrefix(names[0], "a") + " may approve" // Anyone with role …
	case len(names) == 1:
		return "Only " + names[0] + " may approve"
	}
	return "Any one of " + strings.Join(names, ", ") + " may approve"
}

// ruleText names the rule a request falls under, or says that none matched
// (the policy's mode, "mode:manual", decided to ask).
func ruleText(rule string) string {
	if strings.HasPrefix(rule, "mode:") || rule == "" {
		return "No rule matched this call, so the policy asks a person."
	}
	return "Rule " + textsafe.Line(rule)
}

// eligibleReason is the part of an eligibility error that explains it.
func eligibleReason(err error) string {
	msg := err.Error()
	if i := strings.LastIndex(msg, ": "); i >= 0 && errors.Is(err, broker.ErrNotEligible) {
		msg = msg[i+2:]
	}
	return textsafe.Line(msg)
}

// argLimits bound what a card shows of each argument before its "N more
// characters" control: 160 characters or 3 lines, and with many arguments
// about 2,000 characters in all (never under 24 each), so that every key is
// in sight above the card's buttons.
var argLimits = argview.Limits{Value: 160, Lines: 3, Total: 2000, MinValue: 24}

// argList is arguments as a card shows them; for edited arguments, Changed
// marks each that is not in the request as it is here, and Removed names
// the request's arguments the edit left out.
type argList struct {
	argview.View
	Changed []bool
	Removed []string
}

// edited lays out args, an approver's edit of the arguments in asked.
func edited(args json.RawMessage, asked argview.View) argList {
	l := argList{View: argview.Of(args, argLimits)}
	was := map[string]string{}
	for _, a := range asked.Args {
		if _, ok := was[a.Key]; !ok {
			was[a.Key] = a.Value
		}
	}
	now := map[string]bool{}
	for _, a := range l.Args {
		v, ok := was[a.Key]
		l.Changed = append(l.Changed, !ok || v != a.Value)
		now[a.Key] = true
	}
	for _, a := range asked.Args {
		if !now[a.Key] {
			l.Removed = append(l.Removed, a.Key)
			now[a.Key] = true
		}
	}
	return l
}

func makeDecision(d *events.Decided, asked argview.View) *decision {
	out := &decision{Outcome: string(d.Outcome), Reason: textsafe.Text(d.Reason), At: d.DecidedAt, Auto: d.Auto,
		Rule: textsafe.Line(d.Rule), Edited: d.Edited}
	for _, b := range d.DecidedBy {
		out.By = append(out.By, vote{Principal: textsafe.Line(b.Principal), Channel: textsafe.Line(b.Channel), At: b.At})
	}
	if d.Edited {
		out.Args = edited(d.Args, asked)
	}
	if len(d.Payload) > 0 {
		out.Payload, _ = prettyJSON(d.Payload)
	}
	return out
}

// prettyJSON indents raw JSON and escapes what a screen would hide; it says
// whether there was nothing to show.
func prettyJSON(raw json.RawMessage) (string, bool) {
	if len(raw) == 0 || string(raw) == "null" || string(raw) == "{}" {
		return "{}", true
	}
	var buf bytes.Buffer
	if err := json.Indent(&buf, raw, "", "  "); err != nil {
		return textsafe.Text(string(raw)), false
	}
	return string(textsafe.JSON(buf.Bytes())), false
}

// hidden says raw JSON holds, in a key or a string, characters a screen
// would not show (written as they are or as \u escapes).
func hidden(raw json.RawMessage) bool {
	if len(raw) == 0 {
		return false
	}
	var v any
	if json.Unmarshal(raw, &v) != nil {
		return !bytes.Equal(textsafe.JSON(raw), raw)
	}
	var walk func(v any) bool
	walk = func(v any) bool {
		switch v := v.(type) {
		case string:
			return textsafe.Text(v) != v // newlines and tabs are fine
		case []any:
			return slices.ContainsFunc(v, walk)
		case map[string]any:
			for k, x := range v {
				if textsafe.Line(k) != k || walk(x) {
					return true
				}
			}
		}
		return false
	}
	return walk(v)
}

// rememberOptions lists the scopes that apply to req and the durations the
// rule allows.
func rememberOptions(req events.Requested, info broker.RuleInfo) *rememberForm {
	f := &rememberForm{}
	labels := map[string]string{
		events.ScopeCall:    "this exact call",
		events.ScopeSession: "session " + textsafe.Line(req.Session),
		events.ScopeAgent:   "agent " + textsafe.Line(req.Agent),
		events.ScopeUser:    "user " + textsafe.Line(req.User),
	}
	have := map[string]bool{events.ScopeCall: true, events.ScopeSession: req.Session != "", events.ScopeAgent: req.Agent != "", events.ScopeUser: req.User != ""}
	for _, s := range info.RememberScopes {
		if have[s] {
			f.Scopes = append(f.Scopes, scopeOption{Value: s, Label: labels[s]})
		}
	}
	if len(f.Scopes) == 0 {
		return nil
	}
	maxTTL := info.MaxRemember
	if maxTTL <= 0 {
		maxTTL = policy.DefaultMaxRemember
	}
	for _, d := range []time.Duration{15 * time.Minute, time.Hour, 8 * time.Hour, 24 * time.Hour, 7 * 24 * time.Hour} {
		if d < maxTTL {
			f.TTLs = append(f.TTLs, ttlOption{Value: d.String(), Label: humanDuration(d)})
		}
	}
	f.TTLs = append(f.TTLs, ttlOption{Value: maxTTL.String(), Label: humanDuration(maxTTL) + " (the most allowed)"})
	def := 0
	for i, t := range f.TTLs {
		if t.Value == time.Hour.String() {
			def = i
		}
	}
	f.TTLs[def].Default = true
	return f
}

func humanDuration(d time.Duration) string {
	switch {
	case d%(24*time.Hour) == 0:
		return plural(int(d/(24*time.Hour)), "day", "days")
	case d%time.Hour == 0:
		return plural(int(d/time.Hour), "hour", "hours")
	case d%time.Minute == 0:
		return plural(int(d/time.Minute), "minute", "minutes")
	}
	return d.String()
}

// schemaForm is a form for a structured answer, made from the request's
// response schema: one field per property of an object schema whose
// properties are strings (or a list of choices), numbers or booleans. Any
// other schema is answered as JSON in a text box.
type schemaForm struct {
	Fields []field
	// Raw is the schema, shown when there are no fields.
	Raw string
}

type field struct {
	Name, Label, Type, Description string
	Options                        []string
	Required                       bool
	Default                        string
}

func makeSchemaForm(raw json.RawMessage) *schemaForm {
	if len(raw) == 0 || string(raw) == "null" {
		return nil
	}
	var s struct {
		Type       string `json:"type"`
		Properties map[string]struct {
			Type        string            `json:"type"`
			Title       string            `json:"title"`
			Description string            `json:"description"`
			Enum        []json.RawMessage `json:"enum"`
			Default     json.RawMessage   `json:"default"`
		} `json:"properties"`
		Required []string `json:"required"`
	}
	pretty, _ := prettyJSON(raw)
	form := &schemaForm{Raw: pretty}
	if err := json.Unmarshal(raw, &s); err != nil || s.Type != "object" || len(s.Properties) == 0 {
		return form
	}
	var fields []field
	for name, p := range s.Properties {
		f := field{Name: textsafe.Line(name), Label: textsafe.Line(p.Title), Description: textsafe.Line(p.Description),
			Required: slices.Contains(s.Required, name)}
		if f.Name != name {
			return form // a name the page cannot show as it is
		}
		if f.Label == "" {
			f.Label = strings.ReplaceAll(f.Name, "_", " ")
		}
		if len(p.Default) > 0 {
			var d any
			if json.Unmarshal(p.Default, &d) == nil {
				switch d := d.(type) {
				case string:
					f.Default = textsafe.Line(d)
				default:
					f.Default = string(p.Default)
				}
			}
		}
		switch {
		case len(p.Enum) > 0:
			f.Type = "enum"
			for _, e := range p.Enum {
				var str string
				if json.Unmarshal(e, &str) != nil {
					return form // choices other than strings: JSON
				}
				f.Options = append(f.Options, textsafe.Line(str))
			}
		case p.Type == "string", p.Type == "number", p.Type == "integer", p.Type == "boolean":
			f.Type = p.Type
		default:
			return form
		}
		fields = append(fields, f)
	}
	sort.SliceStable(fields, func(i, j int) bool {
		if fields[i].Required != fields[j].Required {
			return fields[i].Required
		}
		return fields[i].Name < fields[j].Name
	})
	form.Fields = fields
	return form
}

// argsSchema is a request's input schema as a person reads it: a row per
// property of an object schema, and the schema itself as JSON.
type argsSchema struct {
	Props []schemaProp
	Raw   string
}

type schemaProp struct {
	Name, Type, Description string
	Required                bool
}

// maxEnumShown is how many of a property's choices a row lists.
const maxEnumShown = 12

// makeArgsSchema reads raw, a request's input_schema; nil when there is none.
// Properties are listed when raw is an object schema with them, required
// ones first; anything else is shown as JSON only.
func makeArgsSchema(raw json.RawMessage) *argsSchema {
	if len(bytes.TrimSpace(raw)) == 0 || string(bytes.TrimSpace(raw)) == "null" {
		return nil
	}
	pretty, _ := prettyJSON(raw)
	out := &argsSchema{Raw: pretty}
	var s struct {
		Properties map[string]struct {
			Type        json.RawMessage   `json:"type"`
			Title       string            `json:"title"`
			Description string            `json:"description"`
			Enum        []json.RawMessage `json:"enum"`
			Items       *struct {
				Type json.RawMessage `json:"type"`
			} `json:"items"`
		} `json:"properties"`
		Required []string `json:"required"`
	}
	if json.Unmarshal(raw, &s) != nil {
		return out
	}
	for name, p := range s.Properties {
		desc := p.Description
		if p.Title != "" && desc != "" {
			desc = p.Title + ": " + desc
		} else if desc == "" {
			desc = p.Title
		}
		typ := schemaType(p.Type)
		if typ == "array" && p.Items != nil {
			if it := schemaType(p.Items.Type); it != "" {
				typ = "array of " + it
			}
		}
		if len(p.Enum) > 0 {
			var vals []string
			for i, e := range p.Enum {
				if i == maxEnumShown {
					vals = append(vals, "…")
					break
				}
				vals = append(vals, string(e))
			}
			typ = "one of " + strings.Join(vals, ", ")
		}
		out.Props = append(out.Props, schemaProp{Name: textsafe.Line(name), Type: textsafe.Line(typ),
			Description: textsafe.Text(desc), Required: slices.Contains(s.Required, name)})
	}
	sort.SliceStable(out.Props, func(i, j int) bool {
		if out.Props[i].Required != out.Props[j].Required {
			return out.Props[i].Required
		}
		return out.Props[i].Name < out.Props[j].Name
	})
	return out
}

// schemaType is a JSON Schema "type" as words: "string", "string or null";
// "" when absent or of another shape.
func schemaType(raw json.RawMessage) string {
	var one string
	if json.Unmarshal(raw, &one) == nil {
		return one
	}
	var many []string
	if json.Unmarshal(raw, &many) == nil {
		return strings.Join(many, " or ")
	}
	return ""
}
