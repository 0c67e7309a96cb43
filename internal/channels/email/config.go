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

	"gopkg.in/yaml.v3"

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
	// (a local relay), or, with SMTPConfig.InsecurePlaintext, to any (a
	// development mail catcher such as Mailpit reached by name).
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

	// Source, if set, is where the configuration was read: its problems
	// then start with file:line.
	Source Source `yaml:"-"`
}

// Source is where a Config was read: a file, and the line of each setting
// in it by its path ("smtp.tls"); "" is the section's own line.
type Source struct {
	File  string
	Lines map[string]int
}

// SourceOf returns the Source of a section read from file: the mapping
// node of the channel's section in it.
func SourceOf(file string, section *yaml.Node) Source {
	src := Source{File: file, Lines: map[string]int{}}
	if section == nil {
		return src
	}
	src.Lines[""] = section.Line
	var walk func(n *yaml.Node, prefix string)
	walk = func(n *yaml.Node, prefix string) {
		if n.Kind != yaml.MappingNode {
			return
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			path := prefix + n.Content[i].Value
			src.Lines[path] = n.Content[i].Line
			walk(n.Content[i+1], path+".")
		}
	}
	walk(section, "")
	return src
}

// at returns where the setting at path is, or where it would go (its
// parent's line): "bot.yaml:12: email." to start a problem with, or ""
// without a Source.
func (s Source) at(path string) string {
	if s.File == "" {
		return ""
	}
	for p := path; ; {
		if line, ok := s.Lines[p]; ok {
			return fmt.Sprintf("%s:%d: email.", s.File, line)
		}
		if p == "" {
			return s.File + ": email."
		}
		p = p[:max(strings.LastIndexByte(p, '.'), 0)]
	}
}

// ConfigError is a problem of one setting of a Config.
type ConfigError struct {
	// Where is "file:line: email." when the Config has a Source, else "".
	Where string
	// Setting is the setting's path: "smtp.tls".
	Setting string
	Msg     string
}

func (e *ConfigError) Error() string { return e.Where + e.Setting + e.Msg }

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
	// TLS is "starttls" (the default), "tls" or "none" (loopback only,
	// unless InsecurePlaintext).
	TLS string `yaml:"tls"`
	// InsecurePlaintext lets TLS "none" reach a server that is not on
	// loopback: mail, with its approval links (and the password, if any),
	// crosses the network unencrypted. For development against a mail
	// catcher (Mailpit, MailHog) in Compose; the bot warns at start and in
	// `approver-bot check`.
	InsecurePlaintext bool `yaml:"insecure_plaintext"`
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
	bad := func(setting, format string, args ...any) {
		errs = append(errs, &ConfigError{Where: c.Source.at(setting), Setting: setting, Msg: fmt.Sprintf(format, args...)})
	}
	switch h := c.SMTP.Host; {
	case h == "":
		bad("smtp.host", ": required: the SMTP server to submit mail to (smtp.example.com)")
	case strings.ContainsAny(h, " /:@") && net.ParseIP(h) == nil:
		bad("smtp.host", " %q: want a host name or an IP address, without a port or a scheme (set smtp.port)", textsafe.Line(h))
	}
	if c.SMTP.Port < 1 || c.SMTP.Port > 65535 {
		bad("smtp.port", " %d: want 1-65535 (587 for STARTTLS, 465 for TLS)", c.SMTP.Port)
	}
	switch c.SMTP.TLS {
	case TLSStartTLS, TLSImplicit:
		if c.SMTP.InsecurePlaintext {
			bad("smtp.insecure_plaintext", ": only with tls: none, and smtp.tls is %s: remove insecure_plaintext", c.SMTP.TLS)
		}
	case TLSNone:
		if c.SMTP.Host != "" && !loopback(c.SMTP.Host) && !c.SMTP.InsecurePlaintext {
			bad("smtp.tls", " none: allowed only to a server on loopback (localhost, 127.0.0.1, ::1), not %q: use starttls or tls; for a development mail catcher (Mailpit, MailHog) reached by name, also set insecure_plaintext: true", textsafe.Line(c.SMTP.Host))
		}
	default:
		bad("smtp.tls", " %q: want starttls, tls or none", textsafe.Line(c.SMTP.TLS))
	}
	// The values are not repeated: they may be the secrets themselves.
	if !envName.MatchString(c.SMTP.PasswordEnv) {
		bad("smtp.password_env", ": want the name of an environment variable (ASSENT_SMTP_PASSWORD) that holds the password, not the password")
	}
	if !envName.MatchString(c.LinkSecretEnv) {
		bad("link_secret_env", ": want the name of an environment variable (ASSENT_EMAIL_LINK_SECRET) that holds the secret, not the secret")
	}
	if c.From == "" {
		bad("from", ": required: the sender address (Assent <assent@example.com>)")
	} else if _, err := netmail.ParseAddress(c.From); err != nil {
		bad("from", " %q: not an email address: %v", textsafe.Line(c.From), err)
	}
	if p := c.SubjectPrefix; textsafe.Line(p) != p || len(p) > 64 {
		bad("subject_prefix", " %q: want one line of at most 64 bytes", textsafe.Line(p))
	}
	return errors.Join(errs...)
}

// Warnings says what in c, though valid, is unsafe outside development:
// mail in plain text to a server that is not on loopback.
func (c Config) Warnings() []string {
	c = c.withDefaults()
	if c.SMTP.TLS != TLSNone || !c.SMTP.InsecurePlaintext || loopback(c.SMTP.Host) {
		return nil
	}
	what := "approval links, which answer as their recipients,"
	if c.SMTP.Username != "" {
		what = "the SMTP password and approval links, which answer as their recipients,"
	}
	return []string{fmt.Sprintf("%ssmtp.insecure_plaintext: mail goes to %s:%d unencrypted: %s can be read and used by anyone on the network path. For development only (a mail catcher such as Mailpit); never in production",
		c.Source.at("smtp.insecure_plaintext"), textsafe.Line(c.SMTP.Host), c.SMTP.Port, what)}
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
