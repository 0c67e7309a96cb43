package broker

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/assent-dev/assent/pkg/events"
)

// maxCASAttempts bounds the read-modify-write loop; contention on one request is
// at most a handful of racing answers, so this is never reached in practice.
const maxCASAttempts = 64

// errNotDue means a timeout fired before the (possibly extended) deadline.
var errNotDue = errors.New("deadline not reached")

// errPublishPending: an outcome is stored and its decided event not yet on the
// stream, and the broker that chose it may still be publishing it.
var errPublishPending = errors.New("decision stored but not yet published")

// origin is the stored message whose handling asks for a change. Every outcome
// is chosen while handling one (a request, an answer, a cancel or a timeout),
// the record keeps its sequence (Record.Trigger), and the message is
// acknowledged only once the decided event is on the stream: if the broker
// dies in between, the message comes back and its redelivery publishes the
// decision (complete).
type origin struct {
	seq uint64    // stream sequence
	at  time.Time // when the stream stored it
	// delivery counts the broker consumer's deliveries of the message; 0
	// when the HTTP gateway applies a message it has just published.
	delivery uint64
	// answer marks an answer or a cancel: it must have been stored after the
	// request it names.
	answer bool
	// agent, on a cancel published on assent.cancel.<agent>.<id>, is the
	// agent it comes from: it may cancel only that agent's requests.
	agent string
}

func originOf(msg jetstream.Msg) (origin, error) {
	md, err := msg.Metadata()
	if err != nil {
		return origin{}, err
	}
	return origin{seq: md.Sequence.Stream, at: md.Timestamp, delivery: md.NumDelivered}, nil
}

// load returns the record of request id: from the ledger while it is open,
// from the index while it keeps it, else from the stream (its first stored
// decision, and the request that decision names), or ErrNotFound.
func (b *Broker) load(ctx context.Context, id string) (Record, error) {
	if rec, ok, err := b.view(ctx, id); err != nil {
		return rec, err
	} else if ok {
		if !rec.judging || b.now().Sub(rec.ReceivedAt) < orphanCheck {
			return rec, nil
		}
		// Judged by now, unless it is a copy of a request decided before
		// what the index keeps, whose handler ran on another replica.
		first, err := b.firstDecision(ctx, id)
		if err != nil || first.Sequence > rec.RequestSeq {
			return rec, nil
		}
		b.ledger.adoptOrphan(id, first)
		if rec, ok, err := b.view(ctx, id); ok || err != nil {
			return rec, err
		}
	}
	if rec, trimmed, ok := b.index.getDecided(id); ok && !trimmed {
		return rec, nil
	}
	return b.loadStored(ctx, id)
}

// orphanCheck is how long after its request a request still being judged
// makes a read look for an older decision.
const orphanCheck = 5 * time.Second

// loadStored reads the decision of request id from the stream, and the
// request it decides: ErrNotFound when the stream holds no decision.
func (b *Broker) loadStored(ctx context.Context, id string) (Record, error) {
	m, err := b.firstDecision(ctx, id)
	if err != nil {
		return Record{}, err
	}
	e, err := b.codec.Decode(events.Header(m.Header), m.Data)
	if err != nil {
		return Record{}, fmt.Errorf("decision of %s at stream sequence %d: %w", id, m.Sequence, err)
	}
	d, err := events.DecodeDecided(&e)
	if err != nil {
		return Record{}, fmt.Errorf("decision of %s at stream sequence %d: %w", id, m.Sequence, err)
	}
	rec := Record{ID: id, State: State(d.Outcome), Decision: &d, DecisionEventID: e.ID(), RequestSeq: d.RequestSeq,
		RequestDigest: d.RequestDigest, ReceivedAt: d.DecidedAt, Deadline: d.DecidedAt, revision: m.Sequence}
	if old, _, ok := b.index.getDecided(id); ok && old.DecisionEventID == rec.DecisionEventID {
		// The index's record, short of the request's content: what the
		// stream does not say (the rule, deadlines, trigger, grant) is there.
		old.Decision = rec.Decision
		rec = old
	} else if ok {
		rec.Forgery = old.Forgery
	}
	rec.partial = false
	if d.RequestSeq == 0 {
		return rec, nil
	}
	rm, err := b.getSeq(ctx, d.RequestSeq)
	if err != nil {
		return rec, nil // gone with retention: the decision says enough
	}
	rec.ReceivedAt = rm.Time.UTC()
	if re, err := b.codec.Decode(events.Header(rm.Header), rm.Data); err == nil {
		if req, err := events.DecodeRequested(&re); err == nil {
			req.Agent = strings.TrimPrefix(rm.Subject, events.RequestPrefix)
			rec.Request, rec.Source = req, re.Source()
			if rec.RequestDigest == "" {
				rec.RequestDigest, _ = events.RequestDigest(req)
			}
		}
	}
	if len(rec.Decision.Args) == 0 {
		rec.Decision.Args = rec.Request.Args
	}
	return rec, nil
}

