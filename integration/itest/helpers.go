package itest

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
// (OpCtx, DoHTTP, PublishCtx, ...) are for goroutines other than the test's. Waits poll with generous deadlines; nothing asserts
// how fast something happened beyond "well within a bound that only a hang
// would miss".

// Patience bounds every poll in the suite: long enough that only a hang misses
// it, even with -race on two busy cores.
const Patience = 20 * time.Second

// Main removes the programs that binary builds, once per test binary.
func Main(m *testing.M) {
	code := m.Run()
	if built.dir != "" {
		_ = os.RemoveAll(built.dir)
	}
	os.Exit(code)
}

// OpCtx bounds one operation (a publish, a read) by patience.
func OpCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), Patience)
}

// TestCtx returns a context that ends after d or with the test.
func TestCtx(t *testing.T, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// RunBroker runs a broker on nc and returns it once it is ready, with a func
// that stops it and waits for Run to return (also called at cleanup; calling it
// twice is fine).
func RunBroker(t testing.TB, nc *nats.Conn, cfg broker.Config) (*broker.Broker, func()) {
	t.Helper()
	return brokertest.Run(t, nc, cfg)
}

// RunLoggedBroker runs a broker on nc, as RunBroker does, whose log lines (JSON)
// go to w.
func RunLoggedBroker(t *testing.T, nc *nats.Conn, cfg broker.Config, w io.Writer) *broker.Broker {
	t.Helper()
	log := zap.New(zapcore.NewCore(zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig()), zapcore.AddSync(w), zap.DebugLevel))
	b, _ := brokertest.RunLogged(t, nc, cfg, log)
	return b
}

