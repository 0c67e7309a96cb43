package broker

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/assent-dev/assent/pkg/events"
)

// catchUpWindow bounds how far back a catch-up reads the stream: the
// messages of the last KeepDecided decisions made at once, with their
// requests, and room for what else the stream holds.
func (b *Broker) catchUpWindow() uint64 { return uint64(4 * b.cfg.KeepDecided) }

// catchUp adds to the index the decisions made at once that it lacks. Those
// have no state entry, so the state watcher never brings them: another
// replica's, and after a restart this replica's own. It reads the stream
// from where the last catch-up stopped (at most catchUpWindow messages back)
// to its end, pairing each such decision with its request read on the way.
// Listings of decided requests call it, through recentCheck, so that a
// burst of listings reads the stream once.
func (b *Broker) catchUp(ctx context.Context) (struct{}, error) {
	info, err := b.res.stream.Info(ctx)
	if err != nil {
		return struct{}{}, err
	}
	last := info.State.LastSeq
	first := b.caughtUp.Load() + 1
	if window := b.catchUpWindow(); last > window {
		first = max(first, last-window+1)
	}
	requests := map[string]*Event{}
	var earlier []string // decided here, asked before first
	err = b.scan(ctx, first, time.Time{}, last, allSubjects, func(e *Event) (bool, error) {
		switch e.Type {
		case events.TypeRequested:
			requests[e.RequestID] = e
		case events.TypeDecided:
			if req, ok := requests[e.RequestID]; ok {
				b.recallDecided(req, e)
			} else if _, _, known := b.index.get(e.RequestID); !known {
				earlier = append(earlier, e.RequestID)
			}
		}
		return true, nil
	})
	if err != nil {
		return struct{}{}, err
	}
	// Their requests came before this read: read each by id (load indexes
	// what it finds).
	for _, id := range earlier {
		if _, err := b.load(ctx, id); err != nil && !errors.Is(err, ErrNotFound) {
			return struct{}{}, err
		}
	}
	b.caughtUp.Store(last)
	return struct{}{}, nil
}

// recallDecided puts into the index the request decided at once that the
// events req (its request) and dec (its decision) describe, unless the
// index has it or the decision was not made at once.
func (b *Broker) recallDecided(req, dec *Event) {
	if _, _, ok := b.index.get(dec.RequestID); ok {
		return
	}
	de, err := events.Decode(nil, dec.Event)
	if err == nil && b.trusted != nil {
		_, err = b.trusted.Verify(&de)
	}
	if err != nil || b.trusted == nil && !strings.HasPrefix(de.Source(), "broker/") {
		return
	}
	d, err := events.DecodeDecided(&de)
	if err != nil || !d.Auto || d.RequestID != req.RequestID {
		return
	}
	re, err := events.Decode(nil, req.Event)
	if err != nil {
		return
	}
	r, err := events.DecodeRequested(&re)
	if err != nil {
		return
	}
	r.Agent = req.Agent
	if digest, err := events.RequestDigest(r); err != nil || digest != d.RequestDigest {
		return
	}
	rec := Record{
		ID: req.RequestID, Request: r, RequestDigest: d.RequestDigest, RequestSeq: req.Seq, Source: re.Source(),
		ReceivedAt: req.Time, Deadline: req.Time.Add(b.cfg.clamp(r.Timeout.Std())),
	}
	rec.adopt(&onSubject{decided: &d, eventID: de.ID(), source: de.Source(), reqSeq: req.Seq})
	b.index.put(rec)
}
