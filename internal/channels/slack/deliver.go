package slack

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"time"

	"github.com/slack-go/slack"
	"go.uber.org/zap"

	"github.com/assent-dev/assent/internal/channels"
	"github.com/assent-dev/assent/pkg/handler"
)

// metadataEvent is the event type of the metadata every request message
// carries, with the request id in its payload: how the channel finds a
// message an attempt cut short posted (find).
const metadataEvent = "assent_request"

// probeEvery is how often a target Slack refused is checked again.
const probeEvery = 30 * time.Second

// Looking for a request's messages (find) reads at most findPages pages of
// findPage messages of a conversation's history, from findSlack before the
// request went pending (Slack's clock and NATS's may differ).
const (
	findPage  = 200
	findPages = 10
	findSlack = 2 * time.Minute
)

// permanent reports a Slack error that retrying cannot cure: the setup must
// change (a channel id, an invitation, the token, a scope).
func permanent(code string) bool {
	switch code {
	case "channel_not_found", "not_in_channel", "is_archived", "missing_scope", "restricted_action",
		"user_not_found", "user_disabled", "cannot_dm_bot", "not_allowed_token_type", "ekm_access_denied":
		return true
	}
	return authFailure(code)
}

// undeliverable is an error Slack will keep answering until the setup
// changes: it wraps handler.ErrUndeliverable besides Slack's error, and
// says what the latter says.
type undeliverable struct{ err error }

func (u undeliverable) Error() string   { return u.err.Error() }
func (u undeliverable) Unwrap() []error { return []error{handler.ErrUndeliverable, u.err} }

// failed returns err, what went wrong doing what in conversation target for
// notice n, with what to change. If Slack refuses for good, n's approvers
// on Slack leave Reaches until target works again (everyone, for the token),
// and the error wraps handler.ErrUndeliverable.
func (a *Adapter) failed(target string, n handler.Notice, what string, err error) error {
	return a.failedFor(target, slices.Sorted(maps.Keys(a.env.Directory.Recipients(n, channelName))), what+" in "+target, err)
}

// failedFor is failed for the principals given.
func (a *Adapter) failedFor(target string, principals []string, what string, err error) error {
	err = a.apiError(what, err)
	var se slack.SlackErrorResponse
	if !errors.As(err, &se) || !permanent(se.Err) {
		return err
	}
	if authFailure(se.Err) {
		target, principals = "", nil
	}
	a.pmu.Lock()
	defer a.pmu.Unlock()
	p := a.problems[target]
	if p == nil {
		p = &channels.Problem{Target: target, Since: a.now().UTC()}
		a.problems[target] = p
		a.log.Error("Slack refuses to deliver; the principals it cannot reach are no longer announced", zap.String("target", target), zap.String("code", se.Err), zap.Strings("principals", principals), zap.Error(err))
	}
	p.Code, p.Message = se.Err, err.Error()
	for _, name := range principals {
		if !slices.Contains(p.Principals, name) {
			p.Principals = append(p.Principals, name)
		}
	}
	slices.Sort(p.Principals)
	return undeliverable{err}
}

// delivered records that Slack took a call about target: it, and the
// token, work.
func (a *Adapter) delivered(target string) {
	a.pmu.Lock()
	defer a.pmu.Unlock()
	if len(a.problems) == 0 {
		return
	}
	for _, t := range []string{target, ""} {
		if _, ok := a.problems[t]; ok {
			delete(a.problems, t)
			a.log.Info("Slack delivers again", zap.String("target", t))
		}
	}
}

// Problems lists what keeps the channel from delivering now, oldest first.
func (a *Adapter) Problems() []channels.Problem {
	a.pmu.Lock()
	defer a.pmu.Unlock()
	out := make([]channels.Problem, 0, len(a.problems))
	for _, p := range a.problems {
		q := *p
		q.Principals = slices.Clone(p.Principals)
		out = append(out, q)
	}
	slices.SortFunc(out, func(x, y channels.Problem) int { return x.Since.Compare(y.Since) })
	return out
}

