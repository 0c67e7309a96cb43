package slack

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
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

	// problems are what keeps the channel from delivering, by target (a
	// conversation, a user, "" for the token); probeEvery is how often
	// they are checked again.
	pmu        sync.Mutex
	problems   map[string]*channels.Problem
	probeEvery time.Duration
	// noHistory is set once Slack refused to let the bot read a
	// conversation's history (a missing scope), to warn once.
	noHistory atomic.Bool
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
	} else {
		var rules []string
		for _, r := range env.Directory.Policy().Rules {
			rules = append(rules, r.Name)
		}
		errs = append(errs, cfg.ruleProblems(rules)...)
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

		problems:   map[string]*channels.Problem{},
		probeEvery: probeEvery,
	}, nil
}

// Name is "slack".
func (a *Adapter) Name() string { return channelName }

// Reaches lists the principals the policy gives a Slack user id, but those
// the channel cannot reach now: everyone while Slack refuses the token, and
// those whose requests could not be posted where they go (a channel that
// does not exist or the app is not in, a DM Slack refuses) until that works
// again (Problems).
func (a *Adapter) Reaches() []string {
	all := a.env.Directory.Reachable(channelName)
	a.pmu.Lock()
	defer a.pmu.Unlock()
	if _, ok := a.problems[""]; ok {
		return nil
	}
	if len(a.problems) == 0 {
		return all
	}
	return slices.DeleteFunc(all, func(p string) bool {
		for _, pr := range a.problems {
			if slices.Contains(pr.Principals, p) {
				return true
			}
		}
		return false
	})
}

