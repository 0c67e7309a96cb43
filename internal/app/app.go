// Package app assembles the broker process: NATS (embedded or remote), the
// broker, and the HTTP gateway, with one lifecycle.
package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"

	"github.com/assent-dev/assent/internal/auth"
	"github.com/assent-dev/assent/internal/broker"
	"github.com/assent-dev/assent/internal/creds"
	"github.com/assent-dev/assent/internal/gcpace"
	"github.com/assent-dev/assent/internal/httpapi"
	"github.com/assent-dev/assent/internal/httptls"
	"github.com/assent-dev/assent/internal/natsconn"
	"github.com/assent-dev/assent/internal/natsembed"
	"github.com/assent-dev/assent/internal/tracing"
	"github.com/assent-dev/assent/internal/webui"
)

// Options configure the broker process.
type Options struct {
	// NATSURL connects to an existing server or cluster; empty runs an embedded
	// server on NATSListen with storage in DataDir.
	NATSURL string
	// NATSCreds is a credentials file for NATSURL.
	NATSCreds string
	// NATSCA, NATSCert and NATSKey are the TLS files for NATSURL: the CA of
	// the server's certificate, and a client certificate for mutual TLS.
	NATSCA, NATSCert, NATSKey string
	// NATSTLS, for the embedded server, makes clients connect over TLS
	// (and, with a client CA, present a certificate).
	NATSTLS *natsembed.TLS
	// NATSOperator, for the embedded server, is a credentials authority's
	// directory (internal/creds, `broker creds init`): the server then runs
	// in operator mode, admitting only clients with credentials it issued,
	// each bound by its role's permissions.
	NATSOperator string
	// NATSListen is host:port for the embedded server's clients; port 0 picks a
	// free port.
	NATSListen string
	// DataDir is the embedded server's JetStream storage.
	DataDir string
	// Sync is the embedded server's fsync policy ("always" or an interval).
	Sync string
	// HTTPListen is host:port for the HTTP API; empty disables it. Without
	// AuthFile it must be a loopback address, with TLS or without.
	HTTPListen string
	// TLS, with its CertFile and KeyFile, serves the HTTP API and web UI
	// (and MetricsListen) over HTTPS only, TLS 1.2 or later. The files are
	// read at start, and again when they change or Reload fires, so that a
	// renewed certificate needs no restart. Its ClientCAFile, if set,
	// requires a client certificate signed by that CA (mutual TLS): others
	// are refused at the handshake.
	TLS httptls.Files
	// MetricsTokenFile, if set, holds a bearer token that GET /metrics then
	// requires (Authorization: Bearer TOKEN), whoever the caller is
	// otherwise; re-read when it changes or Reload fires. Empty, /metrics is
	// open, as /healthz and /readyz are.
	MetricsTokenFile string
	// MetricsListen, if set, is host:port for a listener of its own that
	// serves GET /metrics (over TLS if TLS is set), which the HTTP API then
	// does not serve.
	MetricsListen string
	// AuthFile, if set, turns authentication on for the HTTP API and web UI
	// (docs/web.md); answers are then made as the caller's identity.
	AuthFile string
	// PolicyFile, if set, is loaded at start (a bad file stops the process) and
	// reloaded when it changes or Reload fires; a bad reload keeps the old one.
	PolicyFile string
	// ShadowPolicyFile, if set, is a candidate policy evaluated beside the live
	// one; disagreements are recorded, never acted on. Reloaded with it.
	ShadowPolicyFile string
	// Reload asks for the policy file, the auth file, the TLS certificate
	// and the metrics token to be read again (main feeds it SIGHUP).
	Reload <-chan struct{}
	// PprofListen, if set, is a loopback host:port serving Go's runtime
	// profiles (net/http/pprof, /debug/pprof/) on a listener of its own,
	// from the start of Run, before the embedded server recovers its store.
	// Empty (the default) serves none.
	PprofListen string
	// GC paces the garbage collector (internal/gcpace): GC.Floor, if not 0,
	// is the smallest goal in bytes it is given, so that a small live heap
	// is collected no more often than a heap of that size would be;
	// GC.Headroom, if not 0, is the most a large live heap may grow by
	// before a collection (or a quarter of it, if more).
	GC gcpace.Pace
	// DrainDelay is how long the process goes on working once ctx ends, with
	// /readyz answering 503, so that load balancers stop sending it HTTP
	// before it stops taking requests (docs/cluster.md#rolling-restarts).
	// Zero stops at once.
	DrainDelay time.Duration
	// Broker settings.
	Broker broker.Config
	// Tracing configures the OTLP export of the broker's spans, and of the
	// HTTP API's (docs/tracing.md); off by default. A TracerProvider set in
	// Broker is used as it is instead.
	Tracing tracing.Config
	// Ready, if set, is called once the broker is ready, with the addresses it
	// listens on.
	Ready func(Addrs)
}

