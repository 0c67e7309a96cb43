package broker

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/assent-dev/assent/pkg/events"
)

// requestSeqHeader, on a decided event the broker published for a request it
// decided at once (decideNow), gives the stream sequence of the request
// message, so that the request can be read back with its decision. It is a
// NATS header, not part of the CloudEvent.
const requestSeqHeader = "Assent-Request-Seq"

// onSubject is what a request's decision subject holds first: the decision
// (decided, with its event id, on the message msg), or, for a broker that
// does not sign, a message that is not a decided event (forgery). last is
// the sequence of the last message read.
type onSubject struct {
	decided *events.Decided
	eventID string
	source  string
	msg     *jetstream.RawStreamMsg
	forgery string
	last    uint64
}

// firstOnSubject reads the decision of request id as readers take it: the
// first message on its decision subject or, for a broker that signs, the
// first that a trusted key signed (what comes before it no reader takes).
// Found nothing: a zero onSubject.
func (b *Broker) firstOnSubject(ctx context.Context, id string) (onSubject, error) {
	subj := events.DecisionPrefix + id
	var out onSubject
	for seq := uint64(1); ; {
		m, err := b.res.stream.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(subj))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return out, nil
		}
		if err != nil {
			return out, fmt.Errorf("look up decision of %s: %w", id, err)
		}
		out.last, seq = m.Sequence, m.Sequence+1
		e, err := events.Codec{MaxSize: b.maxEmit}.Decode(events.Header(m.Header), m.Data)
		if err == nil && b.trusted != nil {
			_, err = b.trusted.Verify(&e)
		}
		var d events.Decided
		if err == nil {
			d, err = events.DecodeDecided(&e)
		}
		if err == nil && d.RequestID != id {
			err = fmt.Errorf("decides request %q", d.RequestID)
		}
		if err == nil {
			out.decided, out.eventID, out.source, out.msg = &d, e.ID(), e.Source(), m
			return out, nil
		}
		if out.forgery == "" {
			out.forgery = describeDecision(m, &e, err)
		}
		if b.signer == nil {
			return out, nil // unsigned: the first message is what readers take
		}
	}
}

// brokers reports whether found, a decision on request id's subject, is a
// broker's. A broker that signs trusts its keys (firstOnSubject checked).
// Unsigned decisions carry no proof; one decided at once by a broker names
// its request message (requestSeqHeader), and it counts as a broker's if that
// message is the request id with the digest the decision names. Anything
// else on the subject is treated as before such decisions existed: as a
// forgery that keeps the broker's own decision off the stream.
func (b *Broker) brokers(ctx context.Context, id string, found *onSubject) (bool, error) {
	d := found.decided
	if d == nil {
		return false, nil
	}
	if b.signer != nil {
		return true, nil
	}
	seq, err := strconv.ParseUint(found.msg.Header.Get(requestSeqHeader), 10, 64)
	if err != nil || !d.Auto || d.RequestDigest == "" || !strings.HasPrefix(found.source, "broker/") {
		return false, nil
	}
	req, _, _, ok, err := b.requestAt(ctx, id, seq)
	if err != nil || !ok {
		return false, err
	}
	digest, err := events.RequestDigest(req)
	return err == nil && digest == d.RequestDigest, nil
}

// requestAt reads the request message at stream sequence seq, if it is a
// request with id: the request (its agent from the subject), its source and
// when the stream stored it.
func (b *Broker) requestAt(ctx context.Context, id string, seq uint64) (events.Requested, string, time.Time, bool, error) {
	m, err := b.res.stream.GetMsg(ctx, seq)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return events.Requested{}, "", time.Time{}, false, nil
	}
	if err != nil {
		return events.Requested{}, "", time.Time{}, false, fmt.Errorf("read the request of %s: %w", id, err)
	}
	sub, err := events.ParseSubject(m.Subject)
	if err != nil || sub.Kind != events.KindRequest {
		return events.Requested{}, "", time.Time{}, false, nil
	}
	e, err := b.codec.Decode(events.Header(m.Header), m.Data)
	if err != nil || e.ID() != id {
		return events.Requested{}, "", time.Time{}, false, nil
	}
	req, err := events.DecodeRequested(&e)
	if err != nil {
		return events.Requested{}, "", time.Time{}, false, nil
	}
	req.Agent = sub.Agent
	return req, e.Source(), m.Time.UTC(), true, nil
}

// adopt makes r record the decision found on its subject.
func (r *Record) adopt(found *onSubject) {
	d := found.decided
	r.State = State(d.Outcome)
	r.Decision = d
	r.DecisionEventID = found.eventID
	r.Replica = strings.TrimPrefix(found.source, "broker/")
	if d.Rule != "" {
		r.Rule = d.Rule
	}
	if seq, err := strconv.ParseUint(found.msg.Header.Get(requestSeqHeader), 10, 64); err == nil {
		r.Trigger = seq
	}
}

// loadDecided reads back request id decided with no state entry (decideNow):
// its decision from its decision subject and the request from the message the
// decision names. A decision whose request cannot be read (or does not match
// the decision's request digest) is returned with what the decision says.
func (b *Broker) loadDecided(ctx context.Context, id string) (Record, error) {
	found, err := b.firstOnSubject(ctx, id)
	if err != nil {
		return Record{}, err
	}
	switch ok, err := b.brokers(ctx, id, &found); {
	case err != nil:
		return Record{}, err
	case !ok:
		return Record{}, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	rec := Record{ID: id, RequestDigest: found.decided.RequestDigest}
	rec.adopt(&found)
	rec.Deadline = found.decided.DecidedAt
	if rec.Trigger == 0 {
		return rec, nil
	}
	req, source, at, ok, err := b.requestAt(ctx, id, rec.Trigger)
	if err != nil {
		return Record{}, err
	}
	if !ok {
		return rec, nil
	}
	if digest, err := events.RequestDigest(req); err != nil || digest != rec.RequestDigest {
		return rec, nil
	}
	rec.Request, rec.Source, rec.RequestSeq, rec.ReceivedAt = req, source, rec.Trigger, at
	rec.Deadline = rec.ReceivedAt.Add(b.cfg.clamp(req.Timeout.Std()))
	return rec, nil
}
