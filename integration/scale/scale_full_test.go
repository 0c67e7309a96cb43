//go:build scale

package scale

import (
	"time"
)

// TestScalePending's full size, issue 11's, with -tags scale:
//
//	go test ./integration/scale -run TestScalePending -tags scale -v -timeout 60m -scale.out DIR
const (
	defaultScaleRecord   = 1000000
	defaultScalePending  = 1000000
	defaultScaleExpiring = 50000
	// A CPU profile of the restart (it took about 20s before issue 11).
	defaultScaleRestartCPU = 30 * time.Second
	// Memory again once the stream's duplicate window (30s) has passed
	// since the ingest ended: the server then holds no message ids.
	defaultScaleSettle = 40 * time.Second
)
