package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/assent-dev/assent/internal/broker"
	"github.com/assent-dev/assent/internal/brokertest"
	"github.com/assent-dev/assent/internal/clustertest"
	"github.com/assent-dev/assent/internal/httpapi"
	"github.com/assent-dev/assent/internal/testenv"
	"github.com/assent-dev/assent/pkg/events"
	"github.com/assent-dev/assent/pkg/handler"
	"github.com/assent-dev/assent/pkg/policy"
)

// The suite's shared helpers. Every one that takes a *testing.T calls
// t.Helper and undoes what it started with t.Cleanup; the few without one
// (opCtx, doHTTP, publishCtx, ...) are for goroutines other than the test's. Waits poll with generous deadlines; nothing asserts
// how fast something happened beyond "well within a bound that only a hang
// would miss".

// patience bounds every poll in the suite: long enough that only a hang misses
// it, even with -race on two busy cores.
const patience = 20 * time.Second

// TestMain removes the programs that binary builds, once per test binary.
func TestMain(m *testing.M) {
	code := m.Run()
	if built.dir != "" {
		_ = os.RemoveAll(built.dir)
	}
	os.Exit(code)
}

// opCtx bounds one operation (a publish, a read) by patience.
func opCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), patience)
}

// testCtx returns a context that ends after d or with the test.
func testCtx(t *testing.T, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// runBroker runs a broker on nc and returns it once it is ready, with a func
// that stops it and waits for Run to return (also called at cleanup; calling it
// twice is fine).
func runBroker(t testing.TB, nc *nats.Conn, cfg broker.Config) (*broker.Broker, func()) {
	t.Helper()
	return brokertest.Run(t, nc, cfg)
}

// runLoggedBroker runs a broker on nc, as runBroker does, whose log lines (JSON)
// go to w.
func runLoggedBroker(t *testing.T, nc *nats.Conn, cfg broker.Config, w io.Writer) *broker.Broker {
	t.Helper()
	log := zap.New(zapcore.NewCore(zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig()), zapcore.AddSync(w), zap.DebugLevel))
	b, _ := brokertest.RunLogged(t, nc, cfg, log)
	return b
}

