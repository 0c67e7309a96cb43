package events_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/assent-dev/assent/pkg/events"
)

// benchArgs are the arguments of the benchmarks' requests: what
// integration's BenchmarkRoundTrip sends, and a larger object with nesting,
// white space and text that JSON escapes.
var benchArgs = []struct {
	name string
	args json.RawMessage
}{
	{"small", json.RawMessage(`{"n":1}`)},
	{"1KB", json.RawMessage(`{"path": "/srv/095/ledger", "amount": 5000.25, "currency": "EUR", "note": "quarterly <close> & review",` +
		` "tags": ["a", "b", "c"], "body": "` + strings.Repeat("lorem ipsum dolor sit amet ", 30) + `",` +
		` "nested": {"z": 1, "a": [true, false, null], "m": {"k": "v\u00e9"}}}`)},
}

func benchRequested(args json.RawMessage) events.Requested {
	return events.Requested{Tool: "noop", Args: args, Agent: "bench", Session: "s-1", Labels: map[string]string{"env": "prod"}}
}

// benchDecided is the data of an automatic approval as the broker makes it.
func benchDecided(b *testing.B, args json.RawMessage) events.Decided {
	b.Helper()
	r := benchRequested(args)
	rd, err := events.RequestDigest(r)
	if err != nil {
		b.Fatal(err)
	}
	ad, err := events.ArgsDigest(args)
	if err != nil {
		b.Fatal(err)
	}
	return events.Decided{
		RequestID: testID, Outcome: events.Approved, Reason: "auto-approve mode", Args: args, ArgsDigest: ad,
		Rule: "mode:auto-approve", Auto: true, DecidedAt: time.Date(2026, 5, 1, 12, 0, 0, 123456789, time.UTC), RequestDigest: rd,
	}
}

// BenchmarkNewEncodeDecided is what the broker does to publish an automatic
// decision: build the decided event, then encode it.
func BenchmarkNewEncodeDecided(b *testing.B) {
	for _, a := range benchArgs {
		b.Run(a.name, func(b *testing.B) {
			d := benchDecided(b, a.args)
			b.ReportAllocs()
			for b.Loop() {
				e, err := events.New(events.TypeDecided, testDecided, "broker/b1", &d)
				if err != nil {
					b.Fatal(err)
				}
				e.SetTime(d.DecidedAt)
				if _, _, err := events.Encode(&e); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkEncode(b *testing.B) {
	for _, a := range benchArgs {
		b.Run(a.name, func(b *testing.B) {
			e := benchDecidedEvent(b, a.args)
			b.ReportAllocs()
			for b.Loop() {
				if _, _, err := events.Encode(&e); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkRequestDigest(b *testing.B) {
	for _, a := range benchArgs {
		b.Run(a.name, func(b *testing.B) {
			r := benchRequested(a.args)
			b.ReportAllocs()
			for b.Loop() {
				if _, err := events.RequestDigest(r); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkArgsDigest(b *testing.B) {
	for _, a := range benchArgs {
		b.Run(a.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := events.ArgsDigest(a.args); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkDecodeRequested is what the broker does with a request message:
// decode the event, then its data.
func BenchmarkDecodeRequested(b *testing.B) {
	for _, a := range benchArgs {
		b.Run(a.name, func(b *testing.B) {
			e, err := events.New(events.TypeRequested, testID, "agent/bench", benchRequested(a.args))
			if err != nil {
				b.Fatal(err)
			}
			h, body, err := events.Encode(&e)
			if err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			for b.Loop() {
				e, err := events.Decode(h, body)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := events.DecodeRequested(&e); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkDecodeDecided is what an agent does with a decision message:
// decode the event and its data, and check the args against their digest.
func BenchmarkDecodeDecided(b *testing.B) {
	for _, a := range benchArgs {
		b.Run(a.name, func(b *testing.B) {
			e := benchDecidedEvent(b, a.args)
			h, body, err := events.Encode(&e)
			if err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			for b.Loop() {
				e, err := events.Decode(h, body)
				if err != nil {
					b.Fatal(err)
				}
				got, err := events.DecodeDecided(&e)
				if err != nil {
					b.Fatal(err)
				}
				if err := got.VerifyArgs(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// benchDecidedEvent is the decided event of a request with args, as the
// broker makes it.
func benchDecidedEvent(b *testing.B, args json.RawMessage) events.Event {
	b.Helper()
	d := benchDecided(b, args)
	e, err := events.New(events.TypeDecided, testDecided, "broker/b1", &d)
	if err != nil {
		b.Fatal(err)
	}
	return e
}
