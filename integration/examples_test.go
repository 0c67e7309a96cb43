package integration

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

	"github.com/assent-dev/assent/integration/itest"
	"github.com/assent-dev/assent/internal/broker"
	"github.com/assent-dev/assent/internal/creds"
	"github.com/assent-dev/assent/internal/doccheck"
	"github.com/assent-dev/assent/internal/testenv"
	"github.com/assent-dev/assent/pkg/events"
)

// The example agents of examples/python (HTTP) and examples/typescript
// (CloudEvents on NATS JetStream), run as programs against a broker on
// embedded NATS. One scenario suite runs against both: each agent guards
// delete_file on a file of t.TempDir(), the test answers as an approver once
// the broker holds the request pending, and looks at the file.

// exampleAgent is one example agent program.
type exampleAgent struct {
	name string
	// command returns the program and its script, ready to run; it skips
	// the test where the program is missing (fails with CI=true).
	command func(t *testing.T) []string
	// flags tell the agent where e's broker is.
	flags func(e *itest.Env) []string
	// live: the agent reads the decided events of its request as the
	// stream stores them (over NATS), rather than once the broker's HTTP
	// API says the request is decided.
	live bool
}

var exampleAgents = []exampleAgent{
	{"python", pythonAgent, func(e *itest.Env) []string { return []string{"--url", e.API} }, false},
	{"typescript", typescriptAgent, func(e *itest.Env) []string { return []string{"--nats-url", e.NS.ClientURL()} }, true},
}

// TestExampleAgents: each example deletes the file only once approved, and
// then the file the decided args name; a denial deletes nothing, exits 3
// with the reason, and a retry under the same id gets the same denial
// without anybody answering; Ctrl-C cancels the request (exit 5); an id
// already used by a different request is refused (exit 1) rather than taken
// as this request's decision.
func TestExampleAgents(t *testing.T) {
	for _, ex := range exampleAgents {
		t.Run(ex.name, func(t *testing.T) {
			prog := ex.command(t)
			e := itest.NewEnv(t, broker.Config{})
			start := func(t *testing.T, agent, id, file string, more ...string) *agentProc {
				t.Helper()
				return startAgent(t, append(append(append(prog, ex.flags(e)...), "--agent", agent, "--id", id), append(more, file)...))
			}

			t.Run("approved", func(t *testing.T) {
				file := tempFile(t, "q3 <draft> & ü.csv") // the request digest must escape this name right
				id := events.NewID()
				p := start(t, "ex-approve", id, file)
				p.waitPending(t, e, id)
				mustExist(t, file, true) // nothing runs before the decision
				itest.AnswerNATS(t, e.JS, "alice", id, events.Responded{Decision: events.Approve, Reason: "fine"})
				p.exits(t, 0, "deleted "+file)
				mustExist(t, file, false)
			})

			t.Run("edited", func(t *testing.T) {
				file, draft := tempFile(t, "q3.csv"), tempFile(t, "q3-draft.csv")
				id := events.NewID()
				p := start(t, "ex-edit", id, file)
				p.waitPending(t, e, id)
				// The edit holds what the args digest must get exactly right:
				// numbers as written, escapes, characters beyond U+FFFF, keys
				// that sort differently by UTF-8 bytes than by UTF-16 units.
				edit := fmt.Sprintf(`{"path":%s,"note":"Q3 \u003cdraft\u003e & \u2028 \ud83d\ude00 \"x\"\n","ratio":1.50,`+
					`"max_bytes":12345678901234567890,"\uff61":1,"😀":[1e3,-0.0,true,null,{}]}`, jsonText(t, draft))
				itest.AnswerNATS(t, e.JS, "alice", id, events.Responded{Decision: events.Approve, Args: json.RawMessage(edit)})
				p.exits(t, 0, "deleted "+draft)
				mustExist(t, file, true)
				mustExist(t, draft, false)
			})

			t.Run("denied then retried", func(t *testing.T) {
				file := tempFile(t, "q3.csv")
				id := events.NewID()
				p := start(t, "ex-deny", id, file)
				p.waitPending(t, e, id)
				itest.AnswerNATS(t, e.JS, "alice", id, events.Responded{Decision: events.Deny, Reason: "keep Q3 until the audit"})
				p.exits(t, 3, "keep Q3 until the audit")
				// The same id again is the same request: its decision, at once.
				start(t, "ex-deny", id, file).exits(t, 3, "keep Q3 until the audit")
				mustExist(t, file, true)
				if n := itest.CountDecisions(t, e.JS, id); n != 1 {
					t.Fatalf("%d decided events for %s, want 1", n, id)
				}
			})

			t.Run("cancelled", func(t *testing.T) {
				file := tempFile(t, "q3.csv")
				id := events.NewID()
				p := start(t, "ex-cancel", id, file)
				p.waitPending(t, e, id)
				if err := p.cmd.Process.Signal(os.Interrupt); err != nil {
					t.Fatal(err)
				}
				p.exits(t, 5, "cancelled")
				itest.WaitState(t, e.B, id, broker.StateCancelled)
				mustExist(t, file, true)
			})

			t.Run("id of another request", func(t *testing.T) {
				file, other := tempFile(t, "q3.csv"), tempFile(t, "other.csv")
				id := events.NewID()
				itest.ApprovalOf(t, itest.Call(t, http.MethodPost, e.API+"/v1/approvals", map[string]any{
					"id": id, "agent": "ex-conflict", "tool": "delete_file", "args": map[string]string{"path": other}}), http.StatusCreated)
				itest.AnswerNATS(t, e.JS, "alice", id, events.Responded{Decision: events.Approve})
				itest.WaitState(t, e.B, id, broker.StateApproved)
				start(t, "ex-conflict", id, file).exits(t, 1, "different request")
				mustExist(t, file, true)
				mustExist(t, other, true)
			})

			if ex.name == "python" {
				// The answer to the first POST is lost after the broker took
				// the request: the agent sends it again under the same id and
				// gets that request's decision, not a second request.
				t.Run("network error", func(t *testing.T) {
					lossy := *e
					lossy.API = loseFirstCreate(t, e.API)
					file := tempFile(t, "q3.csv")
					id := events.NewID()
					p := startAgent(t, append(append(prog, ex.flags(&lossy)...), "--agent", "ex-lossy", "--id", id, file))
					p.waitPending(t, e, id)
					itest.AnswerNATS(t, e.JS, "alice", id, events.Responded{Decision: events.Approve})
					if out := p.exits(t, 0, "deleted "+file); !strings.Contains(out, "retrying") {
						t.Fatalf("the agent did not say it retried:\n%s", out)
					}
					if n := countRecords(t, e.B, "ex-lossy"); n != 1 {
						t.Fatalf("%d requests of ex-lossy, want 1", n)
					}
				})
			}
		})
	}
}

