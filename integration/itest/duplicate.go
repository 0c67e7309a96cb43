package itest

import (
	"testing"

	"github.com/assent-dev/assent/pkg/events"
)

// SameDecision fails t unless a and b are the same decided event's data.
func SameDecision(t *testing.T, a, b events.Decided) {
	t.Helper()
	if a.RequestID != b.RequestID || a.Outcome != b.Outcome || !a.DecidedAt.Equal(b.DecidedAt) || a.ArgsDigest != b.ArgsDigest || a.Reason != b.Reason || len(a.DecidedBy) != len(b.DecidedBy) {
		t.Fatalf("different decisions:\n%+v\n%+v", a, b)
	}
	for i := range a.DecidedBy {
		if a.DecidedBy[i].Principal != b.DecidedBy[i].Principal {
			t.Fatalf("different deciders:\n%+v\n%+v", a.DecidedBy, b.DecidedBy)
		}
	}
}
