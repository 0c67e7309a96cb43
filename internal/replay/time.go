package replay

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/assent-dev/assent/internal/human"
)

// ErrBadTime: a time that is neither RFC 3339 nor a time ago.
var ErrBadTime = errors.New("not a time")

// ParseTime reads a time as --since and --until take it: RFC 3339
// ("2026-11-22T10:00:00Z"), or how long before now, as human.ParseSpan
// reads it ("7d", "36h", "1d12h", "90m"). An error wraps
// ErrBadTime.
func ParseTime(s string, now time.Time) (time.Time, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return time.Time{}, nil
	}
	if t, err := time.Parse(time.RFC3339, s); err == nil {
		return t.UTC(), nil
	}
	ago, err := human.ParseSpan(s)
	if err != nil {
		return time.Time{}, fmt.Errorf("%w: %q: want RFC 3339 (2026-11-22T10:00:00Z) or a time ago such as 7d, 36h or 90m", ErrBadTime, s)
	}
	return now.Add(-ago).UTC(), nil
}
