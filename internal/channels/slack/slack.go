package slack

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/slack-go/slack"
	"go.uber.org/zap"

	"github.com/assent-dev/assent/internal/channels"
	"github.com/assent-dev/assent/pkg/handler"
)

// channelName is the channel's name in decisions and presence, and its key
// for principals' identities in the policy (principals: alice: {slack: U...}).
const channelName = "slack"

// InteractionsPath is where Slack posts interactions in http mode: the
// app's Interactivity Request URL is the bot's public URL with this path.
const InteractionsPath = "/slack/interactions"

// Adapter is the Slack channel: it posts each pending request to a Slack
// channel with buttons, takes people's clicks in, answers for the principal
// each Slack user maps to, and updates the message once the request is
// decided, wherever it was decided. It implements channels.Adapter.
type Adapter struct {
	cfg     Config
	secrets secrets
	env     channels.Env
	api     *slack.Client
	log     *zap.Logger
	replays *replayGuard
	now     func() time.Time

	started atomic.Bool
	rt      channels.Runtime // set once by Start
	wg      sync.WaitGroup   // what Start started
}

var _ channels.Adapter = (*Adapter)(nil)

// New returns the Slack channel configured by cfg, with its secrets read from
// the environment variables cfg names. Every problem is reported at once, in
// an error wrapping ErrConfig that says what to set.
func New(cfg Config, env channels.Env) (*Adapter, error) {
	cfg = cfg.withDefaults()
	errs := cfg.problems()
	s, more := cfg.secrets()
	errs = append(errs, more...)
	if env.Directory == nil {
		errs = append(errs, errors.New("no principal directory: the bot must load the policy before it makes channels"))
	}
	if err := wrapConfig(errs); err != nil {
		return nil, err
	}
	if env.Logger == nil {
		env.Logger = zap.NewNop()
	}
	log := env.Logger
	opts := []slack.Option{
		slack.OptionAPIURL(cfg.APIURL),
		slack.OptionHTTPClient(&http.Client{Timeout: 20 * time.Second}),
		slack.OptionLog(zap.NewStdLog(log.Named("slack-go"))),
	}
	if s.appToken != "" {
		opts = append(opts, slack.OptionAppLevelToken(s.appToken))
	}
	return &Adapter{
		cfg:     cfg,
		secrets: s,
		env:     env,
		api:     slack.New(s.botToken, opts...),
		log:     log,
		replays: newReplayGuard(replayKeep, replayMax),
		now:     time.Now,
	}, nil
}

// Name is "slack".
func (a *Adapter) Name() string { return channelName }

// Reaches lists the principals the policy gives a Slack user id.
func (a *Adapter) Reaches() []string { return a.env.Directory.Reachable(channelName) }

// Start makes the channel take interactions in, answering through rt: in
// http mode it registers POST InteractionsPath on mux; in socket mode it
// connects to Slack until ctx ends (Wait waits for that). It first checks
// the bot token with Slack, and fails if Slack refuses it; if Slack cannot
// be reached it logs that and goes on. Start may be called once.
func (a *Adapter) Start(ctx context.Context, rt channels.Runtime, mux *http.ServeMux) error {
	if rt == nil {
		return errors.New("slack: Start needs a runtime")
	}
	if a.cfg.Mode == ModeHTTP && mux == nil {
		return fmt.Errorf("slack: mode %q needs the bot's HTTP server (no mux given)", ModeHTTP)
	}
	if !a.started.CompareAndSwap(false, true) {
		return errors.New("slack: Start called twice")
	}
	if err := a.checkAuth(ctx); err != nil {
		a.started.Store(false)
		return err
	}
	a.rt = rt
	switch a.cfg.Mode {
	case ModeHTTP:
		mux.HandleFunc("POST "+InteractionsPath, a.serveInteractions)
		a.log.Info("taking Slack interactions over HTTP", zap.String("path", InteractionsPath))
	case ModeSocket:
		a.wg.Go(func() { a.runSocket(ctx) })
	}
	return nil
}

// Wait blocks until the work Start started has returned, after Start's
// context ended.
func (a *Adapter) Wait() { a.wg.Wait() }

// checkAuth asks Slack whether the bot token is good.
func (a *Adapter) checkAuth(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	resp, err := a.api.AuthTestContext(ctx)
	var se slack.SlackErrorResponse
	switch {
	case errors.As(err, &se) && authFailure(se.Err):
		return fmt.Errorf("slack: Slack refused the bot token in %s (%s): copy the Bot User OAuth Token (xoxb-...) again from the app's OAuth & Permissions page, and reinstall the app if it was revoked", a.cfg.BotTokenEnv, se.Err)
	case err != nil:
		a.log.Warn("cannot check the bot token with Slack yet; going on", zap.Error(err))
	default:
		a.log.Info("connected to Slack", zap.String("team", resp.Team), zap.String("bot_user", resp.UserID), zap.String("slack_channel", a.cfg.Channel))
	}
	return nil
}