// mustPolicy parses src as the policy file name, failing the test on error.
func mustPolicy(t testing.TB, src, name string) *policy.Policy {
	t.Helper()
	p, err := policy.Parse([]byte(src), name)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// subscribe subscribes nc to subject until the test ends, and returns once
// the server knows of the subscription.
func subscribe(t *testing.T, nc *nats.Conn, subject string) <-chan *nats.Msg {
	t.Helper()
	ch := make(chan *nats.Msg, 64)
	sub, err := nc.ChanSubscribe(subject, ch)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return ch
}

// env is one embedded NATS server with one broker on it, an HTTP gateway in
// front of the broker, and connections for agents and approvers.
type env struct {
	ns  *testenv.NATS
	nc  *nats.Conn // the test's own connection (agents, approvers, checks)
	js  jetstream.JetStream
	b   *broker.Broker
	api string // base URL of the HTTP gateway over b
}

// newEnv starts NATS, a broker with cfg (manual mode unless cfg says
// otherwise), and an HTTP gateway in front of it.
func newEnv(t *testing.T, cfg broker.Config) *env {
	t.Helper()
	ns := testenv.Server(t)
	if cfg.Name == "" {
		cfg.Name = "itest"
	}
	b, _ := runBroker(t, testenv.Conn(t, ns), cfg)
	nc := testenv.Conn(t, ns)
	return &env{ns: ns, nc: nc, js: newJS(t, nc), b: b, api: serveAPI(t, b)}
}

// serveAPI serves the HTTP gateway over b on a loopback port until the test ends.
func serveAPI(t testing.TB, b *broker.Broker) string {
	t.Helper()
	srv := httptest.NewServer(httpapi.New(b, httpapi.Config{}, testenv.Logger(t)))
	t.Cleanup(srv.Close)
	return srv.URL
}

func newJS(t testing.TB, nc *nats.Conn) jetstream.JetStream {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// newClient returns an agent-side SDK client for agent on nc.
func newClient(t testing.TB, nc *nats.Conn, agent string) *handler.Client {
	t.Helper()
	c, err := handler.NewClient(nc, handler.Config{Agent: agent, Logger: testenv.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// result is what a Client.Request returned.
type result struct {
	d   handler.Decision
	err error
}

// requestAsync runs c.Request in a goroutine the test waits for at cleanup.
func requestAsync(t *testing.T, ctx context.Context, c *handler.Client, req handler.Request) <-chan result {
	t.Helper()
	return testenv.Go(t, func() result {
		d, err := c.Request(ctx, req)
		return result{d, err}
	})
}

// await returns what a requestAsync call returned, failing after patience.
func await(t *testing.T, ch <-chan result) result {
	t.Helper()
	return testenv.Await(t, ch, patience, "Client.Request")
}

// runApprover runs an SDK approver runtime until the test ends. It answers
// only requests of agent.
func runApprover(t *testing.T, nc *nats.Conn, principal, agent string, h handler.Handler) {
	t.Helper()
	brokertest.RunApprover(t, nc, handler.ApproverConfig{
		Principal: principal, Channel: "sdk", Agents: []string{agent},
		Durable: "approver-" + principal + "-" + agent,
	}, h)
}

// eventually polls cond every 20ms until it reports true, failing the test
// with cond's last explanation after within.
func eventually(t testing.TB, within time.Duration, cond func() (bool, string)) {
	t.Helper()
	pollEvery(t, within, 20*time.Millisecond, cond)
}

// pollEvery is eventually with a poll of every, for slow waits.
func pollEvery(t testing.TB, within, every time.Duration, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		ok, why := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("still not true after %s: %s", within, why)
		}
		time.Sleep(every)
	}
}

// waitRecord polls b until request id exists and satisfies ok.
func waitRecord(t *testing.T, b *broker.Broker, id string, ok func(broker.Record) bool) broker.Record {
	t.Helper()
	var rec broker.Record
	eventually(t, patience, func() (bool, string) {
		var err error
		rec, err = b.Get(context.Background(), id)
		if err != nil {
			return false, fmt.Sprintf("get %s: %v", id, err)
		}
		return ok(rec), fmt.Sprintf("request %s is %s", id, rec.State)
	})
	return rec
}

// waitState polls b until request id is in state want.
func waitState(t *testing.T, b *broker.Broker, id string, want broker.State) broker.Record {
	t.Helper()
	return waitRecord(t, b, id, func(r broker.Record) bool { return r.State == want })
}

// streamOf returns the broker's stream.
func streamOf(t *testing.T, js jetstream.JetStream) jetstream.Stream {
	t.Helper()
	ctx, cancel := opCtx()
	defer cancel()
	s, err := js.Stream(ctx, broker.StreamName)
	if err != nil {
		t.Fatalf("stream %s: %v", broker.StreamName, err)
	}
	return s
}

// storedDecision reads the decided event on assent.decision.<id>, if any.
func storedDecision(t *testing.T, js jetstream.JetStream, id string) (events.Decided, bool) {
	t.Helper()
	subj, err := events.DecisionSubject(id)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := opCtx()
	defer cancel()
	// The decision is the first message on its subject; anything after it
	// is not (see TestForgedDecision).
	m, err := streamOf(t, js).GetMsg(ctx, 1, jetstream.WithGetMsgSubject(subj))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return events.Decided{}, false
	}
	if err != nil {
		t.Fatalf("read %s: %v", subj, err)
	}
	// Decisions may exceed the limit on incoming events by the broker's
	// headroom; the server bounds them.
	e, err := events.Codec{MaxSize: 2 << 20}.Decode(events.Header(m.Header), m.Data)
	if err != nil {
		t.Fatalf("decode %s: %v", subj, err)
	}
	d, err := events.DecodeDecided(&e)
	if err != nil {
		t.Fatalf("decode %s: %v", subj, err)
	}
	if d.RequestID != id {
		t.Fatalf("decision on %s names request %s", subj, d.RequestID)
	}
	if err := d.VerifyArgs(); err != nil {
		t.Fatalf("decision on %s: %v", subj, err)
	}
	return d, true
}

// waitDecision polls the stream until request id has a decided event.
func waitDecision(t *testing.T, js jetstream.JetStream, id string) events.Decided {
	t.Helper()
	var d events.Decided
	eventually(t, patience, func() (bool, string) {
		var ok bool
		d, ok = storedDecision(t, js, id)
		return ok, "no decided event for " + id
	})
	return d
}

// decodePending decodes a message of assent.pending.<agent>: a pending event,
// as a channel sees it.
func decodePending(t *testing.T, header nats.Header, data []byte) (events.Pending, error) {
	t.Helper()
	ev, err := events.Decode(events.Header(header), data)
	if err != nil {
		return events.Pending{}, err
	}
	return events.DecodePending(&ev)
}

// waitPending waits until the stream holds the pending event of request id
// of agent, as an approver sees it before answering.
func waitPending(t *testing.T, js jetstream.JetStream, agent, id string) {
	t.Helper()
	eventually(t, patience, func() (bool, string) {
		ctx, cancel := opCtx()
		defer cancel()
		m, err := streamOf(t, js).GetLastMsgForSubject(ctx, events.PendingPrefix+agent)
		if err != nil {
			return false, "no pending event for " + agent + ": " + err.Error()
		}
		p, err := decodePending(t, m.Header, m.Data)
		return err == nil && p.RequestID == id, "the last pending event of " + agent + " is not " + id
	})
}

// decisionCounts returns how many messages the stream holds on each
// assent.decision.* subject.
func decisionCounts(t *testing.T, js jetstream.JetStream) map[string]uint64 {
	t.Helper()
	ctx, cancel := opCtx()
	defer cancel()
	info, err := streamOf(t, js).Info(ctx, jetstream.WithSubjectFilter(events.DecisionPrefix+"*"))
	if err != nil {
		t.Fatalf("stream info: %v", err)
	}
	out := make(map[string]uint64, len(info.State.Subjects))
	for subj, n := range info.State.Subjects {
		out[strings.TrimPrefix(subj, events.DecisionPrefix)] = n
	}
	return out
}

// countDecisions counts the decided messages of request id by reading every
// message on its decision subject with an ordered consumer, and checks the
// count against the stream's per-subject accounting.
func countDecisions(t *testing.T, js jetstream.JetStream, id string) int {
	t.Helper()
	subj, err := events.DecisionSubject(id)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := opCtx()
	defer cancel()
	cons, err := streamOf(t, js).OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: []string{subj}})
	if err != nil {
		t.Fatalf("ordered consumer on %s: %v", subj, err)
	}
	n := 0
	for {
		batch, err := cons.FetchNoWait(100)
		if err != nil {
			t.Fatalf("fetch %s: %v", subj, err)
		}
		got := 0
		for m := range batch.Messages() {
			got++
			e, err := events.Decode(events.Header(m.Headers()), m.Data())
			if err != nil {
				t.Fatalf("message on %s: %v", subj, err)
			}
			if e.Type() != events.TypeDecided {
				t.Fatalf("message of type %s on %s", e.Type(), subj)
			}
		}
		if err := batch.Error(); err != nil {
			t.Fatalf("fetch %s: %v", subj, err)
		}
		n += got
		if got == 0 {
			break
		}
	}
	if byInfo := decisionCounts(t, js)[id]; uint64(n) != byInfo {
		t.Fatalf("read %d messages on %s but stream info counts %d", n, subj, byInfo)
	}
	return n
}

