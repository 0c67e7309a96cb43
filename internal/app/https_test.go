package app_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/assent-dev/assent/internal/app"
	"github.com/assent-dev/assent/internal/envflag"
	"github.com/assent-dev/assent/internal/httptls"
	"github.com/assent-dev/assent/internal/testcerts"
	"github.com/assent-dev/assent/internal/testenv"
)

// tlsClient is an HTTP client with files (httptls.ClientFiles.Client).
func tlsClient(t *testing.T, files httptls.ClientFiles) *http.Client {
	t.Helper()
	c, err := files.Client()
	if err != nil {
		t.Fatal(err)
	}
	return &http.Client{Transport: c.Transport, Timeout: patience}
}

// call makes one request with c and returns its status and body, or the
// error of a refused connection.
func call(t *testing.T, c *http.Client, method, url, body string) (int, []byte, error) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(t.Context(), method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	return resp.StatusCode, out, err
}

// TestHTTPS: with --tls-cert and --tls-key the API, the web UI and the
// metrics are served over HTTPS at an https:// address, and the broker's
// client commands reach it with --ca; plain HTTP on the same port, and a
// client that does not trust the certificate's CA, get nothing of the API.
func TestHTTPS(t *testing.T) {
	set := testcerts.New(t)
	addrs := runApp(t, app.Options{NATSListen: "127.0.0.1:0", DataDir: t.TempDir(), HTTPListen: "127.0.0.1:0",
		TLS: httptls.Files{CertFile: set.ServerCertFile, KeyFile: set.ServerKey}})
	if !strings.HasPrefix(addrs.HTTP, "https://") || addrs.Metrics != addrs.HTTP {
		t.Fatalf("addresses %+v: want https:// for the API and its metrics", addrs)
	}
	hostPort := strings.TrimPrefix(addrs.HTTP, "https://")
	c := tlsClient(t, httptls.ClientFiles{CAFile: set.CAFile})

	status, body, err := call(t, c, http.MethodPost, addrs.HTTP+"/v1/approvals", `{"agent":"secure","tool":"delete_file","args":{"path":"a"}}`)
	if err != nil || status != http.StatusCreated {
		t.Fatalf("POST /v1/approvals over HTTPS: %d %s %v", status, body, err)
	}
	var created struct{ ID string }
	if err := json.Unmarshal(body, &created); err != nil || created.ID == "" {
		t.Fatalf("created: %s", body)
	}
	if status, body, err := call(t, c, http.MethodGet, addrs.HTTP+"/", ""); err != nil || status != http.StatusOK || !bytes.Contains(body, []byte("delete_file")) {
		t.Errorf("the web UI over HTTPS: %d %v\n%.300s", status, err, body)
	}
	if status, body, err := call(t, c, http.MethodGet, addrs.HTTP+"/metrics", ""); err != nil || status != http.StatusOK || !bytes.Contains(body, []byte("assent_requests_total 1")) {
		t.Errorf("GET /metrics over HTTPS: %d %v\n%.300s", status, err, body)
	}

	// Plain HTTP on the TLS port: refused, saying so; nothing of the API.
	if status, body, err := call(t, &http.Client{Timeout: patience}, http.MethodGet, "http://"+hostPort+"/v1/approvals", ""); err == nil &&
		(status != http.StatusBadRequest || !bytes.Contains(body, []byte("HTTPS"))) {
		t.Errorf("plain HTTP on the HTTPS port: %d %s", status, body)
	}
	// A client that does not trust the CA.
	if _, _, err := call(t, &http.Client{Timeout: patience}, http.MethodGet, addrs.HTTP+"/readyz", ""); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Errorf("a client without the CA: %v, want a certificate error", err)
	}

	// The client commands: an https URL, or the address with --ca.
	for _, args := range [][]string{
		{"health", "--http", hostPort, "--ca", set.CAFile},
		{"health", "--http", addrs.HTTP, "--ca", set.CAFile, "--path", "/healthz"},
		{"remembered", "--http", hostPort, "--ca", set.CAFile},
		{"audit", "--http", addrs.HTTP, "--ca", set.CAFile, "--request", created.ID},
		{"cancel", "--agent", "secure", "--http", hostPort, "--ca", set.CAFile},
	} {
		if code, out, errOut := run(t, args...); code != app.ExitOK || errOut != "" {
			t.Errorf("broker %s: exit %d\n%s%s", strings.Join(args, " "), code, out, errOut)
		}
	}
	if code, out, _ := run(t, "health", "--http", hostPort, "--ca", set.CAFile); !strings.HasPrefix(out, addrs.HTTP+"/readyz: 200 OK") || code != app.ExitOK {
		t.Errorf("broker health: %q", out)
	}
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"health", "--http", hostPort}, "400 Bad Request: Client sent an HTTP request to an HTTPS server"},
		{[]string{"health", "--http", addrs.HTTP}, "certificate signed by unknown authority"},
		{[]string{"remembered", "--http", addrs.HTTP}, "certificate signed by unknown authority"},
		{[]string{"remembered", "--http", addrs.HTTP, "--ca", set.ServerKey}, "--ca " + set.ServerKey + ": no PEM certificate"},
	} {
		if code, _, errOut := run(t, tt.args...); code != app.ExitFailed || !strings.Contains(errOut, tt.want) {
			t.Errorf("broker %s: exit %d, %q; want %d and %q", strings.Join(tt.args, " "), code, errOut, app.ExitFailed, tt.want)
		}
	}
}