func authFailure(code string) bool {
	switch code {
	case "invalid_auth", "not_authed", "account_inactive", "token_revoked", "token_expired":
		return true
	}
	return false
}

// Notify posts a new request to the channel, with its approvers mentioned
// and the buttons to answer, and returns its message as the ref. With the
// ref of an earlier notice, an escalation updates that message and tells
// its new approvers in the thread, and a reminder nudges in the thread; both
// keep the ref (a message deleted since is posted anew).
func (a *Adapter) Notify(ctx context.Context, n handler.Notice) (json.RawMessage, error) {
	r, ok := parseRef(n.Ref)
	if !ok {
		return a.post(ctx, n)
	}
	if n.Reminder {
		return nil, a.reply(ctx, r, a.reminderText(n, a.now()), "remind about the request")
	}
	_, _, _, err := a.api.UpdateMessageContext(ctx, r.Channel, r.TS,
		slack.MsgOptionBlocks(a.requestBlocks(n)...), slack.MsgOptionText(requestText(n), false))
	if messageGone(err) {
		a.log.Warn("the request's message is gone; posting it again", zap.String("request_id", n.ID), zap.Error(err))
		return a.post(ctx, n)
	}
	if err != nil {
		return nil, a.apiError("update the request's message", err)
	}
	if n.Level > 0 {
		return nil, a.reply(ctx, r, a.escalationText(n), "tell the escalation's approvers")
	}
	return nil, nil
}

// post posts n's message and returns its ref.
func (a *Adapter) post(ctx context.Context, n handler.Notice) (json.RawMessage, error) {
	ch, ts, err := a.api.PostMessageContext(ctx, a.cfg.Channel,
		slack.MsgOptionBlocks(a.requestBlocks(n)...), slack.MsgOptionText(requestText(n), false))
	if err != nil {
		return nil, a.apiError("post the request", err)
	}
	a.log.Debug("posted request", zap.String("request_id", n.ID), zap.String("slack_channel", ch), zap.String("ts", ts))
	return json.Marshal(ref{Channel: ch, TS: ts})
}

// reply posts text in r's thread.
func (a *Adapter) reply(ctx context.Context, r ref, text, what string) error {
	if _, _, err := a.api.PostMessageContext(ctx, r.Channel, slack.MsgOptionTS(r.TS), slack.MsgOptionText(text, false)); err != nil {
		return a.apiError(what, err)
	}
	return nil
}

// Resolve updates the request's message to show its outcome, without
// buttons. It changes nothing else, so calling it again is harmless; a
// message deleted since is left alone.
func (a *Adapter) Resolve(ctx context.Context, o handler.Outcome) error {
	r, ok := parseRef(o.Notice.Ref)
	if !ok {
		a.log.Warn("no Slack message to show the outcome in", zap.String("request_id", o.RequestID))
		return nil
	}
	_, _, _, err := a.api.UpdateMessageContext(ctx, r.Channel, r.TS,
		slack.MsgOptionBlocks(a.outcomeBlocks(o)...), slack.MsgOptionText(outcomeText(o), false))
	if messageGone(err) {
		a.log.Warn("the request's message is gone; outcome not shown", zap.String("request_id", o.RequestID), zap.Error(err))
		return nil
	}
	if err != nil {
		return a.apiError("show the outcome", err)
	}
	return nil
}

// messageGone reports an error saying the message or its channel no longer
// exists: retrying cannot help.
func messageGone(err error) bool {
	var se slack.SlackErrorResponse
	if !errors.As(err, &se) {
		return false
	}
	switch se.Err {
	case "message_not_found", "channel_not_found", "is_archived", "cant_update_message":
		return true
	}
	return false
}

// apiError wraps a Web API error with what was being done and, for the
// errors a setup causes, what to change.
func (a *Adapter) apiError(what string, err error) error {
	var se slack.SlackErrorResponse
	if !errors.As(err, &se) {
		return fmt.Errorf("slack: %s: %w", what, err)
	}
	var hint string
	switch {
	case authFailure(se.Err):
		hint = fmt.Sprintf("Slack refused the bot token in %s; copy it again from OAuth & Permissions", a.cfg.BotTokenEnv)
	case se.Err == "not_in_channel":
		hint = fmt.Sprintf("invite the app to channel %s (/invite @your-app in the channel)", a.cfg.Channel)
	case se.Err == "channel_not_found":
		hint = fmt.Sprintf("check that channel %s is the id of a channel the app can see (a private one needs /invite @your-app)", a.cfg.Channel)
	case se.Err == "missing_scope":
		hint = "add the chat:write bot scope under OAuth & Permissions and reinstall the app"
		if se.Needed != "" {
			hint = "add the " + se.Needed + " bot scope under OAuth & Permissions and reinstall the app"
		}
	}
	if hint == "" {
		return fmt.Errorf("slack: %s: %w", what, err)
	}
	return fmt.Errorf("slack: %s: %w: %s", what, err, hint)
}
