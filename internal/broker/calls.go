package broker

import (
	"context"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// callTimeout bounds one call to the NATS server: a publish, a read or write
// of a bucket, a message get, a consumer's info. JetStream answers nothing to
// a call its stream's or consumer's leader cannot serve, and after a node
// crashes the others elect new leaders only when their election timeouts
// pass (4 to 9 s in nats-server 2.15): a call made meanwhile would wait for
// as long as its context lets it, and one given a handler's whole budget
// (handleTimeout) held its message for 15 s after the new leader was there.
// With its own deadline a call sent to a leader that is gone fails within
// callTimeout, and the message is tried again (settle, notYet) once the
// leader is back. Two seconds is far above any call's time on a healthy
// cluster, also under load on two cores with -race, and a few times below an
// election.
const callTimeout = 2 * time.Second

// unavailableDelay is how soon a message whose handling failed because the
// server did not answer is tried again.
const unavailableDelay = 250 * time.Millisecond

// callCtx returns ctx bounded for one call to the server: callTimeout, or
// sooner if ctx ends sooner.
func callCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, callTimeout)
}

// publish stores msg on the stream within callTimeout. A publish that fails
// by its deadline may still have been stored: every caller publishes
// something a retry can publish again (a message id, an expected last
// subject sequence) or reads back what is there.
func (b *Broker) publish(ctx context.Context, msg *nats.Msg, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	cctx, cancel := callCtx(ctx)
	defer cancel()
	_, js := b.pubs.Load().pick()
	return js.PublishMsg(cctx, msg, opts...)
}
