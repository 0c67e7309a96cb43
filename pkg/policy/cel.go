package policy

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"

	"github.com/google/cel-go/cel"
	celast "github.com/google/cel-go/common/ast"
	"github.com/google/cel-go/common/operators"
	"github.com/google/cel-go/common/types"
	"github.com/google/cel-go/common/types/ref"
	"github.com/google/cel-go/ext"
	"github.com/google/cel-go/interpreter"
)

// costLimit bounds the work one CEL evaluation may do, so a condition over a
// large argument (nested comprehensions over a long list) cannot stall the
// broker. An evaluation that exceeds it fails, and failures are fail-closed.
// Tracking the cost triples the price of an evaluation, so expressions whose
// cost is at most linear in the size of the request (see analyze) run without
// it: the event size limit bounds them already.
const costLimit = 1_000_000

// celEnv is the one CEL environment of every policy: the request's fields as
// variables, the standard library, optional types, string extensions, and
// comparisons across int, uint and double.
var celEnv = sync.OnceValues(func() (*cel.Env, error) {
	return cel.NewEnv(
		cel.Variable("tool", cel.StringType),
		cel.Variable("args", cel.MapType(cel.StringType, cel.DynType)),
		cel.Variable("agent", cel.StringType),
		cel.Variable("session", cel.StringType),
		cel.Variable("user", cel.StringType),
		cel.Variable("labels", cel.MapType(cel.StringType, cel.StringType)),
		cel.CrossTypeNumericComparisons(true),
		cel.OptionalTypes(),
		ext.Strings(),
	)
})

// outputKind is what a compiled expression must produce.
type outputKind int

const (
	wantBool outputKind = iota
	wantNumber
)

// compileCEL type-checks expr and plans its program. The returned error message
// is one line, with columns, and wraps ErrBadCEL, ErrNotBool or ErrBadValue.
func compileCEL(expr string, want outputKind) (cel.Program, error) {
	env, err := celEnv()
	if err != nil {
		return nil, fmt.Errorf("%w: environment: %v", ErrBadCEL, err)
	}
	ast, iss := env.Compile(expr)
	if iss != nil && iss.Err() != nil {
		var msgs []string
		for _, e := range iss.Errors() {
			// CEL quotes the offending source, which may span lines; the
			// problem must stay one line behind its file:line.
			msg := strings.Join(strings.Fields(e.Message), " ")
			msgs = append(msgs, fmt.Sprintf("line %d col %d: %s", e.Location.Line(), e.Location.Column()+1, msg))
		}
		return nil, &problem{kind: ErrBadCEL, msg: strings.Join(msgs, "; ")}
	}
	out := ast.OutputType()
	switch want {
	case wantBool:
		if !out.IsExactType(cel.BoolType) && !out.IsExactType(cel.DynType) {
			return nil, &problem{kind: ErrNotBool, msg: fmt.Sprintf("has type %s, want bool", cel.FormatCELType(out))}
		}
	case wantNumber:
		if !out.IsExactType(cel.IntType) && !out.IsExactType(cel.UintType) &&
			!out.IsExactType(cel.DoubleType) && !out.IsExactType(cel.DynType) {
			return nil, &problem{kind: ErrBadValue, msg: fmt.Sprintf("has type %s, want a number", cel.FormatCELType(out))}
		}
	}
	linear, err := analyze(ast)
	if err != nil {
		return nil, err
	}
	opts := []cel.ProgramOption{cel.EvalOptions(cel.OptOptimize)}
	if !linear {
		opts = append(opts, cel.CostLimit(costLimit))
	}
	prg, err := env.Program(ast, opts...)
	if err != nil {
		return nil, &problem{kind: ErrBadCEL, msg: err.Error()}
	}
	return prg, nil
}

// linearFuncs are the functions and operators whose cost grows at most
// linearly with the size of their arguments. matches, with the constant
// pattern analyze insists on, is linear too (RE2).
var linearFuncs = map[string]bool{
	operators.Conditional: true, operators.LogicalAnd: true, operators.LogicalOr: true,
	operators.LogicalNot: true, operators.Equals: true, operators.NotEquals: true,
	operators.Less: true, operators.LessEquals: true, operators.Greater: true,
	operators.GreaterEquals: true, operators.Add: true, operators.Subtract: true,
	operators.Multiply: true, operators.Divide: true, operators.Modulo: true,
	operators.Negate: true, operators.Index: true, operators.OptIndex: true,
	operators.OptSelect: true, operators.In: true,
	"size": true, "startsWith": true, "endsWith": true, "contains": true,
	"lowerAscii": true, "upperAscii": true, "trim": true,
	"int": true, "uint": true, "double": true, "string": true, "bool": true, "dyn": true, "type": true,
	"matches":     true,
	"optional.of": true, "optional.ofNonZeroValue": true, "optional.none": true,
	"orValue": true, "hasValue": true, "value": true, "or": true,
}

