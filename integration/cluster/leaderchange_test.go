package cluster

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/assent-dev/assent/integration/itest"
	"github.com/assent-dev/assent/internal/broker"
	"github.com/assent-dev/assent/internal/clustertest"
	"github.com/assent-dev/assent/pkg/events"
)

var (
	leaderChangeN         = flag.Int("leaderchange.n", defaultLeaderChangeN, "TestDecisionAcrossLeaderChange: decision subjects written in each phase (step-downs, then kills)")
	leaderChangeStepDowns = flag.Int("leaderchange.stepdowns", defaultLeaderChangeStepDowns, "TestDecisionAcrossLeaderChange: how often the stream's leader is asked to step down in the first phase")
	leaderChangeKills     = flag.Int("leaderchange.kills", defaultLeaderChangeKills, "TestDecisionAcrossLeaderChange: how often the node leading the stream is SIGKILLed and restarted in the second phase")
	leaderChangeInFlight  = flag.Int("leaderchange.inflight", 256, "TestDecisionAcrossLeaderChange: subjects being written at once, at most")
)

const (
	// lcCall is the deadline of every call to the server: one write
	// attempt, one get, one stream info, one step-down request.
	lcCall = 2 * time.Second
	// lcStepDownEvery is how long the first phase waits at least between
	// two step-downs of the stream's leader.
	lcStepDownEvery = 300 * time.Millisecond
	// lcRetryPause is how long a writer waits before trying a failed
	// attempt again.
	lcRetryPause = 100 * time.Millisecond
)

// TestDecisionAcrossLeaderChange races two conditional writes per decision
// subject across leader changes of the ASSENT stream, the case
// docs/stream-decides.md (section 1, "to measure") could not settle by
// reading nats-server: can a new leader accept an expected-sequence-0 write
// while an earlier write to the subject, proposed by the old leader, is in
// its log but not applied?
//
// A three-node cluster of nats-server processes holds the stream exactly as
// the broker creates it (R3, with the RePublish of assent.decision.* to
// assent-decided.*); no broker runs. Two writers, connected to two different
// nodes, each publish their own message on every subject with
// Nats-Expected-Last-Subject-Sequence 0, many subjects at a time, trying
// again after any failure but a "wrong last sequence" refusal. Meanwhile:
//
//   - phase 1: the stream's leader is asked to step down, 300ms apart at
//     least, each time with writes in flight (-leaderchange.stepdowns
//     times);
//   - phase 2: the node leading the stream is SIGKILLed with writes in
//     flight, and restarted once the others have elected a new leader
//     (-leaderchange.kills times).
//
// A plain subscriber on assent-decided.> (on the third node, which is never
// killed) records what the server republishes. Afterwards every subject
// must hold exactly one message (read from the leader: the first by subject,
// then no next), every republished message with Nats-Last-Sequence 0 must
// be that message, every acknowledged write must be it, and the three
// replicas must hold the same messages. Counts (step-downs, kills, acks,
// refusals, retried errors, republished messages, stored decisions never
// republished, writes stored without their acknowledgement) are logged.
func TestDecisionAcrossLeaderChange(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a NATS cluster of nats-server processes")
	}
	n, stepDowns, kills, inflight := *leaderChangeN, *leaderChangeStepDowns, *leaderChangeKills, *leaderChangeInFlight
	if n < 1 || stepDowns < 1 || kills < 1 || inflight < 1 {
		t.Fatalf("-leaderchange.n (%d), -leaderchange.stepdowns (%d), -leaderchange.kills (%d) and -leaderchange.inflight (%d) must be positive", n, stepDowns, kills, inflight)
	}
	started := time.Now()
	cl := clustertest.Start(t, clustertest.Config{Binary: clustertest.BuildNATSServer(t)})
	nc := cl.Conn(t, nats.Name("leaderchange-control"))
	lc := &leaderChange{
		t:        t,
		f:        &failover{t: t, cl: cl, nc: nc, js: itest.NewJS(t, nc)},
		listener: cl.Node(2),
	}
	ctx, cancel := context.WithCancel(context.Background())
	// Cleanups run last registered first: the writes end before the
	// cluster stops.
	t.Cleanup(func() {
		cancel()
		lc.writes.Wait()
	})

	itest.PollEvery(t, clustertest.Patience, 100*time.Millisecond, func() (bool, string) {
		cctx, cancel := context.WithTimeout(ctx, lcCall)
		defer cancel()
		_, err := lc.f.js.CreateOrUpdateStream(cctx, broker.StreamConfig(broker.Config{Replicas: 3}))
		if err != nil {
			return false, fmt.Sprintf("create stream %s: %v", broker.StreamName, err)
		}
		return true, ""
	})
	lc.awaitCurrent(ctx)
	lc.rec = startRecorder(t, lc.listener)
	for i, node := range cl.Nodes()[:2] {
		lc.writers[i] = newLCWriter(t, string(rune('A'+i)), node)
	}
	t.Logf("leaderchange: %d subjects per phase, %d at a time, writers A on %s and B on %s, republish subscriber on %s (%s to set up)",
		n, inflight, cl.Node(0).Name, cl.Node(1).Name, lc.listener.Name, time.Since(started).Round(time.Millisecond))

	steps := lc.newPhase("step-downs", "s", n)
	lc.start(ctx, steps, inflight)
	lc.stepDowns(ctx, steps, stepDowns, inflight)
	lc.awaitCurrent(ctx)

	crashes := lc.newPhase("kills", "k", n)
	lc.start(ctx, crashes, inflight)
	lc.crashes(ctx, crashes, kills, inflight)

	lc.verify(ctx, steps, crashes)
	t.Logf("leaderchange: done in %s", time.Since(started).Round(time.Millisecond))
}

