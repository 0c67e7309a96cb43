package integration

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/assent-dev/assent/integration/itest"
	"github.com/assent-dev/assent/internal/broker"
	"github.com/assent-dev/assent/pkg/events"
	"github.com/assent-dev/assent/pkg/handler"
)

// TestMalformedEvents publishes broken requests and answers straight to NATS.
// Nothing changes for the request that exists; a broken request whose
// envelope carries a usable id is denied with reason "invalid_request: ...",
// so its agent is not left waiting; the broker's consumers terminate poison
// messages instead of redelivering them, and keep working afterwards.
func TestMalformedEvents(t *testing.T) {
	e := itest.NewEnv(t, broker.Config{})
	const agent = "mal"
	reqSubj, _ := events.RequestSubject(agent)

	// The bystander: a valid pending request that must come through untouched.
	victim, err := e.B.Submit(itest.TestCtx(t, itest.Patience), "", "agent/"+agent, events.Requested{Tool: "rm", Agent: agent, Args: json.RawMessage(`{"path":"/keep"}`), Timeout: events.Duration(time.Minute)})
	if err != nil {
		t.Fatal(err)
	}

	requested := func(id, data string) []byte { return itest.RawEvent(id, events.TypeRequested, "agent/"+agent, data) }
	big := strings.Repeat("x", events.DefaultMaxEventSize)

	// Broken requests whose envelope is sound: each must be denied as invalid.
	rejected := []struct{ name, data string }{
		{"tool-not-a-string", `{"tool":5}`},
		{"args-an-array", `{"tool":"rm","args":[1,2]}`},
		{"args-a-string", `{"tool":"rm","args":"/etc"}`},
		{"missing-tool", `{"args":{"path":"/"}}`},
		{"empty-tool", `{"tool":""}`},
		{"timeout-a-number", `{"tool":"rm","timeout":30}`},
		{"timeout-not-a-duration", `{"tool":"rm","timeout":"forever"}`},
		{"data-a-string", `"rm -rf /"`},
		{"data-null", `null`},
		{"labels-wrong-type", `{"tool":"rm","labels":{"a":1}}`},
		{"agent-mismatch", `{"tool":"rm","agent":"someone-else"}`},
		{"agent-not-a-token", `{"tool":"rm","agent":"a b"}`},
		{"schema-not-an-object", `{"tool":"rm","response_schema":true}`},
	}
	rejectedIDs := map[string]string{}
	for _, r := range rejected {
		id := events.NewID()
		rejectedIDs[id] = r.name
		itest.MustPublish(t, e.JS, reqSubj, requested(id, r.data), id)
	}

	// Broken beyond reading an id, or not a request at all: terminated, no
	// record.
	ignoredIDs := map[string]string{}
	ignored := []struct{ name, subject string }{
		{"not-json", reqSubj},
		{"wrong-type", reqSubj},
		{"bad-id", reqSubj},
		{"no-source", reqSubj},
		{"spec-0.3", reqSubj},
		{"xml-data", reqSubj},
		{"too-large", reqSubj},
	}
	for _, ig := range ignored {
		id := events.NewID()
		ignoredIDs[id] = ig.name
		var body []byte
		switch ig.name {
		case "not-json":
			body = []byte(`{"specversion":"1.0","id":"` + id + `",`)
		case "wrong-type":
			body = itest.RawEvent(id, events.TypeResponded, "agent/"+agent, `{"tool":"rm"}`)
		case "bad-id":
			body = itest.RawEvent(id+" x", events.TypeRequested, "agent/"+agent, `{"tool":"rm"}`)
		case "no-source":
			body = itest.RawEvent(id, events.TypeRequested, "", `{"tool":"rm"}`)
		case "spec-0.3":
			body = []byte(strings.Replace(string(requested(id, `{"tool":"rm"}`)), `"1.0"`, `"0.3"`, 1))
		case "xml-data":
			body = []byte(`{"specversion":"1.0","id":"` + id + `","type":"dev.assent.approval.requested","source":"agent/mal","datacontenttype":"application/xml","data":"<tool>rm</tool>"}`)
		case "too-large":
			// Within the stream's limit (the event limit plus headroom) but over
			// the broker's 1 MiB event limit.
			body = requested(id, `{"tool":"rm","args":{"blob":"`+big+`"}}`)
		}
		itest.MustPublish(t, e.JS, ig.subject, body, "")
	}
	// Far over every limit: the stream itself may refuse it. Either way is fine
	// as long as nothing comes of it.
	hugeID := events.NewID()
	if err := itest.Publish(t, e.JS, reqSubj, requested(hugeID, `{"tool":"rm","args":{"blob":"`+big+big+`"}}`), ""); err != nil {
		t.Logf("a 2 MiB request was refused at publish: %v", err)
	}
	ignoredIDs[hugeID] = "huge"

	// An invalid request reusing the bystander's id must not touch it.
	itest.MustPublish(t, e.JS, reqSubj, requested(victim.ID, `{"args":[1]}`), "")
	// Nor may a request with the bystander's id on another agent's subject.
	otherSubj, _ := events.RequestSubject("intruder")
	itest.MustPublish(t, e.JS, otherSubj, itest.RawEvent(victim.ID, events.TypeRequested, "agent/intruder", `{"tool":"format","args":{"disk":"/dev/sda"}}`), "")

	// Broken answers to the bystander.
	respSubj, _ := events.ResponseSubject("mallory", victim.ID)
	responded := func(data string) []byte {
		return itest.RawEvent(events.NewID(), events.TypeResponded, "approver/mallory", data)
	}
	for name, body := range map[string][]byte{
		"not-json":            []byte(`{"decision":"approve"`),
		"bare-data":           []byte(`{"decision":"approve"}`),
		"decision-a-number":   responded(`{"decision":5}`),
		"unknown-decision":    responded(`{"decision":"maybe"}`),
		"missing-decision":    responded(`{"reason":"?"}`),
		"args-an-array":       responded(`{"decision":"approve","args":[1]}`),
		"deny-with-args":      responded(`{"decision":"deny","args":{"path":"/other"}}`),
		"bad-remember":        responded(`{"decision":"approve","remember":{"scope":"forever"}}`),
		"channel-not-a-token": responded(`{"decision":"approve","channel":"a.b"}`),
		"wrong-type":          itest.RawEvent(events.NewID(), events.TypeRequested, "approver/mallory", `{"decision":"approve"}`),
		"too-large":           responded(`{"decision":"approve","reason":"x","payload":{"blob":"` + big + `"}}`),
	} {
		if err := itest.Publish(t, e.JS, respSubj, body, ""); err != nil {
			t.Logf("answer %s refused at publish: %v", name, err)
		}
	}
	// Answers and cancels for a request nobody made: retried a few times (the
	// request may be on its way through another replica), then given up.
	ghost := events.NewID()
	ghostResp, _ := events.ResponseSubject("mallory", ghost)
	itest.MustPublish(t, e.JS, ghostResp, responded(`{"decision":"approve"}`), "")
	ghostCancel, _ := events.CancelSubject(ghost)
	itest.MustPublish(t, e.JS, ghostCancel, itest.RawEvent(events.NewID(), events.TypeCancel, "agent/"+agent, `{}`), "")
	// A broken cancel for the bystander.
	victimCancel, _ := events.CancelSubject(victim.ID)
	itest.MustPublish(t, e.JS, victimCancel, itest.RawEvent(events.NewID(), events.TypeCancel, "agent/"+agent, `{"reason":5}`), "")
	itest.MustPublish(t, e.JS, victimCancel, []byte("cancel!"), "")

	// Everything is settled: nothing pending, nothing awaiting an ack, nothing
	// being redelivered; and redeliveries were few (only the ghost's answer and
	// cancel are worth retrying, three more times each).
	infos := itest.WaitBrokerIdle(t, e.JS)
	for name, info := range infos {
		n := redeliveries(t, e, info)
		t.Logf("consumer %s: %d redeliveries", name, n)
		if n > 8 {
			t.Errorf("consumer %s redelivered %d times: poison messages are not terminated", name, n)
		}
	}

	for id, name := range rejectedIDs {
		d := itest.WaitDecision(t, e.JS, id)
		if d.Outcome != events.Denied || !strings.HasPrefix(d.Reason, "invalid_request") || !d.Auto || d.Approved() {
			t.Errorf("%s: decision %+v, want denied with reason invalid_request...", name, d)
		}
		rec := itest.WaitState(t, e.B, id, broker.StateDenied)
		if rec.Request.Agent != agent {
			t.Errorf("%s: record names agent %q, want the subject's %q", name, rec.Request.Agent, agent)
		}
		if n := itest.CountDecisions(t, e.JS, id); n != 1 {
			t.Errorf("%s: %d decided messages, want 1", name, n)
		}
	}
	for id, name := range ignoredIDs {
		if d, ok := itest.StoredDecision(t, e.JS, id); ok && d.Outcome != events.Denied {
			t.Errorf("%s: got decision %+v", name, d)
		}
		if rec, err := e.B.Get(itest.TestCtx(t, itest.Patience), id); err == nil && rec.State != broker.StateDenied {
			t.Errorf("%s: got record %+v", name, rec)
		}
	}
	for _, id := range []string{ghost} {
		if _, err := e.B.Get(itest.TestCtx(t, itest.Patience), id); err == nil {
			t.Errorf("an answer created request %s", id)
		}
	}

	// The bystander is exactly as it was.
	now, err := e.B.Get(itest.TestCtx(t, itest.Patience), victim.ID)
	if err != nil {
		t.Fatal(err)
	}
	if now.State != broker.StatePending || now.Revision() != victim.Revision() || now.Request.Tool != "rm" || now.Decision != nil {
		t.Fatalf("bystander changed: %+v (was %+v)", now, victim)
	}
	if _, ok := itest.StoredDecision(t, e.JS, victim.ID); ok {
		t.Fatal("bystander got a decision")
	}

	// And the broker still works: the bystander can be answered, and a new
	// request goes round trip.
	itest.AnswerNATS(t, e.JS, "alice", victim.ID, events.Responded{Decision: events.Approve})
	if d := itest.WaitDecision(t, e.JS, victim.ID); d.Outcome != events.Approved || d.DecidedBy[0].Principal != "alice" {
		t.Fatalf("bystander decided %+v", d)
	}
	client := itest.NewClient(t, e.NC, agent)
	id := events.NewID()
	res := itest.RequestAsync(t, itest.TestCtx(t, time.Minute), client, handler.Request{ID: id, Requested: events.Requested{Tool: "ls", Timeout: events.Duration(time.Minute)}})
	itest.WaitState(t, e.B, id, broker.StatePending)
	itest.AnswerNATS(t, e.JS, "alice", id, events.Responded{Decision: events.Deny, Reason: "still here"})
	if r := itest.Await(t, res); r.Err != nil || r.D.Outcome != events.Denied || r.D.Reason != "still here" {
		t.Fatalf("after the garbage a round trip gave %+v, %v", r.D, r.Err)
	}
	itest.WaitBrokerIdle(t, e.JS)
}

