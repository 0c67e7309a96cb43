package broker

import (
	"context"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/trace"

	"github.com/assent-dev/assent/pkg/events"
)

// TestRecordTrace: a record keeps the trace context of the span that
// ingested its request, drops a tracestate too long to keep with every
// request, and gives the context back to later spans; a record without one
// gives nothing.
func TestRecordTrace(t *testing.T) {
	const parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	for _, tc := range []struct {
		name, parent, state   string
		wantParent, wantState string
	}{
		{"valid", parent, "rojo=00f067aa0ba902b7", parent, "rojo=00f067aa0ba902b7"},
		{"tracestate too long", parent, "a=" + strings.Repeat("x", 250) + ",b=" + strings.Repeat("y", 250) + ",c=" + strings.Repeat("z", 250), parent, ""},
		{"tracestate malformed", parent, "=,=", parent, ""},
		{"malformed", "00-zzz-01", "rojo=1", "", ""},
		{"none", "", "", "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, err := events.New(events.TypeRequested, "", "agent/a", events.Requested{Tool: "t"})
			if err != nil {
				t.Fatal(err)
			}
			c := events.TraceCarrier{Event: &e}
			c.Set(events.TraceParentAttribute, tc.parent)
			c.Set(events.TraceStateAttribute, tc.state)
			var r Record
			r.setTrace(eventContext(context.Background(), &e))
			if r.TraceParent != tc.wantParent || r.TraceState != tc.wantState {
				t.Fatalf("record keeps %q, %q; want %q, %q", r.TraceParent, r.TraceState, tc.wantParent, tc.wantState)
			}
			sc := trace.SpanContextFromContext(r.traceContext(context.Background()))
			if sc.IsValid() != (tc.wantParent != "") {
				t.Fatalf("the record's trace context is valid: %v, want %v", sc.IsValid(), tc.wantParent != "")
			}
			if sc.IsValid() && (sc.TraceID().String() != parent[3:35] || !sc.IsRemote()) {
				t.Errorf("trace context %v, want the remote span of %s", sc, parent)
			}
		})
	}
}