// leaderChange runs TestDecisionAcrossLeaderChange.
type leaderChange struct {
	t        *testing.T
	f        *failover // the stream's leader, its node: as TestChaosFailover finds them
	listener *clustertest.Node
	rec      *recorder
	writers  [2]*lcWriter
	writes   sync.WaitGroup // every phase's writes
}

// lcPhase is the writes of one phase: n subjects, two writes each.
type lcPhase struct {
	name   string
	prefix string // of its request ids
	n      int
	// writes holds each subject's outcome, by writer; read once done is
	// closed.
	writes     [][2]lcWrite
	dispatched atomic.Int64 // subjects whose writes started
	// limits raises how many subjects may start: the second phase holds
	// the writes back until the cluster is whole again.
	limits chan int
	done   chan struct{}

	// What disturbed it.
	stepDowns, stepDownsRefused, stepDownsUnanswered int
	kills                                            int
	killLog                                          []string
}

func (lc *leaderChange) newPhase(name, prefix string, n int) *lcPhase {
	return &lcPhase{
		name: name, prefix: prefix, n: n,
		writes: make([][2]lcWrite, n),
		limits: make(chan int, 64),
		done:   make(chan struct{}),
	}
}

func (p *lcPhase) id(i int) string { return fmt.Sprintf("%s-%07d", p.prefix, i) }

// start begins the phase's writes in the background: subject after
// subject, inflight of them at a time, as far as limits allow. done is
// closed once every write ended.
func (lc *leaderChange) start(ctx context.Context, p *lcPhase, inflight int) {
	lc.writes.Go(func() {
		defer close(p.done)
		var subjects sync.WaitGroup
		defer subjects.Wait()
		sem := make(chan struct{}, inflight)
		limit := 0
		for i := range p.n {
			for i >= limit {
				select {
				case limit = <-p.limits:
				case <-ctx.Done():
					return
				}
			}
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				return
			}
			p.dispatched.Add(1)
			id := p.id(i)
			subjects.Go(func() {
				defer func() { <-sem }()
				var both sync.WaitGroup
				for w, wr := range lc.writers {
					both.Go(func() { p.writes[i][w] = wr.write(ctx, id) })
				}
				both.Wait()
			})
		}
	})
}