// decisionFits refuses a decision that would not fit the stream, with room
// for a signature and trace context: an answer whose payload or edited args
// would make one is refused, before it decides anything.
func (b *Broker) decisionFits(r *Record) error {
	e, err := events.New(events.TypeDecided, r.DecisionEventID, b.source, r.Decision)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	h, body, err := events.Encode(&e)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	if size := len(body) + wireHeaderSize(nats.Header(h)) + publishHeaderRoom + decisionRoom; size > b.maxEmit {
		return fmt.Errorf("%w: %w: the decision would be %d bytes, over the stream's limit of %d", ErrInvalid, events.ErrTooLarge, size, b.maxEmit)
	}
	return nil
}

// decisionRoom is what a decision's signature and trace context add.
const decisionRoom = 1024

// requestAt reads request id's request message, at stream sequence seq, and
// returns the record of the request it makes, still to be judged.
func (b *Broker) requestAt(ctx context.Context, id string, seq uint64) (Record, error) {
	m, err := b.getSeq(ctx, seq)
	if err != nil {
		return Record{}, fmt.Errorf("read request %s at stream sequence %d: %w", id, seq, err)
	}
	e, err := b.codec.Decode(events.Header(m.Header), m.Data)
	if err != nil {
		return Record{}, fmt.Errorf("request %s at stream sequence %d: %w", id, seq, err)
	}
	req, err := events.DecodeRequested(&e)
	if err != nil {
		return Record{}, fmt.Errorf("request %s at stream sequence %d: %w", id, seq, err)
	}
	req.Agent = strings.TrimPrefix(m.Subject, events.RequestPrefix)
	digest, _ := events.RequestDigest(req)
	at := m.Time.UTC()
	return Record{ID: id, State: StatePending, Request: req, RequestDigest: digest, RequestSeq: seq, ReceivedAt: at,
		Source: e.Source(), Deadline: at.Add(b.cfg.clamp(req.Timeout.Std())).UTC()}, nil
}

// getSeq reads the message at stream sequence seq, from the stream's leader
// on a cluster.
func (b *Broker) getSeq(ctx context.Context, seq uint64) (*jetstream.RawStreamMsg, error) {
	if b.cfg.Replicas <= 1 {
		cctx, cancel := callCtx(ctx)
		defer cancel()
		return b.res.stream.GetMsg(cctx, seq)
	}
	m, err := b.leaderMsg(ctx, StreamName, map[string]any{"seq": seq}, fmt.Sprintf("stream sequence %d", seq))
	switch {
	case err != nil:
		return nil, err
	case m == nil:
		return nil, fmt.Errorf("stream sequence %d: %w", seq, jetstream.ErrMsgNotFound)
	}
	return m.raw(), nil
}

