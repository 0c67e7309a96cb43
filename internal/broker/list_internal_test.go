package broker

import (
	"encoding/json"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/assent-dev/assent/internal/testenv"
	"github.com/assent-dev/assent/pkg/events"
)

// TestListReadsRecords: List reads the records the index holds in part from
// the bucket, keeping the page's order, and leaves out one the bucket no
// longer has (its total still counts it), and pages on past it.
func TestListReadsRecords(t *testing.T) {
	b, ctx := runInternal(t, testenv.Conn(t, testenv.Server(t)), Config{})

	var want []string // session s1's, in arrival order
	for i := range 30 {
		if i == 10 {
			// One the bucket does not have, among them: its page is short
			// of its limit and is not the last.
			b.index.put(Record{ID: "ghost-early", State: StatePending, Request: events.Requested{Agent: "lister", Session: "s1"}, ReceivedAt: time.Now(), revision: 1})
		}
		session := "s" + strconv.Itoa(1+i%2)
		rec := submit(ctx, t, b, events.Requested{Tool: "t-" + strconv.Itoa(i), Agent: "lister", Session: session, Args: json.RawMessage(`{"i":` + strconv.Itoa(i) + `}`)})
		if session == "s1" {
			want = append(want, rec.ID)
		}
	}
	b.index.put(Record{ID: "ghost", State: StatePending, Request: events.Requested{Agent: "lister", Session: "s1"}, ReceivedAt: time.Now().Add(time.Hour), revision: 1})

	f := Filter{State: StatePending, Agent: "lister", Session: "s1"}
	page, err := b.List(ctx, f)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, rec := range page.Records {
		i, _ := strings.CutPrefix(rec.Request.Tool, "t-")
		if rec.State != StatePending || string(rec.Request.Args) != `{"i":`+i+`}` || rec.Deadline.IsZero() {
			t.Errorf("listed %+v, not the record stored", rec)
		}
		got = append(got, rec.ID)
	}
	if !slices.Equal(got, want) || page.Total != len(want)+2 {
		t.Fatalf("listed %v, total %d; want %v, total %d", got, page.Total, want, len(want)+2)
	}

	// Page by page, the same.
	got = nil
	for f.Limit = 4; ; {
		page, err := b.List(ctx, f)
		if err != nil {
			t.Fatal(err)
		}
		for _, rec := range page.Records {
			got = append(got, rec.ID)
		}
		if page.Next == "" {
			break
		}
		f.After = page.Next
	}
	if !slices.Equal(got, want) {
		t.Fatalf("paged through %v, want %v", got, want)
	}

	// A decided request with args too large for the index.
	big := json.RawMessage(`{"blob":"` + strings.Repeat("x", indexArgsLimit) + `"}`)
	rec := submit(ctx, t, b, events.Requested{Tool: "big", Agent: "lister", Args: big})
	if _, err := b.Respond(ctx, "alice", rec.ID, events.Responded{Decision: events.Approve}); err != nil {
		t.Fatal(err)
	}
	if _, trimmed, _ := b.index.get(rec.ID); !trimmed {
		t.Fatal("the index holds the large args")
	}
	page, err = b.List(ctx, Filter{Decided: true, Agent: "lister"})
	if err != nil {
		t.Fatal(err)
	}
	if len(page.Records) != 1 || page.Total != 1 || string(page.Records[0].Request.Args) != string(big) || page.Records[0].State != StateApproved {
		t.Fatalf("listed %d records (total %d), want the approved one with its args", len(page.Records), page.Total)
	}
}

// TestListPendingLeavesOutDecided: a listing of the pending requests leaves
// out one the bucket has decided while this replica's index, behind it,
// still holds it pending (a page loaded then would show a decided card among
// the pending, one no later event takes away).
func TestListPendingLeavesOutDecided(t *testing.T) {
	b, ctx := runInternal(t, testenv.Conn(t, testenv.Server(t)), Config{})

	open := submit(ctx, t, b, events.Requested{Tool: "open", Agent: "lister"})
	behind := submit(ctx, t, b, events.Requested{Tool: "behind", Agent: "lister"})
	// The index holds it pending at a revision no later change passes, as
	// if its watcher had not yet seen the cancel.
	stale := behind
	stale.revision = 1 << 40
	b.index.put(stale)
	if _, err := b.Cancel(ctx, behind.ID, "agent/lister", "not needed"); err != nil {
		t.Fatal(err)
	}
	if rec, err := b.load(ctx, behind.ID); err != nil || rec.State != StateCancelled {
		t.Fatalf("the bucket has %+v, %v; want it cancelled", rec, err)
	}

	listed := func(f Filter) []string {
		t.Helper()
		page, err := b.List(ctx, f)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, rec := range page.Records {
			got = append(got, rec.ID+" "+string(rec.State))
		}
		return got
	}
	if got, want := listed(Filter{State: StatePending, Agent: "lister"}), []string{open.ID + " pending"}; !slices.Equal(got, want) {
		t.Fatalf("pending listing %v, want %v", got, want)
	}
	// A listing of every state shows it as the bucket has it.
	if got, want := listed(Filter{Agent: "lister"}), []string{open.ID + " pending", behind.ID + " cancelled"}; !slices.Equal(got, want) {
		t.Fatalf("listing %v, want %v", got, want)
	}
}
