package cluster

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"golang.org/x/time/rate"

	"github.com/assent-dev/assent/integration/itest"
	"github.com/assent-dev/assent/internal/broker"
	"github.com/assent-dev/assent/internal/chain"
	"github.com/assent-dev/assent/internal/clustertest"
	"github.com/assent-dev/assent/internal/httpapi"
	"github.com/assent-dev/assent/internal/testenv"
	"github.com/assent-dev/assent/pkg/events"
	"github.com/assent-dev/assent/pkg/handler"
	"github.com/assent-dev/assent/pkg/policy"
)

// TestChaos's knobs. The default size is 1,000 requests (CI); -tags chaos
// makes it 10,000, as does -chaos.requests=10000.
var (
	chaosRequests  = flag.Int("chaos.requests", defaultChaosRequests, "TestChaos: requests in the load")
	chaosRate      = flag.Float64("chaos.rate", 40, "TestChaos: requests started per second")
	chaosInFlight  = flag.Int("chaos.inflight", 256, "TestChaos: requests waiting for a decision at once, at most")
	chaosReplicas  = flag.Int("chaos.replicas", 3, "TestChaos: broker replicas (processes); the last one reaches NATS through the fault proxy")
	chaosKillEvery = flag.Duration("chaos.kill-every", 3*time.Second, "TestChaos: how often a broker replica is SIGKILLed and restarted")
	chaosNodeEvery = flag.Duration("chaos.node-every", time.Minute, "TestChaos: how often a NATS node is stopped (first after 5s) and restarted")
	chaosSettle    = flag.Duration("chaos.settle", 2*time.Second, "TestChaos: how long after a remembered approval its session's next requests are made")
	chaosSeed      = flag.Uint64("chaos.seed", 0, "TestChaos: seed of the load's plan (0: from the clock)")
	chaosLogs      = flag.String("chaos.logs", "", "TestChaos: keep the replicas' and clients' logs in this directory")
	chaosStrict    = flag.Bool("chaos.strict", true, "TestChaos: fail on every timeout later than 2s, every remembered choice not honoured and every cancel lost; with =false, report them and fail only on a timeout past 15s (docs/testing.md)")
)

// chaosLateBound is how late a timeout may fire with -chaos.strict=false,
// for looking into lateness past 2s without failing on it: only a lost timer
// goes past it.
const chaosLateBound = 15 * time.Second

// The kinds of request in the chaos load.
type chaosKind string

const (
	kindAuto       chaosKind = "auto"       // allowed by a rule
	kindApprove    chaosKind = "approve"    // approved by a person
	kindDeny       chaosKind = "deny"       // denied by a person
	kindEdit       chaosKind = "edit"       // approved by a person with edited args
	kindTimeout    chaosKind = "timeout"    // nobody answers: expired at its deadline
	kindCancel     chaosKind = "cancel"     // the agent stops waiting: cancelled
	kindRemember   chaosKind = "remember"   // approved by a person who says "remember for this session"
	kindRemembered chaosKind = "remembered" // a later request of that session: decided by the grant
)

var chaosKinds = []chaosKind{kindAuto, kindApprove, kindDeny, kindEdit, kindTimeout, kindCancel, kindRemember, kindRemembered}

// chaosMix is the load's make-up per 100 requests; each remember is followed
// by chaosFollowers remembered requests in its session.
var chaosMix = map[chaosKind]int{kindAuto: 20, kindApprove: 14, kindDeny: 10, kindEdit: 10, kindTimeout: 10, kindCancel: 11, kindRemember: 5}

const chaosFollowers = 4

// chaosPolicy has a rule per kind; ops (alice and bob) answer. The tools say
// what the approvers' handler does: approve deploy, deny drop_table, edit
// transfer, approve write_file and remember it for the session, and leave
// nightly_job and long_migration unanswered.
const chaosPolicy = `version: 1
mode: manual
principals:
  alice: {roles: [ops]}
  bob:   {roles: [ops]}
defaults:
  timeout: 2m
  rememberable: false
rules:
  - name: auto-read
    tools: ["read_*"]
    action: allow
  - name: deploys
    tools: [deploy]
    action: require_approval
    approvers: ["role:ops"]
  - name: drops
    tools: [drop_table]
    action: require_approval
    approvers: ["role:ops"]
  - name: transfers
    tools: [transfer]
    action: require_approval
    approvers: ["role:ops"]
  - name: nightly
    tools: [nightly_job]
    action: require_approval
    approvers: ["role:ops"]
  - name: migrations
    tools: [long_migration]
    action: require_approval
    approvers: ["role:ops"]
  - name: file-writes
    tools: [write_file]
    action: require_approval
    approvers: ["role:ops"]
    rememberable: true
    remember_scopes: [session]
    max_remember: 1h
`

// chaosReq is one request of the load and what became of it on the agent's
// side. Only the goroutine that runs it writes the fields below the line,
// read after it returned.
type chaosReq struct {
	id      string
	kind    chaosKind
	agent   string
	seed    *chaosReq     // for kindRemembered: the request whose answer was remembered
	cancel  time.Duration // for kindCancel: when the agent stops waiting
	request events.Requested

	got          *handler.Decision // what the agent received, nil if nothing
	err          error             // the last error Request returned
	attempts     int               // Request calls (a retry reuses the id)
	resentCancel bool              // still pending 10s after the SDK's cancel, so the agent cancelled again
	neverStored  bool              // withdrawn before the stream acknowledged it, and never stored
}

// chaosEdit is what the approvers make of a transfer's args.
func chaosEdit(args json.RawMessage) json.RawMessage {
	var a map[string]any
	_ = json.Unmarshal(args, &a)
	a["amount"] = 100
	a["note"] = "capped by ops"
	out, _ := json.Marshal(a)
	return out
}

