package httptls_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/assent-dev/assent/internal/httptls"
	"github.com/assent-dev/assent/internal/testcerts"
	"github.com/assent-dev/assent/internal/testenv"
)

// patience bounds every wait: only a hang misses it.
const patience = 30 * time.Second

// serve serves "hello" over TLS with certs until the test ends, and
// returns its address.
func serve(t *testing.T, certs *httptls.Certs) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{TLSConfig: certs.Config(), ReadHeaderTimeout: patience, Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "hello")
	})}
	done := make(chan error, 1)
	go func() { done <- srv.ServeTLS(ln, "", "") }()
	t.Cleanup(func() {
		_ = srv.Close()
		if err := <-done; !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("ServeTLS: %v", err)
		}
	})
	return ln.Addr().String()
}

// get GETs url with the client that files make.
func get(t *testing.T, files httptls.ClientFiles, url string) (string, error) {
	t.Helper()
	c, err := files.Client()
	if err != nil {
		t.Fatal(err)
	}
	c.Timeout = patience
	resp, err := c.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.Status + " " + string(body), err
}

// TestServe: a client that trusts the CA is served over TLS 1.2 or later;
// one that does not trust it, one that offers TLS 1.1 at most, and one
// that speaks plain HTTP are not.
func TestServe(t *testing.T) {
	set := testcerts.New(t)
	certs, err := httptls.Load(httptls.Files{CertFile: set.ServerCertFile, KeyFile: set.ServerKey}, testenv.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	addr := serve(t, certs)
	if got, err := get(t, httptls.ClientFiles{CAFile: set.CAFile}, "https://"+addr+"/"); err != nil || got != "200 OK hello" {
		t.Fatalf("a client trusting the CA: %q, %v", got, err)
	}
	if got, err := get(t, httptls.ClientFiles{}, "https://"+addr+"/"); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Errorf("a client not trusting the CA: %q, %v; want a certificate error", got, err)
	}
	// Without TLS the server answers nothing of the handler's.
	if got, err := get(t, httptls.ClientFiles{}, "http://"+addr+"/"); err == nil && !strings.HasPrefix(got, "400 ") {
		t.Errorf("plain HTTP on the TLS port: %q, want a refusal", got)
	}
	pool := x509.NewCertPool()
	ca, _ := os.ReadFile(set.CAFile)
	pool.AppendCertsFromPEM(ca)
	old, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: pool, MaxVersion: tls.VersionTLS11})
	if err == nil {
		old.Close()
		t.Error("a TLS 1.1 client was served")
	}
}

// TestMutual: with a client CA, the handshake fails for a client without a
// certificate and for one whose certificate another CA signed; a client
// with a certificate the CA signed is served.
func TestMutual(t *testing.T) {
	set := testcerts.New(t)
	certs, err := httptls.Load(httptls.Files{CertFile: set.ServerCertFile, KeyFile: set.ServerKey, ClientCAFile: set.CAFile}, testenv.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	url := "https://" + serve(t, certs) + "/"
	otherCert, otherKey := testcerts.Other(t)
	for _, tt := range []struct {
		name  string
		files httptls.ClientFiles
		ok    bool
	}{
		{"a certificate the CA signed", httptls.ClientFiles{CAFile: set.CAFile, CertFile: set.ClientCertFile, KeyFile: set.ClientKey}, true},
		{"no certificate", httptls.ClientFiles{CAFile: set.CAFile}, false},
		{"a certificate another CA signed", httptls.ClientFiles{CAFile: set.CAFile, CertFile: otherCert, KeyFile: otherKey}, false},
	} {
		got, err := get(t, tt.files, url)
		if ok := err == nil && got == "200 OK hello"; ok != tt.ok {
			t.Errorf("%s: %q, %v; served %v, want %v", tt.name, got, err, ok, tt.ok)
		}
	}
}

// presented returns the common name of the certificate the server at addr
// presents.
func presented(t *testing.T, addr, caFile string) (string, error) {
	t.Helper()
	pool := x509.NewCertPool()
	ca, err := os.ReadFile(caFile)
	if err != nil {
		t.Fatal(err)
	}
	pool.AppendCertsFromPEM(ca)
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: patience}, "tcp", addr, &tls.Config{RootCAs: pool, ServerName: "localhost"})
	if err != nil {
		return "", err
	}
	defer c.Close()
	return c.ConnectionState().PeerCertificates[0].Subject.CommonName, nil
}

