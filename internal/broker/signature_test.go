package broker_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

	"github.com/assent-dev/assent/internal/broker"
	"github.com/assent-dev/assent/internal/brokertest"
	"github.com/assent-dev/assent/internal/testenv"
	"github.com/assent-dev/assent/pkg/events"
)

// decisionKey makes a decision key and returns it with its public key.
func decisionKey(t *testing.T) (nkeys.KeyPair, string) {
	t.Helper()
	kp, err := events.NewDecisionKey()
	if err != nil {
		t.Fatal(err)
	}
	pub, err := kp.PublicKey()
	if err != nil {
		t.Fatal(err)
	}
	return kp, pub
}

// storedDecisions reads every message stored on request id's decision
// subject, in order, as decoded events.
func storedDecisions(t *testing.T, js jetstream.JetStream, id string) []events.Event {
	t.Helper()
	s, err := js.Stream(tctx(t), events.StreamName)
	if err != nil {
		t.Fatal(err)
	}
	var out []events.Event
	for seq := uint64(1); ; {
		m, err := s.GetMsg(tctx(t), seq, jetstream.WithGetMsgSubject(events.DecisionPrefix+id))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		e, err := events.Codec{MaxSize: 2 << 20}.Decode(events.Header(m.Header), m.Data)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, e)
		seq = m.Sequence + 1
	}
}

