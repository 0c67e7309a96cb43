package slack_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/assent-dev/assent/internal/brokertest"
	slackch "github.com/assent-dev/assent/internal/channels/slack"
	"github.com/assent-dev/assent/internal/slacktest"
	"github.com/assent-dev/assent/pkg/events"
	"github.com/assent-dev/assent/pkg/handler"
)

// TestRoutes: a rule's requests go to its route's channel, an agent's to
// its own, a route with dm: true to each eligible approver directly (an
// escalation adds a DM to its approvers and updates the others), and the
// rest to the default channel; every message is resolved (issue 22.12).
func TestRoutes(t *testing.T) {
	h := start(t, setup{config: func(c *slackch.Config) {
		c.Routes = []slackch.Route{
			{Rule: "deploys", Channel: "CDEPLOYS"},
			{Agent: "reporter", Channel: "CREPORTS"},
			{Rule: "wires", DM: true},
		}
	}})
	deploy, _ := h.ask(t, events.Requested{Tool: "deploy", User: "dan"})
	read, _ := h.ask(t, events.Requested{Tool: "read_file", User: "dan"})
	report, _ := h.ask(t, events.Requested{Tool: "read_file", Agent: "reporter", User: "dan"})
	for id, want := range map[string]string{deploy: "CDEPLOYS", read: slackChannel, report: "CREPORTS"} {
		if m := h.message(t, id); m.Channel != want {
			t.Errorf("request %s posted in %s, want %s", id, m.Channel, want)
		}
	}

	// wires: ops (alice, the only one on Slack) by DM, then erin by DM
	// once it escalates after 1s.
	wire, decided := h.ask(t, events.Requested{Tool: "wire", User: "dan"})
	h.slack.Wait(t, "DMs to alice and erin", func() bool {
		var chs []string
		for _, m := range h.slack.MessagesOf(wire) {
			chs = append(chs, m.Channel)
		}
		slices.Sort(chs)
		return slices.Equal(chs, []string{slacktest.DM("UALICE"), slacktest.DM("UERIN")})
	})
	for _, m := range h.slack.MessagesOf(wire) {
		if m.Channel == slacktest.DM("UALICE") {
			h.slack.Wait(t, "alice's DM updated for the escalation", func() bool {
				got, _ := h.slack.Message(wire)
				return got.Updates > 0 && strings.Contains(got.Blocks, "Escalated (level 1)")
			})
		}
	}
	var erin slacktest.Message
	for _, m := range h.slack.MessagesOf(wire) {
		if m.Channel == slacktest.DM("UERIN") {
			erin = m
		}
	}
	h.interact(t, slacktest.Click("UERIN", "assent.approve", wire, erin))
	if d := brokertest.Decision(t, decided); !d.Approved() || d.DecidedBy[0].Principal != "erin" {
		t.Fatalf("decision %+v", d)
	}
	h.slack.Wait(t, "both DMs show the outcome", func() bool {
		ms := h.slack.MessagesOf(wire)
		for _, m := range ms {
			if !strings.Contains(m.Blocks, "*Approved by* erin via slack") {
				return false
			}
		}
		return len(ms) == 2
	})
	if n := len(h.slack.Messages()); n != 5 {
		// three requests, two DMs for the wire, and no thread reply (a DM
		// tells an escalation's approver in a message of its own)
		t.Errorf("%d messages, want 5: %+v", n, h.slack.Messages())
	}
}

// TestRetryFindsMessage: a post Slack stored but answered too late for the
// bot (stopped hard mid-post) is found by the request id in its metadata
// when the notice is retried, and not posted again; messages an earlier
// version posted twice are all found, and all show the outcome (issue
// 22.2).
func TestRetryFindsMessage(t *testing.T) {
	h := start(t, setup{})
	n := handler.Notice{Request: handler.Request{ID: events.NewID(), Requested: events.Requested{Tool: "deploy", Agent: "coder", User: "dan"},
		Deadline: time.Now().Add(time.Minute)}, Rule: "deploys", Approvers: []string{"role:ops"}, Pending: time.Now()}

	h.slack.Delay("chat.postMessage", 3*time.Second)
	ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
	_, err := h.adapter.Notify(ctx, n)
	cancel()
	if err == nil {
		t.Fatal("a post cut short succeeded")
	}
	if got := h.slack.MessagesOf(n.ID); len(got) != 1 || !strings.Contains(got[0].Metadata, n.ID) {
		t.Fatalf("Slack stored %+v, want the message with the request id in its metadata", got)
	}
	h.slack.Delay("chat.postMessage", 0)

	n.Retry = true
	raw, err := h.adapter.Notify(t.Context(), n)
	if err != nil {
		t.Fatal(err)
	}
	first := h.slack.MessagesOf(n.ID)
	if len(first) != 1 {
		t.Fatalf("%d messages after the retry, want the first only", len(first))
	}
	if want := `{"channel":"` + slackChannel + `","ts":"` + first[0].TS + `"}`; string(raw) != want {
		t.Fatalf("ref %s, want %s", raw, want)
	}

	// Two messages already (a bot before this fix): both found, both
	// resolved.
	n.Retry = false
	if _, err := h.adapter.Notify(t.Context(), n); err != nil {
		t.Fatal(err)
	}
	n.Retry = true
	raw, err = h.adapter.Notify(t.Context(), n)
	if err != nil {
		t.Fatal(err)
	}
	if got := h.slack.MessagesOf(n.ID); len(got) != 2 {
		t.Fatalf("%d messages, want 2", len(got))
	}
	n.Ref = raw
	d := handler.Decision{RequestID: n.ID, Outcome: events.Approved, DecidedBy: []events.DecidedBy{{Principal: "alice", Channel: "web"}}, DecidedAt: time.Now()}
	if err := h.adapter.Resolve(t.Context(), handler.Outcome{RequestID: n.ID, Decision: d, Notice: n}); err != nil {
		t.Fatal(err)
	}
	for _, m := range h.slack.MessagesOf(n.ID) {
		if !strings.Contains(m.Blocks, "*Approved by* alice via web") || len(buttons(t, m.Blocks)) != 0 {
			t.Errorf("message %s not resolved: %s", m.TS, m.Blocks)
		}
	}
}

