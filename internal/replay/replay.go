package replay

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"hash/maphash"
	"strings"
	"time"

	"github.com/assent-dev/assent/pkg/events"
	"github.com/assent-dev/assent/pkg/policy"
)

// Config tunes a replay. The zero Config replays every request the stream
// holds and lists every change.
type Config struct {
	// Since and Until bound the requests reported, by the time each was
	// stored (Until inclusive); zero: no bound. Requests stored before
	// Since are replayed too, unreported, so that remembered choices and
	// limits' totals stand as they did when the window opens.
	Since, Until time.Time
	// List is how many changed requests the report lists, first stored
	// first; 0: all. Every change is counted either way.
	List int
	// Retention is how long a limit's running total lasts without a charge
	// (the limits bucket's TTL, the broker's --retention); 0: for ever. Run
	// takes it from the stream's age limit.
	Retention time.Duration
	// Progress, if set, is called now and then while a replay reads, and
	// once at the end.
	Progress func(Progress)
}

// Validate reports every problem with c at once.
func (c Config) Validate() error {
	var errs []error
	if c.List < 0 {
		errs = append(errs, fmt.Errorf("list %d: want 0 or more", c.List))
	}
	if c.Retention < 0 {
		errs = append(errs, fmt.Errorf("retention %s: want 0 or more", c.Retention))
	}
	if !c.Since.IsZero() && !c.Until.IsZero() && c.Until.Before(c.Since) {
		errs = append(errs, fmt.Errorf("until %s is before since %s", c.Until.Format(time.RFC3339), c.Since.Format(time.RFC3339)))
	}
	return errors.Join(errs...)
}

// Progress is how far a replay has read.
type Progress struct {
	Seq, Last uint64 // the stream sequence reached, and the last one to read
	Messages  uint64 // messages read
	Requests  int    // requests replayed (in the window or before it)
	Elapsed   time.Duration
}

// Replayer replays a policy over the messages of the stream handed to it
// in stream order (Apply), and reports (Report). It is not safe for
// concurrent use.
type Replayer struct {
	pol  *policy.Policy
	cfg  Config
	open map[string]*request
	// taken holds 64-bit hashes of the ids of the requests decided, so
	// that a copy of one published again is not taken for a new request
	// (two ids that collide, about one chance in 10^7 among a million
	// requests, would cost the second its replay).
	taken    map[uint64]struct{}
	seed     maphash.Seed
	grants   *grants
	totals   *totals
	checkers map[string]events.ArgsChecker
	intern   map[string]string // one copy of each tool, agent, rule... name
	rep      Report
	pending  int // requests in the window with no decision yet
	past     bool
	hold     *holding  // a request held until the broker's take on it is known
	held     []Message // the messages after it, from head on
	head     int
	last     uint64 // the last stream sequence to read, if known
	start    time.Time
	lastTick time.Time
}

// request is a request the replay took and whose decision it has not read.
type request struct {
	id, tool, agent, session, user string
	args                           json.RawMessage
	seq                            uint64
	at                             time.Time
	report                         bool // in the window
	// waited: its pending event was stored. maxTTL and rule are the
	// remember terms and rule of that event.
	waited   bool
	maxTTL   time.Duration
	rule     string
	invalid  string // the broker denies it before any policy: "validation", "input-schema"
	replayed verdict
	answers  []answer // answers that asked to remember, in stream order
}

type answer struct {
	seq       uint64
	at        time.Time
	principal string
	msg       answerMsg
}

// actionExpired is the replayed action of a request whose deadline passed
// before the broker saw it: expired, as it was.
const actionExpired policy.Action = "expired"

// verdict is what the replayed policy does with a request.
type verdict struct {
	action             policy.Action
	rule, approvalRule string
	reason             string
	// noApprover: a request that would wait is denied at once when no
	// eligible approver is reachable (on_no_approver: deny).
	noApprover bool
}

// New returns a Replayer of p (which must not be nil) with cfg.
func New(p *policy.Policy, cfg Config) *Replayer {
	now := time.Now()
	return &Replayer{
		pol: p, cfg: cfg,
		open:     map[string]*request{},
		taken:    map[uint64]struct{}{},
		seed:     maphash.MakeSeed(),
		grants:   newGrants(),
		totals:   newTotals(cfg.Retention),
		checkers: map[string]events.ArgsChecker{},
		intern:   map[string]string{},
		rep:      Report{Policy: p.File, Since: cfg.Since, Until: cfg.Until, Kinds: map[Kind]int{}},
		start:    now, lastTick: now,
	}
}

