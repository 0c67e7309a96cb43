package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"time"

	"go.uber.org/zap"

	"github.com/assent-dev/assent/pkg/events"
	"github.com/assent-dev/assent/pkg/handler"
)

// Requester asks the broker to decide a request; *handler.Client is one.
type Requester interface {
	Request(ctx context.Context, req handler.Request) (handler.Decision, error)
}

// ErrStepsFailed is returned by RunPlan when at least one step that should
// have run did not: its tool failed, its args were refused before asking, its
// decision failed verification, or the request itself failed. Denied, expired,
// cancelled and undecided steps are not failures.
var ErrStepsFailed = errors.New("plan steps failed")

// Outcome is how one step of a plan ended.
type Outcome string

// Step outcomes. A guarded step ends with the broker's outcome (approved,
// denied, expired, cancelled) or one of no_decision, rejected, error and
// interrupted; an unguarded one with unguarded (or interrupted).
const (
	OutcomeUnguarded   Outcome = "unguarded" // no approval asked for
	OutcomeApproved    Outcome = Outcome(events.Approved)
	OutcomeDenied      Outcome = Outcome(events.Denied)
	OutcomeExpired     Outcome = Outcome(events.Expired)
	OutcomeCancelled   Outcome = Outcome(events.Cancelled)
	OutcomeNoDecision  Outcome = "no_decision" // the wait ended without a decision
	OutcomeRejected    Outcome = "rejected"    // args refused before asking (bad path, ...)
	OutcomeError       Outcome = "error"       // the request could not be made
	OutcomeInterrupted Outcome = "interrupted" // the run was stopped (Ctrl-C)
)

// StepReport is what happened to one step. It marshals to one JSON line.
type StepReport struct {
	Step      int     `json:"step"`
	Tool      string  `json:"tool"`
	RequestID string  `json:"request_id,omitempty"`
	Outcome   Outcome `json:"outcome"`
	Reason    string  `json:"reason,omitempty"`
	// DecidedBy lists the principals who answered.
	DecidedBy []string `json:"decided_by,omitempty"`
	// Edited: the decision's args differ from the plan's.
	Edited bool `json:"edited"`
	// Executed: the tool ran and succeeded.
	Executed bool `json:"executed"`
	// Failed: the step should have run and did not (see ErrStepsFailed).
	Failed bool `json:"failed"`
	// Args are the args the tool ran with (the decided ones for a guarded
	// step), or the plan's when it did not run.
	Args   json.RawMessage `json:"args,omitempty"`
	Result Result          `json:"result,omitempty"`
	Error  string          `json:"error,omitempty"`
	// Err is Error as an error, for errors.Is.
	Err error `json:"-"`
}

// Summary counts the steps of a plan run.
type Summary struct {
	Steps    int `json:"steps"`    // in the plan
	Executed int `json:"executed"` // ran and succeeded
	Declined int `json:"declined"` // denied, expired, cancelled or undecided: not run, by design
	Failed   int `json:"failed"`   // should have run and did not
	NotRun   int `json:"not_run"`  // interrupted, or not reached because the run stopped
}

// AgentConfig holds an Agent's settings.
type AgentConfig struct {
	// Session groups one run's requests for approvers ("approve the whole
	// session"). Default: a new id per RunPlan.
	Session string
	// User is on whose behalf the agent acts; the broker may forbid that user
	// approving their own requests.
	User string
	// Timeout is asked for each guarded step. Default 2m; the broker clamps it.
	Timeout time.Duration
	// Labels are added to every request, beside "plan" and "step".
	Labels map[string]string
}

// WithDefaults returns c with unset fields at their defaults.
func (c AgentConfig) WithDefaults() AgentConfig {
	if c.Timeout == 0 {
		c.Timeout = 2 * time.Minute
	}
	return c
}

// Validate reports every problem with c at once.
func (c AgentConfig) Validate() error {
	var errs []error
	if c.Timeout <= 0 || c.Timeout > events.MaxTimeout {
		errs = append(errs, fmt.Errorf("timeout %s: want more than 0 and at most %s", c.Timeout, events.MaxTimeout))
	}
	// The rest is checked by the request's own validation; check it here
	// too so that a bad flag fails before the first step, not at it.
	req := events.Requested{Tool: "x", Session: c.Session, User: c.User, Labels: c.Labels}
	if err := req.Validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Agent runs plans in a sandbox, asking before every guarded step.
type Agent struct {
	req Requester
	sb  *Sandbox
	cfg AgentConfig
	log *zap.Logger
}

// NewAgent returns an agent that asks req and works in sb. A nil logger logs
// nothing.
func NewAgent(req Requester, sb *Sandbox, cfg AgentConfig, log *zap.Logger) (*Agent, error) {
	if req == nil || sb == nil {
		return nil, errors.New("worker: NewAgent needs a Requester and a Sandbox")
	}
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("agent config: %w", err)
	}
	if log == nil {
		log = zap.NewNop()
	}
	return &Agent{req: req, sb: sb, cfg: cfg, log: log.Named("agent")}, nil
}