// TestExampleAgentSignedDecisions: each example agent given the broker's
// decision key acts on a decision only if that key signed it. Before the
// broker decides, a decided event approving another file (its digests
// right) is stored on the request's decision subject: unsigned, signed by
// a key the agent does not trust, or signed by the broker's key over other
// values (signed as a denial, or for other args). The agent skips it and
// says so, keeps waiting, and obeys the broker's signed decision.
func TestExampleAgentSignedDecisions(t *testing.T) {
	key, err := events.NewDecisionKey()
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := key.PublicKey()
	brokerKey, _ := events.NewSigner(key)
	untrusted, _ := events.NewDecisionKey()
	otherKey, _ := events.NewSigner(untrusted)

	// Each forgery returns the body of a decided event that approves
	// request rec on other, the file the agent did not ask about; file is
	// the one it asked about.
	tests := []struct {
		name   string
		forge  func(t *testing.T, rec broker.Record, file, other string) []byte
		answer events.Verdict
		env    bool // the key in ASSENT_TRUST_DECISION_KEY, not a flag
	}{
		{name: "none", answer: events.Approve, env: true},
		{name: "unsigned", answer: events.Approve, forge: func(t *testing.T, rec broker.Record, _, other string) []byte {
			return decidedBody(t, rec, events.Approved, other, nil)
		}},
		{name: "untrusted key", answer: events.Deny, forge: func(t *testing.T, rec broker.Record, _, other string) []byte {
			return decidedBody(t, rec, events.Approved, other, otherKey)
		}},
		{name: "outcome changed", answer: events.Deny, forge: func(t *testing.T, rec broker.Record, _, other string) []byte {
			denial := decidedBody(t, rec, events.Denied, other, brokerKey)
			return changeData(t, denial, map[string]any{"outcome": "approved"})
		}},
		{name: "args digest changed", answer: events.Approve, forge: func(t *testing.T, rec broker.Record, file, other string) []byte {
			approval := decidedBody(t, rec, events.Approved, file, brokerKey)
			args := fmt.Sprintf(`{"path":%s}`, jsonText(t, other))
			return changeData(t, approval, map[string]any{"args": json.RawMessage(args), "args_digest": mustDigest(t, args)})
		}},
	}
	for _, ex := range exampleAgents {
		t.Run(ex.name, func(t *testing.T) {
			prog := ex.command(t)
			e := itest.NewEnv(t, broker.Config{DecisionKey: key})
			for _, tt := range tests {
				t.Run(tt.name, func(t *testing.T) {
					file, other := tempFile(t, "q3.csv"), tempFile(t, "other.csv")
					id := events.NewID()
					args := append(append(prog, ex.flags(e)...), "--agent", "ex-signed", "--id", id)
					var env []string
					if tt.env {
						env = []string{"ASSENT_TRUST_DECISION_KEY=" + pub}
					} else {
						args = append(args, "--trust-decision-key", pub)
					}
					p := startAgentEnv(t, env, append(args, file))
					rec := p.waitPending(t, e, id)
					if tt.forge != nil {
						itest.MustPublish(t, e.JS, events.DecisionPrefix+id, tt.forge(t, rec, file, other), "")
						if ex.live {
							// It reads the forgery as the stream stores it, and keeps waiting.
							p.waitOutput(t, "no trusted key signed")
						}
					}
					itest.AnswerNATS(t, e.JS, "alice", id, events.Responded{Decision: tt.answer, Reason: "the broker's"})
					var out string
					if tt.answer == events.Approve {
						out = p.exits(t, 0, "deleted "+file)
					} else {
						out = p.exits(t, 3, "the broker's")
						mustExist(t, file, true)
					}
					mustExist(t, other, true)
					if skipped := strings.Contains(out, "no trusted key signed"); skipped != (tt.forge != nil) {
						t.Fatalf("the agent said it skipped a message: %v, want %v:\n%s", skipped, tt.forge != nil, out)
					}
				})
			}

			// A key that is not an account public key stops the agent before
			// it asks anything.
			userKey, _ := nkeys.CreateUser()
			user, _ := userKey.PublicKey()
			checksum := pub[:55] + "A"
			if pub[55] == 'A' {
				checksum = pub[:55] + "B"
			}
			for _, bad := range []struct{ name, flag, env string }{
				{name: "user key", flag: user},
				{name: "checksum", flag: checksum},
				{name: "seed", flag: "SAAAAAICAMCAKBQHBAEQUCYMBUHA6EARCIJRIFIWC4MBSGQ3DQOR4HYMHI"},
				{name: "environment", env: pub + "," + checksum},
			} {
				t.Run("malformed key/"+bad.name, func(t *testing.T) {
					args := append(prog, ex.flags(e)...)
					if bad.flag != "" {
						args = append(args, "--trust-decision-key", bad.flag)
					}
					file := tempFile(t, "q3.csv")
					p := startAgentEnv(t, []string{"ASSENT_TRUST_DECISION_KEY=" + bad.env}, append(args, file))
					p.exits(t, 2, "not an nkeys account public key")
					mustExist(t, file, true)
				})
			}
		})
	}
}

