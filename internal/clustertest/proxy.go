package clustertest

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
)

// Proxy is a TCP proxy with injectable network faults (Shopify's toxiproxy,
// run in process), put between one client and one NATS node: the client
// connects to Proxy.URL() instead of the node. Its methods may be called from
// any goroutine.
type Proxy struct {
	Upstream string // host:port the proxy forwards to

	p *toxiproxy.Proxy

	mu     sync.Mutex
	counts map[string]int // faults injected, by kind
}

// NewProxy starts a proxy to upstream (host:port) on a free loopback port,
// stopped when the test ends.
func NewProxy(t testing.TB, name, upstream string) *Proxy {
	t.Helper()
	srv := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop())
	p := toxiproxy.NewProxy(srv, name, "127.0.0.1:0", upstream)
	if err := p.Start(); err != nil {
		t.Fatalf("start proxy %s to %s: %v", name, upstream, err)
	}
	t.Cleanup(p.Stop)
	return &Proxy{Upstream: upstream, p: p, counts: map[string]int{}}
}

// Addr is the host:port clients connect to.
func (x *Proxy) Addr() string { return x.p.Listen }

// URL is the NATS URL clients connect to.
func (x *Proxy) URL() string { return "nats://" + x.p.Listen }

// Latency delays everything in both directions by latency ± jitter until
// Clear.
func (x *Proxy) Latency(latencyMS, jitterMS int) error {
	for _, stream := range []string{"upstream", "downstream"} {
		if err := x.add("latency_"+stream, "latency", stream, fmt.Sprintf(`{"latency":%d,"jitter":%d}`, latencyMS, jitterMS)); err != nil {
			return err
		}
	}
	x.count("latency")
	return nil
}

// Drop drops every byte in both directions until Clear, as a network that
// loses every packet does: the connections look alive and carry nothing.
// After closeAfter the proxy closes them, as TCP gives up on such a
// connection; with closeAfter 0 it never does, and what was sent meanwhile
// is lost from the middle of a live connection, which no real network does
// to TCP (the NATS protocol stream then has a hole when Clear lets traffic
// through again).
func (x *Proxy) Drop(closeAfter time.Duration) error {
	for _, stream := range []string{"upstream", "downstream"} {
		if err := x.add("drop_"+stream, "timeout", stream, fmt.Sprintf(`{"timeout":%d}`, closeAfter.Milliseconds())); err != nil {
			return err
		}
	}
	x.count("drop")
	return nil
}

// Cut resets every connection through the proxy (TCP RST) as soon as it
// carries data, until Clear: a connection cut mid-stream, and every
// reconnect cut again.
func (x *Proxy) Cut() error {
	if err := x.add("cut", "reset_peer", "downstream", `{"timeout":0}`); err != nil {
		return err
	}
	x.count("cut")
	return nil
}

// Down closes every connection through the proxy and refuses new ones until
// Up: the node looks gone to the client.
func (x *Proxy) Down() {
	x.p.Stop()
	x.count("down")
}

// Up listens again, on the same address, after Down.
func (x *Proxy) Up() error {
	return x.p.Start()
}

// Clear removes every fault.
func (x *Proxy) Clear() {
	x.p.Toxics.ResetToxics(context.Background())
}

// Counts reports how many faults of each kind were injected.
func (x *Proxy) Counts() map[string]int {
	x.mu.Lock()
	defer x.mu.Unlock()
	out := make(map[string]int, len(x.counts))
	for k, v := range x.counts {
		out[k] = v
	}
	return out
}

func (x *Proxy) count(kind string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.counts[kind]++
}

func (x *Proxy) add(name, typ, stream, attrs string) error {
	body := fmt.Sprintf(`{"name":%q,"type":%q,"stream":%q,"toxicity":1,"attributes":%s}`, name, typ, stream, attrs)
	if _, err := x.p.Toxics.AddToxicJson(strings.NewReader(body)); err != nil {
		return fmt.Errorf("proxy: add %s: %w", name, err)
	}
	return nil
}
