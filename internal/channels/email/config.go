package email

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	netmail "net/mail"
	"net/url"
	"os"
	"regexp"
	"strings"

	"github.com/assent-dev/assent/internal/textsafe"
)

// Defaults of Config.
const (
	DefaultPort          = 587
	DefaultTLSPort       = 465
	DefaultPasswordEnv   = "ASSENT_SMTP_PASSWORD"
	DefaultLinkSecretEnv = "ASSENT_EMAIL_LINK_SECRET"
	DefaultSubjectPrefix = "[Assent]"
	// MinSecretLength is the shortest link secret New accepts, in bytes.
	MinSecretLength = 32
)

// TLS modes of SMTPConfig.TLS.
const (
	// TLSStartTLS connects in plain text and upgrades with STARTTLS, which
	// the server must offer (submission, port 587). The default.
	TLSStartTLS = "starttls"
	// TLSImplicit speaks TLS from the first byte (submissions, port 465).
	TLSImplicit = "tls"
	// TLSNone sends in plain text; allowed only to a server on loopback
	// (a local relay).
	TLSNone = "none"
)

// Config configures the email channel, as the bot's configuration file gives
// it under channels.email.
type Config struct {
	// SMTP is the server mail is submitted to.
	SMTP SMTPConfig `yaml:"smtp"`
	// From is the sender address, required: "assent@example.com" or
	// "Assent <assent@example.com>". Use an address the SMTP server may send
	// as, in a domain whose SPF and DKIM cover that server.
	From string `yaml:"from"`
	// LinkSecretEnv names the environment variable holding the key that
	// signs approval links (HMAC-SHA256), at least 32 bytes. Every bot
	// process must have the same one. Default ASSENT_EMAIL_LINK_SECRET.
	LinkSecretEnv string `yaml:"link_secret_env"`
	// SubjectPrefix starts every subject. Default "[Assent]".
	SubjectPrefix string `yaml:"subject_prefix"`
}

// SMTPConfig is how the channel reaches its SMTP server.
type SMTPConfig struct {
	// Host is the server's name, required. With TLS it must match the
	// server's certificate.
	Host string `yaml:"host"`
	// Port defaults to 587, or 465 when TLS is "tls".
	Port int `yaml:"port"`
	// Username, if set, authenticates with the password from PasswordEnv.
	Username string `yaml:"username"`
	// PasswordEnv names the environment variable holding the SMTP
	// password. Default ASSENT_SMTP_PASSWORD.
	PasswordEnv string `yaml:"password_env"`
	// TLS is "starttls" (the default), "tls" or "none" (loopback only).
	TLS string `yaml:"tls"`
	// CAFile, if set, is a PEM file of certificates to trust besides the
	// system's, for a server with a private certificate authority.
	CAFile string `yaml:"ca_file"`
}

// withDefaults returns c with every unset field at its default.
func (c Config) withDefaults() Config {
	if c.SMTP.TLS == "" {
		c.SMTP.TLS = TLSStartTLS
	}
	if c.SMTP.Port == 0 {
		c.SMTP.Port = DefaultPort
		if c.SMTP.TLS == TLSImplicit {
			c.SMTP.Port = DefaultTLSPort
		}
	}
	if c.SMTP.PasswordEnv == "" {
		c.SMTP.PasswordEnv = DefaultPasswordEnv
	}
	if c.LinkSecretEnv == "" {
		c.LinkSecretEnv = DefaultLinkSecretEnv
	}
	if c.SubjectPrefix == "" {
		c.SubjectPrefix = DefaultSubjectPrefix
	}
	return c
}

