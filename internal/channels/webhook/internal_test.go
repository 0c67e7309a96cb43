package webhook

import (
	"bytes"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/assent-dev/assent/pkg/events"
)

func TestRetryDelay(t *testing.T) {
	for _, c := range []struct {
		attempt  uint64
		min, max time.Duration
	}{
		{1, 800 * time.Millisecond, 1200 * time.Millisecond},
		{2, 1600 * time.Millisecond, 2400 * time.Millisecond},
		{3, 3200 * time.Millisecond, 4800 * time.Millisecond},
		{9, 204800 * time.Millisecond, 5 * time.Minute}, // 256s ± 20%, capped
		{10, 4 * time.Minute, 5 * time.Minute},
		{1000, 4 * time.Minute, 5 * time.Minute},
		{0, 800 * time.Millisecond, 1200 * time.Millisecond}, // no metadata: as a first attempt
	} {
		for _, r := range []float64{0, 0.5, 0.999999} {
			if d := retryDelay(c.attempt, r); d < c.min || d > c.max {
				t.Errorf("retryDelay(%d, %v) = %s, want within [%s, %s]", c.attempt, r, d, c.min, c.max)
			}
		}
	}
	if retryDelay(3, 0) == retryDelay(3, 0.9) {
		t.Error("no jitter")
	}
}

func TestSeenSet(t *testing.T) {
	s := newSeenSet(3)
	now := time.Now()
	if !s.add("a", now) || s.add("a", now.Add(time.Minute)) {
		t.Fatal("a second add of a key within the window must report a replay")
	}
	if !s.add("a", now.Add(2*Tolerance+time.Second)) {
		t.Fatal("a key must be forgotten after the window")
	}
	s.remove("a")
	if !s.add("a", now.Add(2*Tolerance+2*time.Second)) {
		t.Fatal("a removed key must be accepted again")
	}
	// Bounded: past its size, the oldest keys go first.
	s = newSeenSet(3)
	for i := range 10 {
		s.add(fmt.Sprint(i), now)
	}
	if len(s.at) > 3 || len(s.order) > 3 {
		t.Fatalf("set holds %d keys (%d in order), want at most 3", len(s.at), len(s.order))
	}
	if s.add("9", now) {
		t.Fatal("the newest key was evicted")
	}
}

func TestEventType(t *testing.T) {
	for in, want := range map[string]string{
		"pending":                               "dev.assent.approval.pending",
		"dev.assent.approval.decided":           "dev.assent.approval.decided",
		" cancel ":                              "dev.assent.approval.cancel",
		"rejected":                              "dev.assent.approval.rejected",
		"decision":                              "",
		"dev.assent.policy.shadow_disagreement": "",
		"":                                      "",
	} {
		got, ok := eventType(in)
		if ok != (want != "") || ok && got != want {
			t.Errorf("eventType(%q) = %q, %v; want %q", in, got, ok, want)
		}
	}
}

func TestRedactURL(t *testing.T) {
	for in, want := range map[string]string{
		"https://user:pw@example.com/hook?token=s3cret#x": "https://example.com/hook?...",
		"http://127.0.0.1:8080/in":                        "http://127.0.0.1:8080/in",
	} {
		if got := redactURL(in); got != want {
			t.Errorf("redactURL(%q) = %q, want %q", in, got, want)
		}
	}
}

// progressMsg counts InProgress calls.
type progressMsg struct {
	jetstream.Msg
	n atomic.Int32
}

func (m *progressMsg) InProgress() error {
	m.n.Add(1)
	return nil
}

func TestKeepAlive(t *testing.T) {
	m := &progressMsg{}
	stop := keepAlive(m, 10*time.Millisecond)
	deadline := time.Now().Add(5 * time.Second)
	for m.n.Load() < 3 {
		if time.Now().After(deadline) {
			t.Fatalf("%d progress reports in 5s, want 3 at 10ms intervals", m.n.Load())
		}
		time.Sleep(5 * time.Millisecond)
	}
	stop()
	n := m.n.Load()
	time.Sleep(50 * time.Millisecond)
	if m.n.Load() != n {
		t.Fatal("progress reported after stop")
	}
}

func TestDeliveryBody(t *testing.T) {
	e, err := events.New(events.TypeResponded, "", "approver/alice", events.Responded{Decision: events.Approve, Reason: "ok <b>"})
	if err != nil {
		t.Fatal(err)
	}
	h, structuredBody, _ := events.Encode(&e)
	bh, binaryBody, _ := events.EncodeBinary(&e)
	spoofed := e.Clone()
	spoofed.SetExtension(ExtRequestID, "someone-else")
	spoofed.SetExtension(ExtSubject, "assent.response.mallory.someone-else")
	sh, spoofedBody, _ := events.Encode(&spoofed)
	const subject = "assent.response.alice.req-1"
	for _, c := range []struct {
		name     string
		h        events.Header
		body     []byte
		keepTail bool // the stored bytes are kept, after the added attributes
	}{
		{"structured", h, structuredBody, true},
		{"structured with white space", h, append([]byte(" \n{ "), structuredBody[1:]...), false},
		{"binary", bh, binaryBody, false},
		{"attributes set by the publisher", sh, spoofedBody, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			stored, err := events.Decode(c.h, c.body)
			if err != nil {
				t.Fatal(err)
			}
			ct := ""
			if v := c.h["Content-Type"]; len(v) > 0 {
				ct = v[0]
			}
			out, err := deliveryBody(&stored, ct, c.body, subject, "req-1")
			if err != nil {
				t.Fatal(err)
			}
			got, err := events.Decode(events.Header{"Content-Type": {events.ContentTypeStructured}}, out)
			if err != nil {
				t.Fatalf("delivered body is not an event: %v\n%s", err, out)
			}
			ext := got.Extensions()
			if ext[ExtSubject] != subject || ext[ExtRequestID] != "req-1" || got.ID() != e.ID() || string(got.Data()) != string(e.Data()) {
				t.Fatalf("delivered %s", out)
			}
			if c.keepTail && !bytes.HasSuffix(out, structuredBody[1:]) {
				t.Fatalf("stored bytes not kept:\n%s\n%s", out, structuredBody)
			}
		})
	}
}
