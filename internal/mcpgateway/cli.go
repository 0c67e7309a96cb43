package mcpgateway

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/url"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/assent-dev/assent/internal/envflag"
	"github.com/assent-dev/assent/internal/httptls"
	"github.com/assent-dev/assent/internal/natsconn"
	"github.com/assent-dev/assent/internal/tracing"
	"github.com/assent-dev/assent/pkg/events"
	"github.com/assent-dev/assent/pkg/handler"
)

// ErrUsage: the command line is wrong. ParseArgs has printed the usage.
var ErrUsage = errors.New("usage")

// Command is a parsed command line.
type Command struct {
	// Name is "serve" or "check".
	Name   string
	Config Config
	// Stdio serves the client that started the gateway on stdin and stdout.
	Stdio bool
	// HTTP is the address to serve streamable HTTP on; "" serves none.
	HTTP     string
	LogLevel zapcore.Level
	// Tracing configures the export of the SDK's spans (docs/tracing.md).
	Tracing tracing.Config
}

const usage = `usage: mcp-gateway [serve] [flags] [--] [COMMAND [ARG...] | URL]
       mcp-gateway check [flags] [--] [COMMAND [ARG...] | URL]

Offers the tools of upstream MCP servers unchanged, and asks Assent before
each call runs. The upstreams come from --config, and one more from the
command line: a command to start (stdio) or a streamable HTTP URL. Clients
connect over stdio (the default) or streamable HTTP (--http ADDR, at /mcp).

check validates the configuration, then connects to NATS and to every
upstream and lists the tools the gateway would offer.

flags:
`

// Commands returns the names of the commands ParseArgs parses: "serve" (also
// what runs without a command name) and "check".
func Commands() []string {
	return []string{"serve", "check"}
}

// FlagSet returns the flag set of the command called name, as ParseArgs
// defines it; nil if there is no such command.
func FlagSet(name string) *flag.FlagSet {
	if !slices.Contains(Commands(), name) {
		return nil
	}
	return newFlagSet(&Command{Name: name}, new(flagValues))
}

// flagValues are the flags' values that are not a Command's fields.
type flagValues struct {
	file string
	cfg  Config
	up   Upstream
	keys []string
}

// newFlagSet returns a new flag set with the flags of cmd.Name, filling cmd
// and v.
func newFlagSet(cmd *Command, v *flagValues) *flag.FlagSet {
	fs := flag.NewFlagSet("mcp-gateway "+cmd.Name, flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), usage)
		envflag.PrintDefaults(fs)
	}
	fs.StringVar(&v.file, "config", "", "configuration `file` (YAML; docs/integrations.md)")
	fs.BoolVar(&cmd.Stdio, "stdio", true, "serve the client that started the gateway on stdin and stdout; off by default when --http is given")
	fs.StringVar(&cmd.HTTP, "http", "", "serve clients over streamable HTTP at `ADDR` (host:port), path /mcp")
	fs.StringVar(&v.cfg.TLS.CertFile, "tls-cert", "", "serve --http over HTTPS only (TLS 1.2 or later) with this certificate `file` (PEM, with its chain); re-read when it changes")
	fs.StringVar(&v.cfg.TLS.KeyFile, "tls-key", "", "the HTTPS certificate's key `file`")
	fs.StringVar(&v.cfg.TLS.ClientCAFile, "tls-client-ca", "", "with --tls-cert: mutual TLS, every HTTPS client presents a certificate signed by the CA in this `file`, or the handshake fails")
	fs.StringVar(&v.cfg.NATS.URL, "nats-url", "", "NATS server `URL` of the broker (default "+DefaultNATSURL+")")
	fs.StringVar(&v.cfg.NATS.Creds, "creds", "", "NATS credentials `file`")
	fs.StringVar(&v.cfg.NATS.CAFile, "nats-ca", "", "the CA `file` of the NATS server's TLS certificate")
	fs.StringVar(&v.cfg.NATS.CertFile, "nats-cert", "", "a client certificate `file`, for mutual TLS")
	fs.StringVar(&v.cfg.NATS.KeyFile, "nats-key", "", "the client certificate's key `file`")
	fs.BoolVar(&v.cfg.NATS.Private, "private", false, "read decisions through the agent's own subjects, for --private credentials (needs --agent)")
	fs.Func("trust-decision-key", "accept only decisions signed by the broker's decision `key` (public, A...); repeatable", func(s string) error {
		k, err := events.ParseTrustedKeys(s)
		v.keys = append(v.keys, k...)
		return err
	})
	fs.StringVar(&v.cfg.Identity.Agent, "agent", "", "agent `name` to ask as (default: the client's name)")
	fs.StringVar(&v.cfg.Identity.Session, "session", "", "session `id` to ask under (default: the MCP session)")
	fs.StringVar(&v.cfg.Identity.User, "user", "", "the `user` on whose behalf calls are made")
	fs.DurationVar(&v.cfg.Timeout, "timeout", 0, "approval timeout asked for each call (default: the broker's)")
	fs.StringVar(&v.cfg.Elicitation.Principal, "elicit-as", "", "also ask the user in the client, answering as this `principal`")
	fs.BoolVar(&v.cfg.Elicitation.OverHTTP, "elicit-over-http", false, "with --elicit-as, ask clients connected over HTTP too")
	fs.StringVar(&v.up.Name, "name", "", "`name` of the upstream on the command line (default: from its command or host)")
	fs.StringVar(&v.up.Prefix, "prefix", "", "`prefix` for the tool names of the upstream on the command line")
	fs.Var(&cmd.LogLevel, "log-level", "log `level` on stderr: debug, info, warn, error")
	tracing.RegisterFlags(fs, &cmd.Tracing)
	return fs
}

