package creds_test

import (
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/assent-dev/assent/internal/creds"
	"github.com/assent-dev/assent/internal/testcerts"
)

// TestSecureCluster: three nodes made from `broker creds server-config
// --cluster` (operator mode on each, clients over TLS, routes over mutual
// TLS and authenticated by the authority's route secret) form a JetStream
// cluster that takes a replicated stream; a revocation pushed to one node
// closes the revoked agent's connection on another; and a node whose
// configuration comes from another authority (another route secret), or
// whose route certificate another CA signed, never joins.
func TestSecureCluster(t *testing.T) {
	a, _, err := creds.Init(filepath.Join(t.TempDir(), "keys"))
	if err != nil {
		t.Fatal(err)
	}
	certs := testcerts.New(t)
	routes := []string{freeAddr(t), freeAddr(t), freeAddr(t)}
	node := func(a *creds.Authority, name, route string, ca *testcerts.Set, peers []string) *server.Server {
		cert, key := ca.Node(t, name)
		conf, err := a.ServerConfig(creds.ServerOptions{
			Listen: freeAddr(t), StoreDir: t.TempDir(), Name: name,
			CertFile: certs.ServerCertFile, KeyFile: certs.ServerKey,
			Cluster: &creds.ClusterOptions{Name: "assent", Listen: route, Routes: peers, CertFile: cert, KeyFile: key, CAFile: ca.CAFile},
		})
		if err != nil {
			t.Fatal(err)
		}
		return startConfig(t, conf)
	}
	var nodes []*server.Server
	for i, r := range routes {
		nodes = append(nodes, node(a, "n"+strconv.Itoa(i+1), r, certs, routes))
	}

	connect := func(s *server.Server, who creds.Identity, opts ...nats.Option) *nats.Conn {
		t.Helper()
		file := credsFile(t, a, who)
		nc, err := nats.Connect(s.ClientURL(), append(opts, nats.UserCredentials(file), nats.RootCAs(certs.CAFile))...)
		if err != nil {
			t.Fatalf("connect to %s as %s %s: %v", s.Name(), who.Role, who.Name, err)
		}
		t.Cleanup(nc.Close)
		return nc
	}
	js, err := jetstream.New(connect(nodes[0], creds.Identity{Role: creds.RoleBroker, Name: "b1"}))
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := js.CreateStream(testCtx(t), jetstream.StreamConfig{Name: "R3", Subjects: []string{"r3.>"}, Replicas: 3})
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no replicated stream on the cluster: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}

	closed := make(chan struct{})
	leaked := creds.Identity{Role: creds.RoleAgent, Name: "coder"}
	connect(nodes[2], leaked, nats.NoReconnect(), nats.ClosedHandler(func(*nats.Conn) { close(closed) }),
		nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
	issued, err := a.IssuedUsers()
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Revoke(issued[len(issued)-1].User); err != nil {
		t.Fatal(err)
	}
	token, seed, err := a.SystemUser(time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	sysNC, err := nats.Connect(nodes[0].ClientURL(), nats.UserJWTAndSeed(token, seed), nats.RootCAs(certs.CAFile))
	if err != nil {
		t.Fatal(err)
	}
	defer sysNC.Close()
	if _, err := a.Push(testCtx(t), sysNC); err != nil {
		t.Fatal(err)
	}
	select {
	case <-closed:
	case <-time.After(15 * time.Second):
		t.Fatal("the agent revoked through n1 is still connected to n3")
	}

	// Intruders: another authority's route secret; a certificate another
	// CA signed.
	other, _, err := creds.Init(filepath.Join(t.TempDir(), "other"))
	if err != nil {
		t.Fatal(err)
	}
	intruders := []*server.Server{
		node(other, "wrong-secret", freeAddr(t), certs, routes[:1]),
		node(a, "wrong-ca", freeAddr(t), testcerts.New(t), routes[:1]),
	}
	time.Sleep(3 * time.Second) // routes are dialled at once, and again each second
	for _, s := range intruders {
		if n := s.NumRoutes(); n != 0 {
			t.Errorf("%s has %d routes into the cluster", s.Name(), n)
		}
	}
	rz, err := nodes[0].Routez(nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rz.Routes {
		if r.RemoteName != "n2" && r.RemoteName != "n3" {
			t.Errorf("n1 has a route to %q", r.RemoteName)
		}
	}
}

// startConfig starts a nats-server from configuration text, as nats-server
// would read it from a file.
func startConfig(t *testing.T, conf string) *server.Server {
	t.Helper()
	file := filepath.Join(t.TempDir(), "nats.conf")
	if err := os.WriteFile(file, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	opts, err := server.ProcessConfigFile(file)
	if err != nil {
		t.Fatalf("nats-server refuses the configuration: %v\n%s", err, conf)
	}
	opts.NoSigs = true
	s, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	go s.Start()
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatalf("%s not ready", opts.ServerName)
	}
	return s
}

// freeAddr is a free TCP address on the loopback interface.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}