// Addrs are where a running process listens.
type Addrs struct {
	NATS    string // client URL
	HTTP    string // http://host:port, or https:// with TLS, or empty
	Metrics string // the base URL of the listener serving /metrics: HTTP's, MetricsListen's, or empty
	Pprof   string // http://host:port of the profiles (/debug/pprof/), or empty
}

// Validate reports every problem with o at once.
func (o Options) Validate() error {
	var errs []error
	if o.NATSURL == "" {
		if _, _, err := splitHostPort(o.NATSListen); err != nil {
			errs = append(errs, fmt.Errorf("nats listen address: %w", err))
		}
		if o.DataDir == "" {
			errs = append(errs, errors.New("data dir: required for the embedded NATS server"))
		}
		if err := (natsembed.Config{StoreDir: o.DataDir, Sync: o.Sync}).Validate(); err != nil && o.DataDir != "" {
			errs = append(errs, err)
		}
	}
	if o.NATSTLS != nil && o.NATSURL != "" {
		errs = append(errs, errors.New("--nats-tls-cert serves the embedded server over TLS; with --nats-url, the server's own configuration says TLS (use --nats-ca to trust its certificate)"))
	}
	if t := o.NATSTLS; t != nil && (t.CertFile == "" || t.KeyFile == "") {
		errs = append(errs, errors.New("embedded NATS TLS: give both --nats-tls-cert and --nats-tls-key"))
	}
	if o.NATSOperator != "" && o.NATSURL != "" {
		errs = append(errs, errors.New("--nats-operator runs the embedded server in operator mode; with --nats-url, give the broker its credentials with --nats-creds (made by `broker creds broker`)"))
	}
	if o.HTTPListen != "" {
		if host, _, err := splitHostPort(o.HTTPListen); err != nil {
			errs = append(errs, fmt.Errorf("http listen address: %w", err))
		} else if o.AuthFile == "" && !loopback(host) {
			tls := ""
			if o.TLS.On() {
				tls = " (TLS, mutual or not, protects the connection; it does not say who answers)"
			}
			errs = append(errs, fmt.Errorf("http listen address %s: without --auth the HTTP API lets whoever reaches it answer as anyone, so it serves loopback only (127.0.0.1, ::1, localhost)%s; add --auth FILE (docs/web.md) to serve %s", o.HTTPListen, tls, o.HTTPListen))
		}
	}
	errs = append(errs, o.validateHTTPS()...)
	if o.PprofListen != "" {
		if host, _, err := splitHostPort(o.PprofListen); err != nil {
			errs = append(errs, fmt.Errorf("pprof listen address: %w", err))
		} else if !loopback(host) {
			errs = append(errs, fmt.Errorf("pprof listen address %s: the profiles show the process's code paths, command line and memory, and taking one costs CPU, with no authentication, so they are served on loopback only (127.0.0.1, ::1, localhost); from another machine, reach it through a tunnel (ssh -L, kubectl port-forward)", o.PprofListen))
		}
	}
	if o.DrainDelay < 0 {
		errs = append(errs, fmt.Errorf("drain delay %s: want zero or more", o.DrainDelay))
	}
	if err := o.Broker.WithDefaults().Validate(); err != nil {
		errs = append(errs, err)
	}
	if err := o.Tracing.Validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// validateHTTPS reports the problems with the TLS and metrics options.
func (o Options) validateHTTPS() []error {
	var errs []error
	served := o.HTTPListen != "" || o.MetricsListen != ""
	if t := o.TLS; t.On() {
		switch {
		case t.CertFile == "" && t.KeyFile == "":
			errs = append(errs, errors.New("--tls-client-ca asks HTTPS clients for a certificate: give the broker's own too, --tls-cert FILE and --tls-key FILE"))
		case t.CertFile == "":
			errs = append(errs, errors.New("--tls-key without --tls-cert: give both, the certificate file and its key file"))
		case t.KeyFile == "":
			errs = append(errs, errors.New("--tls-cert without --tls-key: give both, the certificate file and its key file"))
		}
		if !served {
			errs = append(errs, errors.New("--tls-cert serves the HTTP API over HTTPS, but --http is empty (the API is off): give --http ADDR, or leave out the TLS flags"))
		}
	}
	if o.MetricsTokenFile != "" && !served {
		errs = append(errs, errors.New("--metrics-token guards GET /metrics, but nothing serves it: --http is empty and --metrics-listen is not set"))
	}
	if o.MetricsListen != "" {
		if _, port, err := splitHostPort(o.MetricsListen); err != nil {
			errs = append(errs, fmt.Errorf("metrics listen address: %w", err))
		} else if port != 0 && o.MetricsListen == o.HTTPListen {
			errs = append(errs, fmt.Errorf("--metrics-listen %s is the HTTP API's address (--http): give it a port of its own, or leave it out to serve /metrics on the API's", o.MetricsListen))
		}
	}
	return errs
}

// loopback reports whether host only ever means this machine.
func loopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func splitHostPort(addr string) (string, int, error) {
	host, p, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, err
	}
	port, err := strconv.Atoi(p)
	if err != nil || port < 0 || port > 65535 {
		return "", 0, fmt.Errorf("port %q: want 0-65535", p)
	}
	return host, port, nil
}

