// Package clustertest runs the production topology inside a test: a
// three-node NATS JetStream cluster on loopback (in-process servers joined by
// routes, each with its own store, or nats-server processes with
// Config.Binary), broker replicas as child processes of the built cmd/broker
// against it, and a network-fault proxy (Shopify's toxiproxy, in process) to
// put between a replica and a node.
//
// Every piece can fail on demand: a node stops and starts again on the same
// ports and store (a node that is a process can also be SIGKILLed, as a
// crash would end it), a replica is SIGKILLed and restarted with the same flags,
// the proxy adds latency, drops traffic or cuts connections. The chaos suite
// (integration/cluster/chaos_test.go) uses all three; docs/cluster.md runs the same
// topology by hand.
//
// Helpers take a testing.TB, call t.Helper and undo what they started with
// t.Cleanup. Waits are bounded by Patience, a bound only a hang misses.
package clustertest

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/assent-dev/assent/internal/natsembed"
)

// Patience bounds every wait in this package: a node or replica becoming
// ready, the cluster electing a leader. Only a hang misses it, even with
// -race on two busy cores.
const Patience = 60 * time.Second

// ClusterName is the NATS cluster's name.
const ClusterName = "assent-test"

// Config configures a cluster. The zero value is three nodes that fsync
// once a minute.
type Config struct {
	// Nodes is the number of NATS servers. Default 3 (JetStream R3 needs 3).
	Nodes int
	// SyncInterval is JetStream's fsync interval. Default 1m: a test stops
	// processes, never the machine, so what is written survives in the page
	// cache, and fsync on every write would make the cluster much slower
	// (docs/architecture.md, "Durability"). Use -1 for fsync always.
	SyncInterval time.Duration
	// Advertise lets clients learn the other nodes' URLs from the one they
	// connect to. Off by default, so that a client given one URL (such as a
	// proxy's) stays on it across reconnects, as a client behind a load
	// balancer would.
	Advertise bool
	// Binary, if set, is a nats-server executable (BuildNATSServer): every
	// node then runs as a process of its own, configured by a file written
	// from Options, so that Kill can SIGKILL it as a crash would (Stop
	// shuts an in-process server down cleanly, which hands its raft
	// leaderships over first). Server returns nil for such nodes; their
	// state is read from their monitoring port.
	Binary string
}

// Cluster is a JetStream cluster of in-process NATS servers on loopback.
type Cluster struct {
	cfg   Config
	nodes []*Node
}

// Node is one server of a Cluster, with what it takes to start it again in
// the same place: its ports and its store directory.
type Node struct {
	Name        string
	Dir         string // JetStream store
	ClientPort  int
	ClusterPort int
	// MonitorPort serves the node's monitoring endpoints (/varz, /jsz,
	// /healthz) when it runs as a process (Config.Binary), else 0.
	MonitorPort int

	cluster *Cluster
	base    *server.Options // from a configuration file (FromConfigs), or nil
	mu      sync.Mutex
	srv     *server.Server // nil while stopped
	proc    *process       // the running process of a node that is one, or nil
	kills   int
}

// Start starts a cluster for t, waits until it is formed (every route up, a
// JetStream meta leader elected, every node current) and shuts it down when
// the test ends.
func Start(t testing.TB, cfg Config) *Cluster {
	t.Helper()
	return start(t, cfg, nil)
}

// FromConfigs starts a cluster from nats-server configuration files, one
// node per file, parsed by nats-server's own parser (server.ProcessConfigFile)
// and run as they say, except for what a test must own: each node's client,
// cluster and monitoring ports are free ones, its routes name those, and its
// store is a directory of the test's. The files' route lists must name every
// node (their number must match).
func FromConfigs(t testing.TB, files ...string) *Cluster {
	t.Helper()
	var bases []*server.Options
	for _, f := range files {
		o, err := server.ProcessConfigFile(f)
		if err != nil {
			t.Fatalf("parse %s: %v", f, err)
		}
		if len(o.Routes) != len(files) {
			t.Fatalf("%s: %d routes, want one per node (%d)", f, len(o.Routes), len(files))
		}
		bases = append(bases, o)
	}
	return start(t, Config{Nodes: len(files)}, bases)
}

func start(t testing.TB, cfg Config, bases []*server.Options) *Cluster {
	t.Helper()
	if cfg.Nodes == 0 {
		cfg.Nodes = 3
	}
	if cfg.SyncInterval == 0 {
		cfg.SyncInterval = time.Minute
	}
	// Routes name every node's cluster port up front, so the ports are chosen
	// before any node starts; one taken meanwhile makes that start fail, and
	// the whole set is chosen again.
	var c *Cluster
	var err error
	for attempt := 1; attempt <= 5; attempt++ {
		c = &Cluster{cfg: cfg}
		base := t.TempDir()
		for i := range cfg.Nodes {
			c.nodes = append(c.nodes, &Node{
				Name:        fmt.Sprintf("node%d", i+1),
				Dir:         filepath.Join(base, fmt.Sprintf("node%d", i+1)),
				ClientPort:  FreePort(t),
				ClusterPort: FreePort(t),
				cluster:     c,
			})
			if cfg.Binary != "" {
				c.nodes[i].MonitorPort = FreePort(t)
			}
			if bases != nil {
				c.nodes[i].base = bases[i]
			}
		}
		if err = c.startAll(); err == nil {
			break
		}
		c.stopAll()
	}
	if err != nil {
		t.Fatalf("start NATS cluster: %v", err)
	}
	t.Cleanup(c.stopAll)
	ctx, cancel := context.WithTimeout(context.Background(), Patience)
	defer cancel()
	if err := c.WaitFormed(ctx); err != nil {
		t.Fatal(err)
	}
	return c
}

