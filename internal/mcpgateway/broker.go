package mcpgateway

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/assent-dev/assent/pkg/events"
)

// A call whose request no broker takes up would wait its whole timeout and
// the client's grace on top, longer than clients wait for a tool call (the
// TypeScript SDK gives up after 60s): the model would see the client's
// timeout, not why. So before asking, the gateway checks that NATS is
// connected, that a broker has run on it (its stream exists; private
// credentials may not look) and that one answers the agent's lookups; after
// asking, that a broker stores the request within Config.BrokerWait.
// Otherwise the call fails at once with ErrNoBroker, and does not run.

// opCheck bounds each look at NATS while checking for a broker.
const opCheck = 2 * time.Second

// takenUp reports whether a broker has stored request id yet.
type takenUp func(ctx context.Context, id string) (bool, error)

// brokerReady checks, before agent's request id is asked, that a broker can
// take it up: NATS is connected, a broker has made its stream (unless the
// credentials are private) and a broker answers the agent's lookups
// (assent-private.<agent>.lookup.<id>, which agent credentials may ask for
// their own agent). It returns how to tell that the broker took the request
// up, or an error wrapping ErrNoBroker.
func (g *Gateway) brokerReady(ctx context.Context, agent, id string) (takenUp, error) {
	if err := g.unreachable(); err != nil {
		return nil, err
	}
	if !g.cfg.NATS.Private {
		sctx, cancel := context.WithTimeout(ctx, opCheck)
		defer cancel()
		_, err := g.js.Stream(sctx, events.StreamName)
		switch {
		case errors.Is(err, jetstream.ErrStreamNotFound):
			return nil, fmt.Errorf("%w: no broker has run on this NATS server (it has no stream %s)", ErrNoBroker, events.StreamName)
		case err != nil && ctx.Err() == nil:
			if err := g.unreachable(); err != nil { // it went while we asked
				return nil, err
			}
			return nil, fmt.Errorf("%w: JetStream does not answer: %v", ErrNoBroker, err)
		case err != nil:
			return nil, err
		}
	}
	up := func(ctx context.Context, id string) (bool, error) { return g.lookup(ctx, agent, id) }
	if _, err := up(ctx, id); errors.Is(err, ErrNoBroker) {
		return nil, err
	}
	return up, nil
}

// unreachable is an error wrapping ErrNoBroker when the gateway is not
// connected to NATS, else nil.
func (g *Gateway) unreachable() error {
	if g.nc.IsConnected() {
		return nil
	}
	return fmt.Errorf("%w: NATS is unreachable (the connection is %s)", ErrNoBroker, g.nc.Status())
}

// lookup asks the brokers about agent's request id: whether one has stored
// it. No broker to answer is an error wrapping ErrNoBroker.
func (g *Gateway) lookup(ctx context.Context, agent, id string) (bool, error) {
	subj, err := events.PrivateSubject(agent, "lookup", id)
	if err != nil {
		return false, err
	}
	ctx, cancel := context.WithTimeout(ctx, opCheck)
	defer cancel()
	m, err := g.nc.RequestWithContext(ctx, subj, nil)
	switch {
	case errors.Is(err, nats.ErrNoResponders):
		return false, fmt.Errorf("%w: no broker is connected to NATS", ErrNoBroker)
	case err != nil:
		return false, err
	}
	st := m.Header.Get(events.LookupStatus)
	return st == events.LookupPending || st == events.LookupDecided, nil
}

// awaitBroker waits until a broker has taken up request id, as up tells,
// for Config.BrokerWait at most; if none has by then, or NATS goes away or
// no broker answers first, it calls cancel with an error wrapping
// ErrNoBroker. It returns when ctx ends, at the latest.
func (g *Gateway) awaitBroker(ctx context.Context, id string, up takenUp, cancel context.CancelCauseFunc) {
	limit := time.NewTimer(g.cfg.BrokerWait)
	defer limit.Stop()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-limit.C:
			cancel(fmt.Errorf("%w: no broker took the request up within %s", ErrNoBroker, g.cfg.BrokerWait))
			return
		case <-tick.C:
		}
		if err := g.unreachable(); err != nil {
			cancel(err)
			return
		}
		ok, err := up(ctx, id)
		if errors.Is(err, ErrNoBroker) {
			cancel(err)
			return
		}
		if ok {
			return
		}
	}
}
