package mcpgateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nats.go"
	"go.uber.org/zap"

	"github.com/assent-dev/assent/pkg/events"
	"github.com/assent-dev/assent/pkg/handler"
)

// Verdict is what Assent decided about a call, as the gateway tells its
// client: in the result's _meta under MetaKey, and as the structured content
// of a call that did not run (unless the tool declares an output schema).
type Verdict struct {
	RequestID string             `json:"request_id"`
	Outcome   events.Outcome     `json:"outcome,omitempty"`
	Reason    string             `json:"reason,omitempty"`
	DecidedBy []events.DecidedBy `json:"decided_by,omitempty"`
	Rule      string             `json:"rule,omitempty"`
	Auto      bool               `json:"auto,omitempty"`
	Edited    bool               `json:"edited,omitempty"`
	// Error says why there is no decision (Outcome is then empty).
	Error string `json:"error,omitempty"`
}

// ElicitChannel is the channel the gateway's elicitation answers are
// recorded under.
const ElicitChannel = "mcp"

// callTool answers tools/call: arguments that break the tool's input
// schema fail at once; the rest are put to Assent, and the call runs
// upstream, with the decided arguments, only once approved. Everything
// else the client sent with the call (its _meta, a task) goes with it.
func (s *session) callTool(ctx context.Context, req *jsonrpc.Request) {
	done, ok := s.g.trackCall()
	defer done()
	if token := progressToken(req.Params); token != "" {
		defer func() {
			s.mu.Lock()
			delete(s.waited, token)
			s.mu.Unlock()
		}()
	}
	p, err := objectOf(req.Params)
	if err != nil {
		s.answer(req.ID, nil, wireError(codeInvalidParams, "tools/call: params: %v", err))
		return
	}
	offered := p.str("name")
	if !ok {
		s.result(req.ID, notRun(&mcp.Tool{}, offered, Verdict{Error: ErrStopped.Error()}, "Not run: the gateway is stopping."))
		return
	}
	t, err := s.lookup(ctx, offered)
	switch {
	case err != nil:
		s.result(req.ID, notRun(&mcp.Tool{}, offered, Verdict{Error: err.Error()}, fmt.Sprintf("Not run: the tools of the gateway's servers could not be listed: %v", err)))
		return
	case t == nil:
		s.result(req.ID, notRun(&mcp.Tool{}, offered, Verdict{Error: "unknown tool"},
			fmt.Sprintf("Unknown tool: %s. No server behind this gateway offers a tool by that name; list the tools again.", offered)))
		return
	}
	args := json.RawMessage(events.TrimJSONSpace(p["arguments"]))
	if string(args) == "null" {
		args = nil
	}
	if err := t.check.Check(args); err != nil {
		s.result(req.ID, notRun(&t.t, offered, Verdict{Error: err.Error()},
			fmt.Sprintf("Not run, and nobody was asked: the arguments do not fit the input schema of %s: %v. Fix them and call again.", offered, err)))
		return
	}
	r, err := s.approvalRequest(req, t, offered, args)
	if err != nil {
		s.result(req.ID, notRun(&t.t, offered, Verdict{Error: err.Error()}, fmt.Sprintf("Not run: the call to %s cannot be put to Assent for approval: %v", offered, err)))
		return
	}
	log := s.log.With(zap.String("request_id", r.ID), zap.String("tool", offered), zap.String("agent", r.Agent))
	d, err := s.ask(ctx, req, r, log)
	if err != nil {
		if errors.Is(err, errEnded) {
			// The client cancelled the call or went away, or the gateway
			// stops: the request is withdrawn, and nobody waits for a
			// result.
			log.Info("call ended before its decision", zap.Error(err))
			return
		}
		log.Warn("no decision", zap.Error(err))
		if errors.Is(err, ErrNoBroker) {
			s.result(req.ID, notRun(&t.t, offered, Verdict{RequestID: r.ID, Error: err.Error()},
				fmt.Sprintf("Not run: %v, so the call to %s could not be approved, and did not run. Tell the user; it can be called again once Assent is back. (Assent request %s.)", err, offered, r.ID)))
			return
		}
		s.result(req.ID, notRun(&t.t, offered, Verdict{RequestID: r.ID, Error: err.Error()},
			fmt.Sprintf("Not run: Assent did not decide the call to %s (%v). Request %s.", offered, err, r.ID)))
		return
	}
	v := verdictOf(d)
	if !d.Approved() {
		log.Info("not approved", zap.String("outcome", string(d.Outcome)))
		s.result(req.ID, notRun(&t.t, offered, v, refusal(offered, d)))
		return
	}
	decided := d.Args
	if events.EmptyJSON(decided) {
		decided = json.RawMessage(`{}`)
	}
	// Always the decided args: an approver may have edited them.
	p.set("name", t.name)
	p["arguments"] = decided
	resp, err := t.link.call(ctx, req.Method, p.bytes(), &forwarded{client: req.ID, token: progressToken(req.Params)})
	switch {
	case err != nil && ctx.Err() != nil:
		return
	case err != nil:
		log.Warn("approved call failed upstream", zap.String("upstream", t.link.cfg.Name), zap.Error(err))
		s.result(req.ID, notRun(&t.t, offered, v, fmt.Sprintf("Approved, but the call to %s could not reach its server %s: %v. It may not have run. Request %s.", offered, t.link.cfg.Name, err, r.ID)))
		return
	case resp.Error != nil:
		s.answer(req.ID, nil, resp.Error) // the upstream's own answer: pass it on
		return
	}
	res, err := objectOf(resp.Result)
	if err != nil {
		s.answer(req.ID, resp.Result, nil)
		return
	}
	meta := res.obj("_meta")
	meta.set(MetaKey, v)
	res["_meta"] = meta.bytes()
	if id := res.obj("task").str("taskId"); id != "" {
		s.mu.Lock()
		s.tasks[id] = t.link
		s.mu.Unlock()
	}
	s.answer(req.ID, res.bytes(), nil)
}

