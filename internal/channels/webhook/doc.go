// Package webhook is the webhook channel of the approver bot: it sends every
// lifecycle event of every request to other systems over HTTP, and takes
// their decisions in, both signed as Standard Webhooks
// (https://www.standardwebhooks.com) say. docs/channels.md tells operators and
// receiver authors how to use it.
//
// # Out
//
// Each configured endpoint has a durable JetStream consumer on the stream
// ASSENT, named webhook-<name>, over the subjects of the wire contract
// (assent.request.*, assent.pending.*, assent.response.*.*, assent.cancel.*,
// assent.decision.*, assent.rejection.*; not the broker's timers). Every
// event whose type and agent the endpoint wants is POSTed as a CloudEvent in
// HTTP structured mode (Content-Type: application/cloudevents+json, the event
// as stored, plus the extension attributes assentsubject and assentrequestid
// that say which request it is about), with the headers webhook-id (the
// CloudEvent id, the same on every retry), webhook-timestamp and
// webhook-signature (Sign). Any 2xx
// answer delivers the event; anything else, or no answer within the
// endpoint's timeout, is retried through the consumer (NakWithDelay) after
// 1s, 2s, 4s, ... up to 5 minutes between attempts, with ±20% jitter, for as
// long as the stream keeps the event. A receiver that is down for minutes or
// hours gets everything, in order, once it is back; a bot that restarts
// carries on where the consumer stands, and several bot processes share the
// consumer without sending anything twice (short of a crash between a
// receiver's 2xx and the acknowledgement: delivery is at least once, so
// receivers drop webhook-ids they have seen).
//
// Order. The consumer hands out one event at a time (MaxAckPending 1), and
// the deliverer pulls the next only once the current one is delivered, so
// each receiver sees the events in stream order: for each request, requested
// before pending before responded before decided. The price: an endpoint
// moves one event per round trip (pull, POST, acknowledgement: 2,000 to
// 2,400 events a second to a local receiver on two cores, against 3,200 to
// 3,700 for a bare ordered consumer that only POSTs and 5,300 to 6,400
// without the order; BenchmarkWebhookDelivery), and an event its receiver keeps refusing holds
// back every later event of that endpoint (not of other endpoints) until it
// is accepted or leaves the stream. Ordering per request only would let
// requests go in parallel, at the cost of a consumer or a sequencer per
// request; approvals are few enough that one ordered queue per endpoint is
// the better trade. Each pull is a Fetch of one event that is always waited
// out, never abandoned: an event the server hands to an abandoned pull waits
// out the consumer's AckWait (30s) before anyone sees it again.
//
// Every attempt is recorded in the delivery log, the stream ASSENT_WEBHOOKS
// (subjects assent-bot.webhooks.<endpoint>, kept 7 days): one Attempt per
// attempt. Log prints it for `approver-bot webhooks log`.
//
// # In
//
// POST /webhooks/in/<name> takes a decision ({"request_id", "decision",
// "reason", "args", "payload"}) signed with that inbound endpoint's secret,
// and answers the request as the endpoint's principal, on channel
// "webhook", through the same path as every other approver. It refuses a bad
// or missing signature (401 bad_signature), a timestamp more than 5 minutes
// off (401 stale_timestamp), a webhook-id it accepted before (409 replayed:
// remembered in this process and in the KV bucket assent-webhook-ids, which
// every bot process shares), a request already decided (409
// already_decided, naming who decided; 410 expired), an unknown request or
// endpoint (404 not_found), a principal the policy does not let answer
// (403 not_eligible, when the bot has seen the request's notice; else the
// broker judges), and a malformed body (400 invalid_request). A refused
// message changes nothing. Accepted decisions get 202: the broker decides,
// and the endpoints receive the decided event.
//
// # As a channel
//
// Adapter implements channels.Adapter so that the bot runs it like the other
// channels: Reaches announces the inbound principals to the brokers, and the
// channel runtime records each request's notice, which the inbound check of
// eligibility reads. Notify and Resolve do nothing: the endpoints' consumers
// already send every event, pending and decided included, in order and with
// retries.
package webhook
