// Package smtptest is a real SMTP server for tests (STARTTLS on a
// certificate made for the test, AUTH PLAIN required, messages kept in
// memory; or, from StartPlain, neither, as a development mail catcher is),
// with a reader for the approval mails the email channel sends.
package smtptest

import (
	"context"
	"crypto/tls"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/emersion/go-sasl"
	"github.com/emersion/go-smtp"

	"github.com/assent-dev/assent/internal/testcerts"
)

// The account the server accepts.
const (
	User     = "assent-bot"
	Password = "correct horse battery staple"
)

// Delivery is one message the test SMTP server accepted.
type Delivery struct {
	From string
	To   []string
	Data []byte
	// TLS and Auth say whether the session was encrypted and authenticated
	// when the message was submitted.
	TLS, Auth bool
	// At is when the server took the message.
	At time.Time
}

// Server is a real SMTP server for tests: STARTTLS with a certificate
// made for the test, AUTH PLAIN required, messages kept in memory.
type Server struct {
	Addr   string
	Host   string
	Port   int
	CAFile string

	// open takes mail without authentication (StartPlain).
	open bool

	mu        sync.Mutex
	delivered []Delivery
	changed   chan struct{}
	// failRcpt, if set, refuses RCPT TO for these addresses with a
	// temporary error, once each.
	failRcpt map[string]bool
	failures int // RCPT TO refused by FailOnce
	authFail int // failed logins
}

// Start starts an SMTP server on a free loopback port and stops it
// when the test ends.
func Start(t testing.TB) *Server {
	t.Helper()
	certs := testcerts.New(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{Addr: l.Addr().String(), Host: "127.0.0.1", Port: l.Addr().(*net.TCPAddr).Port, CAFile: certs.CAFile, changed: make(chan struct{}, 1)}
	srv := smtp.NewServer(smtp.BackendFunc(func(c *smtp.Conn) (smtp.Session, error) { return &session{s: s, c: c}, nil }))
	srv.TLSConfig = &tls.Config{Certificates: []tls.Certificate{certs.Server}, MinVersion: tls.VersionTLS12}
	srv.AllowInsecureAuth = false // AUTH only after STARTTLS
	s.serve(t, srv, l)
	return s
}

// StartPlain starts an SMTP server as development mail catchers (Mailpit,
// MailHog) are: no TLS, no authentication, every message taken. It listens
// on a free port of host and stops when the test ends.
func StartPlain(t testing.TB, host string) *Server {
	t.Helper()
	l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{Addr: l.Addr().String(), Host: host, Port: l.Addr().(*net.TCPAddr).Port, open: true, changed: make(chan struct{}, 1)}
	srv := smtp.NewServer(smtp.BackendFunc(func(c *smtp.Conn) (smtp.Session, error) { return &session{s: s, c: c}, nil }))
	s.serve(t, srv, l)
	return s
}

// serve runs srv on l until the test ends.
func (s *Server) serve(t testing.TB, srv *smtp.Server, l net.Listener) {
	t.Helper()
	srv.Domain = "localhost"
	srv.ReadTimeout, srv.WriteTimeout = 10*time.Second, 10*time.Second
	srv.MaxMessageBytes = 1 << 20
	done := make(chan error, 1)
	go func() { done <- srv.Serve(l) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			_ = srv.Close()
		}
		if err := <-done; err != nil {
			t.Errorf("smtp server: %v", err)
		}
	})
}

// session is one SMTP session of the test server.
type session struct {
	s    *Server
	c    *smtp.Conn
	auth bool
	from string
	to   []string
}

func (s *session) AuthMechanisms() []string { return []string{sasl.Plain} }

func (s *session) Auth(mech string) (sasl.Server, error) {
	if mech != sasl.Plain {
		return nil, smtp.ErrAuthUnknownMechanism
	}
	return sasl.NewPlainServer(func(identity, username, password string) error {
		if username != User || password != Password {
			s.s.mu.Lock()
			s.s.authFail++
			s.s.mu.Unlock()
			return smtp.ErrAuthFailed
		}
		s.auth = true
		return nil
	}), nil
}

func (s *session) Mail(from string, _ *smtp.MailOptions) error {
	if !s.auth && !s.s.open {
		return smtp.ErrAuthRequired
	}
	s.from = from
	return nil
}

func (s *session) Rcpt(to string, _ *smtp.RcptOptions) error {
	if !s.auth && !s.s.open {
		return smtp.ErrAuthRequired
	}
	s.s.mu.Lock()
	defer s.s.mu.Unlock()
	if s.s.failRcpt[strings.ToLower(to)] {
		delete(s.s.failRcpt, strings.ToLower(to))
		s.s.failures++
		return &smtp.SMTPError{Code: 451, EnhancedCode: smtp.EnhancedCode{4, 3, 0}, Message: "try again later"}
	}
	s.to = append(s.to, to)
	return nil
}

func (s *session) Data(r io.Reader) error {
	if !s.auth && !s.s.open {
		return smtp.ErrAuthRequired
	}
	b, err := io.ReadAll(r)
	if err != nil {
		return err
	}
	_, isTLS := s.c.TLSConnectionState()
	s.s.mu.Lock()
	s.s.delivered = append(s.s.delivered, Delivery{From: s.from, To: s.to, Data: b, TLS: isTLS, Auth: s.auth, At: time.Now()})
	s.s.mu.Unlock()
	select {
	case s.s.changed <- struct{}{}:
	default:
	}
	return nil
}

func (s *session) Reset() { s.from, s.to = "", nil }

func (s *session) Logout() error { return nil }

// FailOnce makes the server refuse the next RCPT TO for addr, temporarily.
func (s *Server) FailOnce(addr string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.failRcpt == nil {
		s.failRcpt = map[string]bool{}
	}
	s.failRcpt[strings.ToLower(addr)] = true
}

// Matching returns the deliveries match accepts.
func (s *Server) Matching(match func(Delivery) bool) []Delivery {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Delivery
	for _, d := range s.delivered {
		if match(d) {
			out = append(out, d)
		}
	}
	return out
}

// Wait waits until match accepts n deliveries and returns them, failing
// after 20s.
func (s *Server) Wait(t testing.TB, what string, n int, match func(Delivery) bool) []Delivery {
	t.Helper()
	deadline := time.After(20 * time.Second)
	for {
		if got := s.Matching(match); len(got) >= n {
			return got
		}
		select {
		case <-s.changed:
		case <-time.After(50 * time.Millisecond):
		case <-deadline:
			t.Fatalf("%s: %d mails after 20s, want %d", what, len(s.Matching(match)), n)
		}
	}
}

// Refusals returns how many RCPT TO the server refused (FailOnce) and how
// many logins failed.
func (s *Server) Refusals() (rcpt, auth int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.failures, s.authFail
}

// ExternalIP returns an IPv4 address of this machine that is not on
// loopback, or skips the test.
func ExternalIP(t testing.TB) string {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Skipf("no interface addresses: %v", err)
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && !n.IP.IsLoopback() && !n.IP.IsLinkLocalUnicast() {
			return n.IP.String()
		}
	}
	t.Skip("no IPv4 address but loopback")
	return ""
}
