package snapshot_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/assent-dev/assent/internal/snapshot"
	"github.com/assent-dev/assent/internal/testenv"
)

func ctxFor(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// fill makes stream LOG with n messages of about size bytes each (so that
// the snapshot spans many chunks), a durable consumer that acked the first
// half, and a KV bucket with two keys.
func fill(t *testing.T, ctx context.Context, js jetstream.JetStream, n, size int) {
	t.Helper()
	s, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "LOG", Subjects: []string{"log.>"}, AllowMsgSchedules: true})
	if err != nil {
		t.Fatal(err)
	}
	rnd := rand.NewChaCha8([32]byte{1})
	for i := range n {
		// Random bodies, so that compression leaves many chunks.
		body := make([]byte, size)
		_, _ = rnd.Read(body)
		if _, err := js.Publish(ctx, fmt.Sprintf("log.%d", i%7), body); err != nil {
			t.Fatal(err)
		}
	}
	c, err := s.CreateConsumer(ctx, jetstream.ConsumerConfig{Durable: "reader", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	batch, err := c.Fetch(n/2, jetstream.FetchMaxWait(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	for m := range batch.Messages() {
		if err := m.DoubleAck(ctx); err != nil {
			t.Fatal(err)
		}
	}
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "things"})
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"a", "b"} {
		if _, err := kv.PutString(ctx, k, "value of "+k); err != nil {
			t.Fatal(err)
		}
	}
}

