package itest

import (
	"time"

	"github.com/assent-dev/assent/internal/clustertest"
)

// Quantile returns the q-quantile of sorted ds (nearest rank), 0 if empty.
func Quantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	i := int(q*float64(len(ds))+0.5) - 1
	i = max(0, min(i, len(ds)-1))
	return ds[i].Round(time.Millisecond)
}

// Tail returns the last n lines of s.
func Tail(s string, n int) string { return clustertest.Tail(s, n) }
