// Package broker is Assent's approval state machine on JetStream.
//
// The ASSENT stream is the one source of truth. Each replica reads it in
// order (the ledger, ledger.go) and derives every open request's state from
// its stored events: request, pending, answers, cancels, expiry batches. An
// outcome is fixed by one write: the dev.assent.approval.decided event on
// assent.decision.<id> with an expected last subject sequence of zero, so
// the stream itself refuses a second decision for the same request,
// whichever replica or retry tries, and the first one stored is the
// decision (docs/architecture.md, "The state machine").
//
// Deadlines are durable: every second in which some pending request's moment
// falls has a JetStream message schedule (assent.timer.tick.<second>, firing
// onto assent.tick.at.<second>), beside in-memory timers that give sub-second
// precision and hand due requests over in batches (assent.tick.due). A
// replica that starts arms timers for every pending request it finds.
//
// Work arrives through durable pull consumers shared by all replicas: requests,
// responses, cancels, and ticks (batches of due requests, durable ticks). Handlers are idempotent; a message is
// acknowledged only after its effects are stored, malformed or forbidden ones
// are terminated with a reason, and transient failures are retried with backoff.
package broker
