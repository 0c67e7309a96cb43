package broker

import (
	"context"
	"sync"

	"github.com/google/btree"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
)

// Index bounds.
const (
	// DefaultKeepDecided is how many decided requests each replica keeps in
	// its index for listings, newest first. Older ones are still in the state
	// bucket (GET by id) and in the stream (the audit log).
	DefaultKeepDecided = 10000
	// indexArgsLimit is the largest args (and payload) an index entry keeps;
	// a listing reads a request with larger ones from the bucket.
	indexArgsLimit = 16 << 10
)

// index is this replica's view of the state bucket, kept by the state
// watcher: every pending request in arrival order, and the most recent
// decided ones, newest first. Listings read it instead of the bucket.
type index struct {
	mu      sync.RWMutex
	byID    map[string]*indexed
	pending *btree.BTreeG[*indexed] // by arrival
	decided *btree.BTreeG[*indexed] // by decision time
	keep    int
}

// indexed is one request in the index. Its record may lack large args
// (trimmed); List reads those from the bucket.
type indexed struct {
	rec     Record
	trimmed bool
}

func newIndex(keep int) *index {
	return &index{
		byID: make(map[string]*indexed),
		pending: btree.NewG(32, func(a, b *indexed) bool {
			if !a.rec.ReceivedAt.Equal(b.rec.ReceivedAt) {
				return a.rec.ReceivedAt.Before(b.rec.ReceivedAt)
			}
			return a.rec.ID < b.rec.ID
		}),
		decided: btree.NewG(32, decidedBefore),
		keep:    keep,
	}
}

func decidedBefore(a, b *indexed) bool {
	if !a.rec.Decision.DecidedAt.Equal(b.rec.Decision.DecidedAt) {
		return a.rec.Decision.DecidedAt.Before(b.rec.Decision.DecidedAt)
	}
	return a.rec.ID < b.rec.ID
}

// put records rec, unless the index holds a newer revision of it.
func (x *index) put(rec Record) {
	e := &indexed{rec: rec}
	if len(rec.Request.Args) > indexArgsLimit {
		e.rec.Request.Args, e.trimmed = nil, true
	}
	if d := rec.Decision; d != nil && (len(d.Args) > indexArgsLimit || len(d.Payload) > indexArgsLimit) {
		trimmed := *d
		trimmed.Args, trimmed.Payload = nil, nil
		e.rec.Decision, e.trimmed = &trimmed, true
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	if old, ok := x.byID[rec.ID]; ok {
		if old.rec.revision > rec.revision {
			return
		}
		x.drop(old)
	}
	switch {
	case rec.State == StatePending:
		x.pending.ReplaceOrInsert(e)
	case rec.Decision != nil:
		if x.decided.Len() >= x.keep {
			oldest, _ := x.decided.Min()
			if decidedBefore(e, oldest) {
				return // older than everything kept
			}
			x.drop(oldest)
		}
		x.decided.ReplaceOrInsert(e)
	default:
		return
	}
	x.byID[rec.ID] = e
}

// remove forgets id (its entry was deleted or expired from the bucket).
func (x *index) remove(id string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if old, ok := x.byID[id]; ok {
		x.drop(old)
	}
}

func (x *index) drop(e *indexed) {
	if e.rec.State == StatePending {
		x.pending.Delete(e)
	} else {
		x.decided.Delete(e)
	}
	delete(x.byID, e.rec.ID)
}

// get returns the indexed record of id and whether it was trimmed.
func (x *index) get(id string) (Record, bool, bool) {
	x.mu.RLock()
	defer x.mu.RUnlock()
	e, ok := x.byID[id]
	if !ok {
		return Record{}, false, false
	}
	return e.rec, e.trimmed, true
}

// pendingCount reports how many requests are pending.
func (x *index) pendingCount() int {
	x.mu.RLock()
	defer x.mu.RUnlock()
	return x.pending.Len()
}

// list returns up to f.Limit entries matching f in listing order (pending:
// oldest first; decided: newest first), after the entry f.After names, and
// how many match in all.
func (x *index) list(f Filter) (out []*indexed, total int) {
	x.mu.RLock()
	defer x.mu.RUnlock()
	match := func(e *indexed) bool {
		return (f.State == "" || e.rec.State == f.State) &&
			(f.Agent == "" || e.rec.Request.Agent == f.Agent) &&
			(f.Session == "" || e.rec.Request.Session == f.Session)
	}
	var after *indexed
	if f.After != "" {
		after = x.byID[f.After]
	}
	passed := after == nil
	visit := func(e *indexed) bool {
		if !match(e) {
			return true
		}
		total++
		if !passed {
			passed = e == after
			return true
		}
		if len(out) < f.Limit {
			out = append(out, e)
		}
		return true
	}
	if (f.State == "" && !f.Decided) || f.State == StatePending {
		x.pending.Ascend(visit)
	}
	if f.State != StatePending {
		x.decided.Descend(visit)
	}
	return out, total
}

// watchState keeps the index in step with the state bucket and wakes callers
// waiting on a request whenever its entry changes. A watcher delivers only
// what was stored, after it was stored, so a re-read sees the change and a
// losing compare-and-set is never mistaken for one. On its first pass over the
// bucket it arms a local timer for every pending request (those whose
// deadline passed while no broker ran expire at once), then reports the index
// ready. After that, a pending request another replica took gets a backup
// timer here (backupDelay), and a decided one loses its timer.
func (b *Broker) watchState(ctx context.Context) error {
	loaded := false
	n := 0
	b.follow(ctx, b.res.state, "request state", func(e jetstream.KeyValueEntry) {
		if e.Operation() != jetstream.KeyValuePut {
			b.index.remove(e.Key())
			b.timers.stop(e.Key())
			b.records.deliver(e.Key())
			return
		}
		rec, err := decodeRecord(e.Value(), e.Revision())
		if err != nil {
			b.log.Error("skip corrupt state entry", zap.String("request_id", e.Key()), zap.Error(err))
			return
		}
		b.index.put(rec)
		switch cur, _, ok := b.index.get(rec.ID); {
		case ok && cur.revision > rec.revision:
			// An older revision than one read already: that one counts.
		case rec.State != StatePending:
			b.timers.stop(rec.ID)
		case !loaded:
			b.timers.arm(rec.ID, b.wakeAt(&rec))
			n++
		default:
			// Another replica took it (or moved its deadline): fire a
			// little after it would, should it be gone by then.
			b.timers.backup(rec.ID, b.wakeAt(&rec))
		}
		b.records.deliver(e.Key())
	}, func() {
		loaded = true
		b.log.Info("recovered pending requests", zap.Int("pending", n), zap.Int("indexed", b.index.size()))
		close(b.stateReady)
	})
	return nil
}

// size counts the indexed requests.
func (x *index) size() int {
	x.mu.RLock()
	defer x.mu.RUnlock()
	return len(x.byID)
}
