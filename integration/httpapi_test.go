package integration

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/assent-dev/assent/integration/itest"
	"github.com/assent-dev/assent/internal/app"
	"github.com/assent-dev/assent/internal/broker"
	"github.com/assent-dev/assent/internal/httpapi"
	"github.com/assent-dev/assent/pkg/events"
)

// appEnv is the whole broker process (app.Run) with embedded NATS, and a
// connection to its NATS.
type appEnv struct {
	api string
	js  jetstream.JetStream
}

// newAppEnv runs app.Run with an embedded server on free ports (port 0 for
// NATS as for HTTP) and storage in t.TempDir().
func newAppEnv(t *testing.T) *appEnv {
	t.Helper()
	addrs := itest.StartApp(t, app.Options{
		NATSListen: "127.0.0.1:0",
		DataDir:    t.TempDir(),
		HTTPListen: "127.0.0.1:0",
		Broker:     broker.Config{Name: "http-itest"},
	})
	if addrs.HTTP == "" || addrs.NATS == "" {
		t.Fatalf("addresses %+v", addrs)
	}
	if u, err := url.Parse(addrs.NATS); err != nil || u.Port() == "" || u.Port() == "0" || u.Port() == "4222" {
		t.Fatalf("NATSListen 127.0.0.1:0 gave %s, want a free port (not nats-server's fixed default 4222)", addrs.NATS)
	}
	nc, err := nats.Connect(addrs.NATS)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return &appEnv{api: addrs.HTTP, js: itest.NewJS(t, nc)}
}

// create posts a request and checks it was created pending.
func (a *appEnv) create(t *testing.T, body map[string]any) httpapi.Approval {
	t.Helper()
	r := itest.Call(t, http.MethodPost, a.api+"/v1/approvals", body)
	got := itest.ApprovalOf(t, r, http.StatusCreated)
	if got.State != broker.StatePending || got.ID == "" || got.Decision != nil {
		t.Fatalf("created %+v", got)
	}
	if loc := r.Header.Get("Location"); loc != "/v1/approvals/"+got.ID {
		t.Fatalf("Location %q, want /v1/approvals/%s", loc, got.ID)
	}
	return got
}

// list returns the ids GET /v1/approvals?query lists.
func (a *appEnv) list(t *testing.T, query string) []string {
	t.Helper()
	r := itest.Call(t, http.MethodGet, a.api+"/v1/approvals?"+query, nil)
	if r.Status != http.StatusOK {
		t.Fatalf("list ?%s: %d %s", query, r.Status, r.Body)
	}
	var out struct {
		Approvals []httpapi.Approval `json:"approvals"`
	}
	if err := json.Unmarshal(r.Body, &out); err != nil {
		t.Fatal(err)
	}
	if out.Approvals == nil {
		t.Fatalf("list ?%s: approvals is not an array: %s", query, r.Body)
	}
	ids := []string{}
	for _, ap := range out.Approvals {
		ids = append(ids, ap.ID)
	}
	return ids
}

// longPoll sends a request in the background; the channel yields its
// response (or, on a transport error, a response with status 0 and the error
// as its body).
func longPoll(method, url string, body any) <-chan itest.HTTPResp {
	done := make(chan itest.HTTPResp, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		r, err := itest.DoHTTP(ctx, method, url, body)
		if err != nil {
			r.Body = []byte(err.Error())
		}
		done <- r
	}()
	return done
}

// decidedByLongPoll takes what a long poll returned for request id, which
// was decided while the poll waited. A poll that sat out its whole wait and
// still says "pending" is the race TestLongPollSeesEveryDecision pins down;
// here it is only logged, and the decision is read with a plain GET, so that
// this test checks everything else.
func (a *appEnv) decidedByLongPoll(t *testing.T, id string, got httpapi.Approval) httpapi.Approval {
	t.Helper()
	if got.State != broker.StatePending {
		return got
	}
	t.Logf("long poll on %s missed its decision (see TestLongPollSeesEveryDecision)", id)
	return itest.ApprovalOf(t, itest.Call(t, http.MethodGet, a.api+"/v1/approvals/"+id, nil), http.StatusOK)
}

