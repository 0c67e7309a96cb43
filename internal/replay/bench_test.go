package replay_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/assent-dev/assent/internal/replay"
	"github.com/assent-dev/assent/internal/testenv"
	"github.com/assent-dev/assent/pkg/events"
	"github.com/assent-dev/assent/pkg/policy"
)

// benchPolicy is a policy of the size people write: a dozen rules with
// globs, labels and CEL conditions, a limit that automatic payments are
// charged against, remembered writes.
const benchPolicy = `version: 1
mode: manual
principals:
  alice: {roles: [finance, ops]}
  bob:   {roles: [finance]}
  carol: {roles: [ops]}
rules:
  - name: reads
    tools: ["read_*", "list_*", "get_*", "search_*"]
    action: allow
  - name: tmp-files
    tools: [cat_file, stat_file]
    when: 'args.path.startsWith("/tmp/")'
    action: allow
  - name: no-drop-in-prod
    tools: ["drop_*", "sql_*"]
    labels: {env: "prod*"}
    when: 'tool.startsWith("drop_") || args.statement.upperAscii().contains("DROP ")'
    action: deny
  - name: prod-sql
    tools: ["sql_*"]
    labels: {env: "prod*"}
    action: require_approval
    approvers: ["role:ops"]
  - name: small-pay
    tools: [pay]
    when: 'has(args.amount) && args.amount <= 100'
    action: allow
  - name: big-pay
    tools: [pay]
    when: 'double(args.amount) > 100.0'
    action: require_approval
    approvers: ["role:finance"]
    quorum: 1
  - name: writes
    tools: [write_file, move_file]
    action: require_approval
    remember_scopes: [call, session]
    max_remember: 1h
  - name: deploys
    tools: [deploy]
    agents: ["ci-*"]
    action: require_approval
    approvers: ["role:ops"]
    timeout: 10m
    escalation:
      - after: 5m
        approvers: [alice]
  - name: no-shell
    tools: [shell]
    when: 'args.cmd.contains("rm -rf")'
    action: deny
limits:
  - name: pay-per-session
    tools: [pay]
    per: session
    sum: args.amount
    max: 400
    window: 1h
  - name: reads-per-agent
    tools: ["read_*"]
    per: agent
    max: 1000000
    window: 1h
`

// genMsg is one generated stream message.
type genMsg struct {
	subject string
	header  nats.Header
	body    []byte
}

