package cluster

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/assent-dev/assent/integration/itest"
	"github.com/assent-dev/assent/internal/clustertest"
	"github.com/assent-dev/assent/internal/testenv"
	"github.com/assent-dev/assent/pkg/events"
	"github.com/assent-dev/assent/pkg/handler"
)

const rollingPolicy = `version: 1
mode: manual
principals:
  alice: {roles: [ops]}
defaults:
  timeout: 2m
rules:
  - name: no-drops
    tools: [drop_table]
    action: deny
  - name: reads
    tools: ["read_*"]
    action: allow
  - name: deploys
    tools: [deploy, nightly_job]
    action: require_approval
    approvers: ["role:ops"]
`

// The kinds of request in the rolling load, and the outcome each must get.
type rollingKind int

const (
	rollAuto     rollingKind = iota // allowed by a rule
	rollDeny                        // denied by a rule
	rollHTTP                        // approved by a person over a replica's HTTP API
	rollNATS                        // approved by a person over NATS
	rollExpire                      // nobody answers: expires
	rollLongPoll                    // asked over a replica's HTTP API, long-polling; approved over NATS
	rollKinds
)

var rollingOutcome = [rollKinds]events.Outcome{events.Approved, events.Denied, events.Approved, events.Approved, events.Expired, events.Approved}

type rollingReq struct {
	id   string
	kind rollingKind
	d    events.Decided
	err  error
}