// Message is one stored message of the stream.
type Message struct {
	Seq     uint64
	Subject string
	Header  map[string][]string
	Data    []byte
	Time    time.Time // when the stream stored it
}

// maxHeld is how many messages a request may be held back for (see hold)
// before it is checked the broker's way instead.
const maxHeld = 8192

// holding is a request whose automatic approval would be charged against
// limits, held until the stream says whether the broker took it (see
// Apply).
type holding struct {
	q        *request
	m        Message
	req      events.Requested
	res      policy.Result
	in       policy.Input
	decision string // the subject of its decision
	needle   []byte // how its pending event names it
	scanned  int    // held messages looked at for what the broker made of it
}

// Apply reads the next message of the stream. Messages must come in stream
// order; gaps are fine.
//
// A request the replayed policy approves automatically is charged against
// its limits only if the broker took it as a request (the checks the
// broker makes before any policy: its envelope, its data, its input
// schema): the charge changes how later requests are judged. The fast
// decoder does not make those checks, so such a request is held, and the
// messages after it wait, until the stream shows what the broker made of
// it: its pending event, or its decision (denied by rule validation or
// input-schema, or anything else). Only if that does not come within
// maxHeld messages is it checked the broker's own, slower way.
func (r *Replayer) Apply(m Message) {
	if r.rep.FirstSeq == 0 {
		r.rep.FirstSeq = m.Seq
	}
	r.rep.LastSeq = m.Seq
	r.rep.Messages++
	if r.hold == nil {
		r.apply(m)
	} else {
		r.held = append(r.held, m)
		r.release(false)
	}
	if r.cfg.Progress != nil && r.rep.Messages%4096 == 0 {
		if now := time.Now(); now.Sub(r.lastTick) >= 250*time.Millisecond {
			r.lastTick = now
			r.cfg.Progress(r.progress())
		}
	}
}

// apply applies one message, in its turn.
func (r *Replayer) apply(m Message) {
	rest, ok := strings.CutPrefix(m.Subject, events.Prefix)
	if !ok {
		return
	}
	kind, rest, _ := strings.Cut(rest, ".")
	switch kind {
	case "request":
		if events.ValidToken(rest) {
			r.request(m, rest)
		}
	case "pending":
		r.pendingEvent(m)
	case "response":
		if principal, id, ok := strings.Cut(rest, "."); ok {
			r.answer(m, principal, id)
		}
	case "decision":
		r.decision(m, rest)
	}
}

// release settles the held request once the held messages say what the
// broker made of it, or (force, or too many held) by checking it the
// broker's way, and applies the held messages after it, until another
// request is held.
func (r *Replayer) release(force bool) {
	for r.hold != nil {
		invalid, known := r.evidence()
		if !known {
			if !force && len(r.held)-r.head < maxHeld {
				return
			}
			var took bool
			invalid, took = r.exactCheck(r.hold)
			if !took {
				r.drop(r.hold.q)
				r.hold = nil
			}
		}
		if h := r.hold; h != nil {
			r.hold = nil
			r.settle(h, invalid)
		}
		for r.hold == nil && r.head < len(r.held) {
			m := r.held[r.head]
			r.held[r.head] = Message{}
			r.head++
			r.apply(m)
		}
		if r.head == len(r.held) {
			r.held, r.head = r.held[:0], 0
		}
	}
}

// evidence looks in the held messages for what the broker made of the held
// request: known is false if they do not say yet; invalid is the rule of
// a denial before any policy ("validation", "input-schema"), or "".
func (r *Replayer) evidence() (invalid string, known bool) {
	h := r.hold
	for i := r.head + h.scanned; i < len(r.held); i++ {
		h.scanned++
		m := &r.held[i]
		switch {
		case m.Subject == h.decision:
			d, ok := decodeDecision(m.Header, m.Data, r.intern)
			if !ok || string(d.id) != h.q.id {
				continue
			}
			if d.rule == ruleValidation || d.rule == ruleInputSchema {
				return d.rule, true
			}
			return "", true
		case strings.HasPrefix(m.Subject, events.PendingPrefix) && bytes.Contains(m.Data, h.needle):
			if p, ok := decodePending(m.Header, m.Data, r.intern); ok && !p.escalated && string(p.id) == h.q.id {
				return "", true
			}
		}
	}
	return "", false
}

