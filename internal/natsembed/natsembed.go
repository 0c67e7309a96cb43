// Package natsembed runs a nats-server with JetStream inside the broker process,
// for laptops, tests and single-node installs.
package natsembed

import (
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"go.uber.org/zap"
)

// Config describes an embedded server. The zero value is not usable: StoreDir is
// required.
type Config struct {
	// Host and Port to listen on for NATS clients. Port -1 picks a free port;
	// 0 means the NATS default, 4222.
	Host string
	Port int
	// StoreDir holds JetStream's file storage.
	StoreDir string
	// Sync is the fsync policy: "always" fsyncs every write before it is
	// acknowledged; a duration such as "2m" flushes on that interval (nats-server's
	// default, which can lose acknowledged writes on power loss). Empty means "always".
	Sync string
	// MaxStore bounds JetStream file storage in bytes; 0 means no limit beyond the disk.
	MaxStore int64
	// ServerName names the server in logs and cluster views.
	ServerName string
	// ReadyTimeout bounds the wait for the server to accept connections; 0 means 10s.
	ReadyTimeout time.Duration
	// TLS, if set, makes clients connect over TLS.
	TLS *TLS
	// Operator, if set, runs the server in operator mode: only clients with
	// credentials (user JWTs) signed by its accounts connect, each bound by
	// the permissions in its JWT.
	Operator *Operator
}

// TLS is a server's TLS for client connections.
type TLS struct {
	// CertFile and KeyFile are the server's certificate (PEM, with its
	// chain) and key.
	CertFile, KeyFile string
	// ClientCAFile, if set, turns on mutual TLS: every client must present a
	// certificate signed by this CA.
	ClientCAFile string
}

// MaxPayload is the largest message a server Assent runs takes: nats-server's
// default of 1 MiB leaves no room for the 64 KiB the broker adds to an event
// of the default 1 MiB limit (broker.NeededMaxPayload), so the broker would
// lower its limit. The configurations under deploy/ and `broker creds
// server-config` set it too; 8 MiB is the most nats-server recommends.
const MaxPayload = 8 << 20

// MaxControlLine is the longest protocol line a server in operator mode
// takes: room for the user JWTs internal/creds issues.
const MaxControlLine = 32 << 10

// Operator is the trust of a server in operator mode (internal/creds makes
// one): the operator's JWT, the system account's public key, and the
// accounts the server knows (public key -> JWT).
type Operator struct {
	JWT           string
	SystemAccount string
	Accounts      map[string]string
}

// Validate reports every problem with c at once.
func (c Config) Validate() error {
	var errs []error
	if c.StoreDir == "" {
		errs = append(errs, errors.New("natsembed: StoreDir is required"))
	}
	if _, _, err := parseSync(c.Sync); err != nil {
		errs = append(errs, err)
	}
	if c.Port < -1 || c.Port > 65535 {
		errs = append(errs, fmt.Errorf("natsembed: port %d out of range", c.Port))
	}
	return errors.Join(errs...)
}

func parseSync(s string) (always bool, every time.Duration, err error) {
	switch s {
	case "", "always":
		return true, 0, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		return false, 0, fmt.Errorf("natsembed: sync %q: want \"always\" or a positive duration such as \"2m\"", s)
	}
	return false, d, nil
}

// Start starts a server and waits until it accepts connections. The caller owns
// the returned server and must call Shutdown (then WaitForShutdown) on it.
func Start(cfg Config, log *zap.Logger) (*server.Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if log == nil {
		log = zap.NewNop()
	}
	always, every, _ := parseSync(cfg.Sync)
	dir, err := filepath.Abs(cfg.StoreDir)
	if err != nil {
		return nil, fmt.Errorf("natsembed: store dir: %w", err)
	}
	opts := &server.Options{
		ServerName:        cfg.ServerName,
		Host:              cfg.Host,
		Port:              cfg.Port,
		JetStream:         true,
		StoreDir:          dir,
		SyncAlways:        always,
		SyncInterval:      every,
		JetStreamMaxStore: cfg.MaxStore,
		NoSigs:            true,
		MaxPayload:        MaxPayload,
	}
	if opts.Host == "" {
		opts.Host = "127.0.0.1"
	}
	if opts.JetStreamMaxStore == 0 {
		opts.JetStreamMaxStore = -1
	}
	if t := cfg.TLS; t != nil {
		tc, err := server.GenTLSConfig(&server.TLSConfigOpts{CertFile: t.CertFile, KeyFile: t.KeyFile, CaFile: t.ClientCAFile, Verify: t.ClientCAFile != "", Timeout: 5})
		if err != nil {
			return nil, fmt.Errorf("natsembed: TLS: %w", err)
		}
		opts.TLS, opts.TLSConfig, opts.TLSVerify, opts.TLSTimeout = true, tc, t.ClientCAFile != "", 5
	}
	if op := cfg.Operator; op != nil {
		oc, err := jwt.DecodeOperatorClaims(op.JWT)
		if err != nil {
			return nil, fmt.Errorf("natsembed: operator JWT: %w", err)
		}
		res := &server.MemAccResolver{}
		for pub, token := range op.Accounts {
			if err := res.Store(pub, token); err != nil {
				return nil, fmt.Errorf("natsembed: account %s: %w", pub, err)
			}
		}
		opts.TrustedOperators = []*jwt.OperatorClaims{oc}
		// A user JWT travels in the CONNECT line: a bot's, with the
		// subjects of each principal it answers as, passes the default
		// 4 KiB.
		opts.MaxControlLine = MaxControlLine
		opts.SystemAccount = op.SystemAccount
		opts.AccountResolver = res
	}
	s, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("natsembed: %w", err)
	}
	s.SetLoggerV2(&zapLogger{log.Named("nats").WithOptions(zap.AddCallerSkip(1)).Sugar()}, false, false, false)
	go s.Start()
	wait := cfg.ReadyTimeout
	if wait <= 0 {
		wait = 10 * time.Second
	}
	if !s.ReadyForConnections(wait) {
		s.Shutdown()
		s.WaitForShutdown()
		return nil, fmt.Errorf("natsembed: server not ready for connections after %s (is %s:%d free?)", wait, opts.Host, opts.Port)
	}
	if !s.JetStreamEnabled() {
		s.Shutdown()
		s.WaitForShutdown()
		return nil, errors.New("natsembed: JetStream did not start (is the store dir writable?)")
	}
	return s, nil
}

// zapLogger adapts zap to nats-server's logger interface.
type zapLogger struct{ s *zap.SugaredLogger }

func (l *zapLogger) Noticef(format string, v ...any) { l.s.Debugf(format, v...) }
func (l *zapLogger) Warnf(format string, v ...any)   { l.s.Warnf(format, v...) }
func (l *zapLogger) Fatalf(format string, v ...any)  { l.s.Errorf(format, v...) }
func (l *zapLogger) Errorf(format string, v ...any)  { l.s.Errorf(format, v...) }
func (l *zapLogger) Debugf(format string, v ...any)  { l.s.Debugf(format, v...) }
func (l *zapLogger) Tracef(format string, v ...any)  { l.s.Debugf(format, v...) }
