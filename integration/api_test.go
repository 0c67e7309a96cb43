package integration

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/assent-dev/assent/integration/itest"
	"github.com/assent-dev/assent/internal/app"
	"github.com/assent-dev/assent/internal/broker"
	"github.com/assent-dev/assent/internal/httpapi"
	"github.com/assent-dev/assent/internal/openapicheck"
	"github.com/assent-dev/assent/internal/testenv"
	"github.com/assent-dev/assent/pkg/events"
)

// listBody is the body of GET /v1/approvals.
type listBody struct {
	Approvals []httpapi.Approval `json:"approvals"`
	Total     int                `json:"total"`
	Next      string             `json:"next"`
}

func listAPI(t *testing.T, base, query string) listBody {
	t.Helper()
	r := itest.Call(t, http.MethodGet, base+"/v1/approvals?"+query, nil)
	if r.Status != http.StatusOK {
		t.Fatalf("GET /v1/approvals?%s: %d %s", query, r.Status, r.Body)
	}
	var out listBody
	if err := json.Unmarshal(r.Body, &out); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestListings: pending requests list oldest first, decided ones newest
// first, a page at a time, filtered, and with their totals; a replica that
// did not ingest a request lists it too; a request with large args is listed
// whole.
func TestListings(t *testing.T) {
	ns := testenv.Server(t)
	b1, _ := itest.RunBroker(t, testenv.Conn(t, ns), broker.Config{Name: "l1"})
	b2, _ := itest.RunBroker(t, testenv.Conn(t, ns), broker.Config{Name: "l2"})
	api1, api2 := itest.ServeAPI(t, b1), itest.ServeAPI(t, b2)
	var pending, decided []string
	for i := range 12 {
		session := "s-even"
		if i%2 == 1 {
			session = "s-odd"
		}
		rec, err := b1.Submit(itest.TestCtx(t, itest.Patience), "", "agent/lister", events.Requested{Agent: "lister", Tool: "t", Session: session, Args: json.RawMessage(fmt.Sprintf(`{"i":%d}`, i))})
		if err != nil {
			t.Fatal(err)
		}
		pending = append(pending, rec.ID)
	}
	for _, id := range pending[:4] {
		itest.ApprovalOf(t, itest.Call(t, http.MethodPost, api1+"/v1/approvals/"+id+"/decision", itest.DecisionBody{Principal: "alice", Responded: events.Responded{Decision: events.Approve}}), http.StatusOK)
		decided = append([]string{id}, decided...) // newest first
	}
	pending = pending[4:]
	big, err := b1.Submit(itest.TestCtx(t, itest.Patience), "", "agent/other", events.Requested{Agent: "other", Tool: "upload", Args: json.RawMessage(fmt.Sprintf(`{"blob":%q}`, strings.Repeat("x", 40_000)))})
	if err != nil {
		t.Fatal(err)
	}

	for _, api := range []string{api1, api2} {
		itest.Eventually(t, itest.Patience, func() (bool, string) {
			got := listAPI(t, api, "state=pending&agent=lister")
			return got.Total == len(pending), fmt.Sprintf("%s lists %d pending", api, got.Total)
		})
		// Pages of 3, in arrival order.
		var ids []string
		after := ""
		for range 10 {
			page := listAPI(t, api, "state=pending&agent=lister&limit=3&after="+after)
			if page.Total != len(pending) {
				t.Fatalf("total %d, want %d", page.Total, len(pending))
			}
			for _, a := range page.Approvals {
				ids = append(ids, a.ID)
				if a.Rule == nil || a.Rule.Name != "mode:manual" || a.Rule.Quorum != 1 || !a.Rule.Remember.Allowed {
					t.Fatalf("rule of %s: %+v", a.ID, a.Rule)
				}
			}
			if page.Next == "" {
				break
			}
			after = page.Next
		}
		if !slices.Equal(ids, pending) {
			t.Fatalf("%s paged pending as %v, want %v", api, ids, pending)
		}
		got := listAPI(t, api, "state=approved")
		var approved []string
		for _, a := range got.Approvals {
			approved = append(approved, a.ID)
		}
		if !slices.Equal(approved, decided) || got.Total != len(decided) {
			t.Fatalf("%s lists approved %v (total %d), want %v newest first", api, approved, got.Total, decided)
		}
		if odd := listAPI(t, api, "state=pending&session=s-odd"); odd.Total != 4 {
			t.Fatalf("session filter: %d", odd.Total)
		}
		whole := listAPI(t, api, "state=pending&agent=other")
		if len(whole.Approvals) != 1 || whole.Approvals[0].ID != big.ID || len(whole.Approvals[0].Request.Args) < 40_000 {
			t.Fatalf("large args listed as %d bytes", len(whole.Approvals[0].Request.Args))
		}
	}
	itest.WantError(t, itest.Call(t, http.MethodGet, api1+"/v1/approvals?state=maybe", nil), http.StatusBadRequest, "invalid_request")
	itest.WantError(t, itest.Call(t, http.MethodGet, api1+"/v1/approvals?limit=0", nil), http.StatusBadRequest, "invalid_request")
}

// sse is an event stream client.
type sse struct {
	resp *http.Response
	ch   chan sseEvent
}

type sseEvent struct {
	id    uint64
	event string
	data  broker.Event
}

// openSSE connects to /v1/events with query and Last-Event-ID after (0: none).
func openSSE(t *testing.T, base, query string, after uint64) *sse {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/v1/events?"+query, nil)
	if after > 0 {
		req.Header.Set("Last-Event-ID", strconv.FormatUint(after, 10))
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		cancel()
		t.Fatalf("GET /v1/events: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	s := &sse{resp: resp, ch: make(chan sseEvent, 1024)}
	go func() {
		defer close(s.ch)
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 1<<20), 4<<20)
		var ev sseEvent
		for sc.Scan() {
			line := sc.Text()
			switch {
			case line == "":
				if ev.event != "" {
					s.ch <- ev
				}
				ev = sseEvent{}
			case strings.HasPrefix(line, "id: "):
				ev.id, _ = strconv.ParseUint(line[4:], 10, 64)
			case strings.HasPrefix(line, "event: "):
				ev.event = line[7:]
			case strings.HasPrefix(line, "data: "):
				_ = json.Unmarshal([]byte(line[6:]), &ev.data)
			}
		}
	}()
	t.Cleanup(func() { cancel(); resp.Body.Close() })
	return s
}

func (s *sse) close() { s.resp.Body.Close() }

// next returns the next event, failing after patience.
func (s *sse) next(t *testing.T) sseEvent {
	t.Helper()
	select {
	case e, ok := <-s.ch:
		if !ok {
			t.Fatal("event stream ended")
		}
		return e
	case <-time.After(itest.Patience):
		t.Fatal("no event on the stream")
	}
	return sseEvent{}
}

// TestEventStream: lifecycle events arrive live over SSE, filtered by agent,
// session and type; a client that reconnects with Last-Event-ID gets every
// event it missed, once, in order, and then the live ones.
func TestEventStream(t *testing.T) {
	e := itest.NewEnv(t, broker.Config{})
	all := openSSE(t, e.API, "", 0)
	mine := openSSE(t, e.API, "agent=streamer&type=decided,pending", 0)

	rec, err := e.B.Submit(itest.TestCtx(t, itest.Patience), "", "agent/streamer", events.Requested{Agent: "streamer", Tool: "rm", Session: "s-1"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.B.Submit(itest.TestCtx(t, itest.Patience), "", "agent/bystander", events.Requested{Agent: "bystander", Tool: "ls"}); err != nil {
		t.Fatal(err)
	}
	var seen []string
	var last uint64
	for len(seen) < 5 {
		if len(seen) == 4 { // both announced: answer
			itest.ApprovalOf(t, itest.Call(t, http.MethodPost, e.API+"/v1/approvals/"+rec.ID+"/decision", itest.DecisionBody{Principal: "alice", Responded: events.Responded{Decision: events.Approve}}), http.StatusOK)
		}
		ev := all.next(t)
		if ev.id <= last {
			t.Fatalf("event id %d after %d", ev.id, last)
		}
		last = ev.id
		seen = append(seen, ev.event+"/"+ev.data.Agent)
	}
	// Each agent's events in their order; the two requests' may interleave.
	perAgent := map[string][]string{}
	for _, s := range seen {
		ev, agent, _ := strings.Cut(s, "/")
		perAgent[agent] = append(perAgent[agent], ev)
	}
	if !slices.Equal(perAgent["streamer"], []string{"requested", "pending", "responded"}) || !slices.Equal(perAgent["bystander"], []string{"requested", "pending"}) {
		t.Fatalf("events %v", seen)
	}
	if d := all.next(t); d.event != "decided" || d.data.RequestID != rec.ID || d.data.Session != "s-1" || d.data.Agent != "streamer" {
		t.Fatalf("decided event %+v", d)
	}
	for _, wantEv := range []string{"pending", "decided"} {
		if got := mine.next(t); got.event != wantEv || got.data.RequestID != rec.ID {
			t.Fatalf("filtered stream: %s for %s, want %s", got.event, got.data.RequestID, wantEv)
		}
	}

	// Disconnect, miss some events, resume.
	all.close()
	var missed []string
	for i := range 5 {
		r, err := e.B.Submit(itest.TestCtx(t, itest.Patience), "", "agent/streamer", events.Requested{Agent: "streamer", Tool: fmt.Sprintf("t%d", i)})
		if err != nil {
			t.Fatal(err)
		}
		missed = append(missed, r.ID)
	}
	resumed := openSSE(t, e.API, "type=requested", last)
	// And live ones after the resumption.
	for i := range 3 {
		r, err := e.B.Submit(itest.TestCtx(t, itest.Patience), "", "agent/streamer", events.Requested{Agent: "streamer", Tool: fmt.Sprintf("u%d", i)})
		if err != nil {
			t.Fatal(err)
		}
		missed = append(missed, r.ID)
	}
	var got []string
	prev := last
	for len(got) < len(missed) {
		ev := resumed.next(t)
		if ev.id <= prev {
			t.Fatalf("resumed stream: id %d after %d (a duplicate or out of order)", ev.id, prev)
		}
		prev = ev.id
		got = append(got, ev.data.RequestID)
	}
	if !slices.Equal(got, missed) {
		t.Fatalf("resumed with %v, want %v", got, missed)
	}
	r := itest.Call(t, http.MethodGet, e.API+"/v1/events?after=yesterday", nil)
	itest.WantError(t, r, http.StatusBadRequest, "invalid_request")
}

// TestAuditLog: the audit log reads the stream: one request's timeline, and
// filters by agent, principal, channel, rule, type and time, a page at a time.
func TestAuditLog(t *testing.T) {
	e := policyEnv(t)
	start := time.Now().UTC().Add(-time.Second)
	rec := itest.Submit(t, e, events.Requested{Agent: "auditor", Tool: "write_file", Args: json.RawMessage(`{"path":"/a"}`)})
	// Answer once the request is announced, as an approver would: an answer
	// by id alone may be stored before the pending event.
	itest.WaitPending(t, e.JS, "auditor", rec.ID)
	itest.ApprovalOf(t, itest.Call(t, http.MethodPost, e.API+"/v1/approvals/"+rec.ID+"/decision", itest.DecisionBody{Principal: "dave", Responded: events.Responded{Decision: events.Approve, Channel: "web"}}), http.StatusOK)
	other := itest.Submit(t, e, events.Requested{Agent: "auditor2", Tool: "write_file"})
	itest.AnswerNATS(t, e.JS, "alice", other.ID, events.Responded{Decision: events.Deny, Channel: "slack", Reason: "no"})
	itest.WaitDecision(t, e.JS, other.ID)
	auto := itest.Submit(t, e, events.Requested{Agent: "auditor", Tool: "read_file"})

	type page struct {
		Events []broker.Event `json:"events"`
		Next   uint64         `json:"next"`
	}
	get := func(query string) page {
		t.Helper()
		r := itest.Call(t, http.MethodGet, e.API+"/v1/audit?"+query, nil)
		if r.Status != http.StatusOK {
			t.Fatalf("audit %s: %d %s", query, r.Status, r.Body)
		}
		var p page
		if err := json.Unmarshal(r.Body, &p); err != nil {
			t.Fatal(err)
		}
		return p
	}
	types := func(p page) []string {
		var out []string
		for _, ev := range p.Events {
			out = append(out, ev.ShortType())
		}
		return out
	}
	if got := types(get("request=" + rec.ID)); !slices.Equal(got, []string{"requested", "pending", "responded", "decided"}) {
		t.Fatalf("timeline of %s: %v", rec.ID, got)
	}
	if got := get("principal=alice"); len(got.Events) != 2 || got.Events[0].RequestID != other.ID {
		t.Fatalf("principal=alice: %v", types(got))
	}
	if got := get("channel=web&type=decided"); len(got.Events) != 1 || got.Events[0].RequestID != rec.ID {
		t.Fatalf("channel=web: %v", types(got))
	}
	if got := get("rule=read-only"); len(got.Events) != 1 || got.Events[0].RequestID != auto.ID {
		t.Fatalf("rule=read-only: %v", types(got))
	}
	if got := get("agent=auditor&type=requested"); len(got.Events) != 2 {
		t.Fatalf("agent=auditor: %v", types(got))
	}
	if got := get("since=" + url.QueryEscape(time.Now().UTC().Add(time.Hour).Format(time.RFC3339))); len(got.Events) != 0 {
		t.Fatalf("since the future: %v", types(got))
	}
	if got := get("until=" + url.QueryEscape(start.Format(time.RFC3339))); len(got.Events) != 0 {
		t.Fatalf("until before the test: %v", types(got))
	}
	// Paging: two at a time until the end, the same events as one read.
	whole := get("agent=auditor")
	var paged []uint64
	after := uint64(0)
	for range 20 {
		p := get(fmt.Sprintf("agent=auditor&limit=2&after=%d", after))
		for _, ev := range p.Events {
			paged = append(paged, ev.Seq)
		}
		if p.Next == 0 {
			break
		}
		after = p.Next
	}
	var wholeSeqs []uint64
	for _, ev := range whole.Events {
		wholeSeqs = append(wholeSeqs, ev.Seq)
	}
	if !slices.Equal(paged, wholeSeqs) || len(paged) < 5 {
		t.Fatalf("paged %v, whole %v", paged, wholeSeqs)
	}
	r := itest.Call(t, http.MethodGet, e.API+"/v1/audit?format=ndjson&request="+rec.ID, nil)
	if lines := strings.Split(strings.TrimSpace(string(r.Body)), "\n"); r.Header.Get("Content-Type") != "application/x-ndjson" || len(lines) != 4 {
		t.Fatalf("ndjson: %s %q", r.Header.Get("Content-Type"), r.Body)
	}
	itest.WantError(t, itest.Call(t, http.MethodGet, e.API+"/v1/audit?since=today", nil), http.StatusBadRequest, "invalid_request")
	itest.WantError(t, itest.Call(t, http.MethodGet, e.API+"/v1/audit?request=nope", nil), http.StatusNotFound, "not_found")
}

// TestBatchDecisions: one answer for every pending request of a session, or
// for a list of ids, with each request's own result.
func TestBatchDecisions(t *testing.T) {
	e := policyEnv(t)
	var session []string
	for range 3 {
		session = append(session, itest.Submit(t, e, events.Requested{Agent: "batch", Tool: "write_file", Session: "s-b"}).ID)
	}
	// Needs two finance approvals: alice's is a vote.
	reimb := itest.Submit(t, e, events.Requested{Agent: "batch", Tool: "reimburse", Session: "s-b", Args: json.RawMessage(`{"amount":5000}`)})
	done := itest.Submit(t, e, events.Requested{Agent: "batch", Tool: "write_file", Session: "s-b"})
	itest.ApprovalOf(t, itest.Call(t, http.MethodPost, e.API+"/v1/approvals/"+done.ID+"/decision", itest.DecisionBody{Principal: "bob", Responded: events.Responded{Decision: events.Deny}}), http.StatusOK)
	elsewhere := itest.Submit(t, e, events.Requested{Agent: "batch", Tool: "write_file", Session: "s-other"})

	type result struct {
		ID     string `json:"id"`
		Status string `json:"status"`
		HTTP   int    `json:"http_status"`
	}
	type batch struct {
		Results []result `json:"results"`
		Decided int      `json:"decided"`
	}
	post := func(body any) batch {
		t.Helper()
		r := itest.Call(t, http.MethodPost, e.API+"/v1/decisions", body)
		if r.Status != http.StatusOK {
			t.Fatalf("POST /v1/decisions: %d %s", r.Status, r.Body)
		}
		var out batch
		if err := json.Unmarshal(r.Body, &out); err != nil {
			t.Fatal(err)
		}
		return out
	}
	got := post(map[string]any{"principal": "alice", "decision": "approve", "session": "s-b"})
	status := map[string]string{}
	for _, r := range got.Results {
		status[r.ID] = r.Status
	}
	for _, id := range session {
		if status[id] != "decided" {
			t.Fatalf("%s: %s", id, status[id])
		}
	}
	if status[reimb.ID] != "voted" || len(got.Results) != 4 || got.Decided != 3 {
		t.Fatalf("results %+v", got)
	}
	if rec, _ := e.B.Get(itest.TestCtx(t, itest.Patience), elsewhere.ID); rec.State != broker.StatePending {
		t.Fatalf("another session's request: %s", rec.State)
	}
	// By ids: each gets its own result.
	got = post(map[string]any{"principal": "dave", "decision": "deny", "ids": []string{elsewhere.ID, done.ID, reimb.ID, "no-such-id"}})
	want := []result{{elsewhere.ID, "decided", 200}, {done.ID, "already_decided", 409}, {reimb.ID, "not_eligible", 403}, {"no-such-id", "not_found", 404}}
	if !slices.Equal(got.Results, want) {
		t.Fatalf("results %+v, want %+v", got.Results, want)
	}
	for _, body := range []map[string]any{
		{"principal": "alice", "decision": "approve"},
		{"principal": "alice", "decision": "approve", "session": "s", "ids": []string{"a"}},
		{"principal": "alice", "decision": "approve", "ids": []string{"a"}, "args": map[string]any{"x": 1}},
		{"principal": "alice", "decision": "maybe", "ids": []string{"a"}},
		{"decision": "approve", "ids": []string{"a"}},
	} {
		itest.WantError(t, itest.Call(t, http.MethodPost, e.API+"/v1/decisions", body), http.StatusBadRequest, "invalid_request")
	}
}

// TestAPIConformsToOpenAPI calls every operation, with success and with the
// errors it documents, and checks each JSON body against /v1/openapi.json.
func TestAPIConformsToOpenAPI(t *testing.T) {
	e := policyEnv(t)
	r := itest.Call(t, http.MethodGet, e.API+"/v1/openapi.json", nil)
	if r.Status != http.StatusOK {
		t.Fatalf("GET /v1/openapi.json: %d", r.Status)
	}
	doc, err := openapicheck.Load(r.Body)
	if err != nil {
		t.Fatal(err)
	}
	check := func(op string, r itest.HTTPResp, want int) {
		t.Helper()
		if r.Status != want {
			t.Fatalf("%s: %d, want %d: %s", op, r.Status, want, r.Body)
		}
		if err := doc.CheckResponse(op, r.Status, r.Body); err != nil {
			t.Error(err)
		}
	}
	const (
		create   = "POST /v1/approvals"
		list     = "GET /v1/approvals"
		get      = "GET /v1/approvals/{id}"
		decide   = "POST /v1/approvals/{id}/decision"
		cancel   = "POST /v1/approvals/{id}/cancel"
		many     = "POST /v1/decisions"
		cancels  = "POST /v1/cancels"
		audit    = "GET /v1/audit"
		remember = "GET /v1/remembered"
		revoke   = "DELETE /v1/remembered/{id}"
	)
	created := itest.Call(t, http.MethodPost, e.API+"/v1/approvals", map[string]any{"agent": "doc", "tool": "write_file", "args": map[string]any{"path": "/a"}, "session": "s", "response_schema": map[string]any{"type": "object"}})
	check(create, created, http.StatusCreated)
	var a httpapi.Approval
	_ = json.Unmarshal(created.Body, &a)
	check(create, itest.Call(t, http.MethodPost, e.API+"/v1/approvals", map[string]any{"tool": "x"}), http.StatusBadRequest)
	check(create, itest.Call(t, http.MethodPost, e.API+"/v1/approvals", map[string]any{"id": a.ID, "agent": "doc", "tool": "other"}), http.StatusConflict)
	check(create, itest.Call(t, http.MethodPost, e.API+"/v1/approvals", []byte(`{"agent":"doc","tool":"x","args":{"blob":"`+strings.Repeat("a", 1<<20)+`"}}`)), http.StatusRequestEntityTooLarge)
	check(list, itest.Call(t, http.MethodGet, e.API+"/v1/approvals?state=pending", nil), http.StatusOK)
	check(list, itest.Call(t, http.MethodGet, e.API+"/v1/approvals?state=nope", nil), http.StatusBadRequest)
	check(get, itest.Call(t, http.MethodGet, e.API+"/v1/approvals/"+a.ID, nil), http.StatusOK)
	check(get, itest.Call(t, http.MethodGet, e.API+"/v1/approvals/nope", nil), http.StatusNotFound)
	url := e.API + "/v1/approvals/" + a.ID + "/decision"
	check(decide, itest.Call(t, http.MethodPost, url, itest.DecisionBody{Principal: "carol", Responded: events.Responded{Decision: events.Approve, Payload: json.RawMessage(`{}`)}}), http.StatusOK)
	check(decide, itest.Call(t, http.MethodPost, url, itest.DecisionBody{Principal: "bob", Responded: events.Responded{Decision: events.Deny}}), http.StatusConflict)
	check(decide, itest.Call(t, http.MethodPost, url, itest.DecisionBody{Principal: "bob", Responded: events.Responded{Decision: "maybe"}}), http.StatusBadRequest)
	check(decide, itest.Call(t, http.MethodPost, e.API+"/v1/approvals/nope/decision", itest.DecisionBody{Principal: "bob", Responded: events.Responded{Decision: events.Deny}}), http.StatusNotFound)
	other := itest.Submit(t, e, events.Requested{Agent: "doc", Tool: "write_file", Session: "s"})
	check(decide, itest.Call(t, http.MethodPost, e.API+"/v1/approvals/"+other.ID+"/decision", itest.DecisionBody{Principal: "mallory", Responded: events.Responded{Decision: events.Approve}}), http.StatusForbidden)
	nightly := itest.Submit(t, e, events.Requested{Agent: "doc", Tool: "rotate_logs", Timeout: events.Duration(time.Second)})
	itest.WaitState(t, e.B, nightly.ID, broker.StateApproved)
	late := itest.Submit(t, e, events.Requested{Agent: "doc", Tool: "write_file", Timeout: events.Duration(time.Second)})
	time.Sleep(time.Until(late.Deadline.Add(100 * time.Millisecond)))
	check(decide, itest.Call(t, http.MethodPost, e.API+"/v1/approvals/"+late.ID+"/decision", itest.DecisionBody{Principal: "alice", Responded: events.Responded{Decision: events.Approve}}), http.StatusGone)
	check(many, itest.Call(t, http.MethodPost, e.API+"/v1/decisions", map[string]any{"principal": "alice", "decision": "deny", "session": "s"}), http.StatusOK)
	check(many, itest.Call(t, http.MethodPost, e.API+"/v1/decisions", map[string]any{"principal": "alice", "decision": "deny"}), http.StatusBadRequest)
	third := itest.Submit(t, e, events.Requested{Agent: "doc", Tool: "write_file"})
	check(cancel, itest.Call(t, http.MethodPost, e.API+"/v1/approvals/"+third.ID+"/cancel", map[string]string{"reason": "done"}), http.StatusOK)
	check(cancel, itest.Call(t, http.MethodPost, e.API+"/v1/approvals/"+third.ID+"/cancel", nil), http.StatusConflict)
	check(cancel, itest.Call(t, http.MethodPost, e.API+"/v1/approvals/"+third.ID+"/cancel", map[string]string{"by": "a b"}), http.StatusBadRequest)
	itest.Submit(t, e, events.Requested{Agent: "doc", Tool: "write_file", Session: "to-cancel"})
	check(cancels, itest.Call(t, http.MethodPost, e.API+"/v1/cancels", map[string]string{"session": "to-cancel", "reason": "the user stopped"}), http.StatusOK)
	check(cancels, itest.Call(t, http.MethodPost, e.API+"/v1/cancels", map[string]any{"ids": []string{third.ID, "nope"}}), http.StatusOK)
	check(cancels, itest.Call(t, http.MethodPost, e.API+"/v1/cancels", map[string]string{}), http.StatusBadRequest)
	check(audit, itest.Call(t, http.MethodGet, e.API+"/v1/audit?request="+a.ID, nil), http.StatusOK)
	check(audit, itest.Call(t, http.MethodGet, e.API+"/v1/audit?limit=0", nil), http.StatusBadRequest)
	check(audit, itest.Call(t, http.MethodGet, e.API+"/v1/audit?request=nope", nil), http.StatusNotFound)
	check(remember, itest.Call(t, http.MethodGet, e.API+"/v1/remembered", nil), http.StatusOK)
	check(revoke, itest.Call(t, http.MethodDelete, e.API+"/v1/remembered/nope", nil), http.StatusNotFound)
	check("GET /healthz", itest.Call(t, http.MethodGet, e.API+"/healthz", nil), http.StatusOK)
	check("GET /readyz", itest.Call(t, http.MethodGet, e.API+"/readyz", nil), http.StatusOK)
}

// TestAuditCommand: "broker audit" (app.Audit) prints a request's timeline as
// JSON lines, through pages, and honours a limit.
func TestAuditCommand(t *testing.T) {
	e := policyEnv(t)
	rec := itest.Submit(t, e, events.Requested{Agent: "cli", Tool: "write_file"})
	itest.ApprovalOf(t, itest.Call(t, http.MethodPost, e.API+"/v1/approvals/"+rec.ID+"/decision", itest.DecisionBody{Principal: "dave", Responded: events.Responded{Decision: events.Deny, Reason: "no"}}), http.StatusOK)
	for range 5 {
		itest.Submit(t, e, events.Requested{Agent: "cli", Tool: "read_file"})
	}
	var out strings.Builder
	if err := app.Audit(itest.TestCtx(t, itest.Patience), &out, app.API{URL: e.API}, app.AuditQuery{Request: rec.ID}); err != nil {
		t.Fatal(err)
	}
	var types []string
	for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		var ev broker.Event
		if err := json.Unmarshal([]byte(line), &ev); err != nil {
			t.Fatalf("line %q: %v", line, err)
		}
		types = append(types, ev.ShortType())
	}
	if !slices.Equal(types, []string{"requested", "pending", "responded", "decided"}) {
		t.Fatalf("timeline %v", types)
	}
	out.Reset()
	if err := app.Audit(itest.TestCtx(t, itest.Patience), &out, app.API{URL: e.API}, app.AuditQuery{Agent: "cli", Type: "requested", Limit: 4}); err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(out.String(), "\n"); n != 4 {
		t.Fatalf("%d lines with limit 4:\n%s", n, out.String())
	}
	err := app.Audit(itest.TestCtx(t, itest.Patience), &out, app.API{URL: e.API}, app.AuditQuery{Since: "yesterday"})
	if err == nil || !strings.Contains(err.Error(), "invalid_request") {
		t.Fatalf("bad since: %v", err)
	}
}