// stepDowns asks the stream's leader to step down times times, at least
// lcStepDownEvery apart, each while writes are in flight: the phase's
// subjects are let through in as many parts, and each step-down comes once
// inflight subjects of its part (or all of them) are under way.
func (lc *leaderChange) stepDowns(ctx context.Context, p *lcPhase, times, inflight int) {
	var last time.Time
	for j := 1; j <= times; j++ {
		time.Sleep(time.Until(last.Add(lcStepDownEvery)))
		from, limit := (j-1)*p.n/times, j*p.n/times
		p.limits <- limit
		lc.awaitStarted(p, min(from+inflight, limit), fmt.Sprintf("step-down %d", j))
		last = time.Now()
		ok, why := lc.stepDown(ctx, "")
		switch {
		case ok:
			p.stepDowns++
		case why == "":
			p.stepDownsUnanswered++
		default:
			p.stepDownsRefused++
		}
	}
	<-p.done
	lc.checkDone(ctx, p)
}

// awaitStarted waits until the writes of n subjects of the phase started.
func (lc *leaderChange) awaitStarted(p *lcPhase, n int, before string) {
	for p.dispatched.Load() < int64(n) {
		select {
		case <-p.done:
			lc.t.Fatalf("leaderchange: the writes of phase %s ended before %s", p.name, before)
		case <-time.After(time.Millisecond):
		}
	}
}

// crashes SIGKILLs the node leading the stream kills times while the
// phase's writes are in flight: each time once inflight more subjects are
// under way, then restarts it when the others have elected a new leader. A
// kill waits until the cluster is whole again; the writes of the next part
// of the phase wait for it.
func (lc *leaderChange) crashes(ctx context.Context, p *lcPhase, kills, inflight int) {
	t := lc.t
	for j := 1; j <= kills; j++ {
		lc.awaitCurrent(ctx)
		lc.leaderOff(ctx, lc.listener.Name, lc.writerNode(j))
		from, limit := (j-1)*p.n/kills, j*p.n/kills
		p.limits <- limit
		lc.awaitStarted(p, min(from+inflight, limit), fmt.Sprintf("kill %d", j))
		leader := lc.f.leader(ctx, broker.StreamName, "")
		if leader == lc.listener.Name {
			lc.leaderOff(ctx, lc.listener.Name, lc.writerNode(j))
			leader = lc.f.leader(ctx, broker.StreamName, "")
		}
		node := lc.f.node(leader)
		killed := time.Now()
		dispatched := p.dispatched.Load()
		if err := node.Kill(); err != nil {
			t.Fatal(err)
		}
		p.kills++
		var next string
		itest.PollEvery(t, clustertest.Patience, 100*time.Millisecond, func() (bool, string) {
			next = lc.f.leader(ctx, broker.StreamName, "")
			return next != leader, "the killed " + leader + " still leads the stream"
		})
		elected := time.Since(killed)
		if err := node.Restart(ctx); err != nil {
			t.Fatal(err)
		}
		restarted := time.Since(killed)
		lc.awaitCurrent(ctx)
		p.killLog = append(p.killLog, fmt.Sprintf("kill %d: %s led the stream (%d subjects started); %s leads %s later; %s restarted after %s, current after %s",
			j, leader, dispatched, next, elected.Round(time.Millisecond), leader, restarted.Round(time.Millisecond), time.Since(killed).Round(time.Millisecond)))
	}
	<-p.done
	lc.checkDone(ctx, p)
	lc.awaitCurrent(ctx)
}

// writerNode is the name of the node writer j%2 is connected to.
func (lc *leaderChange) writerNode(j int) string { return lc.writers[j%2].node }

// checkDone fails the test if the phase's writes ended early.
func (lc *leaderChange) checkDone(ctx context.Context, p *lcPhase) {
	if ctx.Err() != nil || p.dispatched.Load() != int64(p.n) {
		lc.t.Fatalf("leaderchange: phase %s: writes stopped after %d subjects of %d", p.name, p.dispatched.Load(), p.n)
	}
}

