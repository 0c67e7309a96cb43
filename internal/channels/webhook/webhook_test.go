package webhook_test

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/assent-dev/assent/internal/broker"
	"github.com/assent-dev/assent/internal/brokertest"
	"github.com/assent-dev/assent/internal/channels"
	"github.com/assent-dev/assent/internal/channels/webhook"
	"github.com/assent-dev/assent/internal/testenv"
	"github.com/assent-dev/assent/pkg/events"
	"github.com/assent-dev/assent/pkg/handler"
	"github.com/assent-dev/assent/pkg/policy"
)

// outage is how long TestReceiverOutage keeps its receiver down. CI runs the
// full minute: go test -race ./internal/channels/webhook/ -webhook-outage=60s
var outage = flag.Duration("webhook-outage", 5*time.Second, "how long TestReceiverOutage keeps the receiver down (CI: 60s)")

// patience bounds every wait of these tests, outages aside.
const patience = 30 * time.Second

const policySrc = `version: 1
principals:
  alice:   {roles: [ops]}
  ci-bot:  {roles: [ops]}
  mallory: {roles: [intern]}
rules:
  - name: deploys
    tools: [deploy]
    action: require_approval
    approvers: ["role:ops"]
    timeout: 60s
    escalation:
      - after: 1s
        approvers: [alice]
  - name: everything
    tools: ["*"]
    action: require_approval
    approvers: ["role:ops"]
    timeout: 5m
`

