package httpapi_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/assent-dev/assent/internal/broker"
	"github.com/assent-dev/assent/internal/brokertest"
	"github.com/assent-dev/assent/internal/httpapi"
	"github.com/assent-dev/assent/internal/testenv"
	"github.com/assent-dev/assent/pkg/events"
)

// TestInputSchemaRoundTrip: a request's input_schema is stored with it and
// comes back as it was sent, in the approval resource and in the pending
// event approvers read; the responses match openapi.json.
func TestInputSchemaRoundTrip(t *testing.T) {
	ns := testenv.Server(t)
	nc := testenv.Conn(t, ns)
	b, _ := brokertest.Run(t, nc, broker.Config{})
	srv := httptest.NewServer(httpapi.New(b, httpapi.Config{}, testenv.Logger(t)))
	t.Cleanup(srv.Close)
	_, doc := loadOpenAPI(t)
	pending, err := nc.SubscribeSync(events.PendingPrefix + "doc")
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil { // the server has the subscription before anything is published
		t.Fatal(err)
	}
	const schema = `{"type":"object","properties":{"path":{"type":"string","description":"the <file> & more"}},"required":["path"]}`
	do := func(method, url, body string) (int, []byte) {
		t.Helper()
		req, err := http.NewRequest(method, url, bytes.NewBufferString(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		out, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, out
	}
	code, body := do(http.MethodPost, srv.URL+"/v1/approvals", `{"agent":"doc","tool":"delete_file","args":{"path":"/a"},"hint":"Delete one file?","input_schema":`+schema+`}`)
	if code != http.StatusCreated {
		t.Fatalf("create: %d %s", code, body)
	}
	if err := doc.CheckResponse("POST /v1/approvals", code, body); err != nil {
		t.Error(err)
	}
	var a httpapi.Approval
	if err := json.Unmarshal(body, &a); err != nil {
		t.Fatal(err)
	}
	code, body = do(http.MethodGet, srv.URL+"/v1/approvals/"+a.ID, "")
	if err := doc.CheckResponse("GET /v1/approvals/{id}", code, body); code != http.StatusOK || err != nil {
		t.Fatalf("get: %d %v", code, err)
	}
	var got struct {
		Request struct {
			InputSchema json.RawMessage `json:"input_schema"`
		} `json:"request"`
	}
	if err := json.Unmarshal(body, &got); err != nil {
		t.Fatal(err)
	}
	if string(got.Request.InputSchema) != schema {
		t.Errorf("GET request.input_schema = %s, want %s", got.Request.InputSchema, schema)
	}

	msg, err := pending.NextMsg(10 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	e, err := events.Decode(events.Header(msg.Header), msg.Data)
	if err != nil {
		t.Fatal(err)
	}
	p, err := events.DecodePending(&e)
	if err != nil {
		t.Fatal(err)
	}
	if p.RequestID != a.ID || string(p.Request.InputSchema) != schema {
		t.Errorf("pending event for %s carries input_schema %s, want %s", p.RequestID, p.Request.InputSchema, schema)
	}

	code, body = do(http.MethodPost, srv.URL+"/v1/approvals", `{"agent":"doc","tool":"delete_file","input_schema":["path"]}`)
	if code != http.StatusBadRequest || !bytes.Contains(body, []byte("input_schema")) {
		t.Errorf("an input_schema that is not an object: %d %s", code, body)
	}
	if err := doc.CheckResponse("POST /v1/approvals", code, body); err != nil {
		t.Error(err)
	}
}

// TestInputSchemaEnforced: an approval whose edited args break the request's
// input_schema is refused with 400 and the schema's words, and the request
// still waits; a request whose own args break it is denied at once, by
// rule input-schema. The responses match openapi.json.
func TestInputSchemaEnforced(t *testing.T) {
	ns := testenv.Server(t)
	b, _ := brokertest.Run(t, testenv.Conn(t, ns), broker.Config{})
	srv := httptest.NewServer(httpapi.New(b, httpapi.Config{}, testenv.Logger(t)))
	t.Cleanup(srv.Close)
	_, doc := loadOpenAPI(t)
	do := func(op, method, url, body string) (int, []byte) {
		t.Helper()
		req, err := http.NewRequest(method, srv.URL+url, bytes.NewBufferString(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		out, _ := io.ReadAll(resp.Body)
		if err := doc.CheckResponse(op, resp.StatusCode, out); err != nil {
			t.Error(err)
		}
		return resp.StatusCode, out
	}
	const schema = `{"type":"object","properties":{"path":{"type":"string"}},"required":["path"]}`
	code, body := do("POST /v1/approvals", http.MethodPost, "/v1/approvals", `{"agent":"doc","tool":"delete_file","args":{"path":"/a"},"input_schema":`+schema+`}`)
	if code != http.StatusCreated {
		t.Fatalf("create: %d %s", code, body)
	}
	var a httpapi.Approval
	if err := json.Unmarshal(body, &a); err != nil {
		t.Fatal(err)
	}
	const decide = "POST /v1/approvals/{id}/decision"
	code, body = do(decide, http.MethodPost, "/v1/approvals/"+a.ID+"/decision", `{"decision":"approve","args":{"path":5},"principal":"alice"}`)
	var e struct {
		Error httpapi.Error `json:"error"`
	}
	if err := json.Unmarshal(body, &e); err != nil || code != http.StatusBadRequest || e.Error.Code != "invalid_request" ||
		!strings.Contains(e.Error.Message, "args: /path: got number, want string") {
		t.Fatalf("an edit that breaks the schema: %d %s", code, body)
	}
	code, body = do(decide, http.MethodPost, "/v1/approvals/"+a.ID+"/decision", `{"decision":"approve","args":{"path":"/b"},"principal":"alice"}`)
	if code != http.StatusOK || !bytes.Contains(body, []byte(`"state":"approved"`)) || !bytes.Contains(body, []byte(`"edited":true`)) {
		t.Fatalf("an edit that fits: %d %s", code, body)
	}

	code, body = do("POST /v1/approvals", http.MethodPost, "/v1/approvals", `{"agent":"doc","tool":"delete_file","args":{"path":7},"input_schema":`+schema+`}`)
	if code != http.StatusCreated || !bytes.Contains(body, []byte(`"state":"denied"`)) || !bytes.Contains(body, []byte(`"rule":"input-schema"`)) ||
		!bytes.Contains(body, []byte("/path: got number, want string")) {
		t.Fatalf("a request whose args break its schema: %d %s", code, body)
	}
}