// TestChaos runs the production topology (a three-node NATS JetStream cluster
// with R3 stream and buckets, broker replicas as processes) under a mixed load
// of requests from SDK agents, answered by approver runtimes, while things
// fail: a broker replica is SIGKILLed and restarted every few seconds
// (rotating), a NATS node is stopped and restarted, a fault proxy between
// one replica and its node adds latency, drops traffic and cuts connections,
// and the approver runtimes are restarted (one stopped cleanly, the other
// losing its connection). Then it checks, from the stream itself:
//
//   - every request has exactly one decision, and no decision subject holds
//     two different ones (every message of every subject is read);
//   - what each agent received is the first message stored on its decision
//     subject, read from the stream's leader: nothing seen by an agent and
//     not stored (a publish the stream refused reaches core subscribers),
//     nothing stored and lost to its agent;
//   - no guarded call ran without an approval, and each ran with the decided
//     args (the agents' worker log);
//   - every timeout fired within 2s of its deadline;
//   - every request of a session with a remembered approval was decided by
//     that grant.
//
// Sizes and fault rates are flags (chaos.*); docs/testing.md has the commands.
func TestChaos(t *testing.T) {
	if testing.Short() {
		t.Skip("the chaos suite runs a NATS cluster and broker processes")
	}
	n := *chaosRequests
	seed := *chaosSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	logDir := *chaosLogs
	if logDir == "" {
		logDir = t.TempDir()
	} else if err := os.MkdirAll(logDir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Logf("chaos: %d requests at %.0f/s, %d replicas, seed %d, logs in %s", n, *chaosRate, *chaosReplicas, seed, logDir)

	// The topology.
	cl := clustertest.Start(t, clustertest.Config{})
	bin := itest.BrokerBinary(t)
	policyFile := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(policyFile, []byte(chaosPolicy), 0o644); err != nil {
		t.Fatal(err)
	}
	faulty := cl.Node(0) // the proxy fronts node1 for the last replica
	downNode := cl.Node(len(cl.Nodes()) - 1)
	proxy := clustertest.NewProxy(t, "faulty", faulty.ClientAddr())
	var replicas []*clustertest.Replica
	for i := range *chaosReplicas {
		url := cl.URL()
		if i == *chaosReplicas-1 {
			url = proxy.URL()
		}
		replicas = append(replicas, clustertest.NewReplica(t, clustertest.ReplicaConfig{
			Binary: bin, Name: fmt.Sprintf("replica-%d", i+1), NATSURL: url, LogDir: logDir,
			Args: []string{"--policy", policyFile, "--log-level", "info", "--log-json"},
		}))
	}
	itest.StartReplicas(t, replicas, 40)

	sdkLog, err := os.Create(filepath.Join(logDir, "test.log"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sdkLog.Close() })
	ch := &chaos{
		cluster: cl,
		log:     zap.New(zapcore.NewCore(zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig()), zapcore.Lock(zapcore.AddSync(sdkLog)), zap.InfoLevel)),
		reached: map[string]string{},
	}
	for _, r := range replicas {
		ch.apis = append(ch.apis, r.HTTP)
	}
	for i := range 8 {
		ch.conns = append(ch.conns, cl.Conn(t, nats.Name(fmt.Sprintf("chaos-agents-%d", i))))
	}
	ch.js = itest.NewJS(t, cl.Conn(t, nats.Name("chaos-checks")))

	// Approvers, restarted during the load.
	ch.approvers = []*chaosApprover{{ch: ch, principal: "alice"}, {ch: ch, principal: "bob", crash: true}}
	for _, a := range ch.approvers {
		if err := a.start(); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		for _, a := range ch.approvers {
			a.stop(false)
		}
	})

	plan := chaosPlan(n, rand.New(rand.NewPCG(seed, seed^0x5eed)))
	loadCtx := itest.TestCtx(t, 5*time.Minute+time.Duration(n)*100*time.Millisecond)

	// Faults, until the load is done.
	faultCtx, stopFaults := context.WithCancel(loadCtx)
	var faults sync.WaitGroup
	f := &chaosFaults{log: ch.log.Named("fault"), behindProxy: replicas[len(replicas)-1], probe: func() string {
		return fmt.Sprintf("%s directly: %s; through the fault proxy: %s", faulty.Name, greeting(faulty.ClientAddr()), greeting(proxy.Addr()))
	}}
	faults.Go(func() { f.killReplicas(faultCtx, replicas, *chaosKillEvery) })
	faults.Go(func() { f.stopNode(faultCtx, downNode, *chaosNodeEvery) })
	faults.Go(func() { f.disturb(faultCtx, proxy) })
	for i, a := range ch.approvers {
		faults.Go(func() { f.restartApprover(faultCtx, a, 4*time.Second, time.Duration(i)*2*time.Second) })
	}

	started := time.Now()
	ch.runLoad(loadCtx, plan)
	loadTime := time.Since(started)
	stopFaults()
	faults.Wait()

	// Heal everything, then let the brokers finish what is in flight.
	proxy.Clear()
	if err := proxy.Up(); err != nil && !strings.Contains(err.Error(), "already started") {
		t.Errorf("proxy up: %v", err)
	}
	healCtx := itest.TestCtx(t, 2*clustertest.Patience)
	if !downNode.Running() {
		if err := downNode.Restart(healCtx); err != nil {
			t.Fatal(err)
		}
	}
	for _, r := range replicas {
		if err := r.Start(healCtx); err != nil {
			t.Fatal(err)
		}
	}
	for _, err := range f.errs() {
		t.Errorf("fault injection: %v", err)
	}
	check := cl.Conn(t)
	js := itest.NewJS(t, check)
	// Redeliveries after the kills can take a few ack waits.
	itest.WaitIdleWithin(t, js, 2*time.Minute, 200*time.Millisecond, false, itest.BrokerConsumers...)

	all := plan.requests()
	counts := map[chaosKind]int{}
	retried, resent := 0, 0
	for _, r := range all {
		counts[r.kind]++
		if r.attempts > 1 {
			retried++
		}
		if r.resentCancel {
			resent++
			report := t.Logf
			if *chaosStrict {
				report = t.Errorf
			}
			report("chaos: DEFECT: request %s still pending 10s after its agent's cancel (the cancel was refused as naming no request); cancelled again", r.id)
		}
	}
	var kinds []string
	for _, k := range chaosKinds {
		kinds = append(kinds, fmt.Sprintf("%s %d", k, counts[k]))
	}
	t.Logf("chaos: load: %d requests (%s) in %s, %.1f requests/s; %d retried by their agent, %d cancels lost and sent again",
		len(all), strings.Join(kinds, ", "), loadTime.Round(100*time.Millisecond), float64(len(all))/loadTime.Seconds(), retried, resent)
	kills := 0
	for _, r := range replicas {
		_, k := r.Counts()
		kills += k
	}
	failures := int64(0)
	for _, a := range ch.approvers {
		failures += a.failures.Load()
	}
	t.Logf("chaos: faults: %d broker replica SIGKILLs and restarts, %d NATS node stops and restarts, proxy %v, %d approver restarts (%d losing their connection, %d more after a failed start)",
		kills, f.nodeStops.Load(), proxy.Counts(), f.approverRestarts.Load(), f.approverCrashes.Load(), failures)

	ch.check(t, js, all)
	checkRecord(t, js)
}