// settleAt handles the stored message o about request id (an answer, a
// cancel, an expiry batch): once the ledger has applied o, it publishes the
// decision o's arrival makes, if any, and returns the request's state.
// A redelivered o is handled once the ledger has read everything stored
// when it came back, so that what its first handling stored is known.
func (b *Broker) settleAt(ctx context.Context, id string, o origin) (Record, status, error) {
	if err := b.ledger.await(ctx, o.seq); err != nil {
		return Record{}, status{}, err
	}
	if o.delivery > 1 {
		if err := b.ledger.catchUp(ctx); err != nil {
			return Record{}, status{}, err
		}
	}
	st, err := b.status(ctx, id, o.seq, true)
	if err != nil {
		return Record{}, st, err
	}
	if !st.known {
		rec, err := b.load(ctx, id)
		if err == nil && rec.Trigger == o.seq {
			b.storeGrant(ctx, &rec) // its handling stopped before the grant
		}
		return rec, st, err
	}
	if st.prop != nil && st.prop.Trigger == o.seq {
		rec, err := b.fix(ctx, st.prop)
		return rec, st, err
	}
	return st.rec, st, nil
}

// fix publishes the decision prop, which a stored message's arrival made,
// and returns the decision stored: prop, or one stored first (then prop
// was never seen by anyone). It publishes the same event until the server
// answers: stored, or refused as a second decision, when it reads the
// first message of the subject from the stream's leader, and finds its own
// event (an attempt whose acknowledgement was lost) or another.
func (b *Broker) fix(ctx context.Context, prop *Record) (Record, error) {
	if prop.rebuild != nil {
		full, err := b.requestAt(ctx, prop.ID, prop.RequestSeq)
		if err != nil {
			return Record{}, err
		}
		if err := prop.rebuild(&full); err != nil {
			return Record{}, err
		}
		full.Trigger, full.DecisionEventID, full.revision = prop.Trigger, prop.DecisionEventID, prop.revision
		full.Decision.RequestSeq = full.RequestSeq
		prop = &full
	}
	msg, err := b.decisionMsg(ctx, prop)
	if err != nil {
		return Record{}, err
	}
	if b.afterCommit != nil {
		b.afterCommit(prop.ID)
	}
	b.ledger.local.Store(prop.ID, *prop)
	own, found, err := b.publishDecision(ctx, prop, msg)
	if err != nil {
		return *prop, err
	}
	if !own {
		b.ledger.local.Delete(prop.ID)
		// Another outcome was stored first: that is the decision.
		rec, err := b.adopt(ctx, prop.ID, found)
		if err == nil {
			b.log.Info("another decision was stored first; it stands", zap.String("request_id", prop.ID),
				zap.String("stored", string(rec.State)), zap.String("built", string(prop.State)))
		}
		return rec, err
	}
	if b.afterPublish != nil {
		b.afterPublish(prop.ID)
	}
	if found.Data == nil {
		// Stored by this publish (found from its acknowledgement, not
		// read back): counted once, whichever handling stored it, and
		// before the wait below, whose failure has the message handled
		// again, which then finds the decision stored and counts nothing.
		b.metrics.decided(prop)
		b.observe(prop)
	}
	// Readers of this replica (listings, GET, the HTTP answer's reply) see
	// the decision once the ledger has read it.
	if err := b.ledger.await(ctx, found.Sequence); err != nil {
		return *prop, err
	}
	// Written after the decision: a grant written before could outlive an
	// answer whose decision lost.
	b.storeGrant(ctx, prop)
	b.copyToAgent(prop.Request.Agent, "decided", prop.ID, msg)
	return *prop, nil
}

// adopt returns the record of request id decided by the stored message
// first, which the ledger reads in its turn, or has read before this
// replica took a later copy of the request for a new one (the decision was
// older than what its index keeps).
func (b *Broker) adopt(ctx context.Context, id string, first *jetstream.RawStreamMsg) (Record, error) {
	if err := b.ledger.await(ctx, first.Sequence); err != nil {
		return Record{}, err
	}
	b.ledger.adoptOrphan(id, first)
	return b.load(ctx, id)
}

