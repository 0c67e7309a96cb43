package broker

import (
	"time"

	"github.com/assent-dev/assent/pkg/events"
)

// decisionID is the event id of the decision that the stored message at
// stream sequence trigger, stored at at, makes for request id: a UUIDv7
// whose time is at and whose other bits are a hash of id and trigger. Every
// replica that handles the same trigger builds the same id, so that a
// replica whose publish was refused as a second decision can tell its own
// event (an earlier attempt whose acknowledgement was lost, or a racing
// replica's copy) from another outcome.
func decisionID(id string, trigger uint64, at time.Time) string {
	return events.DerivedID(id, trigger, at)
}
