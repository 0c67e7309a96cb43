package handler

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/assent-dev/assent/pkg/events"
)

// StreamName is the JetStream stream the broker keeps the contract's events in.
const StreamName = events.StreamName

// Errors Request returns; branch on them with errors.Is.
var (
	// ErrNoDecision: the wait ended without a decision (broker unreachable or
	// too slow). Treat it as "not approved".
	ErrNoDecision = errors.New("no decision")
	// ErrTampered: a decision failed verification (its args do not match its
	// digest, or it names another request). Client.Decision returns it for a
	// stored decision; Request logs and ignores such messages and goes on
	// waiting for the real one.
	ErrTampered = errors.New("decision failed verification")
)

// Request is one approval request. On the agent side, ID is optional (a UUIDv7
// is made) and Deadline is ignored; on the approver side both are set.
type Request struct {
	ID string
	events.Requested
	Deadline time.Time
}

// Decision is the broker's verdict on a request: run only if Approved(), and then
// with Args.
type Decision = events.Decided

// Config configures a Client.
type Config struct {
	// Agent names the agent; requests are published on assent.request.<Agent>.
	// Required unless every Request sets its own Agent.
	Agent string
	// Source is the CloudEvents source; default "agent/<Agent>".
	Source string
	// DefaultTimeout is asked for when a Request sets none. Zero leaves it to
	// the broker's default (its --timeout). Either way the broker clamps it to
	// its policy, and Request waits for the deadline the broker actually set.
	DefaultTimeout time.Duration
	// Grace is how long past the request's timeout the client waits for the
	// broker's expiry decision before giving up with ErrNoDecision. Default 15s.
	Grace time.Duration
	// Logger; nil logs nothing.
	Logger *zap.Logger
}

// Client asks for approvals. It is safe for concurrent use.
type Client struct {
	cfg Config
	nc  *nats.Conn
	js  jetstream.JetStream
	log *zap.Logger

	mu     sync.Mutex
	stream jetstream.Stream // found on first use
	state  jetstream.Stream
}

// NewClient returns a client on nc. The connection stays the caller's.
func NewClient(nc *nats.Conn, cfg Config) (*Client, error) {
	if nc == nil {
		return nil, errors.New("handler: nil NATS connection")
	}
	if cfg.Agent != "" {
		if err := events.CheckToken("agent", cfg.Agent); err != nil {
			return nil, fmt.Errorf("handler: %w", err)
		}
	}
	if cfg.DefaultTimeout < 0 {
		return nil, errors.New("handler: negative DefaultTimeout")
	}
	if cfg.Grace <= 0 {
		cfg.Grace = 15 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	return &Client{cfg: cfg, nc: nc, js: js, log: cfg.Logger.Named("assent")}, nil
}

// Request publishes req and blocks until the broker decides it, then returns the
// decision, whatever its outcome; err is nil for approved, denied, expired and
// cancelled alike. Publishing the same req.ID again is the same request: a
// retry after a crash gets the original decision, even one made while no one
// was waiting.
//
// If ctx ends first, Request publishes a cancel for the request and returns
// ctx's error. If no decision arrives within the broker's deadline plus
// Config.Grace, ErrNoDecision is returned. In every error case the call must
// not run; the returned Decision then carries only the RequestID, so the caller
// can report or cancel the request it made.
func (c *Client) Request(ctx context.Context, req Request) (Decision, error) {
	if req.ID == "" {
		req.ID = events.NewID()
	}
	if req.Agent == "" {
		req.Agent = c.cfg.Agent
	}
	if req.Timeout <= 0 {
		req.Timeout = events.Duration(c.cfg.DefaultTimeout)
	}
	// Until the broker's deadline is known, wait as long as asked, or as long
	// as the broker's default of 5 minutes.
	initialWait := req.Timeout.Std()
	if initialWait <= 0 {
		initialWait = 5 * time.Minute
	}
	if err := req.Validate(); err != nil {
		return Decision{}, err
	}
	subj, err := events.RequestSubject(req.Agent)
	if err != nil {
		return Decision{}, err
	}
	decSubj, err := events.DecisionSubject(req.ID)
	if err != nil {
		return Decision{}, err
	}
	source := c.cfg.Source
	if source == "" {
		source = "agent/" + req.Agent
	}
	e, err := events.New(events.TypeRequested, req.ID, source, req.Requested)
	if err != nil {
		return Decision{}, err
	}
	h, body, err := events.Encode(&e)
	if err != nil {
		return Decision{}, err
	}

	// Subscribe before publishing so no decision can slip between the two.
	decisions := make(chan *nats.Msg, 4)
	sub, err := c.nc.ChanSubscribe(decSubj, decisions)
	if err != nil {
		return Decision{RequestID: req.ID}, fmt.Errorf("subscribe %s: %w", decSubj, err)
	}
	defer sub.Unsubscribe() //nolint:errcheck // best effort

	ack, err := c.js.PublishMsg(ctx, &nats.Msg{Subject: subj, Header: nats.Header(h), Data: body}, jetstream.WithMsgID(req.ID))
	if err != nil {
		if ctx.Err() != nil {
			return Decision{RequestID: req.ID}, ctx.Err()
		}
		return Decision{RequestID: req.ID}, fmt.Errorf("publish request: %w", err)
	}
	log := c.log.With(zap.String("request_id", req.ID), zap.String("tool", req.Tool))
	if ack.Duplicate {
		// A retry: the decision may already be stored.
		if d, ok, err := c.Decision(ctx, req.ID); err != nil {
			log.Debug("read stored decision", zap.Error(err))
		} else if ok {
			return d, nil
		}
	}

	waitUntil := time.Now().Add(initialWait + c.cfg.Grace)
	wait := time.NewTimer(time.Until(waitUntil))
	defer wait.Stop()
	// Look at the stored state now and then: it covers a retry of a request
	// decided longer ago than JetStream's duplicate window and decisions
	// published while a reconnect dropped the subscription, and it learns the
	// deadline the broker set.
	recheck := time.NewTimer(time.Second)
	defer recheck.Stop()
	for {
		select {
		case <-recheck.C:
			if d, ok, err := c.Decision(ctx, req.ID); err == nil && ok {
				return d, nil
			}
			if dl, err := c.deadline(ctx, req.ID); err == nil && !dl.IsZero() {
				waitUntil = dl.Add(c.cfg.Grace)
				wait.Reset(time.Until(waitUntil))
			} else if err != nil {
				log.Debug("read deadline", zap.Error(err))
			}
			recheck.Reset(30 * time.Second)
		case m := <-decisions:
			d, err := verify(m.Header, m.Data, req.ID)
			if err != nil {
				log.Warn("ignoring a decision that failed verification", zap.Error(err))
				continue
			}
			return d, nil
		case <-wait.C:
			// Last look, in case the subscription missed it during a reconnect.
			if d, ok, err := c.Decision(context.WithoutCancel(ctx), req.ID); err == nil && ok {
				return d, nil
			}
			return Decision{RequestID: req.ID}, fmt.Errorf("%w for %s by %s", ErrNoDecision, req.ID, waitUntil.Format(time.RFC3339))
		case <-ctx.Done():
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			if err := c.cancel(cctx, source, req.ID, "requester stopped waiting: "+ctx.Err().Error()); err != nil {
				log.Warn("publish cancel", zap.Error(err))
			}
			cancel()
			return Decision{RequestID: req.ID}, ctx.Err()
		}
	}
}

// Decision reads the stored decision for request id, if there is one.
func (c *Client) Decision(ctx context.Context, id string) (Decision, bool, error) {
	subj, err := events.DecisionSubject(id)
	if err != nil {
		return Decision{}, false, err
	}
	stream, err := c.getStream(ctx)
	if err != nil {
		return Decision{}, false, err
	}
	m, err := stream.GetLastMsgForSubject(ctx, subj)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return Decision{}, false, nil
	}
	if err != nil {
		return Decision{}, false, err
	}
	d, err := verify(m.Header, m.Data, id)
	if err != nil {
		return Decision{}, false, err
	}
	return d, true, nil
}

