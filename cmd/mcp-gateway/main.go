// Command mcp-gateway puts Assent in front of MCP servers: it offers their
// tools unchanged to an MCP client (a desktop assistant, an IDE agent) and
// asks Assent before each call runs.
//
//	mcp-gateway --config gateway.yaml                 # stdio, for a client that starts it
//	mcp-gateway --http 127.0.0.1:8931 --config gateway.yaml
//	mcp-gateway --agent claude -- agent-worker mcp --sandbox /srv/files
//	mcp-gateway check --config gateway.yaml
//
// docs/integrations.md shows the clients' configuration; internal/mcpgateway
// holds the logic.
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
	"github.com/assent-dev/assent/internal/mcpgateway"
	"github.com/assent-dev/assent/internal/textsafe"
)

func main() {
	os.Exit(run())
}

func run() int {
	cmd, err := mcpgateway.ParseArgs(os.Args[1:], os.Stderr)
	switch {
	case errors.Is(err, flag.ErrHelp):
		return 0
	case err != nil:
		return 2
	}

	log, err := logging.New(cmd.LogLevel.String(), false)
	if err != nil {
		fmt.Fprintf(os.Stderr, "mcp-gateway: logger: %v\n", err)
		return 1
	}
	defer log.Sync() //nolint:errcheck // stderr

	// SIGINT or SIGTERM withdraws the calls in flight and stops.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	if err := cmd.Execute(ctx, log, os.Stdin, os.Stdout, os.Stderr); err != nil {
		// The error may quote what an upstream or the broker said: escape it.
		fmt.Fprintf(os.Stderr, "mcp-gateway %s: %s\n", cmd.Name, textsafe.Line(err.Error()))
		return 1
	}
	return 0
}
