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
// ones made with its options.
type publishers struct {
	conns []*nats.Conn
	js    []jetstream.JetStream
	next  atomic.Uint32
}

// newPublishers returns publishers over nc and up to extra more
// connections made with nc's options. A connection that cannot be made is
// left out and logged: the others carry its share.
func newPublishers(nc *nats.Conn, js jetstream.JetStream, extra int, log *zap.Logger) *publishers {
	p := &publishers{conns: []*nats.Conn{nc}, js: []jetstream.JetStream{js}}
	for i := range extra {
		opts := nc.Opts
		if opts.Name != "" {
			opts.Name = fmt.Sprintf("%s (publisher %d)", opts.Name, i+1)
		}
		c, err := opts.Connect()
		if err == nil {
			var cjs jetstream.JetStream
			if cjs, err = jetstream.New(c); err == nil {
				p.conns, p.js = append(p.conns, c), append(p.js, cjs)
				continue
			}
			c.Close()
		}
		log.Warn("an extra connection for publishing could not be made; publishing on the others", zap.Error(err))
	}
	return p
}

// pick returns the connection and JetStream context of the next publish.
func (p *publishers) pick() (*nats.Conn, jetstream.JetStream) {
	i := int(p.next.Add(1)) % len(p.conns)
	return p.conns[i], p.js[i]
}

// close closes the extra connections, after what was published on them
// is sent.
func (p *publishers) close() {
	for _, c := range p.conns[1:] {
		_ = c.Drain()
	}
}
