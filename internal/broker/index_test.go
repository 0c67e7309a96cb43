package broker

import (
	"cmp"
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/assent-dev/assent/pkg/events"
)

// naive is the index as a plain set of records, listed by filtering all of
// them: what index must answer, faster.
type naive struct {
	recs map[string]Record
	keep int
}

func (m *naive) put(rec Record) {
	if old, ok := m.recs[rec.ID]; ok {
		if old.revision > rec.revision {
			return
		}
		delete(m.recs, rec.ID)
	}
	switch {
	case rec.State == StatePending:
	case rec.Decision != nil:
		if decided := m.sorted(false); len(decided) >= m.keep {
			oldest := decided[len(decided)-1]
			if cmpDecided(rec, oldest) < 0 {
				return
			}
			delete(m.recs, oldest.ID)
		}
	default:
		return
	}
	m.recs[rec.ID] = rec
}

// sorted returns the pending records oldest first, or the decided ones
// newest first.
func (m *naive) sorted(pending bool) []Record {
	var out []Record
	for _, r := range m.recs {
		if (r.State == StatePending) == pending {
			out = append(out, r)
		}
	}
	slices.SortFunc(out, func(a, b Record) int {
		if pending {
			return cmp.Or(a.ReceivedAt.Compare(b.ReceivedAt), strings.Compare(a.ID, b.ID))
		}
		return cmpDecided(b, a)
	})
	return out
}

func cmpDecided(a, b Record) int {
	return cmp.Or(a.Decision.DecidedAt.Compare(b.Decision.DecidedAt), strings.Compare(a.ID, b.ID))
}

func (m *naive) list(f Filter) (ids []string, total int) {
	match := func(r Record) bool {
		return (f.State == "" || r.State == f.State) &&
			(f.Agent == "" || r.Request.Agent == f.Agent) &&
			(f.Session == "" || r.Request.Session == f.Session)
	}
	var all []Record
	if (f.State == "" && !f.Decided) || f.State == StatePending {
		all = m.sorted(true)
	}
	if f.State != StatePending {
		all = append(all, m.sorted(false)...)
	}
	after, known := m.recs[f.After]
	passed := f.After == "" || !known
	// A listing of pending requests after one decided since goes on from
	// where that one arrived.
	since := known && f.State == StatePending && after.State != StatePending &&
		(f.Agent == "" || after.Request.Agent == f.Agent) && (f.Session == "" || after.Request.Session == f.Session)
	for _, r := range all {
		if !match(r) {
			continue
		}
		total++
		if !passed && since {
			passed = cmp.Or(r.ReceivedAt.Compare(after.ReceivedAt), strings.Compare(r.ID, after.ID)) > 0
		}
		if !passed {
			passed = r.ID == f.After
			continue
		}
		if len(ids) < f.Limit {
			ids = append(ids, r.ID)
		}
	}
	return ids, total
}

// check compares x with m: every listing by filters drawn from the values
// given, every id's get, and the counts.
func check(t *testing.T, x *index, m *naive, ids, agents, sessions []string, filters int, rnd *rand.Rand) {
	t.Helper()
	states := []State{"", StatePending, StateApproved, StateDenied, StateExpired, StateCancelled}
	afters := append([]string{"", "unknown"}, ids...)
	for range filters {
		f := Filter{
			State:   states[rnd.IntN(len(states))],
			Decided: rnd.IntN(3) == 0,
			Agent:   agents[rnd.IntN(len(agents))],
			Session: sessions[rnd.IntN(len(sessions))],
			After:   afters[rnd.IntN(len(afters))],
			Limit:   []int{0, 1, 2, 3, 100}[rnd.IntN(5)],
		}
		wantIDs, wantTotal := m.list(f)
		gotIDs, total := x.list(f)
		if !slices.Equal(gotIDs, wantIDs) || total != wantTotal {
			t.Fatalf("list(%+v) = %v, total %d; want %v, total %d", f, gotIDs, total, wantIDs, wantTotal)
		}
	}
	for _, id := range ids {
		rec, trim, ok := x.get(id)
		want, known := m.recs[id]
		if ok != known {
			t.Fatalf("get(%s) found %t, want %t", id, ok, known)
		}
		switch {
		case !ok:
		case want.State == StatePending:
			if !trim || rec.ID != id || rec.State != StatePending || rec.revision != want.revision ||
				rec.Request.Agent != want.Request.Agent || rec.Request.Session != want.Request.Session ||
				!rec.ReceivedAt.Equal(want.ReceivedAt) {
				t.Fatalf("get(%s) = %+v (trimmed %t), the request is %+v", id, rec, trim, want)
			}
		default:
			if w := trimmed(want); !reflect.DeepEqual(rec, w.rec) || trim != w.trimmed {
				t.Fatalf("get(%s) = %+v (trimmed %t), want %+v", id, rec, trim, w)
			}
		}
	}
	if x.pendingCount() != len(m.sorted(true)) || x.size() != len(m.recs) {
		t.Fatalf("%d pending of %d, want %d of %d", x.pendingCount(), x.size(), len(m.sorted(true)), len(m.recs))
	}
}