// decidedBody is a decided event in structured mode with outcome for
// request rec, whose args name path, its digests right, signed by signer
// unless it is nil.
func decidedBody(t *testing.T, rec broker.Record, outcome events.Outcome, path string, signer *events.Signer) []byte {
	t.Helper()
	args := fmt.Sprintf(`{"path":%s}`, jsonText(t, path))
	e, err := events.New(events.TypeDecided, events.NewID(), "broker/forged", events.Decided{
		RequestID: rec.ID, Outcome: outcome, Args: json.RawMessage(args), ArgsDigest: mustDigest(t, args),
		RequestDigest: rec.RequestDigest, DecidedAt: time.Now().UTC(),
	})
	if err != nil {
		t.Fatal(err)
	}
	if signer != nil {
		if err := signer.Sign(&e); err != nil {
			t.Fatal(err)
		}
	}
	_, body, err := events.Encode(&e)
	if err != nil {
		t.Fatal(err)
	}
	return body
}

// changeData returns the event body with the data fields in change set to
// new values, its signature, if any, left as it was.
func changeData(t *testing.T, body []byte, change map[string]any) []byte {
	t.Helper()
	var e map[string]any
	if err := json.Unmarshal(body, &e); err != nil {
		t.Fatal(err)
	}
	data := e["data"].(map[string]any)
	for k, v := range change {
		data[k] = v
	}
	out, err := json.Marshal(e)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestExampleSignatureChecks: the example agents' checks of signed
// decisions agree with pkg/events on the worked example of docs/protocol.md
// ("Signed decisions"), which TestSignatureDocExample holds to
// events.Signer byte for byte. Python: examples/python/test_ed25519_verify.py,
// which also runs RFC 8032's test vectors and signatures that must not
// verify; TypeScript: dist/verify-decision.js on the example's event, and
// on the event changed.
func TestExampleSignatureChecks(t *testing.T) {
	t.Run("python", func(t *testing.T) {
		cmd := exec.Command(testenv.Program(t, "python3", "python3"), "test_ed25519_verify.py", "-v")
		cmd.Dir = examplePath(t, "python")
		cmd.Env = append(os.Environ(), "PYTHONDONTWRITEBYTECODE=1")
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "\nOK\n") {
			t.Fatalf("test_ed25519_verify.py: %v\n%s", err, out)
		}
	})

	t.Run("typescript", func(t *testing.T) {
		prog := typescriptAgent(t)
		verifier := []string{prog[0], filepath.Join(filepath.Dir(prog[1]), "verify-decision.js")}
		ex := docSignatureExample(t)
		pub, event := ex[1], ex[2]
		otherKey, _ := events.NewDecisionKey()
		other, _ := otherKey.PublicKey()
		change := func(from, to string) string {
			t.Helper()
			changed := strings.Replace(event, from, to, 1)
			if changed == event {
				t.Fatalf("the example's event holds no %s", from)
			}
			return changed
		}
		tests := []struct {
			name  string
			event string
			keys  []string
			code  int
			want  string
		}{
			{"as signed", event, []string{pub}, 0, "a trusted key signed it: approved"},
			{"one of two keys", event, []string{other, pub}, 0, "a trusted key signed it: approved"},
			{"key not trusted", event, []string{other}, 1, "no trusted key signed it"},
			{"outcome changed", change(`"outcome": "approved"`, `"outcome": "denied"`), []string{pub}, 1, "no trusted key signed it"},
			{"args digest changed", change(`"args_digest": "sha256:8f`, `"args_digest": "sha256:9f`), []string{pub}, 1, "no trusted key signed it"},
			{"decided_at written otherwise", change(`"decided_at": "2025-01-02T03:04:05.25Z"`, `"decided_at": "2025-01-02T03:04:05.250Z"`), []string{pub}, 1, "no trusted key signed it"},
			{"signature's last bits not zero", change(`OvDQ"`, `OvDR"`), []string{pub}, 1, "no trusted key signed it"},
			{"reason changed (not signed)", change(`"reason": "only the draft"`, `"reason": "anything"`), []string{pub}, 0, "a trusted key signed it: approved"},
			{"no key", event, nil, 2, "usage"},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				args := slices.Clone(verifier)
				for _, k := range tt.keys {
					args = append(args, "--trust-decision-key", k)
				}
				cmd := exec.Command(args[0], args[1:]...)
				cmd.Stdin = strings.NewReader(tt.event)
				out, err := cmd.CombinedOutput()
				code := 0
				var exit *exec.ExitError
				switch {
				case errors.As(err, &exit):
					code = exit.ExitCode()
				case err != nil:
					t.Fatal(err)
				}
				if code != tt.code || !strings.Contains(string(out), tt.want) {
					t.Fatalf("verify-decision.js exited with %d, want %d and output saying %q:\n%s", code, tt.code, tt.want, out)
				}
			})
		}
	})
}

