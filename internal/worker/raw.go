package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/assent-dev/assent/internal/natsconn"
	"github.com/assent-dev/assent/pkg/events"
	"github.com/assent-dev/assent/pkg/handler"
)

// The raw JetStream baseline: the least a durable broker must do for one
// approval, with nothing of Assent. It keeps to its own stream and subjects,
// so it can run on the same server as a broker:
//
//	<RawPrefix>.req.<id>      the request, stored, with Nats-Msg-Id <id>
//	<RawPrefix>.pending.<id>  manual mode: the request is waiting for an answer
//	<RawPrefix>.answer.<id>   manual mode: the approver's answer, stored
//	<RawPrefix>.reply.<id>    the decision, stored
//
// Requests and answers are served by a durable pull consumer with explicit
// acks; the service stores what it publishes (pending, reply) before it acks.
// The requester subscribes to its reply subject before it publishes.
const (
	// RawStream is the baseline's stream: file storage, one replica.
	RawStream = "ASSENT_BENCH_RAW"
	// RawPrefix starts every subject of the baseline.
	RawPrefix = "assentbench.raw"
	// RawWorkers is how many goroutines serve the consumer by default.
	RawWorkers = 64
	// RawStoredPrefix starts the subjects on which, with RawConfig.Stored,
	// the server republishes each reply once stored.
	RawStoredPrefix = "assentbench.rawstored"
)

// ErrRawStreamExists: StartRaw found RawStream on the server already.
var ErrRawStreamExists = errors.New("raw baseline stream already exists")

// RawConfig configures StartRaw.
type RawConfig struct {
	// Manual announces each request on <RawPrefix>.pending.<id> and replies
	// when it is answered, like a broker in manual mode. Otherwise each
	// request is replied to at once, like a broker in auto-approve mode.
	Manual bool
	// Workers is how many requests and answers are handled at once.
	// Default RawWorkers.
	Workers int
	// Stored has the server republish each reply once the stream has
	// stored it (on RawStoredPrefix.reply.<id>), for a RawClient made with
	// stored: its requester then acts only on a stored reply, as an agent
	// of Assent acts only on a stored decision. Without it the requester
	// takes the reply as the server routes it, before it is stored (under
	// --sync always, before its fsync).
	Stored bool
}

// RawService is the serving side of the raw baseline, the broker's
// counterpart: a stream of its own and a consumer that answers what it
// stores. Stop it with Close, which deletes the stream.
type RawService struct {
	js     jetstream.JetStream
	log    *zap.Logger
	cc     jetstream.ConsumeContext
	cancel context.CancelFunc
	done   chan struct{} // closed by Close: the workers stop
	work   chan jetstream.Msg
	wg     sync.WaitGroup
	once   sync.Once
	err    error
}

// StartRaw creates RawStream and its consumer on nc and serves it until
// Close. If the stream exists already (another raw run on this server, or
// one killed before it could clean up), ErrRawStreamExists is returned and
// nothing is changed.
func StartRaw(ctx context.Context, nc *nats.Conn, cfg RawConfig, log *zap.Logger) (*RawService, error) {
	if log == nil {
		log = zap.NewNop()
	}
	if cfg.Workers <= 0 {
		cfg.Workers = RawWorkers
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	if _, err := js.Stream(ctx, RawStream); err == nil {
		return nil, fmt.Errorf("%w: %s: another raw baseline may be running on this server; if none is, delete it (nats stream rm %s) and run again", ErrRawStreamExists, RawStream, RawStream)
	} else if !errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, fmt.Errorf("look for stream %s: %w", RawStream, err)
	}
	scfg := jetstream.StreamConfig{
		Name:        RawStream,
		Description: "agent-worker load --baseline raw: deleted when the run ends",
		Subjects:    []string{RawPrefix + ".>"},
		Storage:     jetstream.FileStorage,
		Replicas:    1,
	}
	if cfg.Stored {
		scfg.RePublish = &jetstream.RePublish{Source: RawPrefix + ".reply.>", Destination: RawStoredPrefix + ".reply.>"}
	}
	s, err := natsconn.CreateStream(ctx, js, scfg)
	if err != nil {
		return nil, fmt.Errorf("create stream %s (the server needs JetStream, and the credentials the right to create streams): %w", RawStream, err)
	}
	cons, err := s.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{
		Durable:        "svc",
		FilterSubjects: []string{RawPrefix + ".req.*", RawPrefix + ".answer.*"},
		AckPolicy:      jetstream.AckExplicitPolicy,
		MaxAckPending:  1024,
	})
	if err != nil {
		return nil, errors.Join(fmt.Errorf("create consumer on %s: %w", RawStream, err), js.DeleteStream(context.WithoutCancel(ctx), RawStream))
	}
	sctx, cancel := context.WithCancel(context.Background())
	r := &RawService{js: js, log: log, cancel: cancel, done: make(chan struct{}), work: make(chan jetstream.Msg)}
	for range cfg.Workers {
		r.wg.Go(func() {
			for {
				select {
				case m := <-r.work:
					r.handle(sctx, m, cfg.Manual)
				case <-r.done:
					return
				}
			}
		})
	}
	r.cc, err = cons.Consume(func(m jetstream.Msg) {
		select {
		case r.work <- m:
		case <-r.done: // left unacked: the stream goes with Close
		}
	}, jetstream.PullMaxMessages(128))
	if err != nil {
		return nil, errors.Join(fmt.Errorf("consume %s: %w", RawStream, err), r.Close(ctx))
	}
	log.Debug("raw baseline serving", zap.String("stream", RawStream), zap.Bool("manual", cfg.Manual), zap.Int("workers", cfg.Workers))
	return r, nil
}