// trimmed is rec as the index keeps a decided request.
func trimmed(rec Record) indexed {
	e := indexed{rec: rec}
	if len(rec.Request.Args) > indexArgsLimit {
		e.rec.Request.Args, e.trimmed = nil, true
	}
	if d := rec.Decision; len(d.Args) > indexArgsLimit || len(d.Payload) > indexArgsLimit {
		short := *d
		short.Args, short.Payload = nil, nil
		e.rec.Decision, e.trimmed = &short, true
	}
	return e
}

// TestIndexMatchesNaive runs random sequences of puts (new and older
// revisions, pending and decided, requests leaving and coming back, decided
// ones beyond keep) and removes against index and naive, and compares their
// listings by random filters after every step and by every filter at the end.
func TestIndexMatchesNaive(t *testing.T) {
	sequences, steps := 150, 150
	if testing.Short() {
		sequences = 20
	}
	outcomes := []State{StateApproved, StateDenied, StateExpired, StateCancelled}
	base := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	big := json.RawMessage(`{"blob":"` + strings.Repeat("x", indexArgsLimit) + `"}`)
	for seq := range sequences {
		rnd := rand.New(rand.NewPCG(uint64(seq), 7))
		keep := 1 + rnd.IntN(8)
		x, m := newIndex(keep), &naive{recs: make(map[string]Record), keep: keep}
		var ids []string
		for i := range 12 {
			ids = append(ids, fmt.Sprintf("r%02d", i))
		}
		agents := []string{"", "a0", "a1", "a2", "nobody"}
		sessions := []string{"", "s0", "s1", "s2", "s3", "nobody"}
		var rev uint64
		last := map[string]Record{} // the newest put of each id
		for step := range steps {
			id := ids[rnd.IntN(len(ids))]
			rec, seen := last[id]
			// Mostly a request keeps its agent and session; sometimes
			// not, and some have none.
			if !seen || rnd.IntN(10) == 0 {
				rec.Request.Agent = agents[rnd.IntN(4)]
				rec.Request.Session = sessions[rnd.IntN(5)]
				rec.ReceivedAt = base.Add(time.Duration(rnd.IntN(20)) * time.Second)
			}
			rec.ID = id
			rev++
			rec.revision = rev
			op := rnd.IntN(10)
			switch {
			case op < 4: // pending: new, or back again
				rec.State, rec.Decision = StatePending, nil
				rec.ReceivedAt = base.Add(time.Duration(rnd.IntN(20)) * time.Second)
				rec.Request.Args = nil
			case op < 7: // decided
				rec.State = outcomes[rnd.IntN(len(outcomes))]
				rec.Decision = &events.Decided{RequestID: id, Outcome: events.Outcome(rec.State), Reason: "step " + strconv.Itoa(step),
					DecidedAt: base.Add(time.Minute + time.Duration(rnd.IntN(20))*time.Second)}
				if rnd.IntN(6) == 0 {
					rec.Request.Args = big
				}
			case op == 7 && m.recs[id].revision > 0: // an older revision than the one held
				rec.revision = rnd.Uint64N(m.recs[id].revision)
				if rnd.IntN(2) == 0 {
					rec.State, rec.Decision = StatePending, nil
				}
				x.put(rec)
				m.put(rec)
				check(t, x, m, ids, agents, sessions, 20, rnd)
				continue
			case op == 8 && seen: // the same revision again
				rec = last[id]
			case op == 8: // neither pending nor decided: dropped
				rec.State, rec.Decision = StateApproved, nil
			default:
				x.remove(id)
				delete(m.recs, id)
				delete(last, id)
				check(t, x, m, ids, agents, sessions, 20, rnd)
				continue
			}
			x.put(rec)
			m.put(rec)
			last[id] = rec
			check(t, x, m, ids, agents, sessions, 20, rnd)
		}
		// Every filter at the end, and paging through each listing.
		for _, st := range []State{"", StatePending, StateApproved, StateDenied, StateExpired, StateCancelled, "bogus"} {
			for _, decided := range []bool{false, true} {
				for _, agent := range agents {
					for _, session := range sessions {
						f := Filter{State: st, Decided: decided, Agent: agent, Session: session, Limit: 2}
						for pages := 0; ; pages++ {
							wantIDs, wantTotal := m.list(f)
							gotIDs, total := x.list(f)
							if !slices.Equal(gotIDs, wantIDs) || total != wantTotal {
								t.Fatalf("sequence %d: list(%+v) = %v, total %d; want %v, total %d", seq, f, gotIDs, total, wantIDs, wantTotal)
							}
							if len(gotIDs) < f.Limit {
								break
							}
							if pages > len(ids) {
								t.Fatalf("sequence %d: list(%+v) does not end", seq, f)
							}
							f.After = gotIDs[len(gotIDs)-1]
						}
					}
				}
			}
		}
		// Removing everything leaves nothing behind.
		for _, id := range ids {
			x.remove(id)
		}
		if len(x.names) != 0 || len(x.pending) != 0 || len(x.decided) != 0 {
			t.Fatalf("sequence %d: after removing every request the index holds %d names, %d pending, %d decided", seq, len(x.names), len(x.pending), len(x.decided))
		}
		for _, sh := range append([]*shelf{x.waiting, x.done}, slices.Collect(maps.Values(x.outcomes))...) {
			if sh.byTime.Len()+sh.byAgent.Len()+sh.bySession.Len()+len(sh.counts) != 0 {
				t.Fatalf("sequence %d: after removing every request a shelf holds %d, %d, %d items and %d counts", seq, sh.byTime.Len(), sh.byAgent.Len(), sh.bySession.Len(), len(sh.counts))
			}
		}
	}
}