// redeliveries returns how many deliveries of the consumer were second or
// later ones: its delivery count minus the messages its filter matches.
func redeliveries(t *testing.T, e *itest.Env, info *jetstream.ConsumerInfo) uint64 {
	t.Helper()
	ctx, cancel := itest.OpCtx()
	defer cancel()
	si, err := itest.StreamOf(t, e.JS).Info(ctx, jetstream.WithSubjectFilter(info.Config.FilterSubject))
	if err != nil {
		t.Fatal(err)
	}
	var msgs uint64
	for _, n := range si.State.Subjects {
		msgs += n
	}
	if info.Delivered.Consumer < msgs {
		t.Fatalf("consumer %s delivered %d of %d messages", info.Name, info.Delivered.Consumer, msgs)
	}
	return info.Delivered.Consumer - msgs
}

// TestMalformedBinaryMode sends requests in binary content mode (ce- headers):
// a valid one is handled like a structured one, a broken one with a usable id
// is denied as invalid.
func TestMalformedBinaryMode(t *testing.T) {
	e := itest.NewEnv(t, broker.Config{})
	subj, _ := events.RequestSubject("binary")
	header := func(id string) nats.Header {
		return nats.Header{
			"ce-specversion": {"1.0"}, "ce-id": {id}, "ce-type": {events.TypeRequested},
			"ce-source": {"agent/binary"}, "Content-Type": {events.ContentTypeJSON},
		}
	}
	good, bad := events.NewID(), events.NewID()
	ctx := itest.TestCtx(t, itest.Patience)
	if _, err := e.JS.PublishMsg(ctx, &nats.Msg{Subject: subj, Header: header(good), Data: []byte(`{"tool":"ls","args":{"dir":"/"},"timeout":"1m"}`)}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.JS.PublishMsg(ctx, &nats.Msg{Subject: subj, Header: header(bad), Data: []byte(`{"args":{"dir":"/"}}`)}); err != nil {
		t.Fatal(err)
	}
	rec := itest.WaitState(t, e.B, good, broker.StatePending)
	if rec.Request.Tool != "ls" || rec.Request.Agent != "binary" {
		t.Fatalf("record %+v", rec)
	}
	if d := itest.WaitDecision(t, e.JS, bad); d.Outcome != events.Denied || !strings.HasPrefix(d.Reason, "invalid_request") {
		t.Fatalf("broken binary request decided %+v", d)
	}
	itest.WaitBrokerIdle(t, e.JS)
}