// TestMutualTLS: with --tls-client-ca, a client without a certificate, and
// one whose certificate another CA signed, are refused at the handshake;
// one with a certificate the CA signed is served the API and the web UI,
// and the client commands present theirs with --cert and --key.
func TestMutualTLS(t *testing.T) {
	set := testcerts.New(t)
	addrs := runApp(t, app.Options{NATSListen: "127.0.0.1:0", DataDir: t.TempDir(), HTTPListen: "127.0.0.1:0",
		TLS: httptls.Files{CertFile: set.ServerCertFile, KeyFile: set.ServerKey, ClientCAFile: set.CAFile}})
	hostPort := strings.TrimPrefix(addrs.HTTP, "https://")
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
		c := tlsClient(t, tt.files)
		for _, path := range []string{"/readyz", "/v1/approvals", "/", "/metrics"} {
			status, body, err := call(t, c, http.MethodGet, addrs.HTTP+path, "")
			if served := err == nil && status == http.StatusOK; served != tt.ok {
				t.Errorf("%s, GET %s: %d %.100s %v; served %v, want %v", tt.name, path, status, body, err, served, tt.ok)
			}
		}
	}
	if code, out, errOut := run(t, "health", "--http", hostPort, "--ca", set.CAFile, "--cert", set.ClientCertFile, "--key", set.ClientKey); code != app.ExitOK {
		t.Errorf("broker health with a client certificate: exit %d\n%s%s", code, out, errOut)
	}
	// The server's alert says why, unless its reset came first.
	if code, _, errOut := run(t, "health", "--http", hostPort, "--ca", set.CAFile); code != app.ExitFailed ||
		!strings.Contains(errOut, "tls: certificate required") && !strings.Contains(errOut, "connection reset by peer") {
		t.Errorf("broker health without a client certificate: exit %d %q", code, errOut)
	}
	if code, _, errOut := run(t, "remembered", "--http", hostPort, "--ca", set.CAFile, "--cert", set.ClientCertFile); code != app.ExitFailed || !strings.Contains(errOut, "--cert without --key") {
		t.Errorf("--cert without --key: exit %d %q", code, errOut)
	}
}

// presented returns the common name of the certificate served at hostPort.
func presented(t *testing.T, hostPort, caFile string) (string, error) {
	t.Helper()
	pool := x509.NewCertPool()
	ca, err := os.ReadFile(caFile)
	if err != nil {
		t.Fatal(err)
	}
	pool.AppendCertsFromPEM(ca)
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: patience}, "tcp", hostPort, &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"})
	if err != nil {
		return "", err
	}
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0].Subject.CommonName, nil
}

// waitPresented waits until the certificate served at hostPort is the one
// called want.
func waitPresented(t *testing.T, hostPort, caFile, want string) {
	t.Helper()
	for deadline := time.Now().Add(patience); ; time.Sleep(50 * time.Millisecond) {
		cn, err := presented(t, hostPort, caFile)
		if err == nil && cn == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the broker presents %q (%v), want %q after %s", cn, err, want, patience)
		}
	}
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