// checkRecord waits until a checkpoint of the chained record covers what
// the stream held when the load ended, and checks that the record proves
// itself: the replicas' checkpoints, each stored while others were killed,
// agree with the chain the stored messages make.
func checkRecord(t *testing.T, js jetstream.JetStream) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	s, err := js.Stream(ctx, broker.StreamName)
	if err != nil {
		t.Fatal(err)
	}
	end := s.CachedInfo().State.LastSeq
	deadline := time.Now().Add(3 * broker.DefaultCheckpointInterval)
	for {
		last, found, err := chain.LastCheckpoint(ctx, s)
		if err == nil && found && last.Seq == end && last.Checkpoint.Upto == end-1 {
			// The stream ends with a checkpoint of all before it: a
			// checkpoint never covers itself, and nothing came after.
			end--
			break
		}
		if err == nil && found && last.Checkpoint.Upto >= end {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("chaos: no checkpoint covers the stream up to %d (the last: %+v, found %v): %v", end, last.Checkpoint, found, err)
		}
		time.Sleep(500 * time.Millisecond)
	}
	r, err := chain.Verify(ctx, js, broker.StreamName, chain.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if !r.OK() || r.ProvenFrom != r.First || r.ProvenTo < end {
		t.Fatalf("chaos: the record does not prove itself: %d checkpoints, proven %d to %d of %d to %d; problems %q", r.Checkpoints, r.ProvenFrom, r.ProvenTo, r.First, r.Last, r.Problems)
	}
	t.Logf("chaos: the record proves itself: sequences %d to %d, %d checkpoints, %d decisions", r.ProvenFrom, r.ProvenTo, r.Checkpoints, r.Decisions)
}

// chaos is the load's shared state.
type chaos struct {
	cluster   *clustertest.Cluster
	conns     []*nats.Conn
	js        jetstream.JetStream // the test's own, for looking at the stream and asking the brokers
	log       *zap.Logger
	approvers []*chaosApprover
	apis      []string // the replicas' HTTP APIs

	clientsMu sync.Mutex
	clients   map[string]*handler.Client

	workerMu sync.Mutex
	worker   []execution // the worker log: every guarded call the agents ran

	reachedMu sync.Mutex
	reached   map[string]string // remembered requests that a person was asked about, by id: who
}

// execution is one guarded call an agent ran.
type execution struct {
	id   string
	args json.RawMessage
}

// chaosUnit is a request on its own, or a remembered approval followed by
// the requests of its session.
type chaosUnit struct {
	req       *chaosReq
	followers []*chaosReq
}

type chaosLoad []chaosUnit

func (l chaosLoad) requests() []*chaosReq {
	var out []*chaosReq
	for _, u := range l {
		out = append(out, u.req)
		out = append(out, u.followers...)
	}
	return out
}

// chaosPlan makes n requests in the proportions of chaosMix, in random order.
func chaosPlan(n int, rng *rand.Rand) chaosLoad {
	per := 0
	for k, w := range chaosMix {
		per += w
		if k == kindRemember {
			per += w * chaosFollowers
		}
	}
	var load chaosLoad
	made := 0
	session := 0
	mk := func(kind chaosKind, i int) *chaosReq {
		made++
		r := &chaosReq{id: events.NewID(), kind: kind, agent: fmt.Sprintf("agent-%d", i%16)}
		r.request = events.Requested{User: "carol", Timeout: events.Duration(time.Minute), Session: fmt.Sprintf("s-%d", i)}
		switch kind {
		case kindAuto:
			r.request.Tool, r.request.Args, r.request.Timeout = "read_file", fmt.Appendf(nil, `{"path":"/srv/%d"}`, i), events.Duration(30*time.Second)
		case kindApprove:
			r.request.Tool, r.request.Args = "deploy", fmt.Appendf(nil, `{"service":"svc-%d","version":"v%d"}`, i%7, i)
		case kindDeny:
			r.request.Tool, r.request.Args = "drop_table", fmt.Appendf(nil, `{"table":"t%d"}`, i)
		case kindEdit:
			r.request.Tool, r.request.Args = "transfer", fmt.Appendf(nil, `{"amount":%d,"to":"acct-%d"}`, 1000+i, i)
		case kindTimeout:
			// 2 to 4 seconds, in whole milliseconds: deadlines fall
			// anywhere within a second.
			r.request.Tool, r.request.Args = "nightly_job", fmt.Appendf(nil, `{"job":%d}`, i)
			r.request.Timeout = events.Duration(2*time.Second + time.Duration(rng.IntN(2000))*time.Millisecond)
		case kindCancel:
			r.request.Tool, r.request.Args = "long_migration", fmt.Appendf(nil, `{"step":%d}`, i)
			r.cancel = 300*time.Millisecond + time.Duration(rng.IntN(1200))*time.Millisecond
		case kindRemember, kindRemembered:
			r.request.Tool, r.request.Args = "write_file", fmt.Appendf(nil, `{"path":"/srv/out/%d","seed":%v}`, i, kind == kindRemember)
			r.request.Session = fmt.Sprintf("mem-%d", session)
		}
		return r
	}
	for made < n {
		for _, k := range chaosKinds {
			w := chaosMix[k]
			for j := 0; j < w*n/per+1 && made < n; j++ {
				switch k {
				case kindRemembered:
				case kindRemember:
					session++
					u := chaosUnit{req: mk(kindRemember, made)}
					for range chaosFollowers {
						if made < n {
							f := mk(kindRemembered, made)
							f.seed = u.req
							u.followers = append(u.followers, f)
						}
					}
					load = append(load, u)
				default:
					load = append(load, chaosUnit{req: mk(k, made)})
				}
			}
		}
	}
	rng.Shuffle(len(load), func(i, j int) { load[i], load[j] = load[j], load[i] })
	return load
}

// client returns agent's SDK client, on one of the agents' connections.
func (ch *chaos) client(agent string) *handler.Client {
	ch.clientsMu.Lock()
	defer ch.clientsMu.Unlock()
	if ch.clients == nil {
		ch.clients = map[string]*handler.Client{}
	}
	if c, ok := ch.clients[agent]; ok {
		return c
	}
	c, err := handler.NewClient(ch.conns[len(ch.clients)%len(ch.conns)], handler.Config{Agent: agent, Logger: ch.log.With(zap.String("agent", agent))})
	if err != nil {
		panic(err) // the agent names are valid
	}
	ch.clients[agent] = c
	return c
}

