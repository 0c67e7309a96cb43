package bot

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/assent-dev/assent/internal/app"
	"github.com/assent-dev/assent/internal/channels"
	"github.com/assent-dev/assent/internal/channels/terminal"
	"github.com/assent-dev/assent/internal/channels/webhook"
	"github.com/assent-dev/assent/internal/envflag"
	"github.com/assent-dev/assent/internal/healthcheck"
	"github.com/assent-dev/assent/internal/logging"
	"github.com/assent-dev/assent/internal/natsconn"
	"github.com/assent-dev/assent/internal/tracing"
	"github.com/assent-dev/assent/pkg/events"
)

// Exit codes of Main.
const (
	ExitOK    = 0
	ExitError = 1 // the command failed; the error has been printed
	ExitUsage = 2 // the command line is wrong; the usage has been printed
)

const usage = `approver-bot brings Assent's pending approvals to people (Slack, email,
webhooks, a terminal) and their answers back to the broker.

Usage:
  approver-bot run --config FILE            run the configured channels
  approver-bot check --config FILE          check a configuration and its policy
  approver-bot cli --principal P [flags]    approve from a terminal
  approver-bot webhooks log [flags]         the webhook delivery log, as JSON lines
  approver-bot health [--url URL]           ask a running bot's /readyz and /status
  approver-bot version                      print the version

"approver-bot COMMAND -h" describes a command. Setup: docs/channels.md.
`

// Commands are the names of the commands that Main runs.
var commands = []string{"run", "check", "cli", "webhooks log", "health", "version"}

// Commands returns the names of the commands that Main runs, in the order
// the usage lists them.
func Commands() []string {
	return slices.Clone(commands)
}

// FlagSet returns the flag set of the command called name, as Main defines
// it to parse the command's arguments; nil if there is no such command.
func FlagSet(name string) *flag.FlagSet {
	if !slices.Contains(commands, name) {
		return nil
	}
	fs, _ := newFlagSet(context.Background(), name, "", io.Discard)
	return fs
}

// Main runs the command line args, reading the flags not given from env
// (envflag), and returns the exit code.
func Main(ctx context.Context, version string, args []string, env envflag.Env, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return ExitUsage
	}
	cmd, rest := args[0], args[1:]
	if cmd == "webhooks" {
		if len(rest) == 0 || rest[0] != "log" {
			fmt.Fprintln(stderr, "approver-bot webhooks: want a subcommand: log")
			return ExitUsage
		}
		cmd, rest = "webhooks log", rest[1:]
	}
	switch {
	case cmd == "help" || cmd == "-h" || cmd == "--help":
		fmt.Fprint(stdout, usage)
		return ExitOK
	case !slices.Contains(commands, cmd):
		fmt.Fprintf(stderr, "approver-bot: unknown command %q\n\n%s", cmd, usage)
		return ExitUsage
	}
	fs, run := newFlagSet(ctx, cmd, version, stdout)
	fs.SetOutput(stderr)
	if err := envflag.Parse(fs, rest, env, stderr); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return ExitOK
		}
		return ExitUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "approver-bot %s: unexpected arguments %q\n", cmd, fs.Args())
		fs.Usage()
		return ExitUsage
	}
	if err := run(); err != nil {
		var u usageError
		if errors.As(err, &u) {
			fmt.Fprintf(stderr, "approver-bot %s: %s\n", cmd, u)
			fs.Usage()
			return ExitUsage
		}
		fmt.Fprintf(stderr, "approver-bot %s: %v\n", cmd, err)
		return ExitError
	}
	return ExitOK
}

