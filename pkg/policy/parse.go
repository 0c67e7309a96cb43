package policy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/assent-dev/assent/pkg/events"
	"gopkg.in/yaml.v3"
)

// maxAliases bounds how many YAML alias references one file may follow, so a
// file of aliases to aliases cannot make parsing explode.
const maxAliases = 1000

// Parse reads and validates a policy file. filename is used in error messages
// only. Every problem found is reported at once: the error joins one *Error per
// problem, in line order, each matching ErrInvalid and a sentinel naming the
// kind of problem (ErrUnknownField, ErrBadGlob, ErrBadCEL, ...). CEL conditions
// are compiled here, once.
func Parse(data []byte, filename string) (*Policy, error) {
	if filename == "" {
		filename = "policy.yaml"
	}
	ps := &parser{file: filename}
	p := ps.parse(data)
	if len(ps.errs) > 0 {
		slices.SortStableFunc(ps.errs, func(a, b *Error) int { return a.Line - b.Line })
		errs := make([]error, len(ps.errs))
		for i, e := range ps.errs {
			errs[i] = e
		}
		return nil, errors.Join(errs...)
	}
	p.finish()
	return p, nil
}

type parser struct {
	file         string
	errs         []*Error
	aliases      int
	aliasesSaid  bool
	ruleNames    map[string]*Rule
	limitNames   map[string]*Limit
	identityUser map[string]string
}

// add records a problem at n.
func (ps *parser) add(n *yaml.Node, path string, kind error, format string, args ...any) {
	line := 1
	if n != nil && n.Line > 0 {
		line = n.Line
	}
	ps.errs = append(ps.errs, &Error{File: ps.file, Line: line, Path: path, Msg: fmt.Sprintf(format, args...), Err: kind})
}

var yamlLine = regexp.MustCompile(`^yaml: line (\d+): `)

// document decodes data into its single YAML document's root node.
func (ps *parser) document(data []byte) (root *yaml.Node) {
	defer func() {
		// yaml.v3 is not known to panic on v3.0.1, but a policy file is operator
		// input and a panic here would take the broker down on reload.
		if r := recover(); r != nil {
			ps.add(nil, "", ErrSyntax, "YAML parser failed: %v", r)
			root = nil
		}
	}()
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			ps.add(nil, "", ErrMissingField, "empty policy: want at least \"version: 1\"")
			return nil
		}
		line, msg := 1, strings.TrimPrefix(err.Error(), "yaml: ")
		if m := yamlLine.FindStringSubmatch(err.Error()); m != nil {
			line, _ = strconv.Atoi(m[1])
			msg = strings.TrimPrefix(err.Error(), m[0])
		}
		if l := syntaxErrorLine(data, err.Error()); l > 0 {
			line = l
		}
		ps.errs = append(ps.errs, &Error{File: ps.file, Line: line, Msg: msg, Err: ErrSyntax})
		return nil
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		ps.add(&extra, "", ErrSyntax, "more than one YAML document")
		return nil
	}
	if doc.Kind == yaml.DocumentNode && len(doc.Content) == 1 {
		return doc.Content[0]
	}
	ps.add(&doc, "", ErrMissingField, "empty policy: want at least \"version: 1\"")
	return nil
}

// Bounds on syntaxErrorLine's work: files of more lines keep the line yaml.v3
// reports, and so do files whose search would parse more bytes than this (a
// broken construct thousands of lines long). Policy files are far smaller.
const (
	maxSearchLines = 5000
	maxSearchBytes = 4 << 20
)

