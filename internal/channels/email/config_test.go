package email_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/assent-dev/assent/internal/channels"
	"github.com/assent-dev/assent/internal/channels/email"
	"github.com/assent-dev/assent/internal/testenv"
	"github.com/assent-dev/assent/pkg/policy"
)

// TestNewRefusesBadConfig: New reports what is wrong, every problem at once,
// and says what to do.
func TestNewRefusesBadConfig(t *testing.T) {
	p, err := policy.Parse([]byte(teamPolicy), "email.yaml")
	if err != nil {
		t.Fatal(err)
	}
	nc := testenv.Conn(t, testenv.Server(t))
	dir := t.TempDir()
	notPEM := filepath.Join(dir, "not.pem")
	if err := os.WriteFile(notPEM, []byte("hello"), 0o600); err != nil {
		t.Fatal(err)
	}
	good := email.Config{SMTP: email.SMTPConfig{Host: "smtp.example.com", Username: "bot"}, From: "assent@example.com"}
	env := channels.Env{NATS: nc, Directory: channels.NewDirectory(p), PublicURL: "https://bot.example.com/"}
	with := func(f func(*email.Config)) email.Config {
		c := good
		f(&c)
		return c
	}
	cases := []struct {
		name string
		cfg  email.Config
		env  channels.Env
		vars map[string]string // environment variables; nil values unset
		want []string          // in the error; none for success
	}{
		{"good", good, env, nil, nil},
		{"no authentication", with(func(c *email.Config) { c.SMTP.Username = "" }), env, map[string]string{email.DefaultPasswordEnv: ""}, nil},
		{"loopback without TLS", with(func(c *email.Config) { c.SMTP.Host, c.SMTP.TLS = "127.0.0.1", "none" }), env, nil, nil},
		{"own variable names", with(func(c *email.Config) { c.LinkSecretEnv, c.SMTP.PasswordEnv = "MY_SECRET", "MY_PASSWORD" }), env,
			map[string]string{email.DefaultLinkSecretEnv: "", email.DefaultPasswordEnv: "", "MY_SECRET": strings.Repeat("s", 32), "MY_PASSWORD": "pw"}, nil},
		{"no host", with(func(c *email.Config) { c.SMTP.Host = "" }), env, nil, []string{"smtp.host: required"}},
		{"host with port", with(func(c *email.Config) { c.SMTP.Host = "smtp.example.com:587" }), env, nil, []string{"without a port", "smtp.port"}},
		{"bad port", with(func(c *email.Config) { c.SMTP.Port = 70000 }), env, nil, []string{"smtp.port 70000"}},
		{"bad TLS mode", with(func(c *email.Config) { c.SMTP.TLS = "ssl" }), env, nil, []string{`smtp.tls "ssl": want starttls, tls or none`}},
		{"no TLS to a remote server", with(func(c *email.Config) { c.SMTP.TLS = "none" }), env, nil, []string{"allowed only to a server on loopback", "insecure_plaintext: true"}},
		{"no TLS to a mail catcher, insecure_plaintext", with(func(c *email.Config) { c.SMTP.Host, c.SMTP.TLS, c.SMTP.InsecurePlaintext = "mailpit", "none", true }), env, nil, nil},
		{"insecure_plaintext with TLS", with(func(c *email.Config) { c.SMTP.InsecurePlaintext = true }), env, nil, []string{"smtp.insecure_plaintext: only with tls: none, and smtp.tls is starttls"}},
		{"no sender", with(func(c *email.Config) { c.From = "" }), env, nil, []string{"from: required"}},
		{"bad sender", with(func(c *email.Config) { c.From = "assent at example" }), env, nil, []string{"not an email address"}},
		{"secret in the config", with(func(c *email.Config) { c.LinkSecretEnv = "hunter2 hunter2" }), env, nil, []string{"link_secret_env", "not the secret"}},
		{"subject prefix of two lines", with(func(c *email.Config) { c.SubjectPrefix = "[A]\r\nBcc: x@example.com" }), env, nil, []string{"subject_prefix"}},
		{"no link secret", good, env, map[string]string{email.DefaultLinkSecretEnv: ""}, []string{"ASSENT_EMAIL_LINK_SECRET is not set", "openssl rand"}},
		{"short link secret", good, env, map[string]string{email.DefaultLinkSecretEnv: "short"}, []string{"holds 5 bytes, fewer than 32"}},
		{"no password", good, env, map[string]string{email.DefaultPasswordEnv: ""}, []string{"ASSENT_SMTP_PASSWORD is empty"}},
		{"CA file missing", with(func(c *email.Config) { c.SMTP.CAFile = filepath.Join(dir, "nope.pem") }), env, nil, []string{"smtp.ca_file", "no such file"}},
		{"CA file not PEM", with(func(c *email.Config) { c.SMTP.CAFile = notPEM }), env, nil, []string{"no PEM certificate"}},
		{"no public URL", good, channels.Env{NATS: nc, Directory: env.Directory}, nil, []string{"set the bot's public_url"}},
		{"public URL without scheme", good, channels.Env{NATS: nc, Directory: env.Directory, PublicURL: "bot.example.com"}, nil, []string{"public URL"}},
		{"no directory", good, channels.Env{NATS: nc, PublicURL: "https://bot.example.com"}, nil, []string{"no directory"}},
		{"every problem at once", email.Config{SMTP: email.SMTPConfig{TLS: "ssl"}}, env, map[string]string{email.DefaultLinkSecretEnv: ""},
			[]string{"smtp.host: required", "smtp.tls", "from: required", "ASSENT_EMAIL_LINK_SECRET is not set"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Setenv(email.DefaultLinkSecretEnv, linkSecret)
			t.Setenv(email.DefaultPasswordEnv, "pw")
			for k, v := range c.vars {
				t.Setenv(k, v)
			}
			a, err := email.New(c.cfg, c.env)
			if len(c.want) == 0 {
				if err != nil {
					t.Fatalf("New: %v", err)
				}
				if a.Name() != "email" {
					t.Fatalf("Name %q", a.Name())
				}
				return
			}
			if err == nil {
				t.Fatalf("New accepted it; want an error with %q", c.want)
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error lacks %q:\n%v", w, err)
				}
			}
			if strings.Contains(err.Error(), "hunter2") {
				t.Errorf("the error repeats a secret:\n%v", err)
			}
		})
	}
}