// newFlagSet returns a new flag set with the flags of the command called
// cmd (one of commands), and what runs the command once it is parsed.
func newFlagSet(ctx context.Context, cmd, version string, stdout io.Writer) (*flag.FlagSet, func() error) {
	fs := flag.NewFlagSet("approver-bot "+cmd, flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage of %s:\n", fs.Name())
		envflag.PrintDefaults(fs)
	}
	var run func() error
	switch cmd {
	case "run", "check":
		config := fs.String("config", "", "the configuration `file` (YAML, docs/channels.md)")
		logLevel := fs.String("log-level", "info", "debug, info, warn or error")
		logJSON := fs.Bool("log-json", false, "log JSON lines instead of console text")
		var tc tracing.Config
		tracing.RegisterFlags(fs, &tc)
		run = func() error {
			if *config == "" {
				return usageError("missing --config FILE (or ASSENT_CONFIG)")
			}
			cfg, err := LoadConfig(*config)
			if err != nil {
				return err
			}
			if cmd == "check" {
				return check(ctx, cfg, stdout)
			}
			log, err := logging.New(*logLevel, *logJSON)
			if err != nil {
				return usageError(err.Error())
			}
			defer log.Sync() //nolint:errcheck // nothing to do about it
			stop, err := tracing.Start(ctx, tc, tracing.ServiceApproverBot, log)
			if err != nil {
				return usageError(err.Error())
			}
			defer stop()
			b, err := New(cfg, log)
			if err != nil {
				return err
			}
			return b.Run(ctx)
		}
	case "cli":
		principal := fs.String("principal", "", "who you answer as: a principal of the policy")
		conn := natsFlags(fs, "the broker uses")
		policyFile := fs.String("policy", "", "the policy `file`, to show which requests you may answer (optional: the broker judges anyway)")
		agents := fs.String("agent", "", "only these `agents`' requests, comma-separated")
		var trusted []string
		fs.Func("trust-decision-key", "take only decisions signed by the broker's decision `key` (public, A...); repeat it or separate keys with commas while keys rotate", func(v string) error {
			keys, err := events.ParseTrustedKeys(v)
			trusted = append(trusted, keys...)
			return err
		})
		run = func() error {
			if *principal == "" {
				return usageError("missing --principal (or ASSENT_PRINCIPAL): the principal of the policy you answer as")
			}
			nc, err := connect(*conn)
			if err != nil {
				return err
			}
			defer nc.Close()
			o := terminal.Options{NATS: nc, Principal: *principal, In: nil, Out: stdout}
			if *policyFile != "" {
				p, err := app.LoadPolicy(*policyFile)
				if err != nil {
					return err
				}
				o.Directory = channels.NewDirectory(p)
			}
			if *agents != "" {
				o.Agents = strings.Split(*agents, ",")
			}
			if len(trusted) > 0 {
				if o.Trusted, err = events.NewTrustedKeys(trusted...); err != nil {
					return err
				}
			}
			return terminal.Run(ctx, o)
		}
	case "webhooks log":
		conn := natsFlags(fs, "the bot uses")
		endpoint := fs.String("endpoint", "", "only this endpoint's deliveries")
		since := fs.Duration("since", 24*time.Hour, "deliveries of this last `duration`")
		run = func() error {
			nc, err := connect(*conn)
			if err != nil {
				return err
			}
			defer nc.Close()
			js, err := jetstream.New(nc)
			if err != nil {
				return err
			}
			return webhook.Log(ctx, js, *endpoint, time.Now().Add(-*since), stdout)
		}
	case "health":
		o := healthcheck.Flags(fs, healthcheck.Options{URL: "http://" + DefaultListen + "/readyz"})
		run = func() error {
			status, err := healthcheck.Check(ctx, *o)
			if err != nil {
				return err
			}
			fmt.Fprintf(stdout, "%s: %s\n", o.URL, status)
			return checkStatus(ctx, o.URL, o.Timeout)
		}
	case "version":
		run = func() error {
			_, err := fmt.Fprintln(stdout, "assent approver-bot", version)
			return err
		}
	}
	return fs, run
}

type usageError string

func (e usageError) Error() string { return string(e) }

func connect(s natsconn.Settings) (*nats.Conn, error) {
	return natsconn.Connect(s, nats.Name("assent approver-bot"), nats.MaxReconnects(-1))
}

