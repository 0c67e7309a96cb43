package worker

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/assent-dev/assent/internal/envflag"
	"github.com/assent-dev/assent/internal/natsconn"
	"github.com/assent-dev/assent/internal/tracing"
	"github.com/assent-dev/assent/pkg/events"
	"github.com/assent-dev/assent/pkg/handler"
)

// DefaultNATSURL is where the worker looks for NATS unless told otherwise.
const DefaultNATSURL = "nats://127.0.0.1:4222"

// ErrUsage: the command line is wrong. ParseArgs has printed the usage.
var ErrUsage = errors.New("usage")

// ConnOptions says how to reach NATS.
type ConnOptions struct {
	URL   string
	Creds string // NATS credentials file (broker creds agent); optional
	// CAFile, CertFile and KeyFile are TLS files: the CA of the server's
	// certificate, and a client certificate for mutual TLS; optional.
	CAFile, CertFile, KeyFile string
	Name                      string // connection name, shown by the server
}

// Connect connects to NATS as o says, reconnecting forever once connected.
// A first connection that fails is an error at once.
func Connect(o ConnOptions, log *zap.Logger) (*nats.Conn, error) {
	if log == nil {
		log = zap.NewNop()
	}
	opts := []nats.Option{
		nats.Name(o.Name),
		nats.Timeout(5 * time.Second),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(time.Second),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil { // nil: we closed it
				log.Warn("NATS disconnected", zap.Error(err))
			}
		}),
		nats.ReconnectHandler(func(c *nats.Conn) {
			log.Info("NATS reconnected", zap.String("url", c.ConnectedUrl()))
		}),
	}
	return natsconn.Connect(natsconn.Settings{URL: o.URL, Creds: o.Creds, CAFile: o.CAFile, CertFile: o.CertFile, KeyFile: o.KeyFile}, opts...)
}

// RunOptions are the settings of "agent-worker run".
type RunOptions struct {
	Plan        string
	Sandbox     string
	InitSandbox bool
	Agent       string
	Config      AgentConfig
	JSON        bool
}

// LoadOptions are the settings of "agent-worker load".
type LoadOptions struct {
	Agent  string
	Config LoadConfig
	// Baseline is "" to measure Assent, or BaselineRaw to measure the raw
	// JetStream baseline (RawService) on the same server instead.
	Baseline string
	// AnswerAs, if set, measures the human path (AnswerLoad): every request
	// is approved by this principal as soon as it is pending.
	AnswerAs string
	JSON     bool
}

// The values of --baseline: BaselineRaw measures raw JetStream, its
// requester taking each reply as the server routes it; BaselineRawStored
// the same with the requester taking each reply only once stored (the
// stream's RePublish), as an agent of Assent takes a decision.
const (
	BaselineRaw       = "raw"
	BaselineRawStored = "raw-stored"
)

// Command is a parsed command line.
type Command struct {
	// Name is "run", "load" or "mcp"; Run, Load or MCP holds its settings.
	Name     string
	Conn     ConnOptions
	LogLevel zapcore.Level
	// TrustedKeys are the public keys of the broker's decision keys
	// (--trust-decision-key): when set, a decision counts only if one of
	// them signed it (handler.Config.TrustedKeys).
	TrustedKeys []string
	Run         RunOptions
	Load        LoadOptions
	MCP         MCPOptions
	// Stdin is where "mcp" reads its client's messages; nil means os.Stdin.
	Stdin io.Reader
	// Tracing configures the export of the SDK's spans (docs/tracing.md).
	Tracing tracing.Config
}

// MCPOptions are the settings of "agent-worker mcp".
type MCPOptions struct {
	Sandbox     string
	InitSandbox bool
}

const usage = `usage: agent-worker <command> [flags]

commands:
  run   run a tool plan in a sandbox, asking Assent before guarded steps
  load  send many approval requests and measure decision latency
  mcp   serve the file tools as an MCP server on stdio (unguarded: use mcp-gateway)

"agent-worker <command> -h" lists a command's flags.
`

// Commands returns the names of the commands ParseArgs parses, in the order
// the usage lists them.
func Commands() []string {
	return []string{"run", "load", "mcp"}
}

// FlagSet returns the flag set of the command called name, as ParseArgs
// defines it; nil if there is no such command.
func FlagSet(name string) *flag.FlagSet {
	fs, _ := newFlagSet(&Command{Name: name})
	return fs
}