// generate makes the stream of n requests as a broker records them, with
// benchPolicy's mix: about 60 in 100 decided at once (allowed, denied,
// limited), the rest waiting for people, who approve, deny, remember some
// answers, or let them expire.
func generate(tb testing.TB, n int) []genMsg {
	tb.Helper()
	rng := rand.New(rand.NewPCG(1, 2))
	var out []genMsg
	seq := uint64(0)
	add := func(subject, typ, source string, data any, id ...string) uint64 {
		e, err := events.New(typ, append(id, "")[0], source, data)
		if err != nil {
			tb.Fatal(err)
		}
		h, body, err := events.Encode(&e)
		if err != nil {
			tb.Fatal(err)
		}
		out = append(out, genMsg{subject, nats.Header(h), body})
		seq++
		return seq
	}
	at := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	decide := func(id string, req events.Requested, reqSeq uint64, d events.Decided) {
		d.RequestID, d.RequestSeq, d.DecidedAt = id, reqSeq, at
		d.Args = req.Args
		if len(d.Args) == 0 {
			d.Args = json.RawMessage("{}")
		}
		d.ArgsDigest, _ = events.ArgsDigest(d.Args)
		d.RequestDigest, _ = events.RequestDigest(req)
		add(events.DecisionPrefix+id, events.TypeDecided, "broker/bench", d)
	}
	for i := range n {
		at = at.Add(10 * time.Millisecond)
		agent := "agent-" + strconv.Itoa(i%50)
		session := "s-" + strconv.Itoa(i%2000)
		id := events.NewID()
		var req events.Requested
		waits := false
		var auto events.Decided
		switch k := rng.IntN(100); {
		case k < 35:
			req = events.Requested{Tool: []string{"read_file", "list_dir", "get_user", "search_docs"}[k%4], Args: json.RawMessage(fmt.Sprintf(`{"path":"/srv/data/%d.csv","limit":%d}`, i, k))}
			auto = events.Decided{Outcome: events.Approved, Rule: "reads", Auto: true, Reason: "allowed by rule reads"}
		case k < 42:
			req = events.Requested{Tool: "cat_file", Args: json.RawMessage(fmt.Sprintf(`{"path":"/tmp/x-%d"}`, i))}
			auto = events.Decided{Outcome: events.Approved, Rule: "tmp-files", Auto: true}
		case k < 48:
			req = events.Requested{Tool: "drop_table", Labels: map[string]string{"env": "production"}, Args: json.RawMessage(`{"table":"users"}`)}
			auto = events.Decided{Outcome: events.Denied, Rule: "no-drop-in-prod", Auto: true}
		case k < 60:
			req = events.Requested{Tool: "pay", User: "u-" + strconv.Itoa(i%300), Args: json.RawMessage(fmt.Sprintf(`{"amount":%d,"currency":"EUR"}`, 10+k))}
			auto = events.Decided{Outcome: events.Approved, Rule: "small-pay", Auto: true}
		case k < 66:
			req = events.Requested{Tool: "sql_exec", Labels: map[string]string{"env": "prod", "team": "core"}, Args: json.RawMessage(`{"statement":"SELECT * FROM t"}`)}
			waits = true
		case k < 85:
			req = events.Requested{Tool: "write_file", Args: json.RawMessage(fmt.Sprintf(`{"path":"/srv/out/%d","content":"hello"}`, i%40))}
			waits = true
		case k < 92:
			req = events.Requested{Tool: "pay", Args: json.RawMessage(fmt.Sprintf(`{"amount":%d}`, 150+k*10))}
			waits = true
		default:
			agent = "ci-" + strconv.Itoa(i%5)
			req = events.Requested{Tool: "deploy", Args: json.RawMessage(`{"service":"api","version":"1.2.3"}`)}
			waits = true
		}
		req.Agent, req.Session = agent, session
		reqSeq := add(events.RequestPrefix+agent, events.TypeRequested, "agent/"+agent, req, id)
		if !waits {
			decide(id, req, reqSeq, auto)
			continue
		}
		pend := events.Pending{RequestID: id, Request: req, Deadline: at.Add(time.Hour), Rule: "writes", RequestSeq: reqSeq, ReceivedAt: at,
			Terms: &events.Terms{Quorum: 1, Remember: &events.RememberTerms{Scopes: []string{"call", "session"}, MaxTTL: events.Duration(time.Hour)}}}
		pendSeq := add(events.PendingPrefix+agent, events.TypePending, "broker/bench", pend)
		switch k := rng.IntN(10); {
		case k < 7:
			resp := events.Responded{Decision: events.Approve, Channel: "slack"}
			if k == 0 {
				resp.Remember = &events.Remember{Scope: events.ScopeSession, TTL: events.Duration(30 * time.Minute)}
			}
			ans := add(events.ResponsePrefix+"alice."+id, events.TypeResponded, "approver/alice", resp)
			decide(id, req, reqSeq, events.Decided{Outcome: events.Approved, Rule: "writes", DecidedBy: []events.DecidedBy{{Principal: "alice", Channel: "slack", Decision: events.Approve, At: at}}, Trail: []uint64{pendSeq, ans}})
		case k < 9:
			ans := add(events.ResponsePrefix+"bob."+id, events.TypeResponded, "approver/bob", events.Responded{Decision: events.Deny, Reason: "no"})
			decide(id, req, reqSeq, events.Decided{Outcome: events.Denied, Rule: "writes", Reason: "no", DecidedBy: []events.DecidedBy{{Principal: "bob", Decision: events.Deny, At: at}}, Trail: []uint64{pendSeq, ans}})
		default:
			decide(id, req, reqSeq, events.Decided{Outcome: events.Expired, Rule: "writes", Auto: true, Reason: "timeout: no decision before the deadline", Trail: []uint64{pendSeq}})
		}
	}
	return out
}

// requests counts the request messages among msgs.
func requests(msgs []genMsg) int {
	n := 0
	for _, m := range msgs {
		if len(m.subject) > len(events.RequestPrefix) && m.subject[:len(events.RequestPrefix)] == events.RequestPrefix {
			n++
		}
	}
	return n
}

func benchSize(b *testing.B) int {
	if s := os.Getenv("REPLAY_BENCH_REQUESTS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil {
			b.Fatal(err)
		}
		return n
	}
	return 100_000
}

