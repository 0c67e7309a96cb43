package insights

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"strconv"
	"strings"
	"time"

	jsoniter "github.com/json-iterator/go"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/assent-dev/assent/pkg/events"
)

// What the aggregator reads of each stored message. Reading happens before
// the aggregator takes its lock: it decodes only the fields it keeps, with
// jsoniter, instead of the whole CloudEvent.

// stdJSON decodes like encoding/json (field names unescaped, time.Time and
// json.RawMessage as the standard library reads them), faster.
var stdJSON = jsoniter.ConfigCompatibleWithStandardLibrary

// envelope returns the type, id and data of the event in a stored message:
// from its ce- headers and body in binary mode, else from the body's JSON
// object (structured mode). ok is false for a message that is neither.
func envelope(h nats.Header, body []byte) (typ, id string, data []byte, ok bool) {
	if header(h, "ce-specversion") != "" {
		return header(h, "ce-type"), header(h, "ce-id"), body, true
	}
	it := stdJSON.BorrowIterator(body)
	defer stdJSON.ReturnIterator(it)
	if it.WhatIsNext() != jsoniter.ObjectValue {
		return "", "", nil, false
	}
	it.ReadObjectCB(func(it *jsoniter.Iterator, field string) bool {
		switch field {
		case "type":
			typ = readString(it)
		case "id":
			id = readString(it)
		case "data":
			data = it.SkipAndReturnBytes()
		default:
			it.Skip()
		}
		return true
	})
	return typ, id, data, it.Error == nil
}

// readString reads a JSON string, or skips another value and returns "".
func readString(it *jsoniter.Iterator) string {
	if it.WhatIsNext() != jsoniter.StringValue {
		it.Skip()
		return ""
	}
	return it.ReadString()
}

// header returns the first value of h's key, matched without regard to
// case if need be.
func header(h nats.Header, key string) string {
	if vs := h[key]; len(vs) > 0 {
		return vs[0]
	}
	for k, vs := range h {
		if len(vs) > 0 && strings.EqualFold(k, key) {
			return vs[0]
		}
	}
	return ""
}

// scheduled reports whether msg was stored for someone's message schedule
// rather than by its publisher: the broker takes no such message as a
// request, answer or announcement (a stream an earlier broker made lets
// clients schedule messages), and neither does the aggregator.
func scheduled(h nats.Header) bool {
	return header(h, "Nats-Scheduler") != "" || header(h, jetstream.ScheduleHeader) != ""
}

// requestMsg is what the aggregator reads of a request message.
type requestMsg struct{ id, tool string }

func readRequest(h nats.Header, body []byte) (requestMsg, bool) {
	typ, id, data, ok := envelope(h, body)
	if !ok || typ != events.TypeRequested || !events.ValidToken(id) {
		return requestMsg{}, false
	}
	var d struct {
		Tool string `json:"tool"`
	}
	if stdJSON.Unmarshal(data, &d) != nil {
		return requestMsg{}, false
	}
	return requestMsg{id: id, tool: d.Tool}, true
}

// pendingMsg is what the aggregator reads of a pending event: the request
// it announces, with a summary of its arguments.
type pendingMsg struct {
	id, tool, agent string
	rule, arule     string
	args            []argIn
	hasArgs         bool   // the args were read (args may be empty)
	digest          uint64 // the first 8 bytes of the args digest
}

func readPending(h nats.Header, body []byte) (pendingMsg, bool) {
	typ, _, data, ok := envelope(h, body)
	if !ok || typ != events.TypePending {
		return pendingMsg{}, false
	}
	var d struct {
		RequestID string `json:"request_id"`
		Request   struct {
			Tool  string          `json:"tool"`
			Agent string          `json:"agent"`
			Args  json.RawMessage `json:"args"`
		} `json:"request"`
		Rule         string `json:"rule"`
		ApprovalRule string `json:"approval_rule"`
	}
	if stdJSON.Unmarshal(data, &d) != nil || !events.ValidToken(d.RequestID) {
		return pendingMsg{}, false
	}
	p := pendingMsg{id: d.RequestID, tool: d.Request.Tool, agent: d.Request.Agent, rule: d.Rule, arule: d.ApprovalRule}
	p.args, p.digest, p.hasArgs = summarize(d.Request.Args)
	return p, true
}

// answerMsg is what the aggregator reads of an answer: who answered which
// request, and what the channel said of how the request was shown.
type answerMsg struct {
	principal, id string
	shown         time.Time
	detail        bool
}

func readAnswer(subject string, h nats.Header, body []byte) (answerMsg, bool) {
	sub, err := events.ParseSubject(subject)
	if err != nil || sub.Kind != events.KindResponse {
		return answerMsg{}, false
	}
	a := answerMsg{principal: sub.Principal, id: sub.RequestID}
	typ, _, data, ok := envelope(h, body)
	if !ok || typ != events.TypeResponded {
		return answerMsg{}, false
	}
	var d struct {
		ShownAt time.Time `json:"shown_at"`
		Detail  bool      `json:"detail"`
	}
	if stdJSON.Unmarshal(data, &d) == nil {
		a.shown, a.detail = d.ShownAt, d.Detail
	}
	return a, true
}

// decisionMsg is what the aggregator reads of a decided event.
type decisionMsg struct {
	id          string
	outcome     events.Outcome
	auto        bool
	edited      bool
	rule, arule string
	by          []events.DecidedBy
	decidedAt   time.Time
	requestSeq  uint64
	digest      uint64
	// args are the top-level fields of an edit's args, nil unless edited.
	args []argIn
}