// result answers the client's call with a result of the gateway's own.
func (s *session) result(id jsonrpc.ID, res *mcp.CallToolResult) {
	raw, err := json.Marshal(res)
	if err != nil {
		s.answer(id, nil, wireError(codeInternal, "%v", err))
		return
	}
	s.answer(id, raw, nil)
}

// approvalRequest is the approval request for a call: the tool as the upstream
// names it, the call's arguments, who asks, and what an approver needs to
// know about the tool.
func (s *session) approvalRequest(req *jsonrpc.Request, t *tool, offered string, args json.RawMessage) (handler.Request, error) {
	agent := s.g.cfg.Identity.Agent
	if agent == "" {
		agent = AgentName(s.clientName())
	}
	schema := t.schema
	r := handler.Request{ID: events.NewID(), Requested: events.Requested{
		Tool: t.name, Args: args, Agent: agent, Session: s.sessionID(), User: s.g.cfg.Identity.User,
		Hint: hint(offered, t.link.cfg.Name, &t.t, schema != nil), InputSchema: schema, Labels: labelsOf(t.link.cfg.Name, t.t.Annotations),
	}}
	return r, r.Validate()
}

// labelsOf are the labels of a request to call a tool of server with
// annotations a: mcp_server, and mcp_read_only and mcp_destructive as the
// MCP specification reads the hints. readOnlyHint defaults to false;
// destructiveHint defaults to true, but only for a tool that is not
// read-only: a read-only tool changes nothing, so it is not destructive
// unless it says destructiveHint: true, which is taken as said.
func labelsOf(server string, a *mcp.ToolAnnotations) map[string]string {
	readOnly, destructive := false, true
	if a != nil {
		readOnly = a.ReadOnlyHint
		destructive = !readOnly
		if a.DestructiveHint != nil {
			destructive = *a.DestructiveHint
		}
	}
	return map[string]string{"mcp_server": server, "mcp_read_only": strconv.FormatBool(readOnly), "mcp_destructive": strconv.FormatBool(destructive)}
}

