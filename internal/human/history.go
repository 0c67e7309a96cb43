package human

import (
	"fmt"
	"strings"
	"time"

	"github.com/assent-dev/assent/pkg/events"
)

// maxNames is how many of a History's principals the line names.
const maxNames = 3

// History says in one line what the record said of requests like a pending
// one (events.Pending.History), at now:
//
//	approved 41 of 41 times in 30 days (3 with these exact arguments), by alice and bob; last denied never
//	approved 38 of 41 times in 30 days (2 denied, 1 expired; none with these exact arguments), by alice; last denied 4 days ago
//	first time: no earlier requests of this tool by this agent in 30 days
//
// and "" for nil (the broker had not read the record). The line is the
// broker's words, not the agent's: the names in it are principals'
// (events.History.Validate), and every number is the broker's count.
func History(h *events.History, now time.Time) string {
	if h == nil {
		return ""
	}
	span := window(h.Window.Std())
	total := h.Approved + h.Denied + h.Expired
	var b strings.Builder
	if total <= 0 {
		b.WriteString("first time: no earlier requests of this tool by this agent in " + span)
		if !h.LastDenied.IsZero() {
			b.WriteString("; last denied " + ago(now.Sub(h.LastDenied)))
		}
		return b.String()
	}
	fmt.Fprintf(&b, "approved %d of %s in %s", h.Approved, count(total, "time", "times"), span)
	var others []string
	if h.Denied > 0 {
		others = append(others, fmt.Sprintf("%d denied", h.Denied))
	}
	if h.Expired > 0 {
		others = append(others, fmt.Sprintf("%d expired", h.Expired))
	}
	exact := "none with these exact arguments"
	if h.Exact > 0 {
		exact = fmt.Sprintf("%d with these exact arguments", h.Exact)
	}
	paren := exact
	if len(others) > 0 {
		paren = strings.Join(others, ", ") + "; " + exact
	}
	b.WriteString(" (" + paren + ")")
	if by := names(h.Principals); by != "" {
		b.WriteString(", by " + by)
	}
	b.WriteString("; last denied ")
	if h.LastDenied.IsZero() {
		b.WriteString("never")
	} else {
		b.WriteString(ago(now.Sub(h.LastDenied)))
	}
	return b.String()
}

// names lists principals as a sentence does: "alice", "alice and bob",
// "alice, bob and carol", "alice, bob, carol and others".
func names(ps []string) string {
	switch {
	case len(ps) == 0:
		return ""
	case len(ps) == 1:
		return ps[0]
	case len(ps) > maxNames:
		return strings.Join(ps[:maxNames], ", ") + " and others"
	}
	return strings.Join(ps[:len(ps)-1], ", ") + " and " + ps[len(ps)-1]
}

// count says n of a thing: "1 time", "41 times".
func count(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return fmt.Sprintf("%d %s", n, many)
}

// window says how long a span of the record is: "30 days", "12 hours",
// "45 minutes"; uneven spans are rounded to the unit that reads best.
func window(d time.Duration) string {
	switch {
	case d >= 48*time.Hour:
		return count(int((d+12*time.Hour)/(24*time.Hour)), "day", "days")
	case d >= 2*time.Hour:
		return count(int((d+30*time.Minute)/time.Hour), "hour", "hours")
	case d >= time.Minute:
		return count(int((d+30*time.Second)/time.Minute), "minute", "minutes")
	}
	return count(int(d/time.Second), "second", "seconds")
}

// ago says how long ago something happened, d before now: "just now",
// "5 minutes ago", "3 hours ago", "4 days ago". A time after now (a clock
// ahead) is "just now".
func ago(d time.Duration) string {
	switch {
	case d < time.Minute:
		return "just now"
	case d < time.Hour:
		return count(int(d/time.Minute), "minute", "minutes") + " ago"
	case d < 48*time.Hour:
		return count(int(d/time.Hour), "hour", "hours") + " ago"
	}
	return count(int(d/(24*time.Hour)), "day", "days") + " ago"
}