// docSignatureExample returns the code blocks of the worked example of
// docs/protocol.md ("Signed decisions"), in order: the seed, the public key,
// the event, the canonical text, the signature, the Python verifier; each
// without the line feed that ends it.
func docSignatureExample(t *testing.T) []string {
	t.Helper()
	const file, heading = "docs/protocol.md", "### Worked example: a signed decision"
	data, err := os.ReadFile(filepath.Join("..", file))
	if err != nil {
		t.Fatal(err)
	}
	// The section runs from its heading to the next "## " heading.
	first, last := 0, math.MaxInt
	for i, line := range strings.Split(string(data), "\n") {
		switch {
		case line == heading:
			first = i + 1
		case first > 0 && strings.HasPrefix(line, "## "):
			last = min(last, i+1)
		}
	}
	var blocks []string
	for _, b := range doccheck.Extract(file, string(data)) {
		if first > 0 && b.Line > first && b.Line < last {
			blocks = append(blocks, strings.TrimSuffix(b.Text, "\n"))
		}
	}
	if len(blocks) != 6 {
		t.Fatalf("%s: %q has %d code blocks, want 6 (seed, public key, event, canonical text, signature, Python)", file, heading, len(blocks))
	}
	return blocks
}

// TestExampleAgentRefusedDecision: the TypeScript agent never acts on a
// publish the stream refused. An approval of its own request, digests and
// all, published on the decision subject with an expected last subject
// sequence the subject does not have, reaches every plain subscriber of
// that subject, but it is not stored, so it is not republished on
// assent-decided.<id>. Nor does the agent take a message there that was
// not the first stored on its subject (Nats-Last-Sequence other than 0):
// it keeps waiting, and obeys the broker's denial.
func TestExampleAgentRefusedDecision(t *testing.T) {
	prog := typescriptAgent(t)
	e := itest.NewEnv(t, broker.Config{})
	file := tempFile(t, "q3.csv")
	id := events.NewID()
	p := startAgent(t, append(prog, "--nats-url", e.NS.ClientURL(), "--agent", "ex-refused", "--id", id, file))
	rec := p.waitPending(t, e, id)

	plain, err := e.NC.SubscribeSync(events.DecisionPrefix + id)
	if err != nil {
		t.Fatal(err)
	}
	args := fmt.Sprintf(`{"path":%s}`, jsonText(t, file))
	approval := itest.RawEvent(events.NewID(), events.TypeDecided, "broker/refused",
		fmt.Sprintf(`{"request_id":%q,"outcome":"approved","args":%s,"args_digest":%q,"request_digest":%q,"decided_at":%q}`,
			id, args, mustDigest(t, args), rec.RequestDigest, time.Now().UTC().Format(time.RFC3339Nano)))
	refused := &nats.Msg{
		Subject: events.DecisionPrefix + id,
		Header: nats.Header{
			"Content-Type":                      {events.ContentTypeStructured},
			jetstream.ExpectedLastSubjSeqHeader: {"999999"},
		},
		Data: approval,
	}
	second := &nats.Msg{
		Subject: events.DecidedPrefix + id,
		Header: nats.Header{
			"Content-Type":            {events.ContentTypeStructured},
			events.SequenceHeader:     {"999999"},
			events.LastSequenceHeader: {"999998"},
		},
		Data: approval,
	}
	for _, m := range []*nats.Msg{refused, second} {
		if err := e.NC.PublishMsg(m); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := plain.NextMsg(itest.Patience); err != nil {
		t.Fatalf("a plain subscriber of %s did not get the refused publish: %v", refused.Subject, err)
	}
	// The agent reads what comes on assent-decided.<id> and, every few
	// seconds, the stored decision: it says it skipped the second message
	// before there is a decision to find, so that it cannot find the
	// broker's first and never read that message.
	p.waitOutput(t, "not the first stored")

	itest.AnswerNATS(t, e.JS, "alice", id, events.Responded{Decision: events.Deny, Reason: "not this one"})
	p.exits(t, 3, "not this one")
	mustExist(t, file, true)
	if n := itest.CountDecisions(t, e.JS, id); n != 1 {
		t.Fatalf("%d decided events stored for %s, want the broker's alone", n, id)
	}
}

// TestExampleAgentWithCredentials: the TypeScript agent works with the
// credentials `broker creds agent NAME` issues, on a server that enforces
// them: it publishes its request and cancel, and reads its decision live and,
// for a retry, from the stream, with nothing beyond an agent's permissions.
func TestExampleAgentWithCredentials(t *testing.T) {
	prog := typescriptAgent(t)
	a, _, err := creds.Init(filepath.Join(t.TempDir(), "keys"))
	if err != nil {
		t.Fatal(err)
	}
	ns := testenv.OperatorServer(t, a.Embedded())
	brokerNC, _ := connectAs(t, ns, a, creds.Identity{Role: creds.RoleBroker, Name: "broker-1"})
	b, _ := itest.RunBroker(t, brokerNC, broker.Config{Name: "creds"})
	e := &itest.Env{NS: ns, NC: brokerNC, JS: itest.NewJS(t, brokerNC), B: b}
	data, err := a.Issue(creds.Identity{Role: creds.RoleAgent, Name: "ex-creds"})
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "ex-creds.creds")
	if err := os.WriteFile(file, data, 0o600); err != nil {
		t.Fatal(err)
	}
	start := func(id, path string) *agentProc {
		return startAgent(t, append(prog, "--nats-url", ns.ClientURL(), "--creds", file, "--agent", "ex-creds", "--id", id, path))
	}

	report := tempFile(t, "q3.csv")
	id := events.NewID()
	p := start(id, report)
	p.waitPending(t, e, id)
	itest.AnswerNATS(t, e.JS, "alice", id, events.Responded{Decision: events.Deny, Reason: "not today"})
	p.exits(t, 3, "not today")
	start(id, report).exits(t, 3, "not today") // read from the stream

	id = events.NewID()
	p = start(id, report)
	p.waitPending(t, e, id)
	if err := p.cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	p.exits(t, 5, "cancelled")

	id = events.NewID()
	p = start(id, report)
	p.waitPending(t, e, id)
	itest.AnswerNATS(t, e.JS, "alice", id, events.Responded{Decision: events.Approve})
	p.exits(t, 0, "deleted "+report)
}

