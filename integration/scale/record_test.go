package scale

import (
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/assent-dev/assent/integration/itest"
	"github.com/assent-dev/assent/internal/clustertest"
	"github.com/assent-dev/assent/internal/insights"
	"github.com/assent-dev/assent/internal/replay"
	"github.com/assent-dev/assent/pkg/events"
)

// TestScaleRecord's size: 5,000 requests in CI, 1,000,000 with -tags scale
// (scale_full_test.go's defaultScaleRecord).
var scaleRecord = flag.Int("scale.record", defaultScaleRecord, "TestScaleRecord: requests recorded, each decided by the policy or by people")

// recordPolicy decides most requests itself and asks people about deploys.
const recordPolicy = `version: 1
mode: manual
defaults:
  on_no_approver: wait
rules:
  - name: reads
    tools: ["read_*"]
    action: allow
  - name: drops
    tools: ["drop_*"]
    action: deny
  - name: deploys
    tools: [deploy]
    action: require_approval
    timeout: 2h
`

// recordCandidate lets deploys to staging through without a person.
const recordCandidate = `version: 1
mode: manual
defaults:
  on_no_approver: wait
rules:
  - name: reads
    tools: ["read_*"]
    action: allow
  - name: drops
    tools: ["drop_*"]
    action: deny
  - name: staging-deploys
    tools: [deploy]
    when: 'args.env == "staging"'
    action: allow
  - name: deploys
    tools: [deploy]
    action: require_approval
    timeout: 2h
`