// A publish refused because another write on the decision subject was in
// flight is tried again up to maxInFlightRefusals times, inFlightDelay
// apart: the other write is stored or refused within a round trip.
const (
	maxInFlightRefusals = 8
	inFlightDelay       = 5 * time.Millisecond
)

// publishDecision publishes r's decided event msg with an expected last
// subject sequence of 0, so that the stream refuses it if the decision
// subject holds a message already. It reports whether the decision stored
// is r's own (stored now, or by an earlier attempt), and the message stored
// first: only its subject and sequence, without data, when this publish
// stored it. A broker that signs its decisions
// publishes after messages no trusted key signed (publishSigned).
func (b *Broker) publishDecision(ctx context.Context, r *Record, msg *nats.Msg) (own bool, found *jetstream.RawStreamMsg, err error) {
	if b.signer != nil {
		return b.publishSigned(ctx, r, msg)
	}
	for attempt := 0; ; attempt++ {
		var ack *jetstream.PubAck
		ack, err = b.publish(ctx, msg, jetstream.WithExpectLastSequencePerSubject(0))
		if err == nil {
			return true, &jetstream.RawStreamMsg{Subject: msg.Subject, Sequence: ack.Sequence}, nil
		}
		if !isWrongLastSeq(err) && (!unavailable(err) || attempt >= 3 || ctx.Err() != nil) {
			break
		}
		if !isWrongLastSeq(err) {
			continue // the same bytes again: stored, or refused
		}
		m, gerr := b.firstDecision(ctx, r.ID)
		if errors.Is(gerr, ErrNotFound) && attempt < maxInFlightRefusals {
			// Refused while another write on the subject was in flight
			// (JetStream's 10164), which may not be stored: try again.
			time.Sleep(inFlightDelay)
			continue
		}
		if gerr != nil {
			return false, nil, fmt.Errorf("decision of %s: refused as a second decision, and the first could not be read: %w", r.ID, gerr)
		}
		return eventID(m.Header, m.Data) == r.DecisionEventID, m, nil
	}
	// No answer: the decision may be stored. Read the subject; never judge
	// again while it may still land.
	m, gerr := b.firstDecision(ctx, r.ID)
	switch {
	case gerr == nil:
		return eventID(m.Header, m.Data) == r.DecisionEventID, m, nil
	case errors.Is(gerr, ErrNotFound):
		return false, nil, fmt.Errorf("publish decision of %s: %w", r.ID, err)
	}
	return false, nil, fmt.Errorf("publish decision of %s: %w (and reading it back: %w)", r.ID, err, gerr)
}

// publishSigned publishes r's signed decided event once. Readers take the
// first event on the decision subject that a trusted key signed, so what
// else the subject holds does not matter, only that none of it is a
// decision already: the event is published with the expected last subject
// sequence of what was read, and a message added meanwhile sends the
// broker back to read again.
func (b *Broker) publishSigned(ctx context.Context, r *Record, msg *nats.Msg) (bool, *jetstream.RawStreamMsg, error) {
	var last uint64
	for range maxCASAttempts {
		ack, err := b.publish(ctx, msg, jetstream.WithExpectLastSequencePerSubject(last))
		if err != nil && !isWrongLastSeq(err) && !unavailable(err) {
			return false, nil, err
		}
		if err == nil {
			return true, &jetstream.RawStreamMsg{Subject: msg.Subject, Sequence: ack.Sequence}, nil
		}
		found, next, serr := b.scanSigned(ctx, r)
		switch {
		case serr != nil:
			return false, nil, serr
		case found != nil:
			return eventID(found.Header, found.Data) == r.DecisionEventID, found, nil
		}
		last = next
	}
	return false, nil, fmt.Errorf("decision of %s: its subject changed %d times while publishing", r.ID, maxCASAttempts)
}