// ParseArgs parses the command line after the program name, reading the
// flags not given from env (envflag). Problems, and -h, print usage to
// stderr; the error then wraps ErrUsage, or is flag.ErrHelp.
func ParseArgs(args []string, env envflag.Env, stderr io.Writer) (Command, error) {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return Command{}, fmt.Errorf("%w: no command", ErrUsage)
	}
	cmd := Command{Name: args[0], LogLevel: zapcore.WarnLevel}
	switch cmd.Name {
	case "help", "-h", "-help", "--help":
		fmt.Fprint(stderr, usage)
		return Command{}, flag.ErrHelp
	case "run", "load", "mcp":
	default:
		fmt.Fprint(stderr, usage)
		return Command{}, fmt.Errorf("%w: unknown command %q", ErrUsage, cmd.Name)
	}
	fs, check := newFlagSet(&cmd)
	fs.SetOutput(stderr)
	if err := envflag.Parse(fs, args[1:], env, stderr); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return Command{}, err
		}
		return Command{}, fmt.Errorf("%w: %w", ErrUsage, err)
	}
	errs := check()
	if fs.NArg() > 0 {
		errs = append(errs, fmt.Errorf("unexpected arguments: %s", strings.Join(fs.Args(), " ")))
	}
	if cmd.Conn.URL == "" && cmd.Name != "mcp" {
		errs = append(errs, errors.New("--nats-url is empty"))
	}
	if len(errs) > 0 {
		err := fmt.Errorf("%w: %w", ErrUsage, errors.Join(errs...))
		fmt.Fprintf(stderr, "agent-worker %s: %v\n\n", cmd.Name, errors.Join(errs...))
		fs.Usage()
		return Command{}, err
	}
	return cmd, nil
}

