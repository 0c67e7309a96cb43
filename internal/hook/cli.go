package hook

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/assent-dev/assent/internal/envflag"
	"github.com/assent-dev/assent/pkg/events"
)

// ErrUsage: the command line is wrong. ParseArgs has said why on stderr.
var ErrUsage = errors.New("usage")

// Command is a parsed command line: the dialect to speak and how to ask.
type Command struct {
	// Name is the command, the dialect's name: "claude", "codex", "gemini".
	Name     string
	Dialect  Dialect
	Config   Config
	LogLevel zapcore.Level
}

const usage = `usage: assent-hook claude|codex|gemini [flags]

Asks Assent about one tool call of a coding agent, as the agent's
before-tool command hook: Claude Code's and Codex's PreToolUse, Gemini CLI's
BeforeTool. The call comes as JSON on stdin; the answer (allow, deny with the
reason, or the arguments an approver edited) goes to stdout in the agent's
protocol, and nothing else does. Anything but a decision denies the call.

Give --hook-timeout the timeout the agent's hook configuration gives the
hook (docs/integrations.md): the hook answers 5s before it.

flags:
`

// Commands returns the names of the commands ParseArgs parses: one per
// dialect.
func Commands() []string {
	var names []string
	for _, d := range Dialects() {
		names = append(names, d.Name)
	}
	return names
}

// FlagSet returns the flag set of the command called name, as ParseArgs
// defines it; nil if there is no such command.
func FlagSet(name string) *flag.FlagSet {
	if _, ok := DialectNamed(name); !ok {
		return nil
	}
	return newFlagSet(&Command{Name: name, LogLevel: zapcore.WarnLevel})
}

// newFlagSet returns a new flag set with the flags of cmd.Name, filling cmd.
func newFlagSet(cmd *Command) *flag.FlagSet {
	fs := flag.NewFlagSet("assent-hook "+cmd.Name, flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), usage)
		envflag.PrintDefaults(fs)
	}
	c := &cmd.Config
	fs.StringVar(&c.Agent, "agent", "", "agent `name` to ask as (default: the coding agent's, claude-code, codex or gemini-cli)")
	fs.StringVar(&c.User, "user", "", "the `user` on whose behalf the agent works")
	fs.Func("label", "`key=value` label added to every request, for policies; repeatable", func(s string) error {
		k, v, ok := strings.Cut(s, "=")
		if !ok || k == "" {
			return errors.New("want key=value")
		}
		if c.Labels == nil {
			c.Labels = map[string]string{}
		}
		c.Labels[k] = v
		return nil
	})
	fs.DurationVar(&c.HookTimeout, "hook-timeout", DefaultHookTimeout, "the coding agent's timeout for this hook, as its hook configuration sets it: the hook answers 5s before it")
	fs.DurationVar(&c.Timeout, "timeout", 0, "approval timeout asked for each call (default: --hook-timeout less 10s; at most --hook-timeout less 8s)")
	fs.StringVar(&c.NATS.URL, "nats-url", DefaultNATSURL, "NATS server `URL` of the broker")
	fs.StringVar(&c.NATS.Creds, "creds", "", "NATS credentials `file`")
	fs.StringVar(&c.NATS.CAFile, "nats-ca", "", "the CA `file` of the NATS server's TLS certificate")
	fs.StringVar(&c.NATS.CertFile, "nats-cert", "", "a client certificate `file`, for mutual TLS")
	fs.StringVar(&c.NATS.KeyFile, "nats-key", "", "the client certificate's key `file`")
	fs.BoolVar(&c.Private, "private", false, "read decisions through the agent's own subjects, for --private credentials")
	fs.Func("trust-decision-key", "accept only decisions signed by the broker's decision `key` (public, A...); repeatable", func(s string) error {
		k, err := events.ParseTrustedKeys(s)
		c.TrustedKeys = append(c.TrustedKeys, k...)
		return err
	})
	fs.Var(&cmd.LogLevel, "log-level", "log `level` on stderr: debug, info, warn, error")
	return fs
}

// ParseArgs parses the command line after the program name, reading the
// flags not given from env (envflag). -h prints the usage on stderr and
// returns flag.ErrHelp; a problem is said on stderr in a line or two (the
// agent may show it to its model) and returns an error wrapping ErrUsage.
func ParseArgs(args []string, env envflag.Env, stderr io.Writer) (Command, error) {
	if len(args) == 0 || args[0] == "help" || args[0] == "-h" || args[0] == "-help" || args[0] == "--help" {
		fmt.Fprint(stderr, usage)
		if len(args) == 0 {
			return Command{}, fmt.Errorf("%w: no command", ErrUsage)
		}
		return Command{}, flag.ErrHelp
	}
	d, ok := DialectNamed(args[0])
	if !ok {
		fmt.Fprintf(stderr, "assent-hook: unknown command %q: want one of %s (assent-hook -h)\n", args[0], strings.Join(Commands(), ", "))
		return Command{}, fmt.Errorf("%w: unknown command %q", ErrUsage, args[0])
	}
	cmd := Command{Name: d.Name, Dialect: d, LogLevel: zapcore.WarnLevel}
	fs := newFlagSet(&cmd)
	fs.SetOutput(stderr)
	if err := envflag.Parse(fs, args[1:], env, stderr); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return Command{}, err
		}
		return Command{}, fmt.Errorf("%w: %w", ErrUsage, err)
	}
	var errs []error
	if fs.NArg() > 0 {
		errs = append(errs, fmt.Errorf("unexpected arguments: %s", strings.Join(fs.Args(), " ")))
	}
	cmd.Config = cmd.Config.WithDefaults(d)
	if err := cmd.Config.Validate(); err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		err := errors.Join(errs...)
		fmt.Fprintf(stderr, "assent-hook %s: %s\n(assent-hook %s -h lists the flags)\n", cmd.Name, strings.ReplaceAll(err.Error(), "\n", "; "), cmd.Name)
		return Command{}, fmt.Errorf("%w: %w", ErrUsage, err)
	}
	return cmd, nil
}

// Execute answers the one hook call on stdin, on stdout. Only a failure to
// write the answer is an error.
func (c Command) Execute(ctx context.Context, log *zap.Logger, stdin io.Reader, stdout io.Writer) error {
	h, err := New(c.Dialect, c.Config, log)
	if err != nil {
		return err
	}
	_, err = h.Run(ctx, stdin, stdout)
	return err
}
