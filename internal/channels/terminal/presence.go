package terminal

import (
	"context"
	"encoding/json"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/assent-dev/assent/pkg/events"
)

// announce tells brokers that principal is reachable on the terminal: it
// puts the presence entry <principal>.cli every events.PresenceRefresh
// until ctx ends, then deletes it. A broker that counts only announced
// principals (on_no_approver) then waits for this terminal's user instead of
// failing the request at once. The bucket appears when a broker first
// starts; until then each round tries to open it again.
func announce(ctx context.Context, js jetstream.JetStream, log *zap.Logger, principal string) {
	key, err := events.PresenceKey(principal, Channel)
	if err != nil {
		log.Warn("cannot announce presence", zap.Error(err))
		return
	}
	var kv jetstream.KeyValue
	warned := false
	put := func() {
		if kv == nil {
			b, err := js.KeyValue(ctx, events.PresenceBucket)
			if err != nil {
				if !warned && ctx.Err() == nil {
					log.Warn("cannot announce presence yet", zap.Error(err))
					warned = true
				}
				return
			}
			kv = b
		}
		val, _ := json.Marshal(events.Announcement{Principal: principal, Channel: Channel, At: time.Now().UTC()})
		if _, err := kv.Put(ctx, key, val); err != nil && ctx.Err() == nil {
			log.Warn("announce presence", zap.Error(err))
		}
	}
	put()
	t := time.NewTicker(events.PresenceRefresh)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			if kv != nil {
				dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
				_ = kv.Delete(dctx, key)
				cancel()
			}
			return
		case <-t.C:
			put()
		}
	}
}