var indexBase = time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)

// pendingAt is a pending request that arrived sec seconds after indexBase.
func pendingAt(id, agent, session string, sec int, rev uint64) Record {
	return Record{
		ID: id, State: StatePending, revision: rev,
		Request:    events.Requested{Tool: "deploy", Agent: agent, Session: session},
		ReceivedAt: indexBase.Add(time.Duration(sec) * time.Second),
	}
}

// decidedAt is rec decided (state) sec seconds after indexBase.
func decidedAt(rec Record, state State, sec int, rev uint64) Record {
	rec.State, rec.revision = state, rev
	rec.Decision = &events.Decided{RequestID: rec.ID, Outcome: events.Outcome(state), DecidedAt: indexBase.Add(time.Duration(sec) * time.Second)}
	return rec
}

// listed lists f, failing unless it gives ids and total.
func listed(t *testing.T, x *index, f Filter, total int, ids ...string) {
	t.Helper()
	if f.Limit == 0 {
		f.Limit = 100
	}
	got, n := x.list(f)
	if !slices.Equal(got, ids) || n != total {
		t.Errorf("list(%+v) = %v, total %d; want %v, total %d", f, got, n, ids, total)
	}
}

// TestIndexAfterGone: a listing after a request the index no longer holds
// starts again from the first.
func TestIndexAfterGone(t *testing.T) {
	x := newIndex(10)
	for i, id := range []string{"a", "b", "c"} {
		x.put(pendingAt(id, "agent", "s", i, uint64(i+1)))
	}
	listed(t, x, Filter{Limit: 2}, 3, "a", "b")
	x.remove("b")
	listed(t, x, Filter{After: "b"}, 2, "a", "c")
	listed(t, x, Filter{After: "b", Agent: "agent", Session: "s"}, 2, "a", "c")
	listed(t, x, Filter{After: "never"}, 2, "a", "c")
}

// TestIndexPendingToDecided: a request that is decided leaves the pending
// listings and counts for the decided ones, and get has its record.
func TestIndexPendingToDecided(t *testing.T) {
	x := newIndex(10)
	p1, p2, p3 := pendingAt("p1", "a", "s", 1, 1), pendingAt("p2", "a", "s", 2, 2), pendingAt("p3", "a", "s", 3, 3)
	for _, rec := range []Record{p1, p2, p3} {
		x.put(rec)
	}
	d2 := decidedAt(p2, StateApproved, 10, 4)
	x.put(d2)
	for _, f := range []Filter{{State: StatePending}, {State: StatePending, Agent: "a"}, {State: StatePending, Session: "s"}, {State: StatePending, Agent: "a", Session: "s"}} {
		listed(t, x, f, 2, "p1", "p3")
	}
	for _, f := range []Filter{{State: StateApproved}, {Decided: true}, {Decided: true, Agent: "a", Session: "s"}, {State: StateApproved, Session: "s"}} {
		listed(t, x, f, 1, "p2")
	}
	listed(t, x, Filter{State: StateDenied}, 0)
	listed(t, x, Filter{Agent: "a"}, 3, "p1", "p3", "p2")
	listed(t, x, Filter{After: "p1", Session: "s"}, 3, "p3", "p2")
	listed(t, x, Filter{After: "p3"}, 3, "p2")
	// The last of a page of pending requests, decided since: the next page
	// goes on from where it arrived.
	listed(t, x, Filter{State: StatePending, After: "p2"}, 2, "p3")
	listed(t, x, Filter{State: StatePending, After: "p2", Agent: "other"}, 0)
	rec, trimmed, ok := x.get("p2")
	if !ok || trimmed || !reflect.DeepEqual(rec, d2) {
		t.Errorf("get(p2) = %+v, %t, %t; want %+v", rec, trimmed, ok, d2)
	}
	if rec, trimmed, ok := x.get("p1"); !ok || !trimmed || rec.State != StatePending || rec.revision != 1 ||
		rec.Request.Agent != "a" || rec.Request.Session != "s" || !rec.ReceivedAt.Equal(p1.ReceivedAt) {
		t.Errorf("get(p1) = %+v, %t, %t", rec, trimmed, ok)
	}
	if x.pendingCount() != 2 || x.size() != 3 {
		t.Errorf("%d pending of %d, want 2 of 3", x.pendingCount(), x.size())
	}
}

