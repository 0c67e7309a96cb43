package webhook

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/assent-dev/assent/internal/channels"
	"github.com/assent-dev/assent/pkg/events"
	"github.com/assent-dev/assent/pkg/handler"
)

// Name is the channel's name, as decisions made through inbound webhooks
// record it.
const Name = "webhook"

// Adapter is the webhook channel: it sends every lifecycle event to the
// configured endpoints, and takes decisions in on the inbound endpoints. It
// is a channels.Adapter so that the bot runs it like any other channel.
type Adapter struct {
	env        channels.Env
	log        *zap.Logger
	endpoints  []*endpoint
	inbound    map[string]*inbound
	principals []string
	client     *http.Client

	started atomic.Bool
	wg      sync.WaitGroup

	// Set by Start.
	js   jetstream.JetStream
	rt   channels.Runtime
	seen *seenSet
	ids  jetstream.KeyValue
}

// inbound is a configured Inbound with its secret read.
type inbound struct {
	name      string
	secret    []byte
	principal string
}

// New checks cfg, reads the secrets it names from the environment, and
// returns the channel, ready to Start. The error lists every problem at once.
func New(cfg Config, env channels.Env) (*Adapter, error) {
	var errs []error
	if err := cfg.Validate(); err != nil {
		errs = append(errs, err)
	}
	if env.NATS == nil {
		errs = append(errs, errors.New("no NATS connection"))
	}
	if env.Logger == nil {
		env.Logger = zap.NewNop()
	}
	secret := func(where, name string) []byte {
		if name == "" {
			return nil // reported by Validate
		}
		v, ok := os.LookupEnv(name)
		if !ok || v == "" {
			errs = append(errs, fmt.Errorf("%s: secret_env: %s is not set: export it with the signing secret, %s + base64 of %d to 64 random bytes (make one with: echo %s$(openssl rand -base64 32))",
				where, name, SecretPrefix, MinSecretBytes, SecretPrefix))
			return nil
		}
		key, err := ParseSecret(v)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: secret_env: %s: %w", where, name, err))
		}
		return key
	}
	a := &Adapter{env: env, log: env.Logger, inbound: map[string]*inbound{}}
	for i, ep := range cfg.Endpoints {
		e := &endpoint{name: ep.Name, url: ep.URL, timeout: ep.Timeout, types: map[string]bool{}}
		e.secret = secret(fmt.Sprintf("endpoints[%d] (%s)", i, ep.Name), ep.SecretEnv)
		if e.timeout == 0 {
			e.timeout = DefaultTimeout
		}
		types := ep.Types
		if len(types) == 0 {
			types = lifecycle
		}
		for _, t := range types {
			if full, ok := eventType(t); ok {
				e.types[full] = true
			}
		}
		if len(ep.Agents) > 0 {
			e.agents = map[string]bool{}
			for _, ag := range ep.Agents {
				e.agents[ag] = true
			}
		}
		if u, err := url.Parse(ep.URL); err == nil && insecure(u) {
			a.log.Warn("webhook endpoint over plain http: events (tool arguments included) cross the network unencrypted; use https",
				zap.String("endpoint", ep.Name), zap.String("url", redactURL(ep.URL)))
		}
		a.endpoints = append(a.endpoints, e)
	}
	for i, in := range cfg.Inbound {
		key := secret(fmt.Sprintf("inbound[%d] (%s)", i, in.Name), in.SecretEnv)
		a.inbound[in.Name] = &inbound{name: in.Name, secret: key, principal: in.Principal}
		if !slices.Contains(a.principals, in.Principal) {
			a.principals = append(a.principals, in.Principal)
		}
		if env.Directory != nil {
			if p := env.Directory.Policy(); p != nil && len(p.Principals) > 0 && p.Principals[in.Principal] == nil {
				a.log.Warn("inbound webhook answers as a principal the policy does not declare: only rules open to anyone will accept its answers",
					zap.String("inbound", in.Name), zap.String("principal", in.Principal))
			}
		}
	}
	slices.Sort(a.principals)
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("webhooks: %w", err)
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = 4
	a.client = &http.Client{
		Transport: tr,
		// A receiver that redirects is misconfigured: a POST must not turn
		// into a GET elsewhere. The attempt fails and says so.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	return a, nil
}

// Name is "webhook".
func (a *Adapter) Name() string { return Name }

// Reaches lists the principals the inbound endpoints answer as, sorted.
func (a *Adapter) Reaches() []string { return slices.Clone(a.principals) }

// Notify does nothing and returns nil. Webhooks are not a notifier: each
// endpoint's own consumer already sends every lifecycle event, pending and
// escalated included, in stream order and with retries, which Notify (called
// once per request across processes, without order) could not give. The
// channel runtime still records each notice, which Lookup then returns for
// the inbound eligibility check.
func (a *Adapter) Notify(context.Context, handler.Notice) (json.RawMessage, error) { return nil, nil }