// Run runs the process until ctx ends, then shuts down in order: /readyz
// answers 503 at once while everything else goes on for o.DrainDelay; then
// HTTP stops taking requests and finishes those in flight while the broker
// drains its consumers (finishing the messages it holds); then the NATS
// connection drains, and the embedded server (if any) stops.
func Run(ctx context.Context, o Options, log *zap.Logger) error {
	if log == nil {
		log = zap.NewNop()
	}
	if err := o.Validate(); err != nil {
		return err
	}
	addrs := Addrs{}
	if o.Broker.TracerProvider == nil {
		tp, err := tracing.New(ctx, o.Tracing, tracing.ServiceBroker, log)
		if err != nil {
			return err
		}
		// Last: the spans of the shutdown are exported too.
		defer tracing.Stop(tp, log)
		o.Broker.TracerProvider = tp
	}
	if o.GC != (gcpace.Pace{}) {
		pctx, stop := context.WithCancel(ctx)
		paced := make(chan struct{})
		go func() { gcpace.Run(pctx, o.GC); close(paced) }()
		defer func() { stop(); <-paced }()
	}
	if o.PprofListen != "" {
		url, stop, err := servePprof(o.PprofListen, log)
		if err != nil {
			return err
		}
		defer stop()
		addrs.Pprof = url
	}
	if o.PolicyFile != "" {
		p, err := LoadPolicy(o.PolicyFile)
		if err != nil {
			return err
		}
		o.Broker.Policy = p
		log.Info("policy loaded", zap.String("file", o.PolicyFile), zap.Int("rules", len(p.Rules)), zap.String("mode", string(p.Mode)))
	}
	if o.ShadowPolicyFile != "" {
		p, err := LoadPolicy(o.ShadowPolicyFile)
		if err != nil {
			return fmt.Errorf("shadow %w", err)
		}
		o.Broker.Shadow = p
		log.Info("shadow policy loaded; disagreements are recorded, never acted on", zap.String("file", o.ShadowPolicyFile))
	}
	// The HTTPS certificate and the metrics token are read before anything
	// starts: a file that is missing or wrong stops the process at once.
	var certs *httptls.Certs
	if o.TLS.On() {
		c, err := httptls.Load(o.TLS, log.Named("tls"))
		if err != nil {
			return fmt.Errorf("%w (--tls-cert, --tls-key, --tls-client-ca; docs/security.md#tls)", err)
		}
		certs = c
	}
	var token *metricsToken
	if o.MetricsTokenFile != "" {
		t, err := loadMetricsToken(o.MetricsTokenFile)
		if err != nil {
			return err
		}
		token = t
	}
	url := o.NATSURL
	connectURL := url // where this process connects: in process, without TLS
	var natsOpts []nats.Option
	if url == "" {
		host, port, _ := splitHostPort(o.NATSListen)
		if port == 0 {
			port = -1 // any free port, as for HTTP
		}
		cfg := natsembed.Config{Host: host, Port: port, StoreDir: o.DataDir, Sync: o.Sync, ServerName: o.Broker.WithDefaults().Name, TLS: o.NATSTLS}
		if o.NATSOperator != "" {
			a, err := creds.Open(o.NATSOperator)
			if err != nil {
				return err
			}
			cfg.Operator = a.Embedded()
			// The broker's own connection: a broker user made now.
			token, seed, err := a.User(creds.Identity{Role: creds.RoleBroker, Name: o.Broker.WithDefaults().Name})
			if err != nil {
				return err
			}
			natsOpts = append(natsOpts, nats.UserJWTAndSeed(token, seed))
		}
		ns, err := natsembed.Start(cfg, log)
		if err != nil {
			return err
		}
		defer func() {
			ns.Shutdown()
			ns.WaitForShutdown()
		}()
		url = ns.ClientURL()
		connectURL = strings.Replace(url, "tls://", "nats://", 1)
		natsOpts = append(natsOpts, nats.InProcessServer(ns))
		log.Info("embedded NATS with JetStream running", zap.String("url", url), zap.String("data_dir", o.DataDir), zap.String("sync", syncName(o.Sync)),
			zap.Bool("operator_mode", o.NATSOperator != ""))
	}
	if o.NATSURL != "" {
		client, err := natsconn.Settings{URL: o.NATSURL, Creds: o.NATSCreds, CAFile: o.NATSCA, CertFile: o.NATSCert, KeyFile: o.NATSKey}.Options()
		if err != nil {
			return err
		}
		natsOpts = append(natsOpts, client...)
	}
	natsOpts = append(natsOpts, nats.Name("assent-broker"), nats.MaxReconnects(-1),
		nats.DisconnectErrHandler(func(c *nats.Conn, err error) {
			if !c.IsClosed() && !c.IsDraining() {
				log.Warn("NATS disconnected", zap.Error(err))
			}
		}),
		nats.ReconnectHandler(func(c *nats.Conn) { log.Info("NATS reconnected", zap.String("url", c.ConnectedUrl())) }))
	nc, err := nats.Connect(connectURL, natsOpts...)
	if err != nil {
		return fmt.Errorf("connect to NATS at %s: %w", url, err)
	}
	defer nc.Close()

	// Without an HTTP API, only announced approver channels reach anyone.
	o.Broker.AnnouncedOnly = o.HTTPListen == ""
	m := newMetrics()
	o.Broker.Observe = m.observe
	b, err := broker.New(nc, o.Broker, log)
	if err != nil {
		return err
	}
	// ctx ending starts the shutdown; work ending stops the work.
	work, stopWork := context.WithCancel(context.WithoutCancel(ctx))
	defer stopWork()
	g, gctx := errgroup.WithContext(work)
	served := &draining{Broker: b}
	g.Go(func() error {
		select {
		case <-ctx.Done():
		case <-gctx.Done():
			return nil
		}
		served.stopping.Store(true)
		log.Info("stopping: not ready any more", zap.Duration("drain_delay", o.DrainDelay))
		select {
		case <-time.After(o.DrainDelay):
		case <-gctx.Done():
		}
		stopWork()
		return nil
	})
	g.Go(func() error { return b.Run(gctx) })
	var authn *auth.Authenticator
	if o.AuthFile != "" {
		cfg, err := auth.Load(o.AuthFile)
		if err != nil {
			return err
		}
		js, err := jetstream.New(nc)
		if err != nil {
			return err
		}
		authn, err = auth.New(ctx, cfg, o.AuthFile, auth.Options{JS: js, Logger: log, Replicas: b.Config().Replicas,
			Principals: func() auth.PrincipalResolver { return b.Policy() }})
		if err != nil {
			return err
		}
		g.Go(func() error { return authn.Run(gctx) })
		log.Info("authentication on", zap.String("file", o.AuthFile), zap.Int("tokens", len(cfg.Tokens)), zap.Bool("oidc", cfg.OIDC != nil), zap.Bool("proxy", cfg.Proxy != nil))
	}
	if certs != nil {
		g.Go(func() error { return certs.Run(gctx) })
	}
	if token != nil {
		g.Go(func() error { token.watch(gctx, log); return nil })
	}
	// SIGHUP reloads the policy files, the auth file, the HTTPS certificate
	// and the metrics token.
	policyReload := make(chan struct{}, 1)
	g.Go(func() error {
		for {
			select {
			case <-gctx.Done():
				return nil
			case <-o.Reload:
				select {
				case policyReload <- struct{}{}:
				default:
				}
				if authn != nil {
					if err := authn.Reload(); err != nil {
						log.Error("auth file reload refused; keeping the one in force", zap.Error(err))
					}
				}
				if certs != nil {
					if err := certs.Reload(); err != nil {
						log.Error("TLS certificate reload refused; keeping the one in force", zap.Error(err))
					}
				}
				if token != nil {
					token.reloadOrKeep(log)
				}
			}
		}
	})
	if o.PolicyFile != "" || o.ShadowPolicyFile != "" {
		g.Go(func() error { watchPolicy(gctx, o.PolicyFile, o.ShadowPolicyFile, policyReload, b, log); return nil })
	}

	addrs.NATS = url
	// GET /metrics: on the API's listener (as every other route, or with a
	// token, before authentication: the token is no API token), or on a
	// listener of its own.
	var metricsHandler http.Handler
	if o.HTTPListen != "" || o.MetricsListen != "" {
		var failures func() map[string]int64
		if authn != nil {
			failures = func() map[string]int64 { return authn.Stats().Failures }
		}
		m.register(b, failures)
		metricsHandler = m.handler()
		if token != nil {
			metricsHandler = token.require(metricsHandler)
		}
	}
	hs := httpServing{g: g, ctx: gctx, certs: certs, log: log}
	if o.HTTPListen != "" {
		// Long polls and event streams end when the work stops, not the
		// drain delay before: the API serves as usual until then.
		hc := httpapi.Config{MaxBodyBytes: int64(b.Config().MaxEventSize), Stopping: gctx, TracerProvider: o.Broker.TracerProvider}
		if authn != nil {
			hc.Identify = identify
		}
		api := httpapi.New(served, hc, log)
		metricsOnAPI := o.MetricsListen == ""
		if metricsOnAPI && token == nil {
			api.Handle("GET /metrics", metricsHandler)
		}
		uc := webui.Config{}
		if authn != nil {
			uc.Identify = func(r *http.Request) (webui.Identity, bool) {
				id, ok := auth.FromContext(r.Context())
				return webui.Identity{Principal: id.Principal, Agent: id.Agent, Admin: id.Admin, Method: id.Method}, ok
			}
			uc.CSRFToken = func(r *http.Request) string { return auth.CSRFToken(r.Context()) }
		}
		ui, err := webui.New(b, uc, log)
		if err != nil {
			return err
		}
		ui.Register(api)
		var handler http.Handler = api
		if authn != nil {
			authn.Routes(api)
			handler = authn.Middleware(api)
		}
		handler = served.gate(handler)
		if metricsOnAPI && token != nil {
			handler = metricsFirst(metricsHandler, handler)
		}
		addrs.HTTP, err = hs.serve("http", o.HTTPListen, handler)
		if err != nil {
			return err
		}
		if o.AuthFile == "" {
			log.Warn("HTTP API without authentication, on loopback only: anyone on this machine may answer as anyone; use --auth FILE to require sign-in (docs/web.md)", zap.String("url", addrs.HTTP))
		} else {
			log.Info("HTTP API listening", zap.String("url", addrs.HTTP), zap.Bool("client_certificates", o.TLS.ClientCAFile != ""))
		}
		if metricsOnAPI {
			addrs.Metrics = addrs.HTTP
		}
	}
	if o.MetricsListen != "" {
		addrs.Metrics, err = hs.serve("metrics", o.MetricsListen, metricsFirst(metricsHandler, http.NotFoundHandler()))
		if err != nil {
			return err
		}
		log.Info("metrics listening", zap.String("url", addrs.Metrics+"/metrics"), zap.Bool("token", token != nil))
	}
	g.Go(func() error {
		t := time.NewTicker(10 * time.Millisecond)
		defer t.Stop()
		for !b.Ready() {
			select {
			case <-gctx.Done():
				return nil
			case <-t.C:
			}
		}
		served.started.Store(true)
		log.Info("ready: agents publish to assent.request.<agent>; approve over HTTP or NATS", zap.String("nats", addrs.NATS), zap.String("http", addrs.HTTP),
			zap.String("metrics", addrs.Metrics), zap.String("pprof", addrs.Pprof))
		if o.Ready != nil {
			o.Ready(addrs)
		}
		return nil
	})
	err = g.Wait()
	// The broker has drained its consumers; drain the connection too (flush
	// what is buffered) and wait for it before the embedded server stops.
	if derr := nc.Drain(); derr != nil && !errors.Is(derr, nats.ErrConnectionClosed) {
		log.Debug("drain NATS connection", zap.Error(derr))
	}
	for deadline := time.Now().Add(5 * time.Second); !nc.IsClosed() && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	return err
}