// brokerConsumers are the durable consumers the broker reads its inputs with.
var brokerConsumers = []string{"assent-broker-requests", "assent-broker-responses", "assent-broker-cancels", "assent-broker-timeouts"}

// waitBrokerIdle polls until every broker consumer has handed out and settled
// every message: nothing pending, nothing awaiting an ack, nothing being
// redelivered. It returns their final infos by name.
func waitBrokerIdle(t *testing.T, js jetstream.JetStream) map[string]*jetstream.ConsumerInfo {
	t.Helper()
	return waitIdle(t, js, false, brokerConsumers...)
}

// waitIdle polls until the named consumers have handed out every message and,
// unless allowUnacked, settled every one.
func waitIdle(t *testing.T, js jetstream.JetStream, allowUnacked bool, names ...string) map[string]*jetstream.ConsumerInfo {
	t.Helper()
	return waitIdleWithin(t, js, patience, 20*time.Millisecond, allowUnacked, names...)
}

// waitIdleWithin is waitIdle polling every every, for within.
func waitIdleWithin(t *testing.T, js jetstream.JetStream, within, every time.Duration, allowUnacked bool, names ...string) map[string]*jetstream.ConsumerInfo {
	t.Helper()
	infos := map[string]*jetstream.ConsumerInfo{}
	pollEvery(t, within, every, func() (bool, string) {
		for _, name := range names {
			ctx, cancel := opCtx()
			defer cancel()
			cons, err := js.Consumer(ctx, broker.StreamName, name)
			if err != nil {
				return false, fmt.Sprintf("consumer %s: %v", name, err)
			}
			info, err := cons.Info(ctx)
			if err != nil {
				return false, fmt.Sprintf("consumer %s: %v", name, err)
			}
			infos[name] = info
			if info.NumPending != 0 || !allowUnacked && (info.NumAckPending != 0 || info.NumRedelivered != 0) {
				return false, fmt.Sprintf("consumer %s: %d pending, %d awaiting ack, %d redelivered", name, info.NumPending, info.NumAckPending, info.NumRedelivered)
			}
		}
		return true, ""
	})
	return infos
}