// TestUndeliverable: while Slack refuses the channel for good (the app not
// in it), the channel stops announcing the principals it could not reach,
// so a rule with on_no_approver: deny denies at once instead of waiting
// out its timeout; Problems says why; once the app is invited, the
// principals are announced again (issue 22.3).
func TestUndeliverable(t *testing.T) {
	h := start(t, setup{probe: 200 * time.Millisecond, announcedOnly: true})
	present := func() bool {
		kv, err := h.js.KeyValue(t.Context(), events.PresenceBucket)
		if err != nil {
			return false
		}
		key, _ := events.PresenceKey("alice", "slack")
		_, err = kv.Get(t.Context(), key)
		return err == nil
	}
	h.slack.Wait(t, "alice announced", present)

	h.slack.Fail(slackChannel, "not_in_channel")
	stuck, _ := h.ask(t, events.Requested{Tool: "deploy", User: "dan"})
	h.slack.Wait(t, "alice no longer announced", func() bool { return !present() })
	if r := h.adapter.Reaches(); slices.Contains(r, "alice") {
		t.Fatalf("Reaches %v: alice though her requests cannot be posted", r)
	}
	problems := h.adapter.Problems()
	if len(problems) != 1 || problems[0].Target != slackChannel || problems[0].Code != "not_in_channel" ||
		!slices.Equal(problems[0].Principals, []string{"alice"}) || !strings.Contains(problems[0].Message, "invite the app") {
		t.Fatalf("problems %+v", problems)
	}
	_, ch := h.ask(t, events.Requested{Tool: "deploy", User: "dan"})
	select {
	case d := <-ch:
		if d.Outcome != events.Denied || !strings.Contains(d.Reason, "no_approver") || !d.Auto {
			t.Fatalf("decision %+v, want denied for want of an approver", d)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a request with no reachable approver waits")
	}
	if _, ok := h.slack.Message(stuck); ok {
		t.Fatal("posted in a channel the app is not in")
	}

	h.slack.Fail(slackChannel, "")
	h.slack.Wait(t, "alice announced again", present)
	if p := h.adapter.Problems(); len(p) != 0 {
		t.Fatalf("problems %+v after the fix", p)
	}
}

// TestUndeliverableFromStart: a route's channel that does not exist when
// the channel starts keeps the approvers of its rule out of presence from
// the first announcement, so even the first request of that rule is denied
// at once; the default channel's principals stay (issue 22.3).
func TestUndeliverableFromStart(t *testing.T) {
	h := start(t, setup{announcedOnly: true,
		config: func(c *slackch.Config) { c.Routes = []slackch.Route{{Rule: "wires", Channel: "CWRONG"}} },
		slack:  func(s *slacktest.Server) { s.Fail("CWRONG", "channel_not_found") },
	})
	problems := h.adapter.Problems()
	if len(problems) != 1 || problems[0].Target != "CWRONG" || problems[0].Code != "channel_not_found" ||
		!slices.Equal(problems[0].Principals, []string{"alice", "erin"}) {
		t.Fatalf("problems %+v: want CWRONG, keeping the wires rule's approvers on Slack (alice, erin)", problems)
	}
	if r := h.adapter.Reaches(); !slices.Equal(r, []string{"bob"}) {
		t.Fatalf("Reaches %v, want bob alone", r)
	}
	_, ch := h.ask(t, events.Requested{Tool: "wire", User: "dan"})
	select {
	case d := <-ch:
		if d.Outcome != events.Denied || !strings.Contains(d.Reason, "no_approver") {
			t.Fatalf("decision %+v, want denied for want of an approver", d)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the first request of a rule routed to a missing channel waits")
	}
}

// TestUndeliverableError: an error Slack keeps answering wraps
// handler.ErrUndeliverable; an outage does not.
func TestUndeliverableError(t *testing.T) {
	h := start(t, setup{})
	n := handler.Notice{Request: handler.Request{ID: events.NewID(), Requested: events.Requested{Tool: "deploy"}, Deadline: time.Now().Add(time.Minute)}}
	h.slack.Fail(slackChannel, "channel_not_found")
	if _, err := h.adapter.Notify(t.Context(), n); !errors.Is(err, handler.ErrUndeliverable) {
		t.Fatalf("channel_not_found: %v", err)
	}
	h.slack.Fail(slackChannel, "")
	h.slack.Delay("chat.postMessage", 2*time.Second)
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	if _, err := h.adapter.Notify(ctx, n); err == nil || errors.Is(err, handler.ErrUndeliverable) {
		t.Fatalf("a slow Slack: %v", err)
	}
}