// deadline reads the deadline the broker set for request id from its state
// entry; zero when the broker has not stored the request yet.
func (c *Client) deadline(ctx context.Context, id string) (time.Time, error) {
	c.mu.Lock()
	s := c.state
	c.mu.Unlock()
	if s == nil {
		var err error
		if s, err = c.js.Stream(ctx, "KV_"+events.StateBucket); err != nil {
			return time.Time{}, err
		}
		c.mu.Lock()
		c.state = s
		c.mu.Unlock()
	}
	m, err := s.GetLastMsgForSubject(ctx, "$KV."+events.StateBucket+"."+id)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return time.Time{}, nil
	}
	if err != nil {
		return time.Time{}, err
	}
	var rec struct {
		Deadline time.Time `json:"deadline"`
	}
	if err := json.Unmarshal(m.Data, &rec); err != nil {
		return time.Time{}, err
	}
	return rec.Deadline, nil
}

func (c *Client) getStream(ctx context.Context) (jetstream.Stream, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stream == nil {
		s, err := c.js.Stream(ctx, StreamName)
		if err != nil {
			return nil, fmt.Errorf("stream %s: %w", StreamName, err)
		}
		c.stream = s
	}
	return c.stream, nil
}

// Cancel asks the broker to end request id as cancelled.
func (c *Client) Cancel(ctx context.Context, id, reason string) error {
	source := c.cfg.Source
	if source == "" && c.cfg.Agent != "" {
		source = "agent/" + c.cfg.Agent
	}
	if source == "" {
		source = "agent/unknown"
	}
	return c.cancel(ctx, source, id, reason)
}

func (c *Client) cancel(ctx context.Context, source, id, reason string) error {
	subj, err := events.CancelSubject(id)
	if err != nil {
		return err
	}
	e, err := events.New(events.TypeCancel, "", source, events.Cancel{Reason: reason})
	if err != nil {
		return err
	}
	h, body, err := events.Encode(&e)
	if err != nil {
		return err
	}
	_, err = c.js.PublishMsg(ctx, &nats.Msg{Subject: subj, Header: nats.Header(h), Data: body})
	return err
}

// verify decodes a decided event and checks it belongs to id and that its args
// match their digest.
func verify(h nats.Header, body []byte, id string) (Decision, error) {
	e, err := events.Decode(events.Header(h), body)
	if err != nil {
		return Decision{}, fmt.Errorf("%w: %w", ErrTampered, err)
	}
	d, err := events.DecodeDecided(&e)
	if err != nil {
		return Decision{}, fmt.Errorf("%w: %w", ErrTampered, err)
	}
	if d.RequestID != id {
		return Decision{}, fmt.Errorf("%w: decision names request %s, want %s", ErrTampered, d.RequestID, id)
	}
	if err := d.VerifyArgs(); err != nil {
		return Decision{}, fmt.Errorf("%w: %w", ErrTampered, err)
	}
	return d, nil
}
