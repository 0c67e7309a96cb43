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
	"os"

	"go.uber.org/zap"

	"github.com/assent-dev/assent/internal/cmdrun"
	"github.com/assent-dev/assent/internal/envflag"
	"github.com/assent-dev/assent/internal/tracing"
	"github.com/assent-dev/assent/internal/worker"
)

func main() {
	os.Exit(run())
}

func run() int {
	cmd, err := worker.ParseArgs(os.Args[1:], envflag.OS(), os.Stderr)
	switch {
	case errors.Is(err, flag.ErrHelp):
		return 0
	case err != nil:
		return 2
	}
	// Ctrl-C cancels ctx; a guarded step in flight then publishes a cancel.
	return cmdrun.Run("agent-worker "+cmd.Name, cmd.LogLevel.String(), func(ctx context.Context, log *zap.Logger) error {
		stop, err := tracing.Start(ctx, cmd.Tracing, tracing.ServiceAgentWorker, log)
		if err != nil {
			return err
		}
		defer stop()
		return cmd.Execute(ctx, log, os.Stdout, os.Stderr)
	})
}
