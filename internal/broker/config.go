package broker

import (
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/nats-io/nkeys"
	"go.opentelemetry.io/otel/trace"

	"github.com/assent-dev/assent/pkg/events"
	"github.com/assent-dev/assent/pkg/policy"
)

// Mode is what the broker does with a request when no rule says otherwise.
type Mode string

// Modes.
const (
	ModeManual      Mode = "manual"
	ModeAutoApprove Mode = "auto-approve"
	ModeAutoDeny    Mode = "auto-deny"
)

// ParseMode checks s names a mode.
func ParseMode(s string) (Mode, error) {
	switch m := Mode(s); m {
	case ModeManual, ModeAutoApprove, ModeAutoDeny:
		return m, nil
	}
	return "", fmt.Errorf("unknown mode %q (want manual, auto-approve or auto-deny)", s)
}

// Config holds the broker's settings. The zero value, after WithDefaults, is a
// single-replica broker in manual mode with a 5 minute default timeout.
type Config struct {
	// Name identifies this replica in logs and as the source of its events
	// ("broker/<name>"). Default: the host name.
	Name string
	// Mode decides requests when no Policy is given. Default manual.
	Mode Mode
	// AnnouncedOnly says no open HTTP gateway serves this broker, so only the
	// principals that approver channels announce are reachable; a request whose
	// rule has no reachable eligible approver gets the rule's on_no_approver
	// outcome at once. When false (the default, as with the broker's own HTTP
	// API without authentication), every principal counts as reachable.
	AnnouncedOnly bool
	// Policy decides who must approve what; nil means the built-in policy:
	// Mode decides, anyone may approve, answers may be remembered.
	Policy *policy.Policy
	// Shadow, if set, is a candidate policy evaluated beside Policy for every
	// request; where the two disagree the broker publishes an audit event on
	// assent.audit.shadow.<id> and counts it, and never acts on it.
	Shadow *policy.Policy
	// DefaultTimeout applies when a request asks for none. Default 5m.
	DefaultTimeout time.Duration
	// MinTimeout and MaxTimeout clamp what a request asks for. Defaults 1s and 24h.
	MinTimeout, MaxTimeout time.Duration
	// Workers bounds how many messages each consumer handles at once. Default 64.
	Workers int
	// Retention is how long the stream (the audit trail) and request state are
	// kept. Default 720h (30 days); must exceed MaxTimeout.
	Retention time.Duration
	// Replicas is the JetStream replication factor for the stream and buckets.
	// Default 1; use 3 on a cluster.
	Replicas int
	// MaxEventSize bounds one incoming event, body plus headers. Default 1 MiB.
	MaxEventSize int
	// Observe, if set, is called with every outcome this replica stores (for
	// metrics). It must not block.
	Observe func(Decision)
	// KeepDecided is how many decided requests the replica's index keeps for
	// listings, newest first. Default 10000.
	KeepDecided int
	// DecisionKey, if set, signs every decided event the broker publishes
	// (events.Signer: the assentsig attribute, docs/protocol.md): an nkeys
	// account key pair with its seed, such as events.ParseDecisionKey reads
	// from a seed file. Readers that trust its public key take the first
	// decided event on a decision subject that it signed, so a decided event
	// someone else published first no longer blocks the broker's: the broker
	// logs and counts the forgery and publishes its own after it. Nil: decided
	// events are not signed, and a forgery stored first is the decision that
	// readers see (the broker reports ErrForgedDecision).
	DecisionKey nkeys.KeyPair
	// TrustedDecisionKeys are the public keys ("A...") of earlier decision
	// keys, while keys rotate: a decided event one of them signed is a
	// broker's, not a forgery. Only with DecisionKey, which is always trusted.
	TrustedDecisionKeys []string
	// AckWait is how long a message handed to a replica stays its own before it
	// is redelivered (a handler that runs longer keeps it with progress
	// heartbeats). It bounds how late a request handed to a replica that then
	// crashed is seen by another. Default 2s.
	AckWait time.Duration
	// CheckpointInterval is how often the broker stores a checkpoint of the
	// chained record (internal/chain): the hash chain's head over what the
	// stream stored since the last one, signed with DecisionKey. Default
	// 10s; negative: never.
	CheckpointInterval time.Duration
	// TracerProvider makes the broker's spans, which join each request's
	// trace (docs/tracing.md); nil uses OpenTelemetry's global provider.
	TracerProvider trace.TracerProvider

	// feedIdle is how long the event feed reads the stream after its last
	// subscriber left (tests shorten it). Default feedIdle.
	feedIdle time.Duration
}