// watch checks the targets Slack refused every probeEvery until ctx ends,
// so that a fixed setup (the app invited, the token replaced) counts its
// principals again even with no request to retry.
func (a *Adapter) watch(ctx context.Context) {
	t := time.NewTicker(a.probeEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			a.probe(ctx)
		}
	}
}

// probe checks each target Slack refused, and forgets those that work now.
func (a *Adapter) probe(ctx context.Context) {
	a.pmu.Lock()
	targets := slices.Collect(maps.Keys(a.problems))
	a.pmu.Unlock()
	for _, target := range targets {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		var err error
		switch {
		case target == "":
			_, err = a.api.AuthTestContext(cctx)
		case target[0] == 'U' || target[0] == 'W':
			_, _, _, err = a.api.OpenConversationContext(cctx, &slack.OpenConversationParameters{Users: []string{target}, ReturnIM: true})
		default:
			err = a.canPost(cctx, target)
		}
		cancel()
		if err == nil {
			a.delivered(target)
		}
	}
}

// canPost checks that the bot can post in conversation ch: it exists, and
// the bot is in it (or it is a direct message).
func (a *Adapter) canPost(ctx context.Context, ch string) error {
	info, err := a.api.GetConversationInfoContext(ctx, &slack.GetConversationInfoInput{ChannelID: ch})
	if err != nil {
		return err
	}
	if !info.IsMember && !info.IsIM {
		return slack.SlackErrorResponse{Err: "not_in_channel"}
	}
	return nil
}

// checkConversations checks, at start, that the bot can post in every
// channel the configuration names, and records a problem for each Slack
// refuses for good, with the principals that channel would reach: a route's
// rule's approvers, everyone for the default channel or an agent's route.
// So a channel misconfigured from the start keeps its principals out of
// presence before any request fails there. Without the scope to check
// (channels:read) or without an answer, it records nothing.
func (a *Adapter) checkConversations(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for _, ch := range a.cfg.conversations() {
		err := a.canPost(ctx, ch)
		var se slack.SlackErrorResponse
		if err == nil || (errors.As(err, &se) && se.Err == "missing_scope") {
			continue // fine, or cannot tell
		}
		_ = a.failedFor(ch, a.reachedThrough(ch), "post in "+ch, err)
	}
}

// reachedThrough lists the principals on Slack whose requests conversation
// ch takes: the approvers of the rules routed there, and everyone when the
// default channel or an agent's route takes any rule's requests there.
func (a *Adapter) reachedThrough(ch string) []string {
	p := a.env.Directory.Policy()
	var approvers []string
	everyone := ch == a.cfg.Channel && !a.cfg.DM
	for _, r := range a.cfg.Routes {
		if r.Channel != ch {
			continue
		}
		if r.Rule == "" {
			everyone = true
			continue
		}
		for _, rule := range p.Rules {
			if rule.Name != r.Rule || rule.Approval == nil {
				continue
			}
			if len(rule.Approval.Approvers) == 0 {
				everyone = true
			}
			approvers = append(approvers, rule.Approval.Approvers...)
			for _, s := range rule.Approval.Escalation {
				approvers = append(approvers, s.Approvers...)
			}
		}
	}
	reachable := a.env.Directory.Reachable(channelName)
	if everyone {
		return reachable
	}
	if len(approvers) == 0 {
		return nil
	}
	return slices.DeleteFunc(a.env.Directory.Expand(approvers), func(name string) bool { return !slices.Contains(reachable, name) })
}