// Start makes the channel take interactions in, answering through rt: in
// http mode it registers POST InteractionsPath on mux; in socket mode it
// connects to Slack until ctx ends (Wait waits for that). It first checks
// the bot token with Slack, and fails if Slack refuses it; if Slack cannot
// be reached it logs that and goes on. Start may be called once.
func (a *Adapter) Start(ctx context.Context, rt channels.Runtime, mux *http.ServeMux) error {
	if rt == nil {
		return errors.New("Start needs a runtime")
	}
	if a.cfg.Mode == ModeHTTP && mux == nil {
		return fmt.Errorf("mode %q needs the bot's HTTP server (no mux given)", ModeHTTP)
	}
	if !a.started.CompareAndSwap(false, true) {
		return errors.New("Start called twice")
	}
	if err := a.checkAuth(ctx); err != nil {
		a.started.Store(false)
		return err
	}
	a.checkConversations(ctx)
	a.rt = rt
	switch a.cfg.Mode {
	case ModeHTTP:
		mux.HandleFunc("POST "+InteractionsPath, a.serveInteractions)
		a.log.Info("taking Slack interactions over HTTP", zap.String("path", InteractionsPath))
	case ModeSocket:
		a.wg.Go(func() { a.runSocket(ctx) })
	}
	a.wg.Go(func() { a.watch(ctx) })
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
		return fmt.Errorf("Slack refused the bot token in %s (%s): copy the Bot User OAuth Token (xoxb-...) again from the app's OAuth & Permissions page, and reinstall the app if it was revoked", a.cfg.BotTokenEnv, se.Err)
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

// Notify posts a new request where it goes (its route's channel, or a
// direct message to each approver), with its approvers mentioned and the
// buttons to answer, and returns its messages as the ref. With the ref of an
// earlier notice, an escalation updates those messages and tells its new
// approvers (in the thread, or in a DM of their own), and a reminder nudges
// in each message's thread; a message deleted since is posted anew.
//
// A notice that may have gone out before (Notice.Retry: the bot was killed
// while Slack took the message, or Slack answered too late) is looked for
// first, by the request id in its messages' metadata: what is found is
// kept, not posted again.
//
// When Slack refuses for good (no such channel, the app not in it, the
// token revoked), the error wraps handler.ErrUndeliverable and the
// principals the request was for leave Reaches until it works again.
func (a *Adapter) Notify(ctx context.Context, n handler.Notice) (json.RawMessage, error) {
	r, ok := parseRef(n.Ref)
	if !ok {
		return a.post(ctx, n)
	}
	if n.Reminder {
		text := a.reminderText(n, a.now())
		for _, m := range r.messages() {
			if err := a.reply(ctx, m, text, "remind about the request", n); err != nil {
				return nil, err
			}
		}
		return nil, nil
	}
	var kept []message
	for _, m := range r.messages() {
		_, _, _, err := a.api.UpdateMessageContext(ctx, m.Channel, m.TS,
			slack.MsgOptionBlocks(a.requestBlocks(n)...), slack.MsgOptionText(requestText(n), false))
		if messageGone(err) {
			a.log.Warn("a message of the request is gone", zap.String("request_id", n.ID), zap.String("slack_channel", m.Channel), zap.Error(err))
			continue
		}
		if err != nil {
			return nil, a.failed(m.Channel, n, "update the request's message", err)
		}
		a.delivered(m.Channel)
		kept = append(kept, m)
	}
	if len(kept) == 0 {
		a.log.Warn("the request's messages are gone; posting it again", zap.String("request_id", n.ID))
		n.Retry = false
		return a.post(ctx, n)
	}
	if n.Level > 0 {
		if d := a.cfg.route(n.Rule, n.Agent); d.dm {
			posted, err := a.postDMs(ctx, n, kept)
			if err != nil {
				return nil, err
			}
			kept = append(kept, posted...)
		} else if err := a.reply(ctx, kept[0], a.escalationText(n), "tell the escalation's approvers", n); err != nil {
			return nil, err
		}
	}
	return refOf(kept)
}

// post shows n where its route sends it and returns its ref.
func (a *Adapter) post(ctx context.Context, n handler.Notice) (json.RawMessage, error) {
	d := a.cfg.route(n.Rule, n.Agent)
	if d.dm && len(a.env.Directory.Recipients(n, channelName)) > 0 {
		var found []message
		if n.Retry {
			var err error
			if found, err = a.findDMs(ctx, n); err != nil {
				return nil, err
			}
		}
		posted, err := a.postDMs(ctx, n, found)
		if err != nil {
			return nil, err
		}
		return refOf(append(found, posted...))
	}
	if d.channel == "" {
		a.log.Warn("no approver of the request is on Slack, and no channel is configured to post it in instead", zap.String("request_id", n.ID))
		return nil, nil
	}
	if n.Retry {
		found, err := a.find(ctx, d.channel, n)
		if err != nil {
			return nil, err
		}
		if len(found) > 0 {
			a.log.Info("the request was posted before the last attempt was cut short; keeping that message", zap.String("request_id", n.ID), zap.Int("messages", len(found)))
			return refOf(found)
		}
	}
	m, err := a.postTo(ctx, d.channel, n)
	if err != nil {
		return nil, err
	}
	return refOf([]message{m})
}

// postTo posts n's message in conversation ch, with the request id in its
// metadata.
func (a *Adapter) postTo(ctx context.Context, ch string, n handler.Notice) (message, error) {
	got, ts, err := a.api.PostMessageContext(ctx, ch,
		slack.MsgOptionBlocks(a.requestBlocks(n)...), slack.MsgOptionText(requestText(n), false),
		slack.MsgOptionMetadata(slack.SlackMetadata{EventType: metadataEvent, EventPayload: map[string]any{"request_id": n.ID}}))
	if err != nil {
		return message{}, a.failed(ch, n, "post the request", err)
	}
	a.delivered(ch)
	a.log.Debug("posted request", zap.String("request_id", n.ID), zap.String("slack_channel", got), zap.String("ts", ts))
	return message{Channel: got, TS: ts}, nil
}

// postDMs sends n to each of its approvers on Slack that none of have
// reaches yet, in a direct message, and returns the messages posted. A DM
// Slack refuses is logged (and its principal leaves Reaches); an error is
// returned only if every DM failed.
func (a *Adapter) postDMs(ctx context.Context, n handler.Notice, have []message) ([]message, error) {
	recipients := a.env.Directory.Recipients(n, channelName)
	names := slices.Sorted(maps.Keys(recipients))
	var posted []message
	var errs []error
	for _, name := range names {
		user := recipients[name]
		ch, err := a.openDM(ctx, user, name)
		if err == nil {
			if slices.ContainsFunc(have, func(m message) bool { return m.Channel == ch }) {
				continue
			}
			var m message
			if m, err = a.postTo(ctx, ch, n); err == nil {
				posted = append(posted, m)
				continue
			}
		}
		a.log.Warn("cannot send the request to an approver", zap.String("request_id", n.ID), zap.String("principal", name), zap.Error(err))
		errs = append(errs, err)
	}
	if len(posted) == 0 && len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return posted, nil
}

// openDM returns the id of the bot's direct message conversation with
// Slack user, principal's identity.
func (a *Adapter) openDM(ctx context.Context, user, principal string) (string, error) {
	ch, _, _, err := a.api.OpenConversationContext(ctx, &slack.OpenConversationParameters{Users: []string{user}, ReturnIM: true})
	if err != nil {
		return "", a.failedFor(user, []string{principal}, "open a direct message with "+user, err)
	}
	a.delivered(user)
	return ch.ID, nil
}

// reply posts text in m's thread.
func (a *Adapter) reply(ctx context.Context, m message, text, what string, n handler.Notice) error {
	if _, _, err := a.api.PostMessageContext(ctx, m.Channel, slack.MsgOptionTS(m.TS), slack.MsgOptionText(text, false)); err != nil {
		return a.failed(m.Channel, n, what, err)
	}
	return nil
}

// Resolve updates every message of the request to show its outcome,
// without buttons. It changes nothing else, so calling it again is
// harmless; a message deleted since is left alone.
func (a *Adapter) Resolve(ctx context.Context, o handler.Outcome) error {
	r, ok := parseRef(o.Notice.Ref)
	if !ok {
		a.log.Warn("no Slack message to show the outcome in", zap.String("request_id", o.RequestID))
		return nil
	}
	var errs []error
	for _, m := range r.messages() {
		_, _, _, err := a.api.UpdateMessageContext(ctx, m.Channel, m.TS,
			slack.MsgOptionBlocks(a.outcomeBlocks(o)...), slack.MsgOptionText(outcomeText(o), false))
		if messageGone(err) {
			a.log.Warn("a message of the request is gone; outcome not shown there", zap.String("request_id", o.RequestID), zap.String("slack_channel", m.Channel), zap.Error(err))
			continue
		}
		if err != nil {
			errs = append(errs, a.apiError("show the outcome", err))
		}
	}
	return errors.Join(errs...)
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
		return fmt.Errorf("%s: %w", what, err)
	}
	var hint string
	switch {
	case authFailure(se.Err):
		hint = fmt.Sprintf("Slack refused the bot token in %s; copy it again from OAuth & Permissions", a.cfg.BotTokenEnv)
	case se.Err == "not_in_channel":
		hint = "invite the app to the channel (/invite @your-app in it)"
	case se.Err == "channel_not_found":
		hint = "check that the channel id is one the app can see (a private channel needs /invite @your-app)"
	case se.Err == "is_archived":
		hint = "the channel is archived: unarchive it, or route its requests to another"
	case se.Err == "missing_scope":
		hint = "add the chat:write bot scope under OAuth & Permissions and reinstall the app"
		if se.Needed != "" {
			hint = "add the " + se.Needed + " bot scope under OAuth & Permissions and reinstall the app"
		}
	}
	if hint == "" {
		return fmt.Errorf("%s: %w", what, err)
	}
	return fmt.Errorf("%s: %w: %s", what, err, hint)
}
