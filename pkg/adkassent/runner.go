package adkassent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"iter"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
	"google.golang.org/adk/agent"
	"google.golang.org/adk/plugin"
	"google.golang.org/adk/runner"
	"google.golang.org/adk/session"
	"google.golang.org/adk/tool"
	"google.golang.org/adk/tool/toolconfirmation"
	"google.golang.org/genai"

	"github.com/assent-dev/assent/pkg/events"
	"github.com/assent-dev/assent/pkg/handler"
)

// answerKey marks an answer this package sent: the function response carries
// the Assent request id, outcome and reason under it. ADK reads "confirmed"
// and "payload" and ignores it; it stays in the session for the record.
const answerKey = "assent"

// PluginName is the name of the ADK plugin a Runner installs.
const PluginName = "assent"

// Runner runs an ADK agent and answers its tool confirmations through
// Assent. It is safe for concurrent use on different sessions.
type Runner struct {
	inner    *runner.Runner
	client   *handler.Client
	sessions session.Service
	app      string
	cfg      Config
	log      *zap.Logger

	mu       sync.Mutex
	verdicts map[callKey]verdict // decisions handed to ADK, until their tool has run
}

// callKey names one original call in one ADK session.
type callKey struct{ app, user, session, call string }

// verdict is what Assent decided about one original call, kept for the
// plugin that stands before the tool.
type verdict struct {
	requestID string
	approved  bool
	args      json.RawMessage // the decided args, for an approval
	digest    string          // their digest
	edited    bool
	outcome   events.Outcome
	reason    string
	refused   string // why this package refused an approval
}

// why says why the call does not run.
func (v verdict) why() string {
	if v.refused != "" {
		return fmt.Sprintf("Assent approved request %s, but it was refused: %s", v.requestID, v.refused)
	}
	return fmt.Sprintf("Assent: %s: %s; request %s", v.outcome, v.reason, v.requestID)
}

// NewRunner returns a Runner over an ADK runner made from rc, with the
// Runner's plugin first among rc's plugins, that asks client. The client
// stays the caller's.
func NewRunner(client *handler.Client, rc runner.Config, cfg Config) (*Runner, error) {
	var errs []error
	if client == nil {
		errs = append(errs, errors.New("nil handler.Client"))
	}
	if rc.SessionService == nil {
		errs = append(errs, errors.New("runner config: no SessionService"))
	}
	if err := cfg.Validate(); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("adkassent: %w", err)
	}
	cfg = cfg.withDefaults()
	r := &Runner{
		client:   client,
		sessions: rc.SessionService,
		app:      rc.AppName,
		cfg:      cfg,
		log:      cfg.Logger.Named("adkassent").With(zap.String("agent", cfg.Agent)),
		verdicts: map[callKey]verdict{},
	}
	p, err := plugin.New(plugin.Config{
		Name:               PluginName,
		BeforeToolCallback: r.beforeTool,
		AfterToolCallback:  r.afterTool,
	})
	if err != nil {
		return nil, fmt.Errorf("adkassent: plugin: %w", err)
	}
	rc.PluginConfig.Plugins = append([]*plugin.Plugin{p}, rc.PluginConfig.Plugins...)
	if r.inner, err = runner.New(rc); err != nil {
		return nil, fmt.Errorf("adkassent: %w", err)
	}
	return r, nil
}

// Run runs the agent on msg as runner.Runner.Run does and yields its events.
// Whenever the agent asks for tool confirmations, Run asks Assent, waits for
// the decisions, answers ADK with them and goes on yielding what the agent
// does next. A confirmation that gets no decision (the broker unreachable,
// ctx ended: the SDK then withdraws the request) is yielded as an error
// wrapping ErrUnanswered and stays unanswered in the session, for Resume; one
// whose payload does not fit is answered confirmed=false and yielded as an
// error wrapping ErrPayload. opts apply to msg only.
func (r *Runner) Run(ctx context.Context, userID, sessionID string, msg *genai.Content, rc agent.RunConfig, opts ...runner.RunOption) iter.Seq2[*session.Event, error] {
	return func(yield func(*session.Event, error) bool) {
		r.drive(ctx, userID, sessionID, msg, nil, rc, opts, yield)
	}
}

// Resume answers the confirmations the stored session still waits for, such
// as those asked before the process restarted, and yields what the agent
// does then, as Run does. The same confirmation is the same Assent request,
// so a decision made meanwhile is the one used. Without any, it yields
// nothing.
func (r *Runner) Resume(ctx context.Context, userID, sessionID string, rc agent.RunConfig) iter.Seq2[*session.Event, error] {
	return func(yield func(*session.Event, error) bool) {
		waiting, err := r.Pending(ctx, userID, sessionID)
		if err != nil {
			yield(nil, err)
			return
		}
		r.drive(ctx, userID, sessionID, nil, waiting, rc, nil, yield)
	}
}