var envName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// Validate reports every problem of c at once, defaults applied. It reads
// nothing: New checks the environment variables and the CA file.
func (c Config) Validate() error {
	c = c.withDefaults()
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	switch h := c.SMTP.Host; {
	case h == "":
		bad("smtp.host: required: the SMTP server to submit mail to (smtp.example.com)")
	case strings.ContainsAny(h, " /:@") && net.ParseIP(h) == nil:
		bad("smtp.host %q: want a host name or an IP address, without a port or a scheme (set smtp.port)", textsafe.Line(h))
	}
	if c.SMTP.Port < 1 || c.SMTP.Port > 65535 {
		bad("smtp.port %d: want 1-65535 (587 for STARTTLS, 465 for TLS)", c.SMTP.Port)
	}
	switch c.SMTP.TLS {
	case TLSStartTLS, TLSImplicit:
	case TLSNone:
		if c.SMTP.Host != "" && !loopback(c.SMTP.Host) {
			bad("smtp.tls none: allowed only to a server on loopback (localhost, 127.0.0.1, ::1), not %q; use starttls or tls", textsafe.Line(c.SMTP.Host))
		}
	default:
		bad("smtp.tls %q: want starttls, tls or none", textsafe.Line(c.SMTP.TLS))
	}
	// The values are not repeated: they may be the secrets themselves.
	if !envName.MatchString(c.SMTP.PasswordEnv) {
		bad("smtp.password_env: want the name of an environment variable (ASSENT_SMTP_PASSWORD) that holds the password, not the password")
	}
	if !envName.MatchString(c.LinkSecretEnv) {
		bad("link_secret_env: want the name of an environment variable (ASSENT_EMAIL_LINK_SECRET) that holds the secret, not the secret")
	}
	if c.From == "" {
		bad("from: required: the sender address (Assent <assent@example.com>)")
	} else if _, err := netmail.ParseAddress(c.From); err != nil {
		bad("from %q: not an email address: %v", textsafe.Line(c.From), err)
	}
	if p := c.SubjectPrefix; textsafe.Line(p) != p || len(p) > 64 {
		bad("subject_prefix %q: want one line of at most 64 bytes", textsafe.Line(p))
	}
	return errors.Join(errs...)
}

// loopback reports whether host names this machine.
func loopback(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(strings.Trim(host, "[]"))
	return ip != nil && ip.IsLoopback()
}

// settings is what New derives from a Config and the environment.
type settings struct {
	cfg      Config
	from     *netmail.Address
	domain   string
	secret   []byte
	password string
	tls      *tls.Config
	public   string
}

// load checks cfg (defaults applied) and reads what it points to: the
// environment variables and the CA file. It reports every problem at once.
func load(cfg Config, publicURL string, getenv func(string) string) (settings, error) {
	cfg = cfg.withDefaults()
	s := settings{cfg: cfg}
	var errs []error
	if err := cfg.Validate(); err != nil {
		errs = append(errs, err)
	}
	if from, err := netmail.ParseAddress(cfg.From); err == nil {
		s.from = from
		s.domain = from.Address[strings.LastIndexByte(from.Address, '@')+1:]
	}
	switch secret := getenv(cfg.LinkSecretEnv); {
	case !envName.MatchString(cfg.LinkSecretEnv):
		// Validate said so, without repeating what may be the secret.
	case secret == "":
		errs = append(errs, fmt.Errorf("link secret: environment variable %s is not set: set it to a random secret of at least %d bytes, the same for every bot process (openssl rand -base64 48)", cfg.LinkSecretEnv, MinSecretLength))
	case len(secret) < MinSecretLength:
		errs = append(errs, fmt.Errorf("link secret: %s holds %d bytes, fewer than %d: set it to a longer random secret (openssl rand -base64 48)", cfg.LinkSecretEnv, len(secret), MinSecretLength))
	default:
		s.secret = []byte(secret)
	}
	if cfg.SMTP.Username != "" && envName.MatchString(cfg.SMTP.PasswordEnv) {
		s.password = getenv(cfg.SMTP.PasswordEnv)
		if s.password == "" {
			errs = append(errs, fmt.Errorf("smtp.username is set but environment variable %s is empty: set it to the SMTP password, or remove smtp.username for a server without authentication", cfg.SMTP.PasswordEnv))
		}
	}
	if u, err := url.Parse(publicURL); publicURL == "" || err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
		errs = append(errs, fmt.Errorf("public URL %q: approval links need the bot's public URL (https://assent-bot.example.com): set the bot's public_url", textsafe.Line(publicURL)))
	} else {
		s.public = strings.TrimRight(publicURL, "/")
	}
	s.tls = &tls.Config{ServerName: strings.Trim(cfg.SMTP.Host, "[]"), MinVersion: tls.VersionTLS12}
	if cfg.SMTP.CAFile != "" {
		pool, err := caPool(cfg.SMTP.CAFile)
		if err != nil {
			errs = append(errs, err)
		}
		s.tls.RootCAs = pool
	}
	if err := errors.Join(errs...); err != nil {
		return settings{}, err
	}
	return s, nil
}

// caPool returns the system's certificate pool with the certificates of the
// PEM file at path added.
func caPool(path string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("smtp.ca_file: %w", err)
	}
	pool, err := x509.SystemCertPool()
	if err != nil || pool == nil {
		pool = x509.NewCertPool()
	}
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("smtp.ca_file %s: no PEM certificate in it: want the CA certificate (-----BEGIN CERTIFICATE-----)", path)
	}
	return pool, nil
}