// DefaultCheckpointInterval is how often the broker stores a checkpoint of
// the chained record unless configured otherwise.
const DefaultCheckpointInterval = 10 * time.Second

// WithDefaults returns c with every unset field at its default.
func (c Config) WithDefaults() Config {
	if c.Name == "" {
		c.Name, _ = os.Hostname()
		if !events.ValidToken(c.Name) {
			c.Name = "broker"
		}
	}
	if c.Mode == "" {
		c.Mode = ModeManual
	}
	if c.DefaultTimeout == 0 {
		c.DefaultTimeout = 5 * time.Minute
	}
	if c.MinTimeout == 0 {
		c.MinTimeout = time.Second
	}
	if c.MaxTimeout == 0 {
		c.MaxTimeout = 24 * time.Hour
	}
	if c.Workers == 0 {
		c.Workers = 64
	}
	if c.Retention == 0 {
		c.Retention = 30 * 24 * time.Hour
	}
	if c.Replicas == 0 {
		c.Replicas = 1
	}
	if c.MaxEventSize == 0 {
		c.MaxEventSize = events.DefaultMaxEventSize
	}
	if c.AckWait == 0 {
		c.AckWait = 2 * time.Second
	}
	if c.KeepDecided == 0 {
		c.KeepDecided = DefaultKeepDecided
	}
	if c.CheckpointInterval == 0 {
		c.CheckpointInterval = DefaultCheckpointInterval
	}
	return c
}

// Validate reports every problem with c at once. Call it on WithDefaults' result.
func (c Config) Validate() error {
	var errs []error
	if !events.ValidToken(c.Name) {
		errs = append(errs, fmt.Errorf("name %q: want 1-128 characters of A-Z a-z 0-9 _ -", c.Name))
	}
	if _, err := ParseMode(string(c.Mode)); err != nil {
		errs = append(errs, err)
	}
	if c.MinTimeout <= 0 {
		errs = append(errs, fmt.Errorf("min timeout %s: must be positive", c.MinTimeout))
	}
	if c.MaxTimeout < c.MinTimeout {
		errs = append(errs, fmt.Errorf("max timeout %s is below min timeout %s", c.MaxTimeout, c.MinTimeout))
	}
	if c.DefaultTimeout < c.MinTimeout || c.DefaultTimeout > c.MaxTimeout {
		errs = append(errs, fmt.Errorf("default timeout %s is outside %s..%s", c.DefaultTimeout, c.MinTimeout, c.MaxTimeout))
	}
	if c.Workers < 1 || c.Workers > 4096 {
		errs = append(errs, fmt.Errorf("workers %d: want 1..4096", c.Workers))
	}
	if c.Retention <= c.MaxTimeout {
		errs = append(errs, fmt.Errorf("retention %s must exceed max timeout %s, or decisions would vanish before requests end", c.Retention, c.MaxTimeout))
	}
	if c.Replicas < 1 || c.Replicas > 5 {
		errs = append(errs, fmt.Errorf("replicas %d: want 1..5", c.Replicas))
	}
	if c.MaxEventSize < 1024 {
		errs = append(errs, fmt.Errorf("max event size %d: want at least 1024 bytes", c.MaxEventSize))
	}
	if c.KeepDecided < 1 {
		errs = append(errs, fmt.Errorf("keep decided %d: want at least 1", c.KeepDecided))
	}
	if c.AckWait < time.Second {
		errs = append(errs, fmt.Errorf("ack wait %s: want at least 1s", c.AckWait))
	}
	if c.DecisionKey != nil {
		if _, err := events.NewSigner(c.DecisionKey); err != nil {
			errs = append(errs, err)
		}
	}
	if _, err := events.NewTrustedKeys(c.TrustedDecisionKeys...); err != nil {
		errs = append(errs, err)
	}
	if len(c.TrustedDecisionKeys) > 0 && c.DecisionKey == nil {
		errs = append(errs, errors.New("trusted decision keys without a decision key: a broker that does not sign trusts no key"))
	}
	return errors.Join(errs...)
}

// clamp returns the timeout a request gets.
func (c Config) clamp(asked time.Duration) time.Duration {
	switch {
	case asked <= 0:
		return c.DefaultTimeout
	case asked < c.MinTimeout:
		return c.MinTimeout
	case asked > c.MaxTimeout:
		return c.MaxTimeout
	}
	return asked
}

// timeoutAckWait is the timeouts consumer's ack wait: expiring a request is
// quick, and a trigger held by a replica that died or was cut off must come
// back well within the 2 seconds a deadline may be missed by.
func (c Config) timeoutAckWait() time.Duration { return min(c.AckWait, time.Second) }
