package mcpgateway_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/assent-dev/assent/internal/broker"
	"github.com/assent-dev/assent/internal/brokertest"
	"github.com/assent-dev/assent/internal/envflag"
	"github.com/assent-dev/assent/internal/httptls"
	"github.com/assent-dev/assent/internal/mcpgateway"
	"github.com/assent-dev/assent/internal/testcerts"
	"github.com/assent-dev/assent/internal/testenv"
)

// serveGateway runs "mcp-gateway args..." (Execute) until the test ends and
// returns the endpoint it says it serves.
func serveGateway(t *testing.T, args ...string) string {
	t.Helper()
	var stderr bytes.Buffer
	cmd, err := mcpgateway.ParseArgs(args, envflag.Env{}, &stderr)
	if err != nil {
		t.Fatalf("%v\n%s", err, &stderr)
	}
	pr, pw := io.Pipe()
	ctx, cancel := context.WithCancel(context.Background())
	ran := testenv.Go(t, func() error {
		defer pw.Close()
		return cmd.Execute(ctx, testenv.Logger(t), nil, io.Discard, pw)
	})
	// The first line says where it serves; the rest is read until it ends.
	first := make(chan string, 1)
	testenv.Go(t, func() error {
		sc := bufio.NewScanner(pr)
		line := ""
		if sc.Scan() {
			line = sc.Text()
		}
		first <- line
		_, err := io.Copy(io.Discard, pr)
		return err
	})
	t.Cleanup(func() {
		cancel()
		if err := testenv.Await(t, ran, patience, "Execute"); err != nil {
			t.Errorf("Execute: %v", err)
		}
	})
	line := testenv.Await(t, first, patience, "the gateway's first line")
	endpoint, ok := strings.CutPrefix(line, "mcp-gateway: serving MCP over streamable HTTP at ")
	if !ok {
		t.Fatalf("the gateway said %q", line)
	}
	return endpoint
}

// connectWith connects an MCP client to endpoint with the HTTP client of
// files, and lists the tools.
func connectWith(t *testing.T, endpoint string, files httptls.ClientFiles) ([]string, error) {
	t.Helper()
	hc, err := files.Client()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "tls-client", Version: "v0"}, nil).
		Connect(ctx, &mcp.StreamableClientTransport{Endpoint: endpoint, HTTPClient: hc, MaxRetries: -1}, nil)
	if err != nil {
		return nil, err
	}
	defer cs.Close()
	res, err := cs.ListTools(ctx, nil)
	if err != nil {
		return nil, err
	}
	var names []string
	for _, tool := range res.Tools {
		names = append(names, tool.Name)
	}
	slices.Sort(names)
	return names, nil
}

