package events_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/assent-dev/assent/pkg/events"
)

// An agent asks whether it may delete a file. The encoded header and body are
// what it publishes on the request subject (with nats.go:
// nc.PublishMsg(&nats.Msg{Subject: subject, Header: nats.Header(h), Data: body})).
func ExampleNew() {
	req := events.Requested{
		Tool:    "delete_file",
		Args:    json.RawMessage(`{"path": "/srv/reports/q3.csv"}`),
		Agent:   "file-manager",
		Session: "s-42",
		User:    "carol",
		Hint:    "Delete the Q3 report?",
		Timeout: events.Duration(2 * time.Minute),
	}
	if err := req.Validate(); err != nil {
		log.Fatal(err)
	}
	// An empty id gets a new UUIDv7; it is also the request id.
	e, err := events.New(events.TypeRequested, "", "agent/file-manager", req)
	if err != nil {
		log.Fatal(err)
	}
	subject, err := events.RequestSubject(req.Agent)
	if err != nil {
		log.Fatal(err)
	}
	h, body, err := events.Encode(&e)
	if err != nil {
		log.Fatal(err)
	}

	fmt.Println("type:", e.Type())
	fmt.Println("subject:", subject)
	fmt.Println("Content-Type:", h["Content-Type"][0])
	fmt.Println("id is a subject token:", events.ValidToken(e.ID()))
	fmt.Println("body is JSON:", json.Valid(body))
	fmt.Println("data:", string(e.Data()))
	// Output:
	// type: dev.assent.approval.requested
	// subject: assent.request.file-manager
	// Content-Type: application/cloudevents+json
	// id is a subject token: true
	// body is JSON: true
	// data: {"tool":"delete_file","args":{"path":"/srv/reports/q3.csv"},"agent":"file-manager","session":"s-42","user":"carol","hint":"Delete the Q3 report?","timeout":"2m0s"}
}

// A worker reads the decision for its request and checks that the arguments it
// is about to execute are the ones the decision approved.
func ExampleDecodeDecided() {
	body := []byte(`{
	  "specversion": "1.0",
	  "id": "0193a5b3-0000-7000-8000-000000000002",
	  "type": "dev.assent.approval.decided",
	  "source": "broker/main",
	  "datacontenttype": "application/json",
	  "data": {
	    "request_id": "0193a5b2-7c1e-7d3a-9f1e-3c2b1a0f9e8d",
	    "outcome": "approved",
	    "reason": "only the draft",
	    "args": {"path": "/srv/reports/q3-draft.csv"},
	    "edited": true,
	    "args_digest": "sha256:8f7f2c358c9a100a5f7fc238c878910982a3ef96af99ac7d5b80995790116c9e",
	    "decided_by": [{"principal": "alice", "channel": "cli", "decision": "approve", "at": "2025-01-02T03:04:05Z"}],
	    "decided_at": "2025-01-02T03:04:05Z",
	    "request_digest": "sha256:81b1fa218536b0078493d9de4ecbd9ed86f1728d83b8cd4b0ff0ed67458e5da3"
	  }
	}`)
	h := events.Header{"Content-Type": {"application/cloudevents+json"}}

	e, err := events.Decode(h, body)
	if err != nil {
		log.Fatal(err)
	}
	d, err := events.DecodeDecided(&e)
	if err != nil {
		log.Fatal(err)
	}
	args, err := events.CanonicalArgs(d.Args)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("outcome:", d.Outcome, "approved:", d.Approved(), "edited:", d.Edited)
	fmt.Println("args:", string(args))
	fmt.Println("args verified:", d.VerifyArgs() == nil)

	// The decision is about the request the agent made, not another one that
	// reused its id.
	asked := events.Requested{Tool: "delete_file", Args: json.RawMessage(`{"path": "/srv/reports/q3.csv"}`),
		Agent: "file-manager", Session: "s-42", User: "carol", Hint: "Delete the Q3 report?"}
	fmt.Println("request verified:", d.VerifyRequest(asked) == nil)
	asked.Tool = "drop_database"
	err = d.VerifyRequest(asked)
	fmt.Println("another request verified:", err == nil, "ErrRequestMismatch:", errors.Is(err, events.ErrRequestMismatch))

	// Arguments changed after the decision no longer match its digest.
	d.Args = json.RawMessage(`{"path": "/srv/reports/q3.csv"}`)
	err = d.VerifyArgs()
	fmt.Println("tampered args verified:", err == nil, "ErrBadValue:", errors.Is(err, events.ErrBadValue))
	// Output:
	// outcome: approved approved: true edited: true
	// args: {"path":"/srv/reports/q3-draft.csv"}
	// args verified: true
	// request verified: true
	// another request verified: false ErrRequestMismatch: true
	// tampered args verified: false ErrBadValue: true
}

// The broker learns who answered which request from the subject, where NATS
// permissions bind the principal.
func ExampleParseSubject() {
	sub, err := events.ParseSubject("assent.response.alice.0193a5b2-7c1e-7d3a-9f1e-3c2b1a0f9e8d")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(sub.Kind, sub.Principal, sub.RequestID)

	sub, err = events.ParseSubject("assent.request.file-manager")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(sub.Kind, sub.Agent)

	for _, s := range []string{"assent.request.*", "assent.response.alice", "assent.other.x"} {
		_, err := events.ParseSubject(s)
		fmt.Printf("%s: bad token %v, bad subject %v\n", s, errors.Is(err, events.ErrBadToken), errors.Is(err, events.ErrBadSubject))
	}
	// Output:
	// response alice 0193a5b2-7c1e-7d3a-9f1e-3c2b1a0f9e8d
	// request file-manager
	// assent.request.*: bad token true, bad subject false
	// assent.response.alice: bad token false, bad subject true
	// assent.other.x: bad token false, bad subject true
}

// The digest binds a decision to its arguments. Key order and white space do
// not change it; the value does.
func ExampleArgsDigest() {
	for _, args := range []string{
		`{"path": "/srv/reports/q3-draft.csv"}`,
		"{\n  \"path\" : \"/srv/reports/q3-draft.csv\"\n}",
		`{"path": "/srv/reports/q3.csv"}`,
	} {
		digest, err := events.ArgsDigest(json.RawMessage(args))
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(digest)
	}
	c, err := events.CanonicalArgs(json.RawMessage(`{"b": [1, 2.50], "a": "<x> & y", "n": 12345678901234567890}`))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(string(c))
	// Output:
	// sha256:8f7f2c358c9a100a5f7fc238c878910982a3ef96af99ac7d5b80995790116c9e
	// sha256:8f7f2c358c9a100a5f7fc238c878910982a3ef96af99ac7d5b80995790116c9e
	// sha256:d6332b046e61c7409695ff14bdd1058696deb1c9972784449d0a021592710205
	// {"a":"<x> & y","b":[1,2.50],"n":12345678901234567890}
}
