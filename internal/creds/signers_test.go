package creds_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

	"github.com/assent-dev/assent/internal/chain"
	"github.com/assent-dev/assent/internal/creds"
	"github.com/assent-dev/assent/internal/testenv"
	"github.com/assent-dev/assent/pkg/events"
)

// TestSigningKeys: an authority's users are signed by the account's signing
// keys, not its own key: those of agents, private agents, approvers and
// brokers scoped (the account fixes their permissions and limits), those of
// bots and gateways not (their users carry their own). Issuing needs only
// the signing keys: with the operator's and the account's seeds taken
// offline it still works, and what changes the account says what it needs.
func TestSigningKeys(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "keys")
	a, made, err := creds.Init(dir)
	if err != nil || !made {
		t.Fatalf("init: %v %v", made, err)
	}
	ac, err := jwt.DecodeAccountClaims(a.AccountJWT)
	if err != nil {
		t.Fatal(err)
	}
	if len(ac.SigningKeys) != 7 {
		t.Fatalf("the account has %d signing keys, want 7", len(ac.SigningKeys))
	}
	signer := map[string]string{} // kind -> public key
	for _, kind := range []string{"broker", "agent", "agent-private", "approver", "bot", "gateway", "auditor"} {
		file := filepath.Join(dir, "signers", kind+".nk")
		if fi, err := os.Stat(file); err != nil || fi.Mode().Perm() != 0o600 {
			t.Fatalf("%s: %v, want mode 0600", file, err)
		}
		seed, _ := os.ReadFile(file)
		kp, err := nkeys.FromSeed([]byte(strings.TrimSpace(string(seed))))
		if err != nil {
			t.Fatal(err)
		}
		signer[kind], _ = kp.PublicKey()
		scope, ok := ac.SigningKeys.GetScope(signer[kind])
		if !ok {
			t.Fatalf("%s's key is not a signing key of the account", kind)
		}
		if want := kind != "bot" && kind != "gateway"; (scope != nil) != want {
			t.Errorf("%s's signing key scoped %v, want %v", kind, scope != nil, want)
		}
	}
	agentScope, _ := ac.SigningKeys.GetScope(signer["agent"])
	tmpl := agentScope.(*jwt.UserScope).Template
	if !tmpl.Pub.Allow.Contains("assent.request.{{name()}}") || tmpl.Pub.Allow.Contains("assent.decision.>") || tmpl.Subs != 10000 || tmpl.Payload != 2<<20 {
		t.Errorf("the agents' template: pub %v, subs %d, payload %d", tmpl.Pub.Allow, tmpl.Subs, tmpl.Payload)
	}

	user := func(who creds.Identity) *jwt.UserClaims {
		t.Helper()
		data, err := a.Issue(who)
		if err != nil {
			t.Fatal(err)
		}
		token, err := jwt.ParseDecoratedJWT(data)
		if err != nil {
			t.Fatal(err)
		}
		uc, err := jwt.DecodeUserClaims(token)
		if err != nil {
			t.Fatal(err)
		}
		return uc
	}
	agent := user(creds.Identity{Role: creds.RoleAgent, Name: "Coder"})
	if agent.Issuer != signer["agent"] || agent.IssuerAccount != a.Account || agent.Name != "Coder" || !agent.HasEmptyPermissions() {
		t.Errorf("agent Coder: issuer %s, account %s, name %q, permissions %+v", agent.Issuer, agent.IssuerAccount, agent.Name, agent.UserPermissionLimits)
	}
	if private := user(creds.Identity{Role: creds.RoleAgent, Name: "coder", Private: true}); private.Issuer != signer["agent-private"] {
		t.Errorf("a private agent is signed by %s, want the agent-private key", private.Issuer)
	}
	bot := user(creds.Identity{Role: creds.RoleBot, Name: "slack", Principals: []string{"Alice", "bob"}})
	if bot.Issuer != signer["bot"] || !bot.Pub.Allow.Contains("assent.response.Alice.>") || bot.Limits.Subs != 10000 || bot.Limits.Payload != 2<<20 {
		t.Errorf("bot: issuer %s, pub %v, subs %d, payload %d", bot.Issuer, bot.Pub.Allow, bot.Limits.Subs, bot.Limits.Payload)
	}

	// The operator's and the account's seeds go offline.
	for _, f := range []string{"operator.nk", "assent.nk"} {
		if err := os.Rename(filepath.Join(dir, f), filepath.Join(t.TempDir(), f)); err != nil {
			t.Fatal(err)
		}
	}
	offline, err := creds.Open(dir)
	if err != nil {
		t.Fatalf("open without the operator's and the account's seeds: %v", err)
	}
	if _, err := offline.Issue(creds.Identity{Role: creds.RoleApprover, Name: "alice"}); err != nil {
		t.Fatalf("issue without them: %v", err)
	}
	if err := offline.Revoke(agent.Subject); err == nil || !strings.Contains(err.Error(), "operator.nk") {
		t.Fatalf("revoke without the operator's seed: %v, want it named", err)
	}
	if err := os.Remove(filepath.Join(dir, "signers", "bot.nk")); err != nil {
		t.Fatal(err)
	}
	if offline, err = creds.Open(dir); err != nil {
		t.Fatal(err)
	}
	if _, err := offline.Issue(creds.Identity{Role: creds.RoleBot, Name: "b", Principals: []string{"p"}}); err == nil || !strings.Contains(err.Error(), "signers/bot.nk") {
		t.Fatalf("issue a bot without its signing key: %v", err)
	}
}

