package slack

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/slack-go/slack"
	"go.uber.org/zap"

	"github.com/assent-dev/assent/internal/channels"
	"github.com/assent-dev/assent/pkg/events"
	"github.com/assent-dev/assent/pkg/handler"
)

// interact handles one interaction, whichever transport brought it: a
// button of a request message (block_actions) or a modal's submission
// (view_submission). For a submission it returns what to answer Slack with:
// nil closes the modal, errors keep it open with the errors shown.
// Authenticating the interaction is the transport's job.
func (a *Adapter) interact(ctx context.Context, cb *slack.InteractionCallback) *slack.ViewSubmissionResponse {
	switch cb.Type {
	case slack.InteractionTypeBlockActions:
		a.onAction(ctx, cb)
	case slack.InteractionTypeViewSubmission:
		return a.onSubmit(ctx, cb)
	}
	return nil
}

// target is a request a Slack user may answer now, and who they answer as.
type target struct {
	principal string
	notice    handler.Notice
}

// check finds the principal Slack user userID maps to, and whether they may
// answer request id now. If not, it returns why, for them to read.
func (a *Adapter) check(ctx context.Context, userID, id string) (target, string) {
	log := a.log.With(zap.String("request_id", id), zap.String("slack_user", userID))
	principal, err := a.env.Directory.Principal(channelName, userID)
	if err != nil {
		log.Info("refused a Slack user who is no principal")
		return target{}, fmt.Sprintf("Your Slack account is not mapped to an Assent principal; ask an operator to add `slack: %s` to your entry under principals in the policy.", esc(userID, maxField))
	}
	log = log.With(zap.String("principal", principal))
	if err := events.CheckToken("request_id", id); err != nil {
		log.Warn("interaction names no request", zap.Error(err))
		return target{}, "This button or form names no request Assent knows."
	}
	n, _, ok, err := a.rt.Lookup(ctx, id)
	if err != nil {
		log.Warn("look up request", zap.Error(err))
		return target{}, "Assent could not look this request up just now; try again in a moment."
	}
	if !ok {
		return target{}, "Assent does not know this request: it forgets requests 72 hours after showing them."
	}
	d, decided, err := a.rt.Decision(ctx, id)
	if err != nil {
		log.Warn("read decision", zap.Error(err))
		return target{}, "Assent could not check whether this request is still open; try again in a moment."
	}
	if decided {
		return target{}, alreadyText(d)
	}
	if err := a.env.Directory.MayAnswer(principal, n); err != nil {
		log.Info("refused an ineligible principal", zap.Error(err))
		return target{}, fmt.Sprintf("You (%s) cannot answer this request: %s.", esc(principal, maxField), esc(err.Error(), 1000))
	}
	return target{principal: principal, notice: n}, ""
}

// alreadyText tells someone who answers a decided request how it ended.
func alreadyText(d handler.Decision) string {
	_, word := verb(d.Outcome)
	switch {
	case d.Outcome == events.Expired && len(d.DecidedBy) == 0:
		return "This request already expired: nobody answered before the deadline."
	case d.Outcome == events.Cancelled && len(d.DecidedBy) == 0 && !d.Auto:
		return "This request was already cancelled by the agent."
	}
	return fmt.Sprintf("This request was already %s by %s.", strings.ToLower(word), esc(channels.Who(d), maxField))
}

// onAction handles a click on a request message's button: approve at once,
// or open the modal that asks for more.
func (a *Adapter) onAction(ctx context.Context, cb *slack.InteractionCallback) {
	if len(cb.ActionCallback.BlockActions) == 0 {
		return
	}
	act := cb.ActionCallback.BlockActions[0]
	switch act.ActionID {
	case actionApprove, actionDeny, actionEdit, actionRemember:
	default:
		return // not ours
	}
	channel := cmp.Or(cb.Channel.ID, cb.Container.ChannelID, a.cfg.Channel)
	user := cb.User.ID
	t, refused := a.check(ctx, user, act.Value)
	if refused != "" {
		a.ephemeral(ctx, channel, user, refused)
		return
	}
	ts := cmp.Or(cb.Container.MessageTs, cb.Message.Timestamp) // the message clicked
	meta := modalMeta{ID: t.notice.ID, Channel: channel, TS: ts}
	switch act.ActionID {
	case actionApprove:
		if err := a.answer(ctx, t, handler.Response{Decision: events.Approve, ShownAt: shownAt(ts, t.notice)}); err != nil {
			a.ephemeral(ctx, channel, user, "Assent could not record your approval ("+esc(err.Error(), 1000)+"); try again.")
			return
		}
		if q := quorum(t.notice); q > 1 {
			a.ephemeral(ctx, channel, user, fmt.Sprintf("Your approval is recorded. This request needs %d approvals; its message changes once it is decided.", q))
		}
	case actionDeny:
		a.openModal(ctx, cb.TriggerID, denyModal(t.notice, meta), channel, user)
	case actionEdit:
		v, err := editModal(t.notice, meta)
		if err != nil {
			text := "These arguments cannot be edited in Slack: " + esc(err.Error(), 1000) + "."
			if page := a.env.RequestPage(t.notice.ID); page != "" {
				text += " <" + page + "|Edit them in Assent's web UI.>"
			}
			a.ephemeral(ctx, channel, user, text)
			return
		}
		a.openModal(ctx, cb.TriggerID, v, channel, user)
	case actionRemember:
		scopes := rememberScopes(t.notice)
		if len(scopes) == 0 {
			a.ephemeral(ctx, channel, user, "The policy does not let answers to this request be remembered.")
			return
		}
		a.openModal(ctx, cb.TriggerID, rememberModal(t.notice, meta, scopes), channel, user)
	}
}

