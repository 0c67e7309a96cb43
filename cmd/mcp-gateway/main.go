// Command mcp-gateway puts Assent in front of MCP servers: it offers their
// tools unchanged to an MCP client (a desktop assistant, an IDE agent) and
// asks Assent before each call runs.
//
//	mcp-gateway --config gateway.yaml                 # stdio, for a client that starts it
//	mcp-gateway --http 127.0.0.1:8931 --config gateway.yaml
//	mcp-gateway --agent claude -- agent-worker mcp --sandbox /srv/files
//	mcp-gateway check --config gateway.yaml
//	mcp-gateway health --url http://127.0.0.1:8931/mcp
//
// docs/integrations.md shows the clients' configuration; internal/mcpgateway
// holds the logic.
package main

import (
	"context"
	"errors"
	"flag"
	"os"

	"go.uber.org/zap"

	"github.com/assent-dev/assent/internal/cmdrun"
	"github.com/assent-dev/assent/internal/envflag"
	"github.com/assent-dev/assent/internal/healthcheck"
	"github.com/assent-dev/assent/internal/mcpgateway"
	"github.com/assent-dev/assent/internal/tracing"
)

func main() {
	os.Exit(run())
}

func run() int {
	if len(os.Args) > 1 && os.Args[1] == "health" {
		// For images: the gateway has no health route, so any answer of
		// /mcp below 500 means it serves (docs/deploy.md).
		return healthcheck.Main(context.Background(), "mcp-gateway health",
			healthcheck.Options{URL: "http://127.0.0.1:8931/mcp", AnyStatus: true}, os.Args[2:], os.Stdout, os.Stderr)
	}
	cmd, err := mcpgateway.ParseArgs(os.Args[1:], envflag.OS(), os.Stderr)
	switch {
	case errors.Is(err, flag.ErrHelp):
		return 0
	case err != nil:
		return 2
	}
	// SIGINT or SIGTERM withdraws the calls in flight and stops.
	return cmdrun.Run("mcp-gateway "+cmd.Name, cmd.LogLevel.String(), func(ctx context.Context, log *zap.Logger) error {
		stop, err := tracing.Start(ctx, cmd.Tracing, tracing.ServiceMCPGateway, log)
		if err != nil {
			return err
		}
		defer stop()
		return cmd.Execute(ctx, log, os.Stdin, os.Stdout, os.Stderr)
	})
}