// runLoad starts the plan's requests at the rate asked for, at most
// chaosInFlight at once, and returns once every one has returned.
func (ch *chaos) runLoad(ctx context.Context, load chaosLoad) {
	lim := rate.NewLimiter(rate.Limit(*chaosRate), chaosFollowers+1)
	sem := make(chan struct{}, *chaosInFlight)
	var wg sync.WaitGroup
	for _, u := range load {
		if err := lim.WaitN(ctx, 1+len(u.followers)); err != nil {
			break
		}
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
		wg.Go(func() {
			defer func() { <-sem }()
			ch.run(ctx, u.req)
			if len(u.followers) == 0 {
				return
			}
			// The grant is stored before the approval is published, and
			// reaches every replica's index through its watcher.
			select {
			case <-time.After(*chaosSettle):
			case <-ctx.Done():
				return
			}
			var fw sync.WaitGroup
			for _, f := range u.followers {
				fw.Go(func() { ch.run(ctx, f) })
			}
			fw.Wait()
		})
	}
	wg.Wait()
}

// run is one agent making request r: it asks, retries with the same id
// after an error, and runs the guarded call only on an approval, with the
// decided args.
func (ch *chaos) run(ctx context.Context, r *chaosReq) {
	c := ch.client(r.agent)
	req := handler.Request{ID: r.id, Requested: r.request}
	for r.attempts < 4 && ctx.Err() == nil {
		r.attempts++
		rctx, cancel := context.WithCancel(ctx)
		var withdrawn atomic.Bool
		stop := func() bool { return false }
		if r.kind == kindCancel {
			stop = time.AfterFunc(r.cancel, func() { withdrawn.Store(true); cancel() }).Stop
		}
		d, err := c.Request(rctx, req)
		stop()
		cancel()
		switch {
		case err == nil:
			r.got, r.err = &d, nil
			if d.Approved() {
				ch.execute(r.id, d.Args)
			}
			return
		case withdrawn.Load() && ctx.Err() == nil:
			// The SDK published a cancel as the agent stopped waiting; the
			// decision is on the stream for whoever looks.
			r.err = err
			ch.awaitCancelled(ctx, c, r)
			return
		}
		r.err = err
		if ctx.Err() == nil {
			time.Sleep(500 * time.Millisecond)
		}
	}
}

// awaitCancelled reads the decision of a request its agent withdrew. The
// SDK published a cancel; if the brokers' lookup still finds the request
// pending 10s later, that cancel was lost and the agent cancels again. A request withdrawn before
// the stream acknowledged it may never have been stored: then there is
// nothing to decide.
func (ch *chaos) awaitCancelled(ctx context.Context, c *handler.Client, r *chaosReq) {
	since := time.Now()
	for ctx.Err() == nil {
		octx, cancel := context.WithTimeout(ctx, 5*time.Second)
		d, ok, err := c.Decision(octx, r.id)
		if err == nil && ok {
			cancel()
			r.got = &d
			return
		}
		if time.Since(since) > 10*time.Second {
			switch status, err := itest.LookupRequest(octx, ch.js.Conn(), r.id); {
			case err != nil:
			case status == events.LookupUnknown && !ch.stored(octx, r.agent, r.id):
				cancel()
				r.neverStored = true
				return
			case status == events.LookupPending && !r.resentCancel:
				if err := c.Cancel(octx, r.id, "agent stopped waiting (again)"); err == nil {
					r.resentCancel = true
				}
			}
		}
		cancel()
		select {
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// stored reports whether the stream holds request id of agent (or could not
// tell).
func (ch *chaos) stored(ctx context.Context, agent, id string) bool {
	s, err := ch.js.Stream(ctx, broker.StreamName)
	if err != nil {
		return true
	}
	cons, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: []string{events.RequestPrefix + agent}})
	if err != nil {
		return true
	}
	for {
		batch, err := cons.FetchNoWait(500)
		if err != nil {
			return true
		}
		got := 0
		for m := range batch.Messages() {
			got++
			if m.Headers().Get(jetstream.MsgIDHeader) == id {
				return true
			}
		}
		if batch.Error() != nil {
			return true
		}
		if got == 0 {
			return false
		}
	}
}

// execute writes a guarded call to the worker log.
func (ch *chaos) execute(id string, args json.RawMessage) {
	ch.workerMu.Lock()
	defer ch.workerMu.Unlock()
	ch.worker = append(ch.worker, execution{id: id, args: args})
}

// answer is the approvers' handler (both run it): what a person would do
// with each tool.
func (ch *chaos) answer(principal string) handler.Handler {
	return func(ctx context.Context, req handler.Request) (handler.Response, error) {
		select { // a person reads the request
		case <-time.After(time.Duration(rand.IntN(50)) * time.Millisecond):
		case <-ctx.Done():
			return handler.Response{}, ctx.Err()
		}
		switch req.Tool {
		case "deploy":
			return handler.Response{Decision: events.Approve, Reason: "ship it"}, nil
		case "drop_table":
			return handler.Response{Decision: events.Deny, Reason: "not without a backup"}, nil
		case "transfer":
			return handler.Response{Decision: events.Approve, Reason: "capped", Args: chaosEdit(req.Args)}, nil
		case "write_file":
			var a struct {
				Seed bool `json:"seed"`
			}
			_ = json.Unmarshal(req.Args, &a)
			if a.Seed {
				return handler.Response{Decision: events.Approve, Reason: "fine for this session",
					Remember: &events.Remember{Scope: events.ScopeSession, TTL: events.Duration(time.Hour)}}, nil
			}
			// A later request of a remembered session should never get
			// here; note it and approve, so it does not hang.
			ch.reachedMu.Lock()
			ch.reached[req.ID] = principal
			ch.reachedMu.Unlock()
			return handler.Response{Decision: events.Approve, Reason: "asked again"}, nil
		}
		return handler.Response{}, handler.ErrSkip // nightly_job, long_migration: nobody answers
	}
}

// chaosApprover is one principal's approver runtime, restarted during the
// load: cleanly, or (crash) by losing its connection first, so that what it
// held comes back to its next run only after the consumer's ack wait.
type chaosApprover struct {
	ch        *chaos
	principal string
	crash     bool

	failures atomic.Int64 // runs that failed and were started again

	mu     sync.Mutex
	nc     *nats.Conn
	cancel context.CancelFunc
	done   chan error
}

// start runs the approver's runtime on a connection of its own until stop.
// A runtime that fails (its consumer cannot be made while JetStream elects
// a leader, say) is started again, as a supervisor would.
func (a *chaosApprover) start() error {
	nc, err := nats.Connect(a.ch.cluster.URL(), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond), nats.Name("chaos-approver-"+a.principal))
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		for {
			ap, err := handler.NewApprover(nc, handler.ApproverConfig{
				Principal: a.principal, Channel: "sdk", Durable: "approver-" + a.principal, Concurrency: 64,
				Logger: a.ch.log.With(zap.String("approver", a.principal)),
			}, a.ch.answer(a.principal))
			if err != nil {
				done <- err
				return
			}
			err = ap.Run(ctx)
			if ctx.Err() != nil {
				done <- err
				return
			}
			a.failures.Add(1)
			a.ch.log.Warn("approver runtime failed; starting it again", zap.String("approver", a.principal), zap.Error(err))
			sleep(ctx, 500*time.Millisecond)
		}
	}()
	a.mu.Lock()
	a.nc, a.cancel, a.done = nc, cancel, done
	a.mu.Unlock()
	return nil
}