// copyFile writes src's content over dst, as a renewal does.
func copyFile(t *testing.T, src, dst string) {
	t.Helper()
	data, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestRenewal: Run serves a certificate renewed in place from the next
// handshake after it notices, without a restart; a change that does not
// load (a key that is not the certificate's) is refused and the
// certificate in force kept, until the files are right again. Reload reads
// them at once.
func TestRenewal(t *testing.T) {
	set := testcerts.New(t)
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	copyFile(t, set.ServerCertFile, certFile)
	copyFile(t, set.ServerKey, keyFile)
	certs, err := httptls.Load(httptls.Files{CertFile: certFile, KeyFile: keyFile}, testenv.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	testenv.Go(t, func() error { return certs.Run(t.Context()) })
	addr := serve(t, certs)
	if cn, err := presented(t, addr, set.CAFile); err != nil || cn != "assent test server" {
		t.Fatalf("first certificate: %q, %v", cn, err)
	}
	wait := func(want string) {
		t.Helper()
		for deadline := time.Now().Add(patience); ; time.Sleep(50 * time.Millisecond) {
			cn, err := presented(t, addr, set.CAFile)
			if err == nil && cn == want {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("the server presents %q (%v), want %q after %s", cn, err, want, patience)
			}
		}
	}
	renewedCert, renewedKey := set.Renewed(t, "server-2")
	copyFile(t, renewedCert, certFile)
	copyFile(t, renewedKey, keyFile)
	wait("assent test server-2")
	if cn := certs.Leaf().Subject.CommonName; cn != "assent test server-2" {
		t.Errorf("Leaf: %s", cn)
	}

	// A key that is not the certificate's: refused, the one in force kept.
	thirdCert, thirdKey := set.Renewed(t, "server-3")
	copyFile(t, thirdCert, certFile)
	copyFile(t, set.ServerKey, keyFile)
	if err := certs.Reload(); err == nil || !strings.Contains(err.Error(), "private key does not match public key") {
		t.Errorf("Reload of a mismatched pair: %v", err)
	}
	time.Sleep(httptls.PollInterval + time.Second) // Run has looked at the files
	if cn, err := presented(t, addr, set.CAFile); err != nil || cn != "assent test server-2" {
		t.Errorf("after a bad renewal: %q, %v; want the previous certificate kept", cn, err)
	}
	copyFile(t, thirdKey, keyFile)
	wait("assent test server-3")
}

// TestLoadErrors: each file that cannot serve is refused at start, saying
// which and why.
func TestLoadErrors(t *testing.T) {
	set := testcerts.New(t)
	dir := t.TempDir()
	missing := filepath.Join(dir, "missing.pem")
	garbage := filepath.Join(dir, "garbage.pem")
	if err := os.WriteFile(garbage, []byte("not a certificate\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	expiredCert, expiredKey := selfSigned(t, dir, time.Now().Add(-time.Hour))
	tests := []struct {
		name  string
		files httptls.Files
		want  []string
	}{
		{"no key", httptls.Files{CertFile: set.ServerCertFile}, []string{"both needed"}},
		{"a missing certificate", httptls.Files{CertFile: missing, KeyFile: set.ServerKey}, []string{"TLS certificate file", missing, "no such file"}},
		{"a missing key", httptls.Files{CertFile: set.ServerCertFile, KeyFile: missing}, []string{"TLS key file", missing}},
		{"another certificate's key", httptls.Files{CertFile: set.ServerCertFile, KeyFile: set.ClientKey}, []string{set.ServerCertFile, set.ClientKey, "private key does not match", "give the PEM certificate"}},
		{"no PEM in the certificate", httptls.Files{CertFile: garbage, KeyFile: set.ServerKey}, []string{garbage, "failed to find any PEM data"}},
		{"a client's certificate", httptls.Files{CertFile: set.ClientCertFile, KeyFile: set.ClientKey}, []string{set.ClientCertFile, "not for servers", "serverAuth"}},
		{"an expired certificate", httptls.Files{CertFile: expiredCert, KeyFile: expiredKey}, []string{expiredCert, "expired at", "renew it"}},
		{"a missing client CA", httptls.Files{CertFile: set.ServerCertFile, KeyFile: set.ServerKey, ClientCAFile: missing}, []string{"client CA file", missing}},
		{"no PEM in the client CA", httptls.Files{CertFile: set.ServerCertFile, KeyFile: set.ServerKey, ClientCAFile: garbage}, []string{garbage, "no PEM certificate"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := httptls.Load(tt.files, nil)
			if err == nil {
				t.Fatal("loaded")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%v: want %q in it", err, w)
				}
			}
		})
	}
}

// selfSigned writes a self-signed server certificate for localhost that
// ends at notAfter, and its key.
func selfSigned(t *testing.T, dir string, notAfter time.Time) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(7), Subject: pkix.Name{CommonName: "expired"}, DNSNames: []string{"localhost"},
		NotBefore: notAfter.Add(-24 * time.Hour), NotAfter: notAfter, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, "expired.pem"), filepath.Join(dir, "expired-key.pem")
	for file, block := range map[string]*pem.Block{certFile: {Type: "CERTIFICATE", Bytes: der}, keyFile: {Type: "EC PRIVATE KEY", Bytes: keyDER}} {
		if err := os.WriteFile(file, pem.EncodeToMemory(block), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return certFile, keyFile
}

// TestClientFilesErrors: a client's TLS flags that cannot work say which.
func TestClientFilesErrors(t *testing.T) {
	set := testcerts.New(t)
	garbage := filepath.Join(t.TempDir(), "garbage.pem")
	if err := os.WriteFile(garbage, []byte("nope"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		files httptls.ClientFiles
		want  string
	}{
		{httptls.ClientFiles{CertFile: set.ClientCertFile}, "--cert without --key"},
		{httptls.ClientFiles{KeyFile: set.ClientKey}, "--key without --cert"},
		{httptls.ClientFiles{CAFile: garbage}, "--ca " + garbage + ": no PEM certificate"},
		{httptls.ClientFiles{CAFile: garbage + ".missing"}, "--ca: open"},
		{httptls.ClientFiles{CertFile: set.ClientCertFile, KeyFile: set.ServerKey}, "private key does not match"},
	} {
		if _, err := tt.files.Client(); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%+v: %v, want %q", tt.files, err, tt.want)
		}
	}
	if c, err := (httptls.ClientFiles{}).Client(); err != nil || c != http.DefaultClient {
		t.Errorf("no files: %v, %v; want http.DefaultClient", c, err)
	}
}
