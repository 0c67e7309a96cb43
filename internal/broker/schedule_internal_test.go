package broker

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/assent-dev/assent/internal/testenv"
	"github.com/assent-dev/assent/pkg/events"
)

// runBroker starts a broker on ns and waits until it is ready.
func runBroker(ctx context.Context, t *testing.T, ns *testenv.NATS) *Broker {
	t.Helper()
	b, err := New(testenv.Conn(t, ns), Config{}, testenv.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	rctx, cancel := context.WithCancel(ctx)
	go func() { done <- b.Run(rctx) }()
	t.Cleanup(func() { cancel(); <-done })
	for !b.Ready() {
		time.Sleep(5 * time.Millisecond)
	}
	return b
}

// TestDurableTickExpires keeps the local timer of a request from firing, as
// when its hand-over was lost, and checks that the durable tick alone
// expires the request, on behalf of the tick's batch.
func TestDurableTickExpires(t *testing.T) {
	ns := testenv.Server(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b := runBroker(ctx, t, ns)
	rec := submit(ctx, t, b, events.Requested{Tool: "rm", Agent: "a1", Timeout: events.Duration(time.Second)})
	b.ledger.retry([]string{rec.ID}, time.Now().Add(time.Hour))
	final, err := b.Wait(ctx, rec.ID)
	if err != nil {
		t.Fatal(err)
	}
	if final.State != StateExpired || !strings.HasPrefix(final.Decision.Reason, "timeout") {
		t.Fatalf("got %s: %q", final.State, final.Decision.Reason)
	}
	late := final.Decision.DecidedAt.Sub(rec.Deadline)
	t.Logf("the durable tick expired the request %s after its deadline", late)
	if late < 0 || late > 2*time.Second {
		t.Fatalf("expired %s after the deadline; the durable tick fires within a second of it", late)
	}
	trigger, err := b.res.stream.GetMsg(ctx, final.Trigger)
	if err != nil {
		t.Fatal(err)
	}
	if trigger.Subject != tickDue || !strings.Contains(string(trigger.Data), rec.ID) {
		t.Fatalf("decided on behalf of %s %q, want a batch on %s naming %s", trigger.Subject, trigger.Data, tickDue, rec.ID)
	}
}

// TestStreamTakesNoSchedules: the ASSENT stream a broker makes refuses
// message schedules and per-message TTLs (a client could otherwise have
// the server store a message where it may not publish, or have its own
// removed early); the broker's own schedules live in ASSENT_TIMERS.
func TestStreamTakesNoSchedules(t *testing.T) {
	ns := testenv.Server(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b := runBroker(ctx, t, ns)
	if b.res.legacy {
		t.Fatal("a new stream taken for one made by an earlier broker")
	}
	js, err := jetstream.New(testenv.Conn(t, ns))
	if err != nil {
		t.Fatal(err)
	}
	for name, opts := range map[string][]jetstream.PublishOpt{
		"a schedule":        {jetstream.WithScheduleAt(time.Now().Add(time.Second)), jetstream.WithScheduleTarget(events.DecisionPrefix + "x")},
		"a per-message TTL": {jetstream.WithMsgTTL(time.Minute)},
	} {
		_, err := js.PublishMsg(ctx, &nats.Msg{Subject: events.RequestPrefix + "a1"}, opts...)
		if err == nil {
			t.Fatalf("%s stored in %s", name, StreamName)
		}
		t.Logf("%s refused: %v", name, err)
	}
}

// TestStreamOfEarlierBroker: a stream made by a broker before
// ASSENT_TIMERS keeps its schedules and TTLs (the server refuses to turn
// them off), the broker says so, and a durable tick such a broker
// scheduled in it still expires its request.
func TestStreamOfEarlierBroker(t *testing.T) {
	ns := testenv.Server(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	js, err := jetstream.New(testenv.Conn(t, ns))
	if err != nil {
		t.Fatal(err)
	}
	old := StreamConfig(Config{})
	old.AllowMsgSchedules, old.AllowMsgTTL = true, true
	if _, err := js.CreateStream(ctx, old); err != nil {
		t.Fatal(err)
	}
	b := runBroker(ctx, t, ns)
	if !b.res.legacy {
		t.Fatal("a stream made by an earlier broker not told apart")
	}
	info, err := b.res.stream.Info(ctx)
	if err != nil || !info.Config.AllowMsgSchedules || !info.Config.AllowMsgTTL {
		t.Fatalf("the earlier stream's settings changed: %+v, %v", info.Config, err)
	}
	// The new durable ticks of the next seconds taken as scheduled, and
	// the request's own timer held back: the earlier broker's schedule
	// alone expires it.
	now := time.Now().Unix()
	b.ticks.mu.Lock()
	for sec := now; sec < now+10; sec++ {
		c := &tickCall{done: make(chan struct{})}
		close(c.done)
		b.ticks.seconds[sec] = c
	}
	b.ticks.mu.Unlock()
	rec := submit(ctx, t, b, events.Requested{Tool: "rm", Agent: "a1", Timeout: events.Duration(time.Second)})
	b.ledger.retry([]string{rec.ID}, time.Now().Add(time.Hour))
	if n, err := b.res.timers.Info(ctx); err != nil || n.State.Msgs != 0 {
		t.Fatalf("durable ticks in %s: %+v, %v", TimerStreamName, n, err)
	}
	sec := strconv.FormatInt(tickSecond(rec.Deadline), 10)
	if _, err := js.PublishMsg(ctx, &nats.Msg{Subject: TimerPrefix + "tick." + sec}, jetstream.WithScheduleAt(time.Unix(tickSecond(rec.Deadline), 0)), jetstream.WithScheduleTarget(tickAt+sec)); err != nil {
		t.Fatal(err)
	}
	final, err := b.Wait(ctx, rec.ID)
	if err != nil {
		t.Fatal(err)
	}
	trigger, err := b.res.stream.GetMsg(ctx, final.Trigger)
	if err != nil {
		t.Fatal(err)
	}
	if final.State != StateExpired || trigger.Subject != tickDue {
		t.Fatalf("got %s on behalf of %s, want expired by a batch", final.State, trigger.Subject)
	}
}

// TestOneDurableTickPerSecond checks that requests whose deadlines fall in
// the same second share one durable schedule.
func TestOneDurableTickPerSecond(t *testing.T) {
	ns := testenv.Server(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b := runBroker(ctx, t, ns)
	const n = 200
	deadlines := make(map[int64]bool)
	for _, rec := range submitMany(ctx, t, b, n, time.Minute) {
		deadlines[tickSecond(rec.Deadline)] = true
	}
	info, err := b.res.timers.Info(ctx, jetstream.WithSubjectFilter(timerTick+">"))
	if err != nil {
		t.Fatal(err)
	}
	if len(info.State.Subjects) != len(deadlines) {
		t.Fatalf("%d durable schedules %v for %d requests whose deadlines fall in %d seconds", len(info.State.Subjects), info.State.Subjects, n, len(deadlines))
	}
	for sec := range deadlines {
		subj := timerTick + strconv.FormatInt(sec, 10)
		if count := info.State.Subjects[subj]; count != 1 {
			t.Fatalf("%s holds %d schedules, want 1", subj, count)
		}
	}
	t.Logf("%d requests, %d durable schedules", n, len(deadlines))
}

// TestDueRequestsHandedOverInBatches checks that timers firing together
// hand their requests over in a few batches, not one each.
func TestDueRequestsHandedOverInBatches(t *testing.T) {
	ns := testenv.Server(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	b := runBroker(ctx, t, ns)
	const n = 200
	ids := make([]string, n)
	ticks := make(map[int64]bool)
	var last time.Time
	for i, rec := range submitMany(ctx, t, b, n, 5*time.Second) {
		ids[i], last = rec.ID, rec.Deadline
		ticks[tickSecond(rec.Deadline)] = true
	}
	// Hold their timers (once the ingests, which arm them, are done).
	time.Sleep(200 * time.Millisecond)
	b.ledger.retry(ids, time.Now().Add(time.Hour))
	// Every request is due: let their timers fire together. (A durable
	// tick may hand over those of its second first, as one batch.)
	time.Sleep(time.Until(last))
	fire := time.Now().Add(100 * time.Millisecond)
	b.ledger.retry(ids, fire)
	batches := make(map[uint64]bool)
	for _, id := range ids {
		final, err := b.Wait(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if final.State != StateExpired {
			t.Fatalf("%s: %s", id, final.State)
		}
		batches[final.Trigger] = true
	}
	t.Logf("%d requests expired on behalf of %d batches; their deadlines fall in %d seconds", n, len(batches), len(ticks))
	if len(batches) > len(ticks)+5 {
		t.Fatalf("%d batches for %d requests that fell due together", len(batches), n)
	}
}

// submitMany submits n requests with timeout, one after the other.
func submitMany(ctx context.Context, t *testing.T, b *Broker, n int, timeout time.Duration) []Record {
	t.Helper()
	recs := make([]Record, n)
	for i := range recs {
		recs[i] = submit(ctx, t, b, events.Requested{Tool: "rm", Agent: "a1", Timeout: events.Duration(timeout)})
	}
	return recs
}
