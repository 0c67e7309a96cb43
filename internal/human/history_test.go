package human

import (
	"testing"
	"time"

	"github.com/assent-dev/assent/pkg/events"
)

func TestHistory(t *testing.T) {
	now := time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)
	month := events.Duration(30 * 24 * time.Hour)
	tests := []struct {
		name string
		h    *events.History
		want string
	}{
		{"none: the broker had not read the record", nil, ""},
		{"the brief's line", &events.History{Window: month, Approved: 41, Exact: 3, Principals: []string{"alice", "bob"}, LastDenied: now.Add(-4 * 24 * time.Hour)},
			"approved 41 of 41 times in 30 days (3 with these exact arguments), by alice and bob; last denied 4 days ago"},
		{"never denied", &events.History{Window: month, Approved: 41, Exact: 41, Principals: []string{"alice"}},
			"approved 41 of 41 times in 30 days (41 with these exact arguments), by alice; last denied never"},
		{"never with these arguments", &events.History{Window: month, Approved: 41, Principals: []string{"alice"}},
			"approved 41 of 41 times in 30 days (none with these exact arguments), by alice; last denied never"},
		{"denied and expired", &events.History{Window: month, Approved: 38, Denied: 2, Expired: 1, Exact: 1, Principals: []string{"alice", "bob", "carol"}, LastDenied: now.Add(-3 * time.Hour)},
			"approved 38 of 41 times in 30 days (2 denied, 1 expired; 1 with these exact arguments), by alice, bob and carol; last denied 3 hours ago"},
		{"only expired", &events.History{Window: month, Expired: 2},
			"approved 0 of 2 times in 30 days (2 expired; none with these exact arguments); last denied never"},
		{"once, singular", &events.History{Window: month, Approved: 1, Exact: 1, Principals: []string{"bob"}},
			"approved 1 of 1 time in 30 days (1 with these exact arguments), by bob; last denied never"},
		{"always denied", &events.History{Window: month, Denied: 5, Principals: []string{"bob"}, LastDenied: now.Add(-time.Hour)},
			"approved 0 of 5 times in 30 days (5 denied; none with these exact arguments), by bob; last denied 1 hour ago"},
		{"many names", &events.History{Window: month, Approved: 9, Principals: []string{"alice", "bob", "carol", "dave", "erin"}},
			"approved 9 of 9 times in 30 days (none with these exact arguments), by alice, bob, carol and others; last denied never"},
		{"nobody named", &events.History{Window: month, Approved: 2, Exact: 2},
			"approved 2 of 2 times in 30 days (2 with these exact arguments); last denied never"},
		{"first time", &events.History{Window: month},
			"first time: no earlier requests of this tool by this agent in 30 days"},
		{"first time in the window, denied before it", &events.History{Window: month, LastDenied: now.Add(-45 * 24 * time.Hour)},
			"first time: no earlier requests of this tool by this agent in 30 days; last denied 45 days ago"},
		{"a day's window", &events.History{Window: events.Duration(24 * time.Hour), Approved: 3, Exact: 3},
			"approved 3 of 3 times in 24 hours (3 with these exact arguments); last denied never"},
		{"one minute ago", &events.History{Window: month, Approved: 1, Denied: 1, LastDenied: now.Add(-90 * time.Second)},
			"approved 1 of 2 times in 30 days (1 denied; none with these exact arguments); last denied 1 minute ago"},
		{"just now", &events.History{Window: month, Denied: 1, LastDenied: now.Add(-10 * time.Second)},
			"approved 0 of 1 time in 30 days (1 denied; none with these exact arguments); last denied just now"},
		{"a clock ahead", &events.History{Window: month, Denied: 1, LastDenied: now.Add(time.Hour)},
			"approved 0 of 1 time in 30 days (1 denied; none with these exact arguments); last denied just now"},
		{"yesterday", &events.History{Window: month, Denied: 1, LastDenied: now.Add(-47 * time.Hour)},
			"approved 0 of 1 time in 30 days (1 denied; none with these exact arguments); last denied 47 hours ago"},
		{"one day, singular", &events.History{Window: month, Denied: 1, LastDenied: now.Add(-49 * time.Hour)},
			"approved 0 of 1 time in 30 days (1 denied; none with these exact arguments); last denied 2 days ago"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := History(tt.h, now); got != tt.want {
				t.Errorf("History =\n%q\nwant\n%q", got, tt.want)
			}
		})
	}
}

func TestWindow(t *testing.T) {
	for d, want := range map[time.Duration]string{
		30 * 24 * time.Hour:                "30 days",
		7 * 24 * time.Hour:                 "7 days",
		48 * time.Hour:                     "2 days",
		60 * time.Hour:                     "3 days", // 2.5 days, rounded
		24 * time.Hour:                     "24 hours",
		2 * time.Hour:                      "2 hours",
		90 * time.Minute:                   "90 minutes",
		time.Minute:                        "1 minute",
		time.Hour + 29*time.Second:         "60 minutes",
		30 * time.Second:                   "30 seconds",
		time.Second:                        "1 second",
		366 * 24 * time.Hour:               "366 days",
		24*time.Hour*30 + 11*time.Hour:     "30 days",
		24*time.Hour*30 + 12*time.Hour:     "31 days",
		2*time.Hour + 29*time.Minute:       "2 hours",
		2*time.Hour + 30*time.Minute:       "3 hours",
		47*time.Hour + 59*time.Minute:      "48 hours",
		119*time.Second + time.Millisecond: "2 minutes",
	} {
		if got := window(d); got != want {
			t.Errorf("window(%s) = %q, want %q", d, got, want)
		}
	}
}
