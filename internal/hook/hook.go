package hook

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"

	"github.com/assent-dev/assent/internal/natsconn"
	"github.com/assent-dev/assent/pkg/events"
	"github.com/assent-dev/assent/pkg/handler"
)

// The hook's time: a coding agent kills a hook that runs longer than its
// timeout for it (Config.HookTimeout) and, for most agents, then lets the
// call run. So the hook answers AnswerMargin before that whatever happens,
// and asks for an approval timeout that leaves the broker's expiry time to
// arrive before the answer is due.
const (
	// DefaultHookTimeout is the agent's hook timeout assumed unless told:
	// Gemini CLI's default, and under Claude Code's and Codex's.
	DefaultHookTimeout = 60 * time.Second
	// MinHookTimeout is the shortest hook timeout the hook works within.
	MinHookTimeout = 11 * time.Second
	// AnswerMargin is how long before the hook timeout the hook answers at
	// the latest.
	AnswerMargin = 5 * time.Second
	// DefaultTimeoutMargin is how much shorter than the hook timeout the
	// approval timeout is unless told: 60s gives 50s.
	DefaultTimeoutMargin = 10 * time.Second
	// MinTimeoutMargin is how much shorter than the hook timeout the
	// approval timeout must be, for the broker's expiry to arrive in time.
	MinTimeoutMargin = 8 * time.Second
	// DefaultBrokerWait is how long a broker may take to take up (store) a
	// request before the hook gives up on it as no broker.
	DefaultBrokerWait = 5 * time.Second
	// DefaultNATSURL is the broker's NATS server unless told.
	DefaultNATSURL = "nats://127.0.0.1:4222"
)

// exitMargin is how long before the hook timeout the hook returns, done or
// not with withdrawing a request it gave up on.
const exitMargin = time.Second

// opCheck bounds each look at NATS: connecting, asking for a broker.
const opCheck = 2 * time.Second

// ErrNoBroker: no broker answers, so nothing can decide the call.
var ErrNoBroker = errors.New("no Assent broker answers")

// errHookTime ends the wait when the hook must answer.
var errHookTime = errors.New("the hook's time ran out")

// reservedLabels are the labels the hook sets itself (Dialect.Labels).
var reservedLabels = []string{"coding_agent", "read_only", "cwd", "permission_mode", "mcp_server", "mcp_tool"}

// Config configures a Hook.
type Config struct {
	// Agent is the agent the hook asks as; default the dialect's
	// (claude-code, codex, gemini-cli). With NATS credentials, the agent
	// they were issued for.
	Agent string
	// User is on whose behalf the agent works; none by default.
	User string
	// Labels are added to every request's (Dialect.Labels has the hook's
	// own, which these may not set).
	Labels map[string]string
	// HookTimeout is the coding agent's timeout for the hook (its "timeout"
	// setting): the hook answers AnswerMargin before it. Default
	// DefaultHookTimeout.
	HookTimeout time.Duration
	// Timeout is the approval timeout asked for each call; the broker's
	// policy may shorten it. Default HookTimeout less DefaultTimeoutMargin;
	// at most HookTimeout less MinTimeoutMargin.
	Timeout time.Duration
	// NATS is how to reach the broker; URL default DefaultNATSURL.
	NATS natsconn.Settings
	// TrustedKeys are the public keys of the broker's decision keys: when
	// set, only a decision one of them signed counts.
	TrustedKeys []string
	// Private reads decisions through the agent's own subjects, for
	// credentials issued with --private.
	Private bool
	// BrokerWait is how long a broker may take to take up a request before
	// the call is denied as no broker. Default DefaultBrokerWait; negative,
	// as long as the hook may wait.
	BrokerWait time.Duration
}

// WithDefaults returns c with every unset field at its default for d.
func (c Config) WithDefaults(d Dialect) Config {
	if c.Agent == "" {
		c.Agent = d.Agent
	}
	if c.HookTimeout == 0 {
		c.HookTimeout = DefaultHookTimeout
	}
	if c.Timeout == 0 && c.HookTimeout >= MinHookTimeout {
		c.Timeout = c.HookTimeout - DefaultTimeoutMargin
	}
	if c.NATS.URL == "" {
		c.NATS.URL = DefaultNATSURL
	}
	if c.BrokerWait == 0 {
		c.BrokerWait = DefaultBrokerWait
	}
	return c
}