// BenchmarkApply replays benchPolicy over a generated history held in
// memory: the replay's own work (decoding, evaluating, remembered choices,
// limits, comparing), without NATS. Run it on one core:
//
//	go test -run '^$' -bench BenchmarkApply -cpu 1 ./internal/replay/
func BenchmarkApply(b *testing.B) {
	n := benchSize(b)
	gen := generate(b, n)
	p, err := policy.Parse([]byte(benchPolicy), "bench.yaml")
	if err != nil {
		b.Fatal(err)
	}
	msgs := make([]replay.Message, len(gen))
	start := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	for i, m := range gen {
		msgs[i] = replay.Message{Seq: uint64(i + 1), Subject: m.subject, Header: m.header, Data: m.body, Time: start.Add(time.Duration(i) * 4 * time.Millisecond)}
	}
	reqs := requests(gen)
	b.ReportAllocs()
	b.ResetTimer()
	rounds := 0
	var rep *replay.Report
	cpu := cpuTime()
	for b.Loop() {
		r := replay.New(p, replay.Config{List: 100})
		for _, m := range msgs {
			r.Apply(m)
		}
		rep = r.Report()
		rounds++
	}
	cpu = cpuTime() - cpu
	if rep.Replayed != reqs || rep.Requests != reqs {
		b.Fatalf("replayed %d, decided %d, of %d requests", rep.Replayed, rep.Requests, reqs)
	}
	report(b, reqs*rounds, len(msgs)*rounds, cpu)
}

// BenchmarkReplayStream is BenchmarkApply reading the history from a
// stream written in the broker's format, over NATS (replay.Run, as `broker
// policy replay` does). By default the NATS server runs in the benchmark's
// process, so on one core (-cpu 1) it shares that core with the replay;
// REPLAY_BENCH_NATS=URL names a server of its own instead (one with no
// ASSENT stream: the benchmark makes it, and deletes it when done):
//
//	go test -run '^$' -bench BenchmarkReplayStream -benchtime 3x -cpu 1 ./internal/replay/
func BenchmarkReplayStream(b *testing.B) {
	n := benchSize(b)
	gen := generate(b, n)
	p, err := policy.Parse([]byte(benchPolicy), "bench.yaml")
	if err != nil {
		b.Fatal(err)
	}
	var nc *nats.Conn
	if url := os.Getenv("REPLAY_BENCH_NATS"); url != "" {
		if nc, err = nats.Connect(url); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(nc.Close)
	} else {
		nc = testenv.Conn(b, testenv.Server(b))
	}
	js, err := jetstream.New(nc)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: events.StreamName, Subjects: []string{events.AllSubjects}, Storage: jetstream.FileStorage, MaxAge: 720 * time.Hour}); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = js.DeleteStream(context.Background(), events.StreamName) })
	for i := 0; i < len(gen); i += 1000 {
		var acks []jetstream.PubAckFuture
		for _, m := range gen[i:min(i+1000, len(gen))] {
			f, err := js.PublishMsgAsync(&nats.Msg{Subject: m.subject, Header: m.header, Data: m.body})
			if err != nil {
				b.Fatal(err)
			}
			acks = append(acks, f)
		}
		for _, f := range acks {
			select {
			case <-f.Ok():
			case err := <-f.Err():
				b.Fatal(err)
			}
		}
	}
	reqs, msgs := requests(gen), len(gen)
	gen = nil
	b.ReportAllocs()
	b.ResetTimer()
	rounds := 0
	cpu := cpuTime()
	for b.Loop() {
		rep, err := replay.Run(ctx, js, events.StreamName, p, replay.Config{List: 100})
		if err != nil {
			b.Fatal(err)
		}
		if rep.Replayed != reqs || rep.Requests != reqs {
			b.Fatalf("replayed %d, decided %d, of %d requests", rep.Replayed, rep.Requests, reqs)
		}
		rounds++
	}
	report(b, reqs*rounds, msgs*rounds, cpuTime()-cpu)
}

// report reports the rates of a benchmark that replayed reqs requests in
// msgs messages, using cpu of CPU time: per second of the wall clock, and
// per second of CPU time of this process, which on a machine shared with
// other work says more.
func report(b *testing.B, reqs, msgs int, cpu time.Duration) {
	secs := b.Elapsed().Seconds()
	b.ReportMetric(float64(reqs)/secs, "requests/s")
	b.ReportMetric(float64(msgs)/secs, "msgs/s")
	if cpu > 0 {
		b.ReportMetric(float64(reqs)/cpu.Seconds(), "requests/cpu-s")
	}
	b.ReportMetric(0, "ns/op")
}
