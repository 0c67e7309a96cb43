package app

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/assent-dev/assent/internal/auth"
	"github.com/assent-dev/assent/internal/envflag"
	"github.com/assent-dev/assent/internal/healthcheck"
	"github.com/assent-dev/assent/internal/httptls"
	"github.com/assent-dev/assent/internal/textsafe"
)

// Exit statuses of CLI.Run.
const (
	ExitOK     = 0 // done, or help shown
	ExitFailed = 1 // the command ran and failed: a policy with problems, a broker that said no
	ExitUsage  = 2 // the command line is wrong; the usage has been printed
)

// CLI runs the broker's commands other than serving:
//
//	broker policy check FILE
//	broker policy test --policy FILE --request FILE
//	broker policy replay FILE [--since WINDOW] [--fail-on KINDS] [--json] [--nats-url URL]
//	broker remembered [--http URL]
//	broker remembered revoke ID [--http URL]
//	broker cancel [--agent A] [--session S] [--reason TEXT] [--http URL]
//	broker insights [--since WINDOW] [--agent A] [--tool T] [--rule R] [--approver P] [--json] [--http URL]
//	broker policy suggest [--since WINDOW] [--agent A] [--only allow|deny] [--document] [--http URL]
//	broker backup --out DIR [--nats-url URL]
//	broker restore --from DIR [--nats-url URL | --data DIR] [--force]
//	broker version
//	broker help [COMMAND]
//
// Every command answers -h, -help and --help, anywhere among its arguments
// (before a "--"), with its usage on Stderr, and does nothing else. Flags may
// come before or after positional arguments; "--" ends the flags. Flags not
// given come from Env (envflag.Parse).
type CLI struct {
	// Version is what "broker version" prints.
	Version string
	// Stdout receives what a command reports; Stderr usage and errors.
	Stdout, Stderr io.Writer
	// Env is the environment flags not given are read from
	// (envflag.OS()); the zero Env has none.
	Env envflag.Env
}

// command is one command of the CLI.
type command struct {
	name     string   // "remembered revoke"
	synopsis string   // its arguments and flags: "ID [--http URL]"
	args     []string // its positional arguments, by name: "ID"
	summary  string   // what it does, in a few words
	about    string   // what it does, for -h
	required []string // flags that must be given
	// define adds the command's flags to fs and returns what runs the
	// command, once fs is parsed.
	define func(fs *flag.FlagSet) func(ctx context.Context, c CLI, args []string) error
}

// errReported: the command has reported its failure on Stdout; the exit
// status says the rest.
var errReported = errors.New("failed")

// apiFlags defines the client commands' flags for reaching the broker's HTTP
// API: --http, and the TLS files of an https one.
func apiFlags(fs *flag.FlagSet) *apiTarget {
	a := &apiTarget{}
	fs.StringVar(&a.http, "http", "http://127.0.0.1:8080", "the broker's HTTP API `URL`, or the address it listens on (its own --http, such as 0.0.0.0:8080; https with --ca or --cert)")
	httptls.ClientFlags(fs, &a.tls)
	return a
}

// apiTarget is what apiFlags fill.
type apiTarget struct {
	http string
	tls  httptls.ClientFiles
}

// api returns the broker's HTTP API as the flags name it.
func (a *apiTarget) api() (API, error) {
	client, err := a.tls.Client()
	if err != nil {
		return API{}, err
	}
	return API{URL: apiURL(a.http, a.tls.On()), Client: client}, nil
}

// apiURL is the URL of the broker's HTTP API that the client commands' --http
// names: a URL, or the address the broker listens on, as its own --http (and
// ASSENT_HTTP, in the broker's container) has it, where an unspecified host
// (0.0.0.0, [::] or none) is this machine. An address is reached over https
// when the command has TLS files (secure), as a broker given --tls-cert
// serves.
func apiURL(s string, secure bool) string {
	if strings.Contains(s, "://") {
		return s
	}
	scheme := "http://"
	if secure {
		scheme = "https://"
	}
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		return scheme + s
	}
	if ip := net.ParseIP(host); host == "" || ip != nil && ip.IsUnspecified() {
		host = "127.0.0.1"
	}
	return scheme + net.JoinHostPort(host, port)
}

