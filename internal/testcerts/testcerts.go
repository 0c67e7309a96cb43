// Package testcerts makes a certificate authority and certificates signed by
// it for tests of TLS and mutual TLS, written as PEM files in t.TempDir().
package testcerts

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// Set is a CA and a server and a client certificate it signed. The server's
// is for 127.0.0.1, ::1 and localhost.
type Set struct {
	CAFile                    string
	ServerCertFile, ServerKey string
	ClientCertFile, ClientKey string
	Server                    tls.Certificate
	ca                        *x509.Certificate
	caKey                     *ecdsa.PrivateKey
	dir                       string
}

// New makes a Set for t.
func New(t testing.TB) *Set {
	t.Helper()
	s := &Set{dir: t.TempDir()}
	var err error
	if s.caKey, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader); err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "assent test CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &s.caKey.PublicKey, s.caKey)
	if err != nil {
		t.Fatal(err)
	}
	if s.ca, err = x509.ParseCertificate(der); err != nil {
		t.Fatal(err)
	}
	s.CAFile = s.write(t, "ca.pem", "CERTIFICATE", der)
	s.ServerCertFile, s.ServerKey, s.Server = s.issue(t, "server", x509.ExtKeyUsageServerAuth)
	s.ClientCertFile, s.ClientKey, _ = s.issue(t, "client", x509.ExtKeyUsageClientAuth)
	return s
}

// Other makes a client certificate signed by another CA, which a server
// trusting s refuses.
func Other(t testing.TB) (certFile, keyFile string) {
	t.Helper()
	o := New(t)
	return o.ClientCertFile, o.ClientKey
}

// Node makes a certificate for a server that both accepts and makes
// connections (a NATS cluster's route), for 127.0.0.1, ::1 and localhost.
func (s *Set) Node(t testing.TB, name string) (certFile, keyFile string) {
	t.Helper()
	certFile, keyFile, _ = s.issue(t, name, x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth)
	return certFile, keyFile
}

func (s *Set) issue(t testing.TB, name string, usage ...x509.ExtKeyUsage) (certFile, keyFile string, cert tls.Certificate) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: "assent test " + name},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  usage,
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
		DNSNames:     []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, s.ca, &key.PublicKey, s.caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile = s.write(t, name+".pem", "CERTIFICATE", der)
	keyFile = s.write(t, name+"-key.pem", "EC PRIVATE KEY", keyDER)
	cert, err = tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile, cert
}

func (s *Set) write(t testing.TB, name, typ string, der []byte) string {
	t.Helper()
	path := filepath.Join(s.dir, name)
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}
