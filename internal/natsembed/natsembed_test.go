package natsembed_test

import (
	"net"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/assent-dev/assent/internal/natsembed"
	"github.com/assent-dev/assent/internal/testcerts"
)

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  natsembed.Config
		want string // substring of the error; empty means valid
	}{
		{"defaults", natsembed.Config{StoreDir: "x"}, ""},
		{"interval", natsembed.Config{StoreDir: "x", Sync: "2m"}, ""},
		{"no dir", natsembed.Config{}, "StoreDir is required"},
		{"bad sync", natsembed.Config{StoreDir: "x", Sync: "sometimes"}, `sync "sometimes"`},
		{"zero interval", natsembed.Config{StoreDir: "x", Sync: "0s"}, `sync "0s"`},
		{"bad port", natsembed.Config{StoreDir: "x", Port: 70000}, "port 70000"},
		{"all at once", natsembed.Config{Sync: "x", Port: -5}, "StoreDir is required"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate()
			if tc.want == "" {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want it to mention %q", err, tc.want)
			}
		})
	}
	// Every problem is reported at once.
	err := natsembed.Config{Sync: "x", Port: -5}.Validate()
	if n := strings.Count(err.Error(), "\n") + 1; n != 3 {
		t.Fatalf("%d problems reported, want 3: %v", n, err)
	}
}

func TestStartWithJetStream(t *testing.T) {
	s, err := natsembed.Start(natsembed.Config{Port: -1, StoreDir: t.TempDir()}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { s.Shutdown(); s.WaitForShutdown() }()
	nc, err := nats.Connect(s.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if !s.JetStreamEnabled() || s.JetStreamConfig().SyncAlways != true {
		t.Fatalf("JetStream enabled=%v sync always=%v", s.JetStreamEnabled(), s.JetStreamConfig().SyncAlways)
	}
	// A second server on the same port fails with a clear error.
	port := s.Addr().(*net.TCPAddr).Port
	if _, err := natsembed.Start(natsembed.Config{Port: port, StoreDir: t.TempDir(), ReadyTimeout: 2e9}, nil); err == nil {
		t.Fatal("second server on a used port started")
	}
}

// TestTLS: with TLS the server takes TLS clients that trust its CA, and
// refuses plain ones; with a client CA (mutual TLS) it also refuses a client
// without a certificate, or with one another CA signed.
func TestTLS(t *testing.T) {
	certs := testcerts.New(t)
	for _, mutual := range []bool{false, true} {
		t.Run(map[bool]string{false: "tls", true: "mutual"}[mutual], func(t *testing.T) {
			tc := &natsembed.TLS{CertFile: certs.ServerCertFile, KeyFile: certs.ServerKey}
			if mutual {
				tc.ClientCAFile = certs.CAFile
			}
			s, err := natsembed.Start(natsembed.Config{Port: -1, StoreDir: t.TempDir(), TLS: tc}, nil)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
			url := "tls://" + s.Addr().String()
			connect := func(opts ...nats.Option) error {
				nc, err := nats.Connect(url, append(opts, nats.Timeout(5*time.Second))...)
				if err == nil {
					nc.Close()
				}
				return err
			}
			if err := connect(nats.RootCAs(certs.CAFile), nats.ClientCert(certs.ClientCertFile, certs.ClientKey)); err != nil {
				t.Fatalf("a client with the CA and a certificate: %v", err)
			}
			if err := connect(); err == nil {
				t.Fatal("a client that does not trust the server's CA connected")
			}
			if err := connect(nats.RootCAs(certs.CAFile)); (err == nil) == mutual {
				t.Fatalf("a client without a certificate: %v (mutual %v)", err, mutual)
			}
			otherCert, otherKey := testcerts.Other(t)
			if err := connect(nats.RootCAs(certs.CAFile), nats.ClientCert(otherCert, otherKey)); (err == nil) == mutual {
				t.Fatalf("a client whose certificate another CA signed: %v (mutual %v)", err, mutual)
			}
			if nc, err := nats.Connect("nats://"+s.Addr().String(), nats.Timeout(5*time.Second)); err == nil {
				nc.Close()
				t.Fatal("a plain client connected to a TLS server")
			}
		})
	}
	if _, err := natsembed.Start(natsembed.Config{Port: -1, StoreDir: t.TempDir(), TLS: &natsembed.TLS{CertFile: "missing.pem", KeyFile: "missing-key.pem"}}, nil); err == nil || !strings.Contains(err.Error(), "TLS") {
		t.Fatalf("missing certificate: %v", err)
	}
}
