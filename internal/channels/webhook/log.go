package webhook

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/assent-dev/assent/pkg/events"
)

// The delivery log: one JSON Attempt per delivery attempt, in a stream of its
// own. Its subjects are outside assent.>, which the ASSENT stream holds (two
// streams may not share subjects), and so stay out of the audit trail.
const (
	// LogStream is the stream holding the delivery log.
	LogStream = "ASSENT_WEBHOOKS"
	// LogSubjectPrefix + <endpoint> is where an endpoint's attempts go.
	LogSubjectPrefix = "assent-bot.webhooks."
	// LogMaxAge is how long attempts are kept.
	LogMaxAge = 7 * 24 * time.Hour
	// LogMaxBytes bounds the log's size; the oldest attempts go first.
	LogMaxBytes = 1 << 30
)

// logStreamConfig is the delivery log stream, applied with create-or-update.
func logStreamConfig() jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:        LogStream,
		Description: "Assent approver bot: webhook delivery attempts (approver-bot webhooks log)",
		Subjects:    []string{LogSubjectPrefix + ">"},
		Retention:   jetstream.LimitsPolicy,
		Storage:     jetstream.FileStorage,
		Discard:     jetstream.DiscardOld,
		MaxAge:      LogMaxAge,
		MaxBytes:    LogMaxBytes,
		AllowDirect: true,
	}
}

// Attempt is one delivery attempt of one event to one endpoint, as the
// delivery log records it.
type Attempt struct {
	Endpoint  string `json:"endpoint"`
	EventID   string `json:"event_id"`
	Type      string `json:"type"`
	RequestID string `json:"request_id,omitempty"`
	// Attempt counts the deliveries of this event to this endpoint: 1 for
	// the first.
	Attempt int `json:"attempt"`
	// Status is the receiver's HTTP status; 0 when there was no answer.
	Status int `json:"status,omitempty"`
	// Error says why the attempt failed: no answer (refused, timed out),
	// or a status outside 2xx.
	Error string `json:"error,omitempty"`
	// Response is the start of the receiver's answer to a failed attempt.
	Response string `json:"response,omitempty"`
	// Delivered is true for a 2xx answer: the event will not be sent again.
	Delivered bool            `json:"delivered"`
	Duration  events.Duration `json:"duration"`
	// RetryIn is when the next attempt is due, after a failure.
	RetryIn events.Duration `json:"retry_in,omitempty"`
	At      time.Time       `json:"at"`
}

// Log writes the delivery attempts recorded since since (zero: all the log
// keeps), to endpoint or (with endpoint "") to every endpoint, to w as JSON
// lines, oldest first, and returns once it has written every attempt recorded
// when it started.
func Log(ctx context.Context, js jetstream.JetStream, endpoint string, since time.Time, w io.Writer) error {
	filter := LogSubjectPrefix + ">"
	if endpoint != "" {
		if !events.ValidToken(endpoint) {
			return fmt.Errorf("webhooks log: endpoint %q: not an endpoint name (1-%d characters of A-Z a-z 0-9 _ -)", truncate(endpoint, 40), events.MaxTokenLength)
		}
		filter = LogSubjectPrefix + endpoint
	}
	s, err := js.Stream(ctx, LogStream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return fmt.Errorf("webhooks log: no delivery log on this NATS server (stream %s): it appears when approver-bot first runs with webhook endpoints", LogStream)
	}
	if err != nil {
		return fmt.Errorf("webhooks log: stream %s: %w", LogStream, err)
	}
	cfg := jetstream.OrderedConsumerConfig{FilterSubjects: []string{filter}, DeliverPolicy: jetstream.DeliverAllPolicy}
	if !since.IsZero() {
		cfg.DeliverPolicy, cfg.OptStartTime = jetstream.DeliverByStartTimePolicy, &since
	}
	cons, err := s.OrderedConsumer(ctx, cfg)
	if err != nil {
		return fmt.Errorf("webhooks log: read %s: %w", LogStream, err)
	}
	if info := cons.CachedInfo(); info != nil && info.NumPending == 0 {
		return nil
	}
	var line bytes.Buffer
	for {
		done, n, err := logBatch(ctx, cons, w, &line)
		if done || err != nil {
			return err
		}
		if n == 0 {
			// Nothing came for a while, though attempts were pending: they
			// aged out while being read.
			return ctx.Err()
		}
	}
}

// logBatch writes one batch of attempts to w; done is true once the last
// pending attempt is written.
func logBatch(ctx context.Context, cons jetstream.Consumer, w io.Writer, line *bytes.Buffer) (done bool, n int, err error) {
	fctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	batch, err := cons.Fetch(256, jetstream.FetchContext(fctx))
	if err != nil {
		return false, 0, fmt.Errorf("webhooks log: read %s: %w", LogStream, err)
	}
	for msg := range batch.Messages() {
		n++
		line.Reset()
		if err := json.Compact(line, msg.Data()); err == nil {
			line.WriteByte('\n')
			if _, err := w.Write(line.Bytes()); err != nil {
				return false, n, err
			}
		}
		if md, err := msg.Metadata(); err == nil && md.NumPending == 0 {
			return true, n, nil
		}
	}
	if err := batch.Error(); err != nil && ctx.Err() == nil && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, jetstream.ErrNoMessages) {
		return false, n, fmt.Errorf("webhooks log: read %s: %w", LogStream, err)
	}
	return false, n, ctx.Err()
}
