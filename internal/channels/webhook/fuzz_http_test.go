package webhook_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
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
	"github.com/assent-dev/assent/internal/channels"
	"github.com/assent-dev/assent/internal/channels/webhook"
	"github.com/assent-dev/assent/internal/testenv"
	"github.com/assent-dev/assent/pkg/events"
	"github.com/assent-dev/assent/pkg/handler"
)

// inboundFuzz is what FuzzInbound runs against: a broker and the webhook
// channel on one embedded NATS server, shared by every input.
type inboundFuzz struct {
	b   *broker.Broker
	mux *http.ServeMux
	// keys are the inbound endpoints' signing keys, principals who they
	// answer as.
	keys       map[string][]byte
	principals map[string]string
	// answers receives every answer put on the stream.
	answers *testenv.Tap
	pending string // the request $PENDING stands for, while pending
	made    int
}

// fuzzKey is a fixed signing key for an endpoint, so that seeds can carry
// signatures.
func fuzzKey(name string) []byte {
	k := sha256.Sum256([]byte("fuzz inbound " + name))
	return k[:]
}

func newInboundFuzz(f *testing.F) *inboundFuzz {
	ns := testenv.Server(f)
	pol := testPolicy(f)
	// Deadlines an hour away: nothing expires while the fuzzer runs.
	b, _ := brokertest.RunLogged(f, testenv.InProcessConn(f, ns), broker.Config{Name: "fuzz", Policy: pol, MinTimeout: time.Hour, DefaultTimeout: time.Hour}, zap.NewNop())
	e := &inboundFuzz{b: b, mux: http.NewServeMux(), keys: map[string][]byte{}, principals: map[string]string{},
		answers: testenv.NewTap(f, ns, events.ResponsePrefix+">")}
	cfg := webhook.Config{}
	for name, principal := range map[string]string{"ci": "ci-bot", "intern": "mallory"} {
		env := "FUZZ_WH_" + strings.ToUpper(name)
		e.keys[name], e.principals[name] = fuzzKey(name), principal
		f.Setenv(env, webhook.SecretPrefix+base64.StdEncoding.EncodeToString(e.keys[name]))
		cfg.Inbound = append(cfg.Inbound, webhook.Inbound{Name: name, SecretEnv: env, Principal: principal})
	}
	nc := testenv.InProcessConn(f, ns)
	a, err := webhook.New(cfg, channels.Env{NATS: nc, Directory: channels.NewDirectory(pol), Logger: zap.NewNop()})
	if err != nil {
		f.Fatal(err)
	}
	brokertest.RunAdapter(f, nc, handler.ChannelConfig{Logger: zap.NewNop()}, a, e.mux)
	return e
}

// pendingID returns the id of a request that is pending now: the one made
// last, or a new one.
func (e *inboundFuzz) pendingID(t *testing.T) string {
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	if e.pending != "" {
		if rec, err := e.b.Get(ctx, e.pending); err == nil && rec.State == broker.StatePending {
			return e.pending
		}
	}
	e.made++
	id := fmt.Sprintf("fuzz-%d-%d", os.Getpid(), e.made)
	rec, err := e.b.Submit(ctx, id, "fuzz", events.Requested{Tool: "write_file", Agent: "coder", Args: json.RawMessage(`{"path":"/tmp/a"}`)})
	if err != nil || rec.State != broker.StatePending {
		t.Fatalf("make a pending request: %v (state %q)", err, rec.State)
	}
	e.pending = id
	return id
}

// How FuzzInbound signs an input.
const (
	signAsGiven  = iota // the fuzzed headers as they are
	signNow             // a valid signature now, over the fuzzed id and body
	signOffset          // valid, at now plus the fuzzed timestamp in seconds
	signAppended        // the fuzzed signatures, then a valid one
	signOtherKey        // valid, but with the other endpoint's key
	signModes
)

// inboundStatus is the status of each error code inbound.go documents.
var inboundStatus = map[string]int{
	webhook.CodeBadSignature: 401, webhook.CodeStaleTimestamp: 401, webhook.CodeInvalid: 400, webhook.CodeTooLarge: 413,
	webhook.CodeNotFound: 404, webhook.CodeReplayed: 409, webhook.CodeAlreadyDecided: 409, webhook.CodeExpired: 410,
	webhook.CodeNotEligible: 403, webhook.CodeMethod: 405, webhook.CodeUnavailable: 503,
}

