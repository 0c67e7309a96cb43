package worker_test

import (
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/assent-dev/assent/internal/testenv"
	"github.com/assent-dev/assent/internal/worker"
	"github.com/assent-dev/assent/pkg/events"
)

// The raw baseline of the automatic path: every request replied to at once,
// two stored messages each; Close deletes the stream, twice is fine.
func TestLoadRaw(t *testing.T) {
	ns := testenv.Server(t)
	svc := startRaw(t, testenv.Conn(t, ns), false)
	client, err := worker.NewRawClient(testenv.Conn(t, ns), false)
	if err != nil {
		t.Fatal(err)
	}
	res, err := worker.Load(testCtx(t), client, worker.LoadConfig{N: 100, Concurrency: 8})
	if err != nil {
		t.Fatal(err)
	}
	if res.Sent != 100 || res.Decided != 100 || res.Errors != 0 || res.Outcomes[events.Approved] != 100 || res.Latency.P99 <= 0 {
		t.Fatalf("result %+v", res)
	}
	if n := rawMessages(t, ns, 200); n != 200 {
		t.Fatalf("%d messages stored, want 200 (a request and a reply each)", n)
	}
	// A second service on the same server would share the stream: refused.
	if _, err := worker.StartRaw(testCtx(t), testenv.Conn(t, ns), worker.RawConfig{}, nil); !errors.Is(err, worker.ErrRawStreamExists) {
		t.Fatalf("second StartRaw: %v, want ErrRawStreamExists", err)
	}
	for range 2 {
		if err := svc.Close(testCtx(t)); err != nil {
			t.Fatal(err)
		}
	}
	js, err := jetstream.New(testenv.Conn(t, ns))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.Stream(testCtx(t), worker.RawStream); !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Fatalf("stream after Close: %v", err)
	}
}

// The raw baseline whose requester takes replies only once stored: with the
// service republishing them, every request is replied to; with a service
// that does not, none is (the requester waits on the republished copy, not
// on the reply's own subject).
func TestLoadRawStored(t *testing.T) {
	ns := testenv.Server(t)
	svc, err := worker.StartRaw(testCtx(t), testenv.Conn(t, ns), worker.RawConfig{Stored: true}, testenv.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	client, err := worker.NewRawClient(testenv.Conn(t, ns), true)
	if err != nil {
		t.Fatal(err)
	}
	res, err := worker.Load(testCtx(t), client, worker.LoadConfig{N: 50, Concurrency: 8})
	if err != nil {
		t.Fatal(err)
	}
	if res.Decided != 50 || res.Errors != 0 {
		t.Fatalf("result %+v", res)
	}
	if err := svc.Close(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	startRaw(t, testenv.Conn(t, ns), false) // replies not republished
	res, err = worker.Load(testCtx(t), client, worker.LoadConfig{N: 2, Timeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if res.Decided != 0 || res.ErrorKinds["no_decision"] != 2 {
		t.Fatalf("a requester of stored replies, against a service that does not republish them: %+v, want no decision", res)
	}
}

// Without a service, a raw request ends with ErrNoDecision at its timeout.
func TestRawRequestNoService(t *testing.T) {
	ns := testenv.Server(t)
	svc := startRaw(t, testenv.Conn(t, ns), false)
	if err := svc.Close(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(testenv.Conn(t, ns))
	if err != nil {
		t.Fatal(err)
	}
	// The stream, without its service.
	if _, err := js.CreateStream(testCtx(t), jetstream.StreamConfig{Name: worker.RawStream, Subjects: []string{worker.RawPrefix + ".>"}}); err != nil {
		t.Fatal(err)
	}
	client, err := worker.NewRawClient(testenv.Conn(t, ns), false)
	if err != nil {
		t.Fatal(err)
	}
	res, err := worker.Load(testCtx(t), client, worker.LoadConfig{N: 2, Timeout: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if res.Decided != 0 || res.ErrorKinds["no_decision"] != 2 {
		t.Fatalf("result %+v", res)
	}
}
