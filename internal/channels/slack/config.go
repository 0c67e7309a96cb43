package slack

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
)

// How Slack delivers people's clicks to the bot (Config.Mode).
const (
	// ModeHTTP: Slack POSTs each interaction to PublicURL + InteractionsPath,
	// signed with the app's signing secret. The bot needs a public URL.
	ModeHTTP = "http"
	// ModeSocket: the bot opens a Socket Mode websocket to Slack with an
	// app-level token and receives interactions over it. No public URL.
	ModeSocket = "socket"
)

// Defaults of Config.
const (
	DefaultBotTokenEnv      = "SLACK_BOT_TOKEN"
	DefaultSigningSecretEnv = "SLACK_SIGNING_SECRET"
	DefaultAppTokenEnv      = "SLACK_APP_TOKEN"
	DefaultAPIURL           = "https://slack.com/api/"
)

// ErrConfig is wrapped by every error New and Config.Validate return for a
// bad setting or a missing secret.
var ErrConfig = errors.New("slack channel configuration")

// Config configures the Slack channel, from the bot's configuration file.
// Secrets are never in it: it names the environment variables that hold them.
type Config struct {
	// BotTokenEnv names the environment variable holding the bot token
	// (xoxb-...), which posts and updates messages. Default SLACK_BOT_TOKEN.
	BotTokenEnv string `yaml:"bot_token_env"`
	// SigningSecretEnv names the environment variable holding the app's
	// signing secret, which authenticates interactions in http mode.
	// Default SLACK_SIGNING_SECRET.
	SigningSecretEnv string `yaml:"signing_secret_env"`
	// AppTokenEnv names the environment variable holding the app-level token
	// (xapp-..., scope connections:write) that opens Socket Mode
	// connections in socket mode. Default SLACK_APP_TOKEN.
	AppTokenEnv string `yaml:"app_token_env"`
	// Mode is how interactions arrive: ModeHTTP (default) or ModeSocket.
	Mode string `yaml:"mode"`
	// Channel is the Slack conversation requests are posted in: its id
	// (C0123ABCD), from the channel's details. The bot must be a member.
	// Required.
	Channel string `yaml:"channel"`
	// APIURL is the base URL of Slack's Web API, with a trailing slash.
	// Default https://slack.com/api/; tests point it at a local server.
	APIURL string `yaml:"api_url"`
	// Mention says whether messages mention the approvers they are for
	// (<@U...>), which notifies them. Nil means true.
	Mention *bool `yaml:"mention"`
}

// withDefaults returns c with every unset field at its default.
func (c Config) withDefaults() Config {
	if c.BotTokenEnv == "" {
		c.BotTokenEnv = DefaultBotTokenEnv
	}
	if c.SigningSecretEnv == "" {
		c.SigningSecretEnv = DefaultSigningSecretEnv
	}
	if c.AppTokenEnv == "" {
		c.AppTokenEnv = DefaultAppTokenEnv
	}
	if c.Mode == "" {
		c.Mode = ModeHTTP
	}
	if c.APIURL == "" {
		c.APIURL = DefaultAPIURL
	}
	if !strings.HasSuffix(c.APIURL, "/") {
		c.APIURL += "/"
	}
	return c
}

// mention reports whether messages mention approvers.
func (c Config) mention() bool { return c.Mention == nil || *c.Mention }

// Validate reports every problem with the settings at once, unset fields
// taking their defaults. It does not look at the environment; New does.
func (c Config) Validate() error {
	return wrapConfig(c.withDefaults().problems())
}

func (c Config) problems() []error {
	var errs []error
	switch c.Mode {
	case ModeHTTP, ModeSocket:
	default:
		errs = append(errs, fmt.Errorf("mode %q: want %q (Slack posts clicks to the bot's public URL) or %q (the bot connects to Slack; no public URL needed)", c.Mode, ModeHTTP, ModeSocket))
	}
	switch {
	case c.Channel == "":
		errs = append(errs, errors.New("channel: missing; set it to the id of the Slack channel to post requests in (C0123ABCD: open the channel's details, the id is at the bottom of the About tab)"))
	case strings.ContainsFunc(c.Channel, func(r rune) bool { return r <= ' ' }):
		errs = append(errs, fmt.Errorf("channel %q: a Slack channel id has no spaces (C0123ABCD)", c.Channel))
	}
	for _, e := range []struct{ field, name string }{
		{"bot_token_env", c.BotTokenEnv}, {"signing_secret_env", c.SigningSecretEnv}, {"app_token_env", c.AppTokenEnv},
	} {
		if !validEnvName(e.name) {
			errs = append(errs, fmt.Errorf("%s %q: want the name of an environment variable (letters, digits and _), not its value", e.field, e.name))
		}
	}
	if u, err := url.Parse(c.APIURL); err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
		errs = append(errs, fmt.Errorf("api_url %q: want an http(s) URL such as %s", c.APIURL, DefaultAPIURL))
	}
	return errs
}

// secrets are what the environment holds for the channel.
type secrets struct {
	botToken, signingSecret, appToken string
}

// secrets reads the secrets c's mode needs from the environment, with a
// problem for each one missing or wrong.
func (c Config) secrets() (secrets, []error) {
	var s secrets
	var errs []error
	s.botToken = strings.TrimSpace(os.Getenv(c.BotTokenEnv))
	switch {
	case s.botToken == "":
		errs = append(errs, fmt.Errorf("environment variable %s is not set: set it to the app's Bot User OAuth Token (xoxb-...), from the Slack app's OAuth & Permissions page", c.BotTokenEnv))
	case strings.HasPrefix(s.botToken, "xapp-"):
		errs = append(errs, fmt.Errorf("environment variable %s holds an app-level token (xapp-...): it wants the Bot User OAuth Token (xoxb-...) from OAuth & Permissions; app-level tokens go in %s", c.BotTokenEnv, c.AppTokenEnv))
	}
	switch c.Mode {
	case ModeHTTP:
		s.signingSecret = strings.TrimSpace(os.Getenv(c.SigningSecretEnv))
		if s.signingSecret == "" {
			errs = append(errs, fmt.Errorf("environment variable %s is not set: set it to the app's Signing Secret (Basic Information, App Credentials), which authenticates clicks in mode %q", c.SigningSecretEnv, ModeHTTP))
		}
	case ModeSocket:
		s.appToken = strings.TrimSpace(os.Getenv(c.AppTokenEnv))
		switch {
		case s.appToken == "":
			errs = append(errs, fmt.Errorf("environment variable %s is not set: mode %q needs an app-level token (xapp-...) with the connections:write scope, made under Basic Information, App-Level Tokens", c.AppTokenEnv, ModeSocket))
		case !strings.HasPrefix(s.appToken, "xapp-"):
			errs = append(errs, fmt.Errorf("environment variable %s does not hold an app-level token: they start with xapp- (Basic Information, App-Level Tokens); bot tokens (xoxb-...) go in %s", c.AppTokenEnv, c.BotTokenEnv))
		}
	}
	return s, errs
}

func validEnvName(s string) bool {
	if s == "" || (s[0] >= '0' && s[0] <= '9') {
		return false
	}
	for _, r := range s {
		if !(r == '_' || r >= 'A' && r <= 'Z' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9') {
			return false
		}
	}
	return true
}

func wrapConfig(errs []error) error {
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %w", ErrConfig, errors.Join(errs...))
}