// stop stops the runtime and waits for it; with crash, its connection is
// closed under it first.
func (a *chaosApprover) stop(crash bool) error {
	a.mu.Lock()
	nc, cancel, done := a.nc, a.cancel, a.done
	a.nc, a.cancel, a.done = nil, nil, nil
	a.mu.Unlock()
	if nc == nil {
		return nil
	}
	if crash {
		nc.Close()
	}
	cancel()
	var err error
	select {
	case err = <-done:
	case <-time.After(clustertest.Patience):
		err = fmt.Errorf("approver %s: Run did not return %s after its context ended", a.principal, clustertest.Patience)
	}
	nc.Close()
	if crash || errors.Is(err, context.Canceled) {
		return nil // Run may report the closed connection, or a start cut short
	}
	return err
}

// chaosFaults injects the faults and counts them.
type chaosFaults struct {
	log *zap.Logger // when each fault began and ended
	// behindProxy is the replica that reaches the cluster through the
	// fault proxy, and probe says how its node answers, directly and
	// through the proxy, when that replica does not get ready.
	behindProxy *clustertest.Replica
	probe       func() string

	nodeStops        atomic.Int64
	approverRestarts atomic.Int64
	approverCrashes  atomic.Int64

	mu     sync.Mutex
	failed []error
}

func (f *chaosFaults) fail(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failed = append(f.failed, err)
}

func (f *chaosFaults) errs() []error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.failed)
}

// sleep waits d or until ctx ends, and reports whether ctx is still on.
func sleep(ctx context.Context, d time.Duration) bool {
	select {
	case <-ctx.Done():
		return false
	case <-time.After(d):
		return true
	}
}

// killReplicas SIGKILLs a replica every period, rotating, and starts it
// again at once.
func (f *chaosFaults) killReplicas(ctx context.Context, replicas []*clustertest.Replica, every time.Duration) {
	for i := 0; sleep(ctx, every); i++ {
		r := replicas[i%len(replicas)]
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), clustertest.Patience)
		f.log.Info("kill replica", zap.String("replica", r.Name))
		if err := r.Restart(rctx); err != nil {
			if r == f.behindProxy && f.probe != nil {
				err = fmt.Errorf("%w\n%s", err, f.probe())
			}
			f.fail(err)
		}
		f.log.Info("replica ready", zap.String("replica", r.Name))
		cancel()
	}
}

// stopNode stops node 5s into the load and every period after, for 5s each
// time, and restarts it on its ports and store.
func (f *chaosFaults) stopNode(ctx context.Context, node *clustertest.Node, every time.Duration) {
	wait := 5 * time.Second
	for sleep(ctx, wait) {
		f.log.Info("stop node", zap.String("node", node.Name))
		node.Stop()
		f.nodeStops.Add(1)
		sleep(ctx, 5*time.Second)
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), clustertest.Patience)
		f.log.Info("restart node", zap.String("node", node.Name))
		if err := node.Restart(rctx); err != nil {
			f.fail(err)
		}
		f.log.Info("cluster formed", zap.String("node", node.Name))
		cancel()
		wait = every
	}
}

// greeting says how the NATS server at addr answers a new connection: it
// sends its INFO line first, at once.
func greeting(addr string) string {
	start := time.Now()
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		return fmt.Sprintf("no connection: %v", err)
	}
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	took := time.Since(start).Round(time.Millisecond)
	switch {
	case err != nil:
		return fmt.Sprintf("connected, no INFO after %s (%v)", took, err)
	case !strings.HasPrefix(line, "INFO "):
		return fmt.Sprintf("connected, %.40q instead of INFO", line)
	}
	return fmt.Sprintf("INFO after %s", took)
}

// disturb cycles the proxy through its faults, with calm in between: 3s of
// latency, traffic dropped until the connections are closed 1.5s later,
// connections cut for 1s, the node gone for 1s.
func (f *chaosFaults) disturb(ctx context.Context, proxy *clustertest.Proxy) {
	steps := []struct {
		hold   time.Duration
		inject func() error
	}{
		{3 * time.Second, func() error { return proxy.Latency(80, 40) }},
		{1500 * time.Millisecond, func() error { return proxy.Drop(1500 * time.Millisecond) }},
		{time.Second, proxy.Cut},
		{time.Second, func() error { proxy.Down(); return nil }},
	}
	for i := 0; sleep(ctx, 2*time.Second); i++ {
		s := steps[i%len(steps)]
		f.log.Info("proxy fault", zap.Int("step", i%len(steps)))
		if err := s.inject(); err != nil {
			f.fail(err)
		}
		sleep(ctx, s.hold)
		f.log.Info("proxy clear")
		proxy.Clear()
		if err := proxy.Up(); err != nil && !strings.Contains(err.Error(), "already started") {
			f.fail(fmt.Errorf("proxy up: %w", err))
		}
	}
}

// restartApprover restarts a's runtime every period, after offset.
func (f *chaosFaults) restartApprover(ctx context.Context, a *chaosApprover, every, offset time.Duration) {
	if !sleep(ctx, offset) {
		return
	}
	for sleep(ctx, every) {
		if err := a.stop(a.crash); err != nil {
			f.fail(err)
		}
		if a.crash {
			f.approverCrashes.Add(1)
		}
		sleep(ctx, 300*time.Millisecond)
		if err := a.start(); err != nil {
			f.fail(fmt.Errorf("restart approver %s: %w", a.principal, err))
		}
		f.approverRestarts.Add(1)
	}
}

// streamDecision is a request's decision subject as the stream holds it.
type streamDecision struct {
	first events.Decided // the decision: the first message on the subject
	count int            // messages on the subject
	// differ counts the messages after the first that are not the same
	// decided event's data; other is the first of them.
	differ int
	other  *events.Decided
}

