// Package natsconn turns the NATS connection settings every Assent program
// takes (a URL, credentials, TLS files) into nats.go options, with errors
// that say what to fix.
package natsconn

import (
	"errors"
	"fmt"
	"os"

	"github.com/nats-io/nats.go"
)

// Settings are how a program connects to NATS.
type Settings struct {
	// URL is the server, or servers comma-separated.
	URL string
	// Creds is a credentials file (a user JWT and its nkey seed, as `broker
	// creds` writes): the server then binds the connection to its role.
	Creds string
	// CAFile is the PEM file of the CA that signed the server's certificate,
	// when it is not one the system trusts. Setting it requires TLS.
	CAFile string
	// CertFile and KeyFile are the client's certificate and key, for a
	// server that asks for one (mutual TLS).
	CertFile, KeyFile string
}

// Validate reports every problem with s at once.
func (s Settings) Validate() error {
	var errs []error
	if (s.CertFile == "") != (s.KeyFile == "") {
		errs = append(errs, errors.New("NATS TLS: a client certificate needs both its certificate and its key file"))
	}
	for what, f := range map[string]string{"credentials": s.Creds, "CA": s.CAFile, "client certificate": s.CertFile, "client key": s.KeyFile} {
		if f == "" {
			continue
		}
		if _, err := os.Stat(f); err != nil {
			errs = append(errs, fmt.Errorf("NATS %s file: %w", what, err))
		}
	}
	return errors.Join(errs...)
}

// Options are the nats.go options for s (not the URL).
func (s Settings) Options() ([]nats.Option, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	var opts []nats.Option
	if s.Creds != "" {
		opts = append(opts, nats.UserCredentials(s.Creds))
	}
	if s.CAFile != "" {
		opts = append(opts, nats.RootCAs(s.CAFile))
	}
	if s.CertFile != "" {
		opts = append(opts, nats.ClientCert(s.CertFile, s.KeyFile))
	}
	return opts, nil
}

// Connect connects to s.URL with s and extra options; the error names the
// URL and what to check.
func Connect(s Settings, extra ...nats.Option) (*nats.Conn, error) {
	opts, err := s.Options()
	if err != nil {
		return nil, err
	}
	nc, err := nats.Connect(s.URL, append(opts, extra...)...)
	if err != nil {
		hint := "is the server running?"
		switch {
		case errors.Is(err, nats.ErrAuthorization), errors.Is(err, nats.ErrAuthExpired):
			hint = "check the credentials file"
		case errors.Is(err, nats.ErrSecureConnRequired):
			hint = "the server requires TLS: use a tls:// URL and the CA file of its certificate"
		}
		return nil, fmt.Errorf("connect to NATS at %s: %w (%s)", s.URL, err, hint)
	}
	return nc, nil
}
