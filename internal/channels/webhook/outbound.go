package webhook

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/assent-dev/assent/internal/recent"
	"github.com/assent-dev/assent/pkg/events"
	"github.com/assent-dev/assent/pkg/handler"
)

// contractFilters are the subjects an endpoint's consumer reads: every
// subject of the wire contract, and none of the broker's own (timers,
// timeouts, shadow-policy audit).
var contractFilters = []string{
	events.RequestPrefix + "*",
	events.PendingPrefix + "*",
	events.ResponsePrefix + "*.*",
	events.CancelPrefix + ">",
	events.DecisionPrefix + "*",
	events.RejectionPrefix + "*",
}

// Retry timing: the first retry a second after a failure, then doubling, up
// to about maxRetryDelay, each delay spread by ±jitter so that endpoints
// failing together do not retry in step.
const (
	firstRetryDelay = time.Second
	maxRetryDelay   = 5 * time.Minute
	jitter          = 0.2
)

// ackWait is how long a delivery the server handed out stays with the process
// it was handed to; keepAlive extends it while an attempt runs, so it only
// bounds how soon another process takes over from one that died.
const ackWait = 30 * time.Second

// retryDelay is the wait after failed attempt number attempt (1 for the
// first): 1s, 2s, 4s, ... capped at maxRetryDelay, with jitter; r is a
// uniform random number in [0, 1).
func retryDelay(attempt uint64, r float64) time.Duration {
	d := firstRetryDelay
	for i := uint64(1); i < attempt && d < maxRetryDelay; i++ {
		d *= 2
	}
	d = min(d, maxRetryDelay)
	d = time.Duration(float64(d) * (1 - jitter + 2*jitter*r))
	return min(d, maxRetryDelay)
}

// consumerConfig is endpoint name's durable consumer. MaxAckPending 1 holds
// every later event back while one is not delivered: events reach the
// receiver in stream order, which is each request's order.
func consumerConfig(name string) jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{
		Durable:        "webhook-" + name,
		Description:    "Assent approver bot: webhook endpoint " + name,
		FilterSubjects: contractFilters,
		DeliverPolicy:  jetstream.DeliverNewPolicy,
		AckPolicy:      jetstream.AckExplicitPolicy,
		AckWait:        ackWait,
		MaxDeliver:     -1,
		MaxAckPending:  1,
	}
}

// endpoint is a configured Endpoint with its secret read.
type endpoint struct {
	name    string
	url     string
	secret  []byte
	types   map[string]bool
	agents  map[string]bool
	timeout time.Duration
}

// deliverer sends one endpoint's events, one at a time, in stream order.
type deliverer struct {
	ep     *endpoint
	js     jetstream.JetStream
	client *http.Client
	codec  events.Codec
	// trusted, if set, are the broker's decision keys: a decided event none
	// of them signed is not delivered (a forgery on the stream).
	trusted *events.TrustedKeys
	log     *zap.Logger
	agents  *agentCache
	cons    jetstream.Consumer
	stream  jetstream.Stream // the ASSENT stream, once read
}

// fetchWait is how long one pull for the next event waits on the server. A
// pull is never abandoned (an event the server sent to an abandoned pull
// would wait out ackWait), so it also bounds how long stopping takes.
const fetchWait = 2 * time.Second

// run delivers until ctx ends. An attempt in flight then finishes (within the
// endpoint's timeout) and is acknowledged or retried before run returns.
func (d *deliverer) run(ctx context.Context) {
	for ctx.Err() == nil {
		if d.cons == nil {
			cons, err := handler.Durable(ctx, d.js, consumerConfig(d.ep.name))
			if err != nil {
				if ctx.Err() == nil {
					d.log.Warn("cannot open the endpoint's consumer; retrying", zap.Error(err))
				}
				sleep(ctx, 5*time.Second)
				continue
			}
			d.cons = cons
		}
		if err := d.consume(ctx); err != nil && ctx.Err() == nil {
			// NATS unreachable, or the consumer went away (deleted, or
			// its stream made anew): open it again.
			d.log.Warn("cannot read the endpoint's consumer; opening it again", zap.Error(err))
			d.cons = nil
			sleep(ctx, time.Second)
		}
	}
	select {
	case <-d.js.PublishAsyncComplete():
	case <-time.After(5 * time.Second):
		d.log.Warn("delivery log records still unconfirmed after 5s; some may be missing", zap.String("stream", LogStream))
	}
}

