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

	// TimerStreamName is the stream of the broker's durable schedules
	// (ticks.go), on TimerSubjects. It is apart from the ASSENT stream so
	// that the stream everyone publishes into takes no schedules: the
	// server checks a publisher's permissions on a schedule's subject, not
	// on its target, and a client that could schedule into ASSENT could
	// have the server store a message on any of its subjects.
	TimerStreamName = "ASSENT_TIMERS"
	TimerSubjects   = timerSpace + ">"

	// Internal subjects of the ASSENT stream. TimerPrefix held the durable
	// schedules of brokers before ASSENT_TIMERS; those a stream made then
	// still holds fire as they always did. TimeoutPrefix+id expires request
	// id: brokers before durable ticks scheduled one per request onto it,
	// and it is still handled for the schedules such a broker left behind.
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
		Name:        StreamName,
		Description: "Assent approval events: requests, answers, decisions (the audit trail)",
		Subjects:    []string{events.AllSubjects},
		Retention:   jetstream.LimitsPolicy,
		Storage:     jetstream.FileStorage,
		Discard:     jetstream.DiscardOld,
		MaxAge:      c.Retention,
		MaxMsgSize:  int32(c.MaxEventSize + eventHeadroom),
		Duplicates:  dedupeWindow,
		Replicas:    c.Replicas,
		AllowDirect: true,
		// No schedules and no per-message TTLs: nobody may have the
		// server store a message where it may not publish, nor have a
		// message of the record removed before its time. A stream made by
		// a broker before ASSENT_TIMERS keeps both (the server refuses to
		// turn them off); see provision.
		// The server tells of a decision only once it stored it: readers
		// take assent-decided.<id>, never the stored subject, which a
		// plain subscriber sees even when the stream refuses the message.
		RePublish: &jetstream.RePublish{
			Source:      events.DecisionPrefix + "*",
			Destination: events.DecidedPrefix + "{{wildcard(1)}}",
		},
	}
}

// timerStreamConfig is the stream of the broker's durable schedules. A
// schedule is removed when it fires; what it stores where it fires (a
// tick) lives timerTickTTL, long after the ticks consumer took it.
func timerStreamConfig(c Config) jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:              TimerStreamName,
		Description:       "Assent broker: durable schedules of the deadlines' seconds",
		Subjects:          []string{TimerSubjects},
		Retention:         jetstream.LimitsPolicy,
		Storage:           jetstream.FileStorage,
		Discard:           jetstream.DiscardOld,
		MaxMsgSize:        1024,
		Replicas:          c.Replicas,
		AllowMsgSchedules: true,
		AllowMsgTTL:       true,
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
	timers    jetstream.Stream
	requests  jetstream.Consumer
	responses jetstream.Consumer
	cancels   jetstream.Consumer
	timeouts  jetstream.Consumer
	ticks     jetstream.Consumer
	timerTick jetstream.Consumer
	// legacy: the ASSENT stream was made before ASSENT_TIMERS and still
	// takes schedules and per-message TTLs from anyone who may publish
	// into it.
	legacy bool
}

// provision creates or updates every resource. It is idempotent and safe to run
// from several replicas at once.
func provision(ctx context.Context, js jetstream.JetStream, c Config) (*resources, error) {
	var r resources
	var err error
	cfg := streamConfig(c)
	switch old, err := js.Stream(ctx, StreamName); {
	case errors.Is(err, jetstream.ErrStreamNotFound):
	case err != nil:
		return nil, fmt.Errorf("stream %s: %w", StreamName, err)
	default:
		// The server refuses to turn schedules or TTLs off on a stream
		// that has them: such a stream keeps them, and the broker says so.
		oc := old.CachedInfo().Config
		cfg.AllowMsgSchedules, cfg.AllowMsgTTL = oc.AllowMsgSchedules, oc.AllowMsgTTL
		r.legacy = oc.AllowMsgSchedules || oc.AllowMsgTTL
	}
	if r.stream, err = js.CreateOrUpdateStream(ctx, cfg); err != nil {
		return nil, fmt.Errorf("stream %s: %w", StreamName, err)
	}
	if r.timers, err = js.CreateOrUpdateStream(ctx, timerStreamConfig(c)); err != nil {
		return nil, fmt.Errorf("stream %s: %w", TimerStreamName, err)
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
	tc := consumerConfig(c, consumerTimerTicks, timerAt+">")
	tc.AckWait = c.timeoutAckWait()
	if r.timerTick, err = r.timers.CreateOrUpdateConsumer(ctx, tc); err != nil {
		return nil, fmt.Errorf("consumer %s: %w", consumerTimerTicks, err)
	}
	return &r, nil
}

// StreamConfig is the configuration of the ASSENT stream that a broker with
// configuration c provisions (defaults applied), for tests and tools that
// build the stream without running a broker.
func StreamConfig(c Config) jetstream.StreamConfig { return streamConfig(c.WithDefaults()) }