func testPolicy(t testing.TB) *policy.Policy {
	t.Helper()
	p, err := policy.Parse([]byte(policySrc), "webhook.yaml")
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// delivered is one event a receiver accepted.
type delivered struct {
	ID, Type, RequestID, Subject string
	Header                       http.Header
	Body                         []byte
}

// receiver is a webhook receiver on a real HTTP server that checks every
// delivery as docs/channels.md tells receivers to. It can refuse (answer a status)
// or be closed and reopened on the same address.
type receiver struct {
	t       testing.TB
	key     []byte
	addr    string
	refuse  atomic.Int32 // a status to answer instead of taking the event; 0 takes it
	mu      sync.Mutex
	got     []delivered
	refused int
	srv     *http.Server
	served  chan struct{}
}

func newReceiver(t testing.TB, key []byte) *receiver {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &receiver{t: t, key: key, addr: ln.Addr().String()}
	r.serve(ln)
	t.Cleanup(r.close)
	return r
}

func (r *receiver) URL() string { return "http://" + r.addr + "/hook" }

func (r *receiver) serve(ln net.Listener) {
	r.srv = &http.Server{Handler: r, ReadHeaderTimeout: 5 * time.Second}
	r.served = make(chan struct{})
	srv, served := r.srv, r.served
	go func() {
		defer close(served)
		_ = srv.Serve(ln)
	}()
}

// close takes the receiver off the network: connections are refused.
func (r *receiver) close() {
	if r.srv == nil {
		return
	}
	_ = r.srv.Close()
	<-r.served
	r.srv = nil
}

// reopen serves again on the same address.
func (r *receiver) reopen() {
	r.t.Helper()
	deadline := time.Now().Add(patience)
	for {
		ln, err := net.Listen("tcp", r.addr)
		if err == nil {
			r.serve(ln)
			return
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("reopen %s: %v", r.addr, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (r *receiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	body, err := io.ReadAll(req.Body)
	if err != nil {
		return
	}
	if s := r.refuse.Load(); s != 0 {
		r.mu.Lock()
		r.refused++
		r.mu.Unlock()
		w.WriteHeader(int(s))
		_, _ = io.WriteString(w, "down for maintenance")
		return
	}
	if err := webhook.Verify(r.key, req.Header, body, time.Now()); err != nil {
		r.t.Errorf("delivery with a bad signature: %v", err)
		w.WriteHeader(http.StatusUnauthorized)
		return
	}
	if ct := req.Header.Get("Content-Type"); ct != "application/cloudevents+json" {
		r.t.Errorf("delivery with Content-Type %q", ct)
	}
	e, err := events.Decode(events.Header(req.Header), body)
	if err != nil {
		r.t.Errorf("delivery is not a CloudEvent: %v\n%s", err, body)
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	if e.ID() != req.Header.Get(webhook.HeaderID) {
		r.t.Errorf("webhook-id %q is not the event id %q", req.Header.Get(webhook.HeaderID), e.ID())
	}
	ext := e.Extensions()
	d := delivered{ID: e.ID(), Type: e.Type(), Header: req.Header.Clone(), Body: body}
	d.RequestID, _ = ext[webhook.ExtRequestID].(string)
	d.Subject, _ = ext[webhook.ExtSubject].(string)
	r.mu.Lock()
	r.got = append(r.got, d)
	r.mu.Unlock()
	w.WriteHeader(http.StatusNoContent) // any 2xx delivers
}

func (r *receiver) refusals() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.refused
}

func (r *receiver) deliveries() []delivered {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.got)
}

// stored is one lifecycle event of the stream ASSENT, as a test expects it.
type stored struct {
	ID, Type, RequestID, Agent, Subject string
}

// storedEvents lists the lifecycle events of the stream in order, with the
// request each is about and its agent.
func storedEvents(t testing.TB, nc *nats.Conn) []stored {
	t.Helper()
	js, _ := jetstream.New(nc)
	s, err := js.Stream(testCtx(t), events.StreamName)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	agents := map[string]string{}
	var out []stored
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq; seq++ {
		m, err := s.GetMsg(testCtx(t), seq)
		if err != nil {
			continue // deleted
		}
		sub, err := events.ParseSubject(m.Subject)
		if err != nil {
			continue // the broker's own subjects
		}
		e, err := events.Decode(events.Header(m.Header), m.Data)
		if err != nil || !strings.HasPrefix(e.Type(), "dev.assent.approval.") {
			continue
		}
		st := stored{ID: e.ID(), Type: e.Type(), RequestID: sub.RequestID, Agent: sub.Agent, Subject: m.Subject}
		switch sub.Kind {
		case events.KindRequest:
			st.RequestID = e.ID()
		case events.KindPending:
			var data struct {
				RequestID string `json:"request_id"`
			}
			_ = json.Unmarshal(e.Data(), &data)
			st.RequestID = data.RequestID
		}
		if st.Agent != "" {
			if _, ok := agents[st.RequestID]; !ok {
				agents[st.RequestID] = st.Agent
			}
		} else {
			st.Agent = agents[st.RequestID]
		}
		out = append(out, st)
	}
	return out
}

func filter(all []stored, keep func(stored) bool) []stored {
	var out []stored
	for _, s := range all {
		if keep(s) {
			out = append(out, s)
		}
	}
	return out
}

// waitDelivered waits until r has accepted exactly the events want, in
// order, and fails with both lists if it does not within limit.
func waitDelivered(t testing.TB, r *receiver, want func() []stored, limit time.Duration) []delivered {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		got, exp := r.deliveries(), want()
		if same(got, exp) {
			time.Sleep(300 * time.Millisecond) // nothing more may come
			if got := r.deliveries(); same(got, want()) {
				return got
			}
			continue
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %s the receiver has:\n%s\nwant:\n%s", limit, listDelivered(got), listStored(exp))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func same(got []delivered, want []stored) bool {
	if len(got) != len(want) {
		return false
	}
	for i := range got {
		if got[i].ID != want[i].ID || got[i].Type != want[i].Type || got[i].RequestID != want[i].RequestID || got[i].Subject != want[i].Subject {
			return false
		}
	}
	return true
}

func listDelivered(ds []delivered) string {
	var b strings.Builder
	for _, d := range ds {
		fmt.Fprintf(&b, "  %s %s %s\n", d.ID, strings.TrimPrefix(d.Type, "dev.assent.approval."), d.RequestID)
	}
	return b.String()
}

func listStored(ss []stored) string {
	var b strings.Builder
	for _, s := range ss {
		fmt.Fprintf(&b, "  %s %s %s (%s)\n", s.ID, strings.TrimPrefix(s.Type, "dev.assent.approval."), s.RequestID, s.Agent)
	}
	return b.String()
}

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	t.Cleanup(cancel)
	return ctx
}

// bot is the webhook channel run as the approver bot runs it: on a channel
// runtime, with its routes on an HTTP server.
type bot struct {
	a    *webhook.Adapter
	ch   *handler.Channel
	srv  *httptest.Server
	stop func()
}

func startBot(t testing.TB, ns *testenv.NATS, cfg webhook.Config, dir *channels.Directory) *bot {
	t.Helper()
	nc := testenv.Conn(t, ns)
	a, err := webhook.New(cfg, channels.Env{NATS: nc, Directory: dir, Logger: testenv.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	ch, stop := brokertest.RunAdapter(t, nc, handler.ChannelConfig{}, a, mux)
	b := &bot{a: a, ch: ch, srv: httptest.NewServer(mux)}
	var once sync.Once
	b.stop = func() {
		once.Do(func() {
			stop()
			b.srv.Close()
		})
	}
	t.Cleanup(b.stop)
	return b
}

// ask makes request id without waiting for it; its decision arrives on the
// returned channel.
func ask(t testing.TB, c *handler.Client, id string, req events.Requested) <-chan handler.Decision {
	t.Helper()
	_, ch := brokertest.Ask(t, c, handler.Request{ID: id, Requested: req})
	return ch
}

// answer publishes principal's answer over NATS, as an approver would.
func answer(t testing.TB, nc *nats.Conn, principal, id string, v events.Verdict) {
	t.Helper()
	js, _ := jetstream.New(nc)
	if err := handler.Answer(testCtx(t), js, principal, id, events.Responded{Decision: v, Channel: "test"}); err != nil {
		t.Fatal(err)
	}
}

// waitFor polls cond until it holds.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(patience)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not after %s", what, patience)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// deliveringTo runs a broker, and a bot with one endpoint, name, that takes
// the event types given (every type if none) to a new receiver. It returns
// the connection, the receiver, and a client asking as agent coder.
func deliveringTo(t *testing.T, name string, types ...string) (*nats.Conn, *receiver, *handler.Client) {
	t.Helper()
	ns := testenv.Server(t)
	nc := testenv.Conn(t, ns)
	brokertest.Run(t, nc, broker.Config{Policy: testPolicy(t)})
	secret, key := newSecret(t)
	env := "WH_" + strings.ToUpper(name)
	t.Setenv(env, secret)
	rcv := newReceiver(t, key)
	startBot(t, ns, webhook.Config{Endpoints: []webhook.Endpoint{{Name: name, URL: rcv.URL(), SecretEnv: env, Types: types}}}, nil)
	client, _ := handler.NewClient(nc, handler.Config{Agent: "coder"})
	return nc, rcv, client
}

// TestEveryLifecycleEvent: every event of every request, of all seven types,
// reaches the receiver once, signed, in the order of the stream, with the
// request it is about.
func TestEveryLifecycleEvent(t *testing.T) {
	nc, rcv, client := deliveringTo(t, "all")

	// A deploy escalates after a second, then alice approves it.
	deploy := events.NewID()
	deployed := ask(t, client, deploy, events.Requested{Tool: "deploy", Args: json.RawMessage(`{"env":"prod"}`)})
	waitFor(t, "the deploy escalated", func() bool {
		return slices.ContainsFunc(rcv.deliveries(), func(d delivered) bool { return d.Type == events.TypeEscalated && d.RequestID == deploy })
	})
	answer(t, nc, "alice", deploy, events.Approve)
	if d := brokertest.Decision(t, deployed); !d.Approved() {
		t.Fatalf("deploy: %+v", d)
	}
	// Another request under the deploy's id is rejected. (Published
	// without Nats-Msg-Id: with it, the stream would drop it as a
	// duplicate before the broker sees it.)
	conflict, err := events.New(events.TypeRequested, deploy, "agent/coder", events.Requested{Tool: "rm", Agent: "coder"})
	if err != nil {
		t.Fatal(err)
	}
	hdr, body, _ := events.Encode(&conflict)
	js, _ := jetstream.New(nc)
	if _, err := js.PublishMsg(testCtx(t), &nats.Msg{Subject: events.RequestPrefix + "coder", Header: nats.Header(hdr), Data: body}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the conflicting request rejected", func() bool {
		return slices.ContainsFunc(storedEvents(t, nc), func(s stored) bool { return s.Type == events.TypeRejected && s.RequestID == deploy })
	})
	// A write is cancelled by its agent.
	write := events.NewID()
	written := ask(t, client, write, events.Requested{Tool: "write_file"})
	waitFor(t, "the write pending", func() bool {
		return slices.ContainsFunc(rcv.deliveries(), func(d delivered) bool { return d.Type == events.TypePending && d.RequestID == write })
	})
	if err := client.Cancel(testCtx(t), write, "changed my mind"); err != nil {
		t.Fatal(err)
	}
	if d := brokertest.Decision(t, written); d.Outcome != events.Cancelled {
		t.Fatalf("write: %+v", d)
	}

	got := waitDelivered(t, rcv, func() []stored { return storedEvents(t, nc) }, patience)
	types := map[string]int{}
	for _, d := range got {
		types[d.Type]++
	}
	for _, typ := range []string{events.TypeRequested, events.TypePending, events.TypeEscalated, events.TypeResponded, events.TypeCancel, events.TypeDecided, events.TypeRejected} {
		if types[typ] == 0 {
			t.Errorf("no %s event delivered; got %v", typ, types)
		}
	}
	// Each request's events in its order.
	order := func(id string) []string {
		var out []string
		for _, d := range got {
			if d.RequestID == id && d.Type != events.TypeRejected {
				out = append(out, strings.TrimPrefix(d.Type, "dev.assent.approval."))
			}
		}
		return out
	}
	if o := strings.Join(order(write), " "); o != "requested pending cancel decided" {
		t.Errorf("write: events %s", o)
	}
	if o := strings.Join(order(deploy), " "); !strings.HasPrefix(o, "requested pending escalated responded decided") {
		t.Errorf("deploy: events %s", o)
	}
	for _, d := range got {
		if d.Type == events.TypeResponded && d.Subject != events.ResponsePrefix+"alice."+deploy {
			t.Errorf("responded event with %s %q", webhook.ExtSubject, d.Subject)
		}
	}
}

// TestFilters: endpoints get only the types and agents they ask for, answers
// and decisions of their agents' requests included, even for requests made
// before the endpoint existed.
func TestFilters(t *testing.T) {
	ns := testenv.Server(t)
	nc := testenv.Conn(t, ns)
	brokertest.Run(t, nc, broker.Config{Policy: testPolicy(t)})
	secret, key := newSecret(t)
	t.Setenv("WH", secret)
	coderOnly, decidedOnly, mixed, late := newReceiver(t, key), newReceiver(t, key), newReceiver(t, key), newReceiver(t, key)
	startBot(t, ns, webhook.Config{Endpoints: []webhook.Endpoint{
		{Name: "coder-only", URL: coderOnly.URL(), SecretEnv: "WH", Agents: []string{"coder"}},
		{Name: "decided-only", URL: decidedOnly.URL(), SecretEnv: "WH", Types: []string{"decided"}},
		{Name: "mixed", URL: mixed.URL(), SecretEnv: "WH", Types: []string{"pending", "dev.assent.approval.decided"}, Agents: []string{"ops"}},
	}}, nil)
	coder, _ := handler.NewClient(nc, handler.Config{Agent: "coder"})
	ops, _ := handler.NewClient(nc, handler.Config{Agent: "ops"})
	ids := []string{events.NewID(), events.NewID(), events.NewID()}
	decisions := []<-chan handler.Decision{
		ask(t, coder, ids[0], events.Requested{Tool: "write_file"}),
		ask(t, ops, ids[1], events.Requested{Tool: "restart"}),
		ask(t, coder, ids[2], events.Requested{Tool: "read_file"}),
	}
	waitFor(t, "every request pending", func() bool {
		return len(filter(storedEvents(t, nc), func(s stored) bool { return s.Type == events.TypePending })) == 3
	})
	// An endpoint added now sees the answers and decisions of requests
	// whose request events it never saw: their agent comes from the broker.
	startBot(t, ns, webhook.Config{Endpoints: []webhook.Endpoint{{Name: "late", URL: late.URL(), SecretEnv: "WH", Agents: []string{"coder"}}}}, nil)
	for i, id := range ids {
		v := events.Approve
		if i == 1 {
			v = events.Deny
		}
		answer(t, nc, "alice", id, v)
		brokertest.Decision(t, decisions[i])
	}
	all := func() []stored { return storedEvents(t, nc) }
	waitDelivered(t, coderOnly, func() []stored {
		return filter(all(), func(s stored) bool { return s.Agent == "coder" })
	}, patience)
	waitDelivered(t, decidedOnly, func() []stored {
		return filter(all(), func(s stored) bool { return s.Type == events.TypeDecided })
	}, patience)
	got := waitDelivered(t, mixed, func() []stored {
		return filter(all(), func(s stored) bool {
			return s.Agent == "ops" && (s.Type == events.TypePending || s.Type == events.TypeDecided)
		})
	}, patience)
	if len(got) != 2 {
		t.Errorf("mixed got %d events, want ops's pending and decided", len(got))
	}
	got = waitDelivered(t, late, func() []stored {
		return filter(all(), func(s stored) bool {
			return s.Agent == "coder" && (s.Type == events.TypeResponded || s.Type == events.TypeDecided)
		})
	}, patience)
	if len(got) != 4 {
		t.Errorf("late got %d events, want the answers and decisions of coder's two requests:\n%s", len(got), listDelivered(got))
	}
}

// TestReceiverOutage: a receiver that refuses (503) or is off the network for
// the outage (-webhook-outage, 5s by default, 60s in CI), while requests are
// made and decided and the bot restarts, gets every event exactly once, in
// order, signed, once it is back; the delivery log shows the failed attempts
// and the one that delivered each event.
func TestReceiverOutage(t *testing.T) {
	for _, mode := range []string{"503", "closed"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel() // each waits out its outage
			ns := testenv.Server(t)
			nc := testenv.Conn(t, ns)
			brokertest.Run(t, nc, broker.Config{Policy: testPolicy(t)})
			secret, key := newSecret(t)
			// Not t.Setenv, which parallel tests may not call: a variable
			// of each subtest's own.
			env := "WH_FLAKY_" + mode
			if err := os.Setenv(env, secret); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = os.Unsetenv(env) })
			rcv := newReceiver(t, key)
			cfg := webhook.Config{Endpoints: []webhook.Endpoint{{Name: "flaky", URL: rcv.URL(), SecretEnv: env, Timeout: 2 * time.Second}}}
			b := startBot(t, ns, cfg, nil)

			down := time.Now()
			if mode == "503" {
				rcv.refuse.Store(http.StatusServiceUnavailable)
			} else {
				rcv.close()
			}
			client, _ := handler.NewClient(nc, handler.Config{Agent: "coder"})
			for i := range 3 {
				id := events.NewID()
				decided := ask(t, client, id, events.Requested{Tool: "write_file", Args: json.RawMessage(fmt.Sprintf(`{"n":%d}`, i))})
				waitFor(t, "pending", func() bool {
					return slices.ContainsFunc(storedEvents(t, nc), func(s stored) bool { return s.Type == events.TypePending && s.RequestID == id })
				})
				answer(t, nc, "alice", id, events.Approve)
				brokertest.Decision(t, decided)
			}
			// The bot restarts in the middle of the outage.
			time.Sleep(time.Until(down.Add(*outage / 2)))
			b.stop()
			startBot(t, ns, cfg, nil)
			time.Sleep(time.Until(down.Add(*outage)))
			if mode == "503" {
				if rcv.refusals() == 0 {
					t.Error("no attempt during the outage")
				}
				rcv.refuse.Store(0)
			} else {
				rcv.reopen()
			}
			up := time.Now()
			want := storedEvents(t, nc)
			if len(want) != 12 {
				t.Fatalf("%d events stored, want 12 (3 × requested, pending, responded, decided):\n%s", len(want), listStored(want))
			}
			// The next retry is due within about twice the outage.
			got := waitDelivered(t, rcv, func() []stored { return want }, 3**outage+patience)
			t.Logf("%s outage of %s: every event delivered %s after the receiver was back", mode, *outage, time.Since(up).Round(time.Millisecond))
			seen := map[string]bool{}
			for _, d := range got {
				if seen[d.ID] {
					t.Errorf("event %s delivered twice", d.ID)
				}
				seen[d.ID] = true
			}

			// The delivery log: failures, then one delivery per event.
			js, _ := jetstream.New(nc)
			var attempts []webhook.Attempt
			waitFor(t, "every delivery logged", func() bool {
				var buf bytes.Buffer
				if err := webhook.Log(testCtx(t), js, "flaky", down.Add(-time.Minute), &buf); err != nil {
					t.Fatal(err)
				}
				attempts = attempts[:0]
				dec := json.NewDecoder(&buf)
				for {
					var a webhook.Attempt
					if err := dec.Decode(&a); err == io.EOF {
						break
					} else if err != nil {
						t.Fatalf("log line: %v", err)
					}
					attempts = append(attempts, a)
				}
				n := 0
				for _, a := range attempts {
					if a.Delivered {
						n++
					}
				}
				return n == len(want)
			})
			first := want[0].ID
			var failed int
			for _, a := range attempts {
				if a.Endpoint != "flaky" || a.At.IsZero() || a.Type == "" || a.RequestID == "" {
					t.Errorf("log record %+v", a)
				}
				if a.Delivered {
					if a.Status != http.StatusNoContent || a.Error != "" || a.RetryIn != 0 {
						t.Errorf("delivered record %+v", a)
					}
					continue
				}
				failed++
				if a.EventID != first {
					t.Errorf("a failed attempt for %s, which waits behind %s: %+v", a.EventID, first, a)
				}
				if mode == "503" && (a.Status != 503 || !strings.Contains(a.Error, "503") || a.Response != "down for maintenance") ||
					mode == "closed" && (a.Status != 0 || a.Error == "") {
					t.Errorf("failed record %+v", a)
				}
				if a.RetryIn <= 0 || a.RetryIn.Std() > 5*time.Minute {
					t.Errorf("failed record retries in %s", a.RetryIn.Std())
				}
			}
			if failed < 2 {
				t.Errorf("%d failed attempts logged, want several", failed)
			}
			// The first event's attempts count up, the delivery last.
			last := 0
			for _, a := range attempts {
				if a.EventID != first {
					continue
				}
				if a.Attempt <= last {
					t.Errorf("the first event's attempt %d logged after attempt %d", a.Attempt, last)
				}
				last = a.Attempt
				if a.Delivered && a.Attempt <= failed {
					t.Errorf("the first event delivered at attempt %d, after %d failures", a.Attempt, failed)
				}
			}
			// Every endpoint's log, from the start: the same attempts.
			var buf bytes.Buffer
			if err := webhook.Log(testCtx(t), js, "", time.Time{}, &buf); err != nil {
				t.Fatal(err)
			}
			if n := bytes.Count(buf.Bytes(), []byte("\n")); n < len(attempts) {
				t.Errorf("the whole log has %d lines, want at least %d", n, len(attempts))
			}
			// Other endpoints' logs and bad names.
			buf.Reset()
			if err := webhook.Log(testCtx(t), js, "nobody", time.Time{}, &buf); err != nil || buf.Len() != 0 {
				t.Errorf("log of an unknown endpoint: %v %q", err, buf.String())
			}
			if err := webhook.Log(testCtx(t), js, "bad name", time.Time{}, &buf); err == nil {
				t.Error("log of a bad endpoint name: no error")
			}
		})
	}
}

// TestLogWithoutStream: reading the log of a server no bot has used says so.
func TestLogWithoutStream(t *testing.T) {
	ns := testenv.Server(t)
	js, _ := jetstream.New(testenv.Conn(t, ns))
	err := webhook.Log(testCtx(t), js, "", time.Time{}, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "no delivery log") {
		t.Fatalf("Log = %v", err)
	}
}

// post sends body to the bot's inbound endpoint name, signed with key at ts
// under webhook-id id; it returns the status and the decoded answer.
func post(t testing.TB, b *bot, name string, h http.Header, body []byte) (int, map[string]any) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, b.srv.URL+"/webhooks/in/"+name, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range h {
		req.Header[k] = v
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatalf("answer is not JSON: %v", err)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("answer with Content-Type %q", ct)
	}
	return resp.StatusCode, out
}

