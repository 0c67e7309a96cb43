package broker

import (
	"context"
	"encoding/json"
	"errors"
	"strings"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"

	"github.com/assent-dev/assent/pkg/events"
)

// answerAgent answers an agent's request about its own requests, on
// assent-private.<agent>.list (its pending requests) or .cancel (cancel
// them all, each recorded as cancelled by agent/<agent>). The subject names
// the agent, and only that agent's requests are listed or cancelled: NATS
// permissions let a credential publish on its own agent's subjects alone.
func (b *Broker) answerAgent(ctx context.Context, m *nats.Msg) {
	if m.Reply == "" {
		return
	}
	var reply events.AgentReply
	defer func() {
		data, err := json.Marshal(reply)
		if err == nil {
			err = m.Respond(data)
		}
		if err != nil {
			b.log.Debug("agent answer not sent", zap.String("subject", m.Subject), zap.Error(err))
		}
	}()
	agent, kind, _ := strings.Cut(strings.TrimPrefix(m.Subject, events.PrivatePrefix), ".")
	var q events.AgentQuery
	if len(m.Data) > 0 {
		if err := json.Unmarshal(m.Data, &q); err != nil {
			reply.Error = "invalid query: " + err.Error()
			return
		}
	}
	if q.Session != "" && !events.ValidToken(q.Session) {
		reply.Error = "invalid query: session: not a subject token"
		return
	}
	if !events.ValidToken(agent) {
		reply.Error = "invalid agent"
		return
	}
	switch kind {
	case events.AgentList:
		page, err := b.List(ctx, Filter{State: StatePending, Agent: agent, Session: q.Session, After: q.After, Limit: events.MaxAgentPage})
		if err != nil {
			reply.Error = err.Error()
			return
		}
		reply.Pending = make([]events.AgentPending, 0, len(page.Records))
		for _, rec := range page.Records {
			r := rec.Request
			reply.Pending = append(reply.Pending, events.AgentPending{ID: rec.ID, Tool: r.Tool, Session: r.Session, User: r.User,
				CallID: r.CallID, Hint: r.Hint, ReceivedAt: rec.ReceivedAt, Deadline: rec.Deadline})
		}
		reply.More = page.Next != ""
	case events.AgentCancel:
		c := events.Cancel{Reason: q.Reason}
		if err := c.Validate(); err != nil {
			reply.Error = "invalid query: " + err.Error()
			return
		}
		f := Filter{State: StatePending, Agent: agent, Session: q.Session, Limit: events.MaxAgentPage}
		var errs []error
		for {
			page, err := b.List(ctx, f)
			if err != nil {
				errs = append(errs, err)
				break
			}
			for _, rec := range page.Records {
				_, err := b.Cancel(ctx, rec.ID, "agent/"+agent, q.Reason)
				switch {
				case err == nil:
					reply.Cancelled = append(reply.Cancelled, rec.ID)
				case errors.Is(err, ErrAlreadyDecided), errors.Is(err, ErrExpired), errors.Is(err, ErrNotFound):
					// Decided meanwhile: nothing to cancel.
				default:
					errs = append(errs, err)
				}
			}
			if page.Next == "" {
				break
			}
			f.After = page.Next
		}
		if err := errors.Join(errs...); err != nil {
			reply.Error = err.Error()
		}
	default:
		reply.Error = "unknown kind " + kind + ": want list or cancel"
	}
}
