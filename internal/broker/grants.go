package broker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/assent-dev/assent/pkg/policy"
)

// GrantBucket holds remembered choices, one key per grant (policy.Grant.Key),
// each with a per-key TTL ending when the grant expires.
const GrantBucket = "assent-remembered"

func grantBucketConfig(c Config) jetstream.KeyValueConfig {
	return jetstream.KeyValueConfig{
		Bucket:         GrantBucket,
		Description:    "Assent remembered choices; each key expires with its grant",
		History:        1,
		Storage:        jetstream.FileStorage,
		Replicas:       c.Replicas,
		LimitMarkerTTL: time.Minute,
	}
}

// grants is this replica's copy of the remembered choices, kept current by a
// watcher on the bucket, for listing and revoking them. Judging a request
// reads the bucket itself (grantReader).
type grants struct {
	mu       sync.RWMutex
	byPrefix map[string]map[string]policy.Grant // GrantKey prefix -> key -> grant
	// decided holds, by key, the grants of recent decisions the ledger has
	// read and the watcher has not yet seen in the bucket, neither stored
	// nor removed. A grant is stored after its decision, so an agent that
	// sees the decision and asks again at once would otherwise miss it.
	// Judging counts one only once the bucket's leader shows it is not
	// revoked (grantReader.undecided).
	decided map[string]policy.Grant
	ready   chan struct{}
	// applied is the stream sequence of the last bucket entry the watcher
	// applied.
	applied atomic.Uint64
}

func newGrants() *grants {
	return &grants{byPrefix: make(map[string]map[string]policy.Grant), decided: make(map[string]policy.Grant), ready: make(chan struct{})}
}

// grantWriteWindow is how long after its decision a remembered choice not
// yet seen in the bucket counts from the decision: the handler writes it at
// once, or, if it stopped first, the replica the trigger is redelivered to
// writes it within about one ack wait. Older decisions (a start reading the
// stream from its beginning) put nothing in force.
const grantWriteWindow = 2 * time.Minute

// decide notes gr, with key, from a decision stored at at, unless the
// watcher has seen it already or the decision is too old to be waiting for
// its grant's write.
func (g *grants) decide(key string, gr policy.Grant, at, now time.Time) {
	if now.Sub(at) > grantWriteWindow || !now.Before(gr.ExpiresAt) {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if _, ok := g.byPrefix[prefixOf(key)][key]; ok {
		return
	}
	if len(g.decided) >= 64 {
		for k, d := range g.decided {
			if now.Sub(d.CreatedAt) > grantWriteWindow || !now.Before(d.ExpiresAt) {
				delete(g.decided, k)
			}
		}
	}
	g.decided[key] = gr
}

// undecided forgets the noted grant with key: the bucket showed it
// revoked.
func (g *grants) undecided(key string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	delete(g.decided, key)
}

// decidedFor returns, by key, the noted grants (decide) that may apply to
// in and are not in keys already.
func (g *grants) decidedFor(in policy.Input, have []policy.Grant) map[string]policy.Grant {
	g.mu.RLock()
	defer g.mu.RUnlock()
	if len(g.decided) == 0 {
		return nil
	}
	var out map[string]policy.Grant
	for _, prefix := range policy.GrantKeys(in) {
		for key, gr := range g.decided {
			if prefixOf(key) != prefix || slices.ContainsFunc(have, func(h policy.Grant) bool { return h.ID == gr.ID }) {
				continue
			}
			if out == nil {
				out = make(map[string]policy.Grant)
			}
			out[key] = gr
		}
	}
	return out
}

// Grants implements policy.Remembered.
func (g *grants) Grants(in policy.Input) []policy.Grant {
	g.mu.RLock()
	defer g.mu.RUnlock()
	var out []policy.Grant
	for _, prefix := range policy.GrantKeys(in) {
		for _, gr := range g.byPrefix[prefix] {
			out = append(out, gr)
		}
	}
	return out
}

// list returns every grant, newest first.
func (g *grants) list() []policy.Grant {
	g.mu.RLock()
	defer g.mu.RUnlock()
	var out []policy.Grant
	for _, m := range g.byPrefix {
		for _, gr := range m {
			out = append(out, gr)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].CreatedAt.After(out[j].CreatedAt) })
	return out
}

// find returns the grant with id.
func (g *grants) find(id string) (policy.Grant, bool) {
	g.mu.RLock()
	defer g.mu.RUnlock()
	for _, m := range g.byPrefix {
		for _, gr := range m {
			if gr.ID == id {
				return gr, true
			}
		}
	}
	return policy.Grant{}, false
}