func code(out map[string]any) string {
	e, _ := out["error"].(map[string]any)
	c, _ := e["code"].(string)
	return c
}

func message(out map[string]any) string {
	e, _ := out["error"].(map[string]any)
	m, _ := e["message"].(string)
	return m
}

// responses counts the answers to request id on the stream.
func responses(t testing.TB, nc *nats.Conn, id string) int {
	return len(filter(storedEvents(t, nc), func(s stored) bool { return s.Type == events.TypeResponded && s.RequestID == id }))
}

// TestInbound: a signed decision decides the request as the endpoint's
// principal on channel webhook; forged, tampered, stale, replayed,
// malformed, misdirected and ineligible messages are refused and change
// nothing; a replay is refused by another bot process too.
func TestInbound(t *testing.T) {
	ns := testenv.Server(t)
	nc := testenv.Conn(t, ns)
	brokertest.Run(t, nc, broker.Config{Policy: testPolicy(t)})
	ciSecret, ciKey := newSecret(t)
	internSecret, internKey := newSecret(t)
	_, forgedKey := newSecret(t)
	t.Setenv("WH_CI", ciSecret)
	t.Setenv("WH_INTERN", internSecret)
	cfg := webhook.Config{Inbound: []webhook.Inbound{
		{Name: "ci", SecretEnv: "WH_CI", Principal: "ci-bot"},
		{Name: "intern", SecretEnv: "WH_INTERN", Principal: "mallory"},
	}}
	dir := channels.NewDirectory(testPolicy(t))
	b := startBot(t, ns, cfg, dir)
	other := startBot(t, ns, cfg, dir) // a second bot process
	client, _ := handler.NewClient(nc, handler.Config{Agent: "coder"})
	id := events.NewID()
	decided := ask(t, client, id, events.Requested{Tool: "write_file", Args: json.RawMessage(`{"path":"/tmp/a"}`)})
	waitFor(t, "the channel showed the request", func() bool {
		_, _, ok, _ := b.ch.Lookup(testCtx(t), id)
		return ok
	})

	approve := []byte(fmt.Sprintf(`{"request_id":%q,"decision":"approve","reason":"pipeline green","args":{"path":"/tmp/b"}}`, id))
	now := time.Now()
	for _, c := range []struct {
		name   string
		to     string
		h      http.Header
		body   []byte
		status int
		code   string
	}{
		{"forged signature", "ci", signed(forgedKey, "m1", now, approve), approve, 401, "bad_signature"},
		{"other endpoint's secret", "ci", signed(internKey, "m1", now, approve), approve, 401, "bad_signature"},
		{"tampered body", "ci", signed(ciKey, "m1", now, approve), bytes.Replace(approve, []byte("/tmp/b"), []byte("/etc/x"), 1), 401, "bad_signature"},
		{"no signature", "ci", http.Header{}, approve, 401, "bad_signature"},
		{"stale timestamp", "ci", signed(ciKey, "m1", now.Add(-6*time.Minute), approve), approve, 401, "stale_timestamp"},
		{"future timestamp", "ci", signed(ciKey, "m1", now.Add(6*time.Minute), approve), approve, 401, "stale_timestamp"},
		{"unknown endpoint", "nope", signed(ciKey, "m1", now, approve), approve, 404, "not_found"},
		{"not JSON", "ci", signed(ciKey, "m2", now, []byte("approve!")), []byte("approve!"), 400, "invalid_request"},
		{"unknown decision", "ci", signed(ciKey, "m3", now, []byte(`{"request_id":"`+id+`","decision":"maybe"}`)), []byte(`{"request_id":"` + id + `","decision":"maybe"}`), 400, "invalid_request"},
		{"deny with args", "ci", signed(ciKey, "m4", now, []byte(`{"request_id":"`+id+`","decision":"deny","args":{}}`)), []byte(`{"request_id":"` + id + `","decision":"deny","args":{}}`), 400, "invalid_request"},
		{"bad request id", "ci", signed(ciKey, "m5", now, []byte(`{"request_id":"a.b","decision":"deny"}`)), []byte(`{"request_id":"a.b","decision":"deny"}`), 400, "invalid_request"},
		{"unknown request", "ci", signed(ciKey, "m6", now, []byte(`{"request_id":"no-such-request","decision":"deny"}`)), []byte(`{"request_id":"no-such-request","decision":"deny"}`), 404, "not_found"},
		{"not eligible", "intern", signed(internKey, "m7", now, approve), approve, 403, "not_eligible"},
	} {
		t.Run(c.name, func(t *testing.T) {
			status, out := post(t, b, c.to, c.h, c.body)
			if status != c.status || code(out) != c.code || message(out) == "" {
				t.Fatalf("answer %d %v; want %d %s", status, out, c.status, c.code)
			}
		})
	}
	if _, done, err := b.ch.Decision(testCtx(t), id); err != nil || done {
		t.Fatalf("refused messages decided the request: %v %v", done, err)
	}
	if n := responses(t, nc, id); n != 0 {
		t.Fatalf("refused messages put %d answers on the stream", n)
	}
	if status, out := post(t, b, "ci", nil, nil); status != 401 {
		t.Fatalf("an unsigned empty POST: %d %v", status, out)
	}
	resp, err := http.Get(b.srv.URL + "/webhooks/in/ci")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed || resp.Header.Get("Allow") != "POST" {
		t.Fatalf("GET: %d, Allow %q", resp.StatusCode, resp.Header.Get("Allow"))
	}

	// The signed decision decides, as ci-bot on channel webhook.
	h := signed(ciKey, "decision-1", time.Now(), approve)
	status, out := post(t, b, "ci", h, approve)
	if status != http.StatusAccepted || out["status"] != "accepted" || out["principal"] != "ci-bot" || out["request_id"] != id || out["webhook_id"] != "decision-1" {
		t.Fatalf("signed decision: %d %v", status, out)
	}
	d := brokertest.Decision(t, decided)
	if !d.Approved() || len(d.DecidedBy) != 1 || d.DecidedBy[0].Principal != "ci-bot" || d.DecidedBy[0].Channel != "webhook" ||
		!d.Edited || string(d.Args) != `{"path":"/tmp/b"}` || d.Reason != "pipeline green" {
		t.Fatalf("decision %+v", d)
	}

	// Replays: to the same process, and to another one.
	for _, to := range []*bot{b, other} {
		if status, out := post(t, to, "ci", h, approve); status != http.StatusConflict || code(out) != "replayed" {
			t.Fatalf("replay: %d %v", status, out)
		}
	}
	// A new message about the decided request.
	status, out = post(t, b, "ci", signed(ciKey, "decision-2", time.Now(), approve), approve)
	if status != http.StatusConflict || code(out) != "already_decided" || !strings.Contains(message(out), "ci-bot via webhook") || out["decision"] == nil {
		t.Fatalf("after the decision: %d %v", status, out)
	}
	if n := responses(t, nc, id); n != 1 {
		t.Fatalf("%d answers on the stream, want 1", n)
	}
}