// syntaxErrorLine returns the line of data where the YAML syntax error
// reported as yamlErr is, or 0 if it cannot tell. yaml.v3 reports many errors
// at the line where the enclosing block starts (its context mark) rather than
// where the problem is: an outdented key in a list of rules is reported at the
// line before the list's first item. The problem is on the line after the
// longest run of lines from the top of the file that parses on its own; any
// valid construct of several lines before it (a flow sequence, a block scalar)
// is part of that run.
//
// Once the problem is in, every longer run fails with the same error, so a
// binary search finds the shortest run that fails as the whole file does; the
// longest run that parses is found by walking back from there, usually one
// step.
func syntaxErrorLine(data []byte, yamlErr string) int {
	var ends []int // ends[i]: the offset after line i+1
	for i, c := range data {
		if c == '\n' {
			ends = append(ends, i+1)
			if len(ends) > maxSearchLines {
				return 0
			}
		}
	}
	if len(data) > 0 && data[len(data)-1] != '\n' {
		ends = append(ends, len(data))
	}
	budget := maxSearchBytes
	errorIn := func(lines int) string {
		b := data[:0]
		if lines > 0 {
			b = data[:ends[lines-1]]
		}
		budget -= len(b)
		return syntaxError(b)
	}
	lo, hi := 0, len(ends) // the first lo lines do not fail as data does; the first hi do
	for hi-lo > 1 {
		if budget <= 0 {
			return 0
		}
		mid := lo + (hi-lo)/2
		if errorIn(mid) == yamlErr {
			hi = mid
		} else {
			lo = mid
		}
	}
	for n := hi - 1; n >= 0 && budget > 0; n-- {
		if errorIn(n) == "" {
			return n + 1
		}
	}
	return 0
}

// syntaxError returns the error text of decoding data's first YAML document,
// or "" if it decodes (or is empty).
func syntaxError(data []byte) (msg string) {
	defer func() {
		if r := recover(); r != nil {
			msg = fmt.Sprint("panic: ", r)
		}
	}()
	var doc yaml.Node
	if err := yaml.NewDecoder(bytes.NewReader(data)).Decode(&doc); err != nil && !errors.Is(err, io.EOF) {
		return err.Error()
	}
	return ""
}

func (ps *parser) parse(data []byte) *Policy {
	root := ps.document(data)
	if root == nil {
		return nil
	}
	p := &Policy{
		Mode:       ModeManual,
		Defaults:   defaultDefaults(),
		Principals: map[string]*Principal{},
		File:       ps.file,
	}
	var rules, limits *yaml.Node
	seen := ps.mapping(root, "", map[string]func(*yaml.Node){
		"version": func(v *yaml.Node) {
			if n, ok := ps.integer(v, "", "version"); ok {
				if n != 1 {
					ps.add(v, "", ErrVersion, "version %d: only version 1 is supported", n)
				}
				p.Version = n
			}
		},
		"mode": func(v *yaml.Node) {
			s, ok := ps.str(v, "", "mode")
			if !ok {
				return
			}
			switch m := Mode(s); m {
			case ModeManual, ModeAutoApprove, ModeAutoDeny:
				p.Mode = m
			default:
				ps.add(v, "", ErrBadValue, "mode %q: want manual, auto-approve or auto-deny", s)
			}
		},
		"defaults":   func(v *yaml.Node) { ps.defaults(v, &p.Defaults) },
		"principals": func(v *yaml.Node) { ps.principals(v, p) },
		"rules":      func(v *yaml.Node) { rules = v },
		"limits":     func(v *yaml.Node) { limits = v },
	})
	if seen == nil {
		return nil
	}
	if !seen["version"] {
		ps.add(root, "", ErrMissingField, "version: missing (want \"version: 1\")")
	}
	// Rules and limits come last: they refer to defaults and principals,
	// wherever those sit in the file.
	if rules != nil {
		ps.sequence(rules, "", "rules", func(i int, n *yaml.Node) {
			if r := ps.rule(n, i, p); r != nil {
				p.Rules = append(p.Rules, r)
			}
		})
	}
	if limits != nil {
		ps.sequence(limits, "", "limits", func(i int, n *yaml.Node) {
			if l := ps.limit(n, i); l != nil {
				p.Limits = append(p.Limits, l)
			}
		})
	}
	return p
}

func (ps *parser) defaults(n *yaml.Node, d *Defaults) {
	const path = "defaults"
	ps.mapping(n, path, map[string]func(*yaml.Node){
		"timeout": func(v *yaml.Node) {
			if t, ok := ps.positiveDuration(v, path, "timeout"); ok {
				d.Timeout = t
			}
		},
		"on_timeout":          func(v *yaml.Node) { ps.onTimeout(v, path, &d.OnTimeout) },
		"on_no_approver":      func(v *yaml.Node) { ps.onNoApprover(v, path, &d.OnNoApprover) },
		"allow_self_approval": func(v *yaml.Node) { ps.boolean(v, path, "allow_self_approval", &d.AllowSelfApproval) },
		"rememberable":        func(v *yaml.Node) { ps.boolean(v, path, "rememberable", &d.Rememberable) },
		"max_remember": func(v *yaml.Node) {
			if t, ok := ps.positiveDuration(v, path, "max_remember"); ok {
				d.MaxRemember = t
			}
		},
	})
}