// httpShutdown bounds the wait for HTTP requests in flight when stopping.
const httpShutdown = 10 * time.Second

// httpServing starts the process's HTTP listeners in g: over TLS with
// certs, if set; each stops when ctx ends.
type httpServing struct {
	g     *errgroup.Group
	ctx   context.Context
	certs *httptls.Certs
	log   *zap.Logger
}

// serve listens on addr and serves h there until ctx ends, then stops
// taking requests and finishes those in flight, for httpShutdown at most.
// It returns the listener's base URL: http://host:port, or https://.
func (s httpServing) serve(what, addr string, h http.Handler) (string, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", fmt.Errorf("%s listen: %w", what, err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	url := "http://" + ln.Addr().String()
	if s.certs != nil {
		srv.TLSConfig, srv.ErrorLog = s.certs.Config(), httptls.ErrorLog(s.log.Named(what))
		url = "https://" + ln.Addr().String()
	}
	s.g.Go(func() error {
		var err error
		if s.certs != nil {
			err = srv.ServeTLS(ln, "", "") // the certificate comes from TLSConfig
		} else {
			err = srv.Serve(ln)
		}
		if !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("%s: %w", what, err)
		}
		return nil
	})
	s.g.Go(func() error {
		<-s.ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), httpShutdown)
		defer cancel()
		if err := srv.Shutdown(sctx); err != nil {
			s.log.Warn("HTTP requests still running when stopping; their connections are closed", zap.String("listener", what), zap.Duration("after", httpShutdown), zap.Error(err))
			return srv.Close()
		}
		return nil
	})
	return url, nil
}