// Resolve does nothing and returns nil: the endpoints receive the decided
// event itself.
func (a *Adapter) Resolve(context.Context, handler.Outcome) error { return nil }

// Start provisions the delivery log, one durable consumer per endpoint and
// the replay bucket, registers the inbound route on mux
// (/webhooks/in/{name}), and starts the deliveries, which run until ctx ends
// (Wait waits for them). rt is what inbound decisions are answered through.
// Start may be called once.
func (a *Adapter) Start(ctx context.Context, rt channels.Runtime, mux *http.ServeMux) error {
	if !a.started.CompareAndSwap(false, true) {
		return errors.New("webhooks: Start called twice")
	}
	if len(a.inbound) > 0 && (rt == nil || mux == nil) {
		return errors.New("webhooks: inbound endpoints need a runtime and an HTTP mux")
	}
	js, err := jetstream.New(a.env.NATS, jetstream.WithPublishAsyncErrHandler(func(_ jetstream.JetStream, m *nats.Msg, err error) {
		a.log.Warn("cannot write the delivery log", zap.String("stream", LogStream), zap.String("subject", m.Subject), zap.Error(err))
	}))
	if err != nil {
		return fmt.Errorf("webhooks: %w", err)
	}
	a.js, a.rt = js, rt
	deliverers := make([]*deliverer, 0, len(a.endpoints))
	if len(a.endpoints) > 0 {
		if _, err := js.CreateOrUpdateStream(ctx, logStreamConfig()); err != nil {
			return fmt.Errorf("webhooks: delivery log stream %s: %w", LogStream, err)
		}
		codec := events.Codec{MaxSize: int(a.env.NATS.MaxPayload())}
		for _, ep := range a.endpoints {
			cons, err := handler.Durable(ctx, js, consumerConfig(ep.name))
			if err != nil {
				return fmt.Errorf("webhooks: endpoint %s: consumer: %w", ep.name, err)
			}
			deliverers = append(deliverers, &deliverer{
				ep: ep, js: js, client: a.client, codec: codec, cons: cons, agents: newAgentCache(), trusted: a.env.Trusted,
				log: a.log.With(zap.String("endpoint", ep.name)),
			})
		}
	}
	if len(a.inbound) > 0 {
		kv, err := js.CreateOrUpdateKeyValue(ctx, seenBucketConfig())
		if err != nil {
			return fmt.Errorf("webhooks: replay bucket %s: %w", SeenBucket, err)
		}
		a.ids, a.seen = kv, newSeenSet(seenSetSize)
	}
	if mux != nil {
		mux.HandleFunc("/webhooks/in/{name}", a.serveInbound)
	}
	for _, d := range deliverers {
		a.wg.Go(func() { d.run(ctx) })
	}
	a.log.Info("webhooks running", zap.Int("endpoints", len(a.endpoints)), zap.Int("inbound", len(a.inbound)))
	return nil
}

// Wait blocks until the deliveries Start began have stopped: after ctx ends,
// within a pull's wait (2s) and the longest endpoint timeout, and with the
// delivery log's last records written (bounded by 5s).
func (a *Adapter) Wait() { a.wg.Wait() }

// seenBucketConfig is the bucket that remembers inbound webhook-ids across
// processes for longer than a timestamp stays acceptable (2 × Tolerance: a
// message may be stamped up to Tolerance ahead of the receiver's clock).
func seenBucketConfig() jetstream.KeyValueConfig {
	return jetstream.KeyValueConfig{
		Bucket:      SeenBucket,
		Description: "Assent approver bot: inbound webhook-ids seen, against replays",
		History:     1,
		TTL:         2 * Tolerance,
		Storage:     jetstream.FileStorage,
	}
}

// SeenBucket is the KV bucket of inbound webhook-ids seen.
const SeenBucket = "assent-webhook-ids"

// seenSetSize bounds the webhook-ids one process remembers itself.
const seenSetSize = 100_000

// seenSet is a bounded set of keys, each forgotten after 2 × Tolerance: a
// process's own memory of the webhook-ids it accepted, checked before the
// bucket.
type seenSet struct {
	mu    sync.Mutex
	max   int
	at    map[string]time.Time
	order []string // keys, oldest first
}

func newSeenSet(max int) *seenSet { return &seenSet{max: max, at: map[string]time.Time{}} }

// add records key, and reports false if it was already there.
func (s *seenSet) add(key string, now time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if t, ok := s.at[key]; ok && now.Sub(t) < 2*Tolerance {
		return false
	}
	for len(s.order) > 0 {
		k := s.order[0]
		t, ok := s.at[k]
		if ok && now.Sub(t) < 2*Tolerance && len(s.at) < s.max {
			break
		}
		delete(s.at, k)
		s.order = s.order[1:]
	}
	s.at[key] = now
	s.order = append(s.order, key)
	return true
}

// remove forgets key, so that a message refused after add may be sent again.
func (s *seenSet) remove(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.at, key)
}
