package broker

import (
	"context"
	"encoding/json"
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

// watchPresence keeps b.presence in step with the presence bucket.
func (b *Broker) watchPresence(ctx context.Context) error {
	b.follow(ctx, b.res.presence, "approver presence", func(entry jetstream.KeyValueEntry) {
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
	}, func() { close(b.presence.ready) })
	return nil
}