// consume pulls events one at a time and delivers them until ctx ends or a
// pull fails. An event that arrives while stopping is attempted like any
// other: handing it back would count as an attempt without making one.
func (d *deliverer) consume(ctx context.Context) error {
	for ctx.Err() == nil {
		batch, err := d.cons.Fetch(1, jetstream.FetchMaxWait(fetchWait))
		if err != nil {
			return err
		}
		for msg := range batch.Messages() {
			d.handle(ctx, msg)
		}
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) && !errors.Is(err, context.DeadlineExceeded) {
			return err
		}
	}
	return nil
}

// decides reports whether msg, a stored decided event, is its request's
// decision (handler.FirstDecision): a message stored after the decision on
// its subject is acknowledged and not delivered, and one that cannot be
// checked now is retried.
func (d *deliverer) decides(ctx context.Context, msg jetstream.Msg) bool {
	md, err := msg.Metadata()
	if err != nil {
		return true // not from a consumer
	}
	id := strings.TrimPrefix(msg.Subject(), events.DecisionPrefix)
	if d.stream == nil {
		if d.stream, err = d.js.Stream(ctx, events.StreamName); err != nil {
			d.log.Warn("cannot read the stream to check a decision; retrying", zap.String("request_id", id), zap.Error(err))
			_ = msg.NakWithDelay(time.Second)
			return false
		}
	}
	first, found, err := handler.FirstDecision(ctx, d.stream, id, d.trusted)
	switch {
	case err != nil || !found:
		// Unreadable now, or read from a stream replica that has not
		// stored it yet.
		d.log.Debug("cannot check a decision yet; retrying", zap.String("request_id", id), zap.Error(err))
		_ = msg.NakWithDelay(time.Second)
		return false
	case first != md.Sequence.Stream:
		d.log.Warn("not delivering a message stored after its request's decision", zap.String("request_id", id),
			zap.Uint64("seq", md.Sequence.Stream), zap.Uint64("decision_seq", first))
		_ = msg.Ack()
		return false
	}
	return true
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// handle delivers one stored event, or skips it when the endpoint does not
// want it.
func (d *deliverer) handle(ctx context.Context, msg jetstream.Msg) {
	e, err := d.codec.Decode(events.Header(msg.Headers()), msg.Data())
	if err != nil {
		d.log.Warn("skipping a message that is not a CloudEvent", zap.String("subject", msg.Subject()), zap.Error(err))
		_ = msg.TermWithReason("not a CloudEvent: " + truncate(err.Error(), 200))
		return
	}
	if !d.ep.types[e.Type()] {
		_ = msg.Ack()
		return
	}
	if e.Type() == events.TypeDecided && d.trusted != nil {
		if _, err := d.trusted.Verify(&e); err != nil {
			d.log.Warn("not delivering a decided event no trusted key signed", zap.String("subject", msg.Subject()), zap.String("source", e.Source()), zap.Error(err))
			_ = msg.Ack()
			return
		}
	}
	if e.Type() == events.TypeDecided && !d.decides(ctx, msg) {
		return
	}
	reqID, agent := describe(msg.Subject(), &e)
	if len(d.ep.agents) > 0 {
		if agent != "" {
			d.agents.put(reqID, agent)
		} else if agent, err = d.agents.get(ctx, d.js, reqID); err != nil {
			d.log.Warn("cannot find the agent of a request; retrying", zap.String("request_id", reqID), zap.Error(err))
			_ = msg.NakWithDelay(5 * time.Second)
			return
		}
		if !d.ep.agents[agent] {
			if agent == "" {
				d.log.Debug("skipping an event of a request whose agent is unknown", zap.String("subject", msg.Subject()))
			}
			_ = msg.Ack()
			return
		}
	}
	body, err := deliveryBody(&e, msg.Headers().Get("Content-Type"), msg.Data(), msg.Subject(), reqID)
	if err != nil {
		d.log.Warn("skipping an event that cannot be encoded", zap.String("subject", msg.Subject()), zap.Error(err))
		_ = msg.TermWithReason("cannot encode: " + truncate(err.Error(), 200))
		return
	}
	attempt := uint64(1)
	if md, err := msg.Metadata(); err == nil {
		attempt = md.NumDelivered
	}
	rec := Attempt{Endpoint: d.ep.name, EventID: e.ID(), Type: e.Type(), RequestID: reqID, Attempt: int(attempt)}
	stop := keepAlive(msg, ackWait/3)
	// The attempt runs to its end even when ctx ends: shutting down waits
	// at most the endpoint's timeout, and the result is recorded.
	d.post(context.WithoutCancel(ctx), &rec, body)
	stop()
	if rec.Delivered {
		_ = msg.Ack()
		if ce := d.log.Check(zap.DebugLevel, "delivered"); ce != nil {
			ce.Write(zap.String("event_id", rec.EventID), zap.String("type", rec.Type), zap.String("request_id", reqID),
				zap.Int("attempt", rec.Attempt), zap.Int("status", rec.Status), zap.Duration("duration", rec.Duration.Std()))
		}
	} else {
		delay := retryDelay(attempt, rand.Float64())
		rec.RetryIn = events.Duration(delay)
		_ = msg.NakWithDelay(delay)
		d.log.Warn("delivery failed; will retry", zap.String("event_id", rec.EventID), zap.String("type", rec.Type), zap.String("request_id", reqID),
			zap.Int("attempt", rec.Attempt), zap.Int("status", rec.Status), zap.String("error", rec.Error), zap.Duration("retry_in", delay))
	}
	d.record(&rec)
}

// post makes one attempt and fills in its result.
func (d *deliverer) post(ctx context.Context, rec *Attempt, body []byte) {
	ctx, cancel := context.WithTimeout(ctx, d.ep.timeout)
	defer cancel()
	rec.At = time.Now().UTC()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, d.ep.url, bytes.NewReader(body))
	if err != nil {
		rec.Error = err.Error()
		return
	}
	req.Header.Set("Content-Type", events.ContentTypeStructured)
	req.Header.Set("User-Agent", "assent-webhook/1")
	req.Header.Set(HeaderID, rec.EventID)
	req.Header.Set(HeaderTimestamp, strconv.FormatInt(rec.At.Unix(), 10))
	req.Header.Set(HeaderSignature, Sign(d.ep.secret, rec.EventID, rec.At, body))
	resp, err := d.client.Do(req)
	rec.Duration = events.Duration(time.Since(rec.At))
	if err != nil {
		// Not err itself: a *url.Error names the URL, which may hold a
		// credential in its query.
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		if errors.Is(err, context.DeadlineExceeded) {
			err = fmt.Errorf("no answer within %s", d.ep.timeout)
		}
		rec.Error = err.Error()
		return
	}
	defer resp.Body.Close()
	rec.Status = resp.StatusCode
	start, _ := io.ReadAll(io.LimitReader(resp.Body, 256))
	// Read a little more so the connection can be reused.
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		rec.Delivered = true
		return
	}
	rec.Error = "HTTP " + resp.Status
	if resp.StatusCode >= 300 && resp.StatusCode < 400 {
		rec.Error += " (redirects are not followed: configure the final URL)"
	}
	rec.Response = strings.ToValidUTF8(string(start), string(utf8.RuneError))
}

