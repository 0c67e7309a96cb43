package integration

import (
	"net"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/assent-dev/assent/integration/itest"
	"github.com/assent-dev/assent/internal/brokertest"
	"github.com/assent-dev/assent/internal/clustertest"
)

// TestBotKilledMidSlackPost runs the approver-bot program with a Slack that
// takes 3 seconds to answer chat.postMessage, and kills it (SIGKILL) once
// Slack has stored the request's message but before it answered. The next
// process, when the notice comes back to it (the consumer's ack wait, about
// 30 seconds), finds that message by the request id in its metadata and
// posts no second one; the decision updates the one message (issue 22.2).
func TestBotKilledMidSlackPost(t *testing.T) {
	bin := itest.Binary(t, "approver-bot")
	w := newChannelWorld(t)
	listen := net.JoinHostPort("127.0.0.1", strconv.Itoa(clustertest.FreePort(t)))
	var log itest.LockedBuffer
	p := w.startBotProc(t, bin, "bot", listen, &log)

	w.slack.Delay("chat.postMessage", 3*time.Second)
	id, decision := w.ask(t, "killed-mid-post")
	w.slack.Wait(t, "Slack stored the message", func() bool { return w.countSlackMessages(id) == 1 })
	p.Kill(t)
	w.slack.Delay("chat.postMessage", 0)
	if n := len(w.slack.Calls("conversations.history")); n != 0 {
		t.Fatalf("%d history reads before the restart", n)
	}

	w.startBotProc(t, bin, "bot", listen, &log)
	// The notice comes back after the consumer's ack wait; the new process
	// looks for the message, and before this fix posted a second one.
	deadline := time.Now().Add(90 * time.Second)
	for len(w.slack.Calls("conversations.history")) == 0 && w.countSlackMessages(id) < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("the notice cut short was not retried after 90s\n%s", log.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	time.Sleep(2 * time.Second) // what a second post would take
	if n := w.countSlackMessages(id); n != 1 {
		t.Fatalf("%d Slack messages for the request, want 1", n)
	}

	itest.ApprovalOf(t, itest.Call(t, http.MethodPost, w.api+"/v1/approvals/"+id+"/decision", `{"principal":"carol","decision":"approve"}`), http.StatusOK)
	if d := brokertest.Decision(t, decision); !d.Approved() {
		t.Fatalf("decision %+v", d)
	}
	w.outcome(t, id, "carol via http")
	if n := w.countSlackMessages(id); n != 1 {
		t.Fatalf("%d Slack messages for the request after the decision, want 1", n)
	}
	if t.Failed() {
		t.Logf("the bot's output:\n%s", log.String())
	}
}