// has says whether the grant with key is here.
func (g *grants) has(key string) bool {
	g.mu.RLock()
	defer g.mu.RUnlock()
	_, ok := g.byPrefix[prefixOf(key)][key]
	return ok
}

func prefixOf(key string) string {
	if i := strings.LastIndexByte(key, '.'); i > 0 {
		return key[:i]
	}
	return key
}

func (g *grants) put(key string, gr policy.Grant) {
	g.mu.Lock()
	defer g.mu.Unlock()
	p := prefixOf(key)
	if g.byPrefix[p] == nil {
		g.byPrefix[p] = make(map[string]policy.Grant)
	}
	g.byPrefix[p][key] = gr
	delete(g.decided, key)
}

// advance records that the watcher applied the bucket's entry at stream
// sequence seq. The watcher is its only caller; a watcher that replaces a
// failed one goes over the bucket again from its first entry.
func (g *grants) advance(seq uint64) {
	if seq > g.applied.Load() {
		g.applied.Store(seq)
	}
}

func (g *grants) remove(key string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	p := prefixOf(key)
	delete(g.decided, key)
	delete(g.byPrefix[p], key)
	if len(g.byPrefix[p]) == 0 {
		delete(g.byPrefix, p)
	}
}

// grantReader gives the policy the remembered choices that may apply to a
// request as the bucket's stream leader has them, not merely as this
// replica's watcher last saw them: a watcher on a stopped node falls behind
// for seconds, and a grant made or revoked meanwhile must still count at once
// everywhere. It reads only when the policy consults remembered choices (a
// rememberable approval), and then asks the leader one question shared by
// every request judged at that moment (grantsFresh): does the bucket hold
// anything the watcher has not applied? Usually it does not, and the
// replica's copy answers; otherwise the grants are read from the leader key
// by key. A failed read is kept in err, and the request is retried.
//
// It adds the grants of recent decisions this replica's ledger read whose
// write the watcher has not seen (grants.decide), each once the leader shows
// its key holds no revocation: nothing stored yet (the write is on its way)
// or the grant itself. A decision read after its grant was revoked, by a
// ledger behind the watcher or reading the stream again at a start, finds
// the revocation there.
type grantReader struct {
	ctx context.Context
	b   *Broker
	err error
	// checked says the leader was asked, fresh that the watcher's copy was
	// then current.
	checked, fresh bool
	seen           map[string][]policy.Grant // prefix -> grants, read once per request
}

// Grants implements policy.Remembered.
func (r *grantReader) Grants(in policy.Input) []policy.Grant {
	if !r.checked {
		fresh, err := r.b.grantsFresh(r.ctx)
		if err != nil {
			r.err = err
			return nil
		}
		r.checked, r.fresh = true, fresh
	}
	var out []policy.Grant
	if r.fresh {
		out = r.b.grants.Grants(in)
	} else if out = r.stored(in); r.err != nil {
		return nil
	}
	for key, gr := range r.b.grants.decidedFor(in, out) {
		live, err := r.b.grantNotRevoked(r.ctx, key)
		if err != nil {
			r.err = err
			return nil
		}
		if !live {
			r.b.grants.undecided(key)
			continue
		}
		out = append(out, gr)
	}
	return out
}

// stored returns the grants the bucket's leader holds for in's prefixes,
// read once per request.
func (r *grantReader) stored(in policy.Input) []policy.Grant {
	var out []policy.Grant
	for _, prefix := range policy.GrantKeys(in) {
		gs, ok := r.seen[prefix]
		if !ok {
			var err error
			if gs, err = r.b.readGrants(r.ctx, prefix); err != nil {
				r.err = err
				return nil
			}
			if r.seen == nil {
				r.seen = make(map[string][]policy.Grant)
			}
			r.seen[prefix] = gs
		}
		out = append(out, gs...)
	}
	return out
}

// grantNotRevoked reports whether the bucket's stream leader holds no
// revocation of the grant stored under key: no message yet, or the grant.
// A grant is only ever removed after it was stored, by a revocation or at
// its expiry, each of which leaves a marker as the key's last message.
func (b *Broker) grantNotRevoked(ctx context.Context, key string) (bool, error) {
	m, err := b.leaderMsg(ctx, "KV_"+GrantBucket, map[string]any{"last_by_subj": "$KV." + GrantBucket + "." + key}, "check remembered choice "+key)
	if err != nil || m == nil {
		return err == nil, err
	}
	return !kvRemoved(m.header()), nil
}

// kvRemoved reports whether h, the headers of a bucket's message, mark the
// key removed: deleted, purged or expired.
func kvRemoved(h nats.Header) bool {
	return h.Get("KV-Operation") != "" || h.Get(jetstream.MarkerReasonHeader) != ""
}