// ParseArgs parses the command line after the program name, reading the
// flags not given from env (envflag). Problems, and -h, print usage to
// stderr; the error then wraps ErrUsage, or is flag.ErrHelp.
func ParseArgs(args []string, env envflag.Env, stderr io.Writer) (Command, error) {
	cmd := Command{Name: "serve", LogLevel: zapcore.WarnLevel}
	if len(args) > 0 && (args[0] == "serve" || args[0] == "check") {
		cmd.Name, args = args[0], args[1:]
	} else if len(args) > 0 && args[0] == "help" {
		fmt.Fprint(stderr, usage)
		return Command{}, flag.ErrHelp
	}
	var v flagValues
	fs := newFlagSet(&cmd, &v)
	fs.SetOutput(stderr)

	fail := func(errs ...error) (Command, error) {
		err := errors.Join(errs...)
		fmt.Fprintf(stderr, "mcp-gateway %s: %v\n\n", cmd.Name, err)
		fs.Usage()
		return Command{}, fmt.Errorf("%w: %w", ErrUsage, err)
	}
	if err := envflag.Parse(fs, args, env, stderr); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return Command{}, err
		}
		return Command{}, fmt.Errorf("%w: %w", ErrUsage, err)
	}
	file, cfg, up, keys := v.file, v.cfg, v.up, v.keys
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if file != "" {
		loaded, err := Load(file)
		if err != nil {
			return fail(err)
		}
		// Flags given override the file.
		overlay(&loaded.NATS.URL, cfg.NATS.URL, set["nats-url"])
		overlay(&loaded.NATS.Creds, cfg.NATS.Creds, set["creds"])
		overlay(&loaded.NATS.CAFile, cfg.NATS.CAFile, set["nats-ca"])
		overlay(&loaded.NATS.CertFile, cfg.NATS.CertFile, set["nats-cert"])
		overlay(&loaded.NATS.KeyFile, cfg.NATS.KeyFile, set["nats-key"])
		overlay(&loaded.NATS.Private, cfg.NATS.Private, set["private"])
		overlay(&loaded.Identity.Agent, cfg.Identity.Agent, set["agent"])
		overlay(&loaded.Identity.Session, cfg.Identity.Session, set["session"])
		overlay(&loaded.Identity.User, cfg.Identity.User, set["user"])
		overlay(&loaded.Timeout, cfg.Timeout, set["timeout"])
		overlay(&loaded.Elicitation.Principal, cfg.Elicitation.Principal, set["elicit-as"])
		overlay(&loaded.Elicitation.OverHTTP, cfg.Elicitation.OverHTTP, set["elicit-over-http"])
		overlay(&loaded.TLS.CertFile, cfg.TLS.CertFile, set["tls-cert"])
		overlay(&loaded.TLS.KeyFile, cfg.TLS.KeyFile, set["tls-key"])
		overlay(&loaded.TLS.ClientCAFile, cfg.TLS.ClientCAFile, set["tls-client-ca"])
		cfg = loaded
	}
	cfg.NATS.TrustedDecisionKeys = append(cfg.NATS.TrustedDecisionKeys, keys...)
	var errs []error
	if rest := fs.Args(); len(rest) > 0 {
		if u, err := url.Parse(rest[0]); err == nil && (u.Scheme == "http" || u.Scheme == "https") && len(rest) == 1 {
			up.URL = rest[0]
			if up.Name == "" {
				up.Name, up.AutoName = tokenOf(u.Hostname(), "upstream"), true
			}
		} else {
			up.Command, up.Args = rest[0], rest[1:]
			if up.Name == "" {
				up.Name, up.AutoName = CommandName(rest[0], rest[1:]), true
			}
		}
		cfg.Upstreams = append(cfg.Upstreams, up)
	} else if set["name"] || set["prefix"] {
		errs = append(errs, errors.New("--name and --prefix name the upstream on the command line: give its command or URL after the flags"))
	}
	if !set["stdio"] {
		cmd.Stdio = cmd.HTTP == ""
	}
	if cmd.HTTP != "" {
		if _, _, err := net.SplitHostPort(cmd.HTTP); err != nil {
			errs = append(errs, fmt.Errorf("--http %q: want host:port, such as 127.0.0.1:8931", cmd.HTTP))
		}
	}
	if cfg.TLS != (TLS{}) && cmd.HTTP == "" {
		errs = append(errs, errors.New("--tls-cert (tls in the configuration) serves --http over HTTPS, but --http is not given: give --http ADDR, or leave TLS out"))
	}
	if cmd.Name == "serve" && !cmd.Stdio && cmd.HTTP == "" {
		errs = append(errs, errors.New("nothing to serve: --stdio=false without --http"))
	}
	cmd.Config = cfg.WithDefaults()
	if err := cmd.Config.Validate(); err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		return fail(errs...)
	}
	return cmd, nil
}

