// Package email is the email approver channel: it mails each pending request
// to the principals who may answer it, with Approve and Deny links, and takes
// their answers in over the bot's HTTP server.
//
// # Links
//
// Every mail carries two links per recipient, one to approve and one to deny,
// of the form PublicURL + "/email/a/" + token. The token is the base64url of
// a small payload (request id, principal, decision, the digest of the
// request's arguments, a hash of the address the mail went to, an expiry no
// later than the request's deadline) and an HMAC-SHA256 over it keyed with
// the link secret, so a link cannot be forged or altered, and it answers only
// as the principal it was mailed to, only for the arguments they were shown.
//
// Opening a link (GET) never decides: mail scanners and link previews follow
// links on their own. It shows the request and a confirmation form; only the
// form's POST answers. A link works once: its first use is recorded in the
// JetStream KV bucket LinkBucket with a create that only one writer can win,
// so a link cannot be replayed, even across several bot processes. Before it
// answers, the channel checks again that the principal may answer the request
// under the current policy (channels.Directory.MayAnswer); the broker checks
// every answer once more.
//
// # Mail
//
// Each recipient gets a mail of their own (links are personal), with a plain
// text part and an HTML part that show the tool, the agent, the user, the
// session, the rule, the deadline, the arguments and the hint. The arguments
// come as a list of every key, in the order the agent wrote them, each with
// its value's start and the count of characters left out (internal/argview),
// so that no long value hides another; the values the list cuts follow in
// full below it, up to a bound, and the link's page shows them whole. Everything the agent sent is escaped, and control
// and invisible characters are made visible (internal/textsafe). An
// escalation mails the principals it adds; a reminder mails again everyone
// who may still answer, saying the deadline is near. Outcomes are not mailed:
// the link page shows them.
package email