// TestUpgradeAuthority: an authority of the version before signing keys
// (users signed by the account's key) keeps working, and `creds init` on it
// adds the signing keys and the account's limits: users issued before and
// after connect to a server that has the new account.
func TestUpgradeAuthority(t *testing.T) {
	dir := oldAuthority(t)
	old, err := creds.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	before := credsFile(t, old, creds.Identity{Role: creds.RoleAgent, Name: "coder"})
	if uc := userClaims(t, before); uc.Issuer != old.Account {
		t.Fatalf("an old authority signs with %s, want the account's key", uc.Issuer)
	}
	a, made, err := creds.Init(dir)
	if err != nil || made || !a.Upgraded() {
		t.Fatalf("init on the old authority: made %v, upgraded %v, %v", made, a.Upgraded(), err)
	}
	ac, _ := jwt.DecodeAccountClaims(a.AccountJWT)
	if len(ac.SigningKeys) != 7 || ac.Limits.Conn != creds.DefaultAccountLimits.Connections {
		t.Fatalf("upgraded account: %d signing keys, %d connections", len(ac.SigningKeys), ac.Limits.Conn)
	}
	if again, _, err := creds.Init(dir); err != nil || again.Upgraded() {
		t.Fatalf("init again: upgraded %v, %v", again.Upgraded(), err)
	}
	after := credsFile(t, a, creds.Identity{Role: creds.RoleAgent, Name: "coder"})
	if uc := userClaims(t, after); uc.Issuer == a.Account {
		t.Fatal("the upgraded authority still signs with the account's key")
	}
	ns := testenv.OperatorServer(t, a.Embedded())
	for _, f := range []string{before, after} {
		nc, err := nats.Connect(ns.ClientURL(), nats.UserCredentials(f))
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		if _, err := nc.Request("$JS.API.INFO", nil, 5*time.Second); err != nil {
			t.Fatalf("%s: JetStream info: %v", f, err)
		}
		nc.Close()
	}
}

