package broker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/assent-dev/assent/pkg/policy"
)

// LimitBucket holds the running totals of the policy's limits, one key per
// limit and scope (policy.Limit.Key). Every replica charges them with a
// compare-and-set, so a total never passes its maximum however many replicas
// approve at once.
const LimitBucket = "assent-limits"

func limitBucketConfig(c Config) jetstream.KeyValueConfig {
	return jetstream.KeyValueConfig{
		Bucket:      LimitBucket,
		Description: "Assent running totals of policy limits on automatic approvals",
		History:     1,
		TTL:         c.Retention,
		Storage:     jetstream.FileStorage,
		Replicas:    c.Replicas,
	}
}

// limitTotal is the value of a limit entry. Since starts the current window.
type limitTotal struct {
	Total float64   `json:"total"`
	Since time.Time `json:"since"`
}

type charged struct {
	l      *policy.Limit
	amount float64
}

// charge counts an automatic approval against every limit res names. If one
// would pass its maximum (or its amount cannot be computed), the charges made
// so far are taken back and the limit's outcome replaces res.
//
// A crash between a charge and storing the request can count a request twice
// when it is redelivered: limits err on the safe side, never over the maximum.
func (b *Broker) charge(ctx context.Context, res policy.Result, in policy.Input, now time.Time) (policy.Result, error) {
	var done []charged
	for _, l := range res.Limits {
		amount, err := l.Amount(in)
		ok := err == nil
		if ok {
			if ok, err = b.addToLimit(ctx, l, in, amount, now); err != nil {
				b.refund(ctx, done, in, now)
				return res, err
			}
		}
		if !ok {
			b.refund(ctx, done, in, now)
			return res.Exceeded(l, in), nil
		}
		done = append(done, charged{l, amount})
	}
	return res, nil
}

func (b *Broker) refund(ctx context.Context, done []charged, in policy.Input, now time.Time) {
	for _, c := range done {
		if _, err := b.addToLimit(ctx, c.l, in, -c.amount, now); err != nil {
			b.log.Warn("could not take back a limit charge; the total stays higher than it is")
		}
	}
}

// addToLimit adds amount to l's running total for in, if the result stays within
// the limit (a negative amount always applies). It reports whether it did.
func (b *Broker) addToLimit(ctx context.Context, l *policy.Limit, in policy.Input, amount float64, now time.Time) (bool, error) {
	key := l.Key(in)
	for range maxCASAttempts {
		var cur limitTotal
		var rev uint64
		cctx, cancel := callCtx(ctx)
		entry, err := b.res.limits.Get(cctx, key)
		cancel()
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound), errors.Is(err, jetstream.ErrKeyDeleted):
		case err != nil:
			return false, fmt.Errorf("limit %s: %w", l.Name, err)
		default:
			if err := json.Unmarshal(entry.Value(), &cur); err != nil {
				return false, fmt.Errorf("limit %s: corrupt total: %w", l.Name, err)
			}
			rev = entry.Revision()
		}
		if cur.Since.IsZero() || (l.Window > 0 && now.Sub(cur.Since) >= l.Window) {
			cur = limitTotal{Since: now.UTC()}
		}
		if amount > 0 && !l.Allows(cur.Total, amount) {
			return false, nil
		}
		cur.Total = max(cur.Total+amount, 0)
		val, _ := json.Marshal(cur)
		cctx, cancel = callCtx(ctx)
		if rev == 0 {
			_, err = b.res.limits.Create(cctx, key, val)
		} else {
			_, err = b.res.limits.Update(cctx, key, val, rev)
		}
		cancel()
		if errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			continue // another replica charged first; read again
		}
		if err != nil {
			return false, fmt.Errorf("limit %s: %w", l.Name, err)
		}
		return true, nil
	}
	return false, fmt.Errorf("limit %s: too much contention", l.Name)
}