func (ps *parser) principals(n *yaml.Node, p *Policy) {
	ps.identityUser = map[string]string{}
	ps.entries(n, "principals", func(k, v *yaml.Node) {
		name := k.Value
		path := "principals." + name
		switch {
		case !events.ValidToken(name):
			ps.add(k, "principals", ErrBadName, "principal %q: names are 1-128 characters of A-Z a-z 0-9 _ -", name)
			return
		case name == AnyApprover:
			ps.add(k, "principals", ErrBadName, "principal %q: the name is reserved (approvers: [any] means anyone)", name)
			return
		}
		pr := &Principal{Name: name}
		p.Principals[name] = pr
		if isNull(v) {
			return
		}
		ps.mapping(v, path, map[string]func(*yaml.Node){
			"roles": func(v *yaml.Node) {
				roles, _ := ps.strs(v, path, "roles")
				for i, r := range roles {
					if !events.ValidToken(r) {
						ps.add(v.Content[i], path, ErrBadName, "roles[%d] %q: roles are 1-128 characters of A-Z a-z 0-9 _ -", i, r)
						continue
					}
					pr.Roles = append(pr.Roles, r)
				}
			},
			"slack": func(v *yaml.Node) {
				if s, ok := ps.str(v, path, "slack"); ok {
					pr.Slack = s
					ps.identity(v, path, "slack", s, name)
				}
			},
			"email": func(v *yaml.Node) {
				s, ok := ps.str(v, path, "email")
				if !ok {
					return
				}
				if !strings.Contains(s, "@") {
					ps.add(v, path, ErrBadValue, "email %q: not an email address", s)
					return
				}
				pr.Email = s
				ps.identity(v, path, "email", s, name)
			},
			"identities": func(v *yaml.Node) {
				pr.Identities = map[string]string{}
				ps.entries(v, path+".identities", func(k, v *yaml.Node) {
					ch := k.Value
					if !events.ValidToken(ch) || ch == "slack" || ch == "email" {
						ps.add(k, path, ErrBadName, "identities: channel %q: want a name of A-Z a-z 0-9 _ - other than slack and email (those have their own fields)", ch)
						return
					}
					if s, ok := ps.str(v, path, "identities."+ch); ok {
						pr.Identities[ch] = s
						ps.identity(v, path, ch, s, name)
					}
				})
			},
		})
	})
}

// identity records that channel knows principal by id, refusing an id claimed
// by two principals.
func (ps *parser) identity(n *yaml.Node, path, channel, id, principal string) {
	if id == "" {
		ps.add(n, path, ErrBadValue, "%s: empty id", channel)
		return
	}
	key := channel + ":" + id
	if other, dup := ps.identityUser[key]; dup && other != principal {
		ps.add(n, path, ErrDuplicate, "%s %q: already the identity of principal %q", channel, id, other)
		return
	}
	ps.identityUser[key] = principal
}

// approvalFields are the fields only require_approval rules may set.
var approvalFields = []string{
	"approvers", "quorum", "timeout", "on_timeout", "on_no_approver",
	"allow_self_approval", "rememberable", "remember_scopes", "max_remember", "escalation",
}