// oldAuthority writes an authority as `broker creds init` made it before
// signing keys: the operator, the system account, and the ASSENT account
// without signing keys or limits, and returns its directory.
func oldAuthority(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "keys")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	op, _ := nkeys.CreateOperator()
	sys, _ := nkeys.CreateAccount()
	acct, _ := nkeys.CreateAccount()
	opPub, _ := op.PublicKey()
	sysPub, _ := sys.PublicKey()
	acctPub, _ := acct.PublicKey()
	oc := jwt.NewOperatorClaims(opPub)
	oc.SystemAccount = sysPub
	sc := jwt.NewAccountClaims(sysPub)
	ac := jwt.NewAccountClaims(acctPub)
	ac.Name = "ASSENT"
	ac.Limits.JetStreamLimits = jwt.JetStreamLimits{MemoryStorage: jwt.NoLimit, DiskStorage: jwt.NoLimit, Streams: jwt.NoLimit, Consumer: jwt.NoLimit}
	for name, c := range map[string]interface {
		Encode(nkeys.KeyPair) (string, error)
	}{"operator.jwt": oc, "sys.jwt": sc, "assent.jwt": ac} {
		token, err := c.Encode(op)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), []byte(token+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for name, kp := range map[string]nkeys.KeyPair{"operator.nk": op, "sys.nk": sys, "assent.nk": acct} {
		seed, _ := kp.Seed()
		if err := os.WriteFile(filepath.Join(dir, name), append(seed, '\n'), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// TestRevokeLive: revoking an agent's credentials and pushing the account
// closes that agent's connection at once and refuses it from then on, with
// no restart; another agent carries on. A server started again from the
// authority's directory still refuses it.
func TestRevokeLive(t *testing.T) {
	a, _, err := creds.Init(filepath.Join(t.TempDir(), "keys"))
	if err != nil {
		t.Fatal(err)
	}
	ns := testenv.OperatorServer(t, a.Embedded())
	leaked := credsFile(t, a, creds.Identity{Role: creds.RoleAgent, Name: "coder"})
	other := credsFile(t, a, creds.Identity{Role: creds.RoleAgent, Name: "writer"})
	closed := make(chan struct{})
	victim, err := nats.Connect(ns.ClientURL(), nats.UserCredentials(leaked), nats.NoReconnect(),
		nats.ClosedHandler(func(*nats.Conn) { close(closed) }), nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
	if err != nil {
		t.Fatal(err)
	}
	defer victim.Close()
	bystander, err := nats.Connect(ns.ClientURL(), nats.UserCredentials(other))
	if err != nil {
		t.Fatal(err)
	}
	defer bystander.Close()

	user, err := creds.UserOf(mustRead(t, leaked))
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Revoke(user); err != nil {
		t.Fatal(err)
	}
	if _, ok := a.Revoked(user); !ok {
		t.Fatal("the account does not list the revocation")
	}
	token, seed, err := a.SystemUser(time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	sysNC, err := nats.Connect(ns.ClientURL(), nats.UserJWTAndSeed(token, seed))
	if err != nil {
		t.Fatalf("system user: %v", err)
	}
	defer sysNC.Close()
	// A broker's credentials, which publish on everything of the ASSENT
	// account, cannot change the account: the system account is another.
	brokerNC, err := nats.Connect(ns.ClientURL(), nats.UserCredentials(credsFile(t, a, creds.Identity{Role: creds.RoleBroker, Name: "b1"})))
	if err != nil {
		t.Fatal(err)
	}
	defer brokerNC.Close()
	if _, err := a.Push(testCtx(t), brokerNC); err == nil || !strings.Contains(err.Error(), "no server answered") {
		t.Fatalf("pushing the account with a broker's credentials: %v", err)
	}
	said, err := a.Push(testCtx(t), sysNC)
	if err != nil || !strings.Contains(said, "updated") {
		t.Fatalf("push: %q %v", said, err)
	}
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("the revoked agent's connection is still open")
	}
	if nc, err := nats.Connect(ns.ClientURL(), nats.UserCredentials(leaked)); err == nil {
		nc.Close()
		t.Fatal("the revoked credentials connected again")
	}
	if _, err := bystander.Request("$JS.API.INFO", nil, 5*time.Second); err != nil {
		t.Fatalf("the other agent: %v", err)
	}

	// A server started again from the directory keeps the revocation.
	ns.Stop()
	again, err := creds.Open(a.Dir)
	if err != nil {
		t.Fatal(err)
	}
	ns2 := testenv.OperatorServer(t, again.Embedded())
	if nc, err := nats.Connect(ns2.ClientURL(), nats.UserCredentials(leaked)); err == nil || !errors.Is(err, nats.ErrAuthorization) {
		if nc != nil {
			nc.Close()
		}
		t.Fatalf("after a restart the revoked credentials: %v", err)
	}
	if nc, err := nats.Connect(ns2.ClientURL(), nats.UserCredentials(other)); err != nil {
		t.Fatalf("after a restart the other agent: %v", err)
	} else {
		nc.Close()
	}
}

// TestLimits: the account bounds its connections, and each agent's
// connection its subscriptions and the size of a message, so that a
// compromised agent cannot exhaust the server.
func TestLimits(t *testing.T) {
	a, _, err := creds.InitLimits(filepath.Join(t.TempDir(), "keys"), creds.AccountLimits{Connections: 2, Consumers: 10, Streams: 10})
	if err != nil {
		t.Fatal(err)
	}
	ns := testenv.OperatorServer(t, a.Embedded())
	agent := credsFile(t, a, creds.Identity{Role: creds.RoleAgent, Name: "coder"})
	errs := make(chan error, 100)
	nc, err := nats.Connect(ns.ClientURL(), nats.UserCredentials(agent), nats.NoReconnect(),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { errs <- err }))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	for i := 0; i < 10001; i++ {
		if _, err := nc.SubscribeSync("assent-decided.x"); err != nil {
			t.Fatal(err)
		}
	}
	nc.Flush()
	select {
	case err := <-errs:
		if !strings.Contains(strings.ToLower(err.Error()), "maximum subscriptions exceeded") {
			t.Fatalf("the 10,001st subscription: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the server took an agent's 10,001st subscription")
	}

	// A message over 2 MiB ends the connection that sent it.
	closed := make(chan error, 1)
	big, err := nats.Connect(ns.ClientURL(), nats.UserCredentials(agent), nats.NoReconnect(),
		nats.ClosedHandler(func(nc *nats.Conn) { closed <- nc.LastError() }))
	if err != nil {
		t.Fatalf("the second connection: %v", err)
	}
	// Refused either way: by the client, once it knows the limit; by the
	// server resetting the connection while it is written; or by the
	// server ending the connection after it.
	switch err := big.Publish("assent.request.coder", make([]byte, 2<<20+1)); {
	case err == nil:
		big.Flush()
		select {
		case err := <-closed:
			if !strings.Contains(strings.ToLower(err.Error()), "maximum payload") {
				t.Fatalf("a message of 2 MiB and a byte: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the server took a message over an agent's 2 MiB")
		}
	case errors.Is(err, nats.ErrMaxPayload), strings.Contains(err.Error(), "connection reset"):
	default:
		t.Fatal(err)
	}
	big.Close()

	second, err := nats.Connect(ns.ClientURL(), nats.UserCredentials(agent))
	if err != nil {
		t.Fatalf("the second connection: %v", err)
	}
	defer second.Close()
	if third, err := nats.Connect(ns.ClientURL(), nats.UserCredentials(agent)); err == nil {
		third.Close()
		t.Fatal("a third connection past the account's limit of 2")
	} else if !strings.Contains(strings.ToLower(err.Error()), "maximum account active connections exceeded") {
		t.Fatalf("the third connection: %v", err)
	}
}

func credsFile(t *testing.T, a *creds.Authority, who creds.Identity) string {
	t.Helper()
	data, err := a.Issue(who)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), string(who.Role)+"-"+who.Name+".creds")
	if err := os.WriteFile(file, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return file
}

func userClaims(t *testing.T, file string) *jwt.UserClaims {
	t.Helper()
	token, err := jwt.ParseDecoratedJWT(mustRead(t, file))
	if err != nil {
		t.Fatal(err)
	}
	uc, err := jwt.DecodeUserClaims(token)
	if err != nil {
		t.Fatal(err)
	}
	return uc
}

func mustRead(t *testing.T, file string) []byte {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// TestAuditor: auditor credentials read the whole record (a verify walks
// it through its own consumer, a witness reads the last checkpoint) and
// publish nothing of the contract.
func TestAuditor(t *testing.T) {
	a, _, err := creds.Init(filepath.Join(t.TempDir(), "keys"))
	if err != nil {
		t.Fatal(err)
	}
	ns := testenv.OperatorServer(t, a.Embedded())
	brokerNC, err := nats.Connect(ns.ClientURL(), nats.UserCredentials(credsFile(t, a, creds.Identity{Role: creds.RoleBroker, Name: "b1"})))
	if err != nil {
		t.Fatal(err)
	}
	defer brokerNC.Close()
	bjs, _ := jetstream.New(brokerNC)
	if _, err := bjs.CreateStream(testCtx(t), jetstream.StreamConfig{Name: "ASSENT", Subjects: []string{"assent.>"}, AllowDirect: true}); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if _, err := bjs.Publish(testCtx(t), "assent.request.coder", []byte(`{}`)); err != nil {
			t.Fatal(err)
		}
	}
	c, after, ok, err := chain.NextCheckpoint(testCtx(t), bjs, "ASSENT")
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	m, _ := chain.Message(c, "broker/b1", nil)
	if _, err := bjs.PublishMsg(testCtx(t), m, jetstream.WithExpectLastSequencePerSubject(after)); err != nil {
		t.Fatal(err)
	}

	errs := make(chan error, 10)
	nc, err := nats.Connect(ns.ClientURL(), nats.UserCredentials(credsFile(t, a, creds.Identity{Role: creds.RoleAuditor, Name: "witness"})),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { errs <- err }))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	rep, err := chain.Verify(testCtx(t), js, "ASSENT", chain.Options{})
	if err != nil || !rep.OK() || rep.ProvenTo != c.Upto {
		t.Fatalf("verify as an auditor: %+v %v", rep, err)
	}
	s, err := js.Stream(testCtx(t), "ASSENT")
	if err != nil {
		t.Fatal(err)
	}
	if _, found, err := chain.LastCheckpoint(testCtx(t), s); !found || err != nil {
		t.Fatalf("the last checkpoint as an auditor: %v %v", found, err)
	}
	for _, subject := range []string{"assent.request.coder", "assent.response.alice.R1", "assent.decision.R1", events.CheckpointSubject, "$JS.API.STREAM.PURGE.ASSENT"} {
		if err := nc.Publish(subject, []byte(`{}`)); err != nil {
			t.Fatal(err)
		}
	wait:
		for {
			select {
			case err := <-errs:
				switch {
				case strings.Contains(err.Error(), "$JS.API.CONSUMER.DELETE."):
					// Its ordered consumers' clean-up, refused too: the
					// server drops them once idle.
				case strings.Contains(err.Error(), "Permissions Violation for Publish to \""+subject+"\""):
					break wait
				default:
					t.Fatalf("%s: %v", subject, err)
				}
			case <-time.After(5 * time.Second):
				t.Fatalf("an auditor published on %s", subject)
			}
		}
	}
}