// TestDecisionsSigned: with a decision key, every decided event the broker
// publishes (answered, cancelled, expired, automatic) carries a signature
// that its public key verifies, over the decision the state records.
func TestDecisionsSigned(t *testing.T) {
	ns := testenv.Server(t)
	key, pub := decisionKey(t)
	b := start(t, testenv.Conn(t, ns), broker.Config{Name: "signer", DecisionKey: key})
	js, err := jetstream.New(testenv.Conn(t, ns))
	if err != nil {
		t.Fatal(err)
	}
	trusted, err := events.NewTrustedKeys(pub)
	if err != nil {
		t.Fatal(err)
	}
	submit := func(timeout events.Duration) string {
		rec, err := b.Submit(tctx(t), "", "agent/signed", events.Requested{Tool: "rm", Agent: "signed", Args: json.RawMessage(`{"path":"/tmp/x"}`), Timeout: timeout})
		if err != nil {
			t.Fatal(err)
		}
		return rec.ID
	}
	answered, cancelled, expired := submit(0), submit(0), submit(events.Duration(1e9))
	if _, err := b.Respond(tctx(t), "alice", answered, events.Responded{Decision: events.Approve, Args: json.RawMessage(`{"path":"/tmp/y"}`)}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Cancel(tctx(t), cancelled, "ops", "stop"); err != nil {
		t.Fatal(err)
	}
	want := map[string]events.Outcome{answered: events.Approved, cancelled: events.Cancelled, expired: events.Expired}
	for id, outcome := range want {
		waitDecision(t, ns, id, outcome)
		rec, err := b.Get(tctx(t), id)
		if err != nil {
			t.Fatal(err)
		}
		stored := storedDecisions(t, js, id)
		if len(stored) != 1 {
			t.Fatalf("%s: %d decided events", outcome, len(stored))
		}
		d, err := trusted.Verify(&stored[0])
		if err != nil {
			t.Fatalf("%s: %v", outcome, err)
		}
		if stored[0].ID() != rec.DecisionEventID || d.Outcome != outcome || !d.DecidedAt.Equal(rec.Decision.DecidedAt) || d.ArgsDigest != rec.Decision.ArgsDigest {
			t.Fatalf("%s: the signed event %s says %+v, the state %s %+v", outcome, stored[0].ID(), d, rec.DecisionEventID, rec.Decision)
		}
	}
	if n := b.Stats().ForgedDecisions; n != 0 {
		t.Fatalf("%d forged decisions counted", n)
	}

	// An automatic decision, from a broker with the key and an earlier one.
	ns2 := testenv.Server(t)
	_, earlier := decisionKey(t)
	auto := start(t, testenv.Conn(t, ns2), broker.Config{Name: "auto", Mode: broker.ModeAutoApprove, DecisionKey: key, TrustedDecisionKeys: []string{earlier}})
	rec, err := auto.Submit(tctx(t), "", "agent/signed", events.Requested{Tool: "ls", Agent: "signed"})
	if err != nil {
		t.Fatal(err)
	}
	waitDecision(t, ns2, rec.ID, events.Approved)
	js2, err := jetstream.New(testenv.Conn(t, ns2))
	if err != nil {
		t.Fatal(err)
	}
	stored := storedDecisions(t, js2, rec.ID)
	if len(stored) != 1 {
		t.Fatalf("automatic: %d decided events", len(stored))
	}
	if d, err := trusted.Verify(&stored[0]); err != nil || !d.Auto {
		t.Fatalf("automatic: %+v %v", d, err)
	}
}

// TestSignedDecisionAfterForgery: a decided event nobody trusted signed,
// stored before the broker's, is a forgery the broker logs and counts once,
// and no longer blocks it: the broker's signed decision follows it, the
// answer succeeds, and the subject holds exactly one event that verifies.
func TestSignedDecisionAfterForgery(t *testing.T) {
	ns := testenv.Server(t)
	key, pub := decisionKey(t)
	b := start(t, testenv.Conn(t, ns), broker.Config{Name: "signer", DecisionKey: key})
	nc := testenv.Conn(t, ns)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	trusted, _ := events.NewTrustedKeys(pub)
	stranger, _ := decisionKey(t)
	strangerSigner, _ := events.NewSigner(stranger)

	cases := []struct {
		name string
		sign func(e *events.Event)
	}{
		{"unsigned", func(*events.Event) {}},
		{"signed by an untrusted key", func(e *events.Event) {
			if err := strangerSigner.Sign(e); err != nil {
				t.Fatal(err)
			}
		}},
		{"a signature copied from another key", func(e *events.Event) {
			if err := strangerSigner.Sign(e); err != nil {
				t.Fatal(err)
			}
			v := e.Extensions()[events.SignatureAttribute].(string)
			_ = e.Context.SetExtension(events.SignatureAttribute, "v1."+pub+v[strings.LastIndexByte(v, '.'):])
		}},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rec, err := b.Submit(tctx(t), "", "agent/victim", events.Requested{Tool: "rm", Agent: "victim", Args: json.RawMessage(`{"path":"/tmp/x"}`)})
			if err != nil {
				t.Fatal(err)
			}
			forged := events.Decided{RequestID: rec.ID, Outcome: events.Approved, Args: json.RawMessage(`{"path":"/"}`),
				DecidedAt: rec.ReceivedAt, RequestDigest: rec.RequestDigest}
			forged.ArgsDigest, _ = events.ArgsDigest(forged.Args)
			e, err := events.New(events.TypeDecided, "", "broker/evil", forged)
			if err != nil {
				t.Fatal(err)
			}
			c.sign(&e)
			h, body, err := events.Encode(&e)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := js.PublishMsg(tctx(t), &nats.Msg{Subject: events.DecisionPrefix + rec.ID, Header: nats.Header(h), Data: body}); err != nil {
				t.Fatal(err)
			}

			got, err := b.Respond(tctx(t), "alice", rec.ID, events.Responded{Decision: events.Deny, Reason: "no"})
			if err != nil {
				t.Fatalf("the answer after a forgery: %v", err)
			}
			if got.State != broker.StateDenied {
				t.Fatalf("state %s", got.State)
			}
			// Respond returns once the state is decided; the broker's own
			// event follows the forgery just after.
			stored := storedDecisions(t, js, rec.ID)
			for deadline := time.Now().Add(10 * time.Second); len(stored) < 2 && time.Now().Before(deadline); {
				time.Sleep(10 * time.Millisecond)
				stored = storedDecisions(t, js, rec.ID)
			}
			if len(stored) != 2 || stored[0].ID() != e.ID() {
				t.Fatalf("%d events on the decision subject, want the forgery then the decision", len(stored))
			}
			if _, err := trusted.Verify(&stored[0]); err == nil {
				t.Fatal("the forgery verifies")
			}
			d, err := trusted.Verify(&stored[1])
			if err != nil || d.Outcome != events.Denied || d.Reason != "no" || stored[1].ID() != got.DecisionEventID {
				t.Fatalf("the broker's decision: %+v %v", d, err)
			}
			if n := b.Stats().ForgedDecisions; n != int64(i+1) {
				t.Fatalf("%d forged decisions counted, want %d", n, i+1)
			}
			cur, err := b.Get(tctx(t), rec.ID)
			if err != nil || !strings.Contains(cur.Forgery, "broker/evil") {
				t.Fatalf("the record's forgery: %q %v", cur.Forgery, err)
			}
			// Answering again finds the decision, and counts nothing new.
			if _, err := b.Respond(tctx(t), "bob", rec.ID, events.Responded{Decision: events.Approve}); !errors.Is(err, broker.ErrAlreadyDecided) {
				t.Fatalf("a second answer: %v", err)
			}
			if n := b.Stats().ForgedDecisions; n != int64(i+1) {
				t.Fatalf("%d forged decisions counted after a second answer", n)
			}
		})
	}
}

