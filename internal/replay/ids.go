package replay

import (
	"time"

	"github.com/assent-dev/assent/pkg/events"
)

// grantID is the id the broker gives the remembered choice that the answer
// stored at stream sequence seq, at time at, makes for request id: the
// event id it derives for a decision (events.DerivedID) from the request id
// with "/grant" added, so the replay names a grant as the broker did
// ("remembered:<id>").
func grantID(id string, seq uint64, at time.Time) string {
	return events.DerivedID(id+"/grant", seq, at)
}
