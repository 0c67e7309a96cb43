package insights

import (
	"time"

	"github.com/assent-dev/assent/pkg/events"
)

// LatencyOf is what a report's P50 or P90 reads for a quantile that is d.
func LatencyOf(d time.Duration) events.Duration { return events.Duration(binValue(binOf(d))) }

// DayExamples is how many examples a group keeps of each day.
const DayExamples = dayExamples