// FuzzInbound sends POST /webhooks/in/{name} any endpoint name, method,
// Standard Webhooks headers and body, signed as mode says (see signAsGiven
// and after); $PENDING in the body becomes the id of a pending request.
// Whatever comes, the endpoint must not panic; answer 202 with the accepted
// decision, or an error code of inbound.go with its status, as
// {"error": {"code", "message"}} in application/json; refuse with 401 (or
// 404, 405, 413 before looking at the signature) what does not verify under
// the endpoint's secret, and accept nothing that does not; and put exactly
// one answer on the stream, as the endpoint's principal, when it accepts, and
// none when it refuses.
func FuzzInbound(f *testing.F) {
	e := newInboundFuzz(f)
	approve := `{"request_id":"$PENDING","decision":"approve","reason":"pipeline green","args":{"path":"/tmp/b"}}`
	old := strconv.FormatInt(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).Unix(), 10)
	sig := func(name, id, ts, body string) string {
		sec, _ := strconv.ParseInt(ts, 10, 64)
		return webhook.Sign(fuzzKey(name), id, time.Unix(sec, 0), []byte(body))
	}
	for _, s := range []struct {
		method, name, id, ts, sig string
		mode                      uint8
		body                      string
	}{
		{"POST", "ci", "msg-1", "", "", signNow, approve},
		{"POST", "ci", "msg-2", "", "", signNow, `{"request_id":"$PENDING","decision":"deny","reason":"not on a Friday"}`},
		{"POST", "ci", "msg-3", "", "", signNow, `{"request_id":"$PENDING","decision":"approve","remember":{"scope":"session","ttl":"1h","args":{"path":"/tmp/*"}}}`},
		{"POST", "intern", "msg-4", "", "", signNow, approve},
		{"POST", "ci", "msg-5", "", "", signNow, `{"request_id":"no-such-request","decision":"deny"}`},
		{"POST", "ci", "msg-6", "", "", signNow, `{"request_id":"a.b","decision":"maybe","args":{}}`},
		{"POST", "ci", "msg-7", "", "", signNow, `{"request_id":"$PENDING","decision":"deny","args":{"x":1},"payload":"\ud800"}`},
		{"POST", "ci", "msg-8", "", "", signNow, `[1,2]`},
		{"POST", "ci", "msg-9", "", "", signNow, ``},
		{"POST", "ci", "msg-10", "-360", "", signOffset, approve},
		{"POST", "ci", "msg-11", "299", "", signOffset, approve},
		{"POST", "ci", "msg-12", "", "v2,abc v1,=== v1,", signAppended, approve},
		{"POST", "ci", "msg-13", "", "", signOtherKey, approve},
		{"POST", "ci", "msg-14", old, sig("ci", "msg-14", old, approve), signAsGiven, approve},
		{"POST", "ci", "", old, "v1,AAAA", signAsGiven, approve},
		{"POST", "ci", "msg-15", "-5", "v1,AAAA", signAsGiven, approve},
		{"POST", "ci", "msg-16", "now", "v1", signAsGiven, ``},
		{"POST", "nope", "msg-17", "", "", signNow, approve},
		{"GET", "ci", "msg-18", "", "", signNow, approve},
		{"PUT", "intern", "", "", "", signAsGiven, ``},
	} {
		f.Add(s.method, s.name, s.id, s.ts, s.sig, s.mode, []byte(s.body))
	}
	f.Fuzz(func(t *testing.T, method, name, id, ts, sig string, mode uint8, body []byte) {
		if bytes.Contains(body, []byte("$PENDING")) {
			body = bytes.ReplaceAll(body, []byte("$PENDING"), []byte(e.pendingID(t)))
		}
		now := time.Now()
		switch mode % signModes {
		case signNow:
			ts = strconv.FormatInt(now.Unix(), 10)
			sig = webhook.Sign(fuzzKey(name), id, now, body)
		case signOffset:
			off, _ := strconv.ParseInt(ts, 10, 32)
			at := now.Add(time.Duration(off) * time.Second)
			ts, sig = strconv.FormatInt(at.Unix(), 10), webhook.Sign(fuzzKey(name), id, at, body)
		case signAppended:
			ts = strconv.FormatInt(now.Unix(), 10)
			sig = strings.TrimSpace(sig + " " + webhook.Sign(fuzzKey(name), id, now, body))
		case signOtherKey:
			ts = strconv.FormatInt(now.Unix(), 10)
			sig = webhook.Sign(fuzzKey(name+"-other"), id, now, body)
		}
		header := [][2]string{{"Content-Type", "application/json"}, {webhook.HeaderID, id}, {webhook.HeaderTimestamp, ts}, {webhook.HeaderSignature, sig}}
		r, ok := testenv.WireRequest(method, "/webhooks/in/"+name, "bot.test", header, body)
		if !ok {
			return // not a request net/http would serve
		}
		if _, pattern := e.mux.Handler(r); pattern != "/webhooks/in/{name}" {
			return // not a request for the inbound endpoint
		}
		r.RemoteAddr = "192.0.2.7:40000"
		ctx, cancel := context.WithTimeout(context.Background(), patience)
		defer cancel()
		r = r.WithContext(ctx)
		e.answers.Drain(t)
		before := time.Now()
		w := httptest.NewRecorder()
		e.mux.ServeHTTP(w, r)
		after := time.Now()
		answers := e.answers.Drain(t)
		if w.Code == http.StatusAccepted && len(answers) == 0 {
			// The server may copy the answer to this subscription a moment
			// after it acknowledged it to the publisher.
			if subj, ok := e.answers.Next(patience); ok {
				answers = append(answers, subj)
			}
		}

		input := fmt.Sprintf("%s %q (mode %d) webhook-id %q webhook-timestamp %q webhook-signature %q body %q", method, name, mode%signModes, id, ts, sig, body)
		status, out := w.Code, w.Body.Bytes()
		if status == http.StatusTemporaryRedirect || status == http.StatusMovedPermanently {
			return // the mux's, to the clean path
		}
		if ct := w.Header().Get("Content-Type"); ct != "application/json" {
			t.Fatalf("%s: %d with Content-Type %q, want application/json", input, status, ct)
		}
		inName := r.PathValue("name")
		principal, known := e.principals[inName]
		if status == http.StatusAccepted {
			var acc webhook.Accepted
			// JSON has no way to say bytes that are not UTF-8.
			sent, _ := json.Marshal(id)
			var echoed string
			_ = json.Unmarshal(sent, &echoed)
			if err := testenv.StrictJSON(out, &acc); err != nil || acc.Status != "accepted" || acc.Principal != principal || acc.WebhookID != echoed || acc.RequestID == "" || acc.Decision == "" {
				t.Fatalf("%s: 202 %q (%v)", input, out, err)
			}
			if want := events.ResponsePrefix + principal + "." + acc.RequestID; len(answers) != 1 || answers[0] != want {
				t.Fatalf("%s: accepted, and the stream got answers %v, want one on %s", input, answers, want)
			}
		} else {
			var refused struct {
				Error *struct {
					Code    string `json:"code"`
					Message string `json:"message"`
				} `json:"error"`
				Decision *handler.Decision `json:"decision"`
			}
			if err := testenv.StrictJSON(out, &refused); err != nil || refused.Error == nil || refused.Error.Message == "" || inboundStatus[refused.Error.Code] != status {
				t.Fatalf("%s: %d %q, want an error code of inbound.go with its status (%v)", input, status, out, err)
			}
			if code := refused.Error.Code; refused.Decision != nil && code != webhook.CodeAlreadyDecided && code != webhook.CodeExpired {
				t.Fatalf("%s: %d %q: a decision with a %s", input, status, out, code)
			}
			if len(answers) > 0 {
				t.Fatalf("%s: refused with %d %q, yet the stream got answers %v", input, status, out, answers)
			}
		}
		if !known {
			if status != http.StatusNotFound {
				t.Fatalf("%s: %d %q from an endpoint that is not configured", input, status, out)
			}
			return
		}
		// The signature as the endpoint's secret judges it, on either side of
		// the call: near the edge of the tolerance the two may differ.
		verified := func(at time.Time) bool { return webhook.Verify(e.keys[inName], r.Header, body, at) == nil }
		switch ok0, ok1 := verified(before), verified(after); {
		case ok0 != ok1:
		case !ok0 && status != http.StatusUnauthorized && status != http.StatusMethodNotAllowed && status != http.StatusRequestEntityTooLarge:
			t.Fatalf("%s: a message that does not verify got %d %q", input, status, out)
		case ok0 && status == http.StatusUnauthorized:
			t.Fatalf("%s: a message that verifies got %d %q", input, status, out)
		}
	})
}