// handle serves one stored request or answer: it stores what follows from
// it, then acks. A failed publish is retried by redelivery.
func (r *RawService) handle(ctx context.Context, m jetstream.Msg, manual bool) {
	kind, id, ok := strings.Cut(strings.TrimPrefix(m.Subject(), RawPrefix+"."), ".")
	if !ok {
		_ = m.TermWithReason("not a request or an answer")
		return
	}
	next := "reply"
	if kind == "req" && manual {
		next = "pending"
	}
	subj := RawPrefix + "." + next + "." + id
	if _, err := r.js.Publish(ctx, subj, m.Data(), jetstream.WithMsgID(next+"-"+id)); err != nil {
		r.log.Debug("raw baseline: publish failed; will be redelivered", zap.String("subject", subj), zap.Error(err))
		_ = m.Nak()
		return
	}
	_ = m.Ack()
}

// Close stops serving, waits for the requests in hand, and deletes the
// stream. It is safe to call more than once; later calls return the first
// call's error.
func (r *RawService) Close(ctx context.Context) error {
	r.once.Do(func() {
		if r.cc != nil {
			r.cc.Stop()
			<-r.cc.Closed()
		}
		close(r.done)
		r.wg.Wait()
		r.cancel()
		if err := r.js.DeleteStream(ctx, RawStream); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
			r.err = fmt.Errorf("delete stream %s: %w (delete it with: nats stream rm %s)", RawStream, err, RawStream)
		}
	})
	return r.err
}

// RawClient is the requesting (and, in manual mode, the answering) side of
// the raw baseline: the SDK's counterpart. It implements Requester and
// AnswerTarget. It is safe for concurrent use.
type RawClient struct {
	nc      *nats.Conn
	js      jetstream.JetStream
	replies string // the prefix of the reply subjects it waits on
}

// NewRawClient returns a client of the raw baseline on nc; a RawService
// must serve it, on any connection to the same server. With stored, it
// waits for the server's copy of each reply once stored, which the service
// must republish (RawConfig.Stored).
func NewRawClient(nc *nats.Conn, stored bool) (*RawClient, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	c := &RawClient{nc: nc, js: js, replies: RawPrefix + ".reply."}
	if stored {
		c.replies = RawStoredPrefix + ".reply."
	}
	return c, nil
}

// Request stores req (its Requested data as JSON) and waits for the reply.
// A reply is an approval. If none comes within req.Timeout (default 30s),
// an error wrapping handler.ErrNoDecision is returned; if ctx ends first,
// ctx's error.
func (c *RawClient) Request(ctx context.Context, req handler.Request) (handler.Decision, error) {
	if req.ID == "" {
		req.ID = events.NewID()
	}
	if err := events.CheckToken("request id", req.ID); err != nil {
		return handler.Decision{}, err
	}
	body, err := json.Marshal(req.Requested)
	if err != nil {
		return handler.Decision{}, err
	}
	replies := make(chan *nats.Msg, 1)
	sub, err := c.nc.ChanSubscribe(c.replies+req.ID, replies)
	if err != nil {
		return handler.Decision{}, err
	}
	defer sub.Unsubscribe() //nolint:errcheck // best effort
	if _, err := c.js.Publish(ctx, RawPrefix+".req."+req.ID, body, jetstream.WithMsgID(req.ID)); err != nil {
		return handler.Decision{RequestID: req.ID}, fmt.Errorf("publish request: %w", err)
	}
	timeout := req.Timeout.Std()
	if timeout <= 0 {
		timeout = 30 * time.Second
	}
	wait := time.NewTimer(timeout)
	defer wait.Stop()
	select {
	case <-replies:
		return handler.Decision{RequestID: req.ID, Outcome: events.Approved}, nil
	case <-wait.C:
		return handler.Decision{RequestID: req.ID}, fmt.Errorf("%w for %s within %s: is a raw baseline service running on this server?", handler.ErrNoDecision, req.ID, timeout)
	case <-ctx.Done():
		return handler.Decision{RequestID: req.ID}, ctx.Err()
	}
}

// PendingSubject is where the service announces waiting requests.
func (c *RawClient) PendingSubject() string { return RawPrefix + ".pending.*" }

// PendingID returns the request id of a message on PendingSubject.
func (c *RawClient) PendingID(m *nats.Msg) (string, bool) {
	id, ok := strings.CutPrefix(m.Subject, RawPrefix+".pending.")
	return id, ok && events.ValidToken(id)
}

// Approve stores the answer that approves request id, as principal.
func (c *RawClient) Approve(ctx context.Context, js jetstream.JetStream, principal, id string) error {
	if err := events.CheckToken("request id", id); err != nil {
		return err
	}
	body, err := json.Marshal(events.Responded{Decision: events.Approve, Channel: "load"})
	if err != nil {
		return err
	}
	_, err = js.Publish(ctx, RawPrefix+".answer."+id, body, jetstream.WithMsgID("answer-"+principal+"-"+id))
	return err
}