// stepDown asks the stream's leader to step down, in favour of node
// preferred if not "". It reports whether the server said it did, else
// why not ("" when nothing answered within lcCall).
func (lc *leaderChange) stepDown(ctx context.Context, preferred string) (bool, string) {
	var body []byte
	if preferred != "" {
		body, _ = json.Marshal(map[string]any{"placement": map[string]string{"preferred": preferred}})
	}
	cctx, cancel := context.WithTimeout(ctx, lcCall)
	defer cancel()
	m, err := lc.f.nc.RequestWithContext(cctx, "$JS.API.STREAM.LEADER.STEPDOWN."+broker.StreamName, body)
	if err != nil {
		return false, ""
	}
	var resp struct {
		Success bool                `json:"success"`
		Error   *jetstream.APIError `json:"error"`
	}
	if err := json.Unmarshal(m.Data, &resp); err != nil {
		return false, fmt.Sprintf("step-down answer %q: %v", m.Data, err)
	}
	if resp.Error != nil {
		return false, resp.Error.Error()
	}
	return resp.Success, string(m.Data)
}

// leaderOff moves the stream's leadership from node away to node to, if
// away leads it, and waits until another node does: the subscriber's node
// is never killed, so that what it misses is what the server did not send.
func (lc *leaderChange) leaderOff(ctx context.Context, away, to string) {
	t := lc.t
	t.Helper()
	asked := false
	itest.PollEvery(t, clustertest.Patience, 200*time.Millisecond, func() (bool, string) {
		if lc.f.leader(ctx, broker.StreamName, "") != away {
			return true, ""
		}
		if asked {
			asked = false // once more, next time round
			return false, away + " still leads the stream"
		}
		ok, why := lc.stepDown(ctx, to)
		asked = ok
		return false, fmt.Sprintf("asked %s to hand the stream to %s: %v %s", away, to, ok, why)
	})
}

// awaitCurrent waits until the stream has a leader and both its followers
// are online and current.
func (lc *leaderChange) awaitCurrent(ctx context.Context) {
	t := lc.t
	t.Helper()
	itest.PollEvery(t, clustertest.Patience, 100*time.Millisecond, func() (bool, string) {
		cctx, cancel := context.WithTimeout(ctx, lcCall)
		defer cancel()
		s, err := lc.f.js.Stream(cctx, broker.StreamName)
		if err != nil {
			return false, err.Error()
		}
		c := s.CachedInfo().Cluster
		if c == nil || c.Leader == "" {
			return false, "no stream leader"
		}
		if len(c.Replicas) != 2 {
			return false, fmt.Sprintf("leader %s sees %d followers", c.Leader, len(c.Replicas))
		}
		for _, r := range c.Replicas {
			if !r.Current || r.Offline {
				return false, fmt.Sprintf("follower %s: current %v, offline %v, lag %d", r.Name, r.Current, r.Offline, r.Lag)
			}
		}
		return true, ""
	})
}

// lcWriter is one of the two writers: a connection to one node only, so
// the two writes of a subject reach the stream through different servers.
type lcWriter struct {
	name  string
	node  string
	nc    *nats.Conn
	async *asyncErrors
	js    jetstream.JetStream

	mu   sync.Mutex
	errs map[string]int // the errors of attempts tried again, by kind
}

func newLCWriter(t *testing.T, name string, node *clustertest.Node) *lcWriter {
	t.Helper()
	nc, async := lcConnect(t, node, "leaderchange-writer-"+name)
	return &lcWriter{name: name, node: node.Name, nc: nc, async: async, js: itest.NewJS(t, nc), errs: map[string]int{}}
}

// lcConnect connects to node alone (reconnecting to it, never to another)
// and closes the connection when the test ends.
func lcConnect(t *testing.T, node *clustertest.Node, name string) (*nats.Conn, *asyncErrors) {
	t.Helper()
	async := &asyncErrors{}
	nc, err := nats.Connect(node.ClientURL(), nats.Name(name),
		nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond), nats.Timeout(lcCall),
		nats.ErrorHandler(async.add))
	if err != nil {
		t.Fatalf("%s: connect to %s: %v", name, node.Name, err)
	}
	t.Cleanup(nc.Close)
	return nc, async
}

// asyncErrors counts a connection's asynchronous errors (a write to a
// killed server, a slow consumer), which nats.go would print to stderr.
type asyncErrors struct {
	mu    sync.Mutex
	n     int
	first string
}

func (a *asyncErrors) add(_ *nats.Conn, _ *nats.Subscription, err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.n++; a.n == 1 {
		a.first = err.Error()
	}
}

