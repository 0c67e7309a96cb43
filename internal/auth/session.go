package auth

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/assent-dev/assent/pkg/events"
)

// SessionBucket holds browser sessions, key = session id, for every replica.
const SessionBucket = "assent-sessions"

// session is a signed-in browser, as stored.
type session struct {
	Principal string    `json:"principal"`
	Method    string    `json:"method"`
	Name      string    `json:"name"`
	CSRF      string    `json:"csrf"`
	Created   time.Time `json:"created"`
	Expires   time.Time `json:"expires"`
	// Login state, for entries that record a sign-in under way rather than a
	// session: the OIDC nonce, PKCE verifier, and where to go after.
	Nonce    string `json:"nonce,omitempty"`
	Verifier string `json:"verifier,omitempty"`
	Next     string `json:"next,omitempty"`
}

// sessions is the session bucket with this replica's cache of it, kept
// current by a watcher: a session made on one replica works on every other,
// and a logout anywhere ends it everywhere.
//
// The watcher can lag behind the bucket. A session this replica has not
// heard of yet is read from the bucket directly; when that read finds it
// gone (ended, expired, or never made), the id is remembered in gone, so
// that the watcher's late news of its creation cannot bring it back.
type sessions struct {
	kv  jetstream.KeyValue
	log *zap.Logger

	mu    sync.RWMutex
	cache map[string]session
	gone  map[string]time.Time // id → when it was found missing or ended here
}

// goneFor is how long a missing id is remembered when the watcher does not
// report its end; goneMax bounds how many are (ids from forged cookies never
// end).
const (
	goneFor = 10 * time.Minute
	goneMax = 10000
)

func newSessions(ctx context.Context, js jetstream.JetStream, ttl time.Duration, replicas int, log *zap.Logger) (*sessions, error) {
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:      SessionBucket,
		Description: "Assent browser sessions and sign-ins under way",
		History:     1,
		TTL:         ttl,
		Storage:     jetstream.FileStorage,
		Replicas:    max(replicas, 1),
	})
	if err != nil {
		return nil, fmt.Errorf("auth: bucket %s: %w", SessionBucket, err)
	}
	return &sessions{kv: kv, log: log, cache: map[string]session{}, gone: map[string]time.Time{}}, nil
}

// watch keeps the cache in step with the bucket until ctx ends.
func (s *sessions) watch(ctx context.Context) {
	for ctx.Err() == nil {
		w, err := s.kv.WatchAll(ctx, jetstream.UpdatesOnly())
		if err != nil {
			if ctx.Err() == nil {
				s.log.Warn("watch sessions; retrying", zap.Error(err))
				select {
				case <-ctx.Done():
				case <-time.After(time.Second):
				}
			}
			continue
		}
		for e := range w.Updates() {
			if e != nil {
				s.apply(e.Operation(), e.Key(), e.Value())
			}
		}
		_ = w.Stop()
	}
}

// apply brings the cache up to one change of the bucket, as the watcher
// reports it.
func (s *sessions) apply(op jetstream.KeyValueOp, id string, value []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if op != jetstream.KeyValuePut {
		delete(s.cache, id)
		delete(s.gone, id)
		return
	}
	if _, ok := s.gone[id]; ok {
		return // old news: a direct read has already found it ended
	}
	var v session
	if json.Unmarshal(value, &v) == nil {
		s.cache[id] = v
	}
}

// forget drops id from the cache and keeps the watcher from bringing it
// back: a direct read found it missing, or this replica ended it.
func (s *sessions) forget(id string) {
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.cache, id)
	if len(s.gone) >= goneMax {
		for k, t := range s.gone {
			if now.Sub(t) > goneFor {
				delete(s.gone, k)
			}
		}
		if len(s.gone) >= goneMax {
			clear(s.gone)
		}
	}
	s.gone[id] = now
}

// create stores a new session for id's principal and returns its id.
func (s *sessions) create(ctx context.Context, v session) (string, error) {
	id := randomString()
	if err := s.put(ctx, id, v); err != nil {
		return "", err
	}
	return id, nil
}

func (s *sessions) put(ctx context.Context, id string, v session) error {
	val, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if _, err := s.kv.Create(ctx, id, val); err != nil {
		return fmt.Errorf("store session: %w", err)
	}
	s.mu.Lock()
	s.cache[id] = v
	s.mu.Unlock()
	return nil
}

// get returns the session id names; a non-empty reason says why there is
// none: bad_session (unknown or ended) or expired_session.
func (s *sessions) get(ctx context.Context, id string, now time.Time) (session, string) {
	if !events.ValidToken(id) {
		return session{}, "bad_session"
	}
	s.mu.RLock()
	v, ok := s.cache[id]
	s.mu.RUnlock()
	if !ok {
		// Made a moment ago on another replica, before its watcher said so;
		// or ended, or never made.
		e, err := s.kv.Get(ctx, id)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			s.forget(id)
		}
		if err != nil || json.Unmarshal(e.Value(), &v) != nil {
			return session{}, "bad_session"
		}
	}
	switch {
	case v.Principal == "":
		return session{}, "bad_session" // a sign-in under way, not a session
	case !now.Before(v.Expires):
		s.mu.Lock()
		delete(s.cache, id)
		s.mu.Unlock()
		return session{}, "expired_session"
	}
	return v, ""
}

// take returns the entry id names and deletes it (sign-in state: used once).
func (s *sessions) take(ctx context.Context, id string) (session, error) {
	if !events.ValidToken(id) {
		return session{}, errors.New("bad sign-in state")
	}
	e, err := s.kv.Get(ctx, id)
	if err != nil {
		return session{}, fmt.Errorf("sign-in state: %w", err)
	}
	if err := s.kv.Delete(ctx, id, jetstream.LastRevision(e.Revision())); err != nil {
		return session{}, fmt.Errorf("sign-in state already used: %w", err)
	}
	var v session
	if err := json.Unmarshal(e.Value(), &v); err != nil {
		return session{}, err
	}
	return v, nil
}

// end deletes session id on every replica.
func (s *sessions) end(ctx context.Context, id string) error {
	s.forget(id)
	if err := s.kv.Delete(ctx, id); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		return err
	}
	return nil
}
