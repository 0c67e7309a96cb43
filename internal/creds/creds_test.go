package creds_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/assent-dev/assent/internal/creds"
	"github.com/assent-dev/assent/internal/natsembed"
)

// TestServerConfig: `broker creds server-config` output is a configuration
// nats-server's own parser takes; a server started from it admits an issued
// credential, bound by its permissions, and refuses a client without one.
func TestServerConfig(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "keys")
	a, made, err := creds.Init(dir)
	if err != nil || !made {
		t.Fatalf("init: %v %v", made, err)
	}
	for _, f := range []string{"operator.nk", "sys.nk", "assent.nk"} {
		if fi, err := os.Stat(filepath.Join(dir, f)); err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: %v %v, want mode 0600", f, fi.Mode(), err)
		}
	}
	again, made, err := creds.Init(dir)
	if err != nil || made || again.Account != a.Account {
		t.Fatalf("init again: made %v, account %s (was %s), %v", made, again.Account, a.Account, err)
	}

	conf := filepath.Join(t.TempDir(), "nats.conf")
	src, err := a.ServerConfig(creds.ServerOptions{Listen: "127.0.0.1:-1", StoreDir: t.TempDir(), Name: "assent-test"})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(conf, []byte(src), 0o600); err != nil {
		t.Fatal(err)
	}
	opts, err := server.ProcessConfigFile(conf)
	if err != nil {
		t.Fatalf("nats-server refuses the configuration: %v\n%s", err, src)
	}
	// What docs/cluster.md and operations.md recommend, and what the broker
	// needs to take events of its default 1 MiB limit.
	if !opts.JetStream || !opts.SyncAlways {
		t.Errorf("jetstream %v, sync_interval always %v; want both:\n%s", opts.JetStream, opts.SyncAlways, src)
	}
	if opts.MaxPayload != natsembed.MaxPayload {
		t.Errorf("max_payload %d, want %d:\n%s", opts.MaxPayload, natsembed.MaxPayload, src)
	}
	opts.NoSigs = true
	s, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	go s.Start()
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("server not ready")
	}
	if nc, err := nats.Connect(s.ClientURL()); err == nil {
		nc.Close()
		t.Fatal("a client without credentials connected")
	}
	file := filepath.Join(t.TempDir(), "coder.creds")
	data, err := a.Issue(creds.Identity{Role: creds.RoleAgent, Name: "coder"})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, data, 0o600); err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, 4)
	nc, err := nats.Connect(s.ClientURL(), nats.UserCredentials(file), nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { errs <- err }))
	if err != nil {
		t.Fatalf("connect with issued credentials: %v", err)
	}
	defer nc.Close()
	if err := nc.Publish("assent.decision.x", nil); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-errs:
		if !strings.Contains(err.Error(), "Permissions Violation for Publish to \"assent.decision.x\"") {
			t.Fatalf("error: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the server took an agent's decision")
	}
}

// TestPermissionsRefuseBadIdentities: names must be subject tokens, roles
// known, and a bot must name its principals.
func TestPermissionsRefuseBadIdentities(t *testing.T) {
	for _, c := range []struct {
		who  creds.Identity
		want string
	}{
		{creds.Identity{Role: creds.RoleAgent, Name: "a.b"}, "agent name"},
		{creds.Identity{Role: creds.RoleApprover, Name: ">"}, "approver name"},
		{creds.Identity{Role: creds.RoleBot, Name: "bot"}, "at least one"},
		{creds.Identity{Role: creds.RoleBot, Name: "bot", Principals: []string{"al*ce"}}, "principal"},
		{creds.Identity{Role: "admin", Name: "x"}, `role "admin"`},
		{creds.Identity{Role: creds.RoleGateway, Name: "gw"}, "identity.agent"},
		{creds.Identity{Role: creds.RoleGateway, Name: "gw", Agent: "co.der"}, "agent"},
		{creds.Identity{Role: creds.RoleGateway, Name: "gw", Agent: "coder", Principal: "*"}, "principal"},
	} {
		if _, err := c.who.Permissions(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want %q", c.who, err, c.want)
		}
	}
	p, err := creds.Identity{Role: creds.RoleApprover, Name: "alice"}.Permissions()
	if err != nil {
		t.Fatal(err)
	}
	if !p.Pub.Allow.Contains("assent.response.alice.>") || p.Pub.Allow.Contains("assent.response.>") || p.Pub.Allow.Contains("assent.decision.>") {
		t.Fatalf("approver alice may publish %v", p.Pub.Allow)
	}
}