func (ps *parser) rule(n *yaml.Node, i int, p *Policy) *Rule {
	n = ps.deref(n)
	path := fmt.Sprintf("rules[%d]", i)
	if n.Kind != yaml.MappingNode {
		ps.add(n, path, ErrBadType, "must be a mapping with at least name and action")
		return nil
	}
	r := &Rule{Line: n.Line}
	if v := lookup(n, "name"); v != nil {
		if v = ps.deref(v); v.Kind == yaml.ScalarNode && !isNull(v) {
			r.Name = v.Value
			path = fmt.Sprintf("rules[%d] (%s)", i, truncate(r.Name, 64))
		}
	}
	valid := true
	bad := func(v *yaml.Node, kind error, format string, args ...any) {
		ps.add(v, path, kind, format, args...)
		valid = false
	}
	errsBefore := len(ps.errs)
	// Approval fields are collected first and applied once the action is known.
	appr := map[string]*yaml.Node{}
	fields := map[string]func(*yaml.Node){
		"name": func(v *yaml.Node) {
			switch {
			case v.Kind != yaml.ScalarNode:
				bad(v, ErrBadType, "name: must be a string")
			case !events.ValidToken(r.Name):
				bad(v, ErrBadName, "name %q: names are 1-128 characters of A-Z a-z 0-9 _ -", truncate(r.Name, 64))
			}
		},
		"tools":  func(v *yaml.Node) { r.Tools, r.tools = ps.globList(v, path, "tools") },
		"agents": func(v *yaml.Node) { r.Agents, r.agents = ps.globList(v, path, "agents") },
		"labels": func(v *yaml.Node) { r.Labels, r.labels = ps.labelGlobs(v, path) },
		"when": func(v *yaml.Node) {
			s, ok := ps.str(v, path, "when")
			if !ok {
				return
			}
			r.When = s
			prg, err := compileCEL(s, wantBool)
			if err != nil {
				bad(v, unwrapKind(err), "when: %v", err)
				return
			}
			r.prg = prg
		},
		"action": func(v *yaml.Node) {
			s, ok := ps.str(v, path, "action")
			if !ok {
				return
			}
			switch a := Action(s); a {
			case Allow, Deny, RequireApproval:
				r.Action = a
			default:
				bad(v, ErrBadValue, "action %q: want allow, deny or require_approval", s)
			}
		},
		"reason": func(v *yaml.Node) {
			if s, ok := ps.str(v, path, "reason"); ok {
				r.Reason = s
			}
		},
	}
	for _, f := range approvalFields {
		fields[f] = func(v *yaml.Node) { appr[f] = v }
	}
	seen := ps.mapping(n, path, fields)
	if !seen["name"] {
		bad(n, ErrMissingField, "name: missing")
	} else if prev, dup := ps.ruleNames[r.Name]; dup && r.Name != "" {
		bad(lookup(n, "name"), ErrDuplicate, "name %q: already used by the rule at line %d", r.Name, prev.Line)
	} else {
		if ps.ruleNames == nil {
			ps.ruleNames = map[string]*Rule{}
		}
		ps.ruleNames[r.Name] = r
	}
	if !seen["action"] {
		bad(n, ErrMissingField, "action: missing (want allow, deny or require_approval)")
	}
	switch {
	case r.Action == RequireApproval:
		r.Approval = ps.approval(appr, path, r.Name, p)
	case r.Action != "":
		for _, f := range approvalFields {
			if v, ok := appr[f]; ok {
				bad(v, ErrBadValue, "%s: only require_approval rules have approvers, timeouts and escalation (this rule's action is %s)", f, r.Action)
			}
		}
	}
	if !valid || len(ps.errs) > errsBefore {
		return nil
	}
	return r
}