// scanSigned reads r's decision subject in order until it finds a decided
// event a trusted key signed: the decision. It returns that message (nil
// if none), and the sequence of the last message read.
func (b *Broker) scanSigned(ctx context.Context, r *Record) (found *jetstream.RawStreamMsg, last uint64, err error) {
	subj := events.DecisionPrefix + r.ID
	for seq := uint64(1); ; {
		m, err := b.leaderMsg(ctx, StreamName, map[string]any{"seq": seq, "next_by_subj": subj}, "look up decision of "+r.ID)
		if err != nil || m == nil {
			return nil, last, err
		}
		last, seq = m.Seq, m.Seq+1
		e, err := b.codec.Decode(events.Header(m.header()), m.Data)
		if err == nil {
			_, err = b.trusted.Verify(&e)
		}
		if err == nil {
			return m.raw(), last, nil
		}
	}
}

// firstDecision reads the first message stored on id's decision subject
// from the stream's leader (a direct get may be answered by a replica
// behind it): the decision, since the broker publishes it only where none
// exists. A message added after it is not the decision, whatever it says.
// ErrNotFound when there is none.
func (b *Broker) firstDecision(ctx context.Context, id string) (*jetstream.RawStreamMsg, error) {
	if b.cfg.Replicas <= 1 {
		cctx, cancel := callCtx(ctx)
		defer cancel()
		m, err := b.res.stream.GetMsg(cctx, 1, jetstream.WithGetMsgSubject(events.DecisionPrefix+id))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return nil, fmt.Errorf("%w: %s", ErrNotFound, id)
		}
		return m, err
	}
	m, err := b.leaderMsg(ctx, StreamName, map[string]any{"seq": 1, "next_by_subj": events.DecisionPrefix + id}, "look up decision of "+id)
	switch {
	case err != nil:
		return nil, err
	case m == nil:
		return nil, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	return m.raw(), nil
}

func isWrongLastSeq(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) &&
		(apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence || apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant)
}

// decisionMsg builds r's decided event as the replica that chose the outcome
// publishes it, carrying the trace context of ctx, and checks that it fits
// the stream.
func (b *Broker) decisionMsg(ctx context.Context, r *Record) (*nats.Msg, error) {
	if r.Decision == nil {
		return nil, fmt.Errorf("record %s is %s but has no decision", r.ID, r.State)
	}
	source := b.source
	if r.Replica != "" {
		source = "broker/" + r.Replica
	}
	e, err := events.New(events.TypeDecided, r.DecisionEventID, source, r.Decision)
	if err != nil {
		return nil, err
	}
	e.SetTime(r.Decision.DecidedAt)
	setEventTrace(ctx, &e)
	if b.signer != nil {
		if err := b.signer.Sign(&e); err != nil {
			return nil, fmt.Errorf("sign the decision of %s: %w", r.ID, err)
		}
	}
	subj, err := events.DecisionSubject(r.ID)
	if err != nil {
		return nil, err
	}
	return b.encode(subj, &e)
}

// encode builds the NATS message for an event the broker publishes, and
// refuses one that would not fit the stream: the broker never stores an
// outcome or a request it cannot publish.
func (b *Broker) encode(subject string, e *events.Event) (*nats.Msg, error) {
	h, body, err := events.Encode(e)
	if err != nil {
		return nil, err
	}
	msg := &nats.Msg{Subject: subject, Header: nats.Header(h), Data: body}
	if size := len(body) + wireHeaderSize(msg.Header) + publishHeaderRoom; size > b.maxEmit {
		return nil, fmt.Errorf("%w: %w: the %s event would be %d bytes, over the stream's limit of %d", ErrInvalid, events.ErrTooLarge, shortType(e.Type()), size, b.maxEmit)
	}
	return msg, nil
}

func shortType(t string) string {
	const prefix = "dev.assent.approval."
	if len(t) > len(prefix) && t[:len(prefix)] == prefix {
		return t[len(prefix):]
	}
	return t
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