// TestInboundArgsBreakInputSchema: a decision whose edited args break the
// request's input_schema is refused with 400 invalid_request and the
// schema's words, and puts nothing on the stream; args that fit decide.
func TestInboundArgsBreakInputSchema(t *testing.T) {
	ns := testenv.Server(t)
	nc := testenv.Conn(t, ns)
	brokertest.Run(t, nc, broker.Config{Policy: testPolicy(t)})
	secret, key := newSecret(t)
	t.Setenv("WH_CI", secret)
	b := startBot(t, ns, webhook.Config{Inbound: []webhook.Inbound{{Name: "ci", SecretEnv: "WH_CI", Principal: "ci-bot"}}}, channels.NewDirectory(testPolicy(t)))
	client, _ := handler.NewClient(nc, handler.Config{Agent: "coder"})
	id := events.NewID()
	schema := json.RawMessage(`{"type":"object","properties":{"path":{"type":"string"}},"required":["path"],"additionalProperties":false}`)
	decided := ask(t, client, id, events.Requested{Tool: "write_file", Args: json.RawMessage(`{"path":"/tmp/a"}`), InputSchema: schema})
	waitFor(t, "the channel showed the request", func() bool {
		_, _, ok, _ := b.ch.Lookup(testCtx(t), id)
		return ok
	})
	for i, c := range []struct{ args, want string }{
		{`{"path":5}`, "/path: got number, want string"},
		{`{"path":"/tmp/b","mode":"0777"}`, "additional properties 'mode' not allowed"},
	} {
		body := []byte(`{"request_id":"` + id + `","decision":"approve","args":` + c.args + `}`)
		status, out := post(t, b, "ci", signed(key, fmt.Sprintf("bad-%d", i), time.Now(), body), body)
		if status != http.StatusBadRequest || code(out) != "invalid_request" || !strings.Contains(message(out), c.want) {
			t.Fatalf("args %s: %d %v; want 400 invalid_request saying %q", c.args, status, out, c.want)
		}
	}
	if n := responses(t, nc, id); n != 0 {
		t.Fatalf("refused messages put %d answers on the stream", n)
	}
	body := []byte(`{"request_id":"` + id + `","decision":"approve","args":{"path":"/tmp/b"}}`)
	if status, out := post(t, b, "ci", signed(key, "good", time.Now(), body), body); status != http.StatusAccepted {
		t.Fatalf("args that fit: %d %v", status, out)
	}
	if d := brokertest.Decision(t, decided); !d.Approved() || !d.Edited || string(d.Args) != `{"path":"/tmp/b"}` {
		t.Fatalf("decision %+v", d)
	}
}

