// Package httptls serves the HTTP listeners of Assent's programs over TLS,
// from certificate files that it reads again when they change, so that a
// renewed certificate needs no restart; and it makes the HTTP clients that
// call them, trusting a CA of their own and presenting a certificate for
// mutual TLS.
package httptls

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	stdlog "log"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
)

// Files are a server's TLS files, PEM encoded.
type Files struct {
	// CertFile is the server's certificate, followed by the intermediate
	// CAs' certificates if any; KeyFile is its private key.
	CertFile, KeyFile string
	// ClientCAFile, if set, turns on mutual TLS: a client must present a
	// certificate signed by one of the CAs in it, or the handshake fails.
	// It is read at start only.
	ClientCAFile string
}

// On reports whether any of f is set.
func (f Files) On() bool { return f.CertFile != "" || f.KeyFile != "" || f.ClientCAFile != "" }

// Certs is a server's certificate, kept current: Config's connections are
// served the certificate last read from the files.
type Certs struct {
	files   Files
	log     *zap.Logger
	cur     atomic.Pointer[tls.Certificate]
	clients *x509.CertPool // nil without mutual TLS

	mu   sync.Mutex // one read of the files at a time
	seen [2]stamp   // the certificate's and key's files when last read
}

// stamp tells whether a file changed since it was last read.
type stamp struct {
	mod  time.Time
	size int64
}

// PollInterval is how often Run looks at the files for a change.
const PollInterval = 2 * time.Second

// ExpiryWarning is how close to its end a certificate read is warned of.
const ExpiryWarning = 14 * 24 * time.Hour

// Load reads and checks the files of f: a certificate for servers that is
// valid now, the key that goes with it, and the client CA's certificates.
// Its error says what is wrong with which file, and what to give instead.
func Load(f Files, log *zap.Logger) (*Certs, error) {
	if log == nil {
		log = zap.NewNop()
	}
	if f.CertFile == "" || f.KeyFile == "" {
		return nil, errors.New("TLS: a certificate file and its key file are both needed")
	}
	c := &Certs{files: f, log: log}
	if f.ClientCAFile != "" {
		pool, err := readCAs(f.ClientCAFile)
		if err != nil {
			return nil, err
		}
		c.clients = pool
	}
	if err := c.Reload(); err != nil {
		return nil, err
	}
	return c, nil
}

// readCAs reads the CA certificates of a PEM file.
func readCAs(path string) (*x509.CertPool, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("TLS client CA file: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(data) {
		return nil, fmt.Errorf("TLS client CA file %s: no PEM certificate in it: give the CA certificate (-----BEGIN CERTIFICATE-----) that signs the clients' certificates", path)
	}
	return pool, nil
}

// Config returns the TLS configuration of a server serving c: TLS 1.2 or
// later, the certificate in force at each handshake, and with a client CA,
// a client certificate signed by it required.
func (c *Certs) Config() *tls.Config {
	cfg := &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			return c.cur.Load(), nil
		},
	}
	if c.clients != nil {
		cfg.ClientAuth, cfg.ClientCAs = tls.RequireAndVerifyClientCert, c.clients
	}
	return cfg
}

// Leaf returns the certificate in force.
func (c *Certs) Leaf() *x509.Certificate { return c.cur.Load().Leaf }

// Reload reads the certificate and key files now. A pair that does not
// load, or a certificate that cannot serve, is refused with the reason and
// the one in force is kept.
func (c *Certs) Reload() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seen = [2]stamp{stampOf(c.files.CertFile), stampOf(c.files.KeyFile)}
	cert, err := c.read()
	if err != nil {
		return err
	}
	old := c.cur.Swap(cert)
	leaf := cert.Leaf
	fields := []zap.Field{zap.String("file", c.files.CertFile), zap.String("subject", leaf.Subject.String()),
		zap.String("serial", leaf.SerialNumber.Text(16)), zap.Time("not_after", leaf.NotAfter)}
	switch {
	case old == nil:
		c.log.Info("TLS certificate loaded", fields...)
	case !bytes.Equal(old.Leaf.Raw, leaf.Raw):
		c.log.Info("TLS certificate reloaded", fields...)
	}
	if left := time.Until(leaf.NotAfter); left < ExpiryWarning {
		c.log.Warn("TLS certificate expires soon: renew it; the new files are read without a restart", append(fields, zap.Duration("left", left.Round(time.Minute)))...)
	}
	return nil
}

// read loads the certificate and key files and checks that they can serve.
func (c *Certs) read() (*tls.Certificate, error) {
	f := c.files
	certPEM, err := os.ReadFile(f.CertFile)
	if err != nil {
		return nil, fmt.Errorf("TLS certificate file: %w", err)
	}
	keyPEM, err := os.ReadFile(f.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("TLS key file: %w", err)
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("TLS certificate %s with key %s: %w: give the PEM certificate (its chain after it) and the private key made with it", f.CertFile, f.KeyFile, err)
	}
	leaf := cert.Leaf
	now := time.Now()
	switch {
	case now.After(leaf.NotAfter):
		return nil, fmt.Errorf("TLS certificate %s expired at %s: renew it", f.CertFile, leaf.NotAfter.UTC().Format(time.RFC3339))
	case now.Before(leaf.NotBefore):
		return nil, fmt.Errorf("TLS certificate %s is valid only from %s: check this machine's clock, or use a certificate valid now", f.CertFile, leaf.NotBefore.UTC().Format(time.RFC3339))
	case len(leaf.ExtKeyUsage) > 0 && !slices.Contains(leaf.ExtKeyUsage, x509.ExtKeyUsageServerAuth) && !slices.Contains(leaf.ExtKeyUsage, x509.ExtKeyUsageAny):
		return nil, fmt.Errorf("TLS certificate %s is not for servers (its extended key usage lacks serverAuth): clients would refuse it; issue one for TLS servers", f.CertFile)
	}
	return &cert, nil
}

// Run reads the files again whenever they change (a renewal, a mounted
// secret updated), every PollInterval, until ctx ends. A change that does
// not load is logged and the certificate in force kept; it is read again
// at the files' next change.
func (c *Certs) Run(ctx context.Context) error {
	t := time.NewTicker(PollInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		if !c.changed() {
			continue
		}
		if err := c.Reload(); err != nil {
			c.log.Error("TLS certificate reload refused; keeping the one in force", zap.Error(err))
		}
	}
}

// changed reports whether the certificate or key file changed since read.
func (c *Certs) changed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.seen != [2]stamp{stampOf(c.files.CertFile), stampOf(c.files.KeyFile)}
}

func stampOf(path string) stamp {
	fi, err := os.Stat(path)
	if err != nil {
		return stamp{}
	}
	return stamp{fi.ModTime(), fi.Size()}
}

// ErrorLog is an http.Server's ErrorLog writing to log: a TLS handshake
// that fails (a client that does not trust the certificate, one without a
// client certificate, plain HTTP, a port scan) at debug level, each such
// client's own problem; anything else the server says as a warning.
func ErrorLog(log *zap.Logger) *stdlog.Logger {
	return stdlog.New(errorLog{log}, "", 0)
}

type errorLog struct{ log *zap.Logger }

func (w errorLog) Write(p []byte) (int, error) {
	msg := strings.TrimSpace(string(p))
	if strings.HasPrefix(msg, "http: TLS handshake error") {
		w.log.Debug(msg)
	} else {
		w.log.Warn(msg)
	}
	return len(p), nil
}
