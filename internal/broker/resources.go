package broker

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/assent-dev/assent/pkg/events"
)

// Names of the JetStream resources the broker owns.
const (
	StreamName  = events.StreamName
	StateBucket = events.StateBucket

	// Internal subjects, in the same stream. TimerPrefix holds durable
	// schedules (see ticks.go). TimeoutPrefix+id expires request id: brokers
	// before durable ticks scheduled one per request onto it, and it is still
	// handled for the schedules such a broker left behind.
	TimerPrefix   = "assent.timer."
	TimeoutPrefix = "assent.timeout."

	consumerRequests  = "assent-broker-requests"
	consumerResponses = "assent-broker-responses"
	consumerCancels   = "assent-broker-cancels"
	consumerTimeouts  = "assent-broker-timeouts"

	// dedupeWindow is how long JetStream remembers a Nats-Msg-Id: long
	// enough for a client's publish retries and the broker's redeliveries.
	// A request published again later is still the same request (the broker
	// finds its id stored); the window only spares that work. Each id costs
	// the server about 130 bytes while remembered, so at 10,000 requests a
	// second (each with its pending notice) NATS's two-minute default would
	// hold 2.4 million ids, 300 MB.
	dedupeWindow = 30 * time.Second
)

// streamConfig is the one stream: the log and the audit trail.
func streamConfig(c Config) jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:              StreamName,
		Description:       "Assent approval events: requests, answers, decisions (the audit trail)",
		Subjects:          []string{events.AllSubjects},
		Retention:         jetstream.LimitsPolicy,
		Storage:           jetstream.FileStorage,
		Discard:           jetstream.DiscardOld,
		MaxAge:            c.Retention,
		MaxMsgSize:        int32(c.MaxEventSize + eventHeadroom),
		Duplicates:        dedupeWindow,
		Replicas:          c.Replicas,
		AllowDirect:       true,
		AllowMsgSchedules: true,
		AllowMsgTTL:       true,
		// The server tells of a decision only once it stored it: readers
		// take assent-decided.<id>, never the stored subject, which a
		// plain subscriber sees even when the stream refuses the message.
		RePublish: &jetstream.RePublish{
			Source:      events.DecisionPrefix + "*",
			Destination: events.DecidedPrefix + "{{wildcard(1)}}",
		},
	}
}

// maxDeliver is how many times a consumer hands out one message; the broker
// settles it for good on the last.
const maxDeliver = 20

func consumerConfig(c Config, name, filter string) jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{
		Durable:       name,
		Description:   "Assent broker: " + filter,
		FilterSubject: filter,
		DeliverPolicy: jetstream.DeliverAllPolicy,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       c.AckWait,
		MaxDeliver:    maxDeliver,
		MaxAckPending: 4 * c.Workers,
		Replicas:      c.Replicas,
	}
}

type resources struct {
	stream    jetstream.Stream
	state     jetstream.KeyValue
	grants    jetstream.KeyValue
	presence  jetstream.KeyValue
	limits    jetstream.KeyValue
	requests  jetstream.Consumer
	responses jetstream.Consumer
	cancels   jetstream.Consumer
	timeouts  jetstream.Consumer
	ticks     jetstream.Consumer
}

// provision creates or updates every resource. It is idempotent and safe to run
// from several replicas at once.
func provision(ctx context.Context, js jetstream.JetStream, c Config) (*resources, error) {
	var r resources
	var err error
	if r.stream, err = js.CreateOrUpdateStream(ctx, streamConfig(c)); err != nil {
		return nil, fmt.Errorf("stream %s: %w", StreamName, err)
	}
	// The state bucket of brokers before the stream decided: read once by
	// the migration (migrate.go), never written.
	switch r.state, err = js.KeyValue(ctx, StateBucket); {
	case errors.Is(err, jetstream.ErrBucketNotFound):
		r.state = nil
	case err != nil:
		return nil, fmt.Errorf("bucket %s: %w", StateBucket, err)
	}
	if r.grants, err = js.CreateOrUpdateKeyValue(ctx, grantBucketConfig(c)); err != nil {
		return nil, fmt.Errorf("bucket %s: %w", GrantBucket, err)
	}
	if r.limits, err = js.CreateOrUpdateKeyValue(ctx, limitBucketConfig(c)); err != nil {
		return nil, fmt.Errorf("bucket %s: %w", LimitBucket, err)
	}
	if r.presence, err = js.CreateOrUpdateKeyValue(ctx, presenceBucketConfig(c)); err != nil {
		return nil, fmt.Errorf("bucket %s: %w", events.PresenceBucket, err)
	}
	for _, cc := range []struct {
		dst            *jetstream.Consumer
		name, subjects string
	}{
		{&r.requests, consumerRequests, events.RequestPrefix + "*"},
		{&r.responses, consumerResponses, events.ResponsePrefix + "*.*"},
		{&r.cancels, consumerCancels, events.CancelPrefix + ">"}, // <id>, and <agent>.<id>
		{&r.timeouts, consumerTimeouts, TimeoutPrefix + "*"},
		{&r.ticks, consumerTicks, TickPrefix + ">"},
	} {
		cfg := consumerConfig(c, cc.name, cc.subjects)
		if cc.name == consumerTimeouts || cc.name == consumerTicks {
			cfg.AckWait = c.timeoutAckWait()
		}
		if *cc.dst, err = r.stream.CreateOrUpdateConsumer(ctx, cfg); err != nil {
			return nil, fmt.Errorf("consumer %s: %w", cc.name, err)
		}
	}
	return &r, nil
}

// StreamConfig is the configuration of the ASSENT stream that a broker with
// configuration c provisions (defaults applied), for tests and tools that
// build the stream without running a broker.
func StreamConfig(c Config) jetstream.StreamConfig { return streamConfig(c.WithDefaults()) }
