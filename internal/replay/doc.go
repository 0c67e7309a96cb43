// Package replay evaluates a policy against the requests the ASSENT stream
// recorded, as the broker would have judged each when it was stored, and
// reports where the outcome would differ from the recorded one: `broker
// policy replay` (docs/policy.md, "Replaying a policy against the record").
//
// A Replayer reads the stream's messages in order (Apply) and rebuilds what
// the broker judged with at each request: the remembered choices made by
// answers that asked to remember and decided their request, as the broker
// makes them (internal/broker/answer.go), until they expire; and the running
// totals of the replayed policy's limits, charged by the replay's own
// automatic approvals, as internal/broker/limits.go charges them. Each
// request's stored time is the evaluation's now. What the stream does not
// hold is taken from the recorded outcome: whether an approver was reachable
// (a recorded denial for no_approver_available), a deadline that had passed
// before the broker saw the request, and the checks made before any policy
// (rule validation and input-schema). Grants revoked through the API are not
// in the stream, and count until they expire.
//
// Run reads a live stream over NATS.
package replay
