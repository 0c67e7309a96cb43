package mcpconformance_test

import (
	"testing"

	"github.com/assent-dev/assent/integration/itest"
)

// TestMain runs the tests, then removes the programs they built.
func TestMain(m *testing.M) { itest.Main(m) }
