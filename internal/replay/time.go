package replay

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// ErrBadTime: a time that is neither RFC 3339 nor a time ago.
var ErrBadTime = errors.New("not a time")

// ParseTime reads a time as --since and --until take it: RFC 3339
// ("2026-11-22T10:00:00Z"), or how long before now, as a Go duration that
// may start with whole days ("7d", "36h", "1d12h", "90m"). An error wraps
// ErrBadTime.
func ParseTime(s string, now time.Time) (time.Time, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return time.Time{}, nil
	}
	if t, err := time.Parse(time.RFC3339, s); err == nil {
		return t.UTC(), nil
	}
	ago, err := parseAgo(s)
	if err != nil {
		return time.Time{}, fmt.Errorf("%w: %q: want RFC 3339 (2026-11-22T10:00:00Z) or a time ago such as 7d, 36h or 90m", ErrBadTime, s)
	}
	return now.Add(-ago).UTC(), nil
}

// parseAgo reads a duration of at least zero, with an optional leading
// number of days.
func parseAgo(s string) (time.Duration, error) {
	var days time.Duration
	if i := strings.IndexByte(s, 'd'); i > 0 {
		n, err := strconv.ParseUint(s[:i], 10, 16)
		if err != nil {
			return 0, err
		}
		days, s = time.Duration(n)*24*time.Hour, s[i+1:]
		if s == "" {
			return days, nil
		}
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return 0, errors.New("bad duration")
	}
	return days + d, nil
}
