// Package recent remembers a bounded number of recent entries: when full, a
// new entry replaces the oldest. The broker's event feed and the webhook
// channel use it for facts about recent requests that later events lack.
package recent

import "sync"

// Map holds up to a fixed number of keys, forgetting the oldest first. It is
// safe for concurrent use.
type Map[V any] struct {
	mu   sync.Mutex
	m    map[string]V
	ring []string
	next int
}

// New returns a map of at most size entries.
func New[V any](size int) *Map[V] {
	return &Map[V]{m: make(map[string]V, size), ring: make([]string, size)}
}

// Put remembers v for key, unless key is remembered already: the first value
// stays.
func (c *Map[V]) Put(key string, v V) {
	c.Update(key, v, func(V, V) bool { return false })
}

// Update remembers v for key. A key remembered already keeps its age, and
// takes v only if newer(v, old) says so.
func (c *Map[V]) Update(key string, v V, newer func(v, old V) bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if old, ok := c.m[key]; ok {
		if newer(v, old) {
			c.m[key] = v
		}
		return
	}
	c.add(key, v)
}

// add remembers a new key, forgetting the oldest if full. The caller holds mu.
func (c *Map[V]) add(key string, v V) {
	if old := c.ring[c.next]; old != "" {
		delete(c.m, old)
	}
	c.ring[c.next] = key
	c.next = (c.next + 1) % len(c.ring)
	c.m[key] = v
}

// Get returns the value of key, if it is remembered.
func (c *Map[V]) Get(key string) (V, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	v, ok := c.m[key]
	return v, ok
}
