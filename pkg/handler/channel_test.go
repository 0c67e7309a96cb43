package handler_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/assent-dev/assent/internal/broker"
	"github.com/assent-dev/assent/internal/brokertest"
	"github.com/assent-dev/assent/internal/testenv"
	"github.com/assent-dev/assent/pkg/events"
	"github.com/assent-dev/assent/pkg/handler"
	"github.com/assent-dev/assent/pkg/policy"
)

// recorder is a Notifier that remembers every call, as a channel's messages.
type recorder struct {
	name string
	mu   sync.Mutex
	// notices and outcomes by request id, in the order they came.
	notices  map[string][]handler.Notice
	outcomes map[string][]handler.Outcome
	changed  chan struct{}
}

func newRecorder(name string) *recorder {
	return &recorder{name: name, notices: map[string][]handler.Notice{}, outcomes: map[string][]handler.Outcome{}, changed: make(chan struct{}, 1)}
}

func (r *recorder) Notify(_ context.Context, n handler.Notice) (json.RawMessage, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.notices[n.ID] = append(r.notices[n.ID], n)
	r.signal()
	return json.Marshal(fmt.Sprintf("%s/%s/%d", r.name, n.ID, len(r.notices[n.ID])))
}

func (r *recorder) Resolve(_ context.Context, o handler.Outcome) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.outcomes[o.RequestID] = append(r.outcomes[o.RequestID], o)
	r.signal()
	return nil
}

func (r *recorder) signal() {
	select {
	case r.changed <- struct{}{}:
	default:
	}
}

// wait polls cond under the lock until it holds, failing after 20s.
func (r *recorder) wait(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.After(20 * time.Second)
	for {
		r.mu.Lock()
		ok := cond()
		r.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-r.changed:
		case <-time.After(50 * time.Millisecond):
		case <-deadline:
			t.Fatalf("%s: not after 20s", what)
		}
	}
}

// ask makes a request without waiting for it; the decision arrives on the
// returned channel.
func ask(t *testing.T, c *handler.Client, req events.Requested) (string, <-chan handler.Decision) {
	return brokertest.Ask(t, c, handler.Request{Requested: req})
}

// TestChannelOnceAcrossProcesses: two processes run the same channel; every
// request is notified once between them, answers through the channel decide
// as the acting principal on that channel, and every outcome is resolved with
// the ref its notification made, whichever process made it.
func TestChannelOnceAcrossProcesses(t *testing.T) {
	ns := testenv.Server(t)
	runBroker(t, testenv.Conn(t, ns), broker.Config{})
	a, b := newRecorder("a"), newRecorder("b")
	cfg := handler.ChannelConfig{Channel: "slack", Principals: []string{"alice"}}
	ca, _ := brokertest.RunChannel(t, testenv.Conn(t, ns), cfg, a)
	brokertest.RunChannel(t, testenv.Conn(t, ns), cfg, b)
	client, _ := handler.NewClient(testenv.Conn(t, ns), handler.Config{Agent: "coder"})

	const n = 20
	ids := make([]string, n)
	decisions := make([]<-chan handler.Decision, n)
	for i := range n {
		ids[i], decisions[i] = ask(t, client, events.Requested{Tool: "write_file", Timeout: events.Duration(time.Minute)})
	}
	count := func() int { return len(a.notices) + len(b.notices) }
	a.wait(t, "every request notified", func() bool {
		b.mu.Lock()
		defer b.mu.Unlock()
		return count() == n
	})
	// Answer each from process a, whichever process showed it: the ref is
	// in the bucket once the notification has returned it.
	for i, id := range ids {
		var notice handler.Notice
		var ok bool
		var err error
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			if notice, _, ok, err = ca.Lookup(context.Background(), id); err != nil || notice.Ref != nil {
				break
			}
		}
		if err != nil || !ok || notice.Ref == nil {
			t.Fatalf("lookup %s: %+v %v %v", id, notice, ok, err)
		}
		verdict := events.Approve
		if i%2 == 1 {
			verdict = events.Deny
		}
		if err := ca.Answer(context.Background(), "alice", id, handler.Response{Decision: verdict, Reason: "from slack"}); err != nil {
			t.Fatal(err)
		}
	}
	for i, ch := range decisions {
		d := brokertest.Decision(t, ch)
		if d.Approved() != (i%2 == 0) || len(d.DecidedBy) != 1 || d.DecidedBy[0].Principal != "alice" || d.DecidedBy[0].Channel != "slack" {
			t.Fatalf("decision %d: %+v", i, d)
		}
	}
	b.wait(t, "every outcome resolved", func() bool {
		a.mu.Lock()
		defer a.mu.Unlock()
		return len(a.outcomes)+len(b.outcomes) == n
	})
	a.mu.Lock()
	b.mu.Lock()
	defer a.mu.Unlock()
	defer b.mu.Unlock()
	for _, id := range ids {
		shown := append(a.notices[id], b.notices[id]...)
		resolved := append(a.outcomes[id], b.outcomes[id]...)
		if len(shown) != 1 || len(resolved) != 1 {
			t.Fatalf("request %s: %d notices, %d outcomes; want one each", id, len(shown), len(resolved))
		}
		var ref string
		_ = json.Unmarshal(resolved[0].Notice.Ref, &ref)
		if want := fmt.Sprintf("%s/%s/1", map[bool]string{true: "a", false: "b"}[len(a.notices[id]) == 1], id); ref != want {
			t.Fatalf("request %s resolved with ref %q, want %q", id, ref, want)
		}
	}
}

