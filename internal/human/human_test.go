package human

import (
	"testing"
	"time"
)

func TestDuration(t *testing.T) {
	for d, want := range map[time.Duration]string{
		0:                                 "0s",
		45 * time.Second:                  "45s",
		4*time.Minute + 10*time.Second:    "4m 10s",
		3*time.Hour + 5*time.Minute:       "3h 5m",
		47*time.Hour + 59*time.Minute:     "47h 59m",
		50 * time.Hour:                    "2d",
		9*24*time.Hour + 23*time.Hour:     "9d",
		59*time.Second + time.Millisecond: "59s",
	} {
		if got := Duration(d); got != want {
			t.Errorf("Duration(%s) = %q, want %q", d, got, want)
		}
	}
}