// TestReaches: the channel reaches the principals with an email address.
func TestReaches(t *testing.T) {
	p, err := policy.Parse([]byte(teamPolicy), "email.yaml")
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv(email.DefaultLinkSecretEnv, linkSecret)
	a, err := email.New(email.Config{SMTP: email.SMTPConfig{Host: "localhost", TLS: "none"}, From: "assent@example.com"},
		channels.Env{NATS: testenv.Conn(t, testenv.Server(t)), Directory: channels.NewDirectory(p), PublicURL: "http://127.0.0.1:8080"})
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(a.Reaches(), ","); got != "alice,bob,mallory" {
		t.Fatalf("Reaches: %s", got)
	}
}

// TestWarnings: plain text to a server not on loopback is warned about,
// the password too when there is one; nothing else is.
func TestWarnings(t *testing.T) {
	for _, c := range []struct {
		smtp email.SMTPConfig
		want []string
	}{
		{email.SMTPConfig{Host: "mailpit", Port: 1025, TLS: "none", InsecurePlaintext: true}, []string{"mail goes to mailpit:1025 unencrypted", "approval links", "development only"}},
		{email.SMTPConfig{Host: "mailpit", TLS: "none", InsecurePlaintext: true, Username: "dev"}, []string{"the SMTP password and approval links"}},
		{email.SMTPConfig{Host: "localhost", TLS: "none", InsecurePlaintext: true}, nil},
		{email.SMTPConfig{Host: "localhost", TLS: "none"}, nil},
		{email.SMTPConfig{Host: "smtp.example.com"}, nil},
	} {
		w := email.Config{SMTP: c.smtp}.Warnings()
		if len(c.want) == 0 {
			if len(w) > 0 {
				t.Errorf("%+v: warnings %q, want none", c.smtp, w)
			}
			continue
		}
		for _, want := range c.want {
			if len(w) != 1 || !strings.Contains(w[0], want) {
				t.Errorf("%+v: warnings %q, want one with %q", c.smtp, w, want)
			}
		}
	}
}
