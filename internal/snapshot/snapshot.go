// Package snapshot is the client side of JetStream's own stream snapshot and
// restore API, on a plain nats.go connection:
//
//   - Save asks $JS.API.STREAM.SNAPSHOT.<stream> for a snapshot delivered to
//     an inbox. The server answers with the stream's configuration and state,
//     then sends the snapshot in chunks; each chunk but the last carries a
//     reply subject, and answering it is the flow-control ack that lets the
//     server send more. An empty message ends the transfer: with no status or
//     204 it is complete, with 408 or 500 the server gave up (the reason is in
//     the status description).
//   - Restore asks $JS.API.STREAM.RESTORE.<stream>, with the configuration and
//     state Save returned, for a subject to send chunks to. Each chunk is a
//     request: an empty reply acknowledges it, a JSON error refuses it. An
//     empty request ends the transfer, and its reply is the restored stream's
//     information once the server has rebuilt the stream.
//
// What the snapshot holds is the server's business (an s2-compressed archive
// of the messages and, by default, the consumers' state); this package moves
// it as opaque bytes. A KV bucket is a stream (KV_<bucket>) like any other.
package snapshot

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/nats-io/nats.go"
)

// The JetStream API subjects this package speaks.
const (
	snapshotSubject = "$JS.API.STREAM.SNAPSHOT."
	restoreSubject  = "$JS.API.STREAM.RESTORE."
)

// chunkSize is the size of the chunks Save asks for and Restore sends:
// the server's default, well under any server's max_payload.
const chunkSize = 128 << 10

// idle bounds the wait for the server's next chunk, or its answer to one, once
// a transfer is under way. The server itself gives up after 5 s without acks
// or chunks.
const idle = 30 * time.Second

// rebuild bounds the wait for a restored stream to be rebuilt, when the
// caller's context sets no deadline.
const rebuild = 30 * time.Minute

// Server error codes (err_code) that callers branch on.
const (
	codeStreamNotFound = 10059
	codeStreamExists   = 10130
)

var (
	// ErrStreamNotFound: the stream to save does not exist.
	ErrStreamNotFound = errors.New("stream not found")
	// ErrStreamExists: the stream to restore exists already; the server
	// restores only into a stream of that name that does not exist.
	ErrStreamExists = errors.New("stream already exists")
)

// APIError is an error the JetStream API answered with. It matches
// ErrStreamNotFound and ErrStreamExists with errors.Is.
type APIError struct {
	Code        int    `json:"code"`
	ErrCode     int    `json:"err_code"`
	Description string `json:"description"`
}

func (e *APIError) Error() string {
	return fmt.Sprintf("%s (JetStream error %d, status %d)", e.Description, e.ErrCode, e.Code)
}

// Is reports whether e is one of the sentinel errors.
func (e *APIError) Is(target error) bool {
	switch target {
	case ErrStreamNotFound:
		return e.ErrCode == codeStreamNotFound
	case ErrStreamExists:
		return e.ErrCode == codeStreamExists
	}
	return false
}

// Info is what a snapshot needs to be restored: the stream's configuration
// and state when it was taken, as the server wrote them (kept as raw JSON, so
// that fields this program does not know survive the round trip).
type Info struct {
	Config json.RawMessage `json:"config"`
	State  json.RawMessage `json:"state"`
}

// State is the part of a stream's state this package reads.
type State struct {
	Msgs     uint64 `json:"messages"`
	Bytes    uint64 `json:"bytes"`
	FirstSeq uint64 `json:"first_seq"`
	LastSeq  uint64 `json:"last_seq"`
}

// ParseState decodes raw, a stream state as the server writes it.
func ParseState(raw json.RawMessage) (State, error) {
	var s State
	if err := json.Unmarshal(raw, &s); err != nil {
		return State{}, fmt.Errorf("stream state: %w", err)
	}
	return s, nil
}

// Progress is told how many bytes of a snapshot have moved so far.
type Progress func(bytes int64)