// rawEvent is a structured-mode CloudEvent with data as given, for publishing
// things the SDK would refuse to build.
func rawEvent(id, typ, source, data string) []byte {
	return fmt.Appendf(nil, `{"specversion":"1.0","id":%q,"type":%q,"source":%q,"datacontenttype":"application/json","data":%s}`, id, typ, source, data)
}

// publish puts a message on the stream the way any NATS client could, and
// returns the publish error (the stream may refuse it).
func publish(t *testing.T, js jetstream.JetStream, subject string, body []byte, msgID string) error {
	t.Helper()
	msg := &nats.Msg{Subject: subject, Header: nats.Header{"Content-Type": {events.ContentTypeStructured}}, Data: body}
	var opts []jetstream.PublishOpt
	if msgID != "" {
		opts = append(opts, jetstream.WithMsgID(msgID))
	}
	ctx, cancel := opCtx()
	defer cancel()
	_, err := js.PublishMsg(ctx, msg, opts...)
	return err
}

// publishCtx is publish for goroutines other than the test's: it reports
// instead of failing the test.
func publishCtx(ctx context.Context, js jetstream.JetStream, subject string, body []byte) error {
	_, err := js.PublishMsg(ctx, &nats.Msg{Subject: subject, Header: nats.Header{"Content-Type": {events.ContentTypeStructured}}, Data: body})
	return err
}

// mustPublish is publish that fails the test on error.
func mustPublish(t *testing.T, js jetstream.JetStream, subject string, body []byte, msgID string) {
	t.Helper()
	if err := publish(t, js, subject, body, msgID); err != nil {
		t.Fatalf("publish to %s: %v", subject, err)
	}
}

// answerNATS publishes principal's answer to request id on
// assent.response.<principal>.<id>, as an approver program would.
func answerNATS(t *testing.T, js jetstream.JetStream, principal, id string, r events.Responded) {
	t.Helper()
	ctx, cancel := opCtx()
	defer cancel()
	if err := handler.Answer(ctx, js, principal, id, r); err != nil {
		t.Fatalf("answer %s as %s: %v", id, principal, err)
	}
}