// TestHTTPSRenewal: a certificate renewed in place is served without a
// restart: when its files change, and on SIGHUP (Options.Reload) even if
// the files look unchanged (the same size and time).
func TestHTTPSRenewal(t *testing.T) {
	set := testcerts.New(t)
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	copyFile(t, set.ServerCertFile, certFile)
	copyFile(t, set.ServerKey, keyFile)
	reload := make(chan struct{}, 1)
	addrs := runApp(t, app.Options{NATSListen: "127.0.0.1:0", DataDir: t.TempDir(), HTTPListen: "127.0.0.1:0",
		TLS: httptls.Files{CertFile: certFile, KeyFile: keyFile}, Reload: reload})
	hostPort := strings.TrimPrefix(addrs.HTTP, "https://")
	waitPresented(t, hostPort, set.CAFile, "assent test server")

	renewedCert, renewedKey := set.Renewed(t, "server-2")
	copyFile(t, renewedCert, certFile)
	copyFile(t, renewedKey, keyFile)
	waitPresented(t, hostPort, set.CAFile, "assent test server-2")

	// Files that look as they did: only SIGHUP has them read.
	before := map[string]os.FileInfo{}
	for _, f := range []string{certFile, keyFile} {
		fi, err := os.Stat(f)
		if err != nil {
			t.Fatal(err)
		}
		before[f] = fi
	}
	name := ""
	for _, c := range "abcdefghijklmnopqrstuvwxyz" { // names as long as server-2
		cert, key := set.Renewed(t, "server-"+string(c))
		if fi, _ := os.Stat(cert); fi.Size() == before[certFile].Size() {
			copyFile(t, cert, certFile)
			copyFile(t, key, keyFile)
			name = "assent test server-" + string(c)
			break
		}
	}
	if name == "" {
		t.Fatal("no renewed certificate of the same size")
	}
	for f, fi := range before {
		if now, _ := os.Stat(f); now.Size() != fi.Size() {
			t.Fatalf("%s: %d bytes, was %d", f, now.Size(), fi.Size())
		}
		if err := os.Chtimes(f, fi.ModTime(), fi.ModTime()); err != nil {
			t.Fatal(err)
		}
	}
	reload <- struct{}{}
	waitPresented(t, hostPort, set.CAFile, name)
}