func (a *asyncErrors) String() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.n == 0 {
		return "0 asynchronous errors"
	}
	return fmt.Sprintf("%d asynchronous errors (first: %s)", a.n, a.first)
}

// lcWrite is what became of one writer's write of one subject.
type lcWrite struct {
	seq      uint64              // the sequence acknowledged, 0 without an ack
	refusal  jetstream.ErrorCode // a wrong-last-sequence code, 0 without a refusal
	refused  string              // the refusal's description
	attempts int
	errs     []string // why the attempts tried again failed
	gaveUp   bool     // no ack and no refusal within clustertest.Patience
}

func (w *lcWriter) data(id string) string { return w.name + " " + id }

// write publishes w's message on id's decision subject, expecting it empty,
// until the stream acknowledges or refuses it; any other failure is tried
// again, clustertest.Patience at most.
func (w *lcWriter) write(ctx context.Context, id string) lcWrite {
	var out lcWrite
	msg := &nats.Msg{Subject: events.DecisionPrefix + id, Data: []byte(w.data(id))}
	giveUp := time.Now().Add(clustertest.Patience)
	for {
		out.attempts++
		actx, cancel := context.WithTimeout(ctx, lcCall)
		ack, err := w.js.PublishMsg(actx, msg, jetstream.WithExpectLastSequencePerSubject(0))
		cancel()
		if err == nil {
			out.seq = ack.Sequence
			return out
		}
		var apiErr *jetstream.APIError
		if errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence || apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant) {
			out.refusal, out.refused = apiErr.ErrorCode, apiErr.Description
			return out
		}
		out.errs = append(out.errs, err.Error())
		w.mu.Lock()
		w.errs[errKind(err)]++
		w.mu.Unlock()
		if ctx.Err() != nil || time.Now().After(giveUp) {
			out.gaveUp = true
			return out
		}
		select {
		case <-ctx.Done():
		case <-time.After(lcRetryPause):
		}
	}
}

// errKind names an error for the counts of retried errors.
func errKind(err error) string {
	var apiErr *jetstream.APIError
	switch {
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, nats.ErrTimeout):
		return "no answer within " + lcCall.String()
	case errors.Is(err, jetstream.ErrNoStreamResponse), errors.Is(err, nats.ErrNoResponders):
		return "no responders"
	case errors.As(err, &apiErr):
		return fmt.Sprintf("error %d: %s", apiErr.ErrorCode, apiErr.Description)
	}
	return err.Error()
}

// recorder is a plain subscriber on assent-decided.>: what the stream
// republished, by request id.
type recorder struct {
	nc    *nats.Conn
	async *asyncErrors
	sub   *nats.Subscription

	mu        sync.Mutex
	byID      map[string][]republished
	malformed []string
	total     int
}

// republished is one message of the stream's RePublish.
type republished struct {
	seq, last uint64 // Nats-Sequence, Nats-Last-Sequence
	data      string
}

func startRecorder(t *testing.T, node *clustertest.Node) *recorder {
	t.Helper()
	nc, async := lcConnect(t, node, "leaderchange-republish")
	r := &recorder{nc: nc, async: async, byID: map[string][]republished{}}
	var err error
	r.sub, err = nc.Subscribe(events.DecidedPrefix+">", r.record)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.sub.SetPendingLimits(-1, -1); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), lcCall)
	defer cancel()
	if err := nc.FlushWithContext(ctx); err != nil {
		t.Fatal(err)
	}
	return r
}

func (r *recorder) record(m *nats.Msg) {
	seq, err1 := strconv.ParseUint(m.Header.Get(events.SequenceHeader), 10, 64)
	last, err2 := strconv.ParseUint(m.Header.Get(events.LastSequenceHeader), 10, 64)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.total++
	if err := errors.Join(err1, err2); err != nil {
		r.malformed = append(r.malformed, fmt.Sprintf("%s %q: %v", m.Subject, m.Data, err))
		return
	}
	id := strings.TrimPrefix(m.Subject, events.DecidedPrefix)
	r.byID[id] = append(r.byID[id], republished{seq: seq, last: last, data: string(m.Data)})
}