// Validate reports every problem with c at once. Call it on WithDefaults'
// result.
func (c Config) Validate() error {
	var errs []error
	if err := events.CheckToken("agent", c.Agent); err != nil {
		errs = append(errs, fmt.Errorf("--agent: %w", err))
	}
	if err := events.CheckIdentifier("user", c.User); err != nil || len(c.User) > 256 {
		errs = append(errs, fmt.Errorf("--user %q: want at most 256 bytes of printable text", c.User))
	}
	for _, k := range slices.Sorted(maps.Keys(c.Labels)) {
		v := c.Labels[k]
		switch {
		case slices.Contains(reservedLabels, k):
			errs = append(errs, fmt.Errorf("--label %s: the hook sets this label itself (%v)", k, reservedLabels))
		case k == "" || len(k) > events.MaxLabelLength || len(v) > events.MaxLabelLength:
			errs = append(errs, fmt.Errorf("--label %q: keys 1-%d bytes, values at most %d", k, events.MaxLabelLength, events.MaxLabelLength))
		case events.CheckIdentifier("label", k) != nil || events.CheckIdentifier("label", v) != nil:
			errs = append(errs, fmt.Errorf("--label %q: control or format characters", k))
		}
	}
	if n := len(c.Labels) + len(reservedLabels); n > events.MaxLabels {
		errs = append(errs, fmt.Errorf("--label: %d labels, at most %d", len(c.Labels), events.MaxLabels-len(reservedLabels)))
	}
	switch {
	case c.HookTimeout < MinHookTimeout:
		errs = append(errs, fmt.Errorf("--hook-timeout %s: want %s or more (give the coding agent's hook a timeout of at least that)", c.HookTimeout, MinHookTimeout))
	case c.Timeout < time.Second || c.Timeout > c.HookTimeout-MinTimeoutMargin:
		errs = append(errs, fmt.Errorf("--timeout %s: want 1s up to %s, %s under --hook-timeout %s, so that the decision arrives before the coding agent stops waiting for the hook",
			c.Timeout, c.HookTimeout-MinTimeoutMargin, MinTimeoutMargin, c.HookTimeout))
	case c.Timeout > events.MaxTimeout:
		errs = append(errs, fmt.Errorf("--timeout %s: at most %s", c.Timeout, events.MaxTimeout))
	}
	if c.NATS.URL == "" {
		errs = append(errs, errors.New("--nats-url: empty"))
	}
	if err := c.NATS.Validate(); err != nil {
		errs = append(errs, err)
	}
	if _, err := events.NewTrustedKeys(c.TrustedKeys...); err != nil {
		errs = append(errs, fmt.Errorf("--trust-decision-key: %w", err))
	}
	return errors.Join(errs...)
}

// Hook answers a coding agent's before-tool hook calls through Assent.
type Hook struct {
	d   Dialect
	cfg Config
	log *zap.Logger
}

// New returns a hook speaking dialect d. cfg is completed with WithDefaults;
// what Validate finds is returned. A nil log logs nothing.
func New(d Dialect, cfg Config, log *zap.Logger) (*Hook, error) {
	cfg = cfg.WithDefaults(d)
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if log == nil {
		log = zap.NewNop()
	}
	return &Hook{d: d, cfg: cfg, log: log}, nil
}

// Answer is what Run answered.
type Answer struct {
	Verdict Verdict
	// RequestID is the Assent request asked; "" when none was.
	RequestID string
	// Output is what was printed: one line of JSON in the dialect, or
	// nothing.
	Output []byte
}

// Run reads one hook call from in, asks Assent about it, and writes the
// answer on out: the verdict in the dialect and nothing else. It answers
// by HookTimeout less AnswerMargin from its start whatever happens; a
// request it stops waiting for is withdrawn (cancelled, on the record)
// meanwhile, which it waits for until HookTimeout less one second at most.
// The error is only out's: every other failure is a denial, in the answer.
func (h *Hook) Run(ctx context.Context, in io.Reader, out io.Writer) (Answer, error) {
	started := time.Now()
	// bg holds what goes on after the answer is due: reading a stdin that
	// does not end, withdrawing a request. It is waited for as long as the
	// agent waits for the hook, no longer: the process then ends.
	var bg sync.WaitGroup
	defer waitUntil(&bg, started.Add(h.cfg.HookTimeout-exitMargin))
	ctx, cancel := context.WithDeadlineCause(ctx, started.Add(h.cfg.HookTimeout-AnswerMargin), errHookTime)
	defer cancel()
	a := h.answer(ctx, in, &bg)
	var err error
	if a.Output, err = h.d.Render(a.Verdict); err != nil {
		return a, fmt.Errorf("write the answer: %w", err)
	}
	if _, err := out.Write(a.Output); err != nil {
		return a, fmt.Errorf("write the answer: %w", err)
	}
	return a, nil
}

