package itest

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/assent-dev/assent/internal/broker"
	"github.com/assent-dev/assent/pkg/events"
)

// LeaderMsg is a message of the broker's stream as its leader returns it.
type LeaderMsg struct {
	Subject  string    `json:"subject"`
	Sequence uint64    `json:"seq"`
	Header   []byte    `json:"hdrs,omitempty"`
	Data     []byte    `json:"data,omitempty"`
	Time     time.Time `json:"time"`
}

// LeaderGet reads the first message on subject at or after sequence seq of
// the broker's stream, nil if there is none, from the stream's leader:
// $JS.API.STREAM.MSG.GET, never the direct get, which a follower still
// catching up may answer (jetstream's Stream.GetMsg takes the direct get
// whenever the stream allows it, as ASSENT does). The call has its own
// short deadline within ctx's.
func LeaderGet(ctx context.Context, nc *nats.Conn, subject string, seq uint64) (*LeaderMsg, error) {
	body, err := json.Marshal(map[string]any{"seq": seq, "next_by_subj": subject})
	if err != nil {
		return nil, err
	}
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	m, err := nc.RequestWithContext(cctx, "$JS.API.STREAM.MSG.GET."+broker.StreamName, body)
	if err != nil {
		return nil, fmt.Errorf("get %s from %d: %w", subject, seq, err)
	}
	var resp struct {
		Message *LeaderMsg          `json:"message"`
		Error   *jetstream.APIError `json:"error"`
	}
	if err := json.Unmarshal(m.Data, &resp); err != nil {
		return nil, fmt.Errorf("get %s from %d: %q: %w", subject, seq, m.Data, err)
	}
	switch {
	case resp.Error != nil && resp.Error.ErrorCode == jetstream.JSErrCodeMessageNotFound:
		return nil, nil
	case resp.Error != nil:
		return nil, fmt.Errorf("get %s from %d: %w", subject, seq, resp.Error)
	case resp.Message == nil:
		return nil, fmt.Errorf("get %s from %d: no message in %q", subject, seq, m.Data)
	}
	return resp.Message, nil
}

// Event decodes m as an event (decisions may exceed the limit on incoming
// events by the broker's headroom; the server bounds them).
func (m *LeaderMsg) Event() (events.Event, error) {
	var h nats.Header
	if len(m.Header) > 0 {
		var err error
		if h, err = nats.DecodeHeadersMsg(m.Header); err != nil {
			return events.Event{}, fmt.Errorf("%s at %d: headers: %w", m.Subject, m.Sequence, err)
		}
	}
	e, err := events.Codec{MaxSize: 2 << 20}.Decode(events.Header(h), m.Data)
	if err != nil {
		return events.Event{}, fmt.Errorf("%s at %d: %w", m.Subject, m.Sequence, err)
	}
	return e, nil
}

// Decided decodes m as a decided event.
func (m *LeaderMsg) Decided() (events.Decided, error) {
	e, err := m.Event()
	if err != nil {
		return events.Decided{}, err
	}
	d, err := events.DecodeDecided(&e)
	if err != nil {
		return events.Decided{}, fmt.Errorf("%s at %d: %w", m.Subject, m.Sequence, err)
	}
	return d, nil
}

// LeaderDecision reads request id's decision, the first message on
// assent.decision.<id>, from the stream's leader; ok is false when the
// stream holds none.
func LeaderDecision(ctx context.Context, nc *nats.Conn, id string) (d events.Decided, ok bool, err error) {
	subj, err := events.DecisionSubject(id)
	if err != nil {
		return events.Decided{}, false, err
	}
	m, err := LeaderGet(ctx, nc, subj, 1)
	if err != nil || m == nil {
		return events.Decided{}, false, err
	}
	d, err = m.Decided()
	return d, err == nil, err
}

// LookupRequest asks the broker where request id stands, on
// assent-broker.lookup.<id> (any replica answers): events.LookupUnknown when
// it knows no such request, events.LookupPending (stored, maybe not judged
// yet) or events.LookupDecided. The call has its own short deadline within
// ctx's.
func LookupRequest(ctx context.Context, nc *nats.Conn, id string) (string, error) {
	subj, err := events.BrokerLookupSubject(id)
	if err != nil {
		return "", err
	}
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	m, err := nc.RequestWithContext(cctx, subj, nil)
	if err != nil {
		return "", fmt.Errorf("look up %s: %w", id, err)
	}
	switch st := m.Header.Get(events.LookupStatus); st {
	case events.LookupUnknown, events.LookupPending, events.LookupDecided:
		return st, nil
	default:
		return "", fmt.Errorf("look up %s: status %q", id, st)
	}
}