// lcStored is what the stream holds on one decision subject.
type lcStored struct {
	first, next *itest.LeaderMsg // next: a message after the first, nil if none
}

// get reads the first message on subject at or after seq, nil if none,
// from the stream's leader (itest.LeaderGet: not the direct get, which a
// follower may answer).
func (lc *leaderChange) get(ctx context.Context, subject string, seq uint64) (*itest.LeaderMsg, error) {
	return itest.LeaderGet(ctx, lc.f.nc, subject, seq)
}

// read reads what the stream holds on id's decision subject: its first
// message, then whatever follows it.
func (lc *leaderChange) read(ctx context.Context, id string) (lcStored, error) {
	var st lcStored
	subject := events.DecisionPrefix + id
	giveUp := time.Now().Add(clustertest.Patience)
	var err error
	for {
		if st.first == nil {
			st.first, err = lc.get(ctx, subject, 1)
		}
		if err == nil && st.first != nil {
			st.next, err = lc.get(ctx, subject, st.first.Sequence+1)
		}
		if err == nil || ctx.Err() != nil || time.Now().After(giveUp) {
			return st, err
		}
		time.Sleep(lcRetryPause)
	}
}

// lcCounts are one phase's figures.
type lcCounts struct {
	acks, wrongSeq, inFlight, retried [2]int
	unacked                           [2]int // stored, though its writer was refused
	republished, notFirst, twice      int
	neverRepublished                  int
	unackedUnrepublished              int // stored without ack and never republished
	empty, doubled, ackLost, mismatch int
}

// verify reads every subject of the phases and checks it against what the
// writers were told and what was republished.
func (lc *leaderChange) verify(ctx context.Context, phases ...*lcPhase) {
	t := lc.t
	lc.sameOnEveryReplica(ctx)
	type job struct {
		p *lcPhase
		i int
	}
	stored := make(map[*lcPhase][]lcStored)
	for _, p := range phases {
		stored[p] = make([]lcStored, p.n)
	}
	jobs := make(chan job)
	var readers sync.WaitGroup
	var failed atomic.Int64
	var firstErr atomic.Value
	for range 16 {
		readers.Go(func() {
			for j := range jobs {
				st, err := lc.read(ctx, j.p.id(j.i))
				if err != nil {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, fmt.Sprintf("read %s: %v", j.p.id(j.i), err))
					continue
				}
				stored[j.p][j.i] = st
			}
		})
	}
	for _, p := range phases {
		for i := range p.n {
			jobs <- job{p, i}
		}
	}
	close(jobs)
	readers.Wait()
	if n := failed.Load(); n > 0 {
		t.Fatalf("leaderchange: %d subjects could not be read; first: %v", n, firstErr.Load())
	}

	// What the subscriber got: read last, so that what the server sent
	// before the reads above has arrived.
	rec := lc.rec
	rec.mu.Lock()
	defer rec.mu.Unlock()
	dropped, _ := rec.sub.Dropped()
	for _, m := range rec.malformed {
		t.Errorf("leaderchange: republished message without its sequence headers: %s", m)
	}
	known := 0

	reported := 0
	report := func(format string, args ...any) {
		if reported++; reported <= 20 {
			t.Errorf("leaderchange: "+format, args...)
		}
	}
	var sum lcCounts
	for _, p := range phases {
		var c lcCounts
		for i := range p.n {
			id, st, ws := p.id(i), stored[p][i], p.writes[i]
			known += len(rec.byID[id])
			lc.check(id, st, ws, rec.byID[id], &c, report)
		}
		for w, wr := range lc.writers {
			for i := range p.n {
				c.retried[w] += len(p.writes[i][w].errs)
			}
			t.Logf("leaderchange: phase %s: writer %s (%s): %d acks, %d refused with wrong last sequence, %d refused as in flight, %d errors tried again, %d of its writes stored without their ack",
				p.name, wr.name, wr.node, c.acks[w], c.wrongSeq[w], c.inFlight[w], c.retried[w], c.unacked[w])
		}
		switch p.name {
		case "step-downs":
			t.Logf("leaderchange: phase %s: %d subjects; %d step-downs answered (%d refused, %d unanswered)", p.name, p.n, p.stepDowns, p.stepDownsRefused, p.stepDownsUnanswered)
		default:
			t.Logf("leaderchange: phase %s: %d subjects; %d kills", p.name, p.n, p.kills)
			for _, l := range p.killLog {
				t.Logf("leaderchange: phase %s: %s", p.name, l)
			}
		}
		t.Logf("leaderchange: phase %s: republished %d (not first on their subject %d, republished twice %d); stored decisions never republished %d; writes stored without their ack (both writers refused) %d, of which never republished %d",
			p.name, c.republished, c.notFirst, c.twice, c.neverRepublished, c.unacked[0]+c.unacked[1], c.unackedUnrepublished)
		t.Logf("leaderchange: phase %s: subjects with no message %d, with more than one %d; acked writes not stored %d; republished first messages not the stored one %d",
			p.name, c.empty, c.doubled, c.ackLost, c.mismatch)
		sum.add(c)
	}
	for _, wr := range lc.writers {
		wr.mu.Lock()
		kinds := slices.SortedFunc(maps.Keys(wr.errs), func(a, b string) int {
			return cmp.Or(cmp.Compare(wr.errs[b], wr.errs[a]), cmp.Compare(a, b))
		})
		var parts []string
		for _, k := range kinds {
			parts = append(parts, fmt.Sprintf("%d × %s", wr.errs[k], k))
		}
		wr.mu.Unlock()
		t.Logf("leaderchange: writer %s: errors tried again: %s; connection: %d reconnects, %s", wr.name, cmp.Or(strings.Join(parts, "; "), "none"), wr.nc.Stats().Reconnects, wr.async)
	}
	t.Logf("leaderchange: republish subscriber: %d messages, %d for other subjects, %d dropped; connection: %d reconnects, %s", rec.total, rec.total-len(rec.malformed)-known, dropped, rec.nc.Stats().Reconnects, rec.async)
	if reported > 20 {
		t.Errorf("leaderchange: %d more problems not shown", reported-20)
	}
	t.Logf("leaderchange: total: acks A %d B %d, refusals %d, retried errors %d, republished %d, never republished %d, stored without ack %d, subjects with 0 messages %d, with >1 %d",
		sum.acks[0], sum.acks[1], sum.wrongSeq[0]+sum.wrongSeq[1]+sum.inFlight[0]+sum.inFlight[1], sum.retried[0]+sum.retried[1],
		sum.republished, sum.neverRepublished, sum.unacked[0]+sum.unacked[1], sum.empty, sum.doubled)
}