// TestChannelRestart: a channel stopped and started again while a request
// waits does not notify it a second time, and still resolves it.
func TestChannelRestart(t *testing.T) {
	ns := testenv.Server(t)
	runBroker(t, testenv.Conn(t, ns), broker.Config{})
	cfg := handler.ChannelConfig{Channel: "email", Principals: []string{"alice"}}
	first := newRecorder("first")
	_, stop := brokertest.RunChannel(t, testenv.Conn(t, ns), cfg, first)
	client, _ := handler.NewClient(testenv.Conn(t, ns), handler.Config{Agent: "coder"})
	id, decided := ask(t, client, events.Requested{Tool: "deploy", Timeout: events.Duration(time.Minute)})
	first.wait(t, "notified", func() bool { return len(first.notices[id]) == 1 })
	stop()

	second := newRecorder("second")
	c, _ := brokertest.RunChannel(t, testenv.Conn(t, ns), cfg, second)
	time.Sleep(time.Second) // time to redeliver, were it to
	if err := c.Answer(context.Background(), "alice", id, handler.Response{Decision: events.Approve}); err != nil {
		t.Fatal(err)
	}
	if d := brokertest.Decision(t, decided); !d.Approved() {
		t.Fatalf("decision %+v", d)
	}
	second.wait(t, "resolved after the restart", func() bool { return len(second.outcomes[id]) == 1 })
	second.mu.Lock()
	defer second.mu.Unlock()
	if len(second.notices[id]) != 0 {
		t.Fatalf("notified again after a restart: %+v", second.notices[id])
	}
	var ref string
	_ = json.Unmarshal(second.outcomes[id][0].Notice.Ref, &ref)
	if ref != "first/"+id+"/1" {
		t.Fatalf("resolved with ref %q, want the first process's", ref)
	}
}

