package auth

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/assent-dev/assent/internal/testenv"
)

// TestLateWatchCannotRevive: the watcher's news of a session's creation can
// arrive after the session has ended. A replica that has already seen it end
// (by reading the bucket, or by ending it itself) must not take it back.
func TestLateWatchCannotRevive(t *testing.T) {
	js, err := jetstream.New(testenv.Conn(t, testenv.Server(t)))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	s, err := newSessions(ctx, js, time.Hour, 1, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	v := session{Principal: "alice", Method: "proxy", CSRF: "c", Created: now, Expires: now.Add(time.Hour)}
	val, _ := json.Marshal(v)

	// Made on another replica: this one reads it from the bucket.
	const read = "sessionreadfromthebucket0000001"
	if _, err := s.kv.Create(ctx, read, val); err != nil {
		t.Fatal(err)
	}
	if _, reason := s.get(ctx, read, now); reason != "" {
		t.Fatalf("a session in the bucket: %s", reason)
	}
	// Ended on another replica: the direct read finds it gone ...
	if err := s.kv.Delete(ctx, read); err != nil {
		t.Fatal(err)
	}
	if _, reason := s.get(ctx, read, now); reason != "bad_session" {
		t.Fatalf("an ended session: %q", reason)
	}
	// ... and the watcher's late report of its creation changes nothing.
	s.apply(jetstream.KeyValuePut, read, val)
	if _, reason := s.get(ctx, read, now); reason != "bad_session" {
		t.Fatalf("an ended session after a late report of its creation: %q", reason)
	}
	// The report of its end clears the memory of it.
	s.apply(jetstream.KeyValueDelete, read, nil)
	if len(s.gone) != 0 {
		t.Fatalf("remembered after the watcher reported the end: %v", s.gone)
	}

	// Ended on this replica, before its watcher reported the creation.
	const ended = "sessionendedonthisreplica000001"
	if _, err := s.kv.Create(ctx, ended, val); err != nil {
		t.Fatal(err)
	}
	if err := s.end(ctx, ended); err != nil {
		t.Fatal(err)
	}
	s.apply(jetstream.KeyValuePut, ended, val)
	if _, reason := s.get(ctx, ended, now); reason != "bad_session" {
		t.Fatalf("a session this replica ended, after a late report of its creation: %q", reason)
	}

	// A session reported in order works from the cache.
	const live = "sessionreportedinorder000000001"
	s.apply(jetstream.KeyValuePut, live, val)
	if got, reason := s.get(ctx, live, now); reason != "" || got.Principal != "alice" {
		t.Fatalf("a reported session: %+v %q", got, reason)
	}
	// Expired, it leaves the cache.
	if _, reason := s.get(ctx, live, now.Add(2*time.Hour)); reason != "expired_session" {
		t.Fatalf("an expired session: %q", reason)
	}
	if _, ok := s.cache[live]; ok {
		t.Fatal("an expired session stays in the cache")
	}
}

// TestGoneIsBounded: ids from forged cookies cannot grow the memory of
// missing sessions without bound.
func TestGoneIsBounded(t *testing.T) {
	s := &sessions{cache: map[string]session{}, gone: map[string]time.Time{}}
	for i := range goneMax + 10 {
		s.forget(string(rune('a'+i%26)) + time.Duration(i).String())
	}
	if len(s.gone) > goneMax {
		t.Fatalf("%d ids remembered, bound %d", len(s.gone), goneMax)
	}
}