func (c *lcCounts) add(o lcCounts) {
	for w := range 2 {
		c.acks[w] += o.acks[w]
		c.wrongSeq[w] += o.wrongSeq[w]
		c.inFlight[w] += o.inFlight[w]
		c.retried[w] += o.retried[w]
		c.unacked[w] += o.unacked[w]
	}
	c.republished += o.republished
	c.notFirst += o.notFirst
	c.twice += o.twice
	c.neverRepublished += o.neverRepublished
	c.unackedUnrepublished += o.unackedUnrepublished
	c.empty += o.empty
	c.doubled += o.doubled
	c.ackLost += o.ackLost
	c.mismatch += o.mismatch
}

// check holds one subject to the test's rules, counting into c and
// reporting what fails.
func (lc *leaderChange) check(id string, st lcStored, ws [2]lcWrite, reps []republished, c *lcCounts, report func(string, ...any)) {
	history := func() string {
		var b strings.Builder
		for w, wr := range lc.writers {
			x := ws[w]
			fmt.Fprintf(&b, "; writer %s (%s): %d attempts, ack seq %d, refusal %d %q, gave up %v, errors %q", wr.name, wr.node, x.attempts, x.seq, x.refusal, x.refused, x.gaveUp, x.errs)
		}
		for _, r := range reps {
			fmt.Fprintf(&b, "; republished seq %d last %d %q", r.seq, r.last, r.data)
		}
		return b.String()
	}
	for w, wr := range lc.writers {
		switch x := ws[w]; {
		case x.seq != 0:
			c.acks[w]++
		case x.refusal == jetstream.JSErrCodeStreamWrongLastSequence:
			c.wrongSeq[w]++
		case x.refusal != 0:
			c.inFlight[w]++
		case x.gaveUp:
			report("%s: writer %s gave up%s", id, wr.name, history())
		}
	}
	if st.first == nil {
		c.empty++
		report("%s: no message stored%s", id, history())
		return
	}
	if st.next != nil {
		c.doubled++
		report("%s: two messages stored: seq %d %q at %s and seq %d %q at %s%s", id,
			st.first.Sequence, st.first.Data, st.first.Time.Format(time.RFC3339Nano), st.next.Sequence, st.next.Data, st.next.Time.Format(time.RFC3339Nano), history())
	}
	for w, wr := range lc.writers {
		x := ws[w]
		if x.seq != 0 && (x.seq != st.first.Sequence || string(st.first.Data) != wr.data(id)) {
			c.ackLost++
			report("%s: writer %s was acknowledged seq %d, but the stored message is seq %d %q%s", id, wr.name, x.seq, st.first.Sequence, st.first.Data, history())
		}
		if string(st.first.Data) == wr.data(id) && ws[0].seq == 0 && ws[1].seq == 0 && ws[0].refusal != 0 && ws[1].refusal != 0 {
			c.unacked[w]++
		}
	}
	firsts := 0
	for _, r := range reps {
		c.republished++
		if r.last != 0 {
			c.notFirst++
			continue
		}
		if firsts++; firsts == 2 {
			c.twice++
		}
		if r.seq != st.first.Sequence || r.data != string(st.first.Data) {
			c.mismatch++
			report("%s: republished as first seq %d %q, but the stored message is seq %d %q%s", id, r.seq, r.data, st.first.Sequence, st.first.Data, history())
		}
	}
	if firsts == 0 {
		c.neverRepublished++
		if ws[0].seq == 0 && ws[1].seq == 0 {
			c.unackedUnrepublished++
		}
	}
}