// TestChannelReminderAndEscalation: a reminder goes out before the deadline,
// with the ref of the notification; an escalation notifies the new
// approvers at level 1; a request decided before it is shown is not shown.
func TestChannelReminderAndEscalation(t *testing.T) {
	p, err := policy.Parse([]byte(`version: 1
principals:
  alice: {roles: [ops]}
  erin:  {roles: [cfo]}
rules:
  - name: wires
    tools: [wire]
    action: require_approval
    approvers: ["role:ops"]
    timeout: 10s
    escalation:
      - after: 1s
        approvers: ["role:cfo"]
        extend: 1s
  - name: deploys
    tools: [deploy]
    action: require_approval
    timeout: 5s
`), "channel.yaml")
	if err != nil {
		t.Fatal(err)
	}
	ns := testenv.Server(t)
	runBroker(t, testenv.Conn(t, ns), broker.Config{Policy: p})
	r := newRecorder("r")
	c, _ := brokertest.RunChannel(t, testenv.Conn(t, ns), handler.ChannelConfig{Channel: "slack", Principals: []string{"alice", "erin"}, Remind: 2 * time.Second}, r)
	client, _ := handler.NewClient(testenv.Conn(t, ns), handler.Config{Agent: "bank"})

	deploy, _ := ask(t, client, events.Requested{Tool: "deploy"})
	wire, _ := ask(t, client, events.Requested{Tool: "wire"})
	r.wait(t, "deploy notified and reminded", func() bool { return len(r.notices[deploy]) == 2 })
	r.wait(t, "wire escalated", func() bool { return len(r.notices[wire]) >= 2 })
	r.mu.Lock()
	first, reminder := r.notices[deploy][0], r.notices[deploy][1]
	if first.Reminder || !reminder.Reminder || string(reminder.Ref) != `"r/`+deploy+`/1"` || first.Rule != "deploys" || first.Terms == nil || first.Terms.Quorum != 1 {
		t.Fatalf("deploy notices: %+v then %+v", first, reminder)
	}
	esc := r.notices[wire][1]
	if r.notices[wire][0].Level != 0 || esc.Level != 1 || len(esc.Approvers) != 1 || esc.Approvers[0] != "erin" || string(esc.Ref) != `"r/`+wire+`/1"` {
		t.Fatalf("wire notices: %+v", r.notices[wire])
	}
	if h0 := r.notices[wire][0].History; h0 != nil && (esc.History == nil || esc.History.Window != h0.Window) {
		t.Fatalf("the escalation lost the history of the first notice: %+v, then %+v", h0, esc.History)
	}
	r.mu.Unlock()
	if err := c.Answer(context.Background(), "erin", wire, handler.Response{Decision: events.Deny, Reason: "no"}); err != nil {
		t.Fatal(err)
	}
	r.wait(t, "deploy expired, wire denied, both resolved", func() bool { return len(r.outcomes[deploy]) == 1 && len(r.outcomes[wire]) == 1 })
	r.mu.Lock()
	defer r.mu.Unlock()
	if o := r.outcomes[wire][0]; o.Decision.Outcome != events.Denied || o.Notice.Level != 1 || o.Decision.DecidedBy[0].Principal != "erin" {
		t.Fatalf("wire outcome %+v", o)
	}
	if o := r.outcomes[deploy][0]; o.Decision.Outcome != events.Expired || len(r.notices[wire]) != 2 {
		t.Fatalf("deploy outcome %+v; wire notices %d, want 2 (no reminder yet)", o, len(r.notices[wire]))
	}
}

// TestChannelReminderNotEarly: a reminder goes out remind before the
// deadline, but never before half of the request's time has gone: a request
// no longer than twice remind gets none, rather than one on the heels of its
// notice (issue 22.8).
func TestChannelReminderNotEarly(t *testing.T) {
	ns := testenv.Server(t)
	runBroker(t, testenv.Conn(t, ns), broker.Config{})
	r := newRecorder("r")
	brokertest.RunChannel(t, testenv.Conn(t, ns), handler.ChannelConfig{Channel: "slack", Principals: []string{"alice"}, Remind: 2 * time.Second}, r)
	client, _ := handler.NewClient(testenv.Conn(t, ns), handler.Config{Agent: "coder"})

	short, _ := ask(t, client, events.Requested{Tool: "deploy", Timeout: events.Duration(2 * time.Second)})
	asked := time.Now()
	long, _ := ask(t, client, events.Requested{Tool: "deploy", Timeout: events.Duration(6 * time.Second)})
	var reminded time.Time
	r.wait(t, "the long request reminded", func() bool {
		if len(r.notices[long]) == 2 && reminded.IsZero() {
			reminded = time.Now()
		}
		return !reminded.IsZero()
	})
	if after := reminded.Sub(asked); after < 3*time.Second {
		t.Errorf("a 6s request reminded %s after it was asked: before half its time", after)
	}
	r.wait(t, "both expired and resolved", func() bool { return len(r.outcomes[short]) == 1 && len(r.outcomes[long]) == 1 })
	r.mu.Lock()
	defer r.mu.Unlock()
	if n := r.notices[short]; len(n) != 1 {
		t.Fatalf("a 2s request with remind 2s: %d notices (%+v), want its notice and no reminder", len(n), n)
	}
	if !r.notices[long][1].Reminder {
		t.Fatalf("long: %+v", r.notices[long])
	}
}