// onSubmit handles a modal's submission: it answers, or returns the errors
// to show in the modal.
func (a *Adapter) onSubmit(ctx context.Context, cb *slack.InteractionCallback) *slack.ViewSubmissionResponse {
	var field string
	switch cb.View.CallbackID {
	case viewDeny:
		field = inputReason
	case viewEdit:
		field = inputArgs
	case viewRemember:
		field = inputScope
	default:
		return nil // not ours
	}
	fail := func(msg string) *slack.ViewSubmissionResponse {
		return slack.NewErrorsViewSubmissionResponse(map[string]string{field: msg})
	}
	meta, err := parseMeta(cb.View.PrivateMetadata)
	if err != nil {
		a.log.Warn("modal without a request", zap.Error(err))
		return fail("This form names no request; close it and click the request's button again.")
	}
	t, refused := a.check(ctx, cb.User.ID, meta.ID)
	if refused != "" {
		return fail(refused)
	}
	value := func(block string) *slack.BlockAction {
		if cb.View.State == nil {
			return &slack.BlockAction{}
		}
		if v, ok := cb.View.State.Values[block][block]; ok {
			return &v
		}
		return &slack.BlockAction{}
	}
	// The edit form shows every argument whole: answering from it is
	// answering with the detail in view.
	resp := handler.Response{Reason: strings.TrimSpace(value(inputReason).Value), ShownAt: shownAt(meta.TS, t.notice),
		Detail: cb.View.CallbackID == viewEdit}
	switch cb.View.CallbackID {
	case viewDeny:
		resp.Decision = events.Deny
	case viewEdit:
		args, problem := parseEditedArgs(value(inputArgs).Value)
		if problem == "" {
			problem = channels.ArgsProblem(t.notice.InputSchema, args)
		}
		if problem != "" {
			return fail(problem)
		}
		resp.Decision, resp.Args = events.Approve, args
	case viewRemember:
		scope := value(inputScope).SelectedOption.Value
		scopes := rememberScopes(t.notice)
		if !slices.Contains(scopes, scope) {
			return fail("Pick where to remember the approval: " + strings.Join(scopes, ", ") + ".")
		}
		resp.Decision = events.Approve
		resp.Remember = &events.Remember{Scope: scope, TTL: t.notice.Terms.Remember.MaxTTL}
	}
	r := events.Responded{Decision: resp.Decision, Reason: resp.Reason, Args: resp.Args, Remember: resp.Remember, Channel: channelName}
	if err := r.Validate(); err != nil {
		return fail(err.Error())
	}
	if err := a.answer(ctx, t, resp); err != nil {
		return fail("Assent could not record your answer (" + err.Error() + "); try again.")
	}
	return nil
}

// parseEditedArgs reads arguments typed into the edit modal; problem, if
// not empty, says what is wrong with them.
func parseEditedArgs(text string) (args json.RawMessage, problem string) {
	trimmed := bytes.TrimSpace([]byte(text))
	if len(trimmed) == 0 {
		return nil, `Enter the arguments as a JSON object, such as {"path": "/tmp/report.csv"}.`
	}
	var v any
	if err := json.Unmarshal(trimmed, &v); err != nil {
		var se *json.SyntaxError
		if errors.As(err, &se) {
			return nil, fmt.Sprintf("Not valid JSON: %s (at character %d).", se.Error(), se.Offset)
		}
		return nil, "Not valid JSON: " + err.Error() + "."
	}
	if _, ok := v.(map[string]any); !ok {
		return nil, "The arguments must be a JSON object ({...}), not an array, a string, a number or null."
	}
	var buf bytes.Buffer
	if err := json.Compact(&buf, trimmed); err != nil {
		return nil, "Not valid JSON: " + err.Error() + "."
	}
	return buf.Bytes(), ""
}

// answer publishes t's principal's answer.
func (a *Adapter) answer(ctx context.Context, t target, resp handler.Response) error {
	log := a.log.With(zap.String("request_id", t.notice.ID), zap.String("principal", t.principal), zap.String("decision", string(resp.Decision)))
	if err := a.rt.Answer(ctx, t.principal, t.notice.ID, resp); err != nil {
		log.Warn("answer", zap.Error(err))
		return err
	}
	log.Info("answered", zap.Bool("edited", resp.Args != nil), zap.Bool("remember", resp.Remember != nil))
	return nil
}

// openModal opens v for the user whose click gave triggerID.
func (a *Adapter) openModal(ctx context.Context, triggerID string, v slack.ModalViewRequest, channel, user string) {
	if _, err := a.api.OpenViewContext(ctx, triggerID, v); err != nil {
		a.log.Warn("open modal", zap.String("view", v.CallbackID), zap.Error(err))
		a.ephemeral(ctx, channel, user, "Slack did not open the form ("+esc(err.Error(), 1000)+"); click the button again.")
	}
}

// ephemeral shows text to user alone, in channel.
func (a *Adapter) ephemeral(ctx context.Context, channel, user, text string) {
	if _, err := a.api.PostEphemeralContext(ctx, channel, user, slack.MsgOptionText(text, false)); err != nil {
		a.log.Warn("tell a Slack user", zap.String("slack_user", user), zap.Error(a.apiError("post an ephemeral message", err)))
	}
}

// quorum is how many approvals n needs.
func quorum(n handler.Notice) int {
	if n.Terms == nil || n.Terms.Quorum < 1 {
		return 1
	}
	return n.Terms.Quorum
}
