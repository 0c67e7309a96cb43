package natsconn

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// errStoreFailed is the JetStream API's error code for a stream whose store
// it could not make ("error creating store for stream"): it answers a
// deletion before it has removed the old store's files, and until it has,
// making a stream of the same name again fails so.
const errStoreFailed = 10049

// CreateStream makes the stream cfg describes, trying again, until ctx
// ends, while the server is still removing the store of a stream of that
// name it deleted.
func CreateStream(ctx context.Context, js jetstream.JetStream, cfg jetstream.StreamConfig) (jetstream.Stream, error) {
	for {
		s, err := js.CreateStream(ctx, cfg)
		var apiErr *jetstream.APIError
		if err == nil || !errors.As(err, &apiErr) || apiErr.ErrorCode != errStoreFailed {
			return s, err
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(20 * time.Millisecond):
		}
	}
}