func sameSet(got []string, want ...string) bool {
	if len(got) != len(want) {
		return false
	}
	m := map[string]bool{}
	for _, g := range got {
		m[g] = true
	}
	for _, w := range want {
		if !m[w] {
			return false
		}
	}
	return true
}

// TestHTTPAPI drives the HTTP API of a whole broker process end to end.
func TestHTTPAPI(t *testing.T) {
	a := newAppEnv(t)

	t.Run("health", func(t *testing.T) {
		for path, want := range map[string]string{"/healthz": "ok", "/readyz": "ready"} {
			r := itest.Call(t, http.MethodGet, a.api+path, nil)
			var body struct{ Status string }
			if r.Status != http.StatusOK || json.Unmarshal(r.Body, &body) != nil || body.Status != want {
				t.Fatalf("%s: %d %s", path, r.Status, r.Body)
			}
		}
	})

	t.Run("create-and-get", func(t *testing.T) {
		got := a.create(t, map[string]any{"agent": "web", "tool": "rm", "args": map[string]any{"path": "/x"}, "session": "s-1", "user": "carol", "hint": "Remove /x?", "timeout": "1m", "labels": map[string]string{"env": "prod"}})
		if got.Request.Agent != "web" || got.Request.Tool != "rm" || !itest.SameJSON(got.Request.Args, []byte(`{"path":"/x"}`)) || got.Request.User != "carol" || got.Request.Labels["env"] != "prod" {
			t.Fatalf("request echoed as %+v", got.Request)
		}
		if d := got.Deadline.Sub(got.ReceivedAt); d != time.Minute {
			t.Fatalf("deadline %s after receipt, want 1m", d)
		}
		r := itest.Call(t, http.MethodGet, a.api+"/v1/approvals/"+got.ID, nil)
		again := itest.ApprovalOf(t, r, http.StatusOK)
		if again.ID != got.ID || again.State != broker.StatePending || !again.Deadline.Equal(got.Deadline) {
			t.Fatalf("GET %+v, created %+v", again, got)
		}
		var raw map[string]json.RawMessage
		if err := json.Unmarshal(r.Body, &raw); err != nil || string(raw["decision"]) != "null" {
			t.Fatalf("a pending approval must have \"decision\": null: %s", r.Body)
		}

		// A chosen id is kept; creating it again is the same request, and a
		// different request under it is refused.
		id := events.NewID()
		first := a.create(t, map[string]any{"id": id, "agent": "web", "tool": "ls"})
		if first.ID != id {
			t.Fatalf("created %s, asked for id %s", first.ID, id)
		}
		r = itest.Call(t, http.MethodPost, a.api+"/v1/approvals", map[string]any{"id": id, "agent": "web", "tool": "ls", "hint": "hints may change"})
		if r.Status/100 != 2 {
			t.Fatalf("creating id %s again: %d %s", id, r.Status, r.Body)
		}
		dup := itest.ApprovalOf(t, r, r.Status)
		if dup.ID != id || dup.Request.Tool != "ls" || !dup.ReceivedAt.Equal(first.ReceivedAt) {
			t.Fatalf("creating id %s again gave %+v", id, dup)
		}
		itest.WantError(t, itest.Call(t, http.MethodPost, a.api+"/v1/approvals", map[string]any{"id": id, "agent": "web", "tool": "format_disk"}), http.StatusConflict, "id_conflict")
	})

	t.Run("create-with-wait", func(t *testing.T) {
		id := events.NewID()
		done := longPoll(http.MethodPost, a.api+"/v1/approvals?wait=10s", map[string]any{"id": id, "agent": "web", "tool": "deploy", "timeout": "1m"})
		itest.Eventually(t, itest.Patience, func() (bool, string) {
			r := itest.Call(t, http.MethodGet, a.api+"/v1/approvals/"+id, nil)
			return r.Status == http.StatusOK, "not created yet"
		})
		itest.ApprovalOf(t, itest.Call(t, http.MethodPost, a.api+"/v1/approvals/"+id+"/decision", itest.DecisionBody{Principal: "alice", Responded: events.Responded{Decision: events.Approve}}), http.StatusOK)
		r := <-done
		if loc := r.Header.Get("Location"); loc != "/v1/approvals/"+id {
			t.Fatalf("Location %q", loc)
		}
		// 201 whether or not it waited.
		got := a.decidedByLongPoll(t, id, itest.ApprovalOf(t, r, http.StatusCreated))
		if got.State != broker.StateApproved || got.Decision == nil || got.Decision.DecidedBy[0].Principal != "alice" {
			t.Fatalf("POST ?wait= returned %+v", got)
		}

		// Nobody answers: the wait ends with the request still pending.
		r = itest.Call(t, http.MethodPost, a.api+"/v1/approvals?wait=300ms", map[string]any{"agent": "web", "tool": "deploy", "timeout": "1m"})
		if got := itest.ApprovalOf(t, r, http.StatusCreated); got.State != broker.StatePending {
			t.Fatalf("POST ?wait= with no answer: %+v", got)
		}
	})

	t.Run("get-with-wait", func(t *testing.T) {
		pending := a.create(t, map[string]any{"agent": "web", "tool": "deploy", "timeout": "1m"})
		done := longPoll(http.MethodGet, a.api+"/v1/approvals/"+pending.ID+"?wait=10s", nil)
		// Answer over NATS while the GET waits. (The pause only makes it likely
		// that the GET is waiting already; the test holds either way.)
		time.Sleep(100 * time.Millisecond)
		itest.AnswerNATS(t, a.js, "bob", pending.ID, events.Responded{Decision: events.Deny, Reason: "not today"})
		ap := a.decidedByLongPoll(t, pending.ID, itest.ApprovalOf(t, <-done, http.StatusOK))
		if ap.State != broker.StateDenied || ap.Decision.Reason != "not today" {
			t.Fatalf("GET ?wait= returned %+v", ap)
		}
		// Already decided: no waiting at all is needed.
		if ap := itest.ApprovalOf(t, itest.Call(t, http.MethodGet, a.api+"/v1/approvals/"+pending.ID+"?wait=1m", nil), http.StatusOK); ap.State != broker.StateDenied {
			t.Fatalf("GET ?wait= on a decided request: %+v", ap)
		}
		// Nobody answers: the wait ends with the request still pending.
		other := a.create(t, map[string]any{"agent": "web", "tool": "deploy", "timeout": "1m"})
		if ap := itest.ApprovalOf(t, itest.Call(t, http.MethodGet, a.api+"/v1/approvals/"+other.ID+"?wait=300ms", nil), http.StatusOK); ap.State != broker.StatePending {
			t.Fatalf("GET ?wait= with no answer: %+v", ap)
		}
	})

	t.Run("list", func(t *testing.T) {
		a1 := a.create(t, map[string]any{"agent": "lister-a", "session": "ls-1", "tool": "t1", "timeout": "1m"})
		a2 := a.create(t, map[string]any{"agent": "lister-a", "session": "ls-2", "tool": "t2", "timeout": "1m"})
		b1 := a.create(t, map[string]any{"agent": "lister-b", "session": "ls-1", "tool": "t3", "timeout": "1m"})
		itest.ApprovalOf(t, itest.Call(t, http.MethodPost, a.api+"/v1/approvals/"+a2.ID+"/decision", itest.DecisionBody{Principal: "alice", Responded: events.Responded{Decision: events.Approve}}), http.StatusOK)
		for _, c := range []struct {
			query string
			want  []string
		}{
			{"agent=lister-a", []string{a1.ID, a2.ID}},
			{"agent=lister-a&state=pending", []string{a1.ID}},
			{"agent=lister-a&state=approved", []string{a2.ID}},
			{"session=ls-1", []string{a1.ID, b1.ID}},
			{"session=ls-1&agent=lister-b", []string{b1.ID}},
			{"session=ls-2&state=pending", nil},
			{"agent=nobody", nil},
		} {
			if got := a.list(t, c.query); !sameSet(got, c.want...) {
				t.Errorf("?%s lists %v, want %v", c.query, got, c.want)
			}
		}
		if got := a.list(t, "agent=lister-a&limit=1"); len(got) != 1 {
			t.Errorf("?limit=1 lists %v", got)
		}
		for _, q := range []string{"state=bogus", "limit=0", "limit=x", "limit=1001"} {
			itest.WantError(t, itest.Call(t, http.MethodGet, a.api+"/v1/approvals?"+q, nil), http.StatusBadRequest, "invalid_request")
		}
	})

	t.Run("decision", func(t *testing.T) {
		p := a.create(t, map[string]any{"agent": "web", "tool": "rm", "args": map[string]any{"path": "/a"}, "timeout": "1m"})
		url := a.api + "/v1/approvals/" + p.ID + "/decision"
		for _, body := range []string{
			`{bad`, ``, `[]`,
			`{"decision":"approve"}`, // who is answering?
			`{"principal":"alice","decision":"maybe"}`,
			`{"principal":"alice"}`,
			`{"principal":"alice","decision":"approve","args":[1]}`,
			`{"principal":"alice","decision":"deny","args":{"path":"/b"}}`,
			`{"principal":"a b","decision":"approve"}`,
			`{"principal":"alice","decision":"approve","remember":{"scope":"forever"}}`,
		} {
			itest.WantError(t, itest.Call(t, http.MethodPost, url, body), http.StatusBadRequest, "invalid_request")
		}
		if ap := itest.ApprovalOf(t, itest.Call(t, http.MethodGet, a.api+"/v1/approvals/"+p.ID, nil), http.StatusOK); ap.State != broker.StatePending {
			t.Fatalf("bad answers changed the request: %+v", ap)
		}
		ap := itest.ApprovalOf(t, itest.Call(t, http.MethodPost, url, `{"principal":"alice","decision":"approve","args":{"path":"/b"},"reason":"b, not a"}`), http.StatusOK)
		if ap.State != broker.StateApproved || !ap.Decision.Edited || !itest.SameJSON(ap.Decision.Args, []byte(`{"path":"/b"}`)) || ap.Decision.DecidedBy[0].Channel != "http" {
			t.Fatalf("approved %+v", ap.Decision)
		}
		itest.WantError(t, itest.Call(t, http.MethodPost, url, itest.DecisionBody{Principal: "bob", Responded: events.Responded{Decision: events.Deny}}), http.StatusConflict, "already_decided")
		d := itest.WaitDecision(t, a.js, p.ID)
		if d.Outcome != events.Approved || !d.DecidedAt.Equal(ap.Decision.DecidedAt) {
			t.Fatalf("stream holds %+v", d)
		}
	})

	t.Run("cancel", func(t *testing.T) {
		p := a.create(t, map[string]any{"agent": "web", "tool": "rm", "timeout": "1m"})
		ap := itest.ApprovalOf(t, itest.Call(t, http.MethodPost, a.api+"/v1/approvals/"+p.ID+"/cancel", map[string]string{"reason": "changed my mind", "by": "carol"}), http.StatusOK)
		if ap.State != broker.StateCancelled || ap.Decision.Reason != "changed my mind" || ap.Decision.DecidedBy[0].Principal != "carol" {
			t.Fatalf("cancelled %+v", ap.Decision)
		}
		itest.WantError(t, itest.Call(t, http.MethodPost, a.api+"/v1/approvals/"+p.ID+"/cancel", nil), http.StatusConflict, "already_decided")
		itest.WantError(t, itest.Call(t, http.MethodPost, a.api+"/v1/approvals/"+p.ID+"/decision", itest.DecisionBody{Principal: "alice", Responded: events.Responded{Decision: events.Approve}}), http.StatusConflict, "already_decided")

		// No body at all is a cancel without a reason.
		q := a.create(t, map[string]any{"agent": "web", "tool": "rm", "timeout": "1m"})
		ap = itest.ApprovalOf(t, itest.Call(t, http.MethodPost, a.api+"/v1/approvals/"+q.ID+"/cancel", nil), http.StatusOK)
		if ap.State != broker.StateCancelled || len(ap.Decision.DecidedBy) != 1 || !strings.HasPrefix(ap.Decision.DecidedBy[0].Principal, "http/") {
			t.Fatalf("cancelled %+v", ap.Decision)
		}
		itest.WantError(t, itest.Call(t, http.MethodPost, a.api+"/v1/approvals/"+q.ID+"/cancel", `{"reason":`), http.StatusBadRequest, "invalid_request")
		if d := itest.WaitDecision(t, a.js, q.ID); d.Outcome != events.Cancelled {
			t.Fatalf("stream holds %+v", d)
		}
	})

	t.Run("not-found", func(t *testing.T) {
		ghost := a.api + "/v1/approvals/" + events.NewID()
		itest.WantError(t, itest.Call(t, http.MethodGet, ghost, nil), http.StatusNotFound, "not_found")
		itest.WantError(t, itest.Call(t, http.MethodGet, ghost+"?wait=200ms", nil), http.StatusNotFound, "not_found")
		itest.WantError(t, itest.Call(t, http.MethodPost, ghost+"/decision", itest.DecisionBody{Principal: "alice", Responded: events.Responded{Decision: events.Approve}}), http.StatusNotFound, "not_found")
		itest.WantError(t, itest.Call(t, http.MethodPost, ghost+"/cancel", nil), http.StatusNotFound, "not_found")
		itest.WantError(t, itest.Call(t, http.MethodGet, a.api+"/v1/approvals/"+url.PathEscape("no such id"), nil), http.StatusNotFound, "not_found")
	})

	t.Run("bad-create-bodies", func(t *testing.T) {
		for _, body := range []string{
			``, `{bad`, `[]`, `"rm"`,
			`{"agent":"web"}`,             // no tool
			`{"agent":"web","tool":""}`,   // empty tool
			`{"tool":"rm"}`,               // no agent: it names the subject
			`{"tool":"rm","agent":"a b"}`, // agent not a token
			`{"tool":"rm","agent":"a.b"}`, // agent not a token
			`{"tool":"rm","agent":"web","id":"not a token"}`,
			`{"tool":"rm","agent":"web","args":[1]}`,
			`{"tool":"rm","agent":"web","args":"x"}`,
			`{"tool":"rm","agent":"web","timeout":5}`,
			`{"tool":"rm","agent":"web","timeout":"forever"}`,
			`{"tool":"rm","agent":"web","timeout":"-5s"}`,
			`{"tool":"rm","agent":"web","response_schema":"yes"}`,
		} {
			r := itest.Call(t, http.MethodPost, a.api+"/v1/approvals", body)
			if r.Status != http.StatusBadRequest {
				t.Errorf("body %s: %d %s", body, r.Status, r.Body)
				continue
			}
			itest.WantError(t, r, http.StatusBadRequest, "invalid_request")
		}
	})

	t.Run("bad-wait", func(t *testing.T) {
		p := a.create(t, map[string]any{"agent": "web", "tool": "rm", "timeout": "1m"})
		for _, w := range []string{"abc", "-1s", "10", "1x"} {
			q := "?wait=" + url.QueryEscape(w)
			itest.WantError(t, itest.Call(t, http.MethodPost, a.api+"/v1/approvals"+q, map[string]any{"agent": "web", "tool": "rm"}), http.StatusBadRequest, "invalid_request")
			itest.WantError(t, itest.Call(t, http.MethodGet, a.api+"/v1/approvals/"+p.ID+q, nil), http.StatusBadRequest, "invalid_request")
		}
	})

	t.Run("too-large", func(t *testing.T) {
		p := a.create(t, map[string]any{"agent": "web", "tool": "rm", "timeout": "1m"})
		huge := `{"agent":"web","tool":"rm","args":{"blob":"` + strings.Repeat("x", 2<<20) + `"}}`
		itest.WantError(t, itest.Call(t, http.MethodPost, a.api+"/v1/approvals", huge), http.StatusRequestEntityTooLarge, "too_large")
		itest.WantError(t, itest.Call(t, http.MethodPost, a.api+"/v1/approvals/"+p.ID+"/decision", `{"principal":"alice","decision":"deny","reason":"`+strings.Repeat("x", 2<<20)+`"}`), http.StatusRequestEntityTooLarge, "too_large")
		if ap := itest.ApprovalOf(t, itest.Call(t, http.MethodGet, a.api+"/v1/approvals/"+p.ID, nil), http.StatusOK); ap.State != broker.StatePending {
			t.Fatalf("an oversized answer changed the request: %+v", ap)
		}
	})

	// Everything decided over HTTP is on the stream exactly once.
	itest.WaitBrokerIdle(t, a.js)
	for id, n := range itest.DecisionCounts(t, a.js) {
		if n != 1 {
			t.Errorf("request %s has %d decided messages, want 1", id, n)
		}
	}
}