// TestServeHTTPS: with --tls-cert and --tls-key the gateway serves MCP over
// HTTPS only, to clients that trust its CA; with --tls-client-ca only to
// those presenting a certificate the CA signed. Plain HTTP, a client that
// does not trust the CA, and (mutual) one without a certificate or with
// another CA's, get no session.
func TestServeHTTPS(t *testing.T) {
	ns := testenv.Server(t)
	brokertest.Run(t, testenv.Conn(t, ns), broker.Config{Name: "tls"})
	_, upstream := newNotes(t)
	set := testcerts.New(t)
	otherCert, otherKey := testcerts.Other(t)
	good := httptls.ClientFiles{CAFile: set.CAFile, CertFile: set.ClientCertFile, KeyFile: set.ClientKey}
	for _, mutual := range []bool{false, true} {
		t.Run(map[bool]string{false: "tls", true: "mutual"}[mutual], func(t *testing.T) {
			args := []string{"--nats-url", ns.ClientURL(), "--http", "127.0.0.1:0", "--tls-cert", set.ServerCertFile, "--tls-key", set.ServerKey}
			if mutual {
				args = append(args, "--tls-client-ca", set.CAFile)
			}
			endpoint := serveGateway(t, append(args, upstream)...)
			if !strings.HasPrefix(endpoint, "https://127.0.0.1:") {
				t.Fatalf("serving at %s, want https", endpoint)
			}
			if tools, err := connectWith(t, endpoint, good); err != nil || !slices.Equal(tools, []string{"delete_file", "list_files"}) {
				t.Fatalf("a client with the CA and a certificate: %v, %v", tools, err)
			}
			for _, tt := range []struct {
				name  string
				files httptls.ClientFiles
				ok    bool
			}{
				{"the CA, no certificate", httptls.ClientFiles{CAFile: set.CAFile}, !mutual},
				{"a certificate another CA signed", httptls.ClientFiles{CAFile: set.CAFile, CertFile: otherCert, KeyFile: otherKey}, !mutual},
				{"no CA", httptls.ClientFiles{}, false},
			} {
				if _, err := connectWith(t, endpoint, tt.files); (err == nil) != tt.ok {
					t.Errorf("%s: %v, want served %v", tt.name, err, tt.ok)
				}
			}
			plain := strings.Replace(endpoint, "https://", "http://", 1)
			if resp, err := http.Post(plain, "application/json", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"ping"}`)); err == nil {
				resp.Body.Close()
				if resp.StatusCode != http.StatusBadRequest {
					t.Errorf("plain HTTP: %s, want a refusal", resp.Status)
				}
			}
		})
	}
}

// TestTLSSettings: the TLS files come from the configuration file's tls
// section or the flags (which win); a certificate without its key, TLS
// without --http, or a file that is not there are refused, naming the
// setting. check reports the certificate.
func TestTLSSettings(t *testing.T) {
	set := testcerts.New(t)
	dir := t.TempDir()
	file := filepath.Join(dir, "gw.yaml")
	conf := "upstreams: [{name: fs, command: /usr/bin/true}]\ntls:\n  cert_file: " + set.ServerCertFile + "\n  key_file: " + set.ServerKey + "\n  client_ca_file: " + set.CAFile + "\n"
	if err := os.WriteFile(file, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := mcpgateway.ParseArgs([]string{"--config", file, "--http", "127.0.0.1:0"}, envflag.Env{}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if want := (mcpgateway.TLS{CertFile: set.ServerCertFile, KeyFile: set.ServerKey, ClientCAFile: set.CAFile}); c.Config.TLS != want {
		t.Errorf("from the file: %+v", c.Config.TLS)
	}
	c, err = mcpgateway.ParseArgs([]string{"--config", file, "--http", "127.0.0.1:0", "--tls-client-ca", ""}, envflag.Map(map[string]string{"ASSENT_TLS_KEY": set.ServerKey}), &bytes.Buffer{})
	if err != nil || c.Config.TLS.ClientCAFile != "" {
		t.Errorf("--tls-client-ca= over the file: %+v, %v", c.Config.TLS, err)
	}
	missing := filepath.Join(dir, "missing.pem")
	for _, tt := range []struct {
		name string
		args []string
		want string
	}{
		{"a certificate without its key", []string{"--http", "127.0.0.1:0", "--tls-cert", set.ServerCertFile, "x"}, "tls.cert_file: without tls.key_file (--tls-key): give both"},
		{"a key without its certificate", []string{"--http", "127.0.0.1:0", "--tls-key", set.ServerKey, "x"}, "tls.key_file: without tls.cert_file (--tls-cert)"},
		{"a client CA alone", []string{"--http", "127.0.0.1:0", "--tls-client-ca", set.CAFile, "x"}, "tls.client_ca_file: asks HTTPS clients for a certificate"},
		{"TLS without --http", []string{"--tls-cert", set.ServerCertFile, "--tls-key", set.ServerKey, "x"}, "serves --http over HTTPS, but --http is not given"},
		{"a missing file", []string{"--http", "127.0.0.1:0", "--tls-cert", missing, "--tls-key", set.ServerKey, "x"}, "tls.cert_file: stat " + missing},
		{"in the file", []string{"--config", file, "--http", "127.0.0.1:0", "--tls-key", ""}, "gw.yaml:3: tls.cert_file: without tls.key_file"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var stderr bytes.Buffer
			_, err := mcpgateway.ParseArgs(tt.args, envflag.Env{}, &stderr)
			if !errors.Is(err, mcpgateway.ErrUsage) || !strings.Contains(stderr.String(), tt.want) {
				t.Errorf("%v, want %q in:\n%s", err, tt.want, &stderr)
			}
		})
	}

	// check loads the files, as serve would.
	ns := testenv.Server(t)
	brokertest.Run(t, testenv.Conn(t, ns), broker.Config{Name: "check"})
	_, upstream := newNotes(t)
	for _, tt := range []struct {
		key, want string
	}{
		{set.ServerKey, "tls: certificate CN=assent test server, valid until "},
		{set.ClientKey, "private key does not match public key"},
	} {
		cmd, err := mcpgateway.ParseArgs([]string{"check", "--nats-url", ns.ClientURL(), "--http", "127.0.0.1:0", "--tls-cert", set.ServerCertFile, "--tls-key", tt.key, upstream}, envflag.Env{}, &bytes.Buffer{})
		if err != nil {
			t.Fatal(err)
		}
		var out bytes.Buffer
		err = cmd.Execute(t.Context(), testenv.Logger(t), nil, &out, io.Discard)
		got := out.String()
		if err != nil {
			got += err.Error()
		}
		if !strings.Contains(got, tt.want) {
			t.Errorf("check with key %s: %s; want %q", tt.key, got, tt.want)
		}
	}
}