// TestTLSOptions: the TLS and metrics options go together or are refused,
// each refusal naming the flag to add or drop; TLS does not stand in for
// --auth beyond loopback; the flags come from the environment too.
func TestTLSOptions(t *testing.T) {
	base := app.Options{NATSListen: "127.0.0.1:0", DataDir: t.TempDir(), HTTPListen: "127.0.0.1:8080"}
	tests := []struct {
		name string
		edit func(*app.Options)
		want string // in the error; "" for none
	}{
		{"certificate and key", func(o *app.Options) { o.TLS = httptls.Files{CertFile: "c.pem", KeyFile: "k.pem"} }, ""},
		{"mutual", func(o *app.Options) {
			o.TLS = httptls.Files{CertFile: "c.pem", KeyFile: "k.pem", ClientCAFile: "ca.pem"}
		}, ""},
		{"a certificate without its key", func(o *app.Options) { o.TLS.CertFile = "c.pem" }, "--tls-cert without --tls-key: give both"},
		{"a key without its certificate", func(o *app.Options) { o.TLS.KeyFile = "k.pem" }, "--tls-key without --tls-cert: give both"},
		{"a client CA alone", func(o *app.Options) { o.TLS.ClientCAFile = "ca.pem" }, "--tls-client-ca asks HTTPS clients for a certificate: give the broker's own too, --tls-cert FILE and --tls-key FILE"},
		{"TLS with the API off", func(o *app.Options) {
			o.TLS, o.HTTPListen = httptls.Files{CertFile: "c.pem", KeyFile: "k.pem"}, ""
		}, "--http is empty"},
		{"TLS for the metrics alone", func(o *app.Options) {
			o.TLS, o.HTTPListen, o.MetricsListen = httptls.Files{CertFile: "c.pem", KeyFile: "k.pem"}, "", "127.0.0.1:9090"
		}, ""},
		{"a metrics token with nothing serving /metrics", func(o *app.Options) { o.MetricsTokenFile, o.HTTPListen = "t", "" }, "--metrics-token guards GET /metrics, but nothing serves it"},
		{"a bad metrics address", func(o *app.Options) { o.MetricsListen = "9090" }, "metrics listen address"},
		{"the metrics on the API's address", func(o *app.Options) { o.MetricsListen = "127.0.0.1:8080" }, "--metrics-listen 127.0.0.1:8080 is the HTTP API's address"},
		{"TLS beyond loopback without --auth", func(o *app.Options) {
			o.TLS, o.HTTPListen = httptls.Files{CertFile: "c.pem", KeyFile: "k.pem", ClientCAFile: "ca.pem"}, "0.0.0.0:8443"
		}, "serves loopback only (127.0.0.1, ::1, localhost) (TLS, mutual or not, protects the connection; it does not say who answers); add --auth FILE"},
		{"TLS beyond loopback with --auth", func(o *app.Options) {
			o.TLS, o.HTTPListen, o.AuthFile = httptls.Files{CertFile: "c.pem", KeyFile: "k.pem"}, "0.0.0.0:8443", "auth.yaml"
		}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := base
			tt.edit(&o)
			err := o.Validate()
			if tt.want == "" && err != nil || tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)) {
				t.Errorf("%v, want %q", err, tt.want)
			}
		})
	}

	s, err := app.ParseServe(nil, envflag.Map(map[string]string{"ASSENT_TLS_CERT": "/tls/tls.crt", "ASSENT_TLS_KEY": "/tls/tls.key", "ASSENT_TLS_CLIENT_CA": "/tls/clients.pem",
		"ASSENT_METRICS_TOKEN": "/run/secrets/metrics-token", "ASSENT_METRICS_LISTEN": "127.0.0.1:9090"}), &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	want := httptls.Files{CertFile: "/tls/tls.crt", KeyFile: "/tls/tls.key", ClientCAFile: "/tls/clients.pem"}
	if o := s.Options; o.TLS != want || o.MetricsTokenFile != "/run/secrets/metrics-token" || o.MetricsListen != "127.0.0.1:9090" {
		t.Errorf("from the environment: %+v %q %q", o.TLS, o.MetricsTokenFile, o.MetricsListen)
	}
	if _, err := app.ParseServe([]string{"--tls-cert", "c.pem"}, envflag.Env{}, &bytes.Buffer{}); err != nil {
		t.Errorf("ParseServe leaves the pairing to Validate: %v", err)
	}
}

// TestTLSFilesAtStart: a certificate that cannot serve stops the process
// at start, naming the file, what is wrong and the flags.
func TestTLSFilesAtStart(t *testing.T) {
	set := testcerts.New(t)
	missing := filepath.Join(t.TempDir(), "missing.pem")
	for _, tt := range []struct {
		name  string
		files httptls.Files
		want  []string
	}{
		{"a missing certificate", httptls.Files{CertFile: missing, KeyFile: set.ServerKey}, []string{missing, "no such file", "--tls-cert"}},
		{"another certificate's key", httptls.Files{CertFile: set.ServerCertFile, KeyFile: set.ClientKey}, []string{set.ServerCertFile, "private key does not match public key"}},
		{"a client's certificate", httptls.Files{CertFile: set.ClientCertFile, KeyFile: set.ClientKey}, []string{"not for servers"}},
		{"a missing client CA", httptls.Files{CertFile: set.ServerCertFile, KeyFile: set.ServerKey, ClientCAFile: missing}, []string{"client CA file", missing}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), patience)
			defer cancel()
			err := app.Run(ctx, app.Options{NATSListen: "127.0.0.1:0", DataDir: t.TempDir(), HTTPListen: "127.0.0.1:0", TLS: tt.files}, testenv.Logger(t))
			if err == nil {
				t.Fatal("started")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%v: want %q in it", err, w)
				}
			}
			if errors.Is(err, context.DeadlineExceeded) {
				t.Error("ran until the deadline")
			}
		})
	}
}
