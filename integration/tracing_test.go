package integration

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/assent-dev/assent/integration/itest"
	"github.com/assent-dev/assent/internal/broker"
	"github.com/assent-dev/assent/internal/httpapi"
	"github.com/assent-dev/assent/internal/testenv"
	"github.com/assent-dev/assent/internal/tracing"
	"github.com/assent-dev/assent/pkg/events"
	"github.com/assent-dev/assent/pkg/handler"
)

// collector is an in-process OTLP/HTTP trace collector: it decodes the
// export requests the real exporter sends and keeps their spans.
type collector struct {
	*httptest.Server
	mu    sync.Mutex
	spans []span
}

// span is an exported span with the service that exported it.
type span struct {
	*tracepb.Span
	service string
}

func (s span) traceID() string  { return hex.EncodeToString(s.TraceId) }
func (s span) id() string       { return hex.EncodeToString(s.SpanId) }
func (s span) parentID() string { return hex.EncodeToString(s.ParentSpanId) }

// attr returns the string form of attribute key; "" when absent.
func (s span) attr(key string) string { return attrValue(s.Attributes, key) }

func attrValue(kvs []*commonpb.KeyValue, key string) string {
	for _, kv := range kvs {
		if kv.Key != key {
			continue
		}
		switch v := kv.Value.Value.(type) {
		case *commonpb.AnyValue_StringValue:
			return v.StringValue
		case *commonpb.AnyValue_BoolValue:
			return fmt.Sprint(v.BoolValue)
		case *commonpb.AnyValue_IntValue:
			return fmt.Sprint(v.IntValue)
		}
	}
	return ""
}

func (s span) String() string {
	return fmt.Sprintf("%s/%s (span %s, parent %s)", s.service, s.Name, s.id(), s.parentID())
}

func newCollector(t *testing.T) *collector {
	t.Helper()
	c := &collector{}
	c.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.URL.Path != "/v1/traces" {
			http.Error(w, "want POST /v1/traces", http.StatusNotFound)
			return
		}
		body, err := io.ReadAll(r.Body)
		var req coltracepb.ExportTraceServiceRequest
		if err == nil {
			err = proto.Unmarshal(body, &req)
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		c.mu.Lock()
		for _, rs := range req.ResourceSpans {
			service := attrValue(rs.GetResource().GetAttributes(), "service.name")
			for _, ss := range rs.ScopeSpans {
				for _, sp := range ss.Spans {
					c.spans = append(c.spans, span{sp, service})
				}
			}
		}
		c.mu.Unlock()
		out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		_, _ = w.Write(out)
	}))
	t.Cleanup(c.Close)
	return c
}

// trace returns the spans of trace id received so far.
func (c *collector) trace(id string) []span {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []span
	for _, s := range c.spans {
		if s.traceID() == id {
			out = append(out, s)
		}
	}
	return out
}

// provider returns a tracer provider exporting to c as service.
func (c *collector) provider(t *testing.T, service string) *tracing.Provider {
	t.Helper()
	p, err := tracing.New(context.Background(), tracing.Config{Endpoint: c.URL, SampleRatio: 1}, service, testenv.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tracing.Stop(p, nil) })
	return p
}

// notices is a channel's Notifier that hands every notice to the test.
type notices chan handler.Notice

func (n notices) Notify(_ context.Context, x handler.Notice) (json.RawMessage, error) {
	n <- x
	return nil, nil
}

func (notices) Resolve(context.Context, handler.Outcome) error { return nil }

// traced is one full approval's world: NATS, a broker with its HTTP API, an
// approver channel and an agent, each exporting its spans to one collector
// as its own service.
type traced struct {
	col       *collector
	providers []*tracing.Provider
	api       string
	client    *handler.Client
	channel   *handler.Channel
	shown     notices
	agent     trace.Tracer
}

