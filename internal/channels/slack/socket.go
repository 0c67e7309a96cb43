package slack

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/slack-go/slack"
	"github.com/slack-go/slack/socketmode"
	"go.uber.org/zap"
)

// socketWorkers bounds the interactions handled at once in socket mode.
const socketWorkers = 16

// runSocket takes interactions over Socket Mode until ctx ends: Slack sends
// them over a websocket the bot opens with the app-level token, so the bot
// needs no public URL, and the token itself authenticates what arrives.
// The connection is kept open, and opened again after Slack refuses it
// (a revoked token, say) once the problem may have been fixed.
func (a *Adapter) runSocket(ctx context.Context) {
	client := socketmode.New(a.api, socketmode.OptionLog(zap.NewStdLog(a.log.Named("socketmode"))))
	var handlers sync.WaitGroup
	defer handlers.Wait()
	sem := make(chan struct{}, socketWorkers)
	runs := make(chan error, 1)
	running := false
	run := func() {
		running = true
		go func() { runs <- client.RunContext(ctx) }()
	}
	run()
	retry := time.NewTimer(time.Hour)
	retry.Stop()
	defer retry.Stop()
	for {
		select {
		case <-ctx.Done():
			if running {
				<-runs
			}
			return
		case err := <-runs:
			running = false
			if ctx.Err() != nil {
				return
			}
			a.log.Error("Socket Mode connection refused; trying again in a minute", zap.Error(a.socketError(err)))
			retry.Reset(time.Minute)
		case <-retry.C:
			run()
		case evt := <-client.Events:
			a.onSocketEvent(ctx, client, evt, sem, &handlers)
		}
	}
}

// onSocketEvent handles one Socket Mode event: interactions go to interact,
// each in a goroutine of handlers, at most cap(sem) at once.
func (a *Adapter) onSocketEvent(ctx context.Context, client *socketmode.Client, evt socketmode.Event, sem chan struct{}, handlers *sync.WaitGroup) {
	switch evt.Type {
	case socketmode.EventTypeConnected:
		a.log.Info("connected to Slack over Socket Mode")
	case socketmode.EventTypeConnectionError:
		if e, ok := evt.Data.(*slack.ConnectionErrorEvent); ok {
			a.log.Warn("Socket Mode connection failed; retrying", zap.Error(e.ErrorObj), zap.Duration("backoff", e.Backoff))
		}
	case socketmode.EventTypeInvalidAuth:
		a.log.Error("Slack refused the app-level token in " + a.cfg.AppTokenEnv + ": make one with the connections:write scope under Basic Information, App-Level Tokens, and enable Socket Mode")
	case socketmode.EventTypeInteractive:
		cb, ok := evt.Data.(slack.InteractionCallback)
		if !ok || evt.Request == nil {
			return
		}
		req := *evt.Request
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			return
		}
		handlers.Go(func() {
			defer func() { <-sem }()
			a.onSocketInteraction(ctx, client, req, &cb)
		})
	case socketmode.EventTypeEventsAPI, socketmode.EventTypeSlashCommand:
		// Not subscribed to; acknowledged so that Slack does not resend.
		if evt.Request != nil {
			a.ack(ctx, client, evt.Request.EnvelopeID, nil)
		}
	}
}

// onSocketInteraction handles one interaction and acknowledges its
// envelope: a click at once (Slack wants an answer within 3 seconds, and a
// click needs none), a submission with its response.
func (a *Adapter) onSocketInteraction(ctx context.Context, client *socketmode.Client, req socketmode.Request, cb *slack.InteractionCallback) {
	if cb.Type != slack.InteractionTypeViewSubmission {
		a.ack(ctx, client, req.EnvelopeID, nil)
	}
	// Finish what was started even as the bot shuts down, within a bound.
	work, cancel := context.WithTimeout(context.WithoutCancel(ctx), interactionPatience)
	defer cancel()
	resp := a.interact(work, cb)
	if cb.Type == slack.InteractionTypeViewSubmission {
		var payload any
		if resp != nil {
			payload = resp
		}
		a.ack(ctx, client, req.EnvelopeID, payload)
	}
}

// ack acknowledges envelope id, with payload if not nil.
func (a *Adapter) ack(ctx context.Context, client *socketmode.Client, id string, payload any) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := client.AckCtx(ctx, id, payload); err != nil && ctx.Err() == nil {
		a.log.Warn("acknowledge a Socket Mode envelope", zap.Error(err))
	}
}

// socketError explains why Slack refused a Socket Mode connection.
func (a *Adapter) socketError(err error) error {
	var se slack.SlackErrorResponse
	if errors.As(err, &se) || authFailure(err.Error()) {
		return errors.New("the app-level token in " + a.cfg.AppTokenEnv + " was refused by Slack (" + err.Error() + "): make one with the connections:write scope under Basic Information, App-Level Tokens, and enable Socket Mode in the app")
	}
	return err
}