// record appends rec to the delivery log, without waiting: a log that cannot
// be written does not hold deliveries up (the JetStream context's
// asynchronous error handler reports failures), and run waits for the
// records in flight before it returns.
func (d *deliverer) record(rec *Attempt) {
	b, err := json.Marshal(rec)
	if err != nil {
		return
	}
	if _, err := d.js.PublishAsync(LogSubjectPrefix+d.ep.name, b); err != nil {
		d.log.Warn("cannot write the delivery log", zap.String("stream", LogStream), zap.Error(err))
	}
}

// CloudEvents extension attributes added to every delivered event: on NATS
// the subject says which request (and which agent or principal) an event is
// about, and a responded or cancel event says so nowhere else.
const (
	// ExtSubject is the NATS subject the event was stored on
	// ("assent.response.alice.<request-id>").
	ExtSubject = "assentsubject"
	// ExtRequestID is the id of the request the event is about.
	ExtRequestID = "assentrequestid"
)

// deliveryBody is the HTTP body of an event: the event as stored, in
// structured mode, with the ExtSubject and ExtRequestID attributes. A stored
// structured event keeps its bytes, the attributes put in front; one in
// binary mode, or one that carries these attributes already (set by whoever
// published it, and not to be trusted), is encoded anew.
func deliveryBody(e *events.Event, contentType string, stored []byte, subject, reqID string) ([]byte, error) {
	ext := e.Extensions()
	_, hasSubject := ext[ExtSubject]
	_, hasRequest := ext[ExtRequestID]
	rest := bytes.TrimLeft(stored, " \t\r\n")
	if structured(contentType) && !hasSubject && !hasRequest && len(rest) > 0 && rest[0] == '{' {
		rest = bytes.TrimLeft(rest[1:], " \t\r\n")
		subj, _ := json.Marshal(subject)
		b := make([]byte, 0, len(stored)+len(subj)+len(reqID)+48)
		b = append(b, `{"`+ExtSubject+`":`...)
		b = append(b, subj...)
		if reqID != "" {
			id, _ := json.Marshal(reqID)
			b = append(b, `,"`+ExtRequestID+`":`...)
			b = append(b, id...)
		}
		if len(rest) > 0 && rest[0] != '}' {
			b = append(b, ',')
		}
		return append(b, rest...), nil
	}
	c := e.Clone()
	c.SetExtension(ExtSubject, subject)
	if reqID != "" {
		c.SetExtension(ExtRequestID, reqID)
	} else if hasRequest {
		c.SetExtension(ExtRequestID, nil)
	}
	_, body, err := events.Encode(&c)
	return body, err
}

