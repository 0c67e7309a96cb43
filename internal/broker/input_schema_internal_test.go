package broker

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/assent-dev/assent/internal/testenv"
	"github.com/assent-dev/assent/pkg/events"
)

// fileSchema is the input schema of the requests of these tests.
const fileSchema = `{"type":"object","properties":{"path":{"type":"string"}},"required":["path"],"additionalProperties":false}`

// TestEditBreaksInputSchema: an approval whose edited args break the
// request's input_schema is refused, over HTTP (ErrInvalid, with the
// schema's words) and over NATS (terminated, not counted), and the request
// still waits for a good answer; with its record kept whole, and kept cold
// (read back from the stream to apply each answer).
func TestEditBreaksInputSchema(t *testing.T) {
	for _, tc := range []struct {
		name    string
		maxFull int
	}{{"whole", maxFullRecords}, {"cold", 0}} {
		t.Run(tc.name, func(t *testing.T) {
			ns := testenv.Server(t)
			nc := testenv.Conn(t, ns)
			b, ctx := runInternalLogged(t, nc, Config{}, testenv.Logger(t), func(b *Broker) { b.ledger.maxFull = tc.maxFull })
			rec := submit(ctx, t, b, events.Requested{Tool: "rm", Agent: "a1", Args: []byte(`{"path":"/srv/a"}`),
				InputSchema: []byte(fileSchema), Timeout: events.Duration(time.Minute)})
			if rec.State != StatePending {
				t.Fatalf("a request whose args fit its schema: %s (%+v)", rec.State, rec.Decision)
			}
			if err := b.ledger.catchUp(ctx); err != nil {
				t.Fatal(err)
			}
			b.ledger.mu.Lock()
			cold := b.ledger.open[rec.ID].rec == nil
			b.ledger.mu.Unlock()
			if cold != (tc.maxFull == 0) {
				t.Fatalf("record kept cold: %v, want %v", cold, tc.maxFull == 0)
			}

			// Over HTTP: refused with the schema's words, nothing recorded.
			_, err := b.Respond(ctx, "alice", rec.ID, events.Responded{Decision: events.Approve, Args: []byte(`{"path":5}`)})
			if !errors.Is(err, ErrInvalid) || !errors.Is(err, events.ErrSchema) || !strings.Contains(err.Error(), "args: /path: got number, want string") {
				t.Fatalf("an edit that breaks the schema: %v", err)
			}
			_, err = b.Respond(ctx, "alice", rec.ID, events.Responded{Decision: events.Approve, Args: []byte(`{"path":"/srv/a","force":true}`)})
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "additional properties 'force' not allowed") {
				t.Fatalf("an edit with a property the schema does not allow: %v", err)
			}

			// Over NATS: terminated, and not counted.
			rejected := b.Stats().Rejected
			publishAnswer(ctx, t, nc, "bob", rec.ID, `{"decision":"approve","args":{"path":7},"channel":"cli"}`)
			for b.Stats().Rejected == rejected {
				if ctx.Err() != nil {
					t.Fatal("the answer over NATS was never rejected")
				}
				time.Sleep(10 * time.Millisecond)
			}
			got, err := b.Get(ctx, rec.ID)
			if err != nil || got.State != StatePending || len(got.Votes) != 0 {
				t.Fatalf("after refused edits: %v, %s with votes %+v", err, got.State, got.Votes)
			}

			// An edit that fits decides.
			got, err = b.Respond(ctx, "alice", rec.ID, events.Responded{Decision: events.Approve, Args: []byte(`{"path":"/srv/b"}`)})
			if err != nil || got.State != StateApproved || !got.Decision.Edited || string(got.Decision.Args) != `{"path":"/srv/b"}` {
				t.Fatalf("an edit that fits: %v, %+v", err, got.Decision)
			}
		})
	}
}

// publishAnswer publishes principal's answer data to request id over NATS,
// as an approver would, and waits for the stream to store it.
func publishAnswer(ctx context.Context, t *testing.T, nc *nats.Conn, principal, id, data string) {
	t.Helper()
	e, err := events.New(events.TypeResponded, "", "approver/"+principal, json.RawMessage(data))
	if err != nil {
		t.Fatal(err)
	}
	subj, err := events.ResponseSubject(principal, id)
	if err != nil {
		t.Fatal(err)
	}
	h, body, err := events.Encode(&e)
	if err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.PublishMsg(ctx, &nats.Msg{Subject: subj, Header: nats.Header(h), Data: body}); err != nil {
		t.Fatal(err)
	}
}

// TestRequestBreaksInputSchema: a request whose own args break its
// input_schema, or whose input_schema cannot check them, is denied at once
// with rule input-schema, and nobody is asked; the policy is not consulted
// (an allow rule does not approve it).
func TestRequestBreaksInputSchema(t *testing.T) {
	ns := testenv.Server(t)
	b, ctx := runInternal(t, testenv.Conn(t, ns), Config{Mode: ModeAutoApprove})
	for _, tc := range []struct {
		name, schema, args, reason string
	}{
		{"wrong type", fileSchema, `{"path":5}`, "the args break the request's input_schema: args: /path: got number, want string"},
		{"missing property", fileSchema, ``, "the args break the request's input_schema: args: missing property 'path'"},
		{"schema does not compile", `{"type":5}`, `{"path":"/srv/a"}`, "input_schema cannot check the args: input_schema: "},
		{"schema with an external ref", `{"$ref":"https://example.com/s.json"}`, `{}`, "external references are not allowed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := submit(ctx, t, b, events.Requested{Tool: "rm", Agent: "a1", Args: []byte(tc.args), InputSchema: []byte(tc.schema)})
			d := rec.Decision
			if rec.State != StateDenied || d == nil || d.Rule != RuleInputSchema || !d.Auto || !strings.Contains(d.Reason, tc.reason) {
				t.Fatalf("got %s, decision %+v; want denied by %s saying %q", rec.State, d, RuleInputSchema, tc.reason)
			}
			if err := d.VerifyArgs(); err != nil {
				t.Fatal(err)
			}
			stored, err := b.Wait(ctx, rec.ID)
			if err != nil || stored.State != StateDenied || stored.Decision.Rule != RuleInputSchema {
				t.Fatalf("stored: %v, %+v", err, stored.Decision)
			}
		})
	}
	// Args that fit go on to the policy, which approves them.
	rec := submit(ctx, t, b, events.Requested{Tool: "rm", Agent: "a1", Args: []byte(`{"path":"/srv/a"}`), InputSchema: []byte(fileSchema)})
	if rec.State != StateApproved || rec.Decision.Rule == RuleInputSchema {
		t.Fatalf("args that fit: %s by %q", rec.State, rec.Decision.Rule)
	}
}