// TestBrokerKeyRotation: a broker restarted with a new key and the old one
// trusted finds a decision the old key signed to be a broker's; one that
// does not trust the old key takes it for a forgery, and would publish its
// own after it.
func TestBrokerKeyRotation(t *testing.T) {
	ns := testenv.Server(t)
	keyA, pubA := decisionKey(t)
	keyB, _ := decisionKey(t)
	a, stopA := brokertest.Run(t, testenv.Conn(t, ns), broker.Config{Name: "a", DecisionKey: keyA})
	rec, err := a.Submit(tctx(t), "", "agent/rotating", events.Requested{Tool: "rm", Agent: "rotating"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Respond(tctx(t), "alice", rec.ID, events.Responded{Decision: events.Approve}); err != nil {
		t.Fatal(err)
	}
	waitDecision(t, ns, rec.ID, events.Approved)
	stopA()

	rotated := start(t, testenv.Conn(t, ns), broker.Config{Name: "b", DecisionKey: keyB, TrustedDecisionKeys: []string{pubA}})
	if ok, err := rotated.Published(tctx(t), rec.ID); err != nil || !ok {
		t.Fatalf("trusting the old key: published %v, %v", ok, err)
	}
	if n := rotated.Stats().ForgedDecisions; n != 0 {
		t.Fatalf("trusting the old key: %d forged decisions", n)
	}
	forgetful := start(t, testenv.Conn(t, ns), broker.Config{Name: "c", DecisionKey: keyB})
	if ok, err := forgetful.Published(tctx(t), rec.ID); err != nil || ok {
		t.Fatalf("not trusting the old key: published %v, %v", ok, err)
	}
	if n := forgetful.Stats().ForgedDecisions; n != 1 {
		t.Fatalf("not trusting the old key: %d forged decisions, want 1", n)
	}
}

// TestDecisionKeyConfig: the broker takes an account key with its seed
// only, and trusted keys only beside one.
func TestDecisionKeyConfig(t *testing.T) {
	account, pub := decisionKey(t)
	user, _ := nkeys.CreateUser()
	public, _ := nkeys.FromPublicKey(pub)
	userPub, _ := user.PublicKey()
	cases := []struct {
		name string
		cfg  broker.Config
		ok   bool
	}{
		{"none", broker.Config{}, true},
		{"account key", broker.Config{DecisionKey: account}, true},
		{"account key and an earlier one", broker.Config{DecisionKey: account, TrustedDecisionKeys: []string{pub}}, true},
		{"user key", broker.Config{DecisionKey: user}, false},
		{"public key only", broker.Config{DecisionKey: public}, false},
		{"trusted keys alone", broker.Config{TrustedDecisionKeys: []string{pub}}, false},
		{"a user key trusted", broker.Config{DecisionKey: account, TrustedDecisionKeys: []string{userPub}}, false},
	}
	for _, c := range cases {
		if err := c.cfg.WithDefaults().Validate(); (err == nil) != c.ok {
			t.Errorf("%s: Validate() = %v", c.name, err)
		}
	}
}
