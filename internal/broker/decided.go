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
const requestSeqHeader = events.RequestSeqHeader

// readTimeout bounds a read of the stream on the request path: a read whose
// answer is lost (a node stopping, a connection replaced) fails and its
// message is tried again, instead of holding the request for the handler's
// whole time.
const readTimeout = 2 * time.Second

// onSubject is what a request's decision subject holds first: the decision
// (decided, with its event id and source, on the message msg; reqSeq is its
// requestSeqHeader, 0 without one), or, for a broker that does not sign, a
// message that is not a decided event (forgery). last is the sequence of the
// last message read.
type onSubject struct {
	decided *events.Decided
	eventID string
	source  string
	reqSeq  uint64
	msg     *jetstream.RawStreamMsg
	forgery string
	last    uint64
}

// storedRequest is a request message read back: the request (its agent from
// the subject), its source, and when the stream stored it.
type storedRequest struct {
	req    events.Requested
	source string
	at     time.Time
}

// firstOnSubject reads the decision of request id as readers take it: the
// first message on its decision subject or, for a broker that signs, the
// first that a trusted key signed (what comes before it no reader takes).
// Found nothing: a zero onSubject.
func (b *Broker) firstOnSubject(ctx context.Context, id string) (onSubject, error) {
	ctx, cancel := context.WithTimeout(ctx, readTimeout)
	defer cancel()
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
			out.reqSeq, _ = strconv.ParseUint(m.Header.Get(requestSeqHeader), 10, 64)
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
// broker's, and returns the request message it names if it read it. A broker
// that signs trusts its keys (firstOnSubject checked). Unsigned decisions
// carry no proof; one decided at once by a broker names its request message
// (requestSeqHeader), and it counts as a broker's if that message is the
// request id with the digest the decision names. Anything else on the
// subject is treated as before such decisions existed: as a forgery that
// keeps the broker's own decision off the stream.
func (b *Broker) brokers(ctx context.Context, id string, found *onSubject) (bool, *storedRequest, error) {
	d := found.decided
	switch {
	case d == nil:
		return false, nil, nil
	case b.signer != nil:
		return true, nil, nil
	case found.reqSeq == 0 || !d.Auto || d.RequestDigest == "" || !strings.HasPrefix(found.source, "broker/"):
		return false, nil, nil
	}
	sr, err := b.requestAt(ctx, id, found.reqSeq, d.RequestDigest)
	return sr != nil, sr, err
}

// requestAt reads the request message at stream sequence seq, if it is
// request id with the given request digest; nil if it is not.
func (b *Broker) requestAt(ctx context.Context, id string, seq uint64, digest string) (*storedRequest, error) {
	ctx, cancel := context.WithTimeout(ctx, readTimeout)
	defer cancel()
	m, err := b.res.stream.GetMsg(ctx, seq)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read the request of %s: %w", id, err)
	}
	sub, err := events.ParseSubject(m.Subject)
	if err != nil || sub.Kind != events.KindRequest {
		return nil, nil
	}
	e, err := b.codec.Decode(events.Header(m.Header), m.Data)
	if err != nil || e.ID() != id {
		return nil, nil
	}
	req, err := events.DecodeRequested(&e)
	if err != nil {
		return nil, nil
	}
	req.Agent = sub.Agent
	if got, err := events.RequestDigest(req); err != nil || got != digest {
		return nil, nil
	}
	return &storedRequest{req: req, source: e.Source(), at: m.Time.UTC()}, nil
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
	if found.reqSeq != 0 {
		r.Trigger = found.reqSeq
	}
}

// conflictWith is the ErrIDConflict of a request with digest whose id d, a
// decision about another request, holds.
func conflictWith(d *events.Decided, id, digest string) error {
	if d.RequestDigest == "" || d.RequestDigest == digest {
		return nil
	}
	return fmt.Errorf("%w: %s was decided (%s) as a request with digest %s; this one is %s", ErrIDConflict, id, d.Outcome, d.RequestDigest, digest)
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
	ours, sr, err := b.brokers(ctx, id, &found)
	switch {
	case err != nil:
		return Record{}, err
	case !ours:
		return Record{}, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	rec := Record{ID: id, RequestDigest: found.decided.RequestDigest}
	rec.adopt(&found)
	rec.Deadline = found.decided.DecidedAt
	if sr == nil && found.reqSeq != 0 {
		// Signed: trusted without reading the request; read it now.
		if sr, err = b.requestAt(ctx, id, found.reqSeq, rec.RequestDigest); err != nil {
			return Record{}, err
		}
	}
	if sr != nil {
		rec.Request, rec.Source, rec.RequestSeq, rec.ReceivedAt = sr.req, sr.source, found.reqSeq, sr.at
		rec.Deadline = rec.ReceivedAt.Add(b.cfg.clamp(sr.req.Timeout.Std()))
	}
	return rec, nil
}
