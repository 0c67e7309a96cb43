package policy

import (
	"path"
	"strings"
)

// glob is a compiled path.Match pattern. Patterns without meta characters, a
// lone "*" and "prefix*" are matched without path.Match, which keeps matching a
// long rule list cheap.
type glob struct {
	pattern string
	kind    globKind
	lit     string // the literal, or the prefix for globPrefix
}

type globKind uint8

const (
	globLiteral globKind = iota
	globPrefix
	globAny // "*": any string without '/'
	globMatch
)

// compileGlob checks pattern with path.Match and classifies it.
func compileGlob(pattern string) (glob, error) {
	if _, err := path.Match(pattern, ""); err != nil {
		return glob{}, err
	}
	g := glob{pattern: pattern, kind: globMatch}
	switch meta := strings.IndexAny(pattern, `*?[\`); {
	case meta < 0:
		g.kind, g.lit = globLiteral, pattern
	case pattern == "*":
		g.kind = globAny
	case meta == len(pattern)-1 && pattern[meta] == '*':
		g.kind, g.lit = globPrefix, pattern[:meta]
	}
	return g, nil
}

// match reports whether s matches the pattern, with path.Match semantics: '*'
// and '?' do not match '/'.
func (g *glob) match(s string) bool {
	switch g.kind {
	case globLiteral:
		return s == g.lit
	case globPrefix:
		return strings.HasPrefix(s, g.lit) && !strings.Contains(s[len(g.lit):], "/")
	case globAny:
		return !strings.Contains(s, "/")
	}
	ok, _ := path.Match(g.pattern, s)
	return ok
}

// globs matches if any of its patterns does; an empty list matches anything.
type globs []glob

func (gs globs) match(s string) bool {
	if len(gs) == 0 {
		return true
	}
	for i := range gs {
		if gs[i].match(s) {
			return true
		}
	}
	return false
}

// labelGlob requires label key to be present and match value.
type labelGlob struct {
	key   string
	value glob
}

func matchLabels(ls []labelGlob, labels map[string]string) bool {
	for i := range ls {
		v, ok := labels[ls[i].key]
		if !ok || !ls[i].value.match(v) {
			return false
		}
	}
	return true
}