// pythonAgent is examples/python/agent.py run by python3.
func pythonAgent(t *testing.T) []string {
	t.Helper()
	return []string{testenv.Program(t, "python3", "python3"), examplePath(t, "python", "agent.py")}
}

// tsBuild is examples/typescript, built once per test binary.
var tsBuild struct {
	sync.Mutex
	done bool
}

// typescriptAgent is examples/typescript's agent run by node, once its
// packages are installed (npm ci, when node_modules is missing or older
// than package-lock.json) and it is compiled (tsc).
func typescriptAgent(t *testing.T) []string {
	t.Helper()
	node := testenv.Program(t, "nodejs", "node")
	dir := examplePath(t, "typescript")
	tsBuild.Lock()
	defer tsBuild.Unlock()
	if !tsBuild.done {
		installed, err := os.Stat(filepath.Join(dir, "node_modules", ".package-lock.json")) // npm ci writes it
		lock, lerr := os.Stat(filepath.Join(dir, "package-lock.json"))
		if err != nil || lerr != nil || lock.ModTime().After(installed.ModTime()) {
			runIn(t, dir, testenv.Program(t, "npm", "npm"), "ci", "--no-audit", "--no-fund")
		}
		runIn(t, dir, node, filepath.Join("node_modules", "typescript", "bin", "tsc"))
		tsBuild.done = true
	}
	return []string{node, filepath.Join(dir, "dist", "agent.js")}
}