// approval builds the approval of a require_approval rule from its fields and
// the defaults.
func (ps *parser) approval(f map[string]*yaml.Node, path, rule string, p *Policy) *Approval {
	d := p.Defaults
	a := &Approval{
		Rule:              rule,
		Quorum:            1,
		Timeout:           d.Timeout,
		OnTimeout:         d.OnTimeout,
		OnNoApprover:      d.OnNoApprover,
		AllowSelfApproval: d.AllowSelfApproval,
		Rememberable:      d.Rememberable,
		RememberScopes:    allScopes(),
		MaxRemember:       d.MaxRemember,
	}
	if v := f["approvers"]; v != nil {
		a.Approvers = ps.approvers(v, path, "approvers", p)
	}
	if v := f["quorum"]; v != nil {
		if q, ok := ps.integer(v, path, "quorum"); ok {
			if q < 1 {
				ps.add(v, path, ErrQuorum, "quorum %d: must be at least 1", q)
			} else {
				a.Quorum = q
			}
		}
	}
	if v := f["timeout"]; v != nil {
		if t, ok := ps.positiveDuration(v, path, "timeout"); ok {
			a.Timeout = t
		}
	}
	if v := f["on_timeout"]; v != nil {
		ps.onTimeout(v, path, &a.OnTimeout)
	}
	if v := f["on_no_approver"]; v != nil {
		ps.onNoApprover(v, path, &a.OnNoApprover)
	}
	if v := f["allow_self_approval"]; v != nil {
		ps.boolean(v, path, "allow_self_approval", &a.AllowSelfApproval)
	}
	if v := f["rememberable"]; v != nil {
		ps.boolean(v, path, "rememberable", &a.Rememberable)
	}
	if v := f["remember_scopes"]; v != nil {
		list, _ := ps.strs(v, path, "remember_scopes")
		a.RememberScopes = nil
		for i, s := range list {
			switch {
			case !slices.Contains(scopes[:], s):
				ps.add(v.Content[i], path, ErrBadValue, "remember_scopes[%d] %q: want call, session, agent or user", i, s)
			case slices.Contains(a.RememberScopes, s):
				ps.add(v.Content[i], path, ErrDuplicate, "remember_scopes[%d] %q: listed twice", i, s)
			default:
				a.RememberScopes = append(a.RememberScopes, s)
			}
		}
		if len(list) == 0 {
			ps.add(v, path, ErrBadValue, "remember_scopes: empty (to forbid remembering, say rememberable: false)")
		}
	}
	if v := f["max_remember"]; v != nil {
		if t, ok := ps.positiveDuration(v, path, "max_remember"); ok {
			a.MaxRemember = t
		}
	}
	if v := f["escalation"]; v != nil {
		a.Escalation = ps.escalation(v, path, a, p)
	}
	a.resolve(p)
	if !a.open && a.Quorum > len(a.eligible) {
		at := f["quorum"]
		if at == nil {
			at = f["approvers"]
		}
		ps.add(at, path, ErrQuorum, "quorum %d: only %d principal(s) can approve (%s)", a.Quorum, len(a.eligible), strings.Join(sortedKeys(a.eligible), ", "))
	}
	return a
}

func (ps *parser) escalation(n *yaml.Node, path string, a *Approval, p *Policy) []Step {
	var steps []Step
	deadline := a.Timeout
	ps.sequence(n, path, "escalation", func(i int, v *yaml.Node) {
		field := fmt.Sprintf("escalation[%d]", i)
		var s Step
		seen := ps.mapping(v, path, map[string]func(*yaml.Node){
			"after": func(v *yaml.Node) {
				t, ok := ps.positiveDuration(v, path, field+".after")
				if !ok {
					return
				}
				s.After = t
				switch {
				case len(steps) > 0 && t <= steps[len(steps)-1].After:
					ps.add(v, path, ErrBadValue, "%s.after %s: must be later than the step before (%s); steps count from the start of the request", field, t, steps[len(steps)-1].After)
				case t >= deadline:
					ps.add(v, path, ErrBadValue, "%s.after %s: never reached, the request times out at %s", field, t, deadline)
				}
			},
			"approvers": func(v *yaml.Node) { s.Approvers = ps.approvers(v, path, field+".approvers", p) },
			"extend": func(v *yaml.Node) {
				if t, ok := ps.positiveDuration(v, path, field+".extend"); ok {
					s.Extend = t
				}
			},
		})
		if seen == nil {
			return
		}
		if !seen["after"] {
			ps.add(v, path, ErrMissingField, "%s.after: missing", field)
		}
		if !seen["approvers"] {
			ps.add(v, path, ErrMissingField, "%s.approvers: missing (whom to notify)", field)
		}
		deadline += s.Extend
		steps = append(steps, s)
	})
	return steps
}

// approvers checks an approvers list: principal names, "role:<role>" with a
// role some principal has, or just "any".
func (ps *parser) approvers(n *yaml.Node, path, field string, p *Policy) []string {
	list, ok := ps.strs(n, path, field)
	if !ok {
		return nil
	}
	var out []string
	for i, s := range list {
		at := n.Content[i]
		switch {
		case s == AnyApprover:
			if len(list) > 1 {
				ps.add(at, path, ErrBadValue, "%s[%d] %q: any cannot be combined with other approvers", field, i, s)
			}
		case strings.HasPrefix(s, RolePrefix):
			role := s[len(RolePrefix):]
			if !hasRole(p, role) {
				ps.add(at, path, ErrUnknownApprover, "%s[%d] %q: no principal has role %q", field, i, s, role)
			}
		case p.Principals[s] == nil:
			ps.add(at, path, ErrUnknownApprover, "%s[%d] %q: not a principal (declare it under principals, or write role:<role>)", field, i, s)
		}
		if slices.Contains(out, s) {
			ps.add(at, path, ErrDuplicate, "%s[%d] %q: listed twice", field, i, s)
			continue
		}
		out = append(out, s)
	}
	if len(list) == 0 {
		ps.add(n, path, ErrBadValue, "%s: empty (to let anyone approve, write [any] or leave the field out)", field)
	}
	return out
}

