//go:build !scale

package scale

// TestScalePending's size in the regular suite (CI); the scale build tag
// (scale_full_test.go) raises it to issue 11's million.
const (
	defaultScaleRecord   = 5000
	defaultScalePending  = 20000
	defaultScaleExpiring = 5000
	// No CPU profile of the restart, no wait for the duplicate window.
	defaultScaleRestartCPU = 0
	defaultScaleSettle     = 0
)
