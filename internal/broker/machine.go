package broker

import (
	"context"
	"errors"
	"fmt"
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

// load reads the record of id.
func (b *Broker) load(ctx context.Context, id string) (Record, error) {
	var (
		value    []byte
		revision uint64
	)
	cctx, cancel := callCtx(ctx)
	entry, err := b.res.state.Get(cctx, id)
	cancel()
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound) && b.cfg.Replicas > 1:
		// The bucket's get is a direct get, which any of its stream's
		// replicas may answer, and one cut off from the others answers from
		// what it had then. An answer refused as naming no request is
		// final, so the leader has the last word. (A bucket of one replica
		// has no other to be behind.)
		value, revision, err = b.leaderGet(ctx, id)
		if err != nil {
			return Record{}, err
		}
	case errors.Is(err, jetstream.ErrKeyNotFound), errors.Is(err, jetstream.ErrKeyDeleted):
		return Record{}, fmt.Errorf("%w: %s", ErrNotFound, id)
	case err != nil:
		return Record{}, fmt.Errorf("read state of %s: %w", id, err)
	default:
		value, revision = entry.Value(), entry.Revision()
	}
	rec, err := decodeRecord(value, revision)
	if err == nil {
		// What this replica reads, its listings show, even before the
		// state watcher brings it (put keeps the newest revision).
		b.index.put(rec)
		b.note(rec)
	}
	return rec, err
}

// knownRecords bounds the records a replica keeps from its own writes and
// reads (Broker.known).
const knownRecords = 8192

// note keeps rec, unless a newer revision of it is kept already, for
// transition to start from.
func (b *Broker) note(rec Record) {
	b.known.Update(rec.ID, rec, func(r, old Record) bool { return r.revision > old.revision })
}

// transition applies change, on behalf of the message o, to the pending record
// of id and stores the result with a compare-and-set on the revision it read,
// retrying on conflict. This is the only place an outcome is chosen; once it
// is stored, its decided event is published before transition returns.
//
// stored reports whether this call stored change's result (and not, say, a
// racing replica's handling of the same message). A record that is already
// terminal is returned unchanged with its terminalErr, unless o itself decided
// it (a redelivery), in which case the decision is made sure of and nil
// returned. An answer or cancel stored before its request is refused with
// ErrBeforeRequest.
func (b *Broker) transition(ctx context.Context, id string, o origin, change func(r *Record) error) (rec Record, stored bool, err error) {
	for attempt := range maxCASAttempts {
		// Start from the record this replica last stored or read, if it
		// has one: the compare-and-set refuses the write if it is stale,
		// and the next attempt reads the bucket.
		cached := false
		if attempt == 0 {
			rec, cached = b.known.Get(id)
		}
		if !cached {
			if rec, err = b.load(ctx, id); err != nil {
				return Record{}, false, err
			}
		}
		if o.answer && o.seq != 0 && o.seq < rec.RequestSeq {
			return rec, false, fmt.Errorf("%w: %s: the answer is at stream sequence %d, the request at %d, so nobody could have seen the request", ErrBeforeRequest, id, o.seq, rec.RequestSeq)
		}
		if rec.applied(o.seq) {
			if rec.State.Terminal() && rec.Trigger == o.seq {
				return rec, false, b.complete(ctx, &rec, o)
			}
			return rec, false, nil
		}
		if rec.State.Terminal() {
			return rec, false, rec.terminalErr()
		}
		next := rec
		if err := change(&next); err != nil {
			return rec, false, err
		}
		var decision *nats.Msg
		if next.State.Terminal() {
			next.Trigger, next.Replica = o.seq, b.cfg.Name
			// An outcome is stored only if its event fits the stream.
			if decision, err = b.decisionMsg(ctx, &next); err != nil {
				return rec, false, err
			}
		}
		val, err := b.encodeRecord(&next)
		if err != nil {
			return rec, false, err
		}
		cctx, cancel := callCtx(ctx)
		rev, err := b.res.state.Update(cctx, id, val, rec.revision)
		cancel()
		if errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			continue // someone else wrote first; look again
		}
		if err != nil {
			return rec, false, fmt.Errorf("store state of %s: %w", id, err)
		}
		next.revision = rev
		// Listings read the index: show this replica's own write at once,
		// not when the state watcher brings it back.
		b.index.put(next)
		b.note(next)
		if next.State.Terminal() {
			return next, true, b.decided(ctx, &next, decision, o)
		}
		return next, true, nil
	}
	return Record{}, false, fmt.Errorf("state of %s: too much contention", id)
}

