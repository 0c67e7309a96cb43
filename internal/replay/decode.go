package replay

import (
	"bytes"
	"errors"
	"strings"
	"time"

	"github.com/assent-dev/assent/pkg/events"
)

// The decoders here read only what a replay needs from the events the
// broker stores, in one pass over the structured-mode body, without the
// CloudEvents SDK: a replay reads millions of them. Where a message is not
// what they expect (binary mode, a field they do not know in another case,
// a type they cannot read), they go the broker's own way (events.Decode and
// friends), which is slower and decides.

// isBinary reports whether h marks a binary-mode event: events.Decode reads
// those from their headers.
func isBinary(h map[string][]string) bool {
	if len(h) == 0 {
		return false
	}
	if _, ok := h["Content-Type"]; ok && len(h) == 1 {
		return false // what brokers and SDKs publish: the structured mode's one header
	}
	ct := header(h, "Content-Type")
	if i := strings.IndexByte(ct, ';'); i >= 0 {
		ct = ct[:i]
	}
	if strings.EqualFold(strings.TrimSpace(ct), events.ContentTypeStructured) {
		return false
	}
	return header(h, "ce-specversion") != ""
}

func header(h map[string][]string, key string) string {
	if vs, ok := h[key]; ok && len(vs) > 0 {
		return vs[0]
	}
	for k, vs := range h {
		if len(vs) > 0 && strings.EqualFold(k, key) {
			return vs[0]
		}
	}
	return ""
}

// envelope is what the fast decoders read of a structured-mode event.
type envelope struct {
	id        []byte // not a copy
	typ, spec string
	data      int  // data members met
	odd       bool // something only the broker's decoder reads right
}

// envelopeNames are the members an event's envelope may not have in
// another case: the CloudEvents SDK would read them otherwise than the
// fast decoders do.
var envelopeNames = []string{"id", "type", "specversion", "data", "data_base64"}

// member reads the envelope's member key, if it is one the decoders need,
// and reports whether it was; the caller skips the others.
func (env *envelope) member(s *scanner, key []byte, intern map[string]string) bool {
	switch string(key) {
	case "id":
		env.id = s.token()
	case "type":
		env.typ = s.str(intern)
	case "specversion":
		env.spec = s.str(intern)
	case "data_base64":
		env.odd = true
		s.skip()
	default:
		if foldsTo(key, envelopeNames) {
			env.odd = true
		}
		return false
	}
	return true
}

// sound reports whether the event read well, with its one data member, a
// usable id and spec version 1.0, of type typ.
func (env *envelope) sound(s *scanner, typ string) bool {
	return s.end() && !env.odd && env.data == 1 && env.spec == "1.0" && env.typ == typ && validToken(env.id)
}

