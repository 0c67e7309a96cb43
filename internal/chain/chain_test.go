package chain_test

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/assent-dev/assent/internal/chain"
	"github.com/assent-dev/assent/internal/natsconn"
	"github.com/assent-dev/assent/internal/testenv"
	"github.com/assent-dev/assent/pkg/events"
)

const stream = "REC"

// record is a stream like the broker's (one stream over assent.>, with an
// age limit) and the broker's decision key.
type record struct {
	t      *testing.T
	js     jetstream.JetStream
	s      jetstream.Stream
	signer *events.Signer
	keys   *events.TrustedKeys
}

func newRecord(t *testing.T, maxAge time.Duration) *record {
	t.Helper()
	ns := testenv.Server(t)
	nc := testenv.Conn(t, ns)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	s, err := js.CreateStream(ctx(t), jetstream.StreamConfig{Name: stream, Subjects: []string{"assent.>"}, MaxAge: maxAge})
	if err != nil {
		t.Fatal(err)
	}
	key, err := events.NewDecisionKey()
	if err != nil {
		t.Fatal(err)
	}
	signer, err := events.NewSigner(key)
	if err != nil {
		t.Fatal(err)
	}
	keys, err := events.NewTrustedKeys(signer.PublicKey())
	if err != nil {
		t.Fatal(err)
	}
	return &record{t: t, js: js, s: s, signer: signer, keys: keys}
}

// requests stores n requests and, for each, a decision signed by the
// broker's key, binary-mode headers and all; it returns the sequence of the
// last.
func (r *record) requests(n int) uint64 {
	r.t.Helper()
	var last uint64
	for range n {
		id := events.NewID()
		m := &nats.Msg{Subject: events.RequestPrefix + "coder", Header: nats.Header{"ce-id": {id}, "ce-source": {"agent/coder"}, "X-Note": {"b", "a"}}, Data: []byte(`{"tool":"deploy"}`)}
		r.publish(m)
		e, err := events.New(events.TypeDecided, "", "broker/b1", events.Decided{RequestID: id, Outcome: events.Approved, DecidedAt: time.Now().UTC()})
		if err != nil {
			r.t.Fatal(err)
		}
		if err := r.signer.Sign(&e); err != nil {
			r.t.Fatal(err)
		}
		h, body, _ := events.Encode(&e)
		last = r.publish(&nats.Msg{Subject: events.DecisionPrefix + id, Header: nats.Header(h), Data: body})
	}
	return last
}

func (r *record) publish(m *nats.Msg, opts ...jetstream.PublishOpt) uint64 {
	r.t.Helper()
	ack, err := r.js.PublishMsg(ctx(r.t), m, opts...)
	if err != nil {
		r.t.Fatal(err)
	}
	return ack.Sequence
}

// checkpoint stores the next checkpoint as a broker does, signed by signer
// (nil: unsigned), and returns its data and sequence.
func (r *record) checkpoint(signer *events.Signer) (events.Checkpoint, uint64) {
	r.t.Helper()
	c, after, ok, err := chain.NextCheckpoint(ctx(r.t), r.js, stream)
	if err != nil || !ok {
		r.t.Fatalf("next checkpoint: %v %v", ok, err)
	}
	m, err := chain.Message(c, "broker/b1", signer)
	if err != nil {
		r.t.Fatal(err)
	}
	return c, r.publish(m, jetstream.WithExpectLastSequencePerSubject(after))
}

func (r *record) verify(w ...chain.Witnessed) *chain.Report {
	r.t.Helper()
	rep, err := chain.Verify(ctx(r.t), r.js, stream, chain.Options{Keys: r.keys, Witnessed: w})
	if err != nil {
		r.t.Fatal(err)
	}
	return rep
}

// TestRecordProvesItself: checkpoints made as the broker makes them prove
// the whole stream, decisions signed; a round with nothing new stored but
// the last checkpoint makes none.
func TestRecordProvesItself(t *testing.T) {
	r := newRecord(t, time.Hour)
	r.requests(20)
	c1, _ := r.checkpoint(r.signer)
	r.requests(10)
	c2, seq2 := r.checkpoint(r.signer)
	if c1.From != 1 || c2.From != c1.Upto+1 || c2.Prev != c1.Head || c2.Messages != c2.Upto-c2.From+1 {
		t.Fatalf("checkpoints: %+v then %+v", c1, c2)
	}
	if _, _, ok, err := chain.NextCheckpoint(ctx(t), r.js, stream); ok || err != nil {
		t.Fatalf("a checkpoint with nothing new: ok %v, %v", ok, err)
	}
	rep := r.verify()
	if !rep.OK() || rep.ProvenFrom != 1 || rep.ProvenTo != c2.Upto || rep.Checkpoints != 2 || rep.Decisions != 30 || rep.Signed != 30 {
		t.Fatalf("report: %+v", rep)
	}
	if rep.Last != seq2 {
		t.Fatalf("the stream ends at %d, want %d", rep.Last, seq2)
	}
}