func hasRole(p *Policy, role string) bool {
	for name := range p.Principals {
		if p.HasRole(name, role) {
			return true
		}
	}
	return false
}

func (ps *parser) limit(n *yaml.Node, i int) *Limit {
	n = ps.deref(n)
	path := fmt.Sprintf("limits[%d]", i)
	if n.Kind != yaml.MappingNode {
		ps.add(n, path, ErrBadType, "must be a mapping with at least name, per and max")
		return nil
	}
	l := &Limit{Line: n.Line, Over: RequireApproval}
	if v := lookup(n, "name"); v != nil {
		if v = ps.deref(v); v.Kind == yaml.ScalarNode && !isNull(v) {
			l.Name = v.Value
			path = fmt.Sprintf("limits[%d] (%s)", i, truncate(l.Name, 64))
		}
	}
	errsBefore := len(ps.errs)
	seen := ps.mapping(n, path, map[string]func(*yaml.Node){
		"name": func(v *yaml.Node) {
			if v.Kind != yaml.ScalarNode || !events.ValidToken(l.Name) {
				ps.add(v, path, ErrBadName, "name %q: names are 1-128 characters of A-Z a-z 0-9 _ -", truncate(l.Name, 64))
			}
		},
		"tools":  func(v *yaml.Node) { l.Tools, l.tools = ps.globList(v, path, "tools") },
		"agents": func(v *yaml.Node) { l.Agents, l.agents = ps.globList(v, path, "agents") },
		"per": func(v *yaml.Node) {
			s, ok := ps.str(v, path, "per")
			if !ok {
				return
			}
			switch s {
			case PerSession, PerAgent, PerUser, PerGlobal:
				l.Per = s
			default:
				ps.add(v, path, ErrBadValue, "per %q: want session, agent, user or global", s)
			}
		},
		"sum": func(v *yaml.Node) {
			s, ok := ps.str(v, path, "sum")
			if !ok {
				return
			}
			l.Sum = s
			prg, err := compileCEL(s, wantNumber)
			if err != nil {
				ps.add(v, path, unwrapKind(err), "sum: %v", err)
				return
			}
			l.prg = prg
		},
		"max": func(v *yaml.Node) {
			f, ok := ps.number(v, path, "max")
			if !ok {
				return
			}
			if f < 0 {
				ps.add(v, path, ErrBadValue, "max %v: must not be negative", f)
				return
			}
			l.Max = f
		},
		"window": func(v *yaml.Node) {
			if t, ok := ps.positiveDuration(v, path, "window"); ok {
				l.Window = t
			}
		},
		"over": func(v *yaml.Node) {
			s, ok := ps.str(v, path, "over")
			if !ok {
				return
			}
			switch a := Action(s); a {
			case RequireApproval, Deny:
				l.Over = a
			default:
				ps.add(v, path, ErrBadValue, "over %q: want require_approval or deny", s)
			}
		},
	})
	if seen == nil {
		return nil
	}
	for _, f := range []string{"name", "per", "max"} {
		if !seen[f] {
			ps.add(n, path, ErrMissingField, "%s: missing", f)
		}
	}
	if prev, dup := ps.limitNames[l.Name]; dup && seen["name"] {
		ps.add(lookup(n, "name"), path, ErrDuplicate, "name %q: already used by the limit at line %d", l.Name, prev.Line)
	} else if seen["name"] {
		if ps.limitNames == nil {
			ps.limitNames = map[string]*Limit{}
		}
		ps.limitNames[l.Name] = l
	}
	if len(ps.errs) > errsBefore {
		return nil
	}
	return l
}

// ---- YAML helpers ----

// deref follows aliases, within the file's alias budget. Past the budget it
// reports one error and gives a null node.
func (ps *parser) deref(n *yaml.Node) *yaml.Node {
	for n != nil && n.Kind == yaml.AliasNode {
		ps.aliases++
		if ps.aliases > maxAliases || n.Alias == nil {
			if !ps.aliasesSaid {
				ps.add(n, "", ErrBadValue, "more than %d alias references", maxAliases)
				ps.aliasesSaid = true
			}
			return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!null", Line: n.Line}
		}
		n = n.Alias
	}
	return n
}