// TestInboundRefusedThenResent: a message refused for a reason that passes
// (its request did not exist yet) is not a replay when sent again.
func TestInboundRefusedThenResent(t *testing.T) {
	ns := testenv.Server(t)
	nc := testenv.Conn(t, ns)
	brokertest.Run(t, nc, broker.Config{Policy: testPolicy(t)})
	secret, key := newSecret(t)
	t.Setenv("WH_CI", secret)
	b := startBot(t, ns, webhook.Config{Inbound: []webhook.Inbound{{Name: "ci", SecretEnv: "WH_CI", Principal: "ci-bot"}}}, channels.NewDirectory(testPolicy(t)))
	id := events.NewID()
	body := []byte(`{"request_id":"` + id + `","decision":"deny","reason":"not on a Friday"}`)
	h := signed(key, "early", time.Now(), body)
	if status, out := post(t, b, "ci", h, body); status != http.StatusNotFound {
		t.Fatalf("before the request: %d %v", status, out)
	}
	client, _ := handler.NewClient(nc, handler.Config{Agent: "coder"})
	decided := ask(t, client, id, events.Requested{Tool: "deploy_friday"})
	waitFor(t, "the request stored", func() bool {
		return slices.ContainsFunc(storedEvents(t, nc), func(s stored) bool { return s.Type == events.TypePending && s.RequestID == id })
	})
	if status, out := post(t, b, "ci", h, body); status != http.StatusAccepted {
		t.Fatalf("sent again: %d %v", status, out)
	}
	if d := brokertest.Decision(t, decided); d.Outcome != events.Denied || d.DecidedBy[0].Principal != "ci-bot" || d.Reason != "not on a Friday" {
		t.Fatalf("decision %+v", d)
	}
}