// decided runs after an outcome was stored on behalf of o: publish it, stop
// the timers. A publish that fails is returned, so that o is redelivered and
// its redelivery publishes (complete) — except when the gateway applied o: the
// broker's consumer still holds o then and will publish it.
func (b *Broker) decided(ctx context.Context, r *Record, decision *nats.Msg, o origin) error {
	if b.afterCommit != nil {
		b.afterCommit(r.ID)
	}
	b.timers.stop(r.ID)
	b.metrics.decided(r)
	b.observe(r)
	b.storeGrant(ctx, r)
	if err := b.publishDecision(ctx, r, decision); err != nil {
		if o.delivery == 0 && !errors.Is(err, ErrForgedDecision) {
			b.log.Warn("publish decision failed; the broker's consumer will publish it", zap.String("request_id", r.ID), zap.Error(err))
			return nil
		}
		return err
	}
	if b.afterPublish != nil && r.Trigger == r.RequestSeq {
		b.afterPublish(r.ID)
	}
	return nil
}

// complete makes sure the decision that message o chose for r is on the
// stream: o is being handled again after r was stored.
//
// On a redelivery the handling that chose the outcome stopped before
// acknowledging, so it publishes now. On the first delivery to the consumer
// the gateway chose the outcome, and may be publishing it right now: look
// again after AckWait. When the gateway finds the consumer was first, the
// consumer owns the publish.
func (b *Broker) complete(ctx context.Context, r *Record, o origin) error {
	switch published, err := b.published(ctx, r); {
	case err != nil:
		return err
	case published:
		return nil // and its grant was stored before it was published
	}
	// The broker that stored the outcome may still be running (the gateway
	// and the consumer both apply an HTTP answer) or may have died: either
	// way the grant is in the bucket once this returns.
	b.storeGrant(ctx, r)
	switch o.delivery {
	case 0:
		return nil
	case 1:
		return &retryError{fmt.Errorf("%w: %s", errPublishPending, r.ID), b.cfg.AckWait}
	}
	b.log.Warn("publishing a decision whose handling stopped before it was published", zap.String("request_id", r.ID), zap.Uint64("trigger", r.Trigger))
	msg, err := b.decisionMsg(ctx, r)
	if err != nil {
		return err
	}
	return b.publishDecision(ctx, r, msg)
}

// publishDecision publishes r's decided event, built by decisionMsg, exactly
// once: with an expected last subject sequence of 0 the stream refuses it if
// the decision subject holds a message already. That message is then either
// the same event (an earlier attempt whose acknowledgement was lost) or one
// this broker did not make, and ErrForgedDecision is returned. A broker that
// signs its decisions publishes after a forgery instead (publishSigned).
func (b *Broker) publishDecision(ctx context.Context, r *Record, msg *nats.Msg) (err error) {
	defer func() {
		if err == nil {
			b.copyToAgent(r.Request.Agent, "decided", r.ID, msg)
		}
	}()
	if b.signer != nil {
		return b.publishSigned(ctx, r, msg)
	}
	_, err = b.publish(ctx, msg, jetstream.WithExpectLastSequencePerSubject(0))
	if !isWrongLastSeq(err) {
		return err
	}
	switch published, err := b.published(ctx, r); {
	case err != nil:
		return err
	case !published:
		return fmt.Errorf("decision of %s: the stream refused it as a second decision but holds none", r.ID)
	}
	return nil
}

