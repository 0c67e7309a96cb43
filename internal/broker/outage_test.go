package broker

import (
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/assent-dev/assent/internal/testenv"
	"github.com/assent-dev/assent/pkg/events"
)

// TestOutageReportsOncePerPeriod: a failure that repeats through an outage
// is reported when it begins, then at most once a period with the failures
// since, and its end once with the failures in all; an attempt begun before
// the outage ended that fails after it starts no new one.
func TestOutageReportsOncePerPeriod(t *testing.T) {
	t0 := time.Date(2026, 11, 26, 9, 0, 0, 0, time.UTC)
	o := newOutage(30 * time.Second)
	if ended, _, _ := o.ok(t0); ended {
		t.Fatal("a success with no outage ended one")
	}
	type step struct {
		at     time.Duration
		begun  time.Duration // when a failed attempt began, if not at
		ok     bool
		report bool // fail: logged; ok: ended an outage
		n      int  // failures the line stands for
	}
	steps := []step{
		{at: 0, report: true, n: 1},
		{at: 250 * time.Millisecond},
		{at: 500 * time.Millisecond},
		{at: 29 * time.Second},
		{at: 30 * time.Second, report: true, n: 4},
		{at: 31 * time.Second},
		{at: 32 * time.Second, ok: true, report: true, n: 6},
		{at: 33 * time.Second, ok: true},
		{at: 34 * time.Second, begun: 31 * time.Second}, // held through the outage
		{at: 35 * time.Second, ok: true},
		{at: 40 * time.Second, report: true, n: 1}, // a new outage
		{at: 41 * time.Second, begun: 39 * time.Second, n: 0},
		{at: 42 * time.Second, ok: true, report: true, n: 2},
	}
	for i, s := range steps {
		now := t0.Add(s.at)
		if s.ok {
			ended, n, _ := o.ok(now)
			if ended != s.report || n != s.n {
				t.Errorf("step %d: ok at %s: ended %v with %d failures, want %v with %d", i, s.at, ended, n, s.report, s.n)
			}
			continue
		}
		begun := now
		if s.begun != 0 {
			begun = t0.Add(s.begun)
		}
		report, n := o.fail(begun, now)
		if report != s.report || n != s.n {
			t.Errorf("step %d: fail at %s: report %v for %d failures, want %v for %d", i, s.at, report, n, s.report, s.n)
		}
	}
}

// TestHandOverWarnsOncePerOutage stops the NATS server while requests fall
// due: the replica's hand-overs fail again and again (each request is tried
// again every quarter second), and it warns once for the whole outage, then
// says once that hand-overs work again, with the failures counted; the
// requests expire once the server is back.
func TestHandOverWarnsOncePerOutage(t *testing.T) {
	s := testenv.Server(t)
	nc := testenv.Conn(t, s)
	core, logs := observer.New(zap.InfoLevel)
	b, ctx := runInternalLogged(t, nc, Config{Name: "r1", Mode: ModeManual}, zap.New(core))
	var ids []string
	for i := range 10 {
		rec := submit(ctx, t, b, events.Requested{Agent: "a", Tool: "t", Timeout: events.Duration(time.Second + time.Duration(i)*100*time.Millisecond)})
		ids = append(ids, rec.ID)
	}
	s.Stop()
	const failed = "hand over due requests failed"
	for logs.FilterMessageSnippet(failed).Len() == 0 {
		if ctx.Err() != nil {
			t.Fatal("no hand-over failed while the server was down")
		}
		time.Sleep(50 * time.Millisecond)
	}
	// Let the hand-overs fail a few more times: each takes callTimeout at
	// most, and is tried again a quarter second later.
	time.Sleep(3 * callTimeout)
	s = s.Restart(t)
	for _, id := range ids {
		for {
			rec, err := b.Get(ctx, id)
			if err == nil && rec.State == StateExpired {
				break
			}
			if ctx.Err() != nil {
				t.Fatalf("request %s after the restart: %v %v", id, rec.State, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	if warned := logs.FilterMessageSnippet(failed).Len(); warned != 1 {
		t.Errorf("%d warnings of failed hand-overs in one outage, want 1", warned)
	}
	for logs.FilterMessageSnippet("hand over due requests works again").Len() == 0 {
		if ctx.Err() != nil {
			t.Fatal("no line said hand-overs work again")
		}
		time.Sleep(20 * time.Millisecond)
	}
	again := logs.FilterMessageSnippet("hand over due requests works again").All()
	if n := again[0].ContextMap()["failures"]; len(again) != 1 || n.(int64) < 2 {
		t.Errorf("%d lines saying hand-overs work again, the first counting %v failures; want 1, counting at least 2", len(again), n)
	}
}
