package hook

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/assent-dev/assent/pkg/events"
	"github.com/assent-dev/assent/pkg/handler"
)

// Verdict is what the hook tells the agent about a call: run it or not, and
// why. The reason of a denial is written for the agent's model, which reads
// it as the tool's result: what happened and what to do next.
type Verdict struct {
	// Allow runs the call.
	Allow bool
	// Input, with Allow, is the input to run in place of the asked one: the
	// arguments an approver edited.
	Input json.RawMessage
	// Reason says why, naming who or which rule decided and the Assent
	// request.
	Reason string
}

// Decided is the verdict on c of Assent's decision d: approved runs (the
// decided arguments, if an approver changed them and the dialect can say
// so), anything else does not.
func (d Dialect) Decided(c Call, dec handler.Decision) Verdict {
	ref := fmt.Sprintf("Assent request %s", dec.RequestID)
	reason := ""
	if dec.Reason != "" {
		reason = fmt.Sprintf(": %q", dec.Reason)
	}
	switch dec.Outcome {
	case events.Approved:
		edited := editedArgs(c.Input, dec.Args)
		switch {
		case edited == nil:
			return Verdict{Allow: true, Reason: fmt.Sprintf("Approved in Assent by %s (%s).", deciders(dec), ref)}
		case d.carries(c.Input, edited):
			return Verdict{Allow: true, Input: edited, Reason: fmt.Sprintf("Approved in Assent by %s with changed arguments, which are what runs (%s).", deciders(dec), ref)}
		default:
			return Verdict{Reason: fmt.Sprintf("Not run: %s approved this %s call in Assent only with changed arguments, which this hook cannot pass on to %s. "+
				"If it is still wanted, call %s again with exactly these arguments: %s (%s).", deciders(dec), c.Tool, d.Title, c.Tool, edited, ref)}
		}
	case events.Denied:
		return Verdict{Reason: fmt.Sprintf("Not run: %s denied this %s call in Assent%s. Do not try it again unchanged; tell the user, or ask how to go on (%s).",
			deciders(dec), c.Tool, reason, ref)}
	case events.Expired:
		return Verdict{Reason: fmt.Sprintf("Not run: nobody approved this %s call in Assent in time%s. Ask the user to approve it (on Assent's page, in Slack or by email) when you call it again (%s).",
			c.Tool, reason, ref)}
	case events.Cancelled:
		return Verdict{Reason: fmt.Sprintf("Not run: the Assent request for this %s call was cancelled%s (%s).", c.Tool, reason, ref)}
	}
	return Verdict{Reason: fmt.Sprintf("Not run: Assent ended this %s call %q%s (%s).", c.Tool, dec.Outcome, reason, ref)}
}

// Failed is the verdict on c when Assent did not decide it: the call does
// not run. what says why; next what the agent can do about it.
func (d Dialect) Failed(c Call, what, next string) Verdict {
	tool := "this"
	if c.Tool != "" {
		tool = "this " + c.Tool
	}
	return Verdict{Reason: fmt.Sprintf("Not run: %s call was not approved, because %s. Nothing runs without Assent's approval: %s", tool, what, next)}
}

// editedArgs returns the decided args when they differ from the asked ones
// (an approver edited them), else nil.
func editedArgs(asked, decided json.RawMessage) json.RawMessage {
	if events.EmptyJSON(decided) {
		return nil
	}
	a, errA := events.ArgsDigest(asked)
	b, errB := events.ArgsDigest(decided)
	if errA == nil && errB == nil && a == b {
		return nil
	}
	return decided
}

// deciders names who decided dec: the principals and their channels, or
// the policy rule or remembered choice.
func deciders(dec handler.Decision) string {
	if dec.Auto || len(dec.DecidedBy) == 0 {
		if id, ok := strings.CutPrefix(dec.Rule, "remembered:"); ok {
			return "a remembered choice (" + id + ")"
		}
		if mode, ok := strings.CutPrefix(dec.Rule, "mode:"); ok {
			return "the broker's " + mode + " mode"
		}
		if dec.Rule != "" {
			return "policy rule " + dec.Rule
		}
		return "policy"
	}
	names := make([]string, len(dec.DecidedBy))
	for i, by := range dec.DecidedBy {
		names[i] = by.Principal
		if by.Channel != "" {
			names[i] += " (" + by.Channel + ")"
		}
	}
	by := strings.Join(names, ", ")
	if dec.Rule != "" && !strings.HasPrefix(dec.Rule, "mode:") {
		by += " under rule " + dec.Rule
	}
	return by
}
