package httptls

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
)

// ClientFiles are an HTTP client's TLS files, PEM encoded, for a server
// served over TLS (a broker or a gateway given --tls-cert).
type ClientFiles struct {
	// CAFile is the CA that signed the server's certificate, when the
	// system does not trust it.
	CAFile string
	// CertFile and KeyFile are the client's certificate and key, for a
	// server that asks for one (--tls-client-ca: mutual TLS).
	CertFile, KeyFile string
}

// On reports whether any of f is set.
func (f ClientFiles) On() bool { return f.CAFile != "" || f.CertFile != "" || f.KeyFile != "" }

// ClientFlags defines the client's TLS flags on fs, filling f: --ca,
// --cert and --key, named alike in every command that calls a server of
// Assent's over HTTP.
func ClientFlags(fs *flag.FlagSet, f *ClientFiles) {
	fs.StringVar(&f.CAFile, "ca", "", "the CA `file` of the server's TLS certificate (https), if the system does not trust it")
	fs.StringVar(&f.CertFile, "cert", "", "a client certificate `file`, for a server that asks for one (its --tls-client-ca: mutual TLS)")
	fs.StringVar(&f.KeyFile, "key", "", "the client certificate's key `file`")
}

// Client returns an HTTP client that trusts f.CAFile (besides the system's
// CAs, if it is not set) and presents f's certificate; http.DefaultClient
// when f is empty. Its error names the flag (ClientFlags) whose file is
// wrong.
func (f ClientFiles) Client() (*http.Client, error) {
	if !f.On() {
		return http.DefaultClient, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if f.CAFile != "" {
		data, err := os.ReadFile(f.CAFile)
		if err != nil {
			return nil, fmt.Errorf("--ca: %w", err)
		}
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM(data) {
			return nil, fmt.Errorf("--ca %s: no PEM certificate in it: give the certificate of the CA that signed the server's", f.CAFile)
		}
	}
	switch {
	case f.CertFile != "" && f.KeyFile != "":
		cert, err := tls.LoadX509KeyPair(f.CertFile, f.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("--cert %s with --key %s: %w", f.CertFile, f.KeyFile, err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	case f.CertFile != "":
		return nil, errors.New("--cert without --key: give the client certificate's key too")
	case f.KeyFile != "":
		return nil, errors.New("--key without --cert: give the client certificate too")
	}
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.TLSClientConfig = cfg
	// HTTP/1.1 only: a client certificate the server refuses is then
	// reported as such ("tls: certificate required"), not as an HTTP/2
	// connection that could not be established.
	t.ForceAttemptHTTP2, t.TLSNextProto = false, map[string]func(string, *tls.Conn) http.RoundTripper{}
	return &http.Client{Transport: t}, nil
}
