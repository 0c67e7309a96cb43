package broker

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/assent-dev/assent/pkg/events"
)

func presenceBucketConfig(c Config) jetstream.KeyValueConfig {
	return jetstream.KeyValueConfig{
		Bucket:      events.PresenceBucket,
		Description: "Assent live approver channels: <principal>.<channel>, expiring when not refreshed",
		History:     1,
		TTL:         events.PresenceTTL,
		Storage:     jetstream.MemoryStorage,
		Replicas:    c.Replicas,
	}
}

// presence is this replica's view of which principals a live channel reaches;
// it implements policy.Presence.
type presence struct {
	everyone bool // an open HTTP gateway reaches every principal
	ready    chan struct{}
	mu       sync.RWMutex
	live     map[string]events.Announcement // key -> announcement
}

func (p *presence) Everyone() bool { return p.everyone }

func (p *presence) Live() []string {
	p.mu.RLock()
	defer p.mu.RUnlock()
	cutoff := time.Now().Add(-events.PresenceTTL)
	seen := make(map[string]bool, len(p.live))
	out := make([]string, 0, len(p.live))
	for _, a := range p.live {
		if a.At.After(cutoff) && !seen[a.Principal] {
			seen[a.Principal] = true
			out = append(out, a.Principal)
		}
	}
	return out
}

// presenceCheck is how often a replica checks that the presence bucket
// exists. It lives in memory: a NATS restart loses it.
const presenceCheck = events.PresenceRefresh / 2

// watchPresence keeps b.presence in step with the presence bucket. When the
// bucket is gone (NATS restarted) it makes it again and follows the new one
// from its start: the running channels announce themselves in it within
// events.PresenceRefresh, before the announcements this replica holds go
// stale.
func (b *Broker) watchPresence(ctx context.Context) error {
	kv := b.res.presence
	for ctx.Err() == nil {
		wctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() {
			defer close(done)
			b.followPresence(wctx, kv)
		}()
		if made := b.awaitPresenceLoss(wctx); made != nil {
			kv = made
		}
		cancel()
		<-done
	}
	return nil
}

// awaitPresenceLoss returns nil when ctx ends, or the bucket it made again
// after finding it gone.
func (b *Broker) awaitPresenceLoss(ctx context.Context) jetstream.KeyValue {
	t := time.NewTicker(presenceCheck)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		if _, err := b.js.KeyValue(ctx, events.PresenceBucket); !errors.Is(err, jetstream.ErrBucketNotFound) {
			continue // there, or NATS unreachable: nothing to do yet
		}
		kv, err := b.js.CreateOrUpdateKeyValue(ctx, presenceBucketConfig(b.cfg))
		if err != nil {
			if ctx.Err() == nil {
				b.log.Warn("the presence bucket is gone and cannot be made again yet; retrying", zap.String("bucket", events.PresenceBucket), zap.Error(err))
			}
			continue
		}
		b.log.Warn("the presence bucket was gone (a NATS restart loses it: it lives in memory); made it again, channels announce themselves in it again",
			zap.String("bucket", events.PresenceBucket))
		return kv
	}
}

// followPresence applies the bucket's entries to b.presence until ctx ends.
func (b *Broker) followPresence(ctx context.Context, kv jetstream.KeyValue) {
	ready := b.presence.ready
	b.follow(ctx, kv, "approver presence", func(entry jetstream.KeyValueEntry) {
		b.presence.mu.Lock()
		defer b.presence.mu.Unlock()
		if entry.Operation() != jetstream.KeyValuePut {
			delete(b.presence.live, entry.Key())
			return
		}
		var a events.Announcement
		if err := json.Unmarshal(entry.Value(), &a); err != nil || a.Principal == "" {
			b.log.Warn("ignoring a presence entry that is not an announcement: want {\"principal\", \"channel\", \"at\"} (docs/protocol.md)",
				zap.String("key", entry.Key()), zap.String("value", truncate(string(entry.Value()), 120)), zap.Error(err))
			delete(b.presence.live, entry.Key())
			return
		}
		b.presence.live[entry.Key()] = a
	}, func() {
		select {
		case <-ready:
		default:
			close(ready)
		}
	})
}
