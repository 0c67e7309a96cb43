package email

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/textproto"
	"os"
	"strings"
	"time"

	gomail "github.com/wneessen/go-mail"
)

// checkTimeout bounds Check's session with the SMTP server.
const checkTimeout = 15 * time.Second

// Check checks cfg against its SMTP server, as approver-bot check does:
// it connects, upgrades to TLS as cfg says (verifying the certificate), and
// logs in with the password from the environment when cfg names a user; no
// mail is sent. It returns what it checked, a line each, or an error that
// says what failed and what to do. It needs no NATS and no link secret (New
// checks those).
func Check(ctx context.Context, cfg Config) ([]string, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	smtp := cfg.SMTP
	host := strings.Trim(smtp.Host, "[]")
	tc := &tls.Config{ServerName: host, MinVersion: tls.VersionTLS12}
	if smtp.CAFile != "" {
		pool, err := caPool(smtp.CAFile)
		if err != nil {
			return nil, err
		}
		tc.RootCAs = pool
	}
	login, password := "", ""
	if smtp.Username != "" {
		password = os.Getenv(smtp.PasswordEnv)
		if password == "" {
			return nil, fmt.Errorf("smtp.username is set but environment variable %s is empty: set it to the SMTP password, or remove smtp.username for a server without authentication", smtp.PasswordEnv)
		}
		login = ", logged in as " + smtp.Username
	}
	opts := clientOptions(smtp, tc, checkTimeout, password)
	c, err := gomail.NewClient(host, opts...)
	if err != nil {
		return nil, fmt.Errorf("smtp client: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, checkTimeout)
	defer cancel()
	addr := fmt.Sprintf("%s:%d", smtp.Host, smtp.Port)
	if err := c.DialWithContext(ctx); err != nil {
		return nil, fmt.Errorf("smtp %s: %w%s", addr, err, checkHint(err, smtp))
	}
	_ = c.Close()
	how := map[string]string{TLSStartTLS: "STARTTLS", TLSImplicit: "TLS", TLSNone: "no TLS"}[smtp.TLS]
	return []string{fmt.Sprintf("smtp %s: connected with %s%s", addr, how, login)}, nil
}

// checkHint says what to do about an error of Check.
func checkHint(err error, smtp SMTPConfig) string {
	var cert *tls.CertificateVerificationError
	var proto *textproto.Error
	switch {
	case errors.As(err, &cert):
		return " (the server's certificate is not trusted: set smtp.ca_file to its CA, or check smtp.host matches the certificate)"
	case errors.As(err, &proto) && proto.Code == 535: // authentication credentials invalid
		return fmt.Sprintf(" (the server refused the login: check smtp.username and the password in %s)", smtp.PasswordEnv)
	case errors.Is(err, context.DeadlineExceeded):
		return " (no answer: check smtp.host, smtp.port and the firewall)"
	}
	return ""
}
