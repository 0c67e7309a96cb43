package events_test

import (
	"bytes"
	"slices"
	"testing"

	"github.com/assent-dev/assent/pkg/events"
)

const (
	testTraceParent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	testTraceState  = "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"
)

// TestTraceCarrier: the carrier reads and writes traceparent and tracestate
// only, as strings, and an empty value removes one.
func TestTraceCarrier(t *testing.T) {
	e, err := events.New(events.TypeCancel, testID, "agent/a", events.Cancel{})
	if err != nil {
		t.Fatal(err)
	}
	c := events.TraceCarrier{Event: &e}
	if keys := c.Keys(); len(keys) != 0 {
		t.Fatalf("a new event has trace attributes %v", keys)
	}
	c.Set(events.TraceParentAttribute, testTraceParent)
	c.Set(events.TraceStateAttribute, testTraceState)
	c.Set("baggage", "k=v")                    // not a trace attribute: ignored
	c.Set(events.SignatureAttribute, "v1.x.y") // nor is this one
	if got := c.Get(events.TraceParentAttribute); got != testTraceParent {
		t.Errorf("traceparent %q, want %q", got, testTraceParent)
	}
	if got := c.Get(events.TraceStateAttribute); got != testTraceState {
		t.Errorf("tracestate %q, want %q", got, testTraceState)
	}
	if got := c.Get("baggage"); got != "" {
		t.Errorf("baggage read as %q; the carrier reads the trace attributes only", got)
	}
	if _, ok := e.Extensions()["baggage"]; ok {
		t.Error("the carrier wrote baggage")
	}
	if _, ok := e.Extensions()[events.SignatureAttribute]; ok {
		t.Error("the carrier wrote the signature attribute")
	}
	if keys := c.Keys(); !slices.Equal(keys, []string{events.TraceParentAttribute, events.TraceStateAttribute}) {
		t.Errorf("keys %v", keys)
	}
	c.Set(events.TraceStateAttribute, "")
	if keys := c.Keys(); !slices.Equal(keys, []string{events.TraceParentAttribute}) {
		t.Errorf("after removing tracestate, keys %v", keys)
	}
}

// TestTraceAttributesOnTheWire: the attributes travel in both content modes
// as plain string attributes, and Encode keeps the event compact.
func TestTraceAttributesOnTheWire(t *testing.T) {
	e, err := events.New(events.TypeRequested, testID, "agent/a", events.Requested{Tool: "t"})
	if err != nil {
		t.Fatal(err)
	}
	c := events.TraceCarrier{Event: &e}
	c.Set(events.TraceParentAttribute, testTraceParent)
	c.Set(events.TraceStateAttribute, testTraceState)

	h, body, err := events.Encode(&e)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(body, []byte(`"traceparent":"`+testTraceParent+`"`)) {
		t.Errorf("structured body lacks the traceparent: %s", body)
	}
	got, err := events.Decode(h, body)
	if err != nil {
		t.Fatal(err)
	}
	if gc := (events.TraceCarrier{Event: &got}); gc.Get(events.TraceParentAttribute) != testTraceParent || gc.Get(events.TraceStateAttribute) != testTraceState {
		t.Errorf("structured round trip: traceparent %q, tracestate %q", gc.Get(events.TraceParentAttribute), gc.Get(events.TraceStateAttribute))
	}

	h, body, err = events.EncodeBinary(&e)
	if err != nil {
		t.Fatal(err)
	}
	if h["ce-traceparent"] == nil {
		t.Errorf("binary headers lack ce-traceparent: %v", h)
	}
	got, err = events.Decode(h, body)
	if err != nil {
		t.Fatal(err)
	}
	if gc := (events.TraceCarrier{Event: &got}); gc.Get(events.TraceParentAttribute) != testTraceParent || gc.Get(events.TraceStateAttribute) != testTraceState {
		t.Errorf("binary round trip: traceparent %q, tracestate %q", gc.Get(events.TraceParentAttribute), gc.Get(events.TraceStateAttribute))
	}
}

// TestTraceAttributesNeverReject: whatever the trace attributes hold, an
// event that is valid without them decodes with them; a value that is not a
// string reads as none.
func TestTraceAttributesNeverReject(t *testing.T) {
	for _, tc := range []struct {
		name, attrs, want string
	}{
		{"malformed", `"traceparent":"00-zzz-01","tracestate":"=,=",`, "00-zzz-01"},
		{"all zero ids", `"traceparent":"00-00000000000000000000000000000000-0000000000000000-01",`, "00-00000000000000000000000000000000-0000000000000000-01"},
		{"future version", `"traceparent":"ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",`, "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
		{"empty", `"traceparent":"",`, ""},
		{"a number", `"traceparent":42,`, ""},
		{"a boolean", `"traceparent":true,`, ""},
		{"tracestate alone", `"tracestate":"a=b",`, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body := []byte(`{"specversion":"1.0","id":"` + testID + `","type":"` + events.TypeRequested + `","source":"agent/a",` + tc.attrs +
				`"datacontenttype":"application/json","data":{"tool":"t"}}`)
			e, err := events.Decode(events.Header{"Content-Type": {events.ContentTypeStructured}}, body)
			if err != nil {
				t.Fatalf("Decode: %v", err)
			}
			if _, err := events.DecodeRequested(&e); err != nil {
				t.Fatalf("DecodeRequested: %v", err)
			}
			if got := (events.TraceCarrier{Event: &e}).Get(events.TraceParentAttribute); got != tc.want {
				t.Errorf("traceparent reads %q, want %q", got, tc.want)
			}
		})
	}
}