// Save writes a snapshot of stream, with its consumers, to w, and returns
// its configuration and state at that moment. progress, if not nil, is called
// after every chunk. If the stream does not exist, ErrStreamNotFound is
// returned (as an *APIError).
func Save(ctx context.Context, nc *nats.Conn, stream string, w io.Writer, progress Progress) (Info, error) {
	inbox := nc.NewInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		return Info{}, fmt.Errorf("snapshot %s: subscribe: %w", stream, err)
	}
	defer sub.Unsubscribe() //nolint:errcheck // nothing left to receive
	// The server sends up to its window (8 MiB) before waiting for acks.
	if err := sub.SetPendingLimits(-1, 64<<20); err != nil {
		return Info{}, err
	}
	req, err := json.Marshal(struct {
		DeliverSubject string `json:"deliver_subject"`
		ChunkSize      int    `json:"chunk_size"`
	}{inbox, chunkSize})
	if err != nil {
		return Info{}, err
	}
	var resp struct {
		Error *APIError `json:"error"`
		Info
	}
	if err := request(ctx, nc, snapshotSubject+stream, req, &resp); err != nil {
		return Info{}, fmt.Errorf("snapshot %s: %w", stream, err)
	}
	if resp.Error != nil {
		return Info{}, fmt.Errorf("snapshot %s: %w", stream, resp.Error)
	}
	var n int64
	for {
		mctx, cancel := context.WithTimeout(ctx, idle)
		msg, err := sub.NextMsgWithContext(mctx)
		cancel()
		if err != nil {
			return Info{}, fmt.Errorf("snapshot %s: waiting for the next chunk after %d bytes: %w", stream, n, err)
		}
		if len(msg.Data) == 0 {
			if status := msg.Header.Get("Status"); status != "" && status != "204" {
				return Info{}, fmt.Errorf("snapshot %s: the server stopped after %d bytes: %s %s", stream, n, status, msg.Header.Get("Description"))
			}
			return resp.Info, nil
		}
		if _, err := w.Write(msg.Data); err != nil {
			return Info{}, fmt.Errorf("snapshot %s: %w", stream, err)
		}
		n += int64(len(msg.Data))
		if msg.Reply != "" {
			// The flow-control ack: the server may send one chunk more.
			if err := msg.Respond(nil); err != nil {
				return Info{}, fmt.Errorf("snapshot %s: ack chunk: %w", stream, err)
			}
		}
		if progress != nil {
			progress(n)
		}
	}
}

// Restore makes the stream info describes from the snapshot read from r, and
// returns the restored stream's state as the server reports it once the
// stream is rebuilt. The stream must not exist: if it does, ErrStreamExists
// is returned (as an *APIError) and nothing changes. progress, if not nil, is
// called after every chunk.
func Restore(ctx context.Context, nc *nats.Conn, info Info, r io.Reader, progress Progress) (State, error) {
	var cfg struct {
		Name string `json:"name"`
	}
	if err := json.Unmarshal(info.Config, &cfg); err != nil || cfg.Name == "" {
		return State{}, fmt.Errorf("restore: the stream configuration names no stream (%v)", err)
	}
	stream := cfg.Name
	req, err := json.Marshal(info)
	if err != nil {
		return State{}, err
	}
	var start struct {
		Error          *APIError `json:"error"`
		DeliverSubject string    `json:"deliver_subject"`
	}
	if err := request(ctx, nc, restoreSubject+stream, req, &start); err != nil {
		return State{}, fmt.Errorf("restore %s: %w", stream, err)
	}
	if start.Error != nil {
		return State{}, fmt.Errorf("restore %s: %w", stream, start.Error)
	}
	if start.DeliverSubject == "" {
		return State{}, fmt.Errorf("restore %s: the server gave no subject to send the snapshot to", stream)
	}
	buf := make([]byte, chunkSize)
	var n int64
	for {
		k, rerr := io.ReadFull(r, buf)
		if k > 0 {
			// Each chunk waits for its ack: the server writes it to the
			// stream being rebuilt before answering.
			var refused struct {
				Error *APIError `json:"error"`
			}
			if err := request(ctx, nc, start.DeliverSubject, buf[:k], &refused); err != nil {
				return State{}, fmt.Errorf("restore %s: chunk after %d bytes: %w", stream, n, err)
			}
			if refused.Error != nil {
				return State{}, fmt.Errorf("restore %s: the server refused the chunk after %d bytes: %w", stream, n, refused.Error)
			}
			n += int64(k)
			if progress != nil {
				progress(n)
			}
		}
		if rerr == io.EOF || rerr == io.ErrUnexpectedEOF {
			break
		}
		if rerr != nil {
			return State{}, fmt.Errorf("restore %s: read the snapshot: %w", stream, rerr)
		}
	}
	// The empty message ends the transfer; the answer comes once the server
	// has rebuilt the stream, which for a large one takes a while: ctx bounds
	// that wait, or rebuild if ctx has no deadline.
	var done struct {
		Error *APIError `json:"error"`
		State State     `json:"state"`
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, rebuild)
		defer cancel()
	}
	msg, err := nc.RequestWithContext(ctx, start.DeliverSubject, nil)
	if err != nil {
		return State{}, fmt.Errorf("restore %s: finishing after %d bytes: %w", stream, n, err)
	}
	if err := json.Unmarshal(msg.Data, &done); err != nil {
		return State{}, fmt.Errorf("restore %s: the server's last answer: %w", stream, err)
	}
	if done.Error != nil {
		return State{}, fmt.Errorf("restore %s: %w", stream, done.Error)
	}
	return done.State, nil
}

// request sends data to subject and decodes the JSON answer into v; an empty
// answer leaves v as it is. It waits idle at most.
func request(ctx context.Context, nc *nats.Conn, subject string, data []byte, v any) error {
	ctx, cancel := context.WithTimeout(ctx, idle)
	defer cancel()
	msg, err := nc.RequestWithContext(ctx, subject, data)
	if err != nil {
		if errors.Is(err, nats.ErrNoResponders) {
			return fmt.Errorf("%w (is JetStream enabled for this account, and may these credentials use its API?)", err)
		}
		return err
	}
	if len(msg.Data) == 0 {
		return nil
	}
	if err := json.Unmarshal(msg.Data, v); err != nil {
		return fmt.Errorf("answer from %s: %w", subject, err)
	}
	return nil
}
