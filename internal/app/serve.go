package app

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/assent-dev/assent/internal/broker"
	"github.com/assent-dev/assent/internal/envflag"
	"github.com/assent-dev/assent/internal/gcpace"
	"github.com/assent-dev/assent/internal/natsembed"
	"github.com/assent-dev/assent/internal/tracing"
	"github.com/assent-dev/assent/pkg/events"
)

// Serve is a parsed serving command line: "broker [flags]".
type Serve struct {
	// Options are ready for Run, but for Reload, which main feeds from
	// SIGHUP.
	Options Options
	// LogLevel and LogJSON say how to log (logging.New).
	LogLevel string
	LogJSON  bool
}

// ServeFlagSet returns the flag set of the serving command, as ParseServe
// defines it, for listing (internal/programs).
func ServeFlagSet() *flag.FlagSet {
	fs, _ := serveFlags(new(Serve))
	return fs
}

// ParseServe parses the serving command line args, with the environment
// env (envflag), into a Serve. Problems, and -h, print the usage on stderr;
// the error is then flag.ErrHelp or says what is wrong.
func ParseServe(args []string, env envflag.Env, stderr io.Writer) (Serve, error) {
	var s Serve
	fs, finish := serveFlags(&s)
	fs.SetOutput(stderr)
	if err := envflag.Parse(fs, args, env, stderr); err != nil {
		return Serve{}, err
	}
	if fs.NArg() > 0 {
		return Serve{}, fmt.Errorf("unexpected argument %q: running the broker takes flags only; a command (%s) goes first, as in \"broker audit --limit 10\"", fs.Arg(0), strings.Join(commandWords(), ", "))
	}
	if err := finish(); err != nil {
		return Serve{}, err
	}
	return s, nil
}

