package events

import (
	"encoding/json"
	"reflect"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// Validating a value against a JSON Schema can take time exponential in the
// size of both: a schema a few hundred bytes long that applies itself twice
// to each level of nested arrays (through anyOf and $ref) takes seconds for
// args 20 levels deep and forever for 40, and the schema library cannot be
// stopped once it started. An input schema and the args checked against it
// both come from an agent (or an MCP server), so before validating,
// CheckArgs bounds the work: validationCost counts, from above, the
// (subschema, value) pairs the validator can visit, each weighted by the
// size of the value where a keyword reads all of it (pattern, enum, const,
// format, uniqueItems), and args whose count is over the budget are
// refused unchecked.

// Validation budget: baseValidationBudget units, plus perNodeBudget per
// value in the args, so that large args with a plain schema pass; at most
// maxValidationBudget. A unit is one (subschema, value) pair the validator
// may visit, or about sizeUnit bytes a keyword reads; one takes a
// microsecond or less.
const (
	baseValidationBudget = 200_000
	perNodeBudget        = 8
	maxValidationBudget  = 1_000_000
	sizeUnit             = 64
)

// maxArgsDepth bounds how deep args checked against a schema may nest (the
// args object itself is depth 1): each problem the validator finds keeps
// its path, so deep args make its work and memory grow with the square of
// their depth. Tools' arguments nest a few levels.
const maxArgsDepth = MaxSchemaDepth

// validationBudget returns the budget for validating inst, and how deep
// inst nests.
func validationBudget(inst any) (budget int64, depth int) {
	n, depth := shape(inst)
	return min(baseValidationBudget+perNodeBudget*int64(n), maxValidationBudget), depth
}

// shape counts the values in v, v included, and how deep they nest.
func shape(v any) (nodes, depth int) {
	nodes = 1
	deepest := 0
	switch v := v.(type) {
	case map[string]any:
		for _, x := range v {
			n, d := shape(x)
			nodes, deepest = nodes+n, max(deepest, d)
		}
	case []any:
		for _, x := range v {
			n, d := shape(x)
			nodes, deepest = nodes+n, max(deepest, d)
		}
	default:
		return 1, 0
	}
	return nodes, deepest + 1
}

// costKey names a (subschema, value) pair. A container is named by its
// address (and length); a scalar by its kind and size alone, since what
// validating one costs depends on nothing else.
type costKey struct {
	s     *jsonschema.Schema
	p     uintptr
	kind  byte
	n     int
	depth int
}

// costWalk computes validationCost, remembering each pair's cost.
type costWalk struct {
	budget int64
	memo   map[costKey]int64
	active map[costKey]bool
	spent  int64 // pairs computed: the walk's own work
}

// validationCost returns an upper bound of the work of validating inst
// against sch, in budget units, or budget+1 once it is over budget. sch
// must not use $dynamicRef or $recursiveRef (dynamicRefs).
func validationCost(sch *jsonschema.Schema, inst any, budget int64) int64 {
	w := &costWalk{budget: budget, memo: make(map[costKey]int64), active: make(map[costKey]bool)}
	return w.cost(sch, inst, 0)
}

// dynamicRefs reports whether a schema reachable from sch uses
// $dynamicRef or $recursiveRef. Where those lead is decided while
// validating, by the schemas entered on the way, so validationCost cannot
// bound what they cost.
func dynamicRefs(sch *jsonschema.Schema) bool {
	seen := make(map[*jsonschema.Schema]bool)
	var visit func(x *jsonschema.Schema) bool
	visit = func(x *jsonschema.Schema) bool {
		if x == nil || seen[x] {
			return false
		}
		seen[x] = true
		if x.DynamicRef != nil || x.RecursiveRef != nil {
			return true
		}
		for _, y := range children(x) {
			if visit(y) {
				return true
			}
		}
		return false
	}
	return visit(sch)
}

// keyOf names the pair of s and v, at depth in the args.
func keyOf(s *jsonschema.Schema, v any, depth int) costKey {
	switch v := v.(type) {
	case map[string]any:
		return costKey{s: s, p: reflect.ValueOf(v).Pointer(), kind: 'o', n: len(v), depth: depth}
	case []any:
		return costKey{s: s, p: reflect.ValueOf(v).Pointer(), kind: 'a', n: len(v), depth: depth}
	case string:
		return costKey{s: s, kind: 's', n: len(v), depth: depth}
	case json.Number:
		return costKey{s: s, kind: 'n', n: len(v), depth: depth}
	case bool:
		return costKey{s: s, kind: 'b', depth: depth}
	case nil:
		return costKey{s: s, kind: 'z', depth: depth}
	}
	return costKey{s: s, kind: '?', depth: depth}
}

// size returns about how many bytes v takes as JSON.
func size(v any) int {
	switch v := v.(type) {
	case map[string]any:
		n := 2
		for k, x := range v {
			n += len(k) + 4 + size(x)
		}
		return n
	case []any:
		n := 2
		for _, x := range v {
			n += 1 + size(x)
		}
		return n
	case string:
		return len(v) + 2
	case json.Number:
		return len(v)
	}
	return 4
}

// add returns a+b, kept at most w.budget+1.
func (w *costWalk) add(a, b int64) int64 {
	if a+b > w.budget {
		return w.budget + 1
	}
	return a + b
}

func (w *costWalk) over(c int64) bool { return c > w.budget }

// cost bounds the work of validating v against s: s itself, and every
// subschema the validator may apply to v or to a value inside it, all
// counted as if each were visited (the validator stops earlier on some
// failures, never later).
func (w *costWalk) cost(s *jsonschema.Schema, v any, depth int) int64 {
	if s == nil {
		return 0
	}
	if s.Bool != nil {
		return 1
	}
	if scalar(v) && !appliesHere(s) {
		// Nothing to remember: it costs what its own keywords do.
		if w.spent++; w.spent > w.budget {
			return w.budget + 1
		}
		return w.own(s, v, depth)
	}
	k := keyOf(s, v, depth)
	if c, ok := w.memo[k]; ok {
		return c
	}
	if w.active[k] {
		// A cycle of references that never moves into the value: the
		// validator reports it where it closes, but what it visited
		// depends on where it entered, which the memo does not keep
		// apart. No schema needs one: refuse it as over budget.
		return w.budget + 1
	}
	if w.spent++; w.spent > w.budget {
		return w.budget + 1
	}
	w.active[k] = true
	c := w.own(s, v, depth)
	for _, sub := range w.here(s, v) {
		if c = w.add(c, w.cost(sub, v, depth)); w.over(c) {
			break
		}
	}
	if !w.over(c) {
		c = w.add(c, w.inside(s, v, depth))
	}
	delete(w.active, k)
	w.memo[k] = c
	return c
}

// own is what s's own keywords cost on v, at depth in the args: one unit;
// the size of v where a keyword reads all of it; the number of entries
// of a container, which the validator copies to track the unevaluated
// ones; and the depth, since each problem found keeps its path.
func (w *costWalk) own(s *jsonschema.Schema, v any, depth int) int64 {
	base := int64(1 + depth/4)
	switch v := v.(type) {
	case map[string]any:
		base += int64(len(v) / 16)
	case []any:
		base += int64(len(v) / 16)
	}
	reads := 0
	if s.Const != nil {
		reads++
	}
	if s.Enum != nil {
		reads += len(s.Enum.Values)
	}
	if s.Format != nil {
		reads++
	}
	switch v.(type) {
	case string:
		if s.Pattern != nil {
			reads++
		}
		if s.MinLength != nil || s.MaxLength != nil {
			reads++
		}
	case []any:
		if s.UniqueItems {
			reads++
		}
	case map[string]any:
		// Each pattern is matched against each property name.
		reads += len(s.PatternProperties)
		if len(s.Required) > 0 || len(s.DependentRequired) > 0 || len(s.Dependencies) > 0 {
			reads++
		}
	}
	if reads == 0 {
		return base
	}
	return w.add(base, int64(reads)*int64(1+size(v)/sizeUnit))
}

func scalar(v any) bool {
	switch v.(type) {
	case map[string]any, []any:
		return false
	}
	return true
}

// appliesHere reports whether s may apply a subschema to a value that is
// not an object.
func appliesHere(s *jsonschema.Schema) bool {
	return s.Ref != nil || s.Not != nil || s.If != nil || s.Then != nil || s.Else != nil ||
		len(s.AllOf) > 0 || len(s.AnyOf) > 0 || len(s.OneOf) > 0
}

// here returns the subschemas the validator may apply to v itself.
func (w *costWalk) here(s *jsonschema.Schema, v any) []*jsonschema.Schema {
	var subs []*jsonschema.Schema
	subs = append(subs, s.Ref, s.Not, s.If, s.Then, s.Else)
	subs = append(subs, s.AllOf...)
	subs = append(subs, s.AnyOf...)
	subs = append(subs, s.OneOf...)
	if obj, ok := v.(map[string]any); ok {
		for name, dep := range s.Dependencies {
			if d, ok := dep.(*jsonschema.Schema); ok {
				if _, present := obj[name]; present {
					subs = append(subs, d)
				}
			}
		}
		for name, d := range s.DependentSchemas {
			if _, present := obj[name]; present {
				subs = append(subs, d)
			}
		}
	}
	return subs
}

// inside returns the cost of the subschemas the validator may apply to the
// values inside v (properties, items, property names).
func (w *costWalk) inside(s *jsonschema.Schema, v any, depth int) int64 {
	var c int64
	depth++
	switch v := v.(type) {
	case map[string]any:
		for name, x := range v {
			matched := false
			if sub, ok := s.Properties[name]; ok {
				matched = true
				c = w.add(c, w.cost(sub, x, depth))
			}
			for re, sub := range s.PatternProperties {
				if re.MatchString(name) {
					matched = true
					c = w.add(c, w.cost(sub, x, depth))
				}
			}
			if sub, ok := s.AdditionalProperties.(*jsonschema.Schema); ok && !matched {
				c = w.add(c, w.cost(sub, x, depth))
			}
			if s.PropertyNames != nil {
				c = w.add(c, w.cost(s.PropertyNames, name, depth))
			}
			if s.UnevaluatedProperties != nil {
				c = w.add(c, w.cost(s.UnevaluatedProperties, x, depth))
			}
			if w.over(c) {
				return c
			}
		}
	case []any:
		for i, x := range v {
			switch items := s.Items.(type) {
			case *jsonschema.Schema:
				c = w.add(c, w.cost(items, x, depth))
			case []*jsonschema.Schema:
				if i < len(items) {
					c = w.add(c, w.cost(items[i], x, depth))
				}
			}
			if sub, ok := s.AdditionalItems.(*jsonschema.Schema); ok {
				c = w.add(c, w.cost(sub, x, depth))
			}
			if i < len(s.PrefixItems) {
				c = w.add(c, w.cost(s.PrefixItems[i], x, depth))
			}
			for _, sub := range []*jsonschema.Schema{s.Items2020, s.Contains, s.UnevaluatedItems} {
				if sub != nil {
					c = w.add(c, w.cost(sub, x, depth))
				}
			}
			if w.over(c) {
				return c
			}
		}
	}
	return c
}

// children returns every subschema s holds.
func children(s *jsonschema.Schema) []*jsonschema.Schema {
	out := []*jsonschema.Schema{s.Ref, s.Not, s.If, s.Then, s.Else, s.PropertyNames,
		s.UnevaluatedProperties, s.Contains, s.Items2020, s.UnevaluatedItems, s.ContentSchema}
	out = append(out, s.AllOf...)
	out = append(out, s.AnyOf...)
	out = append(out, s.OneOf...)
	out = append(out, s.PrefixItems...)
	for _, x := range s.Properties {
		out = append(out, x)
	}
	for _, x := range s.PatternProperties {
		out = append(out, x)
	}
	for _, x := range s.DependentSchemas {
		out = append(out, x)
	}
	for _, x := range s.Dependencies {
		if x, ok := x.(*jsonschema.Schema); ok {
			out = append(out, x)
		}
	}
	for _, x := range []any{s.AdditionalProperties, s.AdditionalItems, s.Items} {
		switch x := x.(type) {
		case *jsonschema.Schema:
			out = append(out, x)
		case []*jsonschema.Schema:
			out = append(out, x...)
		}
	}
	return out
}