// TestRollingRestart restarts each of three broker replicas in turn, with
// SIGTERM, while agents keep asking (over NATS, and over HTTP long-polling a
// replica; decided by policy, by people over HTTP and over NATS, and by
// expiry) and a web UI's event stream is open on every replica, and waits
// for each to be ready again before the next. Afterwards every request has
// exactly one decided message, the one its agent received, with the outcome
// its kind calls for, and every replica's GET /v1/approvals/{id} agrees;
// every replica exited cleanly.
func TestRollingRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("runs broker processes")
	}
	ns := testenv.Server(t)
	bin := itest.BrokerBinary(t)
	logDir := t.TempDir()
	policyFile := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(policyFile, []byte(rollingPolicy), 0o644); err != nil {
		t.Fatal(err)
	}
	var replicas []*clustertest.Replica
	for i := range 3 {
		replicas = append(replicas, clustertest.NewReplica(t, clustertest.ReplicaConfig{
			Binary: bin, Name: fmt.Sprintf("replica-%d", i+1), NATSURL: ns.ClientURL(), Replicas: 1, LogDir: logDir,
			Args: []string{"--policy", policyFile, "--log-level", "info", "--drain-delay", "1s"},
		}))
	}
	itest.StartReplicas(t, replicas, 30)

	nc := testenv.Conn(t, ns)
	js := itest.NewJS(t, nc)
	var (
		mu       sync.Mutex
		all      []*rollingReq
		done     atomic.Int64
		answerWG sync.WaitGroup
		answerMu sync.Mutex
		answerEs []error
	)
	answerErr := func(err error) {
		answerMu.Lock()
		answerEs = append(answerEs, err)
		answerMu.Unlock()
	}
	// answerHTTP approves id on some running replica, trying the others
	// while one restarts; a 409 means an earlier try was applied.
	answerHTTP := func(id string) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		var tries []string
		for ctx.Err() == nil {
			r := replicas[rand.IntN(len(replicas))]
			resp, err := itest.DoHTTP(ctx, http.MethodPost, r.HTTP+"/v1/approvals/"+id+"/decision",
				map[string]string{"decision": "approve", "principal": "alice", "reason": "rolling"})
			switch {
			case err != nil:
				tries = append(tries, fmt.Sprintf("%s: %v", r.Name, err))
			case resp.Status == http.StatusOK || resp.Status == http.StatusConflict:
				return
			case resp.Status != http.StatusNotFound && resp.Status != http.StatusServiceUnavailable:
				answerErr(fmt.Errorf("answer %s on %s: %d %s (after %v)", id, r.Name, resp.Status, resp.Body, tries))
				return
			default:
				tries = append(tries, fmt.Sprintf("%s: %d", r.Name, resp.Status))
			}
			time.Sleep(50 * time.Millisecond) // a replica restarting, or the request not stored yet
		}
		answerErr(fmt.Errorf("answer %s: not applied within a minute: %v", id, tries))
	}

	// askHTTP asks over some replica's HTTP API and long-polls for the
	// decision, as an agent without NATS would: when a replica stops, the
	// poll ends with the request still pending (or the connection fails),
	// and it polls another.
	askHTTP := func(ctx context.Context, id, agent string, req events.Requested) (events.Decided, error) {
		body := map[string]any{"id": id, "agent": agent, "tool": req.Tool, "args": req.Args}
		asked := false
		var tries []string
		for ctx.Err() == nil {
			r := replicas[rand.IntN(len(replicas))]
			var resp itest.HTTPResp
			var err error
			// A poll answers within its wait; a replica that holds it
			// longer is a defect, reported with the others.
			tctx, cancel := context.WithTimeout(ctx, 25*time.Second)
			began := time.Now()
			if asked {
				resp, err = itest.DoHTTP(tctx, http.MethodGet, r.HTTP+"/v1/approvals/"+id+"?wait=5s", nil)
			} else {
				resp, err = itest.DoHTTP(tctx, http.MethodPost, r.HTTP+"/v1/approvals?wait=5s", body)
			}
			cancel()
			switch {
			case err != nil:
				tries = append(tries, fmt.Sprintf("%s at %s: %v", r.Name, began.Format("15:04:05.000"), err))
			case resp.Status == http.StatusOK || resp.Status == http.StatusCreated:
				asked = true
				var a struct {
					Decision *events.Decided `json:"decision"`
				}
				if err := json.Unmarshal(resp.Body, &a); err != nil {
					return events.Decided{}, fmt.Errorf("%s: %w: %s", r.Name, err, resp.Body)
				}
				if a.Decision != nil {
					return *a.Decision, nil
				}
				continue
			case resp.Status == http.StatusNotFound:
				asked = false // a POST whose answer was lost: ask again, by the same id
				tries = append(tries, fmt.Sprintf("%s: 404", r.Name))
			case resp.Status == http.StatusServiceUnavailable:
				tries = append(tries, fmt.Sprintf("%s: 503 (starting)", r.Name))
			default:
				return events.Decided{}, fmt.Errorf("%s: %d %s (after %v)", r.Name, resp.Status, resp.Body, tries)
			}
			time.Sleep(50 * time.Millisecond)
		}
		return events.Decided{}, fmt.Errorf("no decision within a minute: %v", tries)
	}

	// A web UI open on every replica: an event stream, opened again when
	// its replica stops.
	loadCtx, stopLoad := context.WithCancel(itest.TestCtx(t, 3*time.Minute))
	var watchers sync.WaitGroup
	var streamed atomic.Int64
	for _, r := range replicas {
		watchers.Go(func() {
			for loadCtx.Err() == nil {
				req, _ := http.NewRequestWithContext(loadCtx, http.MethodGet, r.HTTP+"/v1/events?type=decided", nil)
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					time.Sleep(50 * time.Millisecond)
					continue
				}
				sc := bufio.NewScanner(resp.Body)
				for sc.Scan() {
					if strings.HasPrefix(sc.Text(), "event: decided") {
						streamed.Add(1)
					}
				}
				resp.Body.Close()
			}
		})
	}
	defer stopLoad()
	var agents sync.WaitGroup
	for a := range 12 {
		agent := fmt.Sprintf("roller-%d", a)
		client := itest.NewClient(t, testenv.Conn(t, ns), agent)
		agents.Go(func() {
			for i := 0; loadCtx.Err() == nil; i++ {
				r := &rollingReq{id: events.NewID(), kind: rollingKind((a + i) % int(rollKinds))}
				req := events.Requested{Tool: "deploy", Args: json.RawMessage(fmt.Sprintf(`{"n":%d}`, i))}
				switch r.kind {
				case rollAuto:
					req.Tool = "read_file"
				case rollDeny:
					req.Tool = "drop_table"
				case rollExpire:
					req.Tool, req.Timeout = "nightly_job", events.Duration(time.Second+time.Duration(rand.IntN(1000))*time.Millisecond)
				}
				mu.Lock()
				all = append(all, r)
				mu.Unlock()
				actx, cancel := context.WithTimeout(context.Background(), time.Minute)
				switch r.kind {
				case rollHTTP:
					answerWG.Go(func() {
						time.Sleep(time.Duration(rand.IntN(300)) * time.Millisecond)
						answerHTTP(r.id)
					})
				case rollNATS, rollLongPoll:
					answerWG.Go(func() {
						// Its own context: the agent may have its decision,
						// and end actx, before the answer's publish is
						// acknowledged.
						actx, cancel := context.WithTimeout(context.Background(), time.Minute)
						defer cancel()
						time.Sleep(time.Duration(rand.IntN(300)) * time.Millisecond)
						// A person answers what they were shown: a request
						// stored already (an answer before it is refused),
						// which the brokers know.
						for {
							if st, err := itest.LookupRequest(actx, nc, r.id); err == nil && st != events.LookupUnknown || actx.Err() != nil {
								break
							}
							time.Sleep(20 * time.Millisecond)
						}
						if err := handler.Answer(actx, js, "alice", r.id, events.Responded{Decision: events.Approve, Reason: "rolling"}); err != nil {
							answerErr(fmt.Errorf("answer %s over NATS: %w", r.id, err))
						}
					})
				}
				if r.kind == rollLongPoll {
					r.d, r.err = askHTTP(actx, r.id, agent, req)
				} else {
					r.d, r.err = client.Request(actx, handler.Request{ID: r.id, Requested: req})
				}
				cancel()
				done.Add(1)
			}
		})
	}

	// progress waits until n more requests are decided.
	progress := func(n int64) {
		t.Helper()
		target := done.Load() + n
		itest.PollEvery(t, clustertest.Patience, 20*time.Millisecond, func() (bool, string) {
			return done.Load() >= target, fmt.Sprintf("%d requests decided, waiting for %d", done.Load(), target)
		})
	}
	progress(30)
	for _, r := range replicas {
		before := done.Load()
		stopCtx, cancel := context.WithTimeout(context.Background(), clustertest.Patience)
		err := r.Stop(stopCtx)
		cancel()
		if err != nil {
			t.Errorf("SIGTERM: %v", err)
		}
		startCtx, cancel := context.WithTimeout(context.Background(), 2*clustertest.Patience)
		err = r.Start(startCtx)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%s restarted; %d requests decided meanwhile", r.Name, done.Load()-before)
		progress(30)
	}
	stopLoad()
	agents.Wait()
	answerWG.Wait()
	watchers.Wait()
	for _, err := range answerEs {
		t.Error(err)
	}

	itest.WaitIdleWithin(t, js, time.Minute, 100*time.Millisecond, false, itest.BrokerConsumers...)
	stream := readDecisions(t, js)
	counts := [rollKinds]int{}
	var failed []string
	for _, r := range all {
		counts[r.kind]++
		want := rollingOutcome[r.kind]
		sd := stream[r.id]
		switch {
		case r.err != nil:
			failed = append(failed, r.id)
			t.Errorf("request %s (kind %d): the agent got no decision: %v", r.id, r.kind, r.err)
			continue
		case sd == nil:
			t.Errorf("request %s: no decided message", r.id)
			continue
		case sd.count != 1:
			t.Errorf("request %s: %d decided messages, want 1", r.id, sd.count)
		case sd.first.Outcome != want || r.d.Outcome != want:
			t.Errorf("request %s (kind %d): stream says %s, agent got %s, want %s", r.id, r.kind, sd.first.Outcome, r.d.Outcome, want)
		case !sd.first.DecidedAt.Equal(r.d.DecidedAt):
			t.Errorf("request %s: the agent got the decision of %s, the stream holds that of %s", r.id, r.d.DecidedAt, sd.first.DecidedAt)
		}
		// Every replica reads it back so; one may take a moment to read
		// the newest decisions from the stream.
		for _, rep := range replicas {
			got := approvalState(rep.HTTP, r.id)
			for giveUp := time.Now().Add(5 * time.Second); got != string(want) && time.Now().Before(giveUp); {
				time.Sleep(100 * time.Millisecond)
				got = approvalState(rep.HTTP, r.id)
			}
			if got != string(want) {
				t.Errorf("request %s: GET /v1/approvals/%s on %s reads %s, want %s", r.id, r.id, rep.Name, got, want)
			}
		}
	}
	if len(stream) != len(all) {
		t.Errorf("%d decision subjects for %d requests", len(stream), len(all))
	}
	t.Logf("%d requests: %d by policy, %d denied by policy, %d approved over HTTP, %d over NATS, %d expired, %d asked over HTTP; %d decisions seen on the replicas' event streams", len(all),
		counts[rollAuto], counts[rollDeny], counts[rollHTTP], counts[rollNATS], counts[rollExpire], counts[rollLongPoll], streamed.Load())
	for _, r := range replicas {
		out := r.Output()
		if strings.Contains(out, "panic") || strings.Contains(out, "DATA RACE") {
			t.Errorf("%s: %s", r.Name, itest.Tail(out, 40))
		}
		for _, id := range failed {
			for _, line := range strings.Split(out, "\n") {
				if strings.Contains(line, id) || strings.Contains(line, "stopping") || strings.Contains(line, "clustertest: start") || strings.Contains(line, "still running") {
					t.Logf("%s: %s", r.Name, line)
				}
			}
		}
	}
}

// approvalState returns the state GET /v1/approvals/{id} reads on the
// broker at api, or what went wrong.
func approvalState(api, id string) string {
	ctx, cancel := itest.OpCtx()
	defer cancel()
	resp, err := itest.DoHTTP(ctx, http.MethodGet, api+"/v1/approvals/"+id, nil)
	if err != nil {
		return err.Error()
	}
	if resp.Status != http.StatusOK {
		return fmt.Sprintf("%d %s", resp.Status, resp.Body)
	}
	var a struct {
		State string `json:"state"`
	}
	if err := json.Unmarshal(resp.Body, &a); err != nil {
		return fmt.Sprintf("%v: %s", err, resp.Body)
	}
	return a.State
}
