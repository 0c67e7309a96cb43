package broker

import (
	"sync"
	"time"
)

// outage coalesces the log lines of a failure that repeats for as long as
// the NATS server does not answer: the hand-over of due requests is tried
// again every quarter second per request, and with a warning per failure a
// replica logged dozens a second through an outage. It says when to log:
// the first failure of an outage, then at most once every outageEvery while
// it lasts (with the failures since), and the first success after it (with
// the failures in all and how long it lasted). Its methods take the time, so
// that it can be tested without a clock.
type outage struct {
	every time.Duration

	mu       sync.Mutex
	since    time.Time // when the outage began; zero when there is none
	reported time.Time // when it was last reported
	failures int       // in the whole outage
	unsaid   int       // since it was last reported
	lastOK   time.Time // the last success
}

// outageEvery is how often an outage that goes on is reported again.
const outageEvery = 30 * time.Second

func newOutage(every time.Duration) *outage { return &outage{every: every} }

// fail counts a failure at now of an attempt begun at started. It reports
// whether to log it, and how many failures that line stands for (itself
// included). An attempt begun before the last success belongs to an outage
// that has ended (a publish held through it times out after the server is
// back): it is not counted, so that it starts no outage of its own.
func (o *outage) fail(started, now time.Time) (report bool, failures int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if started.Before(o.lastOK) {
		return false, 0
	}
	o.failures++
	o.unsaid++
	if !o.since.IsZero() && now.Sub(o.reported) < o.every {
		return false, 0
	}
	if o.since.IsZero() {
		o.since = now
	}
	o.reported = now
	n := o.unsaid
	o.unsaid = 0
	return true, n
}

// ok records a success at now. It reports whether it ended an outage, with
// the outage's failures and length.
func (o *outage) ok(now time.Time) (ended bool, failures int, lasted time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.lastOK = now
	if o.since.IsZero() {
		return false, 0, 0
	}
	failures, lasted = o.failures, now.Sub(o.since)
	o.since, o.reported, o.failures, o.unsaid = time.Time{}, time.Time{}, 0, 0
	return true, failures, lasted
}