// validToken is events.ValidToken of b.
func validToken(b []byte) bool {
	if len(b) == 0 || len(b) > events.MaxTokenLength {
		return false
	}
	for _, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// foldsTo reports whether key is one of names in another case.
func foldsTo(key []byte, names []string) bool {
	for _, n := range names {
		if len(key) == len(n) && string(key) != n && bytes.EqualFold(key, []byte(n)) {
			return true
		}
	}
	return false
}

// requestMsg is a request message as a replay reads it.
type requestMsg struct {
	id  string
	req events.Requested
	// unsure: the fast decoder read it, and the broker's checks (the
	// envelope, Validate, the input schema) were not made: the stream says
	// whether they passed (Replayer.Apply).
	unsure bool
	// invalid says why the broker's decoder refuses it as a request it
	// denies ("validation"); not a request at all is ok false in
	// decodeRequest.
	invalid string
}

// requestFields are the members of requested data the fast decoder reads
// (every member of events.Requested).
var requestFields = []string{"tool", "args", "agent", "session", "user", "call_id", "hint", "response_schema", "timeout", "labels", "input_schema"}

// decodeRequest reads the request message on assent.request.<agent>. ok is
// false for a message the broker does not take as a request at all (a
// malformed envelope, another type): it decides nothing for it.
func decodeRequest(agent string, h map[string][]string, body []byte, intern map[string]string) (requestMsg, bool) {
	if !isBinary(h) {
		if m, ok := fastRequest(agent, body, intern); ok {
			return m, true
		}
	}
	return exactRequest(agent, h, body)
}

// fastRequest is decodeRequest for a structured-mode body it can read;
// ok false sends it the exact way.
func fastRequest(agent string, body []byte, intern map[string]string) (requestMsg, bool) {
	var m requestMsg
	var env envelope
	s := newScanner(body)
	readData(&s, &env, intern, func() {
		readRequested(&s, &m.req, &env, intern)
	})
	if !env.sound(&s, events.TypeRequested) {
		return m, false
	}
	m.id = string(env.id)
	m.unsure = true
	if m.req.Agent != "" && m.req.Agent != agent {
		m.invalid = "validation"
	}
	m.req.Agent = agent
	return m, true
}

// readData reads the structured-mode event in s: each envelope member into
// env, and, for the data object, once entered, calls data to read its
// members.
func readData(s *scanner, env *envelope, intern map[string]string, data func()) {
	s.enter()
	for first := true; ; {
		key, ok := s.member(&first)
		if !ok {
			return
		}
		if string(key) != "data" {
			if !env.member(s, key, intern) {
				s.skip()
			}
			continue
		}
		env.data++
		s.enter()
		data()
	}
}

// readRequested reads the members of requested data into r.
func readRequested(s *scanner, r *events.Requested, env *envelope, intern map[string]string) {
	for first := true; ; {
		key, ok := s.member(&first)
		if !ok {
			return
		}
		if s.null() {
			continue // as encoding/json: null leaves the field as it is
		}
		switch string(key) {
		case "tool":
			r.Tool = s.str(intern)
		case "agent":
			r.Agent = s.str(intern)
		case "session":
			r.Session = s.str(intern)
		case "user":
			r.User = s.str(intern)
		case "call_id":
			r.CallID = s.str(nil)
		case "hint":
			r.Hint = s.str(nil)
		case "args":
			r.Args = s.raw()
		case "response_schema":
			r.ResponseSchema = s.raw()
		case "input_schema":
			r.InputSchema = s.raw()
		case "timeout":
			if v := s.str(nil); v != "" {
				d, err := time.ParseDuration(v)
				if err != nil {
					env.odd = true
				}
				r.Timeout = events.Duration(d)
			}
		case "labels":
			labels := map[string]string{}
			s.enter()
			for first := true; ; {
				k, ok := s.member(&first)
				if !ok {
					break
				}
				labels[string(k)] = s.str(intern)
			}
			r.Labels = labels
		default:
			if foldsTo(key, requestFields) {
				env.odd = true // encoding/json matches it regardless of case
			}
			s.skip()
		}
	}
}

// exactRequest reads a request message as the broker does, with its checks:
// the envelope, the data, the agent of the subject, the digests.
func exactRequest(agent string, h map[string][]string, body []byte) (requestMsg, bool) {
	e, err := events.Decode(h, body)
	if err != nil {
		return requestMsg{}, false
	}
	m := requestMsg{id: e.ID()}
	req, err := events.DecodeRequested(&e)
	switch {
	case errors.Is(err, events.ErrWrongType):
		return requestMsg{}, false
	case err != nil:
		m.invalid = "validation"
	case req.Agent != "" && req.Agent != agent:
		m.invalid = "validation"
	}
	req.Agent = agent
	m.req = req
	if m.invalid == "" {
		if _, _, err := events.RequestDigests(req); err != nil {
			m.invalid = "validation"
		}
	}
	return m, true
}

// pendingMsg is what a replay reads of an event on assent.pending.<agent>.
type pendingMsg struct {
	id []byte // not a copy
	// escalated: an escalation step, not the announcement.
	escalated bool
	// maxTTL is how long the rule in force let an answer be remembered
	// (terms.remember.max_ttl); 0 when the event does not say.
	maxTTL time.Duration
	// rule is the rule whose approvers answer.
	rule string
}

// decodePending reads a pending or escalated event; ok is false for
// anything else.
func decodePending(h map[string][]string, body []byte, intern map[string]string) (pendingMsg, bool) {
	if !isBinary(h) {
		if m, ok := fastPending(body, intern); ok {
			return m, true
		}
	}
	e, err := events.Decode(h, body)
	if err != nil {
		return pendingMsg{}, false
	}
	switch e.Type() {
	case events.TypeEscalated:
		x, err := events.DecodeEscalated(&e)
		return pendingMsg{id: []byte(x.RequestID), escalated: true}, err == nil
	case events.TypePending:
		p, err := events.DecodePending(&e)
		if err != nil {
			return pendingMsg{}, false
		}
		m := pendingMsg{id: []byte(p.RequestID), rule: p.Rule}
		if p.ApprovalRule != "" {
			m.rule = p.ApprovalRule
		}
		if p.Terms != nil && p.Terms.Remember != nil {
			m.maxTTL = p.Terms.Remember.MaxTTL.Std()
		}
		return m, true
	}
	return pendingMsg{}, false
}

func fastPending(body []byte, intern map[string]string) (pendingMsg, bool) {
	var m pendingMsg
	var env envelope
	var rule, approvalRule string
	s := newScanner(body)
	readData(&s, &env, intern, func() {
		for first := true; ; {
			key, ok := s.member(&first)
			if !ok {
				break
			}
			switch string(key) {
			case "request_id":
				m.id = s.token()
			case "rule":
				rule = s.str(intern)
			case "approval_rule":
				approvalRule = s.str(intern)
			case "terms":
				if s.null() {
					continue
				}
				m.maxTTL = readTerms(&s, &env)
			default:
				s.skip()
			}
		}
	})
	switch {
	case env.sound(&s, events.TypeEscalated):
		m.escalated = true
	case env.sound(&s, events.TypePending):
	default:
		return m, false
	}
	m.rule = rule
	if approvalRule != "" {
		m.rule = approvalRule
	}
	return m, true
}

// readTerms reads a pending event's terms for remember.max_ttl.
func readTerms(s *scanner, env *envelope) time.Duration {
	var ttl time.Duration
	s.enter()
	for first := true; ; {
		key, ok := s.member(&first)
		if !ok {
			return ttl
		}
		if string(key) != "remember" || s.null() {
			s.skip()
			continue
		}
		s.enter()
		for first := true; ; {
			key, ok := s.member(&first)
			if !ok {
				break
			}
			if string(key) != "max_ttl" {
				s.skip()
				continue
			}
			d, err := time.ParseDuration(s.str(nil))
			if err != nil {
				env.odd = true
			}
			ttl = d
		}
	}
}

// decisionMsg is what a replay reads of a decided event.
type decisionMsg struct {
	id           []byte // not a copy
	outcome      events.Outcome
	reason       string
	rule         string
	approvalRule string
	auto         bool
	by           []string // the principals of decided_by, in order
	trigger      uint64   // the last sequence of trail: what ended the request (0: none)
	requestSeq   uint64
}

// decodeDecision reads a decided event; ok is false for anything else.
func decodeDecision(h map[string][]string, body []byte, intern map[string]string) (decisionMsg, bool) {
	if !isBinary(h) {
		if m, ok := fastDecision(body, intern); ok {
			return m, true
		}
	}
	e, err := events.Decode(h, body)
	if err != nil {
		return decisionMsg{}, false
	}
	d, err := events.DecodeDecided(&e)
	if err != nil {
		return decisionMsg{}, false
	}
	m := decisionMsg{id: []byte(d.RequestID), outcome: d.Outcome, reason: d.Reason, rule: d.Rule, approvalRule: d.ApprovalRule, auto: d.Auto, requestSeq: d.RequestSeq}
	for _, b := range d.DecidedBy {
		m.by = append(m.by, b.Principal)
	}
	if n := len(d.Trail); n > 0 {
		m.trigger = d.Trail[n-1]
	}
	return m, true
}

func fastDecision(body []byte, intern map[string]string) (decisionMsg, bool) {
	var m decisionMsg
	var env envelope
	s := newScanner(body)
	readData(&s, &env, intern, func() {
		for first := true; ; {
			key, ok := s.member(&first)
			if !ok {
				break
			}
			if s.null() {
				continue
			}
			switch string(key) {
			case "request_id":
				m.id = s.token()
			case "outcome":
				m.outcome = events.Outcome(s.str(intern))
			case "reason":
				m.reason = s.str(intern)
			case "rule":
				m.rule = s.str(intern)
			case "approval_rule":
				m.approvalRule = s.str(intern)
			case "auto":
				m.auto = s.boolean()
			case "request_seq":
				m.requestSeq = s.uint()
			case "trail":
				m.trigger = 0
				s.array()
				for first := true; s.elem(&first); {
					m.trigger = s.uint()
				}
			case "decided_by":
				s.array()
				for first := true; s.elem(&first); {
					s.enter()
					for first := true; ; {
						key, ok := s.member(&first)
						if !ok {
							break
						}
						if string(key) == "principal" {
							m.by = append(m.by, s.str(intern))
						} else {
							s.skip()
						}
					}
				}
			default:
				s.skip()
			}
		}
	})
	if !env.sound(&s, events.TypeDecided) || !m.outcome.Valid() {
		return m, false
	}
	return m, true
}

// answerMsg is an answer that asks to remember it.
type answerMsg struct {
	verdict  events.Verdict
	remember events.Remember
}

// decodeAnswer reads an answer as the broker does; ok is false for one the
// broker refuses or that asks to remember nothing, which makes no
// remembered choice.
func decodeAnswer(principal, id string, h map[string][]string, body []byte) (answerMsg, bool) {
	if !containsFold(body, "remember") {
		return answerMsg{}, false
	}
	e, err := events.Decode(h, body)
	if err != nil {
		return answerMsg{}, false
	}
	resp, err := events.DecodeResponded(&e)
	if err != nil || resp.Remember == nil || events.CheckToken("principal", principal) != nil || !events.ValidToken(id) {
		return answerMsg{}, false
	}
	return answerMsg{verdict: resp.Decision, remember: *resp.Remember}, true
}

// containsFold reports whether b holds word (lower-case ASCII) in any case.
func containsFold(b []byte, word string) bool {
	n := len(word)
	for i := 0; i+n <= len(b); i++ {
		if b[i]|0x20 != word[0] {
			continue
		}
		j := 1
		for ; j < n && b[i+j]|0x20 == word[j]; j++ {
		}
		if j == n {
			return true
		}
	}
	return false
}
