package worker

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/assent-dev/assent/pkg/events"
	"github.com/assent-dev/assent/pkg/handler"
)

// AnswerTarget is what AnswerLoad measures: Assent (AssentTarget) or the raw
// JetStream baseline (RawClient).
type AnswerTarget interface {
	// Request asks for req's approval and waits for the decision; req.ID
	// is set.
	Requester
	// PendingSubject is where requests waiting for an answer are announced
	// (wildcards allowed), for a core NATS subscription.
	PendingSubject() string
	// PendingID returns the id of the request a message on PendingSubject
	// announces; false for any other message.
	PendingID(m *nats.Msg) (id string, ok bool)
	// Approve publishes principal's approval of request id through js and
	// returns once the stream stored it.
	Approve(ctx context.Context, js jetstream.JetStream, principal, id string) error
}

// AssentTarget is Assent as AnswerLoad measures it: the agent asks through
// the SDK, the approver watches the agent's pending subject and answers on
// the response subject.
type AssentTarget struct {
	client  *handler.Client
	pending string
}

// NewAssentTarget returns the target of agent's requests through client,
// which must ask as agent (handler.Config.Agent).
func NewAssentTarget(client *handler.Client, agent string) (*AssentTarget, error) {
	subj, err := events.PendingSubject(agent)
	if err != nil {
		return nil, err
	}
	return &AssentTarget{client: client, pending: subj}, nil
}

// Request asks through the SDK (handler.Client.Request).
func (a *AssentTarget) Request(ctx context.Context, req handler.Request) (handler.Decision, error) {
	return a.client.Request(ctx, req)
}

// PendingSubject is assent.pending.<agent>.
func (a *AssentTarget) PendingSubject() string { return a.pending }

// PendingID reads a pending event; escalations and anything else are not
// new requests.
func (a *AssentTarget) PendingID(m *nats.Msg) (string, bool) {
	e, err := events.Decode(events.Header(m.Header), m.Data)
	if err != nil || e.Type() != events.TypePending {
		return "", false
	}
	p, err := events.DecodePending(&e)
	if err != nil {
		return "", false
	}
	return p.RequestID, true
}

// Approve answers as an approver does, with handler.Answer.
func (a *AssentTarget) Approve(ctx context.Context, js jetstream.JetStream, principal, id string) error {
	return handler.Answer(ctx, js, principal, id, events.Responded{Decision: events.Approve, Channel: "load"})
}

// AnswerConfig configures AnswerLoad.
type AnswerConfig struct {
	// LoadConfig says what to ask and how often; Concurrency defaults to
	// 16 here.
	LoadConfig
	// Principal approves every request. Required.
	Principal string
}

// WithDefaults returns c with unset fields at their defaults.
func (c AnswerConfig) WithDefaults() AnswerConfig {
	if c.Concurrency == 0 {
		c.Concurrency = 16
	}
	c.LoadConfig = c.LoadConfig.WithDefaults()
	return c
}

// Validate reports every problem with c at once. Call it on WithDefaults' result.
func (c AnswerConfig) Validate() error {
	return errors.Join(c.LoadConfig.Validate(), events.CheckToken("principal", c.Principal))
}

// ErrUnanswered: a request was decided before its approval was published,
// so the target did not wait for an approver (a broker not in manual mode).
var ErrUnanswered = errors.New("decided before it was answered")

// flight is one request of AnswerLoad on its way. Its times are offsets
// from the run's start; zero means not yet.
type flight struct {
	cancel   context.CancelFunc
	pending  atomic.Int64 // the approver saw the pending notice
	answered atomic.Int64 // the approver started publishing the approval
	err      atomic.Pointer[error]
}

