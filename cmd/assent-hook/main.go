// Command assent-hook asks Assent about a coding agent's own tool calls
// (its shell, edit, read and fetch tools), as the agent's before-tool
// command hook: the call as JSON on stdin, the answer on stdout.
//
//	assent-hook claude --hook-timeout 300s    # Claude Code, PreToolUse
//	assent-hook codex --hook-timeout 300s     # Codex, PreToolUse
//	assent-hook gemini --hook-timeout 300s    # Gemini CLI, BeforeTool
//
// docs/integrations.md shows each agent's configuration; internal/hook
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
	"github.com/assent-dev/assent/internal/hook"
)

func main() {
	os.Exit(run())
}

func run() int {
	cmd, err := hook.ParseArgs(os.Args[1:], envflag.OS(), os.Stderr)
	switch {
	case errors.Is(err, flag.ErrHelp):
		return 0
	case err != nil:
		// 2: the coding agents block the call, and show stderr.
		return 2
	}
	// SIGINT or SIGTERM withdraws the request and denies the call.
	return cmdrun.Run("assent-hook "+cmd.Name, cmd.LogLevel.String(), func(ctx context.Context, log *zap.Logger) error {
		return cmd.Execute(ctx, log, os.Stdin, os.Stdout)
	})
}