// newFlagSet returns a new flag set with the flags of the command cmd.Name
// names, filling cmd, and what checks cmd once the flag set is parsed; nil
// if there is no such command.
func newFlagSet(cmd *Command) (fs *flag.FlagSet, check func() []error) {
	fs = flag.NewFlagSet("agent-worker "+cmd.Name, flag.ContinueOnError)
	fs.Var(&cmd.LogLevel, "log-level", "log `level` on stderr: debug, info, warn, error")
	tracing.RegisterFlags(fs, &cmd.Tracing)
	// natsFlags are the flags of the commands that talk to Assent.
	natsFlags := func() {
		fs.StringVar(&cmd.Conn.URL, "nats-url", DefaultNATSURL, "NATS server `URL`")
		fs.StringVar(&cmd.Conn.Creds, "creds", "", "NATS credentials `file` (optional; broker creds agent NAME)")
		fs.StringVar(&cmd.Conn.CAFile, "nats-ca", "", "the CA `file` of the server's TLS certificate (tls:// URLs), if the system does not trust it")
		fs.StringVar(&cmd.Conn.CertFile, "nats-cert", "", "a client certificate `file`, for a server that asks for one (mutual TLS)")
		fs.StringVar(&cmd.Conn.KeyFile, "nats-key", "", "the client certificate's key `file`")
		fs.Func("trust-decision-key", "accept only decisions signed by the broker's decision `key` (public, A...); repeat it or separate keys with commas while keys rotate", func(v string) error {
			keys, err := events.ParseTrustedKeys(v)
			if err != nil {
				return err
			}
			cmd.TrustedKeys = append(cmd.TrustedKeys, keys...)
			return nil
		})
		cmd.Conn.Name = "assent-agent-worker-" + cmd.Name
	}

	switch cmd.Name {
	case "run":
		natsFlags()
		o := &cmd.Run
		fs.StringVar(&o.Plan, "plan", "", "plan `file` (JSON list of steps); required")
		fs.StringVar(&o.Sandbox, "sandbox", "", "sandbox `directory` the tools may not leave; required")
		fs.BoolVar(&o.InitSandbox, "init-sandbox", false, "create (or reset) a demo sandbox with a few files first")
		fs.StringVar(&o.Agent, "agent", "file-manager", "agent `name`; requests go to assent.request.<name>")
		fs.StringVar(&o.Config.Session, "session", "", "session `id` for this run's requests (default: a new id)")
		fs.StringVar(&o.Config.User, "user", "", "`user` on whose behalf the agent acts")
		fs.DurationVar(&o.Config.Timeout, "timeout", 2*time.Minute, "approval timeout asked for each guarded step")
		fs.BoolVar(&o.JSON, "json", false, "print one JSON object per step instead of text")
		fs.Usage = func() {
			fmt.Fprintf(fs.Output(), "usage: agent-worker run --plan FILE --sandbox DIR [flags]\n\nRuns the plan's steps in order; steps with \"approval\": true run only if\nAssent approves them, and then with the approved (possibly edited) args.\n\n")
			envflag.PrintDefaults(fs)
		}
		check = func() []error {
			var errs []error
			if o.Plan == "" {
				errs = append(errs, errors.New("--plan (or ASSENT_PLAN) is required"))
			}
			if o.Sandbox == "" {
				errs = append(errs, errors.New("--sandbox (or ASSENT_SANDBOX) is required"))
			}
			if err := events.CheckToken("--agent", o.Agent); err != nil {
				errs = append(errs, err)
			}
			if o.Config.Timeout <= 0 {
				errs = append(errs, fmt.Errorf("--timeout %s: must be positive", o.Config.Timeout))
			} else if err := o.Config.Validate(); err != nil {
				errs = append(errs, err)
			}
			return errs
		}
	case "load":
		natsFlags()
		o := &cmd.Load
		fs.IntVar(&o.Config.N, "n", 10000, "number of requests")
		fs.IntVar(&o.Config.Concurrency, "c", 0, "requests in flight at once: default 64, or 16 with --answer-as")
		fs.StringVar(&o.Agent, "agent", "load", "agent `name`; requests go to assent.request.<name>")
		fs.StringVar(&o.Config.Tool, "tool", "load_test", "tool `name` of the requests")
		fs.DurationVar(&o.Config.Timeout, "timeout", 30*time.Second, "timeout asked for each request")
		fs.StringVar(&o.Baseline, "baseline", "", "`raw`: measure the raw JetStream baseline on the same server instead of Assent (its own stream "+RawStream+", deleted at the end); raw-stored: the same, each reply taken only once stored, as Assent's agents take decisions")
		fs.StringVar(&o.AnswerAs, "answer-as", "", "measure the human path: approve every request as `principal` once it is pending, and time the answer to the decision (broker in manual mode)")
		fs.BoolVar(&o.JSON, "json", false, "print the result as one JSON object")
		fs.Usage = func() {
			fmt.Fprintf(fs.Output(), "usage: agent-worker load [flags]\n\nSends N approval requests, C at a time, and reports throughput and\nrequest-to-decision latency. Run the broker in auto-approve mode; with\n--answer-as, in manual mode. --baseline raw does the same on raw JetStream.\n\n")
			envflag.PrintDefaults(fs)
		}
		check = func() []error {
			var errs []error
			if err := events.CheckToken("--agent", o.Agent); err != nil {
				errs = append(errs, err)
			}
			if o.AnswerAs != "" {
				if err := events.CheckToken("--answer-as", o.AnswerAs); err != nil {
					errs = append(errs, err)
				}
			}
			cSet := false
			fs.Visit(func(f *flag.Flag) { cSet = cSet || f.Name == "c" })
			if !cSet {
				o.Config.Concurrency = 64
				if o.AnswerAs != "" {
					o.Config.Concurrency = 16
				}
			}
			if o.Baseline != "" && o.Baseline != BaselineRaw && o.Baseline != BaselineRawStored {
				errs = append(errs, fmt.Errorf("--baseline %q: want %s or %s, or no --baseline to measure Assent", o.Baseline, BaselineRaw, BaselineRawStored))
			}
			// Validate without defaults: an explicit --c 0 or --timeout 0
			// is a mistake, not a request for the default.
			cfg := o.Config
			if err := cfg.Validate(); err != nil {
				errs = append(errs, err)
			}
			return errs
		}
	case "mcp":
		o := &cmd.MCP
		fs.StringVar(&o.Sandbox, "sandbox", "", "sandbox `directory` the tools may not leave; required")
		fs.BoolVar(&o.InitSandbox, "init-sandbox", false, "create (or reset) a demo sandbox with a few files first")
		fs.Usage = func() {
			fmt.Fprintf(fs.Output(), "usage: agent-worker mcp --sandbox DIR [flags]\n\nServes the file tools (%s) as an MCP server on stdin and stdout,\nfor one client. It asks nobody: put cmd/mcp-gateway in front of it to have\nAssent guard the calls.\n\n", strings.Join(Tools(), ", "))
			envflag.PrintDefaults(fs)
		}
		check = func() []error {
			if o.Sandbox == "" {
				return []error{errors.New("--sandbox (or ASSENT_SANDBOX) is required")}
			}
			return nil
		}
	default:
		return nil, nil
	}
	return fs, check
}

// Execute runs the command: it writes its report to stdout and notes to
// stderr. For "run", an error wrapping ErrStepsFailed means the plan ran but
// some steps failed; denials are not errors.
func (c Command) Execute(ctx context.Context, log *zap.Logger, stdout, stderr io.Writer) error {
	if log == nil {
		log = zap.NewNop()
	}
	switch c.Name {
	case "run":
		return c.execRun(ctx, log, stdout, stderr)
	case "load":
		return c.execLoad(ctx, log, stdout, stderr)
	case "mcp":
		return c.execMCP(ctx, stdout, stderr)
	}
	return fmt.Errorf("%w: unknown command %q", ErrUsage, c.Name)
}