// readDecisions reads every message on assent.decision.* (readStored).
func readDecisions(t *testing.T, js jetstream.JetStream) map[string]*streamDecision {
	t.Helper()
	var out map[string]*streamDecision
	readStored(t, js, "the decisions", events.DecisionPrefix+"*", func() func(jetstream.Msg) error {
		out = map[string]*streamDecision{}
		return func(m jetstream.Msg) error {
			id := strings.TrimPrefix(m.Subject(), events.DecisionPrefix)
			sd := out[id]
			if sd == nil {
				sd = &streamDecision{}
				out[id] = sd
			}
			sd.count++
			d, err := decodeDecided(m)
			if sd.count == 1 {
				sd.first = d
				return err
			}
			// A message after the first is never the decision; one that
			// says something else is a request decided twice differently.
			if err != nil || !sameDecided(d, sd.first) {
				sd.differ++
				if sd.other == nil {
					sd.other = &d
				}
			}
			return nil
		}
	})
	return out
}

func decodeDecided(m jetstream.Msg) (events.Decided, error) {
	e, err := events.Codec{MaxSize: 2 << 20}.Decode(events.Header(m.Headers()), m.Data())
	if err != nil {
		return events.Decided{}, fmt.Errorf("%s: %w", m.Subject(), err)
	}
	d, err := events.DecodeDecided(&e)
	if err != nil {
		return events.Decided{}, fmt.Errorf("%s: %w", m.Subject(), err)
	}
	return d, nil
}

// sameDecided reports whether a and b are the same decided event's data.
func sameDecided(a, b events.Decided) bool {
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	return string(ja) == string(jb)
}

// chaosPending is a request's pending event as the stream holds it.
type chaosPending struct {
	deadline time.Time
	by       string    // the broker that announced it
	at       time.Time // when the stream stored it
}

// readPendings reads every pending event on assent.pending.* (readStored),
// the first for each request.
func readPendings(t *testing.T, js jetstream.JetStream) map[string]chaosPending {
	t.Helper()
	var out map[string]chaosPending
	readStored(t, js, "the pending events", events.PendingPrefix+"*", func() func(jetstream.Msg) error {
		out = map[string]chaosPending{}
		return func(m jetstream.Msg) error {
			e, err := events.Decode(events.Header(m.Headers()), m.Data())
			if err != nil {
				return fmt.Errorf("%s: %w", m.Subject(), err)
			}
			if e.Type() != events.TypePending {
				return nil // escalated, on the same subject
			}
			p, err := events.DecodePending(&e)
			if err != nil {
				return fmt.Errorf("%s: %w", m.Subject(), err)
			}
			if _, ok := out[p.RequestID]; !ok {
				md, _ := m.Metadata()
				out[p.RequestID] = chaosPending{deadline: p.Deadline, by: e.Source(), at: md.Timestamp}
			}
			return nil
		}
	})
	return out
}

// deadlineOf asks the replicas' HTTP APIs for request id's deadline, for a
// request with no pending event; ok is false if none knows it.
func (ch *chaos) deadlineOf(id string) (chaosPending, bool) {
	for _, api := range ch.apis {
		ctx, cancel := itest.OpCtx()
		r, err := itest.DoHTTP(ctx, http.MethodGet, api+"/v1/approvals/"+id, nil)
		cancel()
		if err != nil || r.Status != http.StatusOK {
			continue
		}
		var a httpapi.Approval
		if err := json.Unmarshal(r.Body, &a); err != nil || a.Deadline.IsZero() {
			continue
		}
		return chaosPending{deadline: a.Deadline, by: "(none: expired when judged)"}, true
	}
	return chaosPending{}, false
}

// readStored reads every message on the subjects filter matches, with an
// ordered consumer, and checks the per-subject counts against the stream's
// own. start is called before each attempt and returns what to do with each
// message. A read that fails (a node that just came back, a leader just
// elected) is tried again from the start.
func readStored(t *testing.T, js jetstream.JetStream, what, filter string, start func() func(jetstream.Msg) error) {
	t.Helper()
	var err error
	for attempt := 1; attempt <= 5; attempt++ {
		if err = tryReadStored(js, filter, start()); err == nil {
			return
		}
		t.Logf("chaos: read %s (attempt %d): %v", what, attempt, err)
		time.Sleep(2 * time.Second)
	}
	t.Fatalf("read %s: %v", what, err)
}

func tryReadStored(js jetstream.JetStream, filter string, each func(jetstream.Msg) error) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	s, err := js.Stream(ctx, broker.StreamName)
	if err != nil {
		return err
	}
	info, err := s.Info(ctx, jetstream.WithSubjectFilter(filter))
	if err != nil {
		return err
	}
	total := uint64(0)
	for _, c := range info.State.Subjects {
		total += c
	}
	cons, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: []string{filter}})
	if err != nil {
		return err
	}
	counts := map[string]uint64{}
	read := uint64(0)
	for read < total {
		batch, err := cons.Fetch(1000, jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			return fmt.Errorf("fetch: %w", err)
		}
		got := 0
		for m := range batch.Messages() {
			got++
			read++
			counts[m.Subject()]++
			if err := each(m); err != nil {
				return err
			}
		}
		if err := batch.Error(); err != nil {
			return fmt.Errorf("fetch: %w", err)
		}
		if got == 0 {
			return fmt.Errorf("read %d of %d messages on %s, then nothing", read, total, filter)
		}
	}
	for subj, c := range info.State.Subjects {
		if counts[subj] != c {
			return fmt.Errorf("stream info counts %d messages on %s, the consumer read %d", c, subj, counts[subj])
		}
	}
	return nil
}

// leaderDecisions reads the decision of each request, the first message on
// its subject, from the stream's leader (itest.LeaderDecision), eight at a
// time, trying each again while a read fails. A request the stream holds no
// decision for has none in the map.
func leaderDecisions(t *testing.T, nc *nats.Conn, all []*chaosReq) map[string]events.Decided {
	t.Helper()
	out := make([]*events.Decided, len(all))
	errs := make([]error, len(all))
	var next atomic.Int64
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= len(all) {
					return
				}
				for attempt := 1; attempt <= 5; attempt++ {
					ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					d, ok, err := itest.LeaderDecision(ctx, nc, all[i].id)
					cancel()
					if errs[i] = err; err == nil {
						if ok {
							out[i] = &d
						}
						break
					}
					time.Sleep(time.Second)
				}
			}
		})
	}
	wg.Wait()
	firsts := map[string]events.Decided{}
	for i, r := range all {
		if errs[i] != nil {
			t.Fatalf("read the decision of %s from the stream's leader: %v", r.id, errs[i])
		}
		if out[i] != nil {
			firsts[r.id] = *out[i]
		}
	}
	return firsts
}

