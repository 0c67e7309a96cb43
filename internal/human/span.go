package human

import (
	"errors"
	"fmt"
	"strconv"
	"time"
)

// ParseSpan reads a positive duration written as Go writes them (90m,
// 1h30m) or with days and weeks too (7d, 2w, 1d12h): a day is 24 hours.
func ParseSpan(s string) (time.Duration, error) {
	var total time.Duration
	rest := s
	if rest == "" {
		return 0, errors.New("empty duration")
	}
	for rest != "" {
		i := 0
		for i < len(rest) && (rest[i] >= '0' && rest[i] <= '9' || rest[i] == '.') {
			i++
		}
		j := i
		for j < len(rest) && (rest[j] < '0' || rest[j] > '9') && rest[j] != '.' {
			j++
		}
		if i == 0 || j == i {
			return 0, fmt.Errorf("duration %q: want a number and a unit, such as 7d or 24h", s)
		}
		num, unit := rest[:i], rest[i:j]
		var d time.Duration
		switch unit {
		case "d", "w":
			n, err := strconv.ParseFloat(num, 64)
			if err != nil {
				return 0, fmt.Errorf("duration %q: %w", s, err)
			}
			day := 24 * float64(time.Hour)
			if unit == "w" {
				day *= 7
			}
			if n*day > float64(1<<62) {
				return 0, fmt.Errorf("duration %q: too long", s)
			}
			d = time.Duration(n * day)
		default:
			var err error
			if d, err = time.ParseDuration(num + unit); err != nil {
				return 0, fmt.Errorf("duration %q: unit %q: want w, d, h, m or s", s, unit)
			}
		}
		if total > 1<<62-d {
			return 0, fmt.Errorf("duration %q: too long", s)
		}
		total += d
		rest = rest[j:]
	}
	if total <= 0 {
		return 0, fmt.Errorf("duration %q: want more than zero", s)
	}
	return total, nil
}
