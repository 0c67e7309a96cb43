package worker

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
)

// Errors about plans, besides the tool errors (ErrUnknownTool, ErrMissingArg,
// ErrBadArg) that a step's tool and args can have.
var (
	// ErrPlanSyntax: the plan is not valid JSON, or not a JSON array.
	ErrPlanSyntax = errors.New("plan is not a JSON array of steps")
	// ErrEmptyPlan: the plan has no steps.
	ErrEmptyPlan = errors.New("plan has no steps")
	// ErrBadStep: a step is not an object, has an unknown field (a misspelt
	// "approval" must not quietly turn a guard off), a field of the wrong type,
	// or no tool.
	ErrBadStep = errors.New("bad step")
)

// Step is one tool call of a plan.
type Step struct {
	// Tool is one of Tools().
	Tool string `json:"tool"`
	// Args is the tool's JSON object of arguments.
	Args json.RawMessage `json:"args,omitempty"`
	// Approval guards the step: it runs only if the broker approves it, and
	// then with the decided args.
	Approval bool `json:"approval"`
	// Hint is shown to approvers.
	Hint string `json:"hint,omitempty"`

	// Line is where the step starts in the plan file (1-based).
	Line int `json:"-"`
}

// Plan is a scripted list of tool calls.
type Plan struct {
	// Name is where the plan came from (a file name), for messages and labels.
	Name  string
	Steps []Step
}

// PlanError is one problem in a plan, with its place.
type PlanError struct {
	Name      string // file name, if known
	Line, Col int    // 1-based; 0 when unknown
	Step      int    // 1-based step number; 0 for the plan as a whole
	Err       error
}

func (e *PlanError) Error() string {
	var b strings.Builder
	b.WriteString(e.Name)
	if e.Line > 0 {
		fmt.Fprintf(&b, ":%d", e.Line)
		if e.Col > 0 {
			fmt.Fprintf(&b, ":%d", e.Col)
		}
	}
	if b.Len() > 0 {
		b.WriteString(": ")
	}
	if e.Step > 0 {
		fmt.Fprintf(&b, "step %d: ", e.Step)
	}
	b.WriteString(e.Err.Error())
	return b.String()
}

func (e *PlanError) Unwrap() error { return e.Err }

// LoadPlan reads and parses the plan file at path.
func LoadPlan(path string) (Plan, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Plan{}, fmt.Errorf("read plan: %w", err)
	}
	return ParsePlan(path, data)
}

// ParsePlan parses a plan: a JSON array of steps, each
// {"tool": ..., "args": {...}, "approval": true|false, "hint": "..."}. It
// reports every problem it finds at once (errors.Join of *PlanError, each
// with file, line, column and step number), wrapping ErrPlanSyntax,
// ErrEmptyPlan, ErrBadStep, ErrUnknownTool, ErrMissingArg or ErrBadArg.
func ParsePlan(name string, data []byte) (Plan, error) {
	plan := Plan{Name: name}
	at := func(off int64, step int, err error) error {
		line, col := position(data, off)
		return &PlanError{Name: name, Line: line, Col: col, Step: step, Err: err}
	}

	var raws []json.RawMessage
	if err := json.Unmarshal(data, &raws); err != nil {
		var se *json.SyntaxError
		var te *json.UnmarshalTypeError
		switch {
		case errors.As(err, &se):
			// The offending byte is the last one read.
			return plan, at(max(se.Offset-1, 0), 0, fmt.Errorf("%w: %v", ErrPlanSyntax, se))
		case errors.As(err, &te):
			return plan, at(firstByte(data, 0), 0, fmt.Errorf("%w: found %s", ErrPlanSyntax, te.Value))
		}
		return plan, at(0, 0, fmt.Errorf("%w: %v", ErrPlanSyntax, err))
	}
	if raws == nil {
		return plan, at(firstByte(data, 0), 0, fmt.Errorf("%w: found null", ErrPlanSyntax))
	}
	if len(raws) == 0 {
		return plan, at(firstByte(data, 0), 0, ErrEmptyPlan)
	}

	// The data is valid JSON now; walk it again for where each step starts.
	starts := make([]int64, 0, len(raws))
	dec := json.NewDecoder(bytes.NewReader(data))
	if _, err := dec.Token(); err != nil { // [
		return plan, at(0, 0, fmt.Errorf("%w: %v", ErrPlanSyntax, err))
	}
	for dec.More() {
		starts = append(starts, firstByte(data, dec.InputOffset()))
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return plan, at(dec.InputOffset(), len(starts), fmt.Errorf("%w: %v", ErrPlanSyntax, err))
		}
	}

	var errs []error
	for i, raw := range raws {
		n, start := i+1, starts[i]
		step, err := parseStep(raw)
		if err != nil {
			off := start
			var te *json.UnmarshalTypeError
			if errors.As(err, &te) {
				off = start + te.Offset
				err = fmt.Errorf("%w: %q must be %s, not %s", ErrBadStep, te.Field, jsonKind(te.Type), te.Value)
			}
			errs = append(errs, at(off, n, err))
			continue
		}
		step.Line, _ = position(data, start)
		if err := CheckArgs(step.Tool, step.Args); err != nil {
			errs = append(errs, at(start, n, fmt.Errorf("%s: %w", step.Tool, err)))
			continue
		}
		plan.Steps = append(plan.Steps, step)
	}
	if len(errs) > 0 {
		return plan, errors.Join(errs...)
	}
	return plan, nil
}

// parseStep decodes one step strictly.
func parseStep(raw json.RawMessage) (Step, error) {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil || fields == nil {
		return Step{}, fmt.Errorf("%w: a step must be a JSON object", ErrBadStep)
	}
	known := argNames(reflect.TypeFor[Step]())
	var unknown []string
	for k := range fields {
		if !slices.Contains(known, k) || k == "-" {
			unknown = append(unknown, strconv.Quote(k))
		}
	}
	if len(unknown) > 0 {
		slices.Sort(unknown)
		return Step{}, fmt.Errorf("%w: unknown field %s (want tool, args, approval, hint)", ErrBadStep, strings.Join(unknown, ", "))
	}
	var s Step
	if err := json.Unmarshal(raw, &s); err != nil {
		return Step{}, err // an UnmarshalTypeError; the caller places it
	}
	if s.Tool == "" {
		return Step{}, fmt.Errorf("%w: missing \"tool\"", ErrBadStep)
	}
	if len(s.Args) > 0 && !bytes.HasPrefix(bytes.TrimSpace(s.Args), []byte("{")) && string(bytes.TrimSpace(s.Args)) != "null" {
		return Step{}, fmt.Errorf("%w: \"args\" must be a JSON object", ErrBadStep)
	}
	return s, nil
}

// position returns the 1-based line and column of byte offset off in data.
func position(data []byte, off int64) (line, col int) {
	if off < 0 {
		off = 0
	}
	if off > int64(len(data)) {
		off = int64(len(data))
	}
	before := data[:off]
	line = bytes.Count(before, []byte("\n")) + 1
	col = int(off) - (bytes.LastIndexByte(before, '\n') + 1) + 1
	return line, col
}

// firstByte returns the offset of the first byte at or after off that is not
// white space or a comma: where the next JSON value starts.
func firstByte(data []byte, off int64) int64 {
	for off < int64(len(data)) {
		switch data[off] {
		case ' ', '\t', '\r', '\n', ',':
			off++
		default:
			return off
		}
	}
	return off
}
