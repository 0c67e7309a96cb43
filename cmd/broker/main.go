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
// the commands, which internal/app implements (app.CLI).
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
	"github.com/assent-dev/assent/internal/broker"
	"github.com/assent-dev/assent/internal/logging"
	"github.com/assent-dev/assent/internal/natsembed"
	"github.com/assent-dev/assent/internal/tracing"
	"github.com/assent-dev/assent/pkg/events"
)

var version = "dev"

func main() {
	args := os.Args[1:]
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		// A command (policy, remembered, version, help) rather than flags.
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		code := app.CLI{Version: version, Stdout: os.Stdout, Stderr: os.Stderr}.Run(ctx, args)
		stop()
		os.Exit(code)
	}
	if err := serve(args); err != nil && !errors.Is(err, flag.ErrHelp) {
		fmt.Fprintln(os.Stderr, "broker:", err)
		os.Exit(2)
	}
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
	fs.StringVar(&o.NATSOperator, "nats-operator", "", "embedded NATS: run in operator mode with the credentials authority in `DIR` (broker creds init): only clients with credentials it issued connect, each bound by its role's permissions (docs/security.md)")
	var tlsCert, tlsKey, tlsClientCA string
	fs.StringVar(&tlsCert, "nats-tls-cert", "", "embedded NATS: serve clients over TLS with this certificate `file` (PEM, with its chain)")
	fs.StringVar(&tlsKey, "nats-tls-key", "", "embedded NATS: the TLS certificate's key `file`")
	fs.StringVar(&tlsClientCA, "nats-tls-client-ca", "", "embedded NATS: mutual TLS, every client presents a certificate signed by the CA in this `file`")
	fs.StringVar(&o.NATSCA, "nats-ca", "", "with --nats-url: the CA `file` of the server's TLS certificate, if the system does not trust it")
	fs.StringVar(&o.NATSCert, "nats-cert", "", "with --nats-url: a client certificate `file`, for a server that asks for one (mutual TLS)")
	fs.StringVar(&o.NATSKey, "nats-key", "", "with --nats-url: the client certificate's key `file`")
	fs.StringVar(&o.NATSListen, "nats-listen", "127.0.0.1:4222", "embedded NATS: where clients connect (port 0: any free port)")
	fs.StringVar(&o.DataDir, "data", "./assent-data", "embedded NATS: JetStream storage directory")
	fs.StringVar(&o.Sync, "sync", "always", "embedded NATS: fsync every write (always) or on an interval such as 2m (faster, can lose acknowledged writes on power loss)")
	fs.StringVar(&o.HTTPListen, "http", "127.0.0.1:8080", "HTTP API and web UI address; empty disables it; without --auth, loopback only")
	fs.StringVar(&o.PprofListen, "pprof", "", "serve Go's runtime profiles (net/http/pprof, /debug/pprof/) at this loopback `address` (127.0.0.1:6060), on a listener of its own; off when empty; other addresses are refused: tunnel to it (docs/architecture.md#profiling)")
	fs.StringVar(&o.AuthFile, "auth", "", "auth `file` (YAML): API tokens, OIDC sign-in, a trusted proxy (docs/web.md); answers are then made as the caller; reloaded on SIGHUP or when it changes")
	fs.StringVar(&o.Broker.Name, "name", "", "replica name (default: host name)")
	fs.DurationVar(&o.Broker.DefaultTimeout, "timeout", 0, "timeout for requests that ask for none (default 5m)")
	fs.DurationVar(&o.Broker.MaxTimeout, "max-timeout", 0, "longest timeout a request may ask for (default 24h)")
	fs.DurationVar(&o.Broker.Retention, "retention", 0, "how long events and request state are kept (default 720h)")
	fs.IntVar(&o.Broker.Replicas, "replicas", 0, "JetStream replicas for the stream and buckets (default 1; 3 on a cluster)")
	fs.IntVar(&o.Broker.Workers, "workers", 0, "concurrent handlers per consumer (default 64)")
	fs.Func("decision-key", "sign every decision with the nkeys account seed in `file` (broker decision-key new); agents that trust its public key refuse decisions it did not sign (docs/protocol.md)", func(path string) (err error) {
		o.Broker.DecisionKey, err = app.ReadDecisionKey(path)
		return err
	})
	fs.Func("trust-decision-key", "with --decision-key, while keys rotate: decisions signed by this earlier decision `key` (public, A...) are a broker's too; repeat it or separate keys with commas", func(v string) error {
		keys, err := events.ParseTrustedKeys(v)
		o.Broker.TrustedDecisionKeys = append(o.Broker.TrustedDecisionKeys, keys...)
		return err
	})
	tracing.RegisterFlags(fs, &o.Tracing)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), "usage: broker [flags]\n\nRuns the broker. \"broker help\" lists the other commands (policy, remembered, version).\n\nflags:\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q (subcommands: policy, remembered, version)", fs.Arg(0))
	}
	if tlsCert != "" || tlsKey != "" || tlsClientCA != "" {
		o.NATSTLS = &natsembed.TLS{CertFile: tlsCert, KeyFile: tlsKey, ClientCAFile: tlsClientCA}
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