// overlay sets *dst to v when the flag was given.
func overlay[T any](dst *T, v T, given bool) {
	if given {
		*dst = v
	}
}

// launchers are commands that run what their arguments name: a script, a
// package, a module, an image.
var launchers = map[string]bool{
	"node": true, "nodejs": true, "npx": true, "npm": true, "pnpm": true, "yarn": true, "bun": true, "bunx": true, "deno": true,
	"tsx": true, "ts-node": true, "python": true, "python3": true, "py": true, "uv": true, "uvx": true, "pipx": true,
	"ruby": true, "php": true, "java": true, "sh": true, "bash": true, "docker": true, "podman": true,
}

// launcherWords are a launcher's subcommands, before what it runs.
var launcherWords = map[string]bool{"run": true, "exec": true, "x": true, "dlx": true, "tool": true, "start": true}

// scriptExts are left out of a script's name.
var scriptExts = map[string]bool{".js": true, ".mjs": true, ".cjs": true, ".ts": true, ".mts": true, ".py": true, ".rb": true, ".php": true, ".jar": true, ".sh": true}

// CommandName is the name an upstream started as command with args gets
// when none is given, until the server names itself (Upstream.AutoName):
// the command's base name, or, for a launcher (node, npx, python, uvx,
// docker, ...), the name of what it runs, its first argument that is not a
// flag, a subcommand or a setting: "node /srv/notes/server.js" is server,
// "node /srv/notes/index.js" notes, "npx -y @modelcontextprotocol/server-filesystem@1.0 /tmp"
// server-filesystem, "docker run -i --rm -e A=b mcp/fetch:latest" fetch.
func CommandName(command string, args []string) string {
	base := strings.TrimSuffix(strings.ToLower(filepath.Base(command)), ".exe")
	name := base
	if launchers[base] || strings.HasPrefix(base, "python") {
		for _, a := range args {
			if strings.HasPrefix(a, "-") || strings.Contains(a, "=") || launcherWords[a] {
				continue
			}
			name = runName(a)
			break
		}
	}
	return tokenOf(name, tokenOf(base, "upstream"))
}

// runName is the name of what a launcher runs: a script's name without its
// extension (its directory's for index and main), a package's or image's
// last part without its version or tag.
func runName(a string) string {
	a = filepath.ToSlash(a)
	if at := strings.LastIndexByte(a, '@'); at > 0 { // @scope/pkg@1.2, not @scope/pkg
		a = a[:at]
	}
	if colon := strings.LastIndexByte(a, ':'); colon > strings.LastIndexByte(a, '/') { // image:tag
		a = a[:colon]
	}
	a = strings.TrimRight(a, "/")
	base := path.Base(a)
	if ext := path.Ext(base); scriptExts[strings.ToLower(ext)] {
		base = strings.TrimSuffix(base, ext)
		if base == "index" || base == "main" || base == "__main__" {
			if dir := path.Base(path.Dir(a)); dir != "." && dir != "/" {
				base = dir
			}
		}
	}
	return base
}

