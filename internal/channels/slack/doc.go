// Package slack is the Slack approver channel of cmd/approver-bot.
//
// Each pending request is posted where its route sends it (Config.Routes,
// by rule or agent; else Config.Channel), or to each of its approvers in a
// direct message (Config.DM), as a Block Kit message: the tool, agent, user and session, the rule, the hint,
// every argument (its name and the start of its value, with the count of
// characters left out), the deadline in each reader's time zone, a mention of
// the approvers who may answer, and buttons:
//
//   - Approve answers at once.
//   - Deny… opens a modal that asks for the reason.
//   - Edit and approve… opens a modal with the arguments as JSON; the call
//     runs with what the approver submits, once it parses as a JSON object.
//   - Approve and remember…, offered only when the policy lets the answer be
//     remembered, lets the approver pick the scope (this call, session, agent
//     or user) and approves for the rule's longest remember time.
//
// An escalation updates the message and mentions its new approvers in the
// message's thread; a reminder nudges in the thread. Once the request is
// decided, wherever it was decided (Slack, the web UI, another channel, the
// policy, its deadline), the message is updated to show the outcome and who
// decided, and loses its buttons.
//
// # Identity
//
// Every click is answered as the principal the clicking Slack user maps to in
// the policy (principals: alice: {slack: U024BE7LH}); a click from an
// unmapped user, or from a principal the rule does not let answer, changes
// nothing and gets an ephemeral message saying why. Clicks arrive over one of
// two transports (Config.Mode):
//
//   - http: Slack posts them to InteractionsPath on the bot's public URL,
//     signed with the app's signing secret. Requests with a bad signature, a
//     timestamp more than five minutes off, or a signature already seen are
//     refused with 401.
//   - socket: the bot opens a Socket Mode websocket to Slack with an
//     app-level token and receives them over it; no public URL is needed.
//
// # Delivery
//
// Every message carries its request's id in its metadata: a notice whose
// last attempt was cut short (a bot killed while Slack took the message)
// first looks for it in the conversation's history, and keeps what it
// finds. An error Slack will keep answering (no such channel, the app not
// in it, the token revoked) wraps handler.ErrUndeliverable; the principals
// the request was for leave Reaches, so that brokers stop counting them,
// until a post there works or a check every 30 seconds finds it fixed.
// Problems says what is wrong, for the bot's status and metrics.
//
// docs/channels.md says how to make the Slack app.
package slack