// publishSigned publishes r's signed decided event once. Readers take the
// first event on the decision subject that a trusted key signed, so what
// else the subject holds does not matter, only that none of it is r's
// decision already: the event is published with the expected last subject
// sequence of what was read, and a message added meanwhile (a racing
// replica's copy, another forgery) sends the broker back to read again.
func (b *Broker) publishSigned(ctx context.Context, r *Record, msg *nats.Msg) error {
	var last uint64
	for range maxCASAttempts {
		_, err := b.publish(ctx, msg, jetstream.WithExpectLastSequencePerSubject(last))
		if !isWrongLastSeq(err) {
			return err
		}
		published, seq, err := b.scanSigned(ctx, r)
		if err != nil || published {
			return err
		}
		last = seq
	}
	return fmt.Errorf("decision of %s: its subject changed %d times while publishing", r.ID, maxCASAttempts)
}

// published reports whether r's decided event is on its decision subject:
// the first message there, or for a broker that signs, the first message a
// trusted key signed (scanSigned). If an unsigned broker finds another
// message first, it logs and counts the forgery and returns
// ErrForgedDecision.
func (b *Broker) published(ctx context.Context, r *Record) (bool, error) {
	if b.signer != nil {
		published, _, err := b.scanSigned(ctx, r)
		return published, err
	}
	m, err := b.firstDecision(ctx, r.ID)
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("look up decision of %s: %w", r.ID, err)
	}
	e, derr := events.Codec{MaxSize: b.maxEmit}.Decode(events.Header(m.Header), m.Data)
	if derr == nil && e.ID() == r.DecisionEventID {
		return true, nil
	}
	found := describeDecision(m, &e, nil)
	b.forged(ctx, r, found, "the stream holds a decision this broker did not make; its own cannot be published")
	return false, fmt.Errorf("%w: request %s: %s, not event %s", ErrForgedDecision, r.ID, found, r.DecisionEventID)
}

// scanSigned reads r's decision subject in order until it finds r's own
// decided event signed by a trusted key. It reports whether it did, and the
// sequence of the last message it read. The messages before it are
// forgeries, being signed by no trusted key: they are logged and counted
// once per request, and do not stop the broker. A decided event for r that a
// trusted key signed but that is not r's decision is ErrForgedDecision: a
// decision key is in other hands.
func (b *Broker) scanSigned(ctx context.Context, r *Record) (published bool, last uint64, err error) {
	subj := events.DecisionPrefix + r.ID
	found := ""
	for seq := uint64(1); ; {
		cctx, cancel := callCtx(ctx)
		m, err := b.res.stream.GetMsg(cctx, seq, jetstream.WithGetMsgSubject(subj))
		cancel()
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			break
		}
		if err != nil {
			return false, last, fmt.Errorf("look up decision of %s: %w", r.ID, err)
		}
		last, seq = m.Sequence, m.Sequence+1
		e, err := events.Codec{MaxSize: b.maxEmit}.Decode(events.Header(m.Header), m.Data)
		if err == nil {
			_, err = b.trusted.Verify(&e)
		}
		if err == nil && e.ID() == r.DecisionEventID {
			published = true
			break
		}
		if err == nil {
			what := describeDecision(m, &e, nil)
			b.forged(ctx, r, what, "the stream holds a decision signed by a trusted decision key that this broker did not make")
			return false, last, fmt.Errorf("%w: request %s: %s is signed by a trusted key, but the decision is event %s", ErrForgedDecision, r.ID, what, r.DecisionEventID)
		}
		if found == "" {
			found = describeDecision(m, &e, err)
		}
	}
	if found != "" {
		b.forged(ctx, r, found, "the stream holds a decided event no trusted key signed; the broker's own signed decision follows it")
	}
	return published, last, nil
}

