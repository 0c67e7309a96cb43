// Command agent-worker is Assent's example agent and load generator.
//
//	agent-worker run --plan examples/plan.json --sandbox /tmp/demo --init-sandbox
//	agent-worker load --n 10000 --c 64
//
// docs/agent-worker.md walks through both; internal/worker holds the logic.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/assent-dev/assent/internal/logging"
	"github.com/assent-dev/assent/internal/textsafe"
	"github.com/assent-dev/assent/internal/worker"
)

func main() {
	os.Exit(run())
}

func run() int {
	cmd, err := worker.ParseArgs(os.Args[1:], os.Stderr)
	switch {
	case errors.Is(err, flag.ErrHelp):
		return 0
	case err != nil:
		return 2
	}

	log, err := logging.New(cmd.LogLevel.String(), false)
	if err != nil {
		fmt.Fprintf(os.Stderr, "agent-worker: logger: %v\n", err)
		return 1
	}
	defer log.Sync() //nolint:errcheck // stderr

	// Ctrl-C cancels ctx; a guarded step in flight then publishes a cancel.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	if err := cmd.Execute(ctx, log, os.Stdout, os.Stderr); err != nil {
		// The error may quote request data (a tool, a reason): escape it.
		fmt.Fprintf(os.Stderr, "agent-worker %s: %s\n", cmd.Name, textsafe.Line(err.Error()))
		return 1
	}
	return 0
}

// newLogger logs at level and above to stderr, in the console format.