// analyze checks what a condition calls. matches needs a constant pattern
// (an agent must not choose the regular expression, and a constant one is
// compiled once) and replace constant arguments (its output can otherwise grow
// with the product of the sizes of its inputs); else the error wraps ErrBadCEL.
// linear reports whether the cost is at most linear in the size of the input:
// no comprehensions and only linearFuncs.
func analyze(a *cel.Ast) (linear bool, err error) {
	linear = true
	celast.PreOrderVisit(a.NativeRep().Expr(), celast.NewExprVisitor(func(e celast.Expr) {
		switch e.Kind() {
		case celast.ComprehensionKind:
			linear = false
		case celast.CallKind:
			c := e.AsCall()
			args := c.Args()
			switch fn := c.FunctionName(); fn {
			case "matches":
				if len(args) == 0 || args[len(args)-1].Kind() != celast.LiteralKind {
					err = &problem{kind: ErrBadCEL, msg: "matches: the pattern must be a string literal"}
				}
			case "replace":
				for _, arg := range args {
					if arg.Kind() != celast.LiteralKind {
						err = &problem{kind: ErrBadCEL, msg: "replace: the old and new strings (and count) must be literals"}
					}
				}
				linear = false
			default:
				if !linearFuncs[fn] {
					linear = false
				}
			}
		}
	}))
	return linear, err
}

// problem is an error with its own message that unwraps to a sentinel.
type problem struct {
	kind error
	msg  string
}

func (p *problem) Error() string { return p.msg }
func (p *problem) Unwrap() error { return p.kind }

// activation binds the CEL variables to one request. It is built once per
// evaluation and shared by every condition evaluated for that request. The
// args are bound when a condition first reads them.
type activation struct {
	tool, args, agent, session, user, labels ref.Val
	in                                       *Input
}

var _ interpreter.Activation = (*activation)(nil)

func newActivation(in *Input) *activation {
	a := &activation{
		tool:    types.String(in.Tool),
		agent:   types.String(in.Agent),
		session: types.String(in.Session),
		user:    types.String(in.User),
		in:      in,
	}
	a.labels = emptyLabels
	if in.Labels != nil {
		a.labels = types.DefaultTypeAdapter.NativeToValue(in.Labels)
	}
	return a
}

// argsVal binds args: the decoded args, empty if there are none, or an
// error value (which fails the condition) if they do not decode.
func (a *activation) argsVal() ref.Val {
	if a.args == nil {
		switch args, err := a.in.args(); {
		case err != nil:
			a.args = types.NewErr("%v", err)
		case args == nil:
			a.args = emptyArgs
		default:
			a.args = types.DefaultTypeAdapter.NativeToValue(args)
		}
	}
	return a.args
}

// Bindings for absent args and labels; CEL values are immutable.
var (
	emptyArgs   = types.DefaultTypeAdapter.NativeToValue(map[string]any{})
	emptyLabels = types.DefaultTypeAdapter.NativeToValue(map[string]string{})
)

// ResolveName implements interpreter.Activation.
func (a *activation) ResolveName(name string) (any, bool) {
	switch name {
	case "tool":
		return a.tool, true
	case "args":
		return a.argsVal(), true
	case "agent":
		return a.agent, true
	case "session":
		return a.session, true
	case "user":
		return a.user, true
	case "labels":
		return a.labels, true
	}
	return nil, false
}

// Parent implements interpreter.Activation.
func (a *activation) Parent() interpreter.Activation { return nil }

// evalBool runs a condition. A non-bool result is an error.
func evalBool(prg cel.Program, act *activation) (bool, error) {
	out, _, err := prg.Eval(act)
	if err != nil {
		return false, err
	}
	b, ok := out.(types.Bool)
	if !ok {
		return false, fmt.Errorf("condition gave %s, want bool", out.Type().(ref.Type).TypeName())
	}
	return bool(b), nil
}

// evalNumber runs a limit's sum expression.
func evalNumber(prg cel.Program, act *activation) (float64, error) {
	out, _, err := prg.Eval(act)
	if err != nil {
		return 0, err
	}
	var f float64
	switch v := out.(type) {
	case types.Int:
		f = float64(v)
	case types.Uint:
		f = float64(v)
	case types.Double:
		f = float64(v)
	default:
		return 0, fmt.Errorf("sum gave %s, want a number", out.Type().(ref.Type).TypeName())
	}
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return 0, errors.New("sum is not a finite number")
	}
	return f, nil
}