// examplePath is a path under examples/.
func examplePath(t *testing.T, elem ...string) string {
	t.Helper()
	p, err := filepath.Abs(filepath.Join(append([]string{"..", "examples"}, elem...)...))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// runIn runs a build step in dir, failing the test with its output.
func runIn(t *testing.T, dir, prog string, args ...string) {
	t.Helper()
	cmd := exec.Command(prog, args...)
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s %s in %s: %v\n%s", filepath.Base(prog), strings.Join(args, " "), dir, err, out)
	}
}

// agentProc is a running example agent.
type agentProc struct {
	cmd  *exec.Cmd
	out  itest.LockedBuffer // stdout and stderr
	done chan struct{}
	err  error // what Wait returned
}

// startAgent runs the command line args; it is killed if still running
// when the test ends.
func startAgent(t *testing.T, args []string) *agentProc {
	t.Helper()
	return startAgentEnv(t, nil, args)
}

// startAgentEnv is startAgent with the environment variables env
// ("NAME=value") set.
func startAgentEnv(t *testing.T, env, args []string) *agentProc {
	t.Helper()
	p := &agentProc{cmd: exec.Command(args[0], args[1:]...), done: make(chan struct{})}
	// Settings from the environment that would change what the agents do,
	// and no __pycache__ written into examples/python.
	p.cmd.Env = append(os.Environ(), "ASSENT_TOKEN=", "ASSENT_USER=", "ASSENT_TRUST_DECISION_KEY=", "NATS_CREDS=", "PYTHONDONTWRITEBYTECODE=1")
	p.cmd.Env = append(p.cmd.Env, env...) // the last value of a name is the one set
	p.cmd.Stdout, p.cmd.Stderr = &p.out, &p.out
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		<-p.done
	})
	return p
}

