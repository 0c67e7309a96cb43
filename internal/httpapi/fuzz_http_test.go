package httpapi_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/assent-dev/assent/internal/broker"
	"github.com/assent-dev/assent/internal/brokertest"
	"github.com/assent-dev/assent/internal/httpapi"
	"github.com/assent-dev/assent/internal/testenv"
	"github.com/assent-dev/assent/pkg/events"
	"github.com/assent-dev/assent/pkg/policy"
)

// fuzzPolicy gives the fuzzer eligibility, quorum and remembered choices to
// reach: deploys need two of alice, bob and the ops role; anything else
// anyone may answer.
const fuzzPolicy = `version: 1
principals:
  alice: {roles: [ops]}
  bob:   {roles: [ops]}
  eve:   {roles: [intern]}
rules:
  - name: deploys
    tools: [deploy]
    action: require_approval
    approvers: [alice, bob, "role:ops"]
    quorum: 2
  - name: everything
    tools: ["*"]
    action: require_approval
`

// placeholder in a fuzzed target or body stands for a request that is
// pending when the input runs, so that answers can reach a live request.
const placeholder = "$PENDING"

// apiFuzz is what FuzzAPI runs against: one broker on one embedded NATS
// server, shared by every input, with a gateway in front of it without
// authentication and one with it.
type apiFuzz struct {
	b          *broker.Broker
	open, auth *httpapi.Server
	// routes matches a request to its operation as the gateway does.
	routes *http.ServeMux
	// documented lists the statuses openapi.json gives each operation.
	documented map[string]map[int]bool
	// written receives what a request could put on the stream: requests,
	// answers and cancels. Only the gateway writes those here (and
	// pendingID, before each count starts); the broker's own events may
	// follow an input's answer later, so they are not counted.
	written *testenv.Tap
	pending string // the request placeholder stands for, while pending
	made    int
}

func newAPIFuzz(f testing.TB) *apiFuzz {
	ns := testenv.Server(f)
	pol, err := policy.Parse([]byte(fuzzPolicy), "fuzz.yaml")
	if err != nil {
		f.Fatal(err)
	}
	// Deadlines an hour away: no request expires while the fuzzer runs, so
	// nothing but the gateway writes answers to the stream.
	b, _ := brokertest.RunLogged(f, testenv.InProcessConn(f, ns), broker.Config{Name: "fuzz", Policy: pol, MinTimeout: time.Hour, DefaultTimeout: time.Hour}, zap.NewNop())
	e := &apiFuzz{
		b:    b,
		open: httpapi.New(b, httpapi.Config{}, zap.NewNop()),
		// The identity is in the bearer token itself: "principal:agent".
		auth: httpapi.New(b, httpapi.Config{Identify: func(r *http.Request) (httpapi.Identity, bool) {
			tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
			if !ok {
				return httpapi.Identity{}, false
			}
			p, a, _ := strings.Cut(tok, ":")
			return httpapi.Identity{Principal: p, Agent: a}, true
		}}, zap.NewNop()),
		routes:     http.NewServeMux(),
		documented: documentedStatuses(f),
		written:    testenv.NewTap(f, ns, events.RequestPrefix+">", events.ResponsePrefix+">", events.CancelPrefix+">"),
	}
	for _, op := range e.open.Routes() {
		e.routes.HandleFunc(op, func(http.ResponseWriter, *http.Request) {})
		if e.documented[op] == nil {
			f.Fatalf("%s is not in openapi.json", op)
		}
	}
	return e
}

// documentedStatuses reads the statuses of each operation from openapi.json.
func documentedStatuses(f testing.TB) map[string]map[int]bool {
	raw, err := os.ReadFile("openapi.json")
	if err != nil {
		f.Fatal(err)
	}
	var doc struct {
		Paths map[string]map[string]struct {
			Responses map[string]json.RawMessage `json:"responses"`
		} `json:"paths"`
	}
	if err := json.Unmarshal(raw, &doc); err != nil {
		f.Fatal(err)
	}
	out := map[string]map[int]bool{}
	for path, ops := range doc.Paths {
		for method, op := range ops {
			set := map[int]bool{}
			for code := range op.Responses {
				n, err := strconv.Atoi(code)
				if err != nil {
					f.Fatalf("%s %s: response %q", method, path, code)
				}
				set[n] = true
			}
			out[strings.ToUpper(method)+" "+path] = set
		}
	}
	return out
}