// Pending returns the confirmations the stored session waits for: those
// never answered, and those answered whose tool has not run since (the
// process stopped in between). Resume answers them.
func (r *Runner) Pending(ctx context.Context, userID, sessionID string) ([]Confirmation, error) {
	got, err := r.sessions.Get(ctx, &session.GetRequest{AppName: r.app, UserID: userID, SessionID: sessionID})
	if err != nil {
		return nil, fmt.Errorf("adkassent: session %s: %w", sessionID, err)
	}
	evs := slices.Collect(got.Session.Events().All())
	waiting, errs := waiting(evs, r.ids(userID, sessionID))
	for _, err := range errs {
		r.log.Warn("skipping a confirmation call", zap.String("session", sessionID), zap.Error(err))
	}
	return waiting, nil
}

// ids returns the request ids of confirmation calls in a session.
func (r *Runner) ids(userID, sessionID string) func(string) string {
	return func(callID string) string { return RequestID(r.cfg.Agent, r.app, userID, sessionID, callID) }
}

// drive answers the confirmations asked, runs the answers, or msg, through
// the ADK runner, and goes on answering the confirmations each run ends with
// until a run asks none, or none gets an answer.
func (r *Runner) drive(ctx context.Context, userID, sessionID string, msg *genai.Content, asked []Confirmation, rc agent.RunConfig, opts []runner.RunOption, yield func(*session.Event, error) bool) {
	var answered []callKey
	defer r.forget(&answered)
	for {
		if len(asked) > 0 {
			var ok bool
			if msg, ok = r.answer(ctx, userID, sessionID, asked, &answered, yield); !ok {
				return
			}
			asked = nil
		}
		if msg == nil {
			return
		}
		for ev, err := range r.inner.Run(ctx, userID, sessionID, msg, rc, opts...) {
			for _, fc := range confirmationCalls(ev) {
				c, cerr := confirmationOf(fc, r.ids(userID, sessionID))
				if cerr != nil {
					if !yield(nil, cerr) {
						return
					}
					continue
				}
				asked = append(asked, c)
			}
			if !yield(ev, err) {
				return
			}
		}
		msg, opts = nil, nil
	}
}

// forget drops the verdicts of the calls in keys: their tools have run, or
// the run that would have run them is over.
func (r *Runner) forget(keys *[]callKey) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, k := range *keys {
		delete(r.verdicts, k)
	}
}

// answer asks Assent about each confirmation at once, and returns the
// message that answers ADK: nil if none got a decision. The calls whose
// verdicts it records are added to answered. Errors go to yield; ok is false
// once yield says stop.
func (r *Runner) answer(ctx context.Context, userID, sessionID string, cs []Confirmation, answered *[]callKey, yield func(*session.Event, error) bool) (msg *genai.Content, ok bool) {
	type result struct {
		resp *genai.FunctionResponse
		key  callKey
		err  error
	}
	results := make([]result, len(cs))
	var wg sync.WaitGroup
	for i, c := range cs {
		wg.Go(func() {
			resp, err := r.ask(ctx, userID, sessionID, c)
			results[i] = result{resp, callKey{r.app, userID, sessionID, c.OriginalCallID}, err}
		})
	}
	wg.Wait()
	var parts []*genai.Part
	for _, res := range results {
		if res.resp != nil {
			parts = append(parts, &genai.Part{FunctionResponse: res.resp})
			*answered = append(*answered, res.key)
		}
		if res.err != nil && !yield(nil, res.err) {
			return nil, false
		}
	}
	if len(parts) == 0 {
		return nil, true
	}
	return &genai.Content{Role: genai.RoleUser, Parts: parts}, true
}

// ask asks Assent about c, waits for the decision and returns ADK's answer
// to it, after recording the verdict for the plugin. Without a decision it
// returns no answer and an error wrapping ErrUnanswered; with a payload that
// does not fit, a refusal and an error wrapping ErrPayload.
func (r *Runner) ask(ctx context.Context, userID, sessionID string, c Confirmation) (*genai.FunctionResponse, error) {
	log := r.log.With(zap.String("request_id", c.RequestID), zap.String("tool", c.Tool), zap.String("session", sessionID))
	req, err := r.request(userID, sessionID, c)
	if err != nil {
		return nil, fmt.Errorf("%w: %s (tool %s): %w", ErrUnanswered, c.CallID, c.Tool, err)
	}
	start := time.Now()
	d, err := r.client.Request(ctx, req)
	log = log.With(zap.Duration("waited", time.Since(start)))
	if err != nil {
		log.Warn("no decision", zap.Error(err))
		return nil, fmt.Errorf("%w: %s (tool %s, request %s): %w", ErrUnanswered, c.CallID, c.Tool, c.RequestID, err)
	}
	v := verdict{requestID: d.RequestID, outcome: d.Outcome, reason: d.Reason, edited: d.Edited}
	var payload any
	if d.Approved() {
		payload, err = payloadFor(req.ResponseSchema, d.Payload, c.Payload)
		if err != nil {
			v.refused = err.Error()
			err = fmt.Errorf("request %s (tool %s): %w", c.RequestID, c.Tool, err)
			log.Warn("refusing an approval", zap.Error(err))
		} else {
			v.approved, v.args, v.digest = true, d.Args, d.ArgsDigest
		}
	}
	r.mu.Lock()
	r.verdicts[callKey{r.app, userID, sessionID, c.OriginalCallID}] = v
	r.mu.Unlock()
	log.Info("confirmation answered", zap.String("outcome", string(v.outcome)), zap.Bool("edited", v.edited), zap.String("rule", d.Rule))
	record := map[string]any{"request_id": v.requestID, "outcome": string(v.outcome), "reason": v.reason, "edited": v.edited}
	if v.refused != "" {
		record["refused"] = v.refused
	}
	resp := map[string]any{"confirmed": v.approved, "hint": c.Hint, answerKey: record}
	if v.approved && payload != nil {
		resp["payload"] = payload
	}
	return &genai.FunctionResponse{ID: c.CallID, Name: toolconfirmation.FunctionCallName, Response: resp}, err
}