func isNull(n *yaml.Node) bool {
	return n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null"
}

// lookup returns the value of key in mapping n, or nil.
func lookup(n *yaml.Node, key string) *yaml.Node {
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Kind == yaml.ScalarNode && n.Content[i].Value == key {
			return n.Content[i+1]
		}
	}
	return nil
}

// mapping walks the fields of mapping n, calling the function registered for
// each key with its (dereferenced) value. Null values count as absent. Unknown
// and repeated keys are errors. It returns the set of keys with a value, or nil
// if n is not a mapping.
func (ps *parser) mapping(n *yaml.Node, path string, fields map[string]func(*yaml.Node)) map[string]bool {
	n = ps.deref(n)
	if n.Kind != yaml.MappingNode {
		if isNull(n) {
			return map[string]bool{}
		}
		ps.add(n, path, ErrBadType, "must be a mapping")
		return nil
	}
	seen := map[string]bool{}
	keys := map[string]bool{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := ps.deref(n.Content[i]), ps.deref(n.Content[i+1])
		if k.Kind != yaml.ScalarNode {
			ps.add(k, path, ErrBadType, "keys must be strings")
			continue
		}
		key := k.Value
		if keys[key] {
			ps.add(k, path, ErrDuplicate, "%s: field given twice", key)
			continue
		}
		keys[key] = true
		f, ok := fields[key]
		if !ok {
			ps.add(k, path, ErrUnknownField, "unknown field %q (known: %s)", truncate(key, 64), strings.Join(sortedKeys(fields), ", "))
			continue
		}
		if isNull(v) {
			continue
		}
		seen[key] = true
		f(v)
	}
	return seen
}

// entries walks a mapping of free-form keys (principal names, label names).
func (ps *parser) entries(n *yaml.Node, path string, each func(k, v *yaml.Node)) {
	n = ps.deref(n)
	if n.Kind != yaml.MappingNode {
		if !isNull(n) {
			ps.add(n, path, ErrBadType, "must be a mapping")
		}
		return
	}
	keys := map[string]bool{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := ps.deref(n.Content[i]), ps.deref(n.Content[i+1])
		if k.Kind != yaml.ScalarNode {
			ps.add(k, path, ErrBadType, "keys must be strings")
			continue
		}
		if keys[k.Value] {
			ps.add(k, path, ErrDuplicate, "%q: given twice", truncate(k.Value, 64))
			continue
		}
		keys[k.Value] = true
		each(k, v)
	}
}

// sequence walks the items of sequence n.
func (ps *parser) sequence(n *yaml.Node, path, field string, each func(i int, v *yaml.Node)) {
	n = ps.deref(n)
	if n.Kind != yaml.SequenceNode {
		ps.add(n, path, ErrBadType, "%s: must be a list", field)
		return
	}
	for i, v := range n.Content {
		each(i, ps.deref(v))
	}
}

func (ps *parser) str(v *yaml.Node, path, field string) (string, bool) {
	if v.Kind != yaml.ScalarNode {
		ps.add(v, path, ErrBadType, "%s: must be a string", field)
		return "", false
	}
	return v.Value, true
}

// strs reads a list of strings. Its items are dereferenced in place, so callers
// may point errors at v.Content[i].
func (ps *parser) strs(v *yaml.Node, path, field string) ([]string, bool) {
	if v.Kind != yaml.SequenceNode {
		ps.add(v, path, ErrBadType, "%s: must be a list", field)
		return nil, false
	}
	out := make([]string, 0, len(v.Content))
	ok := true
	for i := range v.Content {
		e := ps.deref(v.Content[i])
		v.Content[i] = e
		if e.Kind != yaml.ScalarNode || isNull(e) {
			ps.add(e, path, ErrBadType, "%s[%d]: must be a string", field, i)
			ok = false
			out = append(out, "")
			continue
		}
		out = append(out, e.Value)
	}
	return out, ok
}

