package broker

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
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

// migrate brings what a broker before the stream decided left in the state
// bucket onto the stream, before the ledger reads it (docs/architecture.md,
// "Upgrading from the state bucket"):
//
//   - a request decided in the bucket whose decided event was never
//     published (that broker's window between its compare-and-set and its
//     publish) gets it published now, the same event with its stored id, and
//     its remembered choice stored;
//   - a request pending in the bucket keeps what its pending event does not
//     say (its deadline before escalation, limit, quorum): the ledger takes
//     it from there (legacy) when it reads that event.
//
// Every step is safe to repeat, and every replica runs it at start while the
// bucket exists: a decision published twice is refused by its expected
// sequence.
func (b *Broker) migrate(ctx context.Context) error {
	if b.res.state == nil {
		return b.markMigrated(ctx)
	}
	w, err := b.res.state.WatchAll(ctx, jetstream.IgnoreDeletes())
	if err != nil {
		return fmt.Errorf("read the state bucket of the previous version: %w", err)
	}
	defer func() { _ = w.Stop() }()
	legacy := make(map[string]Record)
	var published, decided int
	for entry := range w.Updates() {
		if entry == nil {
			break // read to its end
		}
		rec, err := decodeRecord(entry.Value(), entry.Revision())
		if err != nil {
			b.log.Error("skip a corrupt entry of the previous version's state bucket", zap.String("request_id", entry.Key()), zap.Error(err))
			continue
		}
		if !rec.State.Terminal() {
			legacy[rec.ID] = rec
			continue
		}
		decided++
		n, err := b.publishLegacy(ctx, &rec)
		if err != nil {
			return err
		}
		published += n
	}
	b.ledger.mu.Lock()
	b.ledger.legacy = legacy
	b.ledger.mu.Unlock()
	b.log.Info("read the state bucket of the previous version", zap.Int("pending", len(legacy)), zap.Int("decided", decided), zap.Int("decisions_published", published))
	return b.markMigrated(ctx)
}

// publishLegacy publishes the decision the previous version stored for rec,
// unless the stream holds one, and its remembered choice; it reports
// whether it published.
func (b *Broker) publishLegacy(ctx context.Context, rec *Record) (int, error) {
	if _, err := b.firstDecision(ctx, rec.ID); err == nil {
		return 0, nil
	} else if !errors.Is(err, ErrNotFound) {
		return 0, err
	}
	msg, err := b.decisionMsg(ctx, rec)
	if err != nil {
		b.log.Error("a decision of the previous version cannot be published", zap.String("request_id", rec.ID), zap.Error(err))
		return 0, nil
	}
	_, err = b.publish(ctx, msg, jetstream.WithExpectLastSequencePerSubject(0))
	switch {
	case isWrongLastSeq(err):
		return 0, nil
	case err != nil:
		return 0, fmt.Errorf("publish the decision of %s the previous version stored: %w", rec.ID, err)
	}
	b.log.Warn("published a decision the previous version stored but never published", zap.String("request_id", rec.ID), zap.String("outcome", string(rec.State)))
	b.storeGrant(ctx, rec)
	return 1, nil
}