// structured reports whether a Content-Type marks a structured-mode event.
func structured(ct string) bool {
	mt, _, _ := strings.Cut(ct, ";")
	return strings.EqualFold(strings.TrimSpace(mt), events.ContentTypeStructured)
}

// describe returns the request an event is about, and its agent when the
// subject names it.
func describe(subject string, e *events.Event) (reqID, agent string) {
	sub, err := events.ParseSubject(subject)
	if err != nil {
		return "", ""
	}
	switch sub.Kind {
	case events.KindRequest:
		return e.ID(), sub.Agent
	case events.KindPending:
		var data struct {
			RequestID string `json:"request_id"`
		}
		_ = json.Unmarshal(e.Data(), &data)
		return data.RequestID, sub.Agent
	}
	return sub.RequestID, ""
}

// keepAlive tells the server msg is still being handled, every interval,
// until the returned function is called; after it returns, no more progress
// is reported.
func keepAlive(msg jetstream.Msg, interval time.Duration) func() {
	var mu sync.Mutex
	mu.Lock()
	defer mu.Unlock()
	stopped := false
	var t *time.Timer
	t = time.AfterFunc(interval, func() {
		mu.Lock()
		defer mu.Unlock()
		if stopped {
			return
		}
		_ = msg.InProgress()
		t.Reset(interval)
	})
	return func() {
		mu.Lock()
		defer mu.Unlock()
		stopped = true
		t.Stop()
	}
}

// agentCache remembers the agents of recent requests, for endpoints that
// filter by agent: answers, cancels and decisions name only the request.
type agentCache struct {
	recent *recent.Map[string]
}

// agentCacheSize bounds the requests an agentCache remembers.
const agentCacheSize = 10_000

func newAgentCache() *agentCache {
	return &agentCache{recent: recent.New[string](agentCacheSize)}
}

func (c *agentCache) put(id, agent string) {
	if id != "" && agent != "" {
		c.recent.Put(id, agent)
	}
}

// get returns the agent of request id: remembered, or asked of the broker
// (a broker lookup). It returns "" when no request has that id (an answer
// to an unknown id, or a request past the broker's retention).
func (c *agentCache) get(ctx context.Context, js jetstream.JetStream, id string) (string, error) {
	if !events.ValidToken(id) {
		return "", nil
	}
	if agent, ok := c.recent.Get(id); ok {
		return agent, nil
	}
	_, agent, err := lookupRequest(ctx, js.Conn(), id)
	if err != nil {
		return "", err
	}
	c.put(id, agent)
	return agent, nil
}