// waitOutput waits until the agent has printed want, failing with its
// output if it exits first or does not print it within itest.Patience.
func (p *agentProc) waitOutput(t *testing.T, want string) {
	t.Helper()
	itest.Eventually(t, itest.Patience, func() (bool, string) {
		select {
		case <-p.done:
			t.Fatalf("the agent exited (%v) before printing %q:\n%s", p.err, want, p.out.String())
		default:
		}
		return strings.Contains(p.out.String(), want), fmt.Sprintf("the agent has not printed %q:\n%s", want, p.out.String())
	})
}

// waitPending waits until the broker holds request id pending, failing
// with the agent's output if the agent exits first.
func (p *agentProc) waitPending(t *testing.T, e *itest.Env, id string) broker.Record {
	t.Helper()
	var rec broker.Record
	itest.Eventually(t, itest.Patience, func() (bool, string) {
		select {
		case <-p.done:
			t.Fatalf("the agent exited (%v) before request %s was pending:\n%s", p.err, id, p.out.String())
		default:
		}
		var err error
		rec, err = e.B.Get(context.Background(), id)
		return err == nil && rec.State == broker.StatePending, fmt.Sprintf("request %s: %q %v", id, rec.State, err)
	})
	return rec
}

// exits waits for the agent to end, checks its exit status and that its
// output contains want, and returns the output.
func (p *agentProc) exits(t *testing.T, code int, want string) string {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(itest.Patience):
		_ = p.cmd.Process.Kill()
		<-p.done
		t.Fatalf("the agent still ran after %s:\n%s", itest.Patience, p.out.String())
	}
	out := p.out.String()
	got := 0
	var exit *exec.ExitError
	switch {
	case errors.As(p.err, &exit):
		got = exit.ExitCode()
	case p.err != nil:
		t.Fatalf("agent: %v\n%s", p.err, out)
	}
	if got != code || !strings.Contains(out, want) {
		t.Fatalf("the agent exited with %d, want %d and output saying %q:\n%s", got, code, want, out)
	}
	return out
}

// loseFirstCreate serves api through a proxy that loses its answer to the
// first POST /v1/approvals: the broker takes the request (and the long
// poll runs its course), then the connection closes without a response.
func loseFirstCreate(t *testing.T, api string) string {
	t.Helper()
	target, err := url.Parse(api)
	if err != nil {
		t.Fatal(err)
	}
	proxy := httputil.NewSingleHostReverseProxy(target)
	var lost atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && r.URL.Path == "/v1/approvals" && lost.CompareAndSwap(false, true) {
			proxy.ServeHTTP(httptest.NewRecorder(), r)
			if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
				_ = conn.Close()
			}
			return
		}
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// tempFile makes a file named name in a new t.TempDir() and returns its path.
func tempFile(t *testing.T, name string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte("report\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// mustExist checks whether path exists.
func mustExist(t *testing.T, path string, want bool) {
	t.Helper()
	_, err := os.Stat(path)
	if got := err == nil; got != want || err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("%s exists: %v (%v), want %v", path, got, err, want)
	}
}

// jsonText is s as a JSON string.
func jsonText(t *testing.T, s string) string {
	t.Helper()
	b, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