// TestChannelPresence: a running channel announces every principal it
// reaches, and withdraws them when it stops.
func TestChannelPresence(t *testing.T) {
	ns := testenv.Server(t)
	runBroker(t, testenv.Conn(t, ns), broker.Config{})
	_, stop := brokertest.RunChannel(t, testenv.Conn(t, ns), handler.ChannelConfig{Channel: "slack", Principals: []string{"alice", "bob"}}, newRecorder("p"))
	js, _ := jetstream.New(testenv.Conn(t, ns))
	kv, err := js.KeyValue(testCtx(t), events.PresenceBucket)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"alice", "bob"} {
		key, _ := events.PresenceKey(p, "slack")
		deadline := time.Now().Add(10 * time.Second)
		for {
			if _, err := kv.Get(testCtx(t), key); err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s not announced on slack", p)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	stop()
	key, _ := events.PresenceKey("alice", "slack")
	if _, err := kv.Get(testCtx(t), key); err == nil {
		t.Fatal("alice still announced after the channel stopped")
	}
}

// TestApproverRestart: an approver started again under the same durable
// consumer runs (the server refuses to move a consumer's start time, which
// each start would otherwise ask for) and answers what waits.
func TestApproverRestart(t *testing.T) {
	ns := testenv.Server(t)
	runBroker(t, testenv.Conn(t, ns), broker.Config{})
	cfg := handler.ApproverConfig{Principal: "alice", Channel: "test"}
	first, err := handler.NewApprover(testenv.Conn(t, ns), cfg, func(context.Context, handler.Request) (handler.Response, error) {
		return handler.Response{}, handler.ErrSkip
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- first.Run(ctx) }()
	time.Sleep(500 * time.Millisecond)
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	time.Sleep(10 * time.Millisecond) // a later start time
	second, err := handler.NewApprover(testenv.Conn(t, ns), cfg, func(context.Context, handler.Request) (handler.Response, error) {
		return handler.Response{Decision: events.Approve}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel = context.WithCancel(context.Background())
	defer cancel()
	go func() { done <- second.Run(ctx) }()
	client, _ := handler.NewClient(testenv.Conn(t, ns), handler.Config{Agent: "coder"})
	_, decided := ask(t, client, events.Requested{Tool: "deploy", Timeout: events.Duration(20 * time.Second)})
	select {
	case err := <-done:
		t.Fatalf("the restarted approver stopped: %v", err)
	case d := <-decided:
		if !d.Approved() {
			t.Fatalf("decision %+v", d)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("no decision")
	}
}

// lookingNotifier looks its own notice up while it is being shown, as a
// person clicking at once would, from another process.
type lookingNotifier struct {
	*recorder
	other *handler.Channel
	found chan bool
}

func (l *lookingNotifier) Notify(ctx context.Context, n handler.Notice) (json.RawMessage, error) {
	_, _, ok, err := l.other.Lookup(ctx, n.ID)
	l.found <- ok && err == nil
	return l.recorder.Notify(ctx, n)
}

// TestChannelNoticeFoundWhileSent: a notice can be looked up (a click, an
// email link) while it is still going out, and its outcome is still shown
// where it went once the request is decided.
func TestChannelNoticeFoundWhileSent(t *testing.T) {
	ns := testenv.Server(t)
	runBroker(t, testenv.Conn(t, ns), broker.Config{})
	cfg := handler.ChannelConfig{Channel: "slack", Principals: []string{"alice"}}
	other, err := handler.NewChannel(testenv.Conn(t, ns), cfg, newRecorder("other"))
	if err != nil {
		t.Fatal(err)
	}
	n := &lookingNotifier{recorder: newRecorder("l"), other: other, found: make(chan bool, 1)}
	c, _ := brokertest.RunChannel(t, testenv.Conn(t, ns), cfg, n)
	client, _ := handler.NewClient(testenv.Conn(t, ns), handler.Config{Agent: "coder"})
	id, decided := ask(t, client, events.Requested{Tool: "deploy", Timeout: events.Duration(time.Minute)})
	select {
	case ok := <-n.found:
		if !ok {
			t.Fatal("the notice was not found while it went out")
		}
	case <-time.After(20 * time.Second):
		t.Fatal("not notified")
	}
	if err := c.Answer(context.Background(), "alice", id, handler.Response{Decision: events.Approve}); err != nil {
		t.Fatal(err)
	}
	brokertest.Decision(t, decided)
	n.wait(t, "resolved", func() bool { return len(n.outcomes[id]) == 1 })
	n.mu.Lock()
	defer n.mu.Unlock()
	if ref := string(n.outcomes[id][0].Notice.Ref); ref != `"l/`+id+`/1"` {
		t.Fatalf("resolved with ref %s", ref)
	}
}
