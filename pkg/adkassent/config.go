package adkassent

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/assent-dev/assent/pkg/events"
)

// Errors the Runner reports; branch on them with errors.Is. Errors of the
// SDK (handler.ErrNoDecision, handler.ErrIDConflict, a context's) come
// through wrapped as well.
var (
	// ErrNotApproved: a tool was about to run on a confirmation that Assent
	// did not give through this Runner, or that says otherwise than Assent's
	// decision. The tool does not run; its result is this error.
	ErrNotApproved = errors.New("confirmation not approved through Assent")
	// ErrPayload: an approved decision's payload (or, without one, the
	// tool's proposal) does not fit the request's response_schema. The
	// confirmation is answered confirmed=false.
	ErrPayload = errors.New("payload does not fit the response schema")
	// ErrUnanswered: a confirmation could not be asked or got no decision
	// (the broker unreachable, the context ended). It is left unanswered in
	// the session, for Resume.
	ErrUnanswered = errors.New("confirmation left unanswered")
	// ErrMalformed: an adk_request_confirmation call without a readable
	// original call.
	ErrMalformed = errors.New("malformed confirmation call")
)

// Config configures a Runner.
type Config struct {
	// Agent is the Assent agent the requests are made as (a subject token).
	// Required.
	Agent string
	// Timeout is asked for on every request; zero leaves it to the broker's
	// default. The broker clamps it to its policy.
	Timeout time.Duration
	// Labels go on every request, for policy rules to match.
	Labels map[string]string
	// Schemas gives a tool's response_schema by tool name (SchemaFor makes
	// one from a Go type). A tool without one that proposes a payload asks
	// with the schema SchemaOf derives from the proposal.
	Schemas map[string]json.RawMessage
	// Hints gives, by tool name, what approvers read for a tool whose
	// confirmation carries ADK's stock text (RequireConfirmation and
	// RequireConfirmationProvider tools ask the app, not a person, to
	// "respond with a FunctionResponse"). A tool without one is asked as
	// "Run <tool>?". A hint the tool gave RequestConfirmation itself is
	// always kept.
	Hints map[string]string
	// KeepOnStop leaves a request pending when Run's or Resume's context
	// ends before its decision (handler.Request.Keep): Resume then picks up
	// the decision made meanwhile. By default the request is withdrawn
	// (cancelled), as the SDK does for any caller that stops waiting. A
	// crash leaves it pending either way.
	KeepOnStop bool
	// Logger; nil logs nothing.
	Logger *zap.Logger
}

// maxTimeout is the longest timeout a request may ask for (docs/protocol.md).
const maxTimeout = 720 * time.Hour

// Validate reports every problem with c at once.
func (c Config) Validate() error {
	var errs []error
	if err := events.CheckToken("agent", c.Agent); err != nil {
		errs = append(errs, err)
	}
	if c.Timeout < 0 || c.Timeout > maxTimeout {
		errs = append(errs, fmt.Errorf("timeout %s: want 0 to %s", c.Timeout, maxTimeout))
	}
	if len(c.Labels) > 0 {
		probe := events.Requested{Tool: "probe", Labels: c.Labels}
		if err := probe.Validate(); err != nil {
			errs = append(errs, fmt.Errorf("labels: %w", err))
		}
	}
	for tool, schema := range c.Schemas {
		if _, err := events.CompileSchema(schema); err != nil {
			errs = append(errs, fmt.Errorf("schemas[%s]: %w", tool, err))
		}
	}
	return errors.Join(errs...)
}

// withDefaults returns c with every unset field at its default.
func (c Config) withDefaults() Config {
	if c.Logger == nil {
		c.Logger = zap.NewNop()
	}
	return c
}