func save(t *testing.T, ctx context.Context, nc *nats.Conn, stream string) (snapshot.Info, []byte, int) {
	t.Helper()
	var buf bytes.Buffer
	calls := 0
	info, err := snapshot.Save(ctx, nc, stream, &buf, func(n int64) {
		calls++
		if n != int64(buf.Len()) {
			t.Errorf("progress says %d bytes, %d written", n, buf.Len())
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	return info, buf.Bytes(), calls
}

// TestSaveRestore saves a stream of many chunks and a KV bucket from one
// server and restores them into another: the same messages, the consumer
// where it was, the bucket's keys.
func TestSaveRestore(t *testing.T) {
	ctx := ctxFor(t)
	src := testenv.Conn(t, testenv.Server(t))
	srcJS, _ := jetstream.New(src)
	const n = 400
	fill(t, ctx, srcJS, n, 4096)

	logInfo, logSnap, calls := save(t, ctx, src, "LOG")
	if calls < 3 {
		t.Errorf("%d chunks for %d bytes; want several, to exercise the flow control", calls, len(logSnap))
	}
	st, err := snapshot.ParseState(logInfo.State)
	if err != nil {
		t.Fatal(err)
	}
	if st.Msgs != n || st.LastSeq != n {
		t.Fatalf("snapshot state %+v, want %d messages", st, n)
	}
	kvInfo, kvSnap, _ := save(t, ctx, src, "KV_things")

	dst := testenv.Conn(t, testenv.Server(t))
	dstJS, _ := jetstream.New(dst)
	restored := 0
	got, err := snapshot.Restore(ctx, dst, logInfo, bytes.NewReader(logSnap), func(int64) { restored++ })
	if err != nil {
		t.Fatal(err)
	}
	if got.Msgs != n || got.LastSeq != n || restored == 0 {
		t.Fatalf("restored state %+v after %d chunks, want %d messages", got, restored, n)
	}
	if _, err := snapshot.Restore(ctx, dst, kvInfo, bytes.NewReader(kvSnap), nil); err != nil {
		t.Fatal(err)
	}

	s, err := dstJS.Stream(ctx, "LOG")
	if err != nil {
		t.Fatal(err)
	}
	for _, seq := range []uint64{1, n / 2, n} {
		want, err := srcJS.Stream(ctx, "LOG")
		if err != nil {
			t.Fatal(err)
		}
		a, err := want.GetMsg(ctx, seq)
		if err != nil {
			t.Fatal(err)
		}
		b, err := s.GetMsg(ctx, seq)
		if err != nil {
			t.Fatal(err)
		}
		if a.Subject != b.Subject || !bytes.Equal(a.Data, b.Data) {
			t.Errorf("message %d: %s differs from the original on %s", seq, b.Subject, a.Subject)
		}
	}
	c, err := s.Consumer(ctx, "reader")
	if err != nil {
		t.Fatalf("the consumer was not restored: %v", err)
	}
	ci, err := c.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if ci.AckFloor.Stream != n/2 || ci.NumPending != n/2 {
		t.Errorf("restored consumer: ack floor %d, %d pending; want %d and %d", ci.AckFloor.Stream, ci.NumPending, n/2, n/2)
	}
	kv, err := dstJS.KeyValue(ctx, "things")
	if err != nil {
		t.Fatal(err)
	}
	if e, err := kv.Get(ctx, "b"); err != nil || string(e.Value()) != "value of b" {
		t.Errorf("restored bucket: key b = %v, %v", e, err)
	}
}

// TestRestoreSchedule restores a stream holding a message schedule due a
// few seconds later: the restored server fires it, on time.
func TestRestoreSchedule(t *testing.T) {
	ctx := ctxFor(t)
	src := testenv.Conn(t, testenv.Server(t))
	srcJS, _ := jetstream.New(src)
	if _, err := srcJS.CreateStream(ctx, jetstream.StreamConfig{Name: "LOG", Subjects: []string{"log.>"}, AllowMsgSchedules: true}); err != nil {
		t.Fatal(err)
	}
	at := time.Now().Add(3 * time.Second).Truncate(time.Second)
	sched := nats.NewMsg("log.timer.1")
	sched.Header.Set("Nats-Schedule", "@at "+at.UTC().Format(time.RFC3339))
	sched.Header.Set("Nats-Schedule-Target", "log.fired.1")
	if _, err := srcJS.PublishMsg(ctx, sched); err != nil {
		t.Fatal(err)
	}
	info, snap, _ := save(t, ctx, src, "LOG")

	dst := testenv.Conn(t, testenv.Server(t))
	dstJS, _ := jetstream.New(dst)
	if _, err := snapshot.Restore(ctx, dst, info, bytes.NewReader(snap), nil); err != nil {
		t.Fatal(err)
	}
	s, err := dstJS.Stream(ctx, "LOG")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.GetLastMsgForSubject(ctx, "log.fired.1"); !errors.Is(err, jetstream.ErrMsgNotFound) {
		t.Fatalf("the schedule fired before its moment %s (now %s): %v", at, time.Now(), err)
	}
	c, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: []string{"log.fired.>"}})
	if err != nil {
		t.Fatal(err)
	}
	m, err := c.Next(jetstream.FetchMaxWait(15 * time.Second))
	if err != nil {
		t.Fatalf("the restored schedule did not fire: %v", err)
	}
	md, err := m.Metadata()
	if err != nil {
		t.Fatal(err)
	}
	late := md.Timestamp.Sub(at)
	t.Logf("fired %s after its moment", late)
	if late < 0 || late > 2*time.Second {
		t.Errorf("fired at %s, moment %s", md.Timestamp, at)
	}
}

// TestRefusals: a missing stream cannot be saved, an existing one is not
// overwritten, and a damaged snapshot is refused.
func TestRefusals(t *testing.T) {
	ctx := ctxFor(t)
	nc := testenv.Conn(t, testenv.Server(t))
	js, _ := jetstream.New(nc)
	if _, err := snapshot.Save(ctx, nc, "NOPE", &bytes.Buffer{}, nil); !errors.Is(err, snapshot.ErrStreamNotFound) {
		t.Errorf("save of a missing stream: %v, want ErrStreamNotFound", err)
	}
	fill(t, ctx, js, 50, 1024)
	info, snap, _ := save(t, ctx, nc, "LOG")
	if _, err := snapshot.Restore(ctx, nc, info, bytes.NewReader(snap), nil); !errors.Is(err, snapshot.ErrStreamExists) {
		t.Errorf("restore over an existing stream: %v, want ErrStreamExists", err)
	}

	other := testenv.Conn(t, testenv.Server(t))
	damaged := bytes.Clone(snap)
	for i := len(damaged) / 3; i < len(damaged)/3+64 && i < len(damaged); i++ {
		damaged[i] ^= 0xff
	}
	if _, err := snapshot.Restore(ctx, other, info, bytes.NewReader(damaged), nil); err == nil {
		t.Error("a damaged snapshot was restored")
	} else {
		t.Logf("damaged: %v", err)
	}
	if _, err := snapshot.Restore(ctx, other, info, bytes.NewReader(snap[:len(snap)/2]), nil); err == nil {
		t.Error("half a snapshot was restored")
	} else {
		t.Logf("truncated: %v", err)
	}
}