// TestScaleRecord records -scale.record requests through the broker
// process (embedded NATS, --sync 2m): six in ten read_file, allowed by
// policy; two in ten drop_table, denied; two in ten deploy, to one of three
// environments, answered by alice or bob (prod denied one time in ten),
// published as an approver would. Then it measures, with the results in
// summary.txt:
//
//   - insights: GET /v1/insights for 30 days, its totals checked against
//     what was recorded, timed 50 times;
//   - a restart (kill -9): time to /readyz, and until the aggregator has
//     read the whole record again (Report.Complete), RSS before and after;
//   - replay: `broker policy replay` of the policy in force over the whole
//     record (every outcome the same, as the broker decided), then of a
//     candidate that allows deploys to staging (exactly the staging deploys
//     people decided change), each timed: requests per second.
func TestScaleRecord(t *testing.T) {
	if testing.Short() {
		t.Skip("the scale test loads a broker process with many requests")
	}
	n := *scaleRecord
	if n < 10 {
		t.Fatalf("-scale.record %d: at least 10", n)
	}
	out, rep, bin := scaleSetup(t)
	dir := t.TempDir()
	pol, cand := filepath.Join(dir, "policy.yaml"), filepath.Join(dir, "candidate.yaml")
	for f, src := range map[string]string{pol: recordPolicy, cand: recordCandidate} {
		if err := os.WriteFile(f, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	rep.add("setup", "%d requests, broker %s, results in %s", n, bin, out)
	sb := &scaleBroker{
		bin: bin, data: filepath.Join(t.TempDir(), "data"), out: out,
		natsPort: clustertest.FreePort(t), httpPort: clustertest.FreePort(t), pprofPort: clustertest.FreePort(t),
		extra: []string{"--policy", pol},
	}
	b1 := sb.start(t, 1, time.Minute, 0)
	nc, err := nats.Connect(sb.natsURL(), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		t.Fatalf("connect to the broker's NATS server: %v", err)
	}
	t.Cleanup(nc.Close)
	pub := newScalePublisher(t, nc)

	envs := []string{"staging", "prod", "dev"}
	// The requests. Deploys are answered once the broker has them all.
	type deploy struct{ id, env string }
	var deploys []deploy
	var want insights.Counts
	began := time.Now()
	lastLog := began
	for i := range n {
		id := events.NewID()
		agent := fmt.Sprintf("agent-%02d", i%20)
		var tool, args string
		switch k := i % 10; {
		case k < 6:
			tool, args = "read_file", `{"path":"/srv/data/`+strconv.Itoa(i)+`.csv"}`
			want.AutoApproved++
		case k < 8:
			tool, args = "drop_table", `{"table":"t`+strconv.Itoa(i%50)+`"}`
			want.AutoDenied++
		default:
			env := envs[(i/10)%3]
			tool, args = "deploy", `{"env":"`+env+`","build":`+strconv.Itoa(i)+`}`
			deploys = append(deploys, deploy{id, env})
		}
		recordRequest(t, pub, id, agent, tool, args)
		if i%1000 == 0 && time.Since(lastLog) >= 5*time.Second {
			lastLog = time.Now()
			rep.progress("record: published %d/%d (%d acknowledged), RSS %s", i, n, pub.acked.Load(), mib(sb.rss(t, b1).rss))
		}
	}
	pub.finish(t)
	rep.add("record", "published %d requests in %s (%.0f/s)", n, time.Since(began).Round(time.Millisecond), float64(n)/time.Since(began).Seconds())
	sb.waitDecided(t, rep, b1, want.AutoApproved+want.AutoDenied, "policy decisions")

	// People: alice and bob in turn; a deploy to prod denied one time in
	// ten.
	began = time.Now()
	staging := 0
	for j, d := range deploys {
		who, verdict := "alice", events.Approve
		if j%2 == 1 {
			who = "bob"
		}
		if d.env == "prod" && j%10 == 0 {
			verdict = events.Deny
			want.Denied++
		} else {
			want.Approved++
		}
		if d.env == "staging" {
			staging++
		}
		recordAnswer(t, pub, d.id, who, verdict)
		if j%1000 == 0 && time.Since(lastLog) >= 5*time.Second {
			lastLog = time.Now()
			rep.progress("record: answered %d/%d", j, len(deploys))
		}
	}
	pub.finish(t)
	sb.waitDecided(t, rep, b1, want.Total(), "every decision")
	rep.add("record", "answered %d deploys in %s; recorded %+v", len(deploys), time.Since(began).Round(time.Millisecond), want)

	// Insights over the record.
	report := waitInsights(t, rep, sb, "after the record")
	if report.Totals != want {
		t.Errorf("insights totals %+v, recorded %+v", report.Totals, want)
	}
	rep.add("insights", "GET /v1/insights?since=30d: %s", timeCalls(t, 50, func() { getInsights(t, sb) }))
	before := sb.memory(t, rep, b1, "recorded")

	// A restart: the aggregator reads the record again.
	b1.Kill(t)
	b2 := sb.start(t, 2, *scaleReady, 0)
	rep.add("restart", "ready in %s", sb.readyAfter.Round(time.Millisecond))
	report = waitInsights(t, rep, sb, "after the restart")
	rep.add("restart", "insights complete %s after the start", time.Since(sb.started).Round(time.Millisecond))
	if report.Totals != want {
		t.Errorf("insights after the restart: totals %+v, recorded %+v", report.Totals, want)
	}
	after := sb.memory(t, rep, b2, "insights read again")
	rep.add("memory", "RSS %s before the restart, %s after it with the record read again", mib(before.rss), mib(after.rss))

	// Raw JetStream doing the least a replay must: read every message of
	// the stream once, through an ordered consumer, and nothing else.
	rawRead(t, rep, nc)

	// Replay: the policy in force, then the candidate.
	same := runReplay(t, rep, sb, bin, pol, "the policy in force")
	if same.Requests != n || same.Changed != 0 {
		t.Errorf("the policy in force replayed: %d requests, %d changed; want %d and 0", same.Requests, same.Changed, n)
	}
	changed := runReplay(t, rep, sb, bin, cand, "the candidate")
	if changed.Requests != n || changed.Changed != staging || changed.Kinds[replay.Kind("allow-what-people-approved")] != staging {
		t.Errorf("the candidate replayed: %d requests, %d changed, kinds %v; want %d staging deploys allowed that people approved", changed.Requests, changed.Changed, changed.Kinds, staging)
	}
	rep.finish()
}

// recordRequest publishes agent's request for tool with args.
func recordRequest(t *testing.T, p *scalePublisher, id, agent, tool, args string) {
	t.Helper()
	e, err := events.New(events.TypeRequested, id, "agent/"+agent, events.Requested{Tool: tool, Agent: agent, Args: json.RawMessage(args)})
	if err != nil {
		t.Fatal(err)
	}
	subject, err := events.RequestSubject(agent)
	if err != nil {
		t.Fatal(err)
	}
	p.publish(t, subject, &e, id)
}

// recordAnswer publishes principal's answer to request id.
func recordAnswer(t *testing.T, p *scalePublisher, id, principal string, verdict events.Verdict) {
	t.Helper()
	e, err := events.New(events.TypeResponded, "", "approver/"+principal, events.Responded{Decision: verdict, Channel: "scale"})
	if err != nil {
		t.Fatal(err)
	}
	subject, err := events.ResponseSubject(principal, id)
	if err != nil {
		t.Fatal(err)
	}
	p.publish(t, subject, &e, "answer-"+id)
}

// waitDecided waits until the record holds want decisions (the insights'
// totals), then checks that the broker counted each once.
func (sb *scaleBroker) waitDecided(t *testing.T, rep *scaleReport, p *itest.Proc, want int, what string) {
	t.Helper()
	last, moved := -1, time.Now()
	for {
		got := getInsights(t, sb).Totals.Total()
		if got >= want {
			m, err := scrape(sb.api(), "assent_approved_total", "assent_denied_total")
			if n := int(m["assent_approved_total"] + m["assent_denied_total"]); err != nil || n != got {
				t.Errorf("%s: the record holds %d decisions, the broker counted %d approved and denied (%v)", what, got, n, err)
			}
			rep.add("record", "%s: %d decided", what, got)
			return
		}
		if got != last {
			last, moved = got, time.Now()
		} else if time.Since(moved) > scaleStall {
			t.Fatalf("%s: %d of %d decided, no progress for %s; the end of the log:\n%s", what, got, want, scaleStall, sb.logTail(40))
		}
		rep.progress("%s: %d of %d decided, RSS %s", what, got, want, mib(sb.rss(t, p).rss))
		time.Sleep(2 * time.Second)
	}
}

// getInsights asks for the last 30 days' insights.
func getInsights(t *testing.T, sb *scaleBroker) insights.Report {
	t.Helper()
	resp, err := http.Get(sb.api() + "/v1/insights?since=30d")
	if err != nil {
		t.Fatalf("GET /v1/insights: %v", err)
	}
	defer resp.Body.Close()
	var r insights.Report
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /v1/insights: %s", resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		t.Fatalf("GET /v1/insights: %v", err)
	}
	return r
}

// waitInsights waits until the aggregator has read the whole record.
func waitInsights(t *testing.T, rep *scaleReport, sb *scaleBroker, when string) insights.Report {
	t.Helper()
	for start := time.Now(); ; time.Sleep(500 * time.Millisecond) {
		r := getInsights(t, sb)
		if r.Complete {
			return r
		}
		if time.Since(start) > *scaleReady {
			t.Fatalf("insights %s: still reading the record after %s (%.0f%%)", when, *scaleReady, 100*r.Progress)
		}
		rep.progress("insights %s: reading the record, %.0f%%", when, 100*r.Progress)
	}
}

// runReplay runs broker policy replay of file over the whole record and
// returns its report.
func runReplay(t *testing.T, rep *scaleReport, sb *scaleBroker, bin, file, what string) replay.Report {
	t.Helper()
	start := time.Now()
	cmd := exec.Command(bin, "policy", "replay", file, "--nats-url", sb.natsURL(), "--json", "--limit", "10")
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	took := time.Since(start)
	var r replay.Report
	if jerr := json.Unmarshal(out, &r); jerr != nil {
		t.Fatalf("broker policy replay %s: %v, %v\n%s", what, err, jerr, out)
	}
	rep.add("replay", "%s: %d requests (%d messages) in %s: %.0f requests/s; %d changed %v", what, r.Requests, r.Messages, took.Round(time.Millisecond), float64(r.Requests)/took.Seconds(), r.Changed, r.Kinds)
	return r
}

// rawRead reads the whole ASSENT stream once with an ordered consumer and
// reports how fast: the floor under a replay, in the same run.
func rawRead(t *testing.T, rep *scaleReport, nc *nats.Conn) {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := itest.TestCtx(t, 10*time.Minute)
	stream, err := js.Stream(ctx, events.StreamName)
	if err != nil {
		t.Fatal(err)
	}
	last := stream.CachedInfo().State.LastSeq
	cons, err := stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	var n int
	it, err := cons.Messages()
	if err != nil {
		t.Fatal(err)
	}
	defer it.Stop()
	for {
		msg, err := it.Next()
		if err != nil {
			t.Fatalf("raw read: %v after %d messages", err, n)
		}
		n++
		md, err := msg.Metadata()
		if err != nil {
			t.Fatal(err)
		}
		if md.Sequence.Stream >= last {
			break
		}
	}
	took := time.Since(start)
	rep.add("replay", "raw JetStream, the same stream read once by an ordered consumer: %d messages in %s (%.0f messages/s)", n, took.Round(time.Millisecond), float64(n)/took.Seconds())
}
