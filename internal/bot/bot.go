package bot

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"
	"gopkg.in/yaml.v3"

	"github.com/assent-dev/assent/internal/app"
	"github.com/assent-dev/assent/internal/channels"
	"github.com/assent-dev/assent/pkg/handler"
)

// factory makes a channel from its configuration section.
type factory func(c *Config, n *yaml.Node, env channels.Env) (channels.Adapter, error)

// checker checks a channel against its service (approver-bot check): a,
// made from the section, or the section itself.
type checker func(ctx context.Context, c *Config, n *yaml.Node, a channels.Adapter) ([]string, error)

// section is one channel section of the configuration.
type section struct {
	name  string
	node  *yaml.Node
	make  factory
	check checker
}

func (c *Config) sections() []section {
	var out []section
	for _, s := range []section{{"slack", c.Slack, newSlack, checkSlack}, {"email", c.Email, newEmail, checkEmail}, {"webhooks", c.Webhooks, newWebhooks, checkWebhooks}} {
		if s.node != nil {
			out = append(out, s)
		}
	}
	return out
}

// Bot is a configured approver bot, ready to run.
type Bot struct {
	cfg      *Config
	nc       *nats.Conn
	dir      *channels.Directory
	adapters []channels.Adapter
	log      *zap.Logger
	ln       net.Listener
	// Ready, if set, is called with the HTTP server's address once the bot
	// serves and its channels run.
	Ready func(addr string)
}

// New connects to NATS, reads the policy and makes every configured channel;
// Run then runs them.
func New(cfg *Config, log *zap.Logger) (*Bot, error) {
	p, err := app.LoadPolicy(cfg.Policy)
	if err != nil {
		return nil, err
	}
	nc, err := connect(cfg.NATSSettings())
	if err != nil {
		return nil, fmt.Errorf("%s: nats: %w", cfg.File, err)
	}
	b := &Bot{cfg: cfg, nc: nc, dir: channels.NewDirectory(p), log: log}
	env := channels.Env{NATS: nc, Directory: b.dir, PublicURL: cfg.HTTP.PublicURL, WebUI: cfg.WebUI, Trusted: cfg.Trusted, Logger: log}
	var errs []error
	for _, s := range cfg.sections() {
		env.Logger = log.Named(s.name)
		a, err := s.make(cfg, s.node, env)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if len(a.Reaches()) == 0 && s.name != "webhooks" {
			log.Warn("no principal of the policy has an identity on this channel: nobody will be notified", zap.String("channel", a.Name()), zap.String("policy", cfg.Policy))
		}
		b.adapters = append(b.adapters, a)
	}
	if err := errors.Join(errs...); err != nil {
		nc.Close()
		return nil, err
	}
	return b, nil
}

// Run serves the channels until ctx ends. SIGHUP reloads the policy.
func (b *Bot) Run(ctx context.Context) error {
	defer b.nc.Close()
	ln, err := net.Listen("tcp", b.cfg.HTTP.Listen)
	if err != nil {
		return fmt.Errorf("http.listen %s: %w", b.cfg.HTTP.Listen, err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if b.nc.Status() != nats.CONNECTED {
			http.Error(w, "NATS: "+b.nc.Status().String(), http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET "+StatusPath, b.serveStatus)
	mux.Handle("GET "+MetricsPath, b.metrics())
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	errc := make(chan error, len(b.adapters)+1)
	for _, a := range b.adapters {
		rt, err := handler.NewChannel(b.nc, handler.ChannelConfig{
			Channel: a.Name(), Reachable: a.Reaches, Agents: b.cfg.Agents, Remind: b.cfg.Remind,
			TrustedKeys: b.cfg.TrustedDecisionKeys, Logger: b.log,
		}, a)
		if err != nil {
			ln.Close()
			return err
		}
		if err := a.Start(ctx, rt, mux); err != nil {
			ln.Close()
			return fmt.Errorf("%s: %w", a.Name(), err)
		}
		wg.Go(func() {
			if err := rt.Run(ctx); err != nil {
				errc <- fmt.Errorf("%s: %w", a.Name(), err)
			}
		})
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	wg.Go(func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			errc <- fmt.Errorf("http: %w", err)
		}
	})
	wg.Go(func() { b.reloadOnHUP(ctx) })
	names := make([]string, len(b.adapters))
	for i, a := range b.adapters {
		names[i] = a.Name()
	}
	b.log.Info("approver-bot running", zap.Strings("channels", names), zap.String("http", ln.Addr().String()),
		zap.String("public_url", b.cfg.HTTP.PublicURL), zap.String("nats", b.cfg.NATS.URL))
	if b.Ready != nil {
		b.Ready(ln.Addr().String())
	}
	var runErr error
	select {
	case <-ctx.Done():
	case runErr = <-errc:
		b.log.Error("stopping", zap.Error(runErr))
	}
	cancel()
	sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer scancel()
	_ = srv.Shutdown(sctx)
	wg.Wait()
	// Channels with work of their own (Socket Mode, webhook deliveries)
	// finish it: the last attempts and their log records.
	for _, a := range b.adapters {
		if w, ok := a.(interface{ Wait() }); ok {
			w.Wait()
		}
	}
	return runErr
}

// reloadOnHUP reads the policy again on SIGHUP, keeping the one in use if the
// new one is broken.
func (b *Bot) reloadOnHUP(ctx context.Context) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
			p, err := app.LoadPolicy(b.cfg.Policy)
			if err != nil {
				b.log.Error("policy reload refused; keeping the one in use", zap.String("policy", b.cfg.Policy), zap.Error(err))
				continue
			}
			b.dir.Set(p)
			b.log.Info("policy reloaded", zap.String("policy", b.cfg.Policy), zap.Int("principals", len(p.Principals)))
		}
	}
}