// commands lists the CLI's commands, in the order usage shows them.
func commands() []*command {
	cmds := []*command{
		{
			name: "policy check", synopsis: "FILE", args: []string{"FILE"},
			summary: "validate a policy file",
			about: `Reads the policy file FILE and prints every problem in it, one per line as
FILE:LINE: problem, or a summary if it has none. The exit status is 1 if
there are problems.`,
			define: func(*flag.FlagSet) func(context.Context, CLI, []string) error {
				return func(_ context.Context, c CLI, args []string) error {
					if !PolicyCheck(c.Stdout, args[0]) {
						return errReported
					}
					return nil
				}
			},
		},
		{
			name: "policy test", synopsis: "--policy FILE --request FILE",
			summary:  "evaluate one request offline",
			required: []string{"policy", "request"},
			about: `Evaluates one request against a policy, offline, and explains the decision:
which rule applies, why, and what an approval would need. No broker is
involved: remembered choices and limits' running totals are not consulted.`,
			define: func(fs *flag.FlagSet) func(context.Context, CLI, []string) error {
				pol := fs.String("policy", "", "policy `FILE` (YAML)")
				req := fs.String("request", "", "request `FILE`: the requested data as JSON, or a whole CloudEvent")
				return func(_ context.Context, c CLI, _ []string) error {
					return PolicyTest(c.Stdout, *pol, *req, time.Now())
				}
			},
		},
		{
			name: "remembered", synopsis: "[--http URL]",
			summary: "list remembered choices",
			about: `Lists the remembered choices (answers an approver asked to apply to later
requests) that a running broker holds. "broker remembered revoke ID" revokes
one.`,
			define: func(fs *flag.FlagSet) func(context.Context, CLI, []string) error {
				target := apiFlags(fs)
				return func(ctx context.Context, c CLI, _ []string) error {
					api, err := target.api()
					if err != nil {
						return err
					}
					ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
					defer cancel()
					return RememberedList(ctx, c.Stdout, api)
				}
			},
		},
		{
			name: "remembered revoke", synopsis: "ID [--http URL]", args: []string{"ID"},
			summary: "revoke a remembered choice",
			about: `Revokes the remembered choice ID (as "broker remembered" lists it) on a
running broker, for every replica: later requests are decided without it.`,
			define: func(fs *flag.FlagSet) func(context.Context, CLI, []string) error {
				target := apiFlags(fs)
				return func(ctx context.Context, c CLI, args []string) error {
					api, err := target.api()
					if err != nil {
						return err
					}
					ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
					defer cancel()
					return RememberedRevoke(ctx, c.Stdout, api, args[0])
				}
			},
		},
		{
			name: "audit", synopsis: "[--request ID] [--agent A] [--principal P] [--channel C] [--rule R] [--type T] [--since TIME] [--until TIME] [--limit N] [--http URL]",
			summary: "print the audit log as JSON lines",
			about: `Prints the events of a running broker's audit log (its stream) that match the
filters, oldest first, one JSON object per line: request, answer, cancel,
pending, escalation and decision events, with the stream sequence and time.
--request gives one request's whole timeline. Times are RFC 3339
(2026-11-22T10:00:00Z). With authentication on, set ` + TokenEnv + ` to an API token.`,
			define: func(fs *flag.FlagSet) func(context.Context, CLI, []string) error {
				target := apiFlags(fs)
				var q AuditQuery
				fs.StringVar(&q.Request, "request", "", "one request's `ID`: its whole timeline")
				fs.StringVar(&q.Agent, "agent", "", "events of this `agent`'s requests")
				fs.StringVar(&q.Principal, "principal", "", "answers and cancels by this `principal`, decisions they took part in")
				fs.StringVar(&q.Channel, "channel", "", "answers through this `channel` (slack, http, cli, ...)")
				fs.StringVar(&q.Rule, "rule", "", "events under this policy `rule` (or limit)")
				fs.StringVar(&q.Type, "type", "", "event `types`, comma-separated: requested, pending, escalated, responded, cancel, decided, rejected")
				fs.StringVar(&q.Since, "since", "", "events stored at or after this `time`")
				fs.StringVar(&q.Until, "until", "", "events stored at or before this `time`")
				fs.IntVar(&q.Limit, "limit", 0, "at most `N` events (0: all)")
				return func(ctx context.Context, c CLI, _ []string) error {
					api, err := target.api()
					if err != nil {
						return err
					}
					return Audit(ctx, c.Stdout, api, q)
				}
			},
		},
		{
			name: "cancel", synopsis: "[--agent A] [--session S] [--reason TEXT] [--http URL]",
			summary: "cancel every pending request of an agent or a session",
			about: `Cancels every pending request of agent A, of session S, or of both, on a
running broker (POST /v1/cancels), and prints each request's id and what
became of it. With authentication on, set ` + TokenEnv + ` to the agent's own token
(which may leave out --agent) or an admin's; each cancel is recorded as
theirs. The exit status is 1 if any request could not be cancelled.`,
			define: func(fs *flag.FlagSet) func(context.Context, CLI, []string) error {
				target := apiFlags(fs)
				var q CancelQuery
				fs.StringVar(&q.Agent, "agent", "", "every pending request of this `agent`")
				fs.StringVar(&q.Session, "session", "", "every pending request of this `session`")
				fs.StringVar(&q.Reason, "reason", "", "`TEXT` saying why, recorded with each cancel")
				return func(ctx context.Context, c CLI, _ []string) error {
					api, err := target.api()
					if err != nil {
						return err
					}
					ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
					defer cancel()
					return Cancel(ctx, c.Stdout, api, q)
				}
			},
		},
		{
			name: "token create", synopsis: "NAME [--principal P] [--agent A] [--admin] --auth FILE", args: []string{"NAME"},
			summary:  "make an API token",
			required: []string{"auth"},
			about: `Makes a new API token called NAME, records its hash (never the token) in the
auth file, and prints the token once: keep it, it cannot be shown again. The
token answers as --principal P and/or asks (and cancels) for --agent A;
with --admin it also reads and follows every request, cancels any, and
revokes any remembered choice (docs/web.md, "Who sees what"). A running
broker accepts it within seconds, without a restart.`,
			define: func(fs *flag.FlagSet) func(context.Context, CLI, []string) error {
				file := fs.String("auth", "", "the auth `FILE` (made if missing)")
				principal := fs.String("principal", "", "the `principal` the token answers as")
				agent := fs.String("agent", "", "the `agent` the token asks for")
				admin := fs.Bool("admin", false, "the token reads and cancels every request and revokes any remembered choice")
				return func(_ context.Context, c CLI, args []string) error {
					tok, err := auth.CreateToken(*file, args[0], *principal, *agent, *admin, time.Now())
					if err != nil {
						return err
					}
					fmt.Fprintf(c.Stderr, "token %s recorded in %s; it is shown this once:\n", args[0], *file)
					_, err = fmt.Fprintln(c.Stdout, tok)
					return err
				}
			},
		},
		{
			name: "token revoke", synopsis: "NAME --auth FILE", args: []string{"NAME"},
			summary:  "revoke an API token",
			required: []string{"auth"},
			about: `Removes the token called NAME from the auth file. A running broker refuses it
within seconds, without a restart (or at once on SIGHUP).`,
			define: func(fs *flag.FlagSet) func(context.Context, CLI, []string) error {
				file := fs.String("auth", "", "the auth `FILE`")
				return func(_ context.Context, c CLI, args []string) error {
					if err := auth.RevokeToken(*file, args[0]); err != nil {
						return err
					}
					_, err := fmt.Fprintf(c.Stdout, "revoked %s\n", args[0])
					return err
				}
			},
		},
		{
			name: "token list", synopsis: "--auth FILE",
			summary:  "list API tokens",
			required: []string{"auth"},
			about:    `Lists the API tokens of an auth file: name, principal, agent and when each was made. Never their hashes.`,
			define: func(fs *flag.FlagSet) func(context.Context, CLI, []string) error {
				file := fs.String("auth", "", "the auth `FILE`")
				return func(_ context.Context, c CLI, _ []string) error {
					cfg, err := auth.Load(*file)
					if err != nil {
						return err
					}
					if len(cfg.Tokens) == 0 {
						_, err := fmt.Fprintln(c.Stdout, "no tokens")
						return err
					}
					tw := tabwriter.NewWriter(c.Stdout, 0, 4, 2, ' ', 0)
					fmt.Fprintln(tw, "NAME\tPRINCIPAL\tAGENT\tADMIN\tCREATED")
					for _, t := range cfg.Tokens {
						created := "-"
						if !t.Created.IsZero() {
							created = t.Created.UTC().Format(time.RFC3339)
						}
						admin := "-"
						if t.Admin {
							admin = "yes"
						}
						fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", t.Name, dash(t.Principal), dash(t.Agent), admin, created)
					}
					return tw.Flush()
				}
			},
		},
		{
			name: "decision-key new", synopsis: "--out FILE",
			summary:  "make a key to sign decisions with",
			required: []string{"out"},
			about: `Makes a new decision key (an nkeys account key), writes its seed to FILE
(readable by its owner only; an existing file is never overwritten), and
prints its public key. Run the broker with --decision-key FILE to sign every
decision with it, and give agents and approvers the public key
(--trust-decision-key) so that they refuse decisions it did not sign. To
rotate, make a new key, let readers trust both, restart the broker with the
new one and --trust-decision-key OLD, then drop the old key.`,
			define: func(fs *flag.FlagSet) func(context.Context, CLI, []string) error {
				out := fs.String("out", "", "write the seed to `FILE` (mode 0600)")
				return func(_ context.Context, c CLI, _ []string) error {
					pub, err := NewDecisionKeyFile(*out)
					if err != nil {
						return err
					}
					fmt.Fprintf(c.Stderr, "decision key written to %s; its public key, for readers to trust:\n", *out)
					_, err = fmt.Fprintln(c.Stdout, pub)
					return err
				}
			},
		},
		{
			name: "health", synopsis: "[--http ADDR] [--path /readyz] [--wait DURATION] [--ca FILE] [--cert FILE --key FILE]",
			summary: "ask a running broker's health endpoint",
			about: `Asks a running broker's health endpoint, by default /readyz (it takes work;
/healthz: it runs), and exits 0 if it answers 200, 1 with the reason if not.
--http is the broker's own --http (ASSENT_HTTP in its container serves
both). Images without a shell run it as their health check
(deploy/Dockerfile, docs/deploy.md). For a broker served over TLS
(--tls-cert), give the CA of its certificate (--ca), and with
--tls-client-ca a client certificate (--cert, --key): the address is then
reached over https.`,
			define: func(fs *flag.FlagSet) func(context.Context, CLI, []string) error {
				target := apiFlags(fs)
				path := fs.String("path", "/readyz", "the health endpoint's `path`")
				o := healthcheck.WaitFlags(fs, healthcheck.Options{})
				return func(ctx context.Context, c CLI, _ []string) error {
					o.URL = strings.TrimRight(apiURL(target.http, target.tls.On()), "/") + *path
					o.TLS = target.tls
					status, err := healthcheck.Check(ctx, *o)
					if err != nil {
						return err
					}
					_, err = fmt.Fprintf(c.Stdout, "%s: %s\n", o.URL, status)
					return err
				}
			},
		},
		{
			name:    "version",
			summary: "print the version",
			about:   `Prints the broker's version.`,
			define: func(*flag.FlagSet) func(context.Context, CLI, []string) error {
				return func(_ context.Context, c CLI, _ []string) error {
					_, err := fmt.Fprintln(c.Stdout, "assent broker", c.Version)
					return err
				}
			},
		},
	}
	// The record's, credentials, backup and restore commands go before
	// version, the last.
	return slices.Insert(cmds, len(cmds)-1, slices.Concat(policyCommands(), recordCommands(), credsCommands(), backupCommands(), insightsCommands())...)
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// group runs a command of a group whose first argument names it ("policy
// check FILE", "token list ...").
func (c CLI) group(ctx context.Context, group, want string, rest []string) int {
	if len(rest) > 0 {
		if cmd := lookup(group + " " + rest[0]); cmd != nil {
			return c.run(ctx, cmd, rest[1:])
		}
	}
	switch {
	case wantsHelp(rest):
		c.groupUsage(group)
		return ExitOK
	case len(rest) == 0:
		fmt.Fprintf(c.Stderr, "broker %s: missing command: want %s\n\n", group, want)
	default:
		fmt.Fprintf(c.Stderr, "broker %s: unknown command %q: want %s\n\n", group, rest[0], want)
	}
	c.groupUsage(group)
	return ExitUsage
}

// Commands returns the names of the commands of CLI, in the order usage
// lists them: "policy check", "remembered revoke", "version".
func Commands() []string {
	var names []string
	for _, cmd := range commands() {
		names = append(names, cmd.name)
	}
	return names
}

// commandWords returns the first words of the commands ("policy", "token",
// ...), each once, in the order usage lists them.
func commandWords() []string {
	var words []string
	for _, name := range Commands() {
		w, _, _ := strings.Cut(name, " ")
		if !slices.Contains(words, w) {
			words = append(words, w)
		}
	}
	return words
}

// CommandFlagSet returns the flag set of the command called name, as CLI
// defines it to parse the command's arguments; nil if there is no such
// command.
func CommandFlagSet(name string) *flag.FlagSet {
	cmd := lookup(name)
	if cmd == nil {
		return nil
	}
	fs, _ := newFlagSet(cmd)
	return fs
}

// newFlagSet returns a new flag set with cmd's flags, and what runs cmd once
// it is parsed.
func newFlagSet(cmd *command) (*flag.FlagSet, func(context.Context, CLI, []string) error) {
	fs := flag.NewFlagSet("broker "+cmd.name, flag.ContinueOnError)
	fs.SetOutput(io.Discard) // run reports errors itself
	return fs, cmd.define(fs)
}

// lookup returns the command called name, or nil.
func lookup(name string) *command {
	for _, cmd := range commands() {
		if cmd.name == name {
			return cmd
		}
	}
	return nil
}

// Run runs the command args names (args[0] is "policy", "remembered",
// "version" or "help") and returns the exit status: ExitOK, ExitFailed or
// ExitUsage.
func (c CLI) Run(ctx context.Context, args []string) int {
	if len(args) == 0 {
		fmt.Fprint(c.Stderr, "broker: missing command\n\n")
		c.overview()
		return ExitUsage
	}
	name, rest := args[0], args[1:]
	switch name {
	case "policy":
		return c.group(ctx, "policy", "check, test, suggest or replay", rest)
	case "token":
		return c.group(ctx, "token", "create, revoke or list", rest)
	case "audit":
		if len(rest) > 0 && (rest[0] == "verify" || rest[0] == "witness") {
			return c.run(ctx, lookup("audit "+rest[0]), rest[1:])
		}
		return c.run(ctx, lookup("audit"), rest)
	case "remembered":
		// "revoke" names the command wherever it is among the positional
		// arguments: "remembered --http URL revoke ID" revokes too.
		revoke := lookup("remembered revoke")
		fs := flag.NewFlagSet("", flag.ContinueOnError)
		revoke.define(fs)
		if _, pos := scanArgs(fs, rest); len(pos) > 0 && rest[pos[0]] == "revoke" {
			return c.run(ctx, revoke, slices.Delete(slices.Clone(rest), pos[0], pos[0]+1))
		}
		return c.run(ctx, lookup("remembered"), rest)
	case "decision-key":
		return c.group(ctx, "decision-key", "new", rest)
	case "creds":
		return c.group(ctx, "creds", "init, agent, approver, bot, gateway, broker, auditor, server-config, revoke, rotate, push or list", rest)
	case "backup", "restore", "health", "cancel", "insights":
		return c.run(ctx, lookup(name), rest)
	case "version":
		return c.run(ctx, lookup("version"), rest)
	case "help":
		if len(rest) == 0 || wantsHelp(rest) {
			c.overview()
			return ExitOK
		}
		return c.Run(ctx, append(slices.Clone(rest), "-h"))
	}
	fmt.Fprintf(c.Stderr, "broker: unknown command %q; the commands are %s and help (\"broker -h\" lists the flags for running the broker)\n", name, strings.Join(Commands(), ", "))
	return ExitUsage
}

// run parses args for cmd and runs it.
func (c CLI) run(ctx context.Context, cmd *command, args []string) int {
	fs, exec := newFlagSet(cmd)
	if wantsHelp(args) {
		c.usage(cmd, fs)
		return ExitOK
	}
	flagIdx, posIdx := scanArgs(fs, args)
	pos := pick(args, posIdx)
	if err := envflag.Parse(fs, pick(args, flagIdx), c.Env, c.Stderr); err != nil {
		if errors.Is(err, flag.ErrHelp) { // -h=true and the like
			c.usage(cmd, fs)
			return ExitOK
		}
		return c.usageError(cmd, fs, err.Error())
	}
	for _, name := range cmd.required {
		if fs.Lookup(name).Value.String() == "" {
			return c.usageError(cmd, fs, fmt.Sprintf("missing --%s (or %s)", name, envflag.Var(name)))
		}
	}
	switch want := wantArgs(cmd.args); {
	case len(pos) < len(cmd.args):
		return c.usageError(cmd, fs, fmt.Sprintf("missing %s (want %s)", strings.Join(cmd.args[len(pos):], " "), want))
	case len(pos) > len(cmd.args):
		return c.usageError(cmd, fs, fmt.Sprintf("unexpected argument %q (want %s)", pos[len(cmd.args)], want))
	}
	if err := exec(ctx, c, pos); err != nil {
		if !errors.Is(err, errReported) {
			fmt.Fprintf(c.Stderr, "broker %s: %s\n", cmd.name, textsafe.Text(err.Error()))
		}
		return ExitFailed
	}
	return ExitOK
}

func wantArgs(names []string) string {
	switch len(names) {
	case 0:
		return "no arguments"
	case 1:
		return "one argument, " + names[0]
	}
	return fmt.Sprintf("%d arguments, %s", len(names), strings.Join(names, " "))
}

// wantsHelp reports whether args ask for help: -h, -help or --help before
// any "--", even where a flag's value is expected.
func wantsHelp(args []string) bool {
	for _, a := range args {
		switch a {
		case "--":
			return false
		case "-h", "-help", "--help":
			return true
		}
	}
	return false
}

// scanArgs finds in args the flags, with their values, and the positional
// arguments, so that flags may come after positional arguments too; it returns
// their indexes. "--" ends the flags: what follows is positional. A flag fs
// does not define is taken as a flag without a value, for fs.Parse to report.
func scanArgs(fs *flag.FlagSet, args []string) (flags, pos []int) {
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "--":
			for i++; i < len(args); i++ {
				pos = append(pos, i)
			}
			return flags, pos
		case len(a) < 2 || a[0] != '-':
			pos = append(pos, i)
			continue
		}
		flags = append(flags, i)
		if name := strings.TrimLeft(a, "-"); !strings.Contains(name, "=") {
			if f := fs.Lookup(name); f != nil && !isBoolFlag(f) && i+1 < len(args) {
				i++
				flags = append(flags, i)
			}
		}
	}
	return flags, pos
}