// describeDecision names a message found on a decision subject, for logs
// and the record's Forgery.
func describeDecision(m *jetstream.RawStreamMsg, e *events.Event, err error) string {
	if err != nil && e.ID() == "" {
		return fmt.Sprintf("stream sequence %d (not a decided event: %v)", m.Sequence, err)
	}
	found := fmt.Sprintf("stream sequence %d (event %q from %q)", m.Sequence, e.ID(), e.Source())
	if err != nil {
		found += ": " + err.Error()
	}
	return found
}

// forged logs and counts a forged decision of r, described by found, once
// per request whichever replica and retry finds it first.
func (b *Broker) forged(ctx context.Context, r *Record, found, msg string) {
	if b.reportForgery(ctx, r.ID, found) {
		b.metrics.nForged.Add(1)
		b.log.Error(msg, zap.String("request_id", r.ID), zap.String("outcome", string(r.State)),
			zap.String("found", found), zap.String("want_event_id", r.DecisionEventID))
	}
}

// reportForgery records in id's state that its decision subject holds a
// message the broker did not make (found describes it). It reports whether
// this call recorded it, so that the forgery is logged and counted once,
// whichever replica and retry finds it first.
func (b *Broker) reportForgery(ctx context.Context, id, found string) bool {
	for range maxCASAttempts {
		rec, err := b.load(ctx, id)
		if err != nil {
			return true // better twice than never
		}
		if rec.Forgery != "" {
			return false
		}
		rec.Forgery = found
		val, err := encodeRecord(&rec)
		if err != nil {
			return true
		}
		cctx, cancel := callCtx(ctx)
		_, err = b.res.state.Update(cctx, id, val, rec.revision)
		cancel()
		if !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			return true
		}
	}
	return true
}

// firstDecision reads the first message stored on id's decision subject: the
// decision, since the broker publishes it only where none exists. A message
// added after it is not the decision, whatever it says.
func (b *Broker) firstDecision(ctx context.Context, id string) (*jetstream.RawStreamMsg, error) {
	cctx, cancel := callCtx(ctx)
	defer cancel()
	return b.res.stream.GetMsg(cctx, 1, jetstream.WithGetMsgSubject(events.DecisionPrefix+id))
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

// encodeRecord encodes r for its KV entry and refuses a value the NATS server
// would not take.
func (b *Broker) encodeRecord(r *Record) ([]byte, error) {
	val, err := encodeRecord(r)
	if err != nil {
		return nil, err
	}
	if len(val) > b.maxValue {
		return nil, fmt.Errorf("%w: %w: the state of %s would be %d bytes, over the server's limit of %d (large args and a large payload or edit together)", ErrInvalid, events.ErrTooLarge, r.ID, len(val), b.maxValue)
	}
	return val, nil
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

// leaderGet reads id's entry in the state bucket from its stream's leader,
// through the JetStream API rather than a direct get: ErrNotFound when the
// bucket has no value for it (never written, deleted or purged).
func (b *Broker) leaderGet(ctx context.Context, id string) ([]byte, uint64, error) {
	resp, err := b.leaderMsgGet(ctx, StateBucket, map[string]string{"last_by_subj": "$KV." + StateBucket + "." + id})
	switch {
	case err != nil:
		return nil, 0, fmt.Errorf("read state of %s from its stream's leader: %w", id, err)
	case resp.Error != nil && resp.Error.ErrCode == errNoMessage:
		return nil, 0, fmt.Errorf("%w: %s", ErrNotFound, id)
	case resp.Error != nil:
		return nil, 0, fmt.Errorf("read state of %s from its stream's leader: %s (%d)", id, resp.Error.Description, resp.Error.ErrCode)
	case resp.Message == nil:
		return nil, 0, fmt.Errorf("read state of %s from its stream's leader: an answer without a message", id)
	case len(resp.Message.Data) == 0:
		// A delete or purge marker: a record is never empty.
		return nil, 0, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	return resp.Message.Data, resp.Message.Seq, nil
}