// AnswerLoad measures the human path: cfg.N requests, cfg.Concurrency at a
// time, each approved by cfg.Principal as soon as its pending notice
// arrives. The agent side asks through t; the approver side, on approver,
// subscribes to t's pending subject before the first request and publishes
// each approval with JetStream. For each request it measures three spans:
// asking to the decision (Latency), asking to the pending notice
// (Pending), and the start of the approval's publish to the decision
// (Answer). For Assent, point it at a broker in manual mode that lets
// cfg.Principal answer (with no policy, anyone may, as long as the broker's
// HTTP API is on); requests it decides on its own are counted as
// "unanswered" errors.
//
// Requests that end without a decision are counted, not fatal. If ctx ends,
// no more requests start, those in flight are cancelled, and the result so
// far is returned with ctx's error. A bad cfg gives an error and no requests.
func AnswerLoad(ctx context.Context, approver *nats.Conn, t AnswerTarget, cfg AnswerConfig) (LoadResult, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return LoadResult{}, fmt.Errorf("load config: %w", err)
	}
	js, err := jetstream.New(approver)
	if err != nil {
		return LoadResult{}, err
	}
	start := time.Now()
	// at is now as an offset from start; never zero.
	at := func() int64 { return int64(time.Since(start)) + 1 }
	var flights sync.Map // request id -> *flight

	workers := min(cfg.Concurrency, cfg.N)
	notices := make(chan *nats.Msg, 4*workers+64)
	sub, err := approver.ChanSubscribe(t.PendingSubject(), notices)
	if err != nil {
		return LoadResult{}, fmt.Errorf("subscribe to %s: %w", t.PendingSubject(), err)
	}
	defer sub.Unsubscribe() //nolint:errcheck // best effort
	// The server has the subscription before the first request.
	if err := approver.FlushTimeout(5 * time.Second); err != nil {
		return LoadResult{}, fmt.Errorf("subscribe to %s: %w", t.PendingSubject(), err)
	}

	// The approvers: as many as requests in flight, so no notice waits
	// for one.
	actx, stop := context.WithCancel(ctx)
	var approvers sync.WaitGroup
	for range workers {
		approvers.Go(func() {
			for {
				var m *nats.Msg
				select {
				case <-actx.Done():
					return
				case m = <-notices:
				}
				seen := at()
				id, ok := t.PendingID(m)
				if !ok {
					continue
				}
				v, ok := flights.Load(id)
				if !ok {
					continue // not this run's, or no longer waiting
				}
				f := v.(*flight)
				f.pending.CompareAndSwap(0, seen)
				if !f.answered.CompareAndSwap(0, at()) {
					continue // answered already (a repeated notice)
				}
				if err := t.Approve(actx, js, cfg.Principal, id); err != nil {
					err = fmt.Errorf("answer %s: %w", id, err)
					f.err.CompareAndSwap(nil, &err)
					f.cancel()
				}
			}
		})
	}
	defer func() {
		stop()
		approvers.Wait()
	}()

	res, err := drive(ctx, cfg.LoadConfig, func(ctx context.Context, i int, st *loadStats) {
		req := cfg.request(i)
		req.ID = events.NewID()
		fctx, cancel := context.WithCancel(ctx)
		defer cancel()
		f := &flight{cancel: cancel}
		flights.Store(req.ID, f)
		defer flights.Delete(req.ID)
		asked := at()
		d, err := t.Request(fctx, req)
		decided := at()
		if ferr := f.err.Load(); ferr != nil {
			st.fail("answer_failed", *ferr)
			return
		}
		if err != nil {
			st.fail(errorKind(ctx, err), err)
			return
		}
		answered, pending := f.answered.Load(), f.pending.Load()
		if answered == 0 || answered > decided {
			st.fail("unanswered", fmt.Errorf("request %s: %w (%s): run the broker in manual mode (--mode manual) with its HTTP API on, so that anyone may answer", req.ID, ErrUnanswered, d.Outcome))
			return
		}
		st.decided(time.Duration(decided-asked), d.Outcome)
		st.answers = append(st.answers, time.Duration(decided-answered))
		st.pendings = append(st.pendings, time.Duration(pending-asked))
	})
	res.Answered = true
	return res, err
}