func newTraced(t *testing.T) *traced {
	t.Helper()
	col := newCollector(t)
	bp, cp, ap := col.provider(t, "broker"), col.provider(t, "approver-bot"), col.provider(t, "agent")
	ns := testenv.Server(t)
	b, _ := itest.RunBroker(t, testenv.Conn(t, ns), broker.Config{Name: "traced", TracerProvider: bp})
	srv := httptest.NewServer(httpapi.New(b, httpapi.Config{TracerProvider: bp}, testenv.Logger(t)))
	t.Cleanup(srv.Close)

	shown := make(notices, 4)
	ch, err := handler.NewChannel(testenv.Conn(t, ns), handler.ChannelConfig{
		Channel: "chat", Principals: []string{"alice"}, Agents: []string{"file-manager"},
		TracerProvider: cp, Logger: testenv.Logger(t)}, shown)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := testenv.Go(t, func() error { return ch.Run(ctx) })
	t.Cleanup(func() {
		cancel()
		if err := testenv.Await(t, done, itest.Patience, "Channel.Run"); err != nil {
			t.Error(err)
		}
	})
	client, err := handler.NewClient(testenv.Conn(t, ns), handler.Config{Agent: "file-manager", TracerProvider: ap, Logger: testenv.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	return &traced{col: col, providers: []*tracing.Provider{bp, cp, ap}, api: srv.URL, client: client, channel: ch,
		shown: shown, agent: ap.Tracer("agent")}
}

// ask runs one agent turn, a span of the agent's own, that asks for approval
// of a file deletion in the background; it returns the turn's trace id.
func (w *traced) ask(t *testing.T, id string) (string, <-chan itest.Result) {
	t.Helper()
	ctx, turn := w.agent.Start(context.Background(), "agent.turn")
	res := testenv.Go(t, func() itest.Result {
		defer turn.End()
		d, err := w.client.Request(ctx, handler.Request{ID: id, Requested: events.Requested{
			Tool: "delete_file", Args: json.RawMessage(`{"path":"/srv/reports/q3.csv"}`), User: "carol", Timeout: events.Duration(itest.Patience)}})
		return itest.Result{D: d, Err: err}
	})
	return turn.SpanContext().TraceID().String(), res
}

// settle waits until trace id holds every span want names (service/name) as
// often as want says, flushing every provider meanwhile, and returns it.
func (w *traced) settle(t *testing.T, id string, want map[string]int) []span {
	t.Helper()
	var spans []span
	itest.Eventually(t, itest.Patience, func() (bool, string) {
		for _, p := range w.providers {
			if err := p.ForceFlush(context.Background()); err != nil {
				return false, "flush: " + err.Error()
			}
		}
		spans = w.col.trace(id)
		count := map[string]int{}
		for _, s := range spans {
			count[s.service+"/"+s.Name]++
		}
		for name, n := range want {
			if count[name] < n {
				return false, fmt.Sprintf("trace %s has %d %s spans, want %d; it has %v", id, count[name], name, n, spans)
			}
		}
		// A span linked to from the trace may still be running (the
		// handler that stored the decision ends after the agent has it):
		// wait for it too, as for the counted ones.
		for _, s := range spans {
			for _, l := range s.Links {
				if hex.EncodeToString(l.TraceId) == id && !slices.ContainsFunc(spans, func(o span) bool { return o.id() == hex.EncodeToString(l.SpanId) }) {
					return false, fmt.Sprintf("trace %s lacks span %x, which %v links to; it has %v", id, l.SpanId, s, spans)
				}
			}
		}
		return true, ""
	})
	return spans
}

// one returns the only span of spans named service/name whose attribute
// key (when not empty) has value val.
func one(t *testing.T, spans []span, name, key, val string) span {
	t.Helper()
	var found []span
	for _, s := range spans {
		if s.service+"/"+s.Name == name && (key == "" || s.attr(key) == val) {
			found = append(found, s)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%d spans %s with %s=%q, want 1; the trace holds %v", len(found), name, key, val, spans)
	}
	return found[0]
}

// childOf checks that child's parent is parent.
func childOf(t *testing.T, child, parent span) {
	t.Helper()
	if child.parentID() != parent.id() {
		t.Errorf("%v is not a child of %v", child, parent)
	}
}

// decider returns the span of spans that the agent's request span req links
// to: the broker's span that decided, whose trace context the decided event
// carried.
func decider(t *testing.T, spans []span, req span) span {
	t.Helper()
	if len(req.Links) != 1 {
		t.Fatalf("%v has %d links, want 1: to the span that decided", req, len(req.Links))
	}
	link := req.Links[0]
	i := slices.IndexFunc(spans, func(s span) bool { return s.id() == hex.EncodeToString(link.SpanId) })
	if i < 0 || hex.EncodeToString(link.TraceId) != req.traceID() {
		t.Fatalf("%v links to span %x of trace %x, not a span of its trace %v", req, link.SpanId, link.TraceId, spans)
	}
	return spans[i]
}

// receipt checks that the agent's request span ended with outcome.
func receipt(t *testing.T, req span, outcome events.Outcome) {
	t.Helper()
	if got := req.attr("assent.outcome"); got != string(outcome) {
		t.Errorf("%v: assent.outcome %q, want %s", req, got, outcome)
	}
	if req.Status.GetCode() == tracepb.Status_STATUS_CODE_ERROR {
		t.Errorf("%v: status error: %s", req, req.Status.GetMessage())
	}
}

// TestTraceOfAnApproval follows one trace through a full approval: the agent
// asks inside its own span, the broker takes the request in, a channel shows
// it to a person, whose answer comes through the HTTP API or through the
// channel, the broker decides, and the agent receives the decision. Every
// span of the way is in the agent's trace, under the span that caused it.
func TestTraceOfAnApproval(t *testing.T) {
	for _, via := range []string{"http", "channel"} {
		t.Run(via, func(t *testing.T) {
			w := newTraced(t)
			id := events.NewID()
			traceID, res := w.ask(t, id)
			n := testenv.Await(t, w.shown, itest.Patience, "the channel's notice")
			if n.ID != id {
				t.Fatalf("notice of %s, want %s", n.ID, id)
			}
			switch via {
			case "http":
				// No traceparent header: the gateway finds the trace by the id.
				resp := itest.Call(t, http.MethodPost, w.api+"/v1/approvals/"+id+"/decision", `{"principal":"alice","decision":"approve"}`)
				if resp.Status != http.StatusOK {
					t.Fatalf("decision: %d %s", resp.Status, resp.Body)
				}
			case "channel":
				// As a chat's button handler answers: its context knows no trace.
				if err := w.channel.Answer(context.Background(), "alice", id, handler.Response{Decision: events.Approve}); err != nil {
					t.Fatal(err)
				}
			}
			r := itest.Await(t, res)
			if r.Err != nil || !r.D.Approved() {
				t.Fatalf("Request: %+v, %v; want approved", r.D, r.Err)
			}

			answerer := map[string]string{"http": "broker/" + httpapi.SpanDecision, "channel": "approver-bot/" + handler.SpanAnswer}[via]
			spans := w.settle(t, traceID, map[string]int{
				"agent/agent.turn": 1, "agent/" + handler.SpanRequest: 1,
				"broker/" + broker.SpanIngest: 1, "broker/" + broker.SpanEvaluate: 1,
				"approver-bot/" + handler.SpanNotify: 1, answerer: 1,
				"broker/" + broker.SpanAnswer: 1,
			})
			turn := one(t, spans, "agent/agent.turn", "", "")
			req := one(t, spans, "agent/"+handler.SpanRequest, "", "")
			ingest := one(t, spans, "broker/"+broker.SpanIngest, "", "")
			notify := one(t, spans, "approver-bot/"+handler.SpanNotify, "", "")
			answer := one(t, spans, answerer, "", "")
			// The span that decided is the one the decided event names; over
			// HTTP the broker's consumer also handles the recorded answer, and
			// finds it applied.
			decided := decider(t, spans, req)
			if decided.Name != broker.SpanAnswer || decided.attr("assent.state") != "approved" {
				t.Errorf("the decision came from %v (state %q), want an approving %s", decided, decided.attr("assent.state"), broker.SpanAnswer)
			}

			childOf(t, req, turn)
			childOf(t, ingest, req)
			childOf(t, one(t, spans, "broker/"+broker.SpanEvaluate, "", ""), ingest)
			childOf(t, notify, ingest)
			switch via {
			case "http":
				childOf(t, answer, ingest)
			case "channel":
				childOf(t, answer, notify)
			}
			childOf(t, decided, answer)
			receipt(t, req, events.Approved)
			for _, s := range []span{req, ingest, notify, answer, decided} {
				if got := s.attr("assent.request_id"); got != id {
					t.Errorf("%v: assent.request_id %q, want %s", s, got, id)
				}
			}
		})
	}
}

// TestTraceOfAnExpiry: a request nobody answers expires in its trace, and
// the agent's span ends with the expiry.
func TestTraceOfAnExpiry(t *testing.T) {
	w := newTraced(t)
	ctx, turn := w.agent.Start(context.Background(), "agent.turn")
	d, err := w.client.Request(ctx, handler.Request{Requested: events.Requested{Tool: "delete_file", Timeout: events.Duration(1e9)}})
	turn.End()
	if err != nil || d.Outcome != events.Expired {
		t.Fatalf("Request: %+v, %v; want expired", d, err)
	}
	spans := w.settle(t, turn.SpanContext().TraceID().String(), map[string]int{
		"agent/" + handler.SpanRequest: 1, "broker/" + broker.SpanIngest: 1, "broker/" + broker.SpanExpire: 1,
	})
	req := one(t, spans, "agent/"+handler.SpanRequest, "", "")
	ingest := one(t, spans, "broker/"+broker.SpanIngest, "", "")
	expire := one(t, spans, "broker/"+broker.SpanExpire, "assent.state", "expired")
	childOf(t, ingest, req)
	childOf(t, expire, ingest)
	receipt(t, req, events.Expired)
	if d := decider(t, spans, req); d.id() != expire.id() {
		t.Errorf("the decision came from %v, want the expiry %v", d, expire)
	}
}

// TestTraceAttributesNeverReject: requested events whose trace attributes
// are malformed are decided as if they carried none; the broker begins a
// trace of its own for them when its tracing is on, and passes a valid one
// on whether its tracing is on or off.
func TestTraceAttributesNeverReject(t *testing.T) {
	const valid = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	cases := []struct {
		name, attrs string
		keep        bool // the decision is in the sender's trace
	}{
		{"none", ``, false},
		{"valid", `"traceparent":"` + valid + `","tracestate":"rojo=00f067aa0ba902b7",`, true},
		{"valid, tracestate malformed", `"traceparent":"` + valid + `","tracestate":"=,=,===",`, true},
		{"malformed", `"traceparent":"00-zzz-01",`, false},
		{"all-zero trace id", `"traceparent":"00-00000000000000000000000000000000-00f067aa0ba902b7-01",`, false},
		{"upper case", `"traceparent":"00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-01",`, false},
		{"a number", `"traceparent":42,`, false},
	}
	for _, on := range []bool{true, false} {
		t.Run(fmt.Sprintf("tracing %v", map[bool]string{true: "on", false: "off"}[on]), func(t *testing.T) {
			var tp trace.TracerProvider = noop.NewTracerProvider() // as tracing.New makes it when off
			if on {
				tp = newCollector(t).provider(t, "broker")
			}
			ns := testenv.Server(t)
			itest.RunBroker(t, testenv.Conn(t, ns), broker.Config{Name: "traced", Mode: broker.ModeAutoApprove, TracerProvider: tp})
			nc := testenv.Conn(t, ns)
			js := itest.NewJS(t, nc)
			for _, tc := range cases {
				t.Run(tc.name, func(t *testing.T) {
					id := events.NewID()
					// The decision as readers get it once stored.
					decisions := itest.Subscribe(t, nc, events.DecidedPrefix+id)
					body := `{"specversion":"1.0","id":"` + id + `","type":"` + events.TypeRequested + `","source":"agent/file-manager",` + tc.attrs +
						`"datacontenttype":"application/json","data":{"tool":"delete_file","agent":"file-manager"}}`
					ctx, cancel := itest.OpCtx()
					defer cancel()
					if _, err := js.PublishMsg(ctx, &nats.Msg{Subject: events.RequestPrefix + "file-manager", Data: []byte(body),
						Header: nats.Header{"Content-Type": {events.ContentTypeStructured}}}); err != nil {
						t.Fatal(err)
					}
					m := testenv.Await(t, decisions, itest.Patience, "the decision")
					e, err := events.Decode(events.Header(m.Header), m.Data)
					if err != nil {
						t.Fatal(err)
					}
					d, err := events.DecodeDecided(&e)
					if err != nil || d.Outcome != events.Approved {
						t.Fatalf("decision %+v, %v; want approved", d, err)
					}
					got := events.TraceCarrier{Event: &e}.Get(events.TraceParentAttribute)
					switch {
					case tc.keep && got[3:35] != valid[3:35]:
						t.Errorf("the decision's traceparent %q is not in the request's trace %s", got, valid[3:35])
					case tc.keep && on && got == valid:
						t.Errorf("the decision's traceparent %q names the agent's span, not the broker's", got)
					case !tc.keep && on && (len(got) != len(valid) || got[3:35] == valid[3:35]):
						t.Errorf("the decision's traceparent %q: want a trace of the broker's own", got)
					case !tc.keep && !on && got != "":
						t.Errorf("with tracing off, the decision carries traceparent %q of nothing", got)
					}
				})
			}
		})
	}
}

// TestTraceOfAnHTTPRequest: a request made over HTTP joins the trace of the
// call's traceparent header.
func TestTraceOfAnHTTPRequest(t *testing.T) {
	const traceID, parentID = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	w := newTraced(t)
	ctx, cancel := itest.OpCtx()
	defer cancel()
	resp, err := itest.DoHTTPWith(ctx, http.MethodPost, w.api+"/v1/approvals", http.Header{"Traceparent": {"00-" + traceID + "-" + parentID + "-01"}},
		`{"tool":"delete_file","agent":"file-manager"}`)
	if err != nil || resp.Status != http.StatusCreated {
		t.Fatalf("create: %v %d %s", err, resp.Status, resp.Body)
	}
	spans := w.settle(t, traceID, map[string]int{"broker/" + broker.SpanIngest: 1, "approver-bot/" + handler.SpanNotify: 1})
	ingest := one(t, spans, "broker/"+broker.SpanIngest, "", "")
	if ingest.parentID() != parentID {
		t.Errorf("%v: want the caller's span %s as parent", ingest, parentID)
	}
	childOf(t, one(t, spans, "approver-bot/"+handler.SpanNotify, "", ""), ingest)
}

// TestTraceOfACancel: an agent that stops waiting withdraws its request in
// the request's trace.
func TestTraceOfACancel(t *testing.T) {
	w := newTraced(t)
	ctx, turn := w.agent.Start(context.Background(), "agent.turn")
	ctx, stop := context.WithCancel(ctx)
	res := testenv.Go(t, func() itest.Result {
		d, err := w.client.Request(ctx, handler.Request{Requested: events.Requested{Tool: "delete_file", Timeout: events.Duration(itest.Patience)}})
		return itest.Result{D: d, Err: err}
	})
	testenv.Await(t, w.shown, itest.Patience, "the channel's notice")
	stop()
	if r := itest.Await(t, res); r.Err == nil {
		t.Fatalf("Request returned %+v after its context ended, want its error", r.D)
	}
	turn.End()
	spans := w.settle(t, turn.SpanContext().TraceID().String(), map[string]int{
		"agent/" + handler.SpanRequest: 1, "broker/" + broker.SpanCancel: 1,
	})
	req := one(t, spans, "agent/"+handler.SpanRequest, "", "")
	childOf(t, one(t, spans, "broker/"+broker.SpanCancel, "assent.state", "cancelled"), req)
	if req.Status.GetCode() != tracepb.Status_STATUS_CODE_ERROR {
		t.Errorf("%v: status %v, want an error: the call ended without a decision", req, req.Status)
	}
}