// RunPlan runs plan's steps in order and calls report (if not nil) with each
// step's outcome as soon as it is known. Steps after a denied or failed one
// still run. If ctx ends, the step in flight is reported as interrupted (a
// guarded one's request is cancelled), no further step runs, and ctx's error
// is returned. Otherwise, if any step failed, an error wrapping
// ErrStepsFailed is returned.
func (a *Agent) RunPlan(ctx context.Context, plan Plan, report func(StepReport)) (Summary, error) {
	session := a.cfg.Session
	if session == "" {
		session = events.NewID()
	}
	log := a.log.With(zap.String("plan", plan.Name), zap.String("session", session))
	sum := Summary{Steps: len(plan.Steps)}
	for i, step := range plan.Steps {
		n := i + 1
		if err := ctx.Err(); err != nil {
			sum.NotRun = sum.Steps - i
			return sum, fmt.Errorf("plan stopped before step %d: %w", n, err)
		}
		r := a.runStep(ctx, log, plan.Name, session, n, step)
		switch {
		case r.Executed:
			sum.Executed++
		case r.Failed:
			sum.Failed++
		case r.Outcome == OutcomeInterrupted:
			sum.NotRun = sum.Steps - i
		default:
			sum.Declined++
		}
		if report != nil {
			report(r)
		}
		if r.Outcome == OutcomeInterrupted {
			return sum, fmt.Errorf("plan stopped at step %d: %w", n, r.Err)
		}
	}
	if sum.Failed > 0 {
		return sum, fmt.Errorf("%w: %d of %d", ErrStepsFailed, sum.Failed, sum.Steps)
	}
	return sum, nil
}

func (a *Agent) runStep(ctx context.Context, log *zap.Logger, planName, session string, n int, step Step) (r StepReport) {
	r = StepReport{Step: n, Tool: step.Tool, Args: step.Args}
	log = log.With(zap.Int("step", n), zap.String("tool", step.Tool))
	defer func() { // r is the named result: this fills in what is returned
		if r.Err != nil {
			r.Error = r.Err.Error()
		}
		log.Info("step done", zap.String("request_id", r.RequestID), zap.String("outcome", string(r.Outcome)),
			zap.Bool("edited", r.Edited), zap.Bool("executed", r.Executed), zap.Error(r.Err))
	}()

	if !step.Approval {
		r.Outcome = OutcomeUnguarded
		a.exec(ctx, &r, step.Args)
		return r
	}
	// Do not trouble an approver with a call the sandbox would refuse.
	if err := a.sb.Check(step.Tool, step.Args); err != nil {
		r.Outcome, r.Err, r.Failed = OutcomeRejected, err, true
		return r
	}

	r.RequestID = events.NewID()
	labels := map[string]string{"plan": truncate(filepath.Base(planName), events.MaxLabelLength), "step": strconv.Itoa(n)}
	for k, v := range a.cfg.Labels {
		labels[k] = v
	}
	log.Info("asking for approval", zap.String("request_id", r.RequestID))
	d, err := a.req.Request(ctx, handler.Request{ID: r.RequestID, Requested: events.Requested{
		Tool:    step.Tool,
		Args:    step.Args,
		Session: session,
		User:    a.cfg.User,
		CallID:  "step-" + strconv.Itoa(n),
		Hint:    step.Hint,
		Timeout: events.Duration(a.cfg.Timeout),
		Labels:  labels,
	}})
	switch {
	case err == nil:
	case ctx.Err() != nil:
		r.Outcome, r.Err = OutcomeInterrupted, err
		return r
	case errors.Is(err, handler.ErrNoDecision):
		r.Outcome, r.Reason = OutcomeNoDecision, err.Error()
		return r
	default:
		r.Outcome, r.Err, r.Failed = OutcomeError, err, true
		return r
	}

	r.Outcome, r.Reason = Outcome(d.Outcome), d.Reason
	for _, by := range d.DecidedBy {
		r.DecidedBy = append(r.DecidedBy, by.Principal)
	}
	r.Edited = d.Edited || !sameArgs(step.Args, d.Args)
	if !d.Approved() {
		return r
	}
	// Run exactly what was approved, and only if it is what was approved.
	if d.RequestID != r.RequestID {
		r.Err, r.Failed = fmt.Errorf("%w: decision names request %s", handler.ErrTampered, d.RequestID), true
		return r
	}
	if err := d.VerifyArgs(); err != nil {
		r.Err, r.Failed = fmt.Errorf("%w: %w", handler.ErrTampered, err), true
		return r
	}
	r.Args = d.Args
	a.exec(ctx, &r, d.Args)
	return r
}

// exec runs the step's tool with args and records the result in r.
func (a *Agent) exec(ctx context.Context, r *StepReport, args json.RawMessage) {
	res, err := a.sb.Exec(ctx, r.Tool, args)
	switch {
	case err == nil:
		r.Result, r.Executed = res, true
	case ctx.Err() != nil && errors.Is(err, ctx.Err()):
		r.Outcome, r.Err = OutcomeInterrupted, err
	default:
		r.Err, r.Failed = err, true
	}
}

// sameArgs reports whether a and b are the same JSON object, whatever the
// key order and spacing.
func sameArgs(a, b json.RawMessage) bool {
	ca, err1 := events.CanonicalArgs(a)
	cb, err2 := events.CanonicalArgs(b)
	return err1 == nil && err2 == nil && string(ca) == string(cb)
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}