// sameOnEveryReplica waits until the three nodes' copies of the stream
// hold the same messages (count, bytes, first and last sequence, subjects),
// as each node's monitoring port reports its own copy, and fails the test
// if they never do.
func (lc *leaderChange) sameOnEveryReplica(ctx context.Context) {
	t := lc.t
	t.Helper()
	client := &http.Client{Timeout: lcCall}
	state := func(node *clustertest.Node) (server.StreamState, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("http://127.0.0.1:%d/jsz?accounts=true&streams=true", node.MonitorPort), nil)
		if err != nil {
			return server.StreamState{}, err
		}
		resp, err := client.Do(req)
		if err != nil {
			return server.StreamState{}, err
		}
		defer resp.Body.Close()
		var jsz server.JSInfo
		if err := json.NewDecoder(resp.Body).Decode(&jsz); err != nil {
			return server.StreamState{}, err
		}
		for _, a := range jsz.AccountDetails {
			for _, s := range a.Streams {
				if s.Name == broker.StreamName {
					return s.State, nil
				}
			}
		}
		return server.StreamState{}, fmt.Errorf("%s holds no stream %s", node.Name, broker.StreamName)
	}
	type view struct {
		msgs, bytes, first, last uint64
		deleted, subjects        int
	}
	var views []string
	itest.PollEvery(t, clustertest.Patience, 200*time.Millisecond, func() (bool, string) {
		views = views[:0]
		var seen []view
		for _, node := range lc.f.cl.Nodes() {
			s, err := state(node)
			if err != nil {
				return false, fmt.Sprintf("%s: %v", node.Name, err)
			}
			v := view{s.Msgs, s.Bytes, s.FirstSeq, s.LastSeq, s.NumDeleted, s.NumSubjects}
			seen = append(seen, v)
			views = append(views, fmt.Sprintf("%s: %d messages, %d bytes, seq %d-%d, %d deleted, %d subjects", node.Name, v.msgs, v.bytes, v.first, v.last, v.deleted, v.subjects))
		}
		for _, v := range seen[1:] {
			if v != seen[0] {
				return false, "the replicas differ: " + strings.Join(views, "; ")
			}
		}
		return true, ""
	})
	t.Logf("leaderchange: every replica: %s", views[0][strings.Index(views[0], ":")+2:])
}
