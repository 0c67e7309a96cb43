// Command broker runs Assent: an approval broker for AI agents on NATS JetStream.
//
//	broker [flags]                                  run the broker (embedded NATS unless --nats-url)
//	broker policy check FILE                        validate a policy file
//	broker policy test --policy FILE --request FILE evaluate one request offline
//	broker remembered [--http URL]                  list remembered choices
//	broker remembered revoke ID [--http URL]        revoke one
//	broker version                                  print the version
//
// Run "broker -h" for the flags.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/assent-dev/assent/internal/app"
	"github.com/assent-dev/assent/internal/broker"
	"github.com/assent-dev/assent/internal/logging"
)

var version = "dev"

func main() {
	err := dispatch(os.Args[1:])
	var exit exitCode
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
	case errors.As(err, &exit):
		os.Exit(int(exit))
	default:
		fmt.Fprintln(os.Stderr, "broker:", err)
		os.Exit(2)
	}
}

// exitCode ends the process with a status and no further message.
type exitCode int

func (e exitCode) Error() string { return fmt.Sprintf("exit %d", int(e)) }

func dispatch(args []string) error {
	if len(args) == 0 {
		return serve(args)
	}
	switch args[0] {
	case "version":
		fmt.Println("assent broker", version)
		return nil
	case "policy":
		return policyCmd(args[1:])
	case "remembered":
		return rememberedCmd(args[1:])
	}
	return serve(args)
}

func policyCmd(args []string) error {
	if len(args) == 0 {
		return errors.New("policy: want 'check FILE' or 'test --policy FILE --request FILE'")
	}
	switch args[0] {
	case "check":
		if len(args) != 2 {
			return errors.New("usage: broker policy check FILE")
		}
		if !app.PolicyCheck(os.Stdout, args[1]) {
			return exitCode(1)
		}
		return nil
	case "test":
		fs := flag.NewFlagSet("policy test", flag.ContinueOnError)
		pol := fs.String("policy", "", "policy `file`")
		req := fs.String("request", "", "request `file`: the requested data as JSON, or a whole CloudEvent")
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		if *pol == "" || *req == "" {
			return errors.New("usage: broker policy test --policy FILE --request FILE")
		}
		return app.PolicyTest(os.Stdout, *pol, *req, time.Now())
	}
	return fmt.Errorf("policy: unknown subcommand %q (want check or test)", args[0])
}

func rememberedCmd(args []string) error {
	fs := flag.NewFlagSet("remembered", flag.ContinueOnError)
	base := fs.String("http", "http://127.0.0.1:8080", "the broker's HTTP API")
	revoke := ""
	if len(args) >= 2 && args[0] == "revoke" {
		revoke, args = args[1], args[2:]
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return errors.New("usage: broker remembered [--http URL] | broker remembered revoke ID [--http URL]")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if revoke != "" {
		return app.RememberedRevoke(ctx, os.Stdout, *base, revoke)
	}
	return app.RememberedList(ctx, os.Stdout, *base)
}

func serve(args []string) error {
	fs := flag.NewFlagSet("broker", flag.ContinueOnError)
	var (
		o        app.Options
		mode     = fs.String("mode", "manual", "without --policy: manual, auto-approve or auto-deny")
		logLevel = fs.String("log-level", "info", "debug, info, warn or error")
		logJSON  = fs.Bool("log-json", false, "log JSON lines instead of console text")
	)
	fs.StringVar(&o.PolicyFile, "policy", "", "policy `file` (YAML); reloaded on SIGHUP or when it changes (docs/policy.md)")
	fs.StringVar(&o.ShadowPolicyFile, "shadow-policy", "", "candidate policy `file` evaluated beside --policy; disagreements are recorded, never acted on")
	fs.StringVar(&o.NATSURL, "nats-url", "", "use this NATS server or cluster instead of the embedded one")
	fs.StringVar(&o.NATSCreds, "nats-creds", "", "NATS credentials file for --nats-url")
	fs.StringVar(&o.NATSListen, "nats-listen", "127.0.0.1:4222", "embedded NATS: where clients connect (port 0: any free port)")
	fs.StringVar(&o.DataDir, "data", "./assent-data", "embedded NATS: JetStream storage directory")
	fs.StringVar(&o.Sync, "sync", "always", "embedded NATS: fsync every write (always) or on an interval such as 2m (faster, can lose acknowledged writes on power loss)")
	fs.StringVar(&o.HTTPListen, "http", "127.0.0.1:8080", "HTTP API address; empty disables it")
	fs.StringVar(&o.Broker.Name, "name", "", "replica name (default: host name)")
	fs.DurationVar(&o.Broker.DefaultTimeout, "timeout", 0, "timeout for requests that ask for none (default 5m)")
	fs.DurationVar(&o.Broker.MaxTimeout, "max-timeout", 0, "longest timeout a request may ask for (default 24h)")
	fs.DurationVar(&o.Broker.Retention, "retention", 0, "how long events and request state are kept (default 720h)")
	fs.IntVar(&o.Broker.Replicas, "replicas", 0, "JetStream replicas for the stream and buckets (default 1; 3 on a cluster)")
	fs.IntVar(&o.Broker.Workers, "workers", 0, "concurrent handlers per consumer (default 64)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q (subcommands: policy, remembered, version)", fs.Arg(0))
	}
	m, err := broker.ParseMode(*mode)
	if err != nil {
		return err
	}
	o.Broker.Mode = m
	log, err := logging.New(*logLevel, *logJSON)
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
	o.Reload = reload
	return app.Run(ctx, o, log)
}
