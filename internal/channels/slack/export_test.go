package slack

import "time"

// SetProbeEvery sets how often a's refused targets are checked again; call
// it before Start.
func SetProbeEvery(a *Adapter, d time.Duration) { a.probeEvery = d }