// check runs the suite's checks over the stream and the agents' worker log,
// printing one line per check.
func (ch *chaos) check(t *testing.T, js jetstream.JetStream, all []*chaosReq) {
	t.Helper()
	stream := readDecisions(t, js)
	// What the stream's leader holds first on each request's subject: the
	// decision, which every agent must have acted on.
	firsts := leaderDecisions(t, js.Conn(), all)
	byID := map[string]*chaosReq{}
	for _, r := range all {
		byID[r.id] = r
	}

	// 1. Exactly one decision per request, and none decided twice
	// differently (every message of every decision subject).
	none, many, differently, strangers, withdrawn, diverged := 0, 0, 0, 0, 0, 0
	for _, r := range all {
		sd := stream[r.id]
		switch {
		case sd == nil && r.neverStored && !ch.stored(context.Background(), r.agent, r.id):
			withdrawn++ // no request, so no decision
		case sd == nil:
			none++
			t.Errorf("request %s (%s): no decision on the stream; agent: %v after %d attempts", r.id, r.kind, r.err, r.attempts)
		case sd.count > 1:
			many++
			t.Errorf("request %s (%s): %d decisions on the stream", r.id, r.kind, sd.count)
		}
		if sd != nil && sd.differ > 0 {
			differently++
			a, _ := json.Marshal(sd.first)
			b, _ := json.Marshal(sd.other)
			t.Errorf("request %s (%s): decided twice differently: %d of the %d messages on its subject differ from the first, %s; one says %s", r.id, r.kind, sd.differ, sd.count, a, b)
		}
		if d, ok := firsts[r.id]; ok != (sd != nil) || ok && !sameDecided(d, sd.first) {
			diverged++
			t.Errorf("request %s (%s): the stream's leader holds %+v first on its decision subject, a consumer of the stream read %+v", r.id, r.kind, d, sdFirst(sd))
		}
	}
	for id := range stream {
		if byID[id] == nil {
			strangers++
			t.Errorf("a decision for %s, which no agent asked for", id)
		}
	}
	t.Logf("chaos: check exactly one decision: %d requests, %d decision subjects; %d without a decision, %d with more than one, %d decided twice differently, %d unknown, %d read otherwise from the stream's leader; %d withdrawn by their agent before the stream stored them (neither request nor decision stored)",
		len(all), len(stream), none, many, differently, strangers, diverged, withdrawn)

	// 2. Every decision an agent acted on is the first stored message of its
	// subject (a decision seen and not stored is one the stream refused or
	// lost), and none stored is lost to its agent.
	received, lost, notStored := 0, 0, 0
	for _, r := range all {
		d, stored := firsts[r.id]
		switch {
		case r.got == nil && stored:
			lost++
			t.Errorf("request %s (%s): the stream holds %s, the agent received nothing (%d attempts, last error %v)", r.id, r.kind, d.Outcome, r.attempts, r.err)
		case r.got == nil:
		case !stored:
			notStored++
			a, _ := json.Marshal(r.got)
			t.Errorf("request %s (%s): seen by its agent and not stored: the agent received %s, the stream holds no decision", r.id, r.kind, a)
		case !sameDecided(*r.got, d):
			notStored++
			a, _ := json.Marshal(r.got)
			b, _ := json.Marshal(d)
			t.Errorf("request %s (%s): seen by its agent and not stored: the agent received %s, the stream holds %s first", r.id, r.kind, a, b)
		default:
			received++
		}
	}
	t.Logf("chaos: check no decision lost or changed: %d received by their agents, equal to the first stored message of their subject (read from the stream's leader); %d lost, %d seen by an agent and not stored", received, lost, notStored)

	// 3. No guarded call without approval: every call an agent ran was
	// approved, with those args, by the stored decision.
	ch.workerMu.Lock()
	worker := slices.Clone(ch.worker)
	ch.workerMu.Unlock()
	ran := map[string]int{}
	unapproved := 0
	for _, x := range worker {
		ran[x.id]++
		d, stored := firsts[x.id]
		switch {
		case !stored || d.Outcome != events.Approved:
			unapproved++
			t.Errorf("guarded call %s ran, but its decision is %+v (stored: %v)", x.id, d, stored)
		case !itest.SameJSON(x.args, d.Args):
			unapproved++
			t.Errorf("guarded call %s ran with %s, the approval says %s", x.id, x.args, d.Args)
		}
	}
	approvedNotRun := 0
	for _, r := range all {
		if d, stored := firsts[r.id]; stored && d.Outcome == events.Approved && r.got != nil && ran[r.id] != 1 {
			approvedNotRun++
			t.Errorf("request %s (%s) approved and received, run %d times", r.id, r.kind, ran[r.id])
		}
	}
	t.Logf("chaos: check no guarded call without approval: %d guarded calls ran, each once and with the approved args; %d without an approval, %d approved calls not run once", len(worker), unapproved, approvedNotRun)

	// 4. Every timeout fired within 2s of its deadline, the one its pending
	// event announced.
	pendings := readPendings(t, js)
	var lateness []time.Duration
	late, atIngest := 0, 0
	for _, r := range all {
		sd := stream[r.id]
		if sd == nil || sd.first.Outcome != events.Expired {
			continue
		}
		p, ok := pendings[r.id]
		if !ok && strings.HasPrefix(sd.first.Reason, "deadline passed before") {
			// Its deadline passed before a broker judged it (a replica
			// killed meanwhile): expired at once, with no pending event.
			// The brokers know the deadline they found passed.
			atIngest++
			p, ok = ch.deadlineOf(r.id)
		}
		if !ok {
			t.Errorf("request %s (%s) expired (%q) with no pending event on the stream", r.id, r.kind, sd.first.Reason)
			continue
		}
		l := sd.first.DecidedAt.Sub(p.deadline)
		lateness = append(lateness, l)
		if l < 0 || l > 2*time.Second {
			late++
			report := t.Logf
			if *chaosStrict || l < 0 || l > chaosLateBound {
				report = t.Errorf
			}
			report("chaos: DEFECT: request %s (%s), announced by %s, expired %s after its deadline %s", r.id, r.kind, p.by, l.Round(time.Millisecond), p.deadline.Format(time.RFC3339Nano))
		}
	}
	sort.Slice(lateness, func(i, j int) bool { return lateness[i] < lateness[j] })
	t.Logf("chaos: check timeouts within 2s of the deadline: %d expired (%d when a broker first judged them, past their deadline); lateness p50 %s, p99 %s, max %s; %d outside [0, 2s] (DEFECT lines above; fatal unless -chaos.strict=false, and then past 15s)",
		len(lateness), atIngest, itest.Quantile(lateness, 0.5), itest.Quantile(lateness, 0.99), itest.Quantile(lateness, 1), late)

	// 5. Every remembered choice honoured.
	grants := readGrants(t, js)
	followers, honoured, notHonoured, unseeded := 0, 0, 0, 0
	for _, r := range all {
		if r.kind != kindRemembered {
			continue
		}
		followers++
		seed := stream[r.seed.id]
		if seed == nil || seed.first.Outcome != events.Approved {
			unseeded++ // its session's approval was not given: nothing to honour
			continue
		}
		sd := stream[r.id]
		gid, ok := strings.CutPrefix(sdRule(sd), "remembered:")
		gr, found := grants[gid]
		if ok && found && sd.first.Auto && sd.first.Outcome == events.Approved && gr.RequestID == r.seed.id && gr.ScopeValue == r.request.Session {
			honoured++
			continue
		}
		notHonoured++
		ch.reachedMu.Lock()
		who := ch.reached[r.id]
		ch.reachedMu.Unlock()
		by, at := "(no pending event)", time.Time{}
		if p, ok := pendings[r.id]; ok {
			by, at = p.by, p.at
		}
		d, _ := json.Marshal(sdFirst(sd))
		report := t.Logf
		if *chaosStrict {
			report = t.Errorf
		}
		report("chaos: DEFECT: request %s of session %s was not decided by the grant of %s (approved at %s, grant %+v): %s announced it as pending at %s, and %q answered: %s",
			r.id, r.request.Session, r.seed.id, seed.first.DecidedAt.Format(time.RFC3339Nano), grants[grantOf(grants, r.seed.id)], by, at.Format(time.RFC3339Nano), who, d)
	}
	t.Logf("chaos: check remembered choices honoured: %d requests of %d remembered sessions, %d decided by their session's grant, %d not (DEFECT lines above; fatal unless -chaos.strict=false); %d whose session's approval was not given",
		followers, len(grants), honoured, notHonoured, unseeded)

	// Outcomes by kind, which must be what the kind makes.
	type key struct {
		kind    chaosKind
		outcome events.Outcome
	}
	byKind := map[key]int{}
	wrong := 0
	for _, r := range all {
		sd := stream[r.id]
		if sd == nil {
			continue
		}
		d := sd.first
		byKind[key{r.kind, d.Outcome}]++
		if why := chaosExpect(r, d); why != "" {
			wrong++
			t.Errorf("request %s (%s): %s: %+v", r.id, r.kind, why, d)
		}
	}
	var parts []string
	for _, k := range chaosKinds {
		for _, o := range []events.Outcome{events.Approved, events.Denied, events.Expired, events.Cancelled} {
			if c := byKind[key{k, o}]; c > 0 {
				parts = append(parts, fmt.Sprintf("%s→%s %d", k, o, c))
			}
		}
	}
	t.Logf("chaos: decisions by kind: %s; %d not what the kind makes", strings.Join(parts, ", "), wrong)
}