// TestTamperingFound: each way a holder of the broker's NATS credentials
// (but not its decision key) could change the record is found, and named.
func TestTamperingFound(t *testing.T) {
	for _, c := range []struct {
		name   string
		tamper func(r *record, seqs []uint64)
		want   string
	}{
		{"a message deleted", func(r *record, seqs []uint64) {
			if err := r.s.DeleteMsg(ctx(t), 7); err != nil {
				t.Fatal(err)
			}
		}, "of the 10 messages it counted are gone: deleted"},
		{"a checkpoint deleted", func(r *record, seqs []uint64) {
			if err := r.s.DeleteMsg(ctx(t), seqs[1]); err != nil {
				t.Fatal(err)
			}
		}, "does not follow the one at"},
		{"a checkpoint forged", func(r *record, seqs []uint64) {
			other, _ := events.NewDecisionKey()
			forger, _ := events.NewSigner(other)
			r.requests(1)
			r.checkpoint(forger)
		}, "not trusted"},
		{"an unsigned checkpoint", func(r *record, seqs []uint64) {
			r.requests(1)
			r.checkpoint(nil)
		}, "not signed"},
		{"a decision forged", func(r *record, seqs []uint64) {
			e, _ := events.New(events.TypeDecided, "", "broker/evil", events.Decided{RequestID: "R1", Outcome: events.Approved, DecidedAt: time.Now().UTC()})
			h, body, _ := events.Encode(&e)
			r.publish(&nats.Msg{Subject: events.DecisionPrefix + "R1", Header: nats.Header(h), Data: body})
			r.checkpoint(r.signer)
		}, "for request R1"},
		{"the start purged early", func(r *record, seqs []uint64) {
			if err := r.s.Purge(ctx(t), jetstream.WithPurgeSequence(seqs[0]+1)); err != nil {
				t.Fatal(err)
			}
		}, "are gone, although the stream keeps messages for 1h0m0s"},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := newRecord(t, time.Hour)
			var seqs []uint64
			for range 3 {
				r.requests(5)
				_, seq := r.checkpoint(r.signer)
				seqs = append(seqs, seq)
			}
			if rep := r.verify(); !rep.OK() {
				t.Fatalf("before tampering: %q", rep.Problems)
			}
			c.tamper(r, seqs)
			rep := r.verify()
			if rep.OK() || !strings.Contains(strings.Join(rep.Problems, "\n"), c.want) {
				t.Fatalf("problems %q, want one saying %q", rep.Problems, c.want)
			}
		})
	}
}