// grantsFresh reports whether this replica's copy of the remembered choices
// holds everything the bucket's stream leader held at some moment after the
// call began. Concurrent callers share one question to the leader (see
// coalescer), so a busy broker asks it once per round trip, not once per
// request.
func (b *Broker) grantsFresh(ctx context.Context) (bool, error) {
	return b.grantsCheck.wait(ctx)
}

// grantsNewer asks the bucket's stream leader whether it holds a message after
// the last one the watcher applied; it reports true if it holds none.
func (b *Broker) grantsNewer(ctx context.Context) (bool, error) {
	applied := b.grants.applied.Load()
	m, err := b.leaderMsg(ctx, "KV_"+GrantBucket, map[string]any{"seq": applied + 1, "next_by_subj": ">"}, "check remembered choices")
	return m == nil && err == nil, err
}

// msgGetResponse is the JetStream API's answer to STREAM.MSG.GET.
type msgGetResponse struct {
	Message *storedMsg `json:"message"`
	Error   *struct {
		Code        int    `json:"code"`
		ErrCode     int    `json:"err_code"`
		Description string `json:"description"`
	} `json:"error"`
}

// storedMsg is a message as STREAM.MSG.GET returns it.
type storedMsg struct {
	Subject string    `json:"subject"`
	Seq     uint64    `json:"seq"`
	Header  []byte    `json:"hdrs,omitempty"`
	Data    []byte    `json:"data,omitempty"`
	Time    time.Time `json:"time"`
}

// header decodes the message's headers; none if they cannot be read.
func (m *storedMsg) header() nats.Header {
	if len(m.Header) == 0 {
		return nil
	}
	h, err := nats.DecodeHeadersMsg(m.Header)
	if err != nil {
		return nil
	}
	return h
}

// raw returns the message as the jetstream package's gets do.
func (m *storedMsg) raw() *jetstream.RawStreamMsg {
	return &jetstream.RawStreamMsg{Subject: m.Subject, Sequence: m.Seq, Header: m.header(), Data: m.Data, Time: m.Time}
}

// errNoMessage is JetStream's error code for "no message found".
const errNoMessage = 10037