func isBoolFlag(f *flag.Flag) bool {
	b, ok := f.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}

// pick returns the elements of args at idx.
func pick(args []string, idx []int) []string {
	out := make([]string, len(idx))
	for i, j := range idx {
		out[i] = args[j]
	}
	return out
}

// usage prints cmd's usage: what it does, its arguments and flags.
func (c CLI) usage(cmd *command, fs *flag.FlagSet) {
	line := "broker " + cmd.name
	if cmd.synopsis != "" {
		line += " " + cmd.synopsis
	}
	fmt.Fprintf(c.Stderr, "usage: %s\n\n%s\n", line, cmd.about)
	n := 0
	fs.VisitAll(func(*flag.Flag) { n++ })
	if n > 0 {
		fmt.Fprint(c.Stderr, "\nflags:\n")
		fs.SetOutput(c.Stderr)
		envflag.PrintDefaults(fs)
		fs.SetOutput(io.Discard)
	}
}

// usageError reports a wrong command line for cmd, in one line, then its
// usage.
func (c CLI) usageError(cmd *command, fs *flag.FlagSet, msg string) int {
	fmt.Fprintf(c.Stderr, "broker %s: %s\n\n", cmd.name, textsafe.Line(msg))
	c.usage(cmd, fs)
	return ExitUsage
}

// groupUsage lists the commands whose names start with group.
func (c CLI) groupUsage(group string) {
	var b strings.Builder
	c.list(&b, group+" ")
	fmt.Fprintf(c.Stderr, "usage:\n%s\n\"broker %s COMMAND -h\" describes one.\n", b.String(), group)
}

// overview lists every command.
func (c CLI) overview() {
	var b strings.Builder
	fmt.Fprintf(&b, "  %-50s %s\n", "broker [flags]", `run the broker ("broker -h" lists the flags)`)
	c.list(&b, "")
	fmt.Fprintf(c.Stderr, "usage:\n%s\n\"broker COMMAND -h\" or \"broker help COMMAND\" describes a command.\n", b.String())
}

func (c CLI) list(b *strings.Builder, prefix string) {
	for _, cmd := range commands() {
		if strings.HasPrefix(cmd.name, prefix) {
			fmt.Fprintf(b, "  %-50s %s\n", strings.TrimSpace("broker "+cmd.name+" "+cmd.synopsis), cmd.summary)
		}
	}
}