// natsFlags adds the flags of a command that connects to NATS.
func natsFlags(fs *flag.FlagSet, what string) *natsconn.Settings {
	s := &natsconn.Settings{}
	fs.StringVar(&s.URL, "nats-url", DefaultNATS, "the NATS server or cluster "+what)
	fs.StringVar(&s.Creds, "creds", "", "NATS credentials `file` (broker creds)")
	fs.StringVar(&s.CAFile, "nats-ca", "", "the CA `file` of the server's TLS certificate (tls:// URLs), if the system does not trust it")
	fs.StringVar(&s.CertFile, "nats-cert", "", "a client certificate `file`, for a server that asks for one (mutual TLS)")
	fs.StringVar(&s.KeyFile, "nats-key", "", "the client certificate's key `file`")
	return s
}

// warner is a channel whose valid configuration may still be unsafe
// outside development (the email channel's insecure_plaintext).
type warner interface{ Warnings() []string }

// checkNATSWait is how long check waits for NATS to answer.
const checkNATSWait = 5 * time.Second

// check reports what a configuration would run, checking each part against
// what it talks to: the file and the policy; each channel's settings and
// secrets, and its own service (Slack takes the token and lets the bot post
// in its channels; the SMTP server takes a session and the login; every
// webhook endpoint answers); and NATS. Every problem is reported at once; a
// NATS that does not answer is one of them, not a reason to stop.
func check(ctx context.Context, cfg *Config, w io.Writer) error {
	p, err := app.LoadPolicy(cfg.Policy)
	if err != nil {
		return err
	}
	nc, natsErr := connectCheck(cfg.NATSSettings())
	if nc != nil {
		defer nc.Close()
	}
	env := channels.Env{NATS: nc, Directory: channels.NewDirectory(p), PublicURL: cfg.HTTP.PublicURL, WebUI: cfg.WebUI, Logger: nopLogger()}
	var errs []error
	for _, s := range cfg.sections() {
		a, err := s.make(cfg, s.node, env)
		if err != nil {
			errs = append(errs, err)
			if nc != nil || s.name == "slack" {
				continue
			}
			// Made without NATS: its service can be checked all the same.
		}
		checked, err := s.check(ctx, cfg, s.node, a)
		if err != nil {
			fmt.Fprintf(w, "%s: FAILED\n", s.name)
			errs = append(errs, fmt.Errorf("%s: %w", s.name, err))
		} else if a != nil {
			who := a.Reaches()
			fmt.Fprintf(w, "%s: ok, reaches %d principal(s): %s\n", a.Name(), len(who), strings.Join(who, ", "))
		}
		if wa, ok := a.(warner); ok {
			for _, warning := range wa.Warnings() {
				fmt.Fprintf(w, "%s: WARNING: %s\n", s.name, warning)
			}
		}
		for _, c := range checked {
			fmt.Fprintf(w, "  %s\n", c)
		}
	}
	if natsErr != nil {
		fmt.Fprintf(w, "nats: FAILED\n")
		errs = append(errs, fmt.Errorf("%s: nats: %w", cfg.File, natsErr))
	} else {
		fmt.Fprintf(w, "nats: ok (%s)\n", cfg.NATS.URL)
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s: ok (policy %s, %d principals)\n", cfg.File, cfg.Policy, len(p.Principals))
	return err
}

// connectCheck connects to NATS as check does: the connection is returned
// even while the server does not answer (the channels are made with it,
// never started), with an error if it did not within checkNATSWait.
func connectCheck(s natsconn.Settings) (*nats.Conn, error) {
	up := make(chan struct{}, 1)
	nc, err := natsconn.Connect(s, nats.Name("assent approver-bot check"), nats.RetryOnFailedConnect(true), nats.MaxReconnects(-1),
		nats.ReconnectWait(200*time.Millisecond), nats.ConnectHandler(func(*nats.Conn) { up <- struct{}{} }))
	if err != nil {
		return nil, err
	}
	if nc.IsConnected() {
		return nc, nil
	}
	select {
	case <-up:
		return nc, nil
	case <-time.After(checkNATSWait):
		return nc, fmt.Errorf("connect to NATS at %s: no answer within %s (is the server running?)", s.URL, checkNATSWait)
	}
}