// AgentName makes a client's name (its initialize clientInfo.name) into the
// agent an MCP client asks as: lower case, each run of characters other than
// a-z 0-9 _ - turned into one "-", no "-" at either end, at most 64
// characters; "mcp-client" when nothing is left. "Claude Desktop" asks as
// claude-desktop, "Visual Studio Code" as visual-studio-code.
func AgentName(clientName string) string { return tokenOf(clientName, "mcp-client") }

// hint is what a person reads about the tool: its title and description
// and the name the client called it by, within the hint's size limit. The
// input schema travels in the request's input_schema (inputSchema), not
// here; withSchema false says it could not.
func hint(offered, server string, t *mcp.Tool, withSchema bool) string {
	title := t.Title
	if title == "" && t.Annotations != nil {
		title = t.Annotations.Title
	}
	var b strings.Builder
	if title != "" {
		b.WriteString(title + ": ")
	}
	if t.Description != "" {
		b.WriteString(t.Description)
	} else {
		b.WriteString("(no description)")
	}
	tail := fmt.Sprintf("\nMCP tool %s of server %s.", offered, server)
	if !withSchema {
		tail += " Its input schema is too large to show."
	}
	// The description is cut, not the line naming the tool, unless that
	// line is most of the hint.
	if room := events.MaxTextLength - len(tail); room >= 256 {
		return cut(b.String(), room) + tail
	}
	return cut(b.String()+tail, events.MaxTextLength)
}

// inputSchema is the tool's input schema as a request's input_schema, for
// approvers; nil when it cannot be carried (over events.MaxInputSchemaSize,
// or not an object).
func inputSchema(t *mcp.Tool) json.RawMessage {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(t.InputSchema); err != nil {
		return nil
	}
	raw := json.RawMessage(bytes.TrimSpace(buf.Bytes()))
	if len(raw) > events.MaxInputSchemaSize || len(raw) == 0 || raw[0] != '{' {
		return nil
	}
	return raw
}

// cut shortens s to at most n bytes, at a character boundary, marking the
// cut with "…".
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	const mark = "…"
	s = s[:n-len(mark)]
	for !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return s + mark
}