// answer reads the call from in and asks about it, until ctx ends.
func (h *Hook) answer(ctx context.Context, in io.Reader, bg *sync.WaitGroup) Answer {
	data, err := readInput(ctx, in, bg)
	if err != nil {
		h.log.Warn("no hook input", zap.Error(err))
		return Answer{Verdict: h.d.Failed(Call{}, "assent-hook could not read its input ("+err.Error()+")",
			fmt.Sprintf("check that assent-hook %s is set up as %s's %s command hook.", h.d.Name, h.d.Title, h.d.Event))}
	}
	c, err := Parse(h.d, data)
	if err != nil {
		h.log.Warn("hook input refused", zap.Error(err))
		return Answer{Verdict: h.d.Failed(c, "assent-hook could not read its input ("+err.Error()+")",
			fmt.Sprintf("check that assent-hook %s is set up as %s's %s command hook.", h.d.Name, h.d.Title, h.d.Event))}
	}
	r := h.request(c)
	log := h.log.With(zap.String("request_id", r.ID), zap.String("tool", r.Tool), zap.String("session", r.Session))
	if err := r.Validate(); err != nil {
		log.Warn("call refused", zap.Error(err))
		return Answer{Verdict: h.d.Failed(c, "Assent does not take it as asked ("+err.Error()+")", "tell the user; a call like it with other arguments may work.")}
	}
	if size := eventSize(r); size > events.DefaultMaxEventSize {
		log.Warn("call too large", zap.Int("bytes", size))
		return Answer{Verdict: h.d.Failed(c, fmt.Sprintf("it is too large to put to Assent (its request is %d bytes; a broker takes %d by default)", size, events.DefaultMaxEventSize),
			"do it in smaller parts (a file written in pieces, say), or tell the user.")}
	}
	nc, err := h.connect()
	if err != nil {
		log.Warn("NATS unreachable", zap.Error(err))
		return Answer{Verdict: h.d.Failed(c, "Assent is unreachable ("+err.Error()+")",
			"tell the user to start the Assent broker, or to fix assent-hook's --nats-url, then try again.")}
	}
	d, err := h.ask(ctx, nc, r, log, bg)
	a := Answer{RequestID: r.ID}
	switch {
	case err == nil:
		a.Verdict = h.d.Decided(c, d)
		log.Info("decided", zap.String("outcome", string(d.Outcome)), zap.Bool("allow", a.Verdict.Allow))
		return a
	case errors.Is(err, ErrNoBroker):
		a.Verdict = h.d.Failed(c, err.Error(), "tell the user to start the Assent broker, then try again.")
	case errors.Is(err, errHookTime):
		a.Verdict = h.d.Failed(c, fmt.Sprintf("nobody decided it in Assent before the hook had to answer (its timeout is %s); the request was withdrawn (Assent request %s)", h.cfg.HookTimeout, r.ID),
			"ask the user to approve it when you call it again.")
	case errors.Is(err, context.Canceled):
		a.Verdict = h.d.Failed(c, fmt.Sprintf("assent-hook was stopped before Assent decided; the request was withdrawn (Assent request %s)", r.ID), "call it again if it is still wanted.")
	default:
		a.Verdict = h.d.Failed(c, fmt.Sprintf("asking Assent failed (%v; Assent request %s)", err, r.ID), "tell the user; it can be tried again.")
	}
	log.Warn("no decision", zap.Error(err))
	return a
}

// readInput reads all of in, at most MaxInput bytes, until ctx ends. The
// read goes on in bg if ctx ends first.
func readInput(ctx context.Context, in io.Reader, bg *sync.WaitGroup) ([]byte, error) {
	type read struct {
		data []byte
		err  error
	}
	got := make(chan read, 1)
	bg.Go(func() {
		data, err := io.ReadAll(io.LimitReader(in, MaxInput+1))
		got <- read{data, err}
	})
	select {
	case r := <-got:
		switch {
		case r.err != nil:
			return nil, r.err
		case len(r.data) > MaxInput:
			return nil, fmt.Errorf("more than %d bytes", MaxInput)
		}
		return r.data, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("stdin did not end: %w", context.Cause(ctx))
	}
}

// request is the approval request for c.
func (h *Hook) request(c Call) handler.Request {
	labels := h.d.Labels(c)
	maps.Copy(labels, h.cfg.Labels)
	return handler.Request{ID: events.NewID(), Requested: events.Requested{
		Tool: c.Tool, Args: c.Input, Agent: h.cfg.Agent, Session: c.Session, User: h.cfg.User, CallID: c.ToolUseID,
		Hint: h.d.Hint(c), Timeout: events.Duration(h.cfg.Timeout), Labels: labels,
	}}
}

// eventSize is the size of r's requested event as the broker bounds it:
// body and headers. A broker refuses a larger one without deciding it, so
// the hook would otherwise wait for nothing.
func eventSize(r handler.Request) int {
	e, err := events.New(events.TypeRequested, r.ID, "agent/"+r.Agent, r.Requested)
	if err != nil {
		return 0 // Validate has said what is wrong
	}
	h, body, err := events.Encode(&e)
	if err != nil {
		return 0
	}
	size := len(body)
	for k, vs := range h {
		for _, v := range vs {
			size += len(k) + len(v)
		}
	}
	return size
}