// exactCheck checks the held request as the broker does: took is false if
// the broker would not take it as a request at all; invalid names the rule
// that denies it before any policy.
func (r *Replayer) exactCheck(h *holding) (invalid string, took bool) {
	exact, ok := exactRequest(h.q.agent, h.m.Header, h.m.Data)
	switch {
	case !ok:
		return "", false
	case exact.invalid != "":
		return exact.invalid, true
	case !events.EmptyJSON(h.req.InputSchema):
		if err := r.checker(h.req.InputSchema).Check(h.req.Args); err != nil {
			return ruleInputSchema, true
		}
	}
	return "", true
}

// drop forgets a request the broker never judged.
func (r *Replayer) drop(q *request) {
	delete(r.open, q.id)
	r.rep.Replayed--
	if q.report {
		r.pending--
	}
}

// Done reports whether nothing the stream holds after what was applied
// can change the report: the window ended, and every request in it is
// decided.
func (r *Replayer) Done() bool { return r.past && r.pending == 0 && r.hold == nil }

func (r *Replayer) progress() Progress {
	return Progress{Seq: r.rep.LastSeq, Last: r.last, Messages: r.rep.Messages, Requests: r.rep.Replayed, Elapsed: time.Since(r.start)}
}

func (r *Replayer) hash(id string) uint64 { return maphash.String(r.seed, id) }

// request takes a request message: the first one of its id is judged by
// the policy, at the time it was stored.
func (r *Replayer) request(m Message, agent string) {
	if !r.cfg.Until.IsZero() && m.Time.After(r.cfg.Until) {
		r.past = true
		return
	}
	msg, ok := decodeRequest(agent, m.Header, m.Data, r.intern)
	if !ok {
		return
	}
	if _, dup := r.open[msg.id]; dup {
		return
	}
	if _, dup := r.taken[r.hash(msg.id)]; dup {
		return
	}
	q := &request{
		id: msg.id, tool: msg.req.Tool, agent: agent, session: msg.req.Session, user: msg.req.User,
		args: msg.req.Args, seq: m.Seq, at: m.Time, invalid: msg.invalid,
		report: r.cfg.Since.IsZero() || !m.Time.Before(r.cfg.Since),
	}
	r.open[q.id] = q
	r.rep.Replayed++
	if q.report {
		r.pending++
	}
	if q.invalid == "" {
		r.judge(q, &msg, m)
	}
}

// judge evaluates the policy for q, as the broker's evaluate does
// (internal/broker/policy.go): limits charged for an automatic approval,
// remembered choices as they stand at the request's stored time.
func (r *Replayer) judge(q *request, msg *requestMsg, m Message) {
	now := m.Time
	digest := ""
	if r.grants.needsDigest(q.tool) {
		d, err := events.ArgsDigest(msg.req.Args)
		if err != nil {
			q.invalid = ruleValidation // the broker cannot take its args either
			return
		}
		digest = d
	}
	in := policy.InputWithDigest(msg.req, digest)
	r.grants.now = now
	res := r.pol.Evaluate(in, now, r.grants)
	h := &holding{q: q, m: m, req: msg.req, res: res, in: in}
	if res.Action != policy.Allow || len(res.Limits) == 0 {
		r.settle(h, "")
		return
	}
	if !msg.unsure {
		invalid := ""
		if !events.EmptyJSON(msg.req.InputSchema) && r.checker(msg.req.InputSchema).Check(msg.req.Args) != nil {
			invalid = ruleInputSchema
		}
		r.settle(h, invalid)
		return
	}
	h.decision = events.DecisionPrefix + q.id
	h.needle = []byte(`"request_id":"` + q.id + `"`)
	r.hold = h
}

// settle finishes judging h's request: denied before any policy (invalid),
// or as the policy says, with an automatic approval charged against its
// limits.
func (r *Replayer) settle(h *holding, invalid string) {
	q, res := h.q, h.res
	if invalid != "" {
		q.invalid = invalid
		return
	}
	if res.Action == policy.Allow && len(res.Limits) > 0 {
		res = r.totals.charge(res, h.in, h.m.Time)
	}
	v := verdict{action: res.Action, rule: res.Rule, reason: res.Reason}
	if a := res.Approval; a != nil {
		v.noApprover = a.OnNoApprover == policy.NoApproverDeny
		v.rule = a.Rule
		if res.Limit != "" {
			v.rule, v.approvalRule = "limit:"+res.Limit, a.Rule
		}
	}
	q.replayed = v
}