// TestGatewayPermissions: a gateway's credentials are its agent's, plus,
// with a principal, the agent's pending events and that principal's answers;
// nothing of another agent's or principal's, no consumer, no decision.
func TestGatewayPermissions(t *testing.T) {
	for _, c := range []struct {
		name    string
		who     creds.Identity
		extra   []string // beyond the agent's own, "pub S" or "sub S"
		private bool
	}{
		{"agent only", creds.Identity{Role: creds.RoleGateway, Name: "gw", Agent: "coder"}, nil, false},
		{"elicitation", creds.Identity{Role: creds.RoleGateway, Name: "gw", Agent: "coder", Principal: "carol"},
			[]string{"pub assent.response.carol.>", "sub assent.pending.coder"}, false},
		{"private", creds.Identity{Role: creds.RoleGateway, Name: "gw", Agent: "coder", Principal: "carol", Private: true},
			[]string{"pub assent.response.carol.>", "sub assent.pending.coder"}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			p, err := c.who.Permissions()
			if err != nil {
				t.Fatal(err)
			}
			agent, err := creds.Identity{Role: creds.RoleAgent, Name: "coder", Private: c.private}.Permissions()
			if err != nil {
				t.Fatal(err)
			}
			var extra []string
			for _, s := range p.Pub.Allow {
				if !agent.Pub.Allow.Contains(s) {
					extra = append(extra, "pub "+s)
				}
			}
			for _, s := range p.Sub.Allow {
				if !agent.Sub.Allow.Contains(s) {
					extra = append(extra, "sub "+s)
				}
			}
			for _, s := range agent.Pub.Allow {
				if !p.Pub.Allow.Contains(s) {
					t.Errorf("the gateway may not publish its agent's %s", s)
				}
			}
			for _, s := range agent.Sub.Allow {
				if !p.Sub.Allow.Contains(s) {
					t.Errorf("the gateway may not read its agent's %s", s)
				}
			}
			slices.Sort(extra)
			if !slices.Equal(extra, c.extra) {
				t.Errorf("beyond agent coder's: %q, want %q", extra, c.extra)
			}
			for _, s := range []string{"assent.decision.>", "assent.response.>", "assent.response.alice.>", "assent.request.other", "$JS.API.CONSUMER.CREATE.ASSENT", "$KV.assent-presence.carol.>"} {
				if p.Pub.Allow.Contains(s) {
					t.Errorf("the gateway may publish %s", s)
				}
			}
			for _, s := range []string{"assent.pending.>", "assent.pending.other", "assent.response.>"} {
				if p.Sub.Allow.Contains(s) {
					t.Errorf("the gateway may read %s", s)
				}
			}
		})
	}
}

func TestOpenMissing(t *testing.T) {
	_, err := creds.Open(t.TempDir())
	if err == nil || !strings.Contains(err.Error(), "broker creds init --dir") {
		t.Fatalf("open an empty dir: %v", err)
	}
}

// TestDecidedAndLookupPermissions: per role, who may read the server's
// copies of stored decisions (assent-decided.<id>) and who may publish there
// (nobody, not even the broker: the server republishes on its own), who may
// ask the broker about any request (assent-broker.lookup.<id>) and who about
// agent coder's own (assent-private.coder.lookup.<id>), and who may store a
// checkpoint of the chained record (the broker alone). Older SDKs' stored
// decision subject stays readable where the stream is.
func TestDecidedAndLookupPermissions(t *testing.T) {
	const (
		subDecided   = "sub assent-decided.R1"
		pubDecided   = "pub assent-decided.R1"
		subStored    = "sub assent.decision.R1"
		pubLookup    = "pub assent-broker.lookup.R1"
		pubOwn       = "pub assent-private.coder.lookup.R1"
		pubOthers    = "pub assent-private.other.lookup.R1"
		pubDecisions = "pub assent.decision.R1"
		pubCheckpt   = "pub assent.audit.checkpoint"
	)
	all := []string{subDecided, pubDecided, subStored, pubLookup, pubOwn, pubOthers, pubDecisions, pubCheckpt}
	for _, tc := range []struct {
		name string
		who  creds.Identity
		may  []string
	}{
		{"agent", creds.Identity{Role: creds.RoleAgent, Name: "coder"}, []string{subDecided, subStored, pubOwn}},
		{"private agent", creds.Identity{Role: creds.RoleAgent, Name: "coder", Private: true}, []string{pubOwn}},
		{"approver", creds.Identity{Role: creds.RoleApprover, Name: "alice"}, []string{subDecided, subStored}},
		{"bot", creds.Identity{Role: creds.RoleBot, Name: "bot", Principals: []string{"alice"}}, []string{subDecided, subStored, pubLookup}},
		{"gateway", creds.Identity{Role: creds.RoleGateway, Name: "gw", Agent: "coder", Principal: "alice"}, []string{subDecided, subStored, pubOwn}},
		{"private gateway", creds.Identity{Role: creds.RoleGateway, Name: "gw", Agent: "coder", Private: true}, []string{pubOwn}},
		{"auditor", creds.Identity{Role: creds.RoleAuditor, Name: "witness"}, []string{subDecided, subStored}},
		{"admin (broker)", creds.Identity{Role: creds.RoleBroker, Name: "admin-tool"}, []string{subDecided, subStored, pubLookup, pubOwn, pubOthers, pubDecisions, pubCheckpt}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := tc.who.Permissions()
			if err != nil {
				t.Fatal(err)
			}
			for _, op := range all {
				kind, subject, _ := strings.Cut(op, " ")
				perm := p.Pub
				if kind == "sub" {
					perm = p.Sub
				}
				if got, want := allowed(perm, subject), slices.Contains(tc.may, op); got != want {
					t.Errorf("%s: allowed %v, want %v", op, got, want)
				}
			}
		})
	}
	if _, err := (creds.Identity{}).Permissions(); err == nil {
		t.Error("credentials issued to no role")
	}
}

// allowed reports whether p lets a client use subject, as the server
// decides: an allowed subject covers it and no denied one does.
func allowed(p jwt.Permission, subject string) bool {
	for _, d := range p.Deny {
		if server.SubjectMatchesFilter(subject, d) {
			return false
		}
	}
	for _, a := range p.Allow {
		if server.SubjectMatchesFilter(subject, a) {
			return true
		}
	}
	return false
}
