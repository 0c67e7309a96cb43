package broker

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// MigratedSubject holds the marker a broker stores once the stream is the
// one source of truth: decisions stored before it were made by brokers that
// chose outcomes in the state bucket (their event ids are not derived from
// their triggers), and a broker that finds that bucket imports it before
// storing the marker.
const MigratedSubject = "assent.meta.migrated"

// markMigrated stores the marker, unless the stream holds it.
func (b *Broker) markMigrated(ctx context.Context) error {
	cctx, cancel := callCtx(ctx)
	_, err := b.res.stream.GetLastMsgForSubject(cctx, MigratedSubject)
	cancel()
	switch {
	case err == nil:
		return nil
	case !errors.Is(err, jetstream.ErrMsgNotFound):
		return fmt.Errorf("read the migration marker: %w", err)
	}
	_, err = b.publish(ctx, &nats.Msg{Subject: MigratedSubject, Data: []byte(b.source)}, jetstream.WithMsgID("migrated"))
	if err != nil {
		return fmt.Errorf("store the migration marker: %w", err)
	}
	return nil
}