// pendingID returns the id of a request that is pending now: the one made
// last, or a new one.
func (e *apiFuzz) pendingID(t testing.TB) string {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if e.pending != "" {
		if rec, err := e.b.Get(ctx, e.pending); err == nil && rec.State == broker.StatePending {
			return e.pending
		}
	}
	newID := func() string {
		e.made++
		return fmt.Sprintf("fuzz-%d-%d", os.Getpid(), e.made)
	}
	id := brokertest.SubmitPending(ctx, t, e.b, newID, events.Requested{Tool: "deploy", Agent: "coder", Session: "s1", User: "carol",
		Args: json.RawMessage(`{"env":"prod"}`), ResponseSchema: json.RawMessage(`{"type":"object","properties":{"ticket":{"type":"string"}}}`)})
	e.pending = id
	return id
}

// maxPending bounds the pending requests the fuzzer keeps: each one is work
// for listings and batch answers by session, so inputs would slow down as
// the run goes on.
const maxPending = 100

// tidy cancels every pending request once there are more than maxPending.
func (e *apiFuzz) tidy(t testing.TB) {
	if e.b.Pending() <= maxPending {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	page, err := e.b.List(ctx, broker.Filter{State: broker.StatePending, Limit: 1000})
	if err != nil {
		t.Fatalf("list pending requests: %v", err)
	}
	for _, rec := range page.Records {
		if _, err := e.b.Cancel(ctx, rec.ID, "fuzz", "too many pending"); err != nil && !errors.Is(err, broker.ErrAlreadyDecided) {
			t.Fatalf("cancel %s: %v", rec.ID, err)
		}
	}
}

// apiRequest makes the request a server would hand the gateway for this
// input, as net/http parses it off the wire; false if it would not get that
// far.
func apiRequest(method, target, contentType, accept, lastEventID, who string, body []byte) (*http.Request, bool) {
	header := [][2]string{{"Content-Type", contentType}, {"Accept", accept}, {"Last-Event-ID", lastEventID}, {"Authorization", who}}
	for _, h := range header {
		if strings.TrimSpace(h[1]) != h[1] {
			return nil, false // the server would trim it: not what was sent
		}
	}
	r, ok := testenv.WireRequest(method, target, "assent.test", header, body)
	if ok {
		r.RemoteAddr = "192.0.2.7:40000"
	}
	return r, ok
}

// apiError is the one shape of every error the gateway answers.
type apiError struct {
	Error *struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

// FuzzAPI sends the gateway any method, target (path and query), the headers
// it reads and any body, with authentication off (who empty) or on (who is
// the Authorization header; "Bearer principal:agent" identifies). $PENDING in
// the target or body becomes the id of a pending request. Whatever comes, the
// gateway must not panic; answer only the statuses openapi.json documents for
// the operation (404 and 405 for no operation, a redirect to the clean path,
// 503 when the broker cannot be reached in time), and no other 5xx; write
// every error as {"error": {"code", "message"}} in application/json and every
// success in the type the operation names; and put no request, answer or
// cancel on the stream when it refuses with a 4xx.
func FuzzAPI(f *testing.F) {
	e := newAPIFuzz(f)
	approve := `{"principal":"alice","decision":"approve","reason":"ok","payload":{"ticket":"T-1"},"remember":{"scope":"session","ttl":"1h"}}`
	for _, s := range []struct {
		method, target, contentType, accept, lastEventID, who, body string
	}{
		{"POST", "/v1/approvals", "application/json", "", "", "", `{"id":"fuzz-new-1","tool":"deploy","agent":"coder","session":"s1","args":{"env":"prod"},"timeout":"90s","labels":{"team":"web"}}`},
		{"POST", "/v1/approvals?wait=1s", "application/json", "", "", "", `{"id":"fuzz-new-2","tool":"read_file","agent":"coder","args":{"path":"/tmp/a"},"response_schema":{"type":"object"}}`},
		{"POST", "/v1/approvals", "application/json", "", "", "Bearer :coder", `{"tool":"x","agent":"other"}`},
		{"POST", "/v1/approvals", "text/plain", "", "", "", `{"tool":"x","agent":"a.b","args":"\ud800"}`},
		{"GET", "/v1/approvals?state=pending&agent=coder&session=s1&limit=2&after=" + placeholder, "", "", "", "", ""},
		{"GET", "/v1/approvals?state=bogus&limit=0", "", "", "", "", ""},
		{"GET", "/v1/approvals/" + placeholder + "?wait=10ms", "", "", "", "", ""},
		{"GET", "/v1/approvals/..%2f..%2fetc", "", "", "", "", ""},
		{"POST", "/v1/approvals/" + placeholder + "/decision", "application/json", "", "", "", approve},
		{"POST", "/v1/approvals/" + placeholder + "/decision", "application/json", "", "", "Bearer bob:", `{"decision":"approve","args":{"env":"staging"}}`},
		{"POST", "/v1/approvals/" + placeholder + "/decision", "application/json", "", "", "Bearer eve:", `{"principal":"alice","decision":"deny"}`},
		{"POST", "/v1/approvals/" + placeholder + "/decision", "application/json", "", "", "", `{"principal":"carol","decision":"deny","args":{}}`},
		{"POST", "/v1/approvals/" + placeholder + "/decision", "application/json", "", "", "", `{"principal":"alice","decision":"approve","payload":{"ticket":7}}`},
		{"POST", "/v1/approvals/no-such/decision", "application/json", "", "", "", `{"principal":"alice","decision":"maybe"}`},
		{"POST", "/v1/approvals/" + placeholder + "/cancel", "application/json", "", "", "", `{"reason":"not needed","by":"alice"}`},
		{"POST", "/v1/approvals/" + placeholder + "/cancel", "", "", "", "Bearer :coder", ``},
		{"POST", "/v1/approvals/" + placeholder + "/cancel", "application/json", "", "", "", `{"by":"a b"}`},
		{"POST", "/v1/decisions", "application/json", "", "", "", `{"principal":"bob","ids":["` + placeholder + `","no-such","a.b"],"decision":"approve"}`},
		{"POST", "/v1/decisions", "application/json", "", "", "", `{"principal":"bob","session":"s1","agent":"coder","decision":"deny","reason":"batch"}`},
		{"POST", "/v1/decisions", "application/json", "", "", "", `{"principal":"bob","session":"s1","ids":["x"],"decision":"approve","args":{"a":1}}`},
		{"POST", "/v1/cancels", "application/json", "", "", "Bearer :coder", `{"session":"s1","reason":"stopped"}`},
		{"POST", "/v1/cancels", "application/json", "", "", "Bearer :coder", `{"agent":"other"}`},
		{"POST", "/v1/cancels", "application/json", "", "", "", `{"ids":["` + placeholder + `","a.b"],"agent":"coder"}`},
		{"GET", "/v1/events?type=decided,pending&agent=coder&after=1", "", "", "", "", ""},
		{"GET", "/v1/events?agent=other&after=0", "", "", "", "Bearer :coder", ""},
		{"GET", "/v1/events", "", "", "nope", "", ""},
		{"GET", "/v1/audit?request=" + placeholder + "&since=2026-01-01T00:00:00Z&until=2099-01-01T00:00:00Z&limit=5&type=decided", "", "", "", "", ""},
		{"GET", "/v1/audit?format=ndjson&after=2&principal=alice&channel=http&rule=deploys", "", "application/x-ndjson", "", "", ""},
		{"GET", "/v1/audit?since=yesterday&after=-1&limit=5000", "", "", "", "", ""},
		{"GET", "/v1/remembered", "", "", "", "", ""},
		{"DELETE", "/v1/remembered/no-such-grant", "", "", "", "Bearer alice:", ""},
		{"GET", "/v1/openapi.json", "", "", "", "", ""},
		{"GET", "/healthz", "", "", "", "", ""},
		{"HEAD", "/readyz", "", "", "", "", ""},
		{"PUT", "/v1/approvals", "application/json", "", "", "", `{}`},
		{"GET", "/v1//approvals/./x/../", "", "", "", "", ""},
		{"POST", "/v1/approvals/x//decision", "application/json", "", "", "", `{}`},
		{"GET", "/v2/nothing", "", "", "", "Bearer", ""},
		{"OPTIONS", "*", "", "", "", "", ""},
		{"GET", "http://elsewhere.test/v1/approvals", "", "", "", "", ""},
	} {
		f.Add(s.method, s.target, s.contentType, s.accept, s.lastEventID, s.who, []byte(s.body))
	}
	f.Fuzz(func(t *testing.T, method, target, contentType, accept, lastEventID, who string, body []byte) {
		e.tidy(t)
		if strings.Contains(target, placeholder) || bytes.Contains(body, []byte(placeholder)) {
			id := e.pendingID(t)
			target = strings.ReplaceAll(target, placeholder, id)
			body = bytes.ReplaceAll(body, []byte(placeholder), []byte(id))
		}
		r, ok := apiRequest(method, target, contentType, accept, lastEventID, who, body)
		if !ok {
			return
		}
		srv := e.open
		if who != "" {
			srv = e.auth
		}
		_, op := e.routes.Handler(r)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		switch {
		case op == "GET /v1/events":
			// The stream ends only with its client: the client is gone.
			cancel()
		case r.URL.Query().Has("wait"):
			// A long poll ends with the request's decision or the wait.
			ctx, cancel = context.WithTimeout(ctx, time.Millisecond)
			defer cancel()
		case op == "GET /v1/audit":
			// A filter that matches rarely reads up to 100,000 events, and
			// the stream grows as the fuzzer runs: the client gives up.
			ctx, cancel = context.WithTimeout(ctx, 10*time.Millisecond)
			defer cancel()
		}
		e.written.Drain(t)
		w := httptest.NewRecorder()
		srv.ServeHTTP(w, r.WithContext(ctx))
		written := e.written.Drain(t)

		input := fmt.Sprintf("%s %q (operation %q, who %q, Content-Type %q, Accept %q, Last-Event-ID %q) body %q", method, target, op, who, contentType, accept, lastEventID, body)
		status, ct, out := w.Code, w.Header().Get("Content-Type"), w.Body.Bytes()
		var errBody apiError
		if status >= 400 {
			if ct != "application/json" {
				t.Fatalf("%s: %d with Content-Type %q, want application/json", input, status, ct)
			}
			if err := testenv.StrictJSON(out, &errBody); err != nil || errBody.Error == nil || errBody.Error.Code == "" || errBody.Error.Message == "" {
				t.Fatalf("%s: %d with body %q, want {\"error\": {\"code\", \"message\"}} (%v)", input, status, out, err)
			}
		}
		switch {
		case status == http.StatusServiceUnavailable && errBody.Error.Code == "unavailable":
			// The broker's NATS did not answer in time: any operation.
		case status == http.StatusMovedPermanently || status == http.StatusTemporaryRedirect || status == http.StatusPermanentRedirect:
			// To the clean path (the mux's), whether or not an operation
			// serves it.
			if w.Header().Get("Location") == "" {
				t.Fatalf("%s: redirect %d without a Location", input, status)
			}
		case op == "":
			if status != http.StatusNotFound && status != http.StatusMethodNotAllowed {
				t.Fatalf("%s: %d %q for a request no operation serves", input, status, out)
			}
		default:
			doc := op
			if m, p, _ := strings.Cut(op, " "); m == "GET" && r.Method == "HEAD" {
				doc = "GET " + p
			}
			if !e.documented[doc][status] {
				t.Fatalf("%s: %d %q, which openapi.json does not document for %s", input, status, out, doc)
			}
		}
		if status >= 500 && status != http.StatusServiceUnavailable {
			t.Fatalf("%s: %d %q", input, status, out)
		}
		if status >= 200 && status < 300 {
			want := "application/json"
			switch {
			case op == "GET /v1/events":
				want = "text/event-stream"
			case op == "GET /v1/audit" && (r.URL.Query().Get("format") == "ndjson" || strings.Contains(accept, "application/x-ndjson")):
				want = "application/x-ndjson"
			}
			if ct != want {
				t.Fatalf("%s: %d with Content-Type %q, want %q", input, status, ct, want)
			}
			if want == "application/json" && !json.Valid(out) {
				t.Fatalf("%s: %d with a body that is not JSON: %q", input, status, out)
			}
		}
		if status >= 400 && status < 500 && len(written) > 0 {
			t.Fatalf("%s: refused with %d %s, yet wrote %v to the stream", input, status, out, written)
		}
	})
}