// connect connects to the broker's NATS server.
func (h *Hook) connect() (*nats.Conn, error) {
	opts := []nats.Option{nats.Name("assent-hook " + h.d.Name), nats.Timeout(opCheck), nats.MaxReconnects(-1), nats.ReconnectWait(250 * time.Millisecond)}
	if h.cfg.Private {
		opts = append(opts, nats.CustomInboxPrefix(handler.PrivateInbox(h.cfg.Agent)))
	}
	return natsconn.Connect(h.cfg.NATS, opts...)
}

// ask asks Assent about r on nc, which it closes, and waits for the
// decision until ctx ends. It first checks that a broker answers, then
// that one takes r up within BrokerWait; otherwise the error wraps
// ErrNoBroker. When it returns before the decision, the request is
// withdrawn in bg.
func (h *Hook) ask(ctx context.Context, nc *nats.Conn, r handler.Request, log *zap.Logger, bg *sync.WaitGroup) (handler.Decision, error) {
	noDecision := handler.Decision{RequestID: r.ID}
	client, err := handler.NewClient(nc, handler.Config{Agent: r.Agent, TrustedKeys: h.cfg.TrustedKeys, Private: h.cfg.Private, Logger: log})
	if err != nil {
		nc.Close()
		return noDecision, err
	}
	if err := brokerAnswers(ctx, nc, r.Agent, r.ID); err != nil {
		nc.Close()
		return noDecision, err
	}
	type result struct {
		d   handler.Decision
		err error
	}
	results := make(chan result, 1)
	rctx, cancel := context.WithCancelCause(ctx)
	var watch sync.WaitGroup
	defer watch.Wait()
	defer cancel(errors.New("answered"))
	bg.Go(func() {
		defer nc.Close()
		d, err := client.Request(rctx, r)
		results <- result{d, err}
	})
	if h.cfg.BrokerWait > 0 {
		watch.Go(func() { awaitBroker(rctx, nc, r.Agent, r.ID, h.cfg.BrokerWait, cancel) })
	}
	select {
	case res := <-results:
		if res.err != nil && rctx.Err() != nil {
			return noDecision, context.Cause(rctx)
		}
		return res.d, res.err
	case <-rctx.Done():
		select {
		case res := <-results:
			if res.err == nil {
				return res.d, nil
			}
		default:
		}
		return noDecision, context.Cause(rctx)
	}
}

// brokerAnswers checks that a broker answers agent's lookups
// (assent-private.<agent>.lookup.<id>, which agent credentials may ask):
// an error wrapping ErrNoBroker if NATS says nobody listens there.
func brokerAnswers(ctx context.Context, nc *nats.Conn, agent, id string) error {
	_, err := lookup(ctx, nc, agent, id)
	return err
}

// lookup asks the brokers whether one has stored agent's request id.
func lookup(ctx context.Context, nc *nats.Conn, agent, id string) (stored bool, err error) {
	subj, err := events.PrivateSubject(agent, "lookup", id)
	if err != nil {
		return false, err
	}
	ctx, cancel := context.WithTimeout(ctx, opCheck)
	defer cancel()
	m, err := nc.RequestWithContext(ctx, subj, nil)
	switch {
	case errors.Is(err, nats.ErrNoResponders):
		return false, fmt.Errorf("%w: no broker is connected to NATS at %s", ErrNoBroker, nc.ConnectedUrlRedacted())
	case err != nil:
		return false, nil // a slow answer says nothing yet
	}
	st := m.Header.Get(events.LookupStatus)
	return st == events.LookupPending || st == events.LookupDecided, nil
}

// awaitBroker waits until a broker has stored request id, for wait at
// most; if none has by then, or NATS goes away or no broker answers first,
// it calls cancel with an error wrapping ErrNoBroker. It returns when ctx
// ends, at the latest.
func awaitBroker(ctx context.Context, nc *nats.Conn, agent, id string, wait time.Duration, cancel context.CancelCauseFunc) {
	limit := time.NewTimer(wait)
	defer limit.Stop()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-limit.C:
			cancel(fmt.Errorf("%w: no broker took the request up within %s", ErrNoBroker, wait))
			return
		case <-tick.C:
		}
		if !nc.IsConnected() {
			cancel(fmt.Errorf("%w: the connection to NATS was lost (%s)", ErrNoBroker, nc.Status()))
			return
		}
		stored, err := lookup(ctx, nc, agent, id)
		if err != nil {
			cancel(err)
			return
		}
		if stored {
			return
		}
	}
}

// waitUntil waits for wg until deadline at the latest.
func waitUntil(wg *sync.WaitGroup, deadline time.Time) {
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
	}
}
