package recent

import (
	"fmt"
	"testing"
)

func TestMapForgetsTheOldest(t *testing.T) {
	m := New[int](3)
	for i := range 4 {
		m.Put(fmt.Sprint(i), i)
	}
	if _, ok := m.Get("0"); ok {
		t.Error("the oldest key is still remembered in a full map")
	}
	for i := 1; i < 4; i++ {
		if v, ok := m.Get(fmt.Sprint(i)); !ok || v != i {
			t.Errorf("key %d: %d %v", i, v, ok)
		}
	}
	m.Put("3", 30) // the first value stays, and takes no new slot
	m.Put("4", 4)
	if v, _ := m.Get("3"); v != 3 {
		t.Errorf("key 3 was replaced: %d", v)
	}
	if _, ok := m.Get("1"); ok {
		t.Error("key 1 should have made room for key 4")
	}
	if _, ok := m.Get("2"); !ok {
		t.Error("key 2 was forgotten early: a repeated Put took a slot")
	}
}

func TestMapUpdateKeepsTheNewer(t *testing.T) {
	m := New[int](2)
	newer := func(v, old int) bool { return v > old }
	m.Update("a", 2, newer)
	m.Update("a", 1, newer) // older: ignored
	if v, _ := m.Get("a"); v != 2 {
		t.Errorf("a = %d, want 2", v)
	}
	m.Update("a", 3, newer)
	if v, _ := m.Get("a"); v != 3 {
		t.Errorf("a = %d, want 3", v)
	}
	m.Update("b", 1, newer)
	m.Update("c", 1, newer) // a is the oldest, whatever its updates
	if _, ok := m.Get("a"); ok {
		t.Error("an updated key took a new slot instead of keeping its age")
	}
}