// leaderMsg asks the leader of stream for the message req names
// (STREAM.MSG.GET with a sequence, the next by subject, or the last by
// subject), never a direct get, which a replica behind the others may
// answer: nil, without an error, when the stream holds none. what names
// the lookup in errors.
func (b *Broker) leaderMsg(ctx context.Context, stream string, req any, what string) (*storedMsg, error) {
	data, err := json.Marshal(req)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	cctx, cancel := callCtx(ctx)
	defer cancel()
	msg, err := b.nc.RequestWithContext(cctx, "$JS.API.STREAM.MSG.GET."+stream, data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	var resp msgGetResponse
	switch err := json.Unmarshal(msg.Data, &resp); {
	case err != nil:
		return nil, fmt.Errorf("%s: %w", what, err)
	case resp.Error != nil && resp.Error.ErrCode == errNoMessage:
		return nil, nil
	case resp.Error != nil:
		return nil, fmt.Errorf("%s: %s (%d)", what, resp.Error.Description, resp.Error.ErrCode)
	case resp.Message == nil:
		return nil, fmt.Errorf("%s: an answer without a message", what)
	}
	return resp.Message, nil
}

// readGrants returns the live grants stored under key prefix, read from the
// stream leader (STREAM.MSG.GET, never a direct get that a follower still
// catching up may answer), one key after another by subject.
func (b *Broker) readGrants(ctx context.Context, prefix string) ([]policy.Grant, error) {
	filter := "$KV." + GrantBucket + "." + prefix + ".*"
	var out []policy.Grant
	for seq := uint64(1); ; {
		m, err := b.leaderMsg(ctx, "KV_"+GrantBucket, map[string]any{"seq": seq, "next_by_subj": filter}, "read remembered choices "+prefix)
		switch {
		case err != nil:
			return nil, err
		case m == nil:
			return out, nil
		}
		seq = m.Seq + 1
		if len(m.Header) > 0 {
			h, err := nats.DecodeHeadersMsg(m.Header)
			if err != nil {
				return nil, fmt.Errorf("read remembered choice %s: %w", m.Subject, err)
			}
			if kvRemoved(h) {
				continue // revoked, or expired
			}
		}
		var gr policy.Grant
		if err := json.Unmarshal(m.Data, &gr); err != nil {
			b.log.Error("skip corrupt remembered choice", zap.String("subject", m.Subject), zap.Error(err))
			continue
		}
		out = append(out, gr)
	}
}

// watchGrants keeps b.grants in step with the bucket until ctx ends.
func (b *Broker) watchGrants(ctx context.Context) error {
	b.follow(ctx, b.res.grants, "remembered choices", func(entry jetstream.KeyValueEntry) {
		defer b.grants.advance(entry.Revision())
		if entry.Operation() != jetstream.KeyValuePut {
			b.grants.remove(entry.Key())
			return
		}
		var gr policy.Grant
		if err := json.Unmarshal(entry.Value(), &gr); err != nil {
			b.log.Error("skip corrupt remembered choice", zap.String("key", entry.Key()), zap.Error(err))
			return
		}
		b.grants.put(entry.Key(), gr)
	}, func() { close(b.grants.ready) })
	return nil
}

// remember stores a grant with a TTL that ends when it expires. The key
// (its grant's id is in it) is written only if it never held anything: a
// second handling of the grant's answer that comes after the grant's
// revocation finds the revocation there and stores nothing (a KV create
// would write over it). ErrKeyExists says it was stored before.
func (b *Broker) remember(ctx context.Context, gr policy.Grant) error {
	val, err := json.Marshal(gr)
	if err != nil {
		return err
	}
	ttl := time.Until(gr.ExpiresAt)
	if ttl < time.Second {
		return nil // expires before it could be used
	}
	msg := nats.NewMsg("$KV." + GrantBucket + "." + gr.Key())
	msg.Data = val
	cctx, cancel := callCtx(ctx)
	defer cancel()
	if _, err := b.js.PublishMsg(cctx, msg, jetstream.WithExpectLastSequencePerSubject(0), jetstream.WithMsgTTL(ttl)); err != nil {
		if isWrongLastSeq(err) {
			return jetstream.ErrKeyExists
		}
		return fmt.Errorf("store remembered choice: %w", err)
	}
	b.grants.put(gr.Key(), gr) // visible here at once; the watcher confirms it
	return nil
}

// storeGrant stores the remembered choice r's outcome asked for, if any. It
// may run more than once for one outcome (a redelivery, the gateway and the
// consumer both): the grant's key is fixed in the record, so a second store
// finds it there. A failure is logged: the decision stands without it.
func (b *Broker) storeGrant(ctx context.Context, r *Record) {
	if r.Grant == nil || !r.State.Terminal() || r.Decision == nil || r.Decision.Auto {
		return
	}
	if b.grants.has(r.Grant.Key()) {
		return
	}
	if b.beforeGrant != nil {
		b.beforeGrant(r.ID)
	}
	err := b.remember(ctx, *r.Grant)
	if errors.Is(err, jetstream.ErrKeyExists) {
		// Another handling of the same outcome stored it (or it was
		// revoked since): once this handling returns, this replica lists
		// what the bucket holds.
		b.awaitGrant(ctx, r.Grant.Key())
		return
	}
	if err != nil {
		b.log.Error("decided, but the remembered choice was not stored", zap.String("request_id", r.ID), zap.Error(err))
	}
}

// awaitGrant waits, for a call's time at most, until this replica's copy of
// the remembered choices has what key holds in the bucket: a grant another
// handling stored (its own put, or the watcher's), not one revoked since. It
// adds nothing itself, so that a revocation applied meanwhile stays applied.
func (b *Broker) awaitGrant(ctx context.Context, key string) {
	cctx, cancel := callCtx(ctx)
	defer cancel()
	e, err := b.res.grants.Get(cctx, key)
	if err != nil {
		return // revoked, or not readable now: nothing to wait for
	}
	for !b.grants.has(key) && b.grants.applied.Load() < e.Revision() {
		select {
		case <-cctx.Done():
			return
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// Remembered lists the remembered choices in force, newest first.
func (b *Broker) Remembered() []policy.Grant {
	now := b.now()
	out := []policy.Grant{}
	for _, gr := range b.grants.list() {
		if now.Before(gr.ExpiresAt) {
			out = append(out, gr)
		}
	}
	return out
}

// Forget revokes the remembered choice with id on every replica. If there is
// none, ErrNotFound is returned.
func (b *Broker) Forget(ctx context.Context, id string) (policy.Grant, error) {
	gr, ok := b.grants.find(id)
	if !ok {
		return policy.Grant{}, fmt.Errorf("%w: no remembered choice %q", ErrNotFound, id)
	}
	if err := b.res.grants.Purge(ctx, gr.Key()); err != nil {
		return gr, fmt.Errorf("revoke remembered choice %s: %w", id, err)
	}
	b.grants.remove(gr.Key())
	return gr, nil
}
