package events_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"testing"

	"github.com/assent-dev/assent/pkg/events"
)

// designRequest is the request of docs/protocol.md's request-digest example.
var designRequest = events.Requested{
	Tool:    "delete_file",
	Args:    json.RawMessage(`{"path": "/srv/reports/q3.csv"}`),
	Agent:   "file-manager",
	Session: "s-42",
	User:    "carol",
	Hint:    "Delete the Q3 report?",
	Timeout: events.Duration(120e9),
}

func ExampleRequestDigest() {
	c, _ := events.CanonicalRequest(designRequest)
	d, _ := events.RequestDigest(designRequest)
	fmt.Println(string(c))
	fmt.Println(d)
	// Output:
	// {"agent":"file-manager","args":{"path":"/srv/reports/q3.csv"},"session":"s-42","tool":"delete_file","user":"carol"}
	// sha256:81b1fa218536b0078493d9de4ecbd9ed86f1728d83b8cd4b0ff0ed67458e5da3
}

func TestRequestDigest(t *testing.T) {
	base := designRequest
	want, err := events.RequestDigest(base)
	if err != nil {
		t.Fatal(err)
	}
	same := []struct {
		name string
		edit func(r *events.Requested)
	}{
		{"hint", func(r *events.Requested) { r.Hint = "other words" }},
		{"timeout", func(r *events.Requested) { r.Timeout = 0 }},
		{"args re-encoded", func(r *events.Requested) { r.Args = json.RawMessage("{ \"path\" :\"\\/srv\\/reports\\/q3.csv\" }") }},
		{"labels empty", func(r *events.Requested) { r.Labels = map[string]string{} }},
		{"schema null", func(r *events.Requested) { r.ResponseSchema = json.RawMessage("null") }},
		// Shown to approvers, like the hint; it does not change what runs.
		{"input schema", func(r *events.Requested) { r.InputSchema = json.RawMessage(`{"type":"object"}`) }},
	}
	for _, tc := range same {
		r := base
		tc.edit(&r)
		if got, err := events.RequestDigest(r); err != nil || got != want {
			t.Errorf("%s: digest %s (%v), want the same request's %s", tc.name, got, err, want)
		}
	}
	differ := []struct {
		name  string
		field string
		edit  func(r *events.Requested)
	}{
		{"tool", "tool", func(r *events.Requested) { r.Tool = "drop_database" }},
		{"args", "args", func(r *events.Requested) { r.Args = json.RawMessage(`{"path":"/"}`) }},
		{"no args", "args", func(r *events.Requested) { r.Args = nil }},
		{"agent", "agent", func(r *events.Requested) { r.Agent = "other" }},
		{"session", "session", func(r *events.Requested) { r.Session = "" }},
		{"user", "user", func(r *events.Requested) { r.User = "mallory" }},
		{"call id", "call_id", func(r *events.Requested) { r.CallID = "call-1" }},
		{"labels", "labels", func(r *events.Requested) { r.Labels = map[string]string{"env": "prod"} }},
		{"schema", "response_schema", func(r *events.Requested) { r.ResponseSchema = json.RawMessage(`{"type":"object"}`) }},
	}
	for _, tc := range differ {
		r := base
		tc.edit(&r)
		got, err := events.RequestDigest(r)
		if err != nil || got == want {
			t.Errorf("%s: digest %s (%v) equals the original's", tc.name, got, err)
		}
		if diff := events.DiffRequests(base, r); len(diff) != 1 || diff[0] != tc.field {
			t.Errorf("%s: DiffRequests = %v, want [%s]", tc.name, diff, tc.field)
		}
	}
	if _, err := events.RequestDigest(events.Requested{Tool: "x", Args: json.RawMessage(`[1]`)}); !errors.Is(err, events.ErrArgsNotObject) {
		t.Errorf("args not an object: %v", err)
	}
}

func TestVerifyRequestDigest(t *testing.T) {
	digest, _ := events.RequestDigest(designRequest)
	tests := []struct {
		name    string
		d       events.Decided
		wantErr error
	}{
		{"approved, same request", events.Decided{Outcome: events.Approved, RequestDigest: digest}, nil},
		{"approved, other request", events.Decided{Outcome: events.Approved, RequestDigest: "sha256:00"}, events.ErrRequestMismatch},
		{"approved, no digest", events.Decided{Outcome: events.Approved}, events.ErrMissingField},
		{"denied, other request", events.Decided{Outcome: events.Denied, RequestDigest: "sha256:00"}, events.ErrRequestMismatch},
		{"denied, no digest", events.Decided{Outcome: events.Denied}, nil},
		{"expired, no digest", events.Decided{Outcome: events.Expired}, nil},
	}
	for _, tc := range tests {
		err := tc.d.VerifyRequest(designRequest)
		if !errors.Is(err, tc.wantErr) || (tc.wantErr == nil) != (err == nil) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.wantErr)
		}
		if err != nil && !errors.Is(err, events.ErrInvalid) {
			t.Errorf("%s: %v does not match ErrInvalid", tc.name, err)
		}
	}
}

func TestRejectionSubject(t *testing.T) {
	subj, err := events.RejectionSubject("r-1")
	if err != nil || subj != "assent.rejection.r-1" {
		t.Fatalf("%q %v", subj, err)
	}
	s, err := events.ParseSubject(subj)
	if err != nil || s.Kind != events.KindRejection || s.RequestID != "r-1" || s.Kind.String() != "rejection" {
		t.Fatalf("%+v %v", s, err)
	}
	if _, err := events.RejectionSubject("a.b"); !errors.Is(err, events.ErrBadToken) {
		t.Fatalf("bad id: %v", err)
	}
	e, err := events.New(events.TypeRejected, "", "broker/x", events.Rejected{RequestID: "r-1", Code: events.RejectIDConflict, Reason: "tool differs"})
	if err != nil {
		t.Fatal(err)
	}
	r, err := events.DecodeRejected(&e)
	if err != nil || r.Code != events.RejectIDConflict {
		t.Fatalf("%+v %v", r, err)
	}
	bad, _ := events.New(events.TypeRejected, "", "broker/x", map[string]string{"request_id": "r-1"})
	if _, err := events.DecodeRejected(&bad); !errors.Is(err, events.ErrMissingField) {
		t.Fatalf("rejection without a code: %v", err)
	}
}
