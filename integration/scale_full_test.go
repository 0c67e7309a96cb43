//go:build scale

package integration

import "time"

// TestScalePending's full size, issue 11's, with -tags scale:
//
//	go test ./integration -run TestScalePending -tags scale -v -timeout 60m -scale.out DIR
const (
	defaultScalePending  = 1000000
	defaultScaleExpiring = 50000
	// A CPU profile of the restart (it took about 20s before issue 11).
	defaultScaleRestartCPU = 30 * time.Second
	// Memory again once the stream's duplicate window (2m) has passed
	// since the last publish: the server then holds no message ids.
	defaultScaleSettle = 2*time.Minute + 10*time.Second
)
