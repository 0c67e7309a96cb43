package broker

import (
	"fmt"
	"sync/atomic"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
)

// publishConns is how many connections besides the broker's own carry its
// publishes. Every publish takes its connection's lock, two or three times
// for one awaiting its acknowledgement: with hundreds of handlers
// publishing at once on one connection, handing that lock from one to the
// next is what they wait for, and while a garbage collection slows every
// goroutine's turn it stalled ten thousand expiries a second for a second
// and more.
const publishConns = 3

// publishers spreads publishes over the broker's connection and extra
// ones made with its options, skipping those that are down.
type publishers struct {
	conns []pubConn // the broker's own first
	next  atomic.Uint32
}

// pubConn is one connection publishes go out on.
type pubConn struct {
	nc *nats.Conn
	js jetstream.JetStream
	// up says whether an extra connection is connected, as its handlers
	// last heard; nil for the broker's own, which is asked.
	up *atomic.Bool
}

func (c pubConn) connected() bool {
	if c.up == nil {
		return c.nc.IsConnected()
	}
	return c.up.Load()
}

// newPublishers returns publishers over nc and up to extra more
// connections made with nc's options. A connection that cannot be made is
// left out and logged: the others carry its share.
func newPublishers(nc *nats.Conn, js jetstream.JetStream, extra int, log *zap.Logger) *publishers {
	p := &publishers{conns: []pubConn{{nc: nc, js: js}}}
	for i := range extra {
		opts := nc.Opts
		if opts.Name != "" {
			opts.Name = fmt.Sprintf("%s (publisher %d)", opts.Name, i+1)
		}
		// The broker's handlers speak for its own connection; these
		// only say whether this one is up, so that a publish goes out
		// on a connection that is. One that cannot connect at first
		// keeps trying in the background.
		up := new(atomic.Bool)
		opts.DiscoveredServersCB, opts.AsyncErrorCB, opts.LameDuckModeHandler, opts.ReconnectErrCB = nil, nil, nil, nil
		opts.ConnectedCB = func(*nats.Conn) { up.Store(true) }
		opts.ReconnectedCB = func(*nats.Conn) { up.Store(true) }
		opts.DisconnectedErrCB = func(*nats.Conn, error) { up.Store(false) }
		opts.DisconnectedCB = nil
		opts.ClosedCB = func(*nats.Conn) { up.Store(false) }
		opts.RetryOnFailedConnect = true
		c, err := opts.Connect()
		if err == nil {
			// up follows the handlers, called in order: connected
			// (also when the first attempt works), then any disconnect
			// and reconnect.
			var cjs jetstream.JetStream
			if cjs, err = jetstream.New(c); err == nil {
				p.conns = append(p.conns, pubConn{nc: c, js: cjs, up: up})
				continue
			}
			c.Close()
		}
		log.Warn("an extra connection for publishing could not be made; publishing on the others", zap.Error(err))
	}
	return p
}

// pick returns the connection and JetStream context of the next publish:
// the next one that is up, or, while none is (an outage), the next one.
// Skipping those down keeps a connection that has not reconnected yet from
// failing publishes while the others carry them.
func (p *publishers) pick() (*nats.Conn, jetstream.JetStream) {
	first := int(p.next.Add(1)) % len(p.conns)
	for k := range len(p.conns) {
		if c := p.conns[(first+k)%len(p.conns)]; c.connected() {
			return c.nc, c.js
		}
	}
	return p.conns[first].nc, p.conns[first].js
}

// close closes the extra connections, after what was published on them
// is sent.
func (p *publishers) close() {
	for _, c := range p.conns[1:] {
		_ = c.nc.Drain()
	}
}