// find returns the top-level messages of conversation ch that the bot
// posted for n's request (their metadata names it), oldest first. Without
// the scope to read ch's history it warns once and finds none.
func (a *Adapter) find(ctx context.Context, ch string, n handler.Notice) ([]message, error) {
	since := n.Pending
	if since.IsZero() {
		since = n.Deadline.Add(-25 * time.Hour)
	}
	p := &slack.GetConversationHistoryParameters{
		ChannelID: ch, Limit: findPage, IncludeAllMetadata: true,
		Oldest: strconv.FormatFloat(float64(since.Add(-findSlack).UnixMicro())/1e6, 'f', 6, 64),
	}
	var found []message
	for range findPages {
		h, err := a.api.GetConversationHistoryContext(ctx, p)
		if err != nil {
			var se slack.SlackErrorResponse
			if errors.As(err, &se) && se.Err == "missing_scope" {
				if !a.noHistory.Swap(true) {
					a.log.Warn("cannot read the channel's history to find a message posted before a restart; it may be posted twice: add the channels:history and groups:history (im:history for DMs) bot scopes and reinstall the app", zap.String("slack_channel", ch))
				}
				return found, nil
			}
			return nil, a.failed(ch, n, "look for the request's message", err)
		}
		for _, m := range h.Messages {
			if m.Metadata.EventType == metadataEvent && m.Metadata.EventPayload["request_id"] == n.ID && (m.ThreadTimestamp == "" || m.ThreadTimestamp == m.Timestamp) {
				found = append(found, message{Channel: ch, TS: m.Timestamp})
			}
		}
		if !h.HasMore || h.ResponseMetaData.NextCursor == "" {
			break
		}
		p.Cursor = h.ResponseMetaData.NextCursor
	}
	slices.SortFunc(found, func(x, y message) int {
		fx, _ := strconv.ParseFloat(x.TS, 64)
		fy, _ := strconv.ParseFloat(y.TS, 64)
		return compareFloat(fx, fy)
	})
	return found, nil
}

func compareFloat(x, y float64) int {
	switch {
	case x < y:
		return -1
	case x > y:
		return 1
	}
	return 0
}

// findDMs is find in the direct messages of n's approvers.
func (a *Adapter) findDMs(ctx context.Context, n handler.Notice) ([]message, error) {
	recipients := a.env.Directory.Recipients(n, channelName)
	var found []message
	for _, name := range slices.Sorted(maps.Keys(recipients)) {
		ch, err := a.openDM(ctx, recipients[name], name)
		if err != nil {
			continue // postDMs reports it
		}
		ms, err := a.find(ctx, ch, n)
		if err != nil {
			return nil, err
		}
		found = append(found, ms...)
	}
	return found, nil
}

// Check checks the channel's setup against Slack: that it takes the bot
// token (auth.test), and that the bot can post in every channel the
// configuration names (conversations.info: it exists and the bot is in
// it). It returns what it checked, a line each, and every problem found,
// each with what to do.
func (a *Adapter) Check(ctx context.Context) ([]string, error) {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	resp, err := a.api.AuthTestContext(ctx)
	if err != nil {
		var se slack.SlackErrorResponse
		if errors.As(err, &se) && authFailure(se.Err) {
			return nil, fmt.Errorf("Slack refused the bot token in %s (%s): copy the Bot User OAuth Token (xoxb-...) again from the app's OAuth & Permissions page, and reinstall the app if it was revoked", a.cfg.BotTokenEnv, se.Err)
		}
		return nil, fmt.Errorf("cannot reach Slack at %s to check the bot token: %w", a.cfg.APIURL, err)
	}
	checked := []string{fmt.Sprintf("bot token accepted (team %s, bot user %s)", resp.Team, resp.UserID)}
	var errs []error
	for _, ch := range a.cfg.conversations() {
		if err := a.canPost(ctx, ch); err != nil {
			var se slack.SlackErrorResponse
			if errors.As(err, &se) && se.Err == "missing_scope" {
				errs = append(errs, fmt.Errorf("channel %s: cannot check it: add the channels:read and groups:read bot scopes under OAuth & Permissions and reinstall the app", ch))
				continue
			}
			errs = append(errs, fmt.Errorf("channel %s: %w", ch, a.apiError("cannot post", err)))
			continue
		}
		checked = append(checked, "can post in channel "+ch)
	}
	if a.cfg.DM || slices.ContainsFunc(a.cfg.Routes, func(r Route) bool { return r.DM }) {
		checked = append(checked, "direct messages: each is checked when it is sent")
	}
	return checked, errors.Join(errs...)
}
