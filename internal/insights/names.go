package insights

import (
	"sync"
	"unicode/utf8"
)

// names interns the strings the aggregator keys on (agents, tools, rules,
// principals, argument fields, disagreement pairs) as small integers, so
// that buckets hold, hash and compare integers. Id 0 is "": unknown, or
// none. It has its own lock, so that History and Query read names while the
// aggregator writes buckets.
type names struct {
	mu  sync.RWMutex
	ids map[string]uint32
	all []string
}

// Bounds of the name table: past maxNames distinct names, new ones are all
// otherName; a name longer than maxNameLen bytes is cut to it.
const (
	maxNames   = 1 << 20
	maxNameLen = 256
	otherName  = "(other)"
)

func newNames() *names {
	return &names{ids: map[string]uint32{"": 0}, all: []string{""}}
}

// id returns s's id, interning it.
func (n *names) id(s string) uint32 {
	s = cut(s, maxNameLen)
	n.mu.RLock()
	id, ok := n.ids[s]
	n.mu.RUnlock()
	if ok {
		return id
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if id, ok := n.ids[s]; ok {
		return id
	}
	if len(n.all) >= maxNames {
		if id, ok := n.ids[otherName]; ok {
			return id
		}
		s = otherName
	}
	id = uint32(len(n.all))
	n.ids[s] = id
	n.all = append(n.all, s)
	return id
}

// lookup returns s's id if s was interned.
func (n *names) lookup(s string) (uint32, bool) {
	s = cut(s, maxNameLen)
	n.mu.RLock()
	defer n.mu.RUnlock()
	id, ok := n.ids[s]
	return id, ok
}

// name returns the name of id.
func (n *names) name(id uint32) string {
	n.mu.RLock()
	defer n.mu.RUnlock()
	if int(id) >= len(n.all) {
		return ""
	}
	return n.all[id]
}

// cut returns s cut to at most max bytes, on a character boundary.
func cut(s string, max int) string {
	if len(s) <= max {
		return s
	}
	return wholeRunes(s[:max])
}

// wholeRunes drops from the end of s the bytes of a character cut in two.
func wholeRunes(s string) string {
	for i := 0; i < utf8.UTFMax-1 && len(s) > 0; i++ {
		if r, size := utf8.DecodeLastRuneInString(s); r != utf8.RuneError || size != 1 {
			break
		}
		s = s[:len(s)-1]
	}
	return s
}