// TestIndexOlderRevisionIgnored: a revision older than the one held changes
// nothing, whichever state either is in.
func TestIndexOlderRevisionIgnored(t *testing.T) {
	x := newIndex(10)
	p := pendingAt("r", "a", "s", 1, 5)
	x.put(p)
	x.put(decidedAt(p, StateDenied, 9, 4))
	listed(t, x, Filter{State: StatePending}, 1, "r")
	listed(t, x, Filter{Decided: true}, 0)
	d := decidedAt(p, StateApproved, 10, 6)
	x.put(d)
	x.put(p)
	x.put(pendingAt("r", "b", "other", 1, 3))
	listed(t, x, Filter{State: StatePending}, 0)
	listed(t, x, Filter{State: StateApproved, Agent: "a", Session: "s"}, 1, "r")
	listed(t, x, Filter{Agent: "b"}, 0)
	if rec, _, _ := x.get("r"); rec.revision != 6 || rec.State != StateApproved {
		t.Errorf("get(r) = %+v", rec)
	}
	if _, ok := x.names["other"]; ok {
		t.Error("the session of an ignored revision was interned")
	}
}

// TestIndexSessionOfTwoAgents: a session that two agents (and requests with
// no agent) share lists in time order across them.
func TestIndexSessionOfTwoAgents(t *testing.T) {
	x := newIndex(10)
	x.put(pendingAt("1", "b", "s", 1, 1))
	x.put(pendingAt("2", "a", "s", 2, 2))
	x.put(pendingAt("3", "", "s", 3, 3))
	x.put(pendingAt("4", "b", "s", 4, 4))
	x.put(pendingAt("5", "a", "t", 5, 5))
	x.put(pendingAt("6", "a", "s", 6, 6))
	listed(t, x, Filter{Session: "s"}, 5, "1", "2", "3", "4", "6")
	listed(t, x, Filter{Session: "s", Limit: 2, After: "2"}, 5, "3", "4")
	listed(t, x, Filter{Session: "s", Agent: "a"}, 2, "2", "6")
	listed(t, x, Filter{Session: "s", Agent: "a", After: "2"}, 2, "6")
	listed(t, x, Filter{Session: "s", Agent: "b", After: "2"}, 2)
	listed(t, x, Filter{Agent: "a"}, 3, "2", "5", "6")
	listed(t, x, Filter{Session: "t", Agent: "b"}, 0)
	x.put(decidedAt(pendingAt("4", "b", "s", 4, 4), StateExpired, 20, 7))
	x.put(decidedAt(pendingAt("2", "a", "s", 2, 2), StateApproved, 30, 8))
	listed(t, x, Filter{Session: "s"}, 5, "1", "3", "6", "2", "4")
	listed(t, x, Filter{Session: "s", After: "6"}, 5, "2", "4")
	listed(t, x, Filter{Session: "s", Decided: true}, 2, "2", "4")
	listed(t, x, Filter{Session: "s", State: StateExpired, Agent: "b"}, 1, "4")
}

// TestIndexKeepDecided: the index keeps the newest keep decided requests; a
// decision older than all of them is not kept, nor is its request pending
// any more.
func TestIndexKeepDecided(t *testing.T) {
	x := newIndex(2)
	for i, id := range []string{"d1", "d2", "d3"} {
		x.put(decidedAt(pendingAt(id, "a", "", i, 0), StateApproved, 10+i, uint64(i+1)))
	}
	listed(t, x, Filter{Decided: true}, 2, "d3", "d2")
	if _, _, ok := x.get("d1"); ok {
		t.Error("d1 is still indexed")
	}
	p := pendingAt("p", "a", "", 0, 4)
	x.put(p)
	x.put(decidedAt(p, StateDenied, 5, 5))
	listed(t, x, Filter{Agent: "a"}, 2, "d3", "d2")
	if _, _, ok := x.get("p"); ok {
		t.Error("p is still indexed")
	}
}
