// Package cmdrun is the frame around a command of Assent's smaller programs
// (agent-worker, mcp-gateway): a logger on stderr, a context that SIGINT and
// SIGTERM cancel, and the process's exit status.
package cmdrun

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"go.uber.org/zap"

	"github.com/assent-dev/assent/internal/logging"
	"github.com/assent-dev/assent/internal/textsafe"
)

// Run runs exec with a logger at level on stderr and a context that SIGINT
// or SIGTERM cancels, and returns the exit status: 0, or 1 after printing
// exec's error as "what: error". The error is escaped: it may quote request
// data or what a server said.
func Run(what, level string, exec func(ctx context.Context, log *zap.Logger) error) int {
	log, err := logging.New(level, false)
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: logger: %v\n", what, err)
		return 1
	}
	defer log.Sync() //nolint:errcheck // stderr

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	if err := exec(ctx, log); err != nil {
		fmt.Fprintf(os.Stderr, "%s: %s\n", what, textsafe.Line(err.Error()))
		return 1
	}
	return 0
}
