package broker

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/assent-dev/assent/pkg/events"
)

// AuditQuery selects events from the audit log, the stream. Empty fields
// match everything.
type AuditQuery struct {
	RequestID string
	Agent     string
	// Principal matches answers by the principal, cancels by them, and
	// decisions they took part in.
	Principal string
	// Channel matches answers through the channel and decisions someone
	// took part in through it.
	Channel string
	// Rule matches events of requests under the rule: pending and escalated
	// events, decisions (rule or approval rule).
	Rule  string
	Types []string
	// Since and Until bound when the stream stored the event.
	Since, Until time.Time
	// After continues a previous query after this stream sequence.
	After uint64
	// Limit bounds the events returned; default 100, at most 1000.
	Limit int
}

// AuditPage is one page of the audit log.
type AuditPage struct {
	Events []*Event `json:"events"`
	// Next is the stream sequence to continue after (AuditQuery.After), or
	// zero when the log holds no more events up to Until.
	Next uint64 `json:"next,omitempty"`
}

// auditScanLimit bounds the messages one query reads; a query that matches
// rarely continues from AuditPage.Next.
const auditScanLimit = 100_000

// Audit returns the events of the audit log matching q, in stream order.
func (b *Broker) Audit(ctx context.Context, q AuditQuery) (AuditPage, error) {
	if q.Limit <= 0 {
		q.Limit = 100
	}
	q.Limit = min(q.Limit, 1000)
	first := q.After + 1
	subjects := allSubjects
	if q.RequestID != "" {
		if !events.ValidToken(q.RequestID) {
			return AuditPage{}, fmt.Errorf("%w: request %q", ErrInvalid, q.RequestID)
		}
		// The request's own subjects, its announcements on its agent's
		// pending subject, and its request message by sequence.
		rec, err := b.load(ctx, q.RequestID)
		if err != nil {
			return AuditPage{}, err
		}
		subjects = []string{
			events.ResponsePrefix + "*." + rec.ID, events.CancelPrefix + rec.ID, events.CancelPrefix + "*." + rec.ID, events.DecisionPrefix + rec.ID,
			events.RejectionPrefix + rec.ID, events.ShadowPrefix + rec.ID, events.RequestPrefix + rec.Request.Agent,
			events.PendingPrefix + rec.Request.Agent,
		}
		first = max(first, rec.RequestSeq)
	}
	var page AuditPage
	page.Events = []*Event{}
	read := 0
	since := q.Since
	if q.After != 0 {
		since = time.Time{} // the cursor is past it
	}
	err := b.scan(ctx, first, since, 0, subjects, func(e *Event) (bool, error) {
		read++
		if !q.Until.IsZero() && e.Time.After(q.Until) {
			page.Next = 0
			return false, nil
		}
		page.Next = e.Seq
		if q.match(e) {
			page.Events = append(page.Events, e)
		}
		return len(page.Events) < q.Limit && read < auditScanLimit, nil
	})
	if err != nil {
		return AuditPage{}, err
	}
	if len(page.Events) < q.Limit && read < auditScanLimit {
		page.Next = 0 // the end of the log
	}
	return page, nil
}

// match reports whether e is one q asks for.
func (q *AuditQuery) match(e *Event) bool {
	if q.RequestID != "" && e.RequestID != q.RequestID {
		return false
	}
	if q.Agent != "" && e.Agent != q.Agent {
		return false
	}
	if len(q.Types) > 0 && !slices.ContainsFunc(q.Types, func(t string) bool { return t == e.Type || t == shortType(e.Type) }) {
		return false
	}
	if !q.Since.IsZero() && e.Time.Before(q.Since) {
		return false
	}
	if q.Principal != "" || q.Channel != "" {
		if !slices.ContainsFunc(e.parts(), func(p part) bool {
			return (q.Principal == "" || p.principal == q.Principal) && (q.Channel == "" || p.channel == q.Channel)
		}) {
			return false
		}
	}
	if q.Rule != "" && e.str("rule") != q.Rule && e.str("approval_rule") != q.Rule && e.str("rule") != "limit:"+q.Rule {
		return false
	}
	return true
}

// part is one principal's part in an event, through a channel.
type part struct{ principal, channel string }

// parts lists who took part in e: the principal of an answer (from its
// subject) and its channel, who cancelled, and who decided.
func (e *Event) parts() []part {
	switch e.Type {
	case events.TypeResponded:
		if sub, err := events.ParseSubject(e.Subject); err == nil {
			return []part{{sub.Principal, e.str("channel")}}
		}
	case events.TypeCancel:
		var ce struct {
			Source string `json:"source"`
		}
		_ = json.Unmarshal(e.Event, &ce)
		return []part{{ce.Source, ""}}
	case events.TypeDecided:
		var by []events.DecidedBy
		_ = json.Unmarshal(e.data["decided_by"], &by)
		out := make([]part, len(by))
		for i, d := range by {
			out[i] = part{d.Principal, d.Channel}
		}
		return out
	}
	return nil
}