// checker returns the compiled input schema, kept for the next request of
// the same tool.
func (r *Replayer) checker(schema json.RawMessage) events.ArgsChecker {
	c, ok := r.checkers[string(schema)]
	if !ok {
		if len(r.checkers) >= 256 {
			clear(r.checkers)
		}
		c = events.NewArgsChecker(schema)
		r.checkers[string(schema)] = c
	}
	return c
}

// pendingEvent notes that a request waits for people.
func (r *Replayer) pendingEvent(m Message) {
	p, ok := decodePending(m.Header, m.Data, r.intern)
	if !ok || p.escalated {
		return
	}
	q := r.open[string(p.id)]
	if q == nil || q.waited {
		return
	}
	q.waited, q.maxTTL, q.rule = true, p.maxTTL, p.rule
}

// answer keeps an answer that asks to remember, for the decision it may
// make.
func (r *Replayer) answer(m Message, principal, id string) {
	q := r.open[id]
	if q == nil {
		return
	}
	a, ok := decodeAnswer(principal, id, m.Header, m.Data)
	if !ok {
		return
	}
	q.answers = append(q.answers, answer{seq: m.Seq, at: m.Time, principal: principal, msg: a})
}

// decision closes the request it decides: the remembered choice its
// deciding answer asked for is made, and the outcome compared.
func (r *Replayer) decision(m Message, id string) {
	q := r.open[id]
	if q == nil {
		return // not a request the replay took, or not its first decision
	}
	d, ok := decodeDecision(m.Header, m.Data, r.intern)
	if !ok || string(d.id) != id {
		return
	}
	delete(r.open, id)
	r.taken[r.hash(id)] = struct{}{}
	if !d.auto && (d.outcome == events.Approved || d.outcome == events.Denied) {
		r.remember(q, &d)
	}
	if !q.report {
		return
	}
	r.pending--
	r.compare(q, &d)
}

// remember makes the remembered choice that the answer deciding q asked
// for, as the broker's answerChange does (internal/broker/answer.go).
func (r *Replayer) remember(q *request, d *decisionMsg) {
	if len(q.answers) == 0 {
		return
	}
	var a *answer
	for i := range q.answers {
		if d.trigger != 0 && q.answers[i].seq == d.trigger {
			a = &q.answers[i]
		}
	}
	if a == nil && d.trigger == 0 && len(d.by) > 0 {
		// A decision without its trail (a broker before it): the last
		// principal named decided it.
		last := d.by[len(d.by)-1]
		for i := range q.answers {
			if q.answers[i].principal == last {
				a = &q.answers[i]
			}
		}
	}
	if a == nil {
		return
	}
	rem := a.msg.remember
	in := policy.Input{Tool: q.tool, Agent: q.agent, Session: q.session, User: q.user}
	if rem.Scope == events.ScopeCall {
		digest, err := events.ArgsDigest(q.args)
		if err != nil {
			return
		}
		in.ArgsDigest = digest
	}
	value := policy.ScopeValue(rem.Scope, in)
	if value == "" {
		return
	}
	ttl := rem.TTL.Std()
	if ttl <= 0 {
		ttl = r.maxRemember(q)
	}
	g := policy.Grant{
		ID: grantID(q.id, a.seq, a.at), Verdict: a.msg.verdict, Tool: q.tool,
		Scope: rem.Scope, ScopeValue: value, Rule: q.rule, RequestID: q.id,
		CreatedBy: a.principal, CreatedAt: a.at.UTC(), ExpiresAt: a.at.Add(ttl).UTC(),
	}
	if len(rem.Args) > 0 && string(rem.Args) != "null" {
		g.ArgsPattern = rem.Args
	}
	r.grants.add(g)
}

// maxRemember is how long an answer to q that gave no ttl was remembered:
// what its pending event said the rule allowed, else what the replayed
// policy's rule of that name allows.
func (r *Replayer) maxRemember(q *request) time.Duration {
	if q.maxTTL > 0 {
		return q.maxTTL
	}
	for _, rule := range r.pol.Rules {
		if rule.Name == q.rule && rule.Approval != nil {
			return rule.Approval.MaxRemember
		}
	}
	return r.pol.ModeApproval().MaxRemember
}