// draining is the broker as the HTTP API sees it: not ready from the moment
// the process starts stopping, while it still serves; and not serving the
// API before it has started.
type draining struct {
	*broker.Broker
	started  atomic.Bool // the broker has run: its stream and buckets are there
	stopping atomic.Bool
}

// Ready is false until the gate lets the API through (started), so that a
// client that waited for /readyz is never answered not_ready.
func (d *draining) Ready() bool {
	return !d.stopping.Load() && d.started.Load() && d.Broker.Ready()
}

// gate answers 503 to every request but the probes and the metrics until
// the broker has started: before, it has nothing to read requests from. A
// replica starting again during a rolling restart is reached by clients that
// do not wait for its readiness (an event stream reconnecting, say).
func (d *draining) gate(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case d.started.Load(), r.URL.Path == "/healthz", r.URL.Path == "/readyz", r.URL.Path == "/metrics":
			h.ServeHTTP(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Retry-After", "1")
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = io.WriteString(w, `{"error":{"code":"not_ready","message":"the broker is starting; try again in a moment"}}`+"\n")
	})
}

// identify gives the gateway the identity the authentication attached.
func identify(r *http.Request) (httpapi.Identity, bool) {
	id, ok := auth.FromContext(r.Context())
	return httpapi.Identity{Principal: id.Principal, Agent: id.Agent, Admin: id.Admin, Name: id.Name}, ok
}

func syncName(s string) string {
	if s == "" {
		return "always"
	}
	return s
}