// ask asks Assent about r and waits for the decision. Meanwhile it asks the
// client's user too (elicitation, when configured) and watches the client.
//
// When no broker takes r up (see broker.go), the error wraps ErrNoBroker
// and ask returns at once: the request's withdrawal, which may wait for
// NATS, goes on in the background, which Close waits for.
func (s *session) ask(ctx context.Context, req *jsonrpc.Request, r handler.Request, log *zap.Logger) (handler.Decision, error) {
	g := s.g
	noDecision := handler.Decision{RequestID: r.ID}
	up, err := g.brokerReady(ctx, r.Agent, r.ID)
	if err != nil {
		if ctx.Err() != nil { // nothing was asked: nothing to withdraw
			return noDecision, fmt.Errorf("%w: %w", errEnded, context.Cause(ctx))
		}
		return noDecision, err
	}
	ctx, cancel := context.WithCancelCause(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel(nil)
	if pending := s.watchPending(r, log); pending != nil {
		wg.Go(func() { s.elicit(ctx, req.ID, r, pending, log) })
	}
	if g.cfg.ClientPing > 0 {
		wg.Go(func() { s.watch(ctx, req, r.ID, cancel, log) })
	}
	if g.cfg.BrokerWait > 0 {
		wg.Go(func() { g.awaitBroker(ctx, r.ID, up, cancel) })
	}
	type answer struct {
		d   handler.Decision
		err error
	}
	answered := make(chan answer, 1)
	g.wg.Go(func() {
		d, err := g.client.Request(ctx, r)
		answered <- answer{d, err}
	})
	var a answer
	select {
	case a = <-answered:
	case <-ctx.Done():
		if cause := context.Cause(ctx); errors.Is(cause, ErrNoBroker) {
			return noDecision, cause
		}
		a = <-answered
	}
	if a.err != nil && ctx.Err() != nil {
		cause := context.Cause(ctx)
		if errors.Is(cause, ErrNoBroker) {
			return noDecision, cause
		}
		return a.d, fmt.Errorf("%w: %w", errEnded, cause)
	}
	return a.d, a.err
}

// errEnded: the call ended before its decision, and its request was
// withdrawn.
var errEnded = errors.New("call ended before its decision")

// watch pings the client of a waiting call every ClientPing, and tells it
// the call waits when it asked for progress; a client that does not answer
// in time is gone, and cancel is called with ErrClientGone. A call decided
// within ClientPing (by policy, say) sees nothing of it.
func (s *session) watch(ctx context.Context, req *jsonrpc.Request, id string, cancel context.CancelCauseFunc, log *zap.Logger) {
	every := s.g.cfg.ClientPing
	tick := time.NewTicker(every)
	defer tick.Stop()
	token := progressToken(req.Params)
	for n := 1.0; ; n++ {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if token != "" {
			p := object{"progressToken": json.RawMessage(token)}
			p.set("progress", n)
			p.set("message", "waiting for approval (Assent request "+id+")")
			s.progressed(token, n)
			if err := s.notify("notifications/progress", p, req.ID); err != nil && ctx.Err() == nil {
				log.Debug("notify progress", zap.Error(err))
			}
		}
		pctx, stop := context.WithTimeout(ctx, every)
		_, err := s.request(pctx, "ping", struct{}{}, req.ID)
		stop()
		if err != nil && ctx.Err() == nil {
			log.Info("the client does not answer pings: cancelling its call", zap.Error(err))
			cancel(fmt.Errorf("%w: no answer to a ping: %v", ErrClientGone, err))
			return
		}
	}
}

// watchPending subscribes to the pending events of r's agent when the
// client's user is to be asked too (elicitation configured, the client able
// to elicit, over stdio or allowed over HTTP); else it returns nil. It
// subscribes before r is published, so the event cannot slip by.
func (s *session) watchPending(r handler.Request, log *zap.Logger) *nats.Subscription {
	e := s.g.cfg.Elicitation
	if e.Principal == "" || s.http && !e.OverHTTP || !s.canElicit() {
		return nil
	}
	subj, err := events.PendingSubject(r.Agent)
	if err != nil {
		return nil
	}
	sub, err := s.g.nc.SubscribeSync(subj)
	if err != nil {
		log.Warn("cannot watch for the request's pending event: not asking the client's user", zap.Error(err))
		return nil
	}
	return sub
}

// elicit asks the client's user to approve or deny r once the broker says r
// waits for people, and publishes the answer as the configured principal.
// The broker decides whether it counts; ctx ends when r is decided, which
// withdraws the question from the client.
func (s *session) elicit(ctx context.Context, call jsonrpc.ID, r handler.Request, sub *nats.Subscription, log *zap.Logger) {
	p, ok := awaitPending(ctx, sub, r.ID)
	_ = sub.Unsubscribe()
	principal := s.g.cfg.Elicitation.Principal
	if !ok {
		return
	}
	if !mayAnswer(p, principal, r.User) {
		log.Debug("not asking the client's user: the policy does not let them answer", zap.String("principal", principal))
		return
	}
	form := newApprovalForm(r, p)
	message := question(r, principal)
	for try := 0; ; try++ {
		raw, err := s.request(ctx, "elicitation/create", &mcp.ElicitParams{Message: message, RequestedSchema: form.schema}, call)
		if err != nil {
			if ctx.Err() == nil {
				log.Warn("ask the client's user", zap.Error(err))
			}
			return
		}
		var res mcp.ElicitResult
		if err := json.Unmarshal(raw, &res); err != nil {
			log.Warn("the client's answer to the question", zap.Error(err))
			return
		}
		answer := events.Responded{Channel: ElicitChannel}
		switch res.Action {
		case "accept":
			answer.Decision = events.Approve
		case "decline":
			answer.Decision = events.Deny
		default: // dismissed: leave it to the other approvers
			log.Info("the client's user dismissed the question")
			return
		}
		if reason, _ := res.Content[reasonKey].(string); reason != "" {
			answer.Reason = reason
		}
		if answer.Decision == events.Approve {
			args, err := form.edited(res.Content)
			if err == nil && args != nil {
				err = events.CheckArgs(r.InputSchema, args)
			}
			if err != nil {
				if try == 2 {
					log.Info("the client's user's edits do not fit the tool's input schema; leaving it to the other approvers", zap.Error(err))
					return
				}
				message = fmt.Sprintf("Your changes were not used: %s. Change them, or accept without changes.\n\n%s", cut(err.Error(), 512), question(r, principal))
				continue
			}
			answer.Args = args
			if remember, _ := res.Content[rememberKey].(bool); remember {
				answer.Remember = &events.Remember{Scope: "session"}
			}
		}
		if err := handler.Answer(ctx, s.g.js, principal, r.ID, answer); err != nil && ctx.Err() == nil {
			log.Warn("publish the client's user's answer", zap.String("principal", principal), zap.Error(err))
		}
		return
	}
}

// question is what the client's user is asked about r: the whole call,
// unless it is too long for a question, when it says how much is shown and
// where to read the rest.
func question(r handler.Request, principal string) string {
	args := string(r.Args)
	if args == "" {
		args = "{}"
	}
	if len(args) > maxQuestionArgs {
		args = fmt.Sprintf("%s\n(only the first %d of the arguments' %d bytes are shown here: read them whole in Assent's web page, request %s, before you accept)",
			cut(args, maxQuestionArgs), maxQuestionArgs, len(r.Args), r.ID)
	}
	return fmt.Sprintf("Approve this tool call? Accept approves it (with your changes to the arguments below, if any), decline denies it; you answer as %s.\n\nAgent %s wants to call %s with:\n%s\n\n(Assent request %s)",
		principal, r.Agent, r.Tool, args, r.ID)
}

// maxQuestionArgs bounds the arguments shown in a question.
const maxQuestionArgs = 6000

// awaitPending waits on sub for the pending event of request id.
func awaitPending(ctx context.Context, sub *nats.Subscription, id string) (events.Pending, bool) {
	for {
		m, err := sub.NextMsgWithContext(ctx)
		if err != nil {
			return events.Pending{}, false
		}
		e, err := events.Decode(events.Header(m.Header), m.Data)
		if err != nil || e.Type() != events.TypePending {
			continue
		}
		if p, err := events.DecodePending(&e); err == nil && p.RequestID == id {
			return p, true
		}
	}
}

// mayAnswer reports whether principal may answer the pending request p
// asked on user's behalf, as far as p tells: not their own request unless
// self-approval is allowed, and only when the approvers are anyone, name
// principal, or name roles (which the broker resolves).
func mayAnswer(p events.Pending, principal, user string) bool {
	if user == principal && (p.Terms == nil || !p.Terms.AllowSelfApproval) {
		return false
	}
	return len(p.Approvers) == 0 || slices.ContainsFunc(p.Approvers, func(a string) bool {
		return a == principal || a == "any" || strings.HasPrefix(a, "role:")
	})
}

// verdictOf is what the gateway says of d.
func verdictOf(d handler.Decision) Verdict {
	return Verdict{RequestID: d.RequestID, Outcome: d.Outcome, Reason: d.Reason, DecidedBy: d.DecidedBy, Rule: d.Rule, Auto: d.Auto, Edited: d.Edited}
}

// notRun is a tool error saying why the call did not run: text for the
// model, and the verdict in _meta and as structured content (left out when
// the tool declares an output schema, which it would not match).
func notRun(t *mcp.Tool, offered string, v Verdict, text string) *mcp.CallToolResult {
	res := &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: text}}, Meta: mcp.Meta{MetaKey: v}}
	if t.OutputSchema == nil {
		res.StructuredContent = map[string]any{"assent": v}
	}
	return res
}