// TestWitness: a witness keeps each new checkpoint in its file, synced,
// and alerts when the stream's checkpoints go back; Verify with the
// witness's file finds a stream made again shorter (its checkpoints
// forged with the broker's own key would not help: the heads differ), and
// one cut short.
func TestWitness(t *testing.T) {
	r := newRecord(t, 0)
	file := filepath.Join(t.TempDir(), "witness.jsonl")
	var mu sync.Mutex
	var saw, alerts []string
	wctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- chain.Witness(wctx, r.js, stream, file, chain.WitnessOptions{
			Every: 20 * time.Millisecond, Keys: r.keys,
			Saw: func(w chain.Witnessed, c events.Checkpoint) {
				mu.Lock()
				saw = append(saw, fmt.Sprint(c.Upto))
				mu.Unlock()
			},
			Alert: func(msg string) { mu.Lock(); alerts = append(alerts, msg); mu.Unlock() },
		})
	}()
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				mu.Lock()
				defer mu.Unlock()
				t.Fatalf("%s: saw %v, alerts %q", what, saw, alerts)
			}
		}
	}
	count := func(l *[]string) func() int {
		return func() int { mu.Lock(); defer mu.Unlock(); return len(*l) }
	}
	var ups []uint64
	for i := range 3 {
		r.requests(4)
		c, _ := r.checkpoint(r.signer)
		ups = append(ups, c.Upto)
		waitFor("the witness keeps checkpoint "+fmt.Sprint(i+1), func() bool { return count(&saw)() == i+1 })
	}
	kept, err := chain.ReadWitnessed(file)
	if err != nil || len(kept) != 3 {
		t.Fatalf("witness file: %d lines, %v", len(kept), err)
	}
	if rep := r.verify(kept...); !rep.OK() || rep.Witnessed != 3 {
		t.Fatalf("with the witness, before tampering: %+v", rep)
	}

	// The stream made again, shorter: the first two rounds only, with
	// checkpoints signed by the broker's key.
	if err := r.js.DeleteStream(ctx(t), stream); err != nil {
		t.Fatal(err)
	}
	// The server removes the old store's files after it answers the
	// deletion: CreateStream tries again until it has.
	s, err := natsconn.CreateStream(ctx(t), r.js, jetstream.StreamConfig{Name: stream, Subjects: []string{"assent.>"}})
	if err != nil {
		t.Fatal(err)
	}
	r.s = s
	for range 2 {
		r.requests(4)
		r.checkpoint(r.signer)
	}
	// While the stream was gone the witness said so too.
	waitFor("an alert that the chain went back", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return slices.ContainsFunc(alerts, func(a string) bool { return strings.Contains(a, "is behind the one witnessed last") })
	})
	rep := r.verify(kept...)
	problems := strings.Join(rep.Problems, "\n")
	if rep.OK() || !strings.Contains(problems, fmt.Sprintf("a witness saw the chain reach stream sequence %d", ups[2])) {
		t.Fatalf("a stream made again shorter: problems %q", rep.Problems)
	}
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	// The witness's lines are what it read: structured events, whole.
	var line map[string]json.RawMessage
	if err := json.Unmarshal(kept[0].Event, &line); err != nil || line["assentsig"] == nil {
		t.Fatalf("a witnessed event: %s (%v)", kept[0].Event, err)
	}
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

// TestSchedulesComeAndGo: a schedule the broker stores (its durable ticks)
// is removed by the server when it fires; the chain takes it as no message
// from the start, so a checkpoint made while it waited still proves the
// stream after it fired.
func TestSchedulesComeAndGo(t *testing.T) {
	r := newRecord(t, time.Hour)
	if _, err := r.js.UpdateStream(ctx(t), jetstream.StreamConfig{Name: stream, Subjects: []string{"assent.>"}, MaxAge: time.Hour, AllowMsgSchedules: true}); err != nil {
		t.Fatal(err)
	}
	r.requests(2)
	sched := r.publish(&nats.Msg{Subject: "assent.timer.tick.1"}, jetstream.WithScheduleAt(time.Now().Add(time.Second)), jetstream.WithScheduleTarget("assent.tick.at.1"))
	r.requests(1)
	r.checkpoint(r.signer)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if _, err := r.s.GetMsg(ctx(t), sched); err != nil {
			break // fired, and gone
		}
		if time.Now().After(deadline) {
			t.Fatal("the schedule never fired")
		}
	}
	r.checkpoint(r.signer)
	if rep := r.verify(); !rep.OK() || rep.Checkpoints != 2 {
		t.Fatalf("after the schedule fired: %+v", rep)
	}
}

// TestSpanCut: a checkpoint covers at most MaxSpan sequences; the next
// ones go on from where it stopped (each stored checkpoint is one more
// message to cover), and together they prove the stream.
func TestSpanCut(t *testing.T) {
	defer func(n uint64) { chain.MaxSpan = n }(chain.MaxSpan)
	chain.MaxSpan = 7
	r := newRecord(t, time.Hour)
	r.requests(10) // 20 messages
	var cps []events.Checkpoint
	var seq uint64
	for {
		var c events.Checkpoint
		c, seq = r.checkpoint(r.signer)
		cps = append(cps, c)
		if !chain.Cut(c) {
			break
		}
	}
	for i, c := range cps {
		if want := uint64(1 + 7*i); c.From != want || i < len(cps)-1 && c.Upto != want+6 {
			t.Fatalf("checkpoint %d: %+v", i, c)
		}
	}
	if last := cps[len(cps)-1]; last.Upto != seq-1 || len(cps) != 4 {
		t.Fatalf("%d checkpoints, the last up to %d, stored at %d", len(cps), last.Upto, seq)
	}
	if rep := r.verify(); !rep.OK() || rep.ProvenTo != seq-1 {
		t.Fatalf("report: %+v", rep)
	}
}