func (c Command) execRun(ctx context.Context, log *zap.Logger, stdout, stderr io.Writer) error {
	o := c.Run
	sb, err := prepareSandbox(o.Sandbox, o.InitSandbox, stderr)
	if err != nil {
		return err
	}
	defer sb.Close() //nolint:errcheck // a directory handle
	plan, err := LoadPlan(o.Plan)
	if err != nil {
		return err
	}
	nc, err := Connect(c.Conn, log)
	if err != nil {
		return err
	}
	defer nc.Close()
	client, err := handler.NewClient(nc, handler.Config{Agent: o.Agent, TrustedKeys: c.TrustedKeys, Logger: log})
	if err != nil {
		return err
	}
	agent, err := NewAgent(client, sb, o.Config, log)
	if err != nil {
		return err
	}
	var werr error
	sum, err := agent.RunPlan(ctx, plan, func(r StepReport) {
		if werr != nil {
			return
		}
		if o.JSON {
			werr = WriteJSONLine(stdout, r)
		} else {
			werr = WriteStepText(stdout, r, len(plan.Steps))
		}
	})
	if o.JSON {
		// Keep stdout one kind of line; the tally goes to stderr.
		_ = WriteSummaryText(stderr, sum)
	} else if werr == nil {
		werr = WriteSummaryText(stdout, sum)
	}
	if werr != nil {
		return errors.Join(err, fmt.Errorf("write report: %w", werr))
	}
	return err
}

func (c Command) execLoad(ctx context.Context, log *zap.Logger, stdout, stderr io.Writer) error {
	o := c.Load
	cfg := o.Config
	cfg.Progress = func(ended, n int, elapsed time.Duration) {
		fmt.Fprintf(stderr, "load: %d of %d requests ended after %s\n", ended, n, elapsed.Round(time.Second))
	}
	// The agent's connection; the approver and the raw baseline's service
	// get their own, as they would be other programs.
	nc, err := Connect(c.Conn, log)
	if err != nil {
		return err
	}
	defer nc.Close()
	connect := func(role string) (*nats.Conn, error) {
		o := c.Conn
		o.Name += "-" + role
		return Connect(o, log)
	}

	var target AnswerTarget
	name := "assent"
	if o.Baseline != "" {
		stored := o.Baseline == BaselineRawStored
		name = "raw-jetstream"
		if stored {
			name = "raw-jetstream-stored"
		}
		svcConn, err := connect("raw-service")
		if err != nil {
			return err
		}
		defer svcConn.Close()
		svc, err := StartRaw(ctx, svcConn, RawConfig{Manual: o.AnswerAs != "", Stored: stored}, log)
		if err != nil {
			return err
		}
		defer func() {
			if cerr := svc.Close(context.WithoutCancel(ctx)); cerr != nil {
				fmt.Fprintf(stderr, "agent-worker load: %v\n", cerr)
			}
		}()
		if target, err = NewRawClient(nc, stored); err != nil {
			return err
		}
	} else {
		client, err := handler.NewClient(nc, handler.Config{Agent: o.Agent, TrustedKeys: c.TrustedKeys, Logger: log})
		if err != nil {
			return err
		}
		if target, err = NewAssentTarget(client, o.Agent); err != nil {
			return err
		}
	}

	var res LoadResult
	if o.AnswerAs == "" {
		res, err = Load(ctx, target, cfg)
	} else {
		approver, cerr := connect("approver")
		if cerr != nil {
			return cerr
		}
		defer approver.Close()
		res, err = AnswerLoad(ctx, approver, target, AnswerConfig{LoadConfig: cfg, Principal: o.AnswerAs})
	}
	if res.Sent == 0 {
		return err
	}
	res.Target = name
	var werr error
	if o.JSON {
		werr = WriteJSONLine(stdout, res)
	} else {
		werr = WriteLoadText(stdout, res)
	}
	if werr != nil {
		return errors.Join(err, fmt.Errorf("write report: %w", werr))
	}
	return err
}

func (c Command) execMCP(ctx context.Context, stdout, stderr io.Writer) error {
	sb, err := prepareSandbox(c.MCP.Sandbox, c.MCP.InitSandbox, stderr)
	if err != nil {
		return err
	}
	defer sb.Close() //nolint:errcheck // a directory handle
	in := c.Stdin
	if in == nil {
		in = os.Stdin
	}
	return ServeMCP(ctx, sb, io.NopCloser(in), nopWriteCloser{stdout})
}

// prepareSandbox opens dir as the sandbox, made a demo sandbox first when
// init is set (and said so on stderr).
func prepareSandbox(dir string, init bool, stderr io.Writer) (*Sandbox, error) {
	if init {
		if err := InitDemoSandbox(dir); err != nil {
			return nil, err
		}
		fmt.Fprintf(stderr, "initialised demo sandbox %s\n", dir)
	}
	return OpenSandbox(dir)
}

// nopWriteCloser is a writer the MCP connection may close without closing
// it: stdout stays the process's.
type nopWriteCloser struct{ io.Writer }

func (nopWriteCloser) Close() error { return nil }