// refusal tells the model why a call was not approved, and what to do.
func refusal(offered string, d handler.Decision) string {
	reason := ""
	if d.Reason != "" {
		reason = fmt.Sprintf(": %q", d.Reason)
	}
	var what string
	switch d.Outcome {
	case events.Denied:
		what = fmt.Sprintf("Not run: Assent denied this call of %s. Denied by %s%s. Do not call it again unchanged; tell the user, or ask how to proceed.", offered, deciders(d), reason)
	case events.Expired:
		what = fmt.Sprintf("Not run: nobody approved this call of %s in time%s. You may ask the user to approve it, then call it again.", offered, reason)
	case events.Cancelled:
		what = fmt.Sprintf("Not run: the approval request for this call of %s was cancelled%s.", offered, reason)
	default:
		what = fmt.Sprintf("Not run: the call of %s ended %s%s.", offered, d.Outcome, reason)
	}
	return fmt.Sprintf("%s (Assent request %s, outcome %q.)", what, d.RequestID, d.Outcome)
}

// deciders names who decided d: its principals and their channels, or the
// policy rule or remembered choice that decided.
func deciders(d handler.Decision) string {
	if d.Auto || len(d.DecidedBy) == 0 {
		if id, ok := strings.CutPrefix(d.Rule, "remembered:"); ok {
			return "a remembered choice (" + id + ")"
		}
		if d.Rule != "" {
			return "policy rule " + d.Rule
		}
		return "policy"
	}
	names := make([]string, len(d.DecidedBy))
	for i, by := range d.DecidedBy {
		names[i] = by.Principal
		if by.Channel != "" {
			names[i] += " (" + by.Channel + ")"
		}
	}
	by := strings.Join(names, ", ")
	if d.Rule != "" && !strings.HasPrefix(d.Rule, "mode:") { // the mode says nothing to the model
		by += ", under rule " + d.Rule
	}
	return by
}