// Execute runs the command. serve speaks MCP on stdin and stdout (with
// Stdio) and notes on stderr; check writes its report to stdout and returns
// an error if anything failed.
func (c Command) Execute(ctx context.Context, log *zap.Logger, stdin io.Reader, stdout, stderr io.Writer) error {
	if log == nil {
		log = zap.NewNop()
	}
	// The HTTPS certificate is read before anything starts; a renewed one
	// is served without a restart.
	var certs *httptls.Certs
	if c.Name == "serve" && c.HTTP != "" && c.Config.TLS != (TLS{}) {
		var err error
		if certs, err = httptls.Load(c.Config.TLS.Files(), log.Named("tls")); err != nil {
			return err
		}
		watch, stopWatch := context.WithCancel(ctx)
		var wg sync.WaitGroup
		wg.Go(func() { _ = certs.Run(watch) })
		defer func() { stopWatch(); wg.Wait() }()
	}
	opts := []nats.Option{nats.Name("assent-mcp-gateway"), nats.MaxReconnects(-1), nats.Timeout(5 * time.Second)}
	if c.Config.NATS.Private {
		opts = append(opts, nats.CustomInboxPrefix(handler.PrivateInbox(c.Config.Identity.Agent)))
	}
	nc, err := natsconn.Connect(c.Config.NATS.Settings(), opts...)
	if err != nil {
		return err
	}
	defer nc.Close()
	if c.Name == "check" {
		return check(ctx, nc, c.Config, log, stdout)
	}
	g, err := New(nc, c.Config, log)
	if err != nil {
		return err
	}
	var o RunOptions
	if c.Stdio {
		o.Stdin, o.Stdout = io.NopCloser(stdin), nopWriteCloser{stdout}
	}
	if c.HTTP != "" {
		ln, err := net.Listen("tcp", c.HTTP)
		if err != nil {
			return fmt.Errorf("--http: %w", err)
		}
		scheme := "http"
		if certs != nil {
			scheme, o.TLS = "https", certs.Config()
		}
		fmt.Fprintf(stderr, "mcp-gateway: serving MCP over streamable HTTP at %s://%s/mcp\n", scheme, ln.Addr())
		o.HTTP = ln
	}
	return g.Run(ctx, o)
}

// check reports whether the broker's stream is on the NATS server and which
// tools each upstream offers through the gateway.
func check(ctx context.Context, nc *nats.Conn, cfg Config, log *zap.Logger, stdout io.Writer) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	fmt.Fprintf(stdout, "config: ok, %d upstream(s)\n", len(cfg.Upstreams))
	if cfg.TLS != (TLS{}) {
		certs, err := httptls.Load(cfg.TLS.Files(), nil)
		if err != nil {
			return err
		}
		leaf := certs.Leaf()
		fmt.Fprintf(stdout, "tls: certificate %s, valid until %s; client certificates required: %v\n", leaf.Subject, leaf.NotAfter.UTC().Format(time.RFC3339), cfg.TLS.ClientCAFile != "")
	}
	g, err := New(nc, cfg, log)
	if err != nil {
		return err
	}
	defer g.Close() //nolint:errcheck // a check
	if cfg.NATS.Private {
		// Private credentials read no stream: the connection is the check.
		fmt.Fprintf(stdout, "nats: connected to %s (private: decisions through assent-private.%s.>)\n", nc.ConnectedUrl(), cfg.Identity.Agent)
	} else {
		if _, err := g.js.Stream(ctx, events.StreamName); err != nil {
			return fmt.Errorf("nats: connected to %s, but no stream %s: %w (has a broker run on this NATS server?)", nc.ConnectedUrl(), events.StreamName, err)
		}
		fmt.Fprintf(stdout, "nats: connected to %s; stream %s found\n", nc.ConnectedUrl(), events.StreamName)
	}
	err = g.Start(ctx)
	byUpstream := map[string][]string{}
	for name, up := range g.Tools() {
		byUpstream[up] = append(byUpstream[up], name)
	}
	for _, name := range g.Upstreams() {
		tools := byUpstream[name]
		slices.Sort(tools)
		fmt.Fprintf(stdout, "upstream %s: %d tool(s): %s\n", name, len(tools), strings.Join(tools, ", "))
	}
	return err
}

// tokenOf makes s a subject token: lower case, each run of characters
// other than a-z 0-9 _ - one "-", none at either end, at most 64
// characters; fallback when nothing is left.
func tokenOf(s, fallback string) string {
	var b strings.Builder
	dash := false
	for _, r := range strings.ToLower(s) {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '_' || r == '-' {
			b.WriteRune(r)
			dash = r == '-'
		} else if !dash {
			b.WriteByte('-')
			dash = true
		}
	}
	t := strings.Trim(b.String(), "-")
	if len(t) > 64 {
		t = strings.TrimRight(t[:64], "-")
	}
	if t == "" {
		return fallback
	}
	return t
}

// nopWriteCloser is a writer the MCP connection may close without closing
// it: stdout stays the process's.
type nopWriteCloser struct{ io.Writer }

func (nopWriteCloser) Close() error { return nil }