// TestStartWithoutBroker: without the stream ASSENT, Start says what to do.
func TestStartWithoutBroker(t *testing.T) {
	ns := testenv.Server(t)
	secret, _ := newSecret(t)
	t.Setenv("WH", secret)
	a, err := webhook.New(webhook.Config{Endpoints: []webhook.Endpoint{{Name: "x", URL: "https://example.com", SecretEnv: "WH"}}},
		channels.Env{NATS: testenv.Conn(t, ns)})
	if err != nil {
		t.Fatal(err)
	}
	err = a.Start(testCtx(t), nil, nil)
	if err == nil || !strings.Contains(err.Error(), "start a broker") {
		t.Fatalf("Start = %v", err)
	}
	if err := a.Start(testCtx(t), nil, nil); err == nil || !strings.Contains(err.Error(), "twice") {
		t.Fatalf("second Start = %v", err)
	}
}

// TestSecondDecisionNotDelivered: a message stored on a decision subject
// after the decision (a client publishing without the broker's expected
// sequence, as a second replica would) is not delivered: endpoints get the
// one decision every other reader acts on.
func TestSecondDecisionNotDelivered(t *testing.T) {
	nc, rcv, client := deliveringTo(t, "decided", "decided")

	// approved asks and has alice approve.
	approved := func() string {
		id := events.NewID()
		decided := ask(t, client, id, events.Requested{Tool: "write_file"})
		waitFor(t, "the request pending", func() bool {
			return slices.ContainsFunc(storedEvents(t, nc), func(s stored) bool { return s.Type == events.TypePending && s.RequestID == id })
		})
		answer(t, nc, "alice", id, events.Approve)
		if d := brokertest.Decision(t, decided); !d.Approved() {
			t.Fatalf("decision %+v", d)
		}
		return id
	}
	id := approved()
	second, err := events.New(events.TypeDecided, "", "broker/other", events.Decided{RequestID: id, Outcome: events.Denied, Reason: "a second opinion", DecidedAt: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	h, body, err := events.Encode(&second)
	if err != nil {
		t.Fatal(err)
	}
	js, _ := jetstream.New(nc)
	if _, err := js.PublishMsg(testCtx(t), &nats.Msg{Subject: events.DecisionPrefix + id, Header: nats.Header(h), Data: body}); err != nil {
		t.Fatal(err)
	}
	// A request decided after it: once its decision is delivered, the
	// endpoint has been handed everything stored before.
	next := approved()
	waitFor(t, "the next decision delivered", func() bool {
		return slices.ContainsFunc(rcv.deliveries(), func(d delivered) bool { return d.RequestID == next })
	})
	var got []string
	for _, d := range rcv.deliveries() {
		if d.RequestID == id {
			got = append(got, d.ID)
		}
	}
	if len(got) != 1 || got[0] == second.ID() {
		t.Fatalf("deliveries of %s's decided events: %v (the second, %s, must not be one)", id, got, second.ID())
	}
}