func (c *Cluster) startAll() error {
	for _, n := range c.nodes {
		if err := n.start(); err != nil {
			return err
		}
	}
	return nil
}

func (c *Cluster) stopAll() {
	for _, n := range c.nodes {
		n.Stop()
	}
}

// Nodes returns the cluster's nodes, in order.
func (c *Cluster) Nodes() []*Node { return c.nodes }

// Node returns the i-th node, from 0.
func (c *Cluster) Node(i int) *Node { return c.nodes[i] }

// URLs returns every node's client URL.
func (c *Cluster) URLs() []string {
	out := make([]string, len(c.nodes))
	for i, n := range c.nodes {
		out[i] = n.ClientURL()
	}
	return out
}

// URL returns every node's client URL, comma-separated, as nats.Connect and
// the broker's --nats-url take them.
func (c *Cluster) URL() string { return strings.Join(c.URLs(), ",") }

// routes lists every node's route URL.
func (c *Cluster) routes() []*url.URL {
	var out []*url.URL
	for _, n := range c.nodes {
		out = append(out, &url.URL{Scheme: "nats-route", Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(n.ClusterPort))})
	}
	return out
}

// Conn connects to the cluster (any node) and closes the connection when the
// test ends. It reconnects forever, to whichever node is up.
func (c *Cluster) Conn(t testing.TB, opts ...nats.Option) *nats.Conn {
	t.Helper()
	opts = append([]nats.Option{nats.MaxReconnects(-1), nats.ReconnectWait(100 * time.Millisecond), nats.Timeout(5 * time.Second)}, opts...)
	nc, err := nats.Connect(c.URL(), opts...)
	if err != nil {
		t.Fatalf("connect to the NATS cluster: %v", err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// WaitFormed waits until every running node has a route to every other
// running node, a JetStream meta leader is elected and every running node
// is current with it. It returns what was still missing if ctx ends first.
func (c *Cluster) WaitFormed(ctx context.Context) error {
	for {
		why := c.formed()
		if why == "" {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("NATS cluster not formed: %s (%w)", why, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// formed says what the cluster still lacks, or "" when it is formed.
func (c *Cluster) formed() string {
	var running []nodeView
	for _, n := range c.nodes {
		if !n.Running() {
			continue
		}
		v, err := n.view()
		if err != nil {
			return fmt.Sprintf("%s: %v", n.Name, err)
		}
		running = append(running, v)
	}
	leaders := 0
	for _, v := range running {
		for _, o := range running {
			if o.name != v.name && !v.routes[o.name] {
				return fmt.Sprintf("%s has no route to %s yet", v.name, o.name)
			}
		}
		if !v.clustered {
			return v.name + ": JetStream not clustered yet"
		}
		if v.leader {
			leaders++
		}
		if !v.current {
			return v.name + ": JetStream not current with the meta leader"
		}
	}
	if leaders != 1 {
		var views []string
		for _, v := range running {
			views = append(views, v.meta)
		}
		return fmt.Sprintf("%d JetStream meta leaders (%s)", leaders, strings.Join(views, "; "))
	}
	return ""
}

// nodeView is what formed needs to know of a running node.
type nodeView struct {
	name      string
	routes    map[string]bool // the servers it has a route to, by name
	clustered bool            // JetStream runs clustered
	leader    bool            // it is the JetStream meta leader
	current   bool            // current with the meta leader
	meta      string          // how it sees the meta group, for errors
}

// view reads the node's view of the cluster, from the server itself or
// from the monitoring port of a node that is a process.
func (n *Node) view() (nodeView, error) {
	if n.cluster.cfg.Binary != "" {
		return n.processView()
	}
	s := n.Server()
	if s == nil {
		return nodeView{}, fmt.Errorf("stopped")
	}
	v := nodeView{name: s.Name(), routes: map[string]bool{}}
	rz, err := s.Routez(nil)
	if err != nil {
		return v, fmt.Errorf("routez: %w", err)
	}
	for _, r := range rz.Routes {
		v.routes[r.RemoteName] = true
	}
	v.clustered, v.leader, v.current = s.JetStreamIsClustered(), s.JetStreamIsLeader(), s.JetStreamIsCurrent()
	jsz, err := s.Jsz(nil)
	if err != nil || jsz.Meta == nil {
		v.meta = fmt.Sprintf("%s: no meta view (%v)", s.Name(), err)
	} else {
		m := jsz.Meta
		v.meta = fmt.Sprintf("%s sees leader %q, size %d, quorum %d, %d pending", s.Name(), m.Leader, m.Size, m.QuorumNeeded, m.Pending)
	}
	return v, nil
}

// ClientURL is the node's client URL.
func (n *Node) ClientURL() string {
	return "nats://" + n.ClientAddr()
}

// ClientAddr is the node's client host:port.
func (n *Node) ClientAddr() string {
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(n.ClientPort))
}

// Server returns the running server, or nil while the node is stopped or
// runs as a process (Config.Binary).
func (n *Node) Server() *server.Server {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.srv
}

// Running reports whether the node runs.
func (n *Node) Running() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.proc != nil {
		return n.proc.running()
	}
	return n.srv != nil
}

// Options returns the server options the node runs with.
func (n *Node) Options() *server.Options {
	c := n.cluster
	if n.base != nil {
		opts := n.base.Clone()
		opts.Host = "127.0.0.1"
		opts.Port = n.ClientPort
		opts.StoreDir = n.Dir
		opts.Cluster.Host = "127.0.0.1"
		opts.Cluster.Port = n.ClusterPort
		opts.Routes = c.routes()
		if opts.HTTPPort != 0 {
			opts.HTTPHost, opts.HTTPPort = "127.0.0.1", -1
		}
		opts.NoLog, opts.NoSigs = true, true
		return opts
	}
	opts := &server.Options{
		ServerName: n.Name,
		Host:       "127.0.0.1",
		Port:       n.ClientPort,
		JetStream:  true,
		StoreDir:   n.Dir,
		// Every node takes what it needs of the machine, not a share of it.
		JetStreamMaxStore:  -1,
		JetStreamMaxMemory: -1,
		Cluster: server.ClusterOpts{
			Name:        ClusterName,
			Host:        "127.0.0.1",
			Port:        n.ClusterPort,
			NoAdvertise: !c.cfg.Advertise,
		},
		Routes: c.routes(),
		// As deploy/nats/*.conf: room for the broker's 1 MiB events.
		MaxPayload: natsembed.MaxPayload,
		NoLog:      true,
		NoSigs:     true,
	}
	if c.cfg.SyncInterval < 0 {
		opts.SyncAlways = true
	} else {
		opts.SyncInterval = c.cfg.SyncInterval
	}
	return opts
}

// start starts the node's server on its ports and store.
func (n *Node) start() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cluster.cfg.Binary != "" {
		return n.startProcess()
	}
	if n.srv != nil {
		return nil
	}
	s, err := server.NewServer(n.Options())
	if err != nil {
		return fmt.Errorf("%s: %w", n.Name, err)
	}
	go s.Start()
	if !s.ReadyForConnections(Patience) {
		s.Shutdown()
		s.WaitForShutdown()
		return fmt.Errorf("%s: not ready for connections on %s after %s (port taken?)", n.Name, n.ClientAddr(), Patience)
	}
	n.srv = s
	return nil
}

// Stop shuts the node down and waits until it is gone; clients connected to
// it reconnect to the others. The server hands the raft leaderships it holds
// over to the other nodes first (a process node is sent SIGTERM, which does
// the same). Safe to call on a stopped node.
func (n *Node) Stop() {
	n.mu.Lock()
	s, p := n.srv, n.proc
	n.srv, n.proc = nil, nil
	n.mu.Unlock()
	if s != nil {
		s.Shutdown()
		s.WaitForShutdown()
	}
	if p != nil {
		p.terminate()
	}
}

// Kill ends a node that runs as a process (Config.Binary) with SIGKILL, as
// a crash or kill -9 would: it hands nothing over, and the other nodes elect
// new leaders for its raft groups only once their election timeouts pass
// (4 to 9 s in nats-server 2.15). It waits until the process is gone; clients
// connected to it reconnect to the others. Restart starts it again. Killing
// a stopped node does nothing; an in-process node cannot be killed (error).
func (n *Node) Kill() error {
	if n.cluster.cfg.Binary == "" {
		return fmt.Errorf("%s runs in process: only a node that is a process (Config.Binary) can be killed", n.Name)
	}
	n.mu.Lock()
	p := n.proc
	n.proc = nil
	if p != nil {
		n.kills++
	}
	n.mu.Unlock()
	if p == nil {
		return nil
	}
	return p.kill()
}

// Kills reports how often the node was killed.
func (n *Node) Kills() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.kills
}

// Restart starts the node again (stopping it first if it runs) on the same
// ports and store, and waits until the cluster is formed again with it. A
// port the old server held may linger for a moment, so a failed start is
// tried again until ctx ends. It may be called from any goroutine.
func (n *Node) Restart(ctx context.Context) error {
	n.Stop()
	for {
		err := n.start()
		if err == nil {
			break
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("restart NATS %s: %w (%w)", n.Name, err, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
	return n.cluster.WaitFormed(ctx)
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func FreePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}