// The tools a guarded resource read and prompt are asked as: no MCP tool
// is called so (a tool's name has no ":"), and the glob "*" matches them.
const (
	ToolReadResource = "resource:read"
	ToolGetPrompt    = "prompt:get"
)

// codeNotApproved is the JSON-RPC error of a guarded read (a resource, a
// prompt) that Assent did not approve; its data is the Verdict.
const codeNotApproved = -32042

// guard puts what the client asks of upstream l other than a tool call (a
// resource read, a prompt) to Assent, as a request for tool what
// (ToolReadResource, ToolGetPrompt) with args. Approved, it returns the decided args (an
// approver may have edited them) and true; otherwise the client was
// answered with an error saying why, and it returns false.
func (s *session) guard(ctx context.Context, req *jsonrpc.Request, l *link, what string, args json.RawMessage) (json.RawMessage, bool) {
	done, ok := s.g.trackCall()
	defer done()
	fail := func(v Verdict, text string) (json.RawMessage, bool) {
		data, _ := json.Marshal(v)
		s.answer(req.ID, nil, &jsonrpc.Error{Code: codeNotApproved, Message: text, Data: data})
		return nil, false
	}
	if !ok {
		return fail(Verdict{Error: ErrStopped.Error()}, "Not read: the gateway is stopping.")
	}
	agent := s.g.cfg.Identity.Agent
	if agent == "" {
		agent = AgentName(s.clientName())
	}
	kind := map[string]string{ToolReadResource: "resource", ToolGetPrompt: "prompt"}[what]
	r := handler.Request{ID: events.NewID(), Requested: events.Requested{
		Tool: what, Args: args, Agent: agent, Session: s.sessionID(), User: s.g.cfg.Identity.User,
		Hint:   fmt.Sprintf("MCP %s of server %s: the client reads a %s, which the gateway guards.", req.Method, l.cfg.Name, kind),
		Labels: map[string]string{"mcp_server": l.cfg.Name, "mcp_kind": kind},
	}}
	if err := r.Validate(); err != nil {
		return fail(Verdict{Error: err.Error()}, fmt.Sprintf("Not read: the %s cannot be put to Assent for approval: %v", kind, err))
	}
	log := s.log.With(zap.String("request_id", r.ID), zap.String("tool", what), zap.String("agent", r.Agent))
	d, err := s.ask(ctx, req, r, log)
	switch {
	case err != nil && errors.Is(err, errEnded):
		log.Info("read ended before its decision", zap.Error(err))
		return nil, false
	case err != nil:
		return fail(Verdict{RequestID: r.ID, Error: err.Error()}, fmt.Sprintf("Not read: Assent did not decide (%v). Request %s.", err, r.ID))
	case !d.Approved():
		return fail(verdictOf(d), refusal(what, d))
	}
	if events.EmptyJSON(d.Args) {
		return args, true
	}
	return d.Args, true
}