// MustPolicy parses src as the policy file name, failing the test on error.
func MustPolicy(t testing.TB, src, name string) *policy.Policy {
	t.Helper()
	p, err := policy.Parse([]byte(src), name)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// Subscribe subscribes nc to subject until the test ends, and returns once
// the server knows of the subscription.
func Subscribe(t *testing.T, nc *nats.Conn, subject string) <-chan *nats.Msg {
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

// Env is one embedded NATS server with one broker on it, an HTTP gateway in
// front of the broker, and connections for agents and approvers.
type Env struct {
	NS  *testenv.NATS
	NC  *nats.Conn // the test's own connection (agents, approvers, checks)
	JS  jetstream.JetStream
	B   *broker.Broker
	API string // base URL of the HTTP gateway over b
}

// NewEnv starts NATS, a broker with cfg (manual mode unless cfg says
// otherwise), and an HTTP gateway in front of it.
func NewEnv(t *testing.T, cfg broker.Config) *Env {
	t.Helper()
	ns := testenv.Server(t)
	if cfg.Name == "" {
		cfg.Name = "itest"
	}
	b, _ := RunBroker(t, testenv.Conn(t, ns), cfg)
	nc := testenv.Conn(t, ns)
	return &Env{NS: ns, NC: nc, JS: NewJS(t, nc), B: b, API: ServeAPI(t, b)}
}

// ServeAPI serves the HTTP gateway over b on a loopback port until the test ends.
func ServeAPI(t testing.TB, b *broker.Broker) string {
	t.Helper()
	srv := httptest.NewServer(httpapi.New(b, httpapi.Config{}, testenv.Logger(t)))
	t.Cleanup(srv.Close)
	return srv.URL
}

func NewJS(t testing.TB, nc *nats.Conn) jetstream.JetStream {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// NewClient returns an agent-side SDK client for agent on nc.
func NewClient(t testing.TB, nc *nats.Conn, agent string) *handler.Client {
	t.Helper()
	c, err := handler.NewClient(nc, handler.Config{Agent: agent, Logger: testenv.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// Result is what a Client.Request returned.
type Result struct {
	D   handler.Decision
	Err error
}

// RequestAsync runs c.Request in a goroutine the test waits for at cleanup.
func RequestAsync(t *testing.T, ctx context.Context, c *handler.Client, req handler.Request) <-chan Result {
	t.Helper()
	return testenv.Go(t, func() Result {
		d, err := c.Request(ctx, req)
		return Result{d, err}
	})
}

// Await returns what a RequestAsync call returned, failing after patience.
func Await(t *testing.T, ch <-chan Result) Result {
	t.Helper()
	return testenv.Await(t, ch, Patience, "Client.Request")
}

// RunApprover runs an SDK approver runtime until the test ends. It answers
// only requests of agent.
func RunApprover(t *testing.T, nc *nats.Conn, principal, agent string, h handler.Handler) {
	t.Helper()
	brokertest.RunApprover(t, nc, handler.ApproverConfig{
		Principal: principal, Channel: "sdk", Agents: []string{agent},
		Durable: "approver-" + principal + "-" + agent,
	}, h)
}

// Eventually polls cond every 20ms until it reports true, failing the test
// with cond's last explanation after within.
func Eventually(t testing.TB, within time.Duration, cond func() (bool, string)) {
	t.Helper()
	PollEvery(t, within, 20*time.Millisecond, cond)
}

// PollEvery is eventually with a poll of every, for slow waits.
func PollEvery(t testing.TB, within, every time.Duration, cond func() (bool, string)) {
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

// WaitRecord polls b until request id exists and satisfies ok.
func WaitRecord(t *testing.T, b *broker.Broker, id string, ok func(broker.Record) bool) broker.Record {
	t.Helper()
	var rec broker.Record
	Eventually(t, Patience, func() (bool, string) {
		var err error
		rec, err = b.Get(context.Background(), id)
		if err != nil {
			return false, fmt.Sprintf("get %s: %v", id, err)
		}
		return ok(rec), fmt.Sprintf("request %s is %s", id, rec.State)
	})
	return rec
}

// WaitState polls b until request id is in state want.
func WaitState(t *testing.T, b *broker.Broker, id string, want broker.State) broker.Record {
	t.Helper()
	return WaitRecord(t, b, id, func(r broker.Record) bool { return r.State == want })
}

// StreamOf returns the broker's stream.
func StreamOf(t *testing.T, js jetstream.JetStream) jetstream.Stream {
	t.Helper()
	ctx, cancel := OpCtx()
	defer cancel()
	s, err := js.Stream(ctx, broker.StreamName)
	if err != nil {
		t.Fatalf("stream %s: %v", broker.StreamName, err)
	}
	return s
}

// StoredDecision reads the decided event on assent.decision.<id>, if any.
func StoredDecision(t *testing.T, js jetstream.JetStream, id string) (events.Decided, bool) {
	t.Helper()
	subj, err := events.DecisionSubject(id)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := OpCtx()
	defer cancel()
	// The decision is the first message on its subject; anything after it
	// is not (see TestForgedDecision).
	m, err := StreamOf(t, js).GetMsg(ctx, 1, jetstream.WithGetMsgSubject(subj))
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

// WaitDecision polls the stream until request id has a decided event.
func WaitDecision(t *testing.T, js jetstream.JetStream, id string) events.Decided {
	t.Helper()
	var d events.Decided
	Eventually(t, Patience, func() (bool, string) {
		var ok bool
		d, ok = StoredDecision(t, js, id)
		return ok, "no decided event for " + id
	})
	return d
}

// DecodePending decodes a message of assent.pending.<agent>: a pending event,
// as a channel sees it.
func DecodePending(t *testing.T, header nats.Header, data []byte) (events.Pending, error) {
	t.Helper()
	ev, err := events.Decode(events.Header(header), data)
	if err != nil {
		return events.Pending{}, err
	}
	return events.DecodePending(&ev)
}

// WaitPending waits until the stream holds the pending event of request id
// of agent, as an approver sees it before answering.
func WaitPending(t *testing.T, js jetstream.JetStream, agent, id string) {
	t.Helper()
	Eventually(t, Patience, func() (bool, string) {
		ctx, cancel := OpCtx()
		defer cancel()
		m, err := StreamOf(t, js).GetLastMsgForSubject(ctx, events.PendingPrefix+agent)
		if err != nil {
			return false, "no pending event for " + agent + ": " + err.Error()
		}
		p, err := DecodePending(t, m.Header, m.Data)
		return err == nil && p.RequestID == id, "the last pending event of " + agent + " is not " + id
	})
}

// DecisionCounts returns how many messages the stream holds on each
// assent.decision.* subject.
func DecisionCounts(t *testing.T, js jetstream.JetStream) map[string]uint64 {
	t.Helper()
	ctx, cancel := OpCtx()
	defer cancel()
	info, err := StreamOf(t, js).Info(ctx, jetstream.WithSubjectFilter(events.DecisionPrefix+"*"))
	if err != nil {
		t.Fatalf("stream info: %v", err)
	}
	out := make(map[string]uint64, len(info.State.Subjects))
	for subj, n := range info.State.Subjects {
		out[strings.TrimPrefix(subj, events.DecisionPrefix)] = n
	}
	return out
}

// CountDecisions counts the decided messages of request id by reading every
// message on its decision subject with an ordered consumer, and checks the
// count against the stream's per-subject accounting.
func CountDecisions(t *testing.T, js jetstream.JetStream, id string) int {
	t.Helper()
	subj, err := events.DecisionSubject(id)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := OpCtx()
	defer cancel()
	cons, err := StreamOf(t, js).OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: []string{subj}})
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
	if byInfo := DecisionCounts(t, js)[id]; uint64(n) != byInfo {
		t.Fatalf("read %d messages on %s but stream info counts %d", n, subj, byInfo)
	}
	return n
}

// BrokerConsumers are the durable consumers the broker reads its inputs with.
var BrokerConsumers = []string{"assent-broker-requests", "assent-broker-responses", "assent-broker-cancels", "assent-broker-timeouts"}

// WaitBrokerIdle polls until every broker consumer has handed out and settled
// every message: nothing pending, nothing awaiting an ack, nothing being
// redelivered. It returns their final infos by name.
func WaitBrokerIdle(t *testing.T, js jetstream.JetStream) map[string]*jetstream.ConsumerInfo {
	t.Helper()
	return WaitIdle(t, js, false, BrokerConsumers...)
}

// WaitIdle polls until the named consumers have handed out every message and,
// unless allowUnacked, settled every one.
func WaitIdle(t *testing.T, js jetstream.JetStream, allowUnacked bool, names ...string) map[string]*jetstream.ConsumerInfo {
	t.Helper()
	return WaitIdleWithin(t, js, Patience, 20*time.Millisecond, allowUnacked, names...)
}

// WaitIdleWithin is WaitIdle polling every every, for within.
func WaitIdleWithin(t *testing.T, js jetstream.JetStream, within, every time.Duration, allowUnacked bool, names ...string) map[string]*jetstream.ConsumerInfo {
	t.Helper()
	infos := map[string]*jetstream.ConsumerInfo{}
	PollEvery(t, within, every, func() (bool, string) {
		sctx, cancel := OpCtx()
		defer cancel()
		stream, err := js.Stream(sctx, broker.StreamName)
		if err != nil {
			return false, fmt.Sprintf("stream %s: %v", broker.StreamName, err)
		}
		for _, name := range names {
			ctx, cancel := OpCtx()
			defer cancel()
			cons, err := stream.Consumer(ctx, name)
			if err != nil {
				return false, fmt.Sprintf("consumer %s: %v", name, err)
			}
			info := cons.CachedInfo() // read just now, by Consumer
			infos[name] = info
			if info.NumPending != 0 || !allowUnacked && (info.NumAckPending != 0 || info.NumRedelivered != 0) {
				return false, fmt.Sprintf("consumer %s: %d pending, %d awaiting ack, %d redelivered", name, info.NumPending, info.NumAckPending, info.NumRedelivered)
			}
			// The server tells a consumer of a stored message after it has
			// acknowledged the publish, so a consumer may say it has nothing
			// pending before it knows of the last message: it is idle once
			// it has handed out the last message its filters take.
			last, err := lastFiltered(ctx, stream, info.Config)
			if err != nil {
				return false, fmt.Sprintf("consumer %s: %v", name, err)
			}
			if info.Delivered.Stream < last {
				return false, fmt.Sprintf("consumer %s: handed out up to stream sequence %d, the last message it takes is at %d", name, info.Delivered.Stream, last)
			}
		}
		return true, ""
	})
	return infos
}

// lastFiltered returns the stream sequence of the last message the consumer
// configured by cfg takes, 0 if none.
func lastFiltered(ctx context.Context, stream jetstream.Stream, cfg jetstream.ConsumerConfig) (uint64, error) {
	filters := cfg.FilterSubjects
	if cfg.FilterSubject != "" {
		filters = append(filters, cfg.FilterSubject)
	}
	if len(filters) == 0 {
		filters = []string{">"}
	}
	var last uint64
	for _, f := range filters {
		m, err := stream.GetLastMsgForSubject(ctx, f)
		switch {
		case errors.Is(err, jetstream.ErrMsgNotFound):
		case err != nil:
			return 0, fmt.Errorf("last message on %s: %w", f, err)
		default:
			last = max(last, m.Sequence)
		}
	}
	return last, nil
}

// RawEvent is a structured-mode CloudEvent with data as given, for publishing
// things the SDK would refuse to build.
func RawEvent(id, typ, source, data string) []byte {
	return fmt.Appendf(nil, `{"specversion":"1.0","id":%q,"type":%q,"source":%q,"datacontenttype":"application/json","data":%s}`, id, typ, source, data)
}

// Publish puts a message on the stream the way any NATS client could, and
// returns the publish error (the stream may refuse it).
func Publish(t *testing.T, js jetstream.JetStream, subject string, body []byte, msgID string) error {
	t.Helper()
	msg := &nats.Msg{Subject: subject, Header: nats.Header{"Content-Type": {events.ContentTypeStructured}}, Data: body}
	var opts []jetstream.PublishOpt
	if msgID != "" {
		opts = append(opts, jetstream.WithMsgID(msgID))
	}
	ctx, cancel := OpCtx()
	defer cancel()
	_, err := js.PublishMsg(ctx, msg, opts...)
	return err
}

// PublishCtx is publish for goroutines other than the test's: it reports
// instead of failing the test.
func PublishCtx(ctx context.Context, js jetstream.JetStream, subject string, body []byte) error {
	_, err := js.PublishMsg(ctx, &nats.Msg{Subject: subject, Header: nats.Header{"Content-Type": {events.ContentTypeStructured}}, Data: body})
	return err
}

// MustPublish is publish that fails the test on error.
func MustPublish(t *testing.T, js jetstream.JetStream, subject string, body []byte, msgID string) {
	t.Helper()
	if err := Publish(t, js, subject, body, msgID); err != nil {
		t.Fatalf("publish to %s: %v", subject, err)
	}
}

// AnswerNATS publishes principal's answer to request id on
// assent.response.<principal>.<id>, as an approver program would.
func AnswerNATS(t *testing.T, js jetstream.JetStream, principal, id string, r events.Responded) {
	t.Helper()
	ctx, cancel := OpCtx()
	defer cancel()
	if err := handler.Answer(ctx, js, principal, id, r); err != nil {
		t.Fatalf("answer %s as %s: %v", id, principal, err)
	}
}

// HTTPResp is a response read in full.
type HTTPResp struct {
	Status int
	Header http.Header
	Body   []byte
}

// httpClient is used for every HTTP call: a hung server fails the test rather
// than the test binary.
var httpClient = &http.Client{Timeout: 60 * time.Second}

// Call sends method to url with body (nil, []byte, string, or a value to
// encode as JSON) and reads the whole response.
func Call(t *testing.T, method, url string, body any) HTTPResp {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r, err := DoHTTP(ctx, method, url, body)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// DoHTTP is call for goroutines other than the test's: it reports errors
// instead of failing the test.
func DoHTTP(ctx context.Context, method, url string, body any) (HTTPResp, error) {
	return DoHTTPWith(ctx, method, url, nil, body)
}

// DoHTTPWith is DoHTTP sending header too.
func DoHTTPWith(ctx context.Context, method, url string, header http.Header, body any) (HTTPResp, error) {
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
			return HTTPResp{}, err
		}
		rd = bytes.NewReader(buf)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		return HTTPResp{}, err
	}
	if rd != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		return HTTPResp{}, fmt.Errorf("%s %s: %w", method, url, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return HTTPResp{}, fmt.Errorf("%s %s: read body: %w", method, url, err)
	}
	return HTTPResp{Status: resp.StatusCode, Header: resp.Header, Body: data}, nil
}

// ApprovalOf decodes an approval resource, checking the status first.
func ApprovalOf(t *testing.T, r HTTPResp, wantStatus int) httpapi.Approval {
	t.Helper()
	if r.Status != wantStatus {
		t.Fatalf("status %d, want %d: %s", r.Status, wantStatus, r.Body)
	}
	if ct := r.Header.Get("Content-Type"); ct != "application/json" {
		t.Fatalf("Content-Type %q, want application/json", ct)
	}
	var a httpapi.Approval
	if err := json.Unmarshal(r.Body, &a); err != nil {
		t.Fatalf("decode approval: %v: %s", err, r.Body)
	}
	return a
}

// WantError checks r is an error with status and code in the documented shape,
// {"error": {"code", "message"}} and nothing else.
func WantError(t *testing.T, r HTTPResp, status int, code string) {
	t.Helper()
	if r.Status != status {
		t.Fatalf("status %d, want %d (%s): %s", r.Status, status, code, r.Body)
	}
	if ct := r.Header.Get("Content-Type"); ct != "application/json" {
		t.Fatalf("error Content-Type %q, want application/json: %s", ct, r.Body)
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(r.Body, &top); err != nil {
		t.Fatalf("error body is not a JSON object: %v: %s", err, r.Body)
	}
	if len(top) != 1 || top["error"] == nil {
		t.Fatalf("error body %s: want exactly one member, \"error\"", r.Body)
	}
	var e map[string]any
	if err := json.Unmarshal(top["error"], &e); err != nil {
		t.Fatalf("error member is not an object: %s", r.Body)
	}
	gotCode, _ := e["code"].(string)
	msg, _ := e["message"].(string)
	if gotCode != code || msg == "" || len(e) != 2 {
		t.Fatalf("error %s: want {\"code\": %q, \"message\": non-empty}", top["error"], code)
	}
}

// SameJSON reports whether a and b hold the same JSON value.
func SameJSON(a, b []byte) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	xa, _ := json.Marshal(x)
	ya, _ := json.Marshal(y)
	return bytes.Equal(xa, ya)
}

// StartReplicas starts replicas, each ready, and has the last lines of each
// one's log shown if the test fails.
func StartReplicas(t *testing.T, replicas []*clustertest.Replica, lines int) {
	t.Helper()
	ctx := TestCtx(t, 2*clustertest.Patience)
	for _, r := range replicas {
		if err := r.Start(ctx); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		if t.Failed() {
			for _, r := range replicas {
				t.Logf("%s: last lines of %s:\n%s", r.Name, r.LogFile, Tail(r.Output(), lines))
			}
		}
	})
}
