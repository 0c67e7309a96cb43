// Command broker runs Assent: an approval broker for AI agents on NATS JetStream.
//
//	broker [flags]                                  run the broker (embedded NATS unless --nats-url)
//	broker policy check FILE                        validate a policy file
//	broker policy test --policy FILE --request FILE evaluate one request offline
//	broker remembered [--http URL]                  list remembered choices
//	broker remembered revoke ID [--http URL]        revoke one
//	broker audit [filters] [--http URL]             the audit log as JSON lines
//	broker token create NAME --principal P --auth F make an API token
//	broker token revoke NAME --auth FILE            revoke one
//	broker token list --auth FILE                   list them
//	broker creds init|agent|approver|bot|broker ...  NATS credentials per role (docs/security.md)
//	broker decision-key new --out FILE              make a key to sign decisions with
//	broker version                                  print the version
//
// "broker -h" lists the flags; "broker help" and "broker COMMAND -h" describe
// the commands, which internal/app implements (app.CLI, app.ParseServe).
// Every flag can also come from the environment (docs/configuration.md).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/assent-dev/assent/internal/app"
	"github.com/assent-dev/assent/internal/envflag"
	"github.com/assent-dev/assent/internal/logging"
)

var version = "dev"

func main() {
	args := os.Args[1:]
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		// A command (policy, remembered, version, help) rather than flags.
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		code := app.CLI{Version: version, Stdout: os.Stdout, Stderr: os.Stderr, Env: envflag.OS()}.Run(ctx, args)
		stop()
		os.Exit(code)
	}
	if err := serve(args); err != nil && !errors.Is(err, flag.ErrHelp) {
		fmt.Fprintln(os.Stderr, "broker:", err)
		os.Exit(2)
	}
}

func serve(args []string) error {
	s, err := app.ParseServe(args, envflag.OS(), os.Stderr)
	if err != nil {
		return err
	}
	log, err := logging.New(s.LogLevel, s.LogJSON)
	if err != nil {
		return err
	}
	defer log.Sync() //nolint:errcheck // nothing to do about it at exit

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	reload := make(chan struct{}, 1)
	go func() {
		for {
			select {
			case <-hup:
				select {
				case reload <- struct{}{}:
				default:
				}
			case <-ctx.Done():
				return
			}
		}
	}()
	s.Options.Reload = reload
	return app.Run(ctx, s.Options, log)
}