// serveFlags defines the serving flags onto a new flag set, filling s; finish
// completes s once the flag set is parsed.
func serveFlags(s *Serve) (fs *flag.FlagSet, finish func() error) {
	fs = flag.NewFlagSet("broker", flag.ContinueOnError)
	o := &s.Options
	mode := fs.String("mode", "manual", "without --policy: manual, auto-approve or auto-deny")
	fs.StringVar(&s.LogLevel, "log-level", "info", "debug, info, warn or error")
	fs.BoolVar(&s.LogJSON, "log-json", false, "log JSON lines instead of console text")
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
	fs.StringVar(&o.TLS.CertFile, "tls-cert", "", "serve the HTTP API and web UI over HTTPS only (TLS 1.2 or later) with this certificate `file` (PEM, with its chain); re-read when it changes or on SIGHUP (docs/security.md#tls)")
	fs.StringVar(&o.TLS.KeyFile, "tls-key", "", "the HTTPS certificate's key `file`")
	fs.StringVar(&o.TLS.ClientCAFile, "tls-client-ca", "", "with --tls-cert: mutual TLS, every HTTPS client presents a certificate signed by the CA in this `file` (read at start), or the handshake fails")
	fs.StringVar(&o.MetricsTokenFile, "metrics-token", "", "GET /metrics requires Authorization: Bearer and the token in this `file` (at least 16 characters); re-read when it changes or on SIGHUP; without it /metrics is open (docs/operations.md#scraping)")
	fs.StringVar(&o.MetricsListen, "metrics-listen", "", "serve GET /metrics at this `address` on a listener of its own (over HTTPS with --tls-cert), and not on the HTTP API's")
	fs.StringVar(&o.PprofListen, "pprof", "", "serve Go's runtime profiles (net/http/pprof, /debug/pprof/) at this loopback `address` (127.0.0.1:6060), on a listener of its own; off when empty; other addresses are refused: tunnel to it (docs/architecture.md#profiling)")
	o.GC = gcpace.Pace{Floor: DefaultGCFloor}
	fs.Var(mibFlag{&o.GC.Floor}, "gc-floor", "let the heap grow to this `size` in MiB before each garbage collection while the live heap is under half of it (Go's pacing collects each time the heap doubles): fewer collections slowing a busy broker's handlers, for up to that much more memory; 0: Go's own pacing (docs/operations.md#memory)")
	fs.Var(mibFlag{&o.GC.Headroom}, "gc-headroom", "collect garbage each time the heap has grown by this `size` in MiB or a quarter of the live heap, whichever is more, instead of each time it doubles, once the live heap is larger: less memory for a broker with very many pending requests (about 1.3 GiB of RSS instead of up to 3 at a million), for more collections, which slow its expiries and its start; 0 (the default): Go's own pacing (docs/operations.md#memory)")
	fs.DurationVar(&o.DrainDelay, "drain-delay", 0, "on SIGTERM, answer /readyz with 503 and go on serving for this `duration` before stopping, so that load balancers stop sending first (docs/cluster.md#rolling-restarts)")
	fs.StringVar(&o.AuthFile, "auth", "", "auth `file` (YAML): API tokens, OIDC sign-in, a trusted proxy (docs/web.md); answers are then made as the caller; reloaded on SIGHUP or when it changes")
	fs.StringVar(&o.Broker.Name, "name", "", "replica name (default: host name)")
	fs.DurationVar(&o.Broker.DefaultTimeout, "timeout", 0, "timeout for requests that ask for none (default 5m)")
	fs.DurationVar(&o.Broker.MaxTimeout, "max-timeout", 0, "longest timeout a request may ask for (default 24h)")
	fs.DurationVar(&o.Broker.Retention, "retention", 0, "how long events and request state are kept (default 720h)")
	fs.DurationVar(&o.Broker.CheckpointInterval, "checkpoint-interval", broker.DefaultCheckpointInterval, "how often a checkpoint of the chained record is stored, signed with --decision-key (docs/security.md); 0 for never")
	fs.IntVar(&o.Broker.Replicas, "replicas", 0, "JetStream replicas for the stream and buckets (default 1; 3 on a cluster)")
	fs.IntVar(&o.Broker.Workers, "workers", 0, "concurrent handlers per consumer (default 64)")
	fs.Func("decision-key", "sign every decision with the nkeys account seed in `file` (broker decision-key new); agents that trust its public key refuse decisions it did not sign (docs/protocol.md)", func(path string) (err error) {
		o.Broker.DecisionKey, err = ReadDecisionKey(path)
		return err
	})
	fs.Func("trust-decision-key", "with --decision-key, while keys rotate: decisions signed by this earlier decision `key` (public, A...) are a broker's too; repeat it or separate keys with commas", func(v string) error {
		keys, err := events.ParseTrustedKeys(v)
		o.Broker.TrustedDecisionKeys = append(o.Broker.TrustedDecisionKeys, keys...)
		return err
	})
	tracing.RegisterFlags(fs, &o.Tracing)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: broker [flags]\n\nRuns the broker. \"broker help\" describes the other commands (%s).\n\nflags:\n", strings.Join(commandWords(), ", "))
		envflag.PrintDefaults(fs)
	}
	finish = func() error {
		if tlsCert != "" || tlsKey != "" || tlsClientCA != "" {
			o.NATSTLS = &natsembed.TLS{CertFile: tlsCert, KeyFile: tlsKey, ClientCAFile: tlsClientCA}
		}
		m, err := broker.ParseMode(*mode)
		if err != nil {
			return err
		}
		o.Broker.Mode = m
		switch ci := o.Broker.CheckpointInterval; {
		case ci < 0:
			return fmt.Errorf("--checkpoint-interval %s: want a positive duration, or 0 for never", ci)
		case ci == 0:
			o.Broker.CheckpointInterval = -1 // never
		}
		return nil
	}
	return fs, finish
}

// DefaultGCFloor is the broker's --gc-floor: 256 MiB.
const DefaultGCFloor = 256 << 20

// mibFlag is a size in bytes given in whole MiB.
type mibFlag struct{ p *uint64 }

func (f mibFlag) String() string {
	if f.p == nil {
		return "0"
	}
	return strconv.FormatUint(*f.p>>20, 10)
}

func (f mibFlag) Set(v string) error {
	mib, err := strconv.ParseUint(v, 10, 32)
	if err != nil {
		return errors.New("a whole number of MiB, such as 256 (0: off)")
	}
	*f.p = mib << 20
	return nil
}