// request is the Assent request for confirmation c in a session.
func (r *Runner) request(userID, sessionID string, c Confirmation) (handler.Request, error) {
	schema := r.cfg.Schemas[c.Tool]
	if schema == nil {
		var err error
		if schema, err = SchemaOf(c.Payload); err != nil {
			return handler.Request{}, err
		}
	}
	return handler.Request{ID: c.RequestID, Requested: events.Requested{
		Tool:           c.Tool,
		Args:           c.Args,
		Agent:          r.cfg.Agent,
		Session:        sessionID,
		User:           userID,
		CallID:         c.OriginalCallID,
		Hint:           truncateText(r.hint(c), hintLimit),
		ResponseSchema: schema,
		Timeout:        events.Duration(r.cfg.Timeout),
		Labels:         r.cfg.Labels,
	}, Keep: r.cfg.KeepOnStop}, nil
}

// stockHint marks the text ADK's own tools give RequestConfirmation: words
// for the app that answers the confirmation, not for a person.
const stockHint = "by responding with a FunctionResponse"

// hint is what approvers read for c: the tool's own words, or for ADK's stock
// text, Config.Hints for the tool or a plain question.
func (r *Runner) hint(c Confirmation) string {
	if !strings.Contains(c.Hint, stockHint) {
		return c.Hint
	}
	if h := r.cfg.Hints[c.Tool]; h != "" {
		return h
	}
	return "Run " + c.Tool + "?"
}

// beforeTool stands between a confirmation and its tool. A call confirmed by
// anything but this Runner's answer, or whose confirmation disagrees with the
// decision, does not run (ErrNotApproved). An approved call runs with the
// decided args: the approver's edit replaces the model's in place, as ADK
// lets a before-tool callback do.
func (r *Runner) beforeTool(ctx agent.ToolContext, t tool.Tool, args map[string]any) (map[string]any, error) {
	tc := ctx.ToolConfirmation()
	if tc == nil {
		return nil, nil // not a confirmed call: a policy allowed it outright, or it is not guarded
	}
	r.mu.Lock()
	v, ok := r.verdicts[callKey{ctx.AppName(), ctx.UserID(), ctx.SessionID(), ctx.FunctionCallID()}]
	r.mu.Unlock()
	switch {
	case !ok && tc.Confirmed:
		return nil, fmt.Errorf("%w: tool %s call %s was confirmed, but not by Assent", ErrNotApproved, t.Name(), ctx.FunctionCallID())
	case !ok:
		return nil, nil // refused by someone else: the tool sees Confirmed false
	case tc.Confirmed != v.approved:
		return nil, fmt.Errorf("%w: tool %s call %s: the confirmation says %v, Assent %s (request %s)", ErrNotApproved, t.Name(), ctx.FunctionCallID(), tc.Confirmed, v.outcome, v.requestID)
	case !v.approved:
		return nil, nil // the tool sees Confirmed false; afterTool gives the reason
	}
	raw, err := json.Marshal(args)
	if err == nil {
		var digest string
		if digest, err = events.ArgsDigest(raw); err == nil && digest == v.digest {
			return nil, nil // what runs is what was approved
		}
	}
	var decided map[string]any
	if err := json.Unmarshal(v.args, &decided); err != nil {
		return nil, fmt.Errorf("%w: tool %s: the decided args of request %s: %v", ErrNotApproved, t.Name(), v.requestID, err)
	}
	clear(args)
	maps.Copy(args, decided)
	r.log.Info("running the decided args", zap.String("request_id", v.requestID), zap.String("tool", t.Name()), zap.Bool("edited", v.edited))
	return nil, nil
}

// afterTool forgets the call's verdict once its tool has run, and tells the
// model why a call Assent did not approve was refused.
func (r *Runner) afterTool(ctx agent.ToolContext, _ tool.Tool, _, _ map[string]any, err error) (map[string]any, error) {
	if ctx.ToolConfirmation() == nil {
		return nil, nil
	}
	key := callKey{ctx.AppName(), ctx.UserID(), ctx.SessionID(), ctx.FunctionCallID()}
	r.mu.Lock()
	v, ok := r.verdicts[key]
	delete(r.verdicts, key)
	r.mu.Unlock()
	if !ok || v.approved || err == nil {
		return nil, nil
	}
	return nil, fmt.Errorf("%w (%s)", err, v.why())
}