// httpResp is a response read in full.
type httpResp struct {
	status int
	header http.Header
	body   []byte
}

// httpClient is used for every HTTP call: a hung server fails the test rather
// than the test binary.
var httpClient = &http.Client{Timeout: 60 * time.Second}

// call sends method to url with body (nil, []byte, string, or a value to
// encode as JSON) and reads the whole response.
func call(t *testing.T, method, url string, body any) httpResp {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r, err := doHTTP(ctx, method, url, body)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// doHTTP is call for goroutines other than the test's: it reports errors
// instead of failing the test.
func doHTTP(ctx context.Context, method, url string, body any) (httpResp, error) {
	return doHTTPWith(ctx, method, url, nil, body)
}

// doHTTPWith is doHTTP sending header too.
func doHTTPWith(ctx context.Context, method, url string, header http.Header, body any) (httpResp, error) {
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case []byte:
		rd = bytes.NewReader(b)
	case string:
		rd = strings.NewReader(b)
	default:
		buf, err := json.Marshal(b)
		if err != nil {
			return httpResp{}, err
		}
		rd = bytes.NewReader(buf)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		return httpResp{}, err
	}
	if rd != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		return httpResp{}, fmt.Errorf("%s %s: %w", method, url, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return httpResp{}, fmt.Errorf("%s %s: read body: %w", method, url, err)
	}
	return httpResp{status: resp.StatusCode, header: resp.Header, body: data}, nil
}

// approvalOf decodes an approval resource, checking the status first.
func approvalOf(t *testing.T, r httpResp, wantStatus int) httpapi.Approval {
	t.Helper()
	if r.status != wantStatus {
		t.Fatalf("status %d, want %d: %s", r.status, wantStatus, r.body)
	}
	if ct := r.header.Get("Content-Type"); ct != "application/json" {
		t.Fatalf("Content-Type %q, want application/json", ct)
	}
	var a httpapi.Approval
	if err := json.Unmarshal(r.body, &a); err != nil {
		t.Fatalf("decode approval: %v: %s", err, r.body)
	}
	return a
}

// wantError checks r is an error with status and code in the documented shape,
// {"error": {"code", "message"}} and nothing else.
func wantError(t *testing.T, r httpResp, status int, code string) {
	t.Helper()
	if r.status != status {
		t.Fatalf("status %d, want %d (%s): %s", r.status, status, code, r.body)
	}
	if ct := r.header.Get("Content-Type"); ct != "application/json" {
		t.Fatalf("error Content-Type %q, want application/json: %s", ct, r.body)
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(r.body, &top); err != nil {
		t.Fatalf("error body is not a JSON object: %v: %s", err, r.body)
	}
	if len(top) != 1 || top["error"] == nil {
		t.Fatalf("error body %s: want exactly one member, \"error\"", r.body)
	}
	var e map[string]any
	if err := json.Unmarshal(top["error"], &e); err != nil {
		t.Fatalf("error member is not an object: %s", r.body)
	}
	gotCode, _ := e["code"].(string)
	msg, _ := e["message"].(string)
	if gotCode != code || msg == "" || len(e) != 2 {
		t.Fatalf("error %s: want {\"code\": %q, \"message\": non-empty}", top["error"], code)
	}
}

// sameJSON reports whether a and b hold the same JSON value.
func sameJSON(a, b []byte) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	xa, _ := json.Marshal(x)
	ya, _ := json.Marshal(y)
	return bytes.Equal(xa, ya)
}

// startReplicas starts replicas, each ready, and has the last lines of each
// one's log shown if the test fails.
func startReplicas(t *testing.T, replicas []*clustertest.Replica, lines int) {
	t.Helper()
	ctx := testCtx(t, 2*clustertest.Patience)
	for _, r := range replicas {
		if err := r.Start(ctx); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		if t.Failed() {
			for _, r := range replicas {
				t.Logf("%s: last lines of %s:\n%s", r.Name, r.LogFile, tail(r.Output(), lines))
			}
		}
	})
}