// readDecision reads the decided event on request id's decision subject;
// ok is false for a message that readers do not take as a decision: not a
// decided event, one with an unknown outcome, or, with trusted keys, one
// none of them signed or that names another request. Without trusted keys,
// a decided event naming another request is, as the first message on the
// subject, what readers take (docs/protocol.md, "Reading a decision").
func readDecision(id string, h nats.Header, body []byte, trusted *events.TrustedKeys) (decisionMsg, bool) {
	var d events.Decided
	if trusted != nil {
		e, err := events.Decode(events.Header(h), body)
		if err != nil {
			return decisionMsg{}, false
		}
		if d, err = trusted.Verify(&e); err != nil {
			return decisionMsg{}, false
		}
	} else {
		typ, _, data, ok := envelope(h, body)
		if !ok || typ != events.TypeDecided || stdJSON.Unmarshal(data, &d) != nil {
			return decisionMsg{}, false
		}
	}
	if trusted != nil && d.RequestID != id || !d.Outcome.Valid() {
		return decisionMsg{}, false
	}
	m := decisionMsg{
		id: id, outcome: d.Outcome, auto: d.Auto, edited: d.Edited,
		rule: d.Rule, arule: d.ApprovalRule, by: d.DecidedBy,
		decidedAt: d.DecidedAt, requestSeq: d.RequestSeq, digest: digestKey(d.ArgsDigest),
	}
	if d.Edited {
		m.args, _, _ = summarize(d.Args)
	}
	return m, true
}

// shadowMsg is what the aggregator reads of a shadow disagreement.
type shadowMsg struct {
	id, tool, agent, live, shadow string
}

func readShadow(h nats.Header, body []byte) (shadowMsg, bool) {
	typ, _, data, ok := envelope(h, body)
	if !ok || typ != events.TypeShadowDisagreement {
		return shadowMsg{}, false
	}
	var d events.ShadowDisagreement
	if stdJSON.Unmarshal(data, &d) != nil || !events.ValidToken(d.RequestID) {
		return shadowMsg{}, false
	}
	m := shadowMsg{id: d.RequestID, tool: d.Tool, agent: d.Agent, live: d.Live, shadow: d.Shadow}
	if m.live == m.shadow && d.Summary != "" {
		// The same action by the same rule: what differs is in the
		// summary (approvers, quorum, timeout), bounded by the policies.
		sum := d.Summary
		if len(sum) > maxSummary {
			sum = wholeRunes(sum[:maxSummary]) + "…"
		}
		m.shadow += " (" + sum + ")"
	}
	return m, true
}

// maxSummary bounds the summary a disagreement pair's name carries.
const maxSummary = 160

// digestKey returns the first 8 bytes of an args digest ("sha256:<hex>"),
// which is how the aggregator tells arguments apart; 0 for anything else.
func digestKey(digest string) uint64 {
	const prefix = "sha256:"
	if len(digest) < len(prefix)+16 || digest[:len(prefix)] != prefix {
		return 0
	}
	var b [8]byte
	if _, err := hex.Decode(b[:], []byte(digest[len(prefix):len(prefix)+16])); err != nil {
		return 0
	}
	return binary.BigEndian.Uint64(b[:])
}

// Kinds of argument values.
const (
	kindString uint8 = 1 << iota
	kindNumber
	kindOther
)

// Bounds of an argument summary: the fields of a request's args the
// aggregator keeps, the longest value it keeps as JSON (a longer one is
// kept as a hash, and a string's first maxPrefix bytes), and the bytes of
// JSON it keeps in all per request (past them, values are kept as hashes).
const (
	maxFields   = 16
	maxValueLen = 128
	maxPrefix   = 64
	maxArgBytes = 512
)

// argIn is one top-level field of a request's args, as read.
type argIn struct {
	field string
	kind  uint8
	// json is the value's canonical JSON, "" when it is longer than
	// maxValueLen or past the budget; text is a string value's first
	// maxPrefix bytes; num a number's value.
	json string
	text string
	num  float64
	hash uint64 // of the canonical JSON
}

// summarize reads the top-level fields of args in canonical form (at most
// maxFields of them, in key order) and the first 8 bytes of their digest
// (events.ArgsDigest). ok is false for args that are not a JSON object.
func summarize(args json.RawMessage) (vals []argIn, digest uint64, ok bool) {
	canon, err := events.CanonicalArgs(args)
	if err != nil {
		return nil, 0, false
	}
	sum := sha256.Sum256(canon)
	digest = binary.BigEndian.Uint64(sum[:8])
	it := stdJSON.BorrowIterator(canon)
	defer stdJSON.ReturnIterator(it)
	budget := maxArgBytes
	it.ReadObjectCB(func(it *jsoniter.Iterator, field string) bool {
		if len(vals) == maxFields {
			it.Skip()
			return true
		}
		next := it.WhatIsNext()
		raw := it.SkipAndReturnBytes()
		v := argIn{field: field, kind: kindOther, hash: hashBytes(raw)}
		switch next {
		case jsoniter.StringValue:
			v.kind = kindString
			var s string
			if stdJSON.Unmarshal(raw, &s) == nil {
				v.text = cut(s, maxPrefix)
			}
		case jsoniter.NumberValue:
			v.kind = kindNumber
			v.num, _ = strconv.ParseFloat(string(raw), 64)
		}
		if len(raw) <= maxValueLen && len(raw) <= budget {
			v.json = string(raw)
			budget -= len(raw)
		}
		vals = append(vals, v)
		return true
	})
	if it.Error != nil {
		return nil, 0, false
	}
	return vals, digest, true
}
