// Package terminal is the terminal approver of approver-bot (`approver-bot
// cli`): a full-screen interactive list of the requests waiting for one
// principal, read straight from the broker's stream on NATS, with keys to
// approve, deny with a reason, approve with arguments edited in $EDITOR,
// answer a request's response schema, and remember an answer.
//
// The terminal is an approver channel like Slack or email, named "cli" in
// decisions. It answers on assent.response.<principal>.<id> through
// handler.Answer, as every approver does, and learns the outcome from the
// decision the broker publishes; it never decides anything itself. With a
// policy Directory it refuses locally, sending nothing, what the broker
// would refuse anyway (a request the principal may not answer), and shows
// such requests dimmed with the reason, or hides them.
//
// Run is all there is: the caller (cmd/approver-bot) connects to NATS, reads
// the policy, and hands both over with the principal to answer as. The
// screen works from 80x24 up and follows resizes; with NO_COLOR set it uses
// no color (the selection, refusals and errors are marked in text too).
//
// Inside, a feed (feed.go) follows the stream with an ordered consumer and
// queues what it reads for the program; the model (model.go) holds the list
// and the prompts and turns keys into answers; view.go draws it; edit.go
// runs the editor and shows the diff; presence.go announces the principal.
package terminal
