// Command approver-bot brings Assent's pending approvals to people where they
// are (Slack, email, other systems through webhooks, a terminal) and their
// answers back to the broker.
//
//	approver-bot run --config FILE            run the configured channels
//	approver-bot check --config FILE          check a configuration and its policy
//	approver-bot cli --principal P [flags]    approve from a terminal
//	approver-bot webhooks log [flags]         the webhook delivery log, as JSON lines
//	approver-bot version                      print the version
//
// Configuration and setup: docs/channels.md.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/assent-dev/assent/internal/bot"
	"github.com/assent-dev/assent/internal/envflag"
)

var version = "dev"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := bot.Main(ctx, version, os.Args[1:], envflag.OS(), os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