// chaosExpect says what is wrong with decision d of r for its kind, or "".
func chaosExpect(r *chaosReq, d events.Decided) string {
	human := len(d.DecidedBy) > 0 && !d.Auto
	switch r.kind {
	case kindAuto:
		if d.Outcome != events.Approved || !d.Auto || d.Rule != "auto-read" {
			return "want approved by rule auto-read"
		}
	case kindApprove, kindRemember:
		if d.Outcome != events.Approved || !human || d.Edited {
			return "want approved by a person, unedited"
		}
	case kindDeny:
		if d.Outcome != events.Denied || !human {
			return "want denied by a person"
		}
	case kindEdit:
		if d.Outcome != events.Approved || !human || !d.Edited || !itest.SameJSON(d.Args, chaosEdit(r.request.Args)) {
			return "want approved by a person with the edited args"
		}
	case kindTimeout:
		if d.Outcome != events.Expired {
			return "want expired"
		}
	case kindCancel:
		if d.Outcome != events.Cancelled {
			return "want cancelled"
		}
	case kindRemembered:
		if d.Outcome != events.Approved {
			return "want approved"
		}
	}
	return ""
}

func sdRule(sd *streamDecision) string {
	if sd == nil {
		return ""
	}
	return sd.first.Rule
}

func sdFirst(sd *streamDecision) any {
	if sd == nil {
		return nil
	}
	return sd.first
}

// grantOf returns the id of the grant that request id's answer made.
func grantOf(grants map[string]policy.Grant, id string) string {
	for gid, g := range grants {
		if g.RequestID == id {
			return gid
		}
	}
	return ""
}

// readGrants reads every remembered choice in the bucket, by grant id.
func readGrants(t *testing.T, js jetstream.JetStream) map[string]policy.Grant {
	t.Helper()
	return retrying(t, "remembered choices", func() (map[string]policy.Grant, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		kv, err := js.KeyValue(ctx, broker.GrantBucket)
		if err != nil {
			return nil, err
		}
		out := map[string]policy.Grant{}
		keys, err := kv.ListKeys(ctx)
		if err != nil {
			return nil, err
		}
		for k := range keys.Keys() {
			e, err := kv.Get(ctx, k)
			if errors.Is(err, jetstream.ErrKeyNotFound) {
				continue
			}
			if err != nil {
				return nil, err
			}
			var g policy.Grant
			if err := json.Unmarshal(e.Value(), &g); err != nil {
				return nil, fmt.Errorf("grant %s: %w", k, err)
			}
			out[g.ID] = g
		}
		return out, nil
	})
}

// retrying calls f until it succeeds, five times at most: a read right
// after the faults may meet a node that just came back or a leader just
// elected.
func retrying[T any](t *testing.T, what string, f func() (T, error)) T {
	t.Helper()
	var err error
	for attempt := 1; attempt <= 5; attempt++ {
		var v T
		if v, err = f(); err == nil {
			return v
		}
		t.Logf("chaos: %s (attempt %d): %v", what, attempt, err)
		time.Sleep(2 * time.Second)
	}
	t.Fatalf("%s: %v", what, err)
	var zero T
	return zero
}

// TestChaosGreeting: the probe of a replica that does not get ready tells
// a server that greets from an address nothing listens on, and from one
// that accepts and says nothing.
func TestChaosGreeting(t *testing.T) {
	s := testenv.Server(t)
	if got := greeting(strings.TrimPrefix(s.ClientURL(), "nats://")); !strings.HasPrefix(got, "INFO after ") {
		t.Errorf("a NATS server: %s", got)
	}
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := silent.Addr().String()
	if got := greeting(addr); !strings.HasPrefix(got, "connected, no INFO after ") {
		t.Errorf("a listener that never answers: %s", got)
	}
	silent.Close()
	if got := greeting(addr); !strings.HasPrefix(got, "no connection: ") {
		t.Errorf("nothing listening: %s", got)
	}
}