func (ps *parser) globList(v *yaml.Node, path, field string) ([]string, globs) {
	list, ok := ps.strs(v, path, field)
	if !ok {
		return nil, nil
	}
	gs := make(globs, 0, len(list))
	for i, s := range list {
		g, err := compileGlob(s)
		if err != nil || s == "" {
			ps.add(v.Content[i], path, ErrBadGlob, "%s[%d] %q: not a glob pattern (path.Match syntax: * ? [a-z] \\)", field, i, s)
			continue
		}
		gs = append(gs, g)
	}
	return list, gs
}

func (ps *parser) labelGlobs(n *yaml.Node, path string) (map[string]string, []labelGlob) {
	m := map[string]string{}
	var ls []labelGlob
	ps.entries(n, path+": labels", func(k, v *yaml.Node) {
		s, ok := ps.str(v, path, "labels."+k.Value)
		if !ok {
			return
		}
		g, err := compileGlob(s)
		if err != nil {
			ps.add(v, path, ErrBadGlob, "labels.%s %q: not a glob pattern (path.Match syntax)", k.Value, s)
			return
		}
		m[k.Value] = s
		ls = append(ls, labelGlob{key: k.Value, value: g})
	})
	slices.SortFunc(ls, func(a, b labelGlob) int { return strings.Compare(a.key, b.key) })
	return m, ls
}

func (ps *parser) positiveDuration(v *yaml.Node, path, field string) (time.Duration, bool) {
	if v.Kind != yaml.ScalarNode {
		ps.add(v, path, ErrBadType, "%s: must be a duration such as 90s, 5m or 1h30m", field)
		return 0, false
	}
	d, err := time.ParseDuration(v.Value)
	switch {
	case err != nil:
		ps.add(v, path, ErrBadDuration, "%s %q: not a duration such as 90s, 5m or 1h30m", field, truncate(v.Value, 64))
		return 0, false
	case d <= 0:
		ps.add(v, path, ErrBadDuration, "%s %s: must be positive", field, v.Value)
		return 0, false
	}
	return d, true
}

func (ps *parser) integer(v *yaml.Node, path, field string) (int, bool) {
	var n int
	if v.Kind != yaml.ScalarNode || v.ShortTag() != "!!int" || v.Decode(&n) != nil {
		ps.add(v, path, ErrBadType, "%s %q: must be a whole number", field, truncate(v.Value, 64))
		return 0, false
	}
	return n, true
}

func (ps *parser) number(v *yaml.Node, path, field string) (float64, bool) {
	var f float64
	tag := v.ShortTag()
	if v.Kind != yaml.ScalarNode || (tag != "!!int" && tag != "!!float") || v.Decode(&f) != nil || math.IsNaN(f) || math.IsInf(f, 0) {
		ps.add(v, path, ErrBadType, "%s %q: must be a number", field, truncate(v.Value, 64))
		return 0, false
	}
	return f, true
}

func (ps *parser) boolean(v *yaml.Node, path, field string, dst *bool) {
	var b bool
	if v.Kind != yaml.ScalarNode || v.ShortTag() != "!!bool" || v.Decode(&b) != nil {
		ps.add(v, path, ErrBadType, "%s %q: must be true or false", field, truncate(v.Value, 64))
		return
	}
	*dst = b
}

func (ps *parser) onTimeout(v *yaml.Node, path string, dst *events.Verdict) {
	s, ok := ps.str(v, path, "on_timeout")
	if !ok {
		return
	}
	switch vd := events.Verdict(s); vd {
	case events.Approve, events.Deny:
		*dst = vd
	default:
		ps.add(v, path, ErrBadValue, "on_timeout %q: want deny or approve", truncate(s, 64))
	}
}

func (ps *parser) onNoApprover(v *yaml.Node, path string, dst *NoApprover) {
	s, ok := ps.str(v, path, "on_no_approver")
	if !ok {
		return
	}
	switch na := NoApprover(s); na {
	case NoApproverDeny, NoApproverWait:
		*dst = na
	default:
		ps.add(v, path, ErrBadValue, "on_no_approver %q: want deny or wait", truncate(s, 64))
	}
}

// unwrapKind returns the sentinel a compile error wraps.
func unwrapKind(err error) error {
	for _, k := range []error{ErrNotBool, ErrBadCEL, ErrBadValue} {
		if errors.Is(err, k) {
			return k
		}
	}
	return ErrBadCEL
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
