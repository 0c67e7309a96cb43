package slack

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"slices"
	"strings"

	"github.com/assent-dev/assent/pkg/events"
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
	// Channel is the Slack conversation requests are posted in when no
	// route takes them: its id (C0123ABCD), from the channel's details. The
	// bot must be a member. Required unless DM is set.
	Channel string `yaml:"channel"`
	// DM sends the requests no route takes to each eligible approver on
	// Slack, as a direct message, instead of posting them in Channel
	// (which, if set too, takes those with no approver on Slack).
	DM bool `yaml:"dm"`
	// Routes send some requests elsewhere: the first route whose rule and
	// agent match a request takes it (a route names one or both).
	Routes []Route `yaml:"routes"`
	// APIURL is the base URL of Slack's Web API, with a trailing slash.
	// Default https://slack.com/api/; tests point it at a local server.
	APIURL string `yaml:"api_url"`
	// Mention says whether messages mention the approvers they are for
	// (<@U...>), which notifies them. Nil means true.
	Mention *bool `yaml:"mention"`
}

// Route sends the requests of a policy rule, of an agent, or of a rule for
// an agent, to a channel of their own or to their approvers' DMs.
type Route struct {
	// Rule is the name of a rule of the policy; empty matches every rule.
	Rule string `yaml:"rule"`
	// Agent is an agent's name; empty matches every agent.
	Agent string `yaml:"agent"`
	// Channel is the id of the conversation the requests go to; or DM
	// sends them to each eligible approver directly. One of the two.
	Channel string `yaml:"channel"`
	DM      bool   `yaml:"dm"`
}

// matches says whether r takes a request of rule by agent.
func (r Route) matches(rule, agent string) bool {
	return (r.Rule == "" || r.Rule == rule) && (r.Agent == "" || r.Agent == agent)
}

// dest is where a request goes: a conversation, or its approvers' DMs
// (with channel, if set, for a request without approvers on Slack).
type dest struct {
	channel string
	dm      bool
}

// route returns where a request of rule by agent goes.
func (c Config) route(rule, agent string) dest {
	for _, r := range c.Routes {
		if r.matches(rule, agent) {
			if r.DM {
				return dest{dm: true, channel: c.Channel}
			}
			return dest{channel: r.Channel}
		}
	}
	return dest{channel: c.Channel, dm: c.DM}
}

// conversations lists the channels c posts in, each once, in the order
// written.
func (c Config) conversations() []string {
	var out []string
	add := func(ch string) {
		if ch != "" && !slices.Contains(out, ch) {
			out = append(out, ch)
		}
	}
	add(c.Channel)
	for _, r := range c.Routes {
		add(r.Channel)
	}
	return out
}

// FieldError is a problem with one setting of the section: Field is its
// path ("channel", "routes[1].rule"), for the bot to report at its line.
type FieldError struct {
	Field string
	// Value is the setting's value, quoted in the message when not empty.
	Value string
	Err   error
}

func (e *FieldError) Error() string {
	if e.Value != "" {
		return fmt.Sprintf("%s %q: %s", e.Field, e.Value, e.Err)
	}
	return e.Field + ": " + e.Err.Error()
}
func (e *FieldError) Unwrap() error { return e.Err }

// FieldPath is Field: the bot reports the error at that setting's line.
func (e *FieldError) FieldPath() string { return e.Field }

func fieldErr(field, format string, args ...any) error {
	return &FieldError{Field: field, Err: fmt.Errorf(format, args...)}
}

func valueErr(field, value, format string, args ...any) error {
	return &FieldError{Field: field, Value: value, Err: fmt.Errorf(format, args...)}
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
		errs = append(errs, valueErr("mode", c.Mode, "want %q (Slack posts clicks to the bot's public URL) or %q (the bot connects to Slack; no public URL needed)", ModeHTTP, ModeSocket))
	}
	switch {
	case c.Channel == "" && !c.DM:
		errs = append(errs, fieldErr("channel", "missing; set it to the id of the Slack channel to post requests in (C0123ABCD: open the channel's details, the id is at the bottom of the About tab), or set dm: true to send each request to its approvers directly"))
	case c.Channel != "":
		if err := checkChannelID(c.Channel); err != nil {
			errs = append(errs, &FieldError{Field: "channel", Value: c.Channel, Err: err})
		}
	}
	for i, r := range c.Routes {
		field := fmt.Sprintf("routes[%d]", i)
		if r.Rule == "" && r.Agent == "" {
			errs = append(errs, fieldErr(field, "names neither a rule nor an agent: add rule: NAME (a rule of the policy), agent: NAME, or both"))
		}
		if r.Agent != "" {
			if err := events.CheckToken("agent", r.Agent); err != nil {
				errs = append(errs, &FieldError{Field: field + ".agent", Err: err})
			}
		}
		switch {
		case r.Channel == "" && !r.DM:
			errs = append(errs, fieldErr(field, "says nowhere to send the requests: add channel: C0123ABCD, or dm: true"))
		case r.Channel != "" && r.DM:
			errs = append(errs, fieldErr(field, "has both channel and dm: true; keep one"))
		case r.Channel != "":
			if err := checkChannelID(r.Channel); err != nil {
				errs = append(errs, &FieldError{Field: field + ".channel", Value: r.Channel, Err: err})
			}
		}
		for j, earlier := range c.Routes[:i] {
			if earlier.Rule == r.Rule && earlier.Agent == r.Agent {
				errs = append(errs, fieldErr(field, "matches the same requests as routes[%d], which takes them first", j))
				break
			}
		}
	}
	for _, e := range []struct{ field, name string }{
		{"bot_token_env", c.BotTokenEnv}, {"signing_secret_env", c.SigningSecretEnv}, {"app_token_env", c.AppTokenEnv},
	} {
		if !validEnvName(e.name) {
			errs = append(errs, valueErr(e.field, e.name, "want the name of an environment variable (letters, digits and _), not its value"))
		}
	}
	if u, err := url.Parse(c.APIURL); err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
		errs = append(errs, valueErr("api_url", c.APIURL, "want an http(s) URL such as %s", DefaultAPIURL))
	}
	return errs
}

// checkChannelID refuses what cannot be a conversation's id: a name
// (#approvals), a link, anything with spaces.
func checkChannelID(id string) error {
	switch {
	case strings.ContainsFunc(id, func(r rune) bool { return r <= ' ' }):
		return errors.New("a Slack channel id has no spaces (C0123ABCD)")
	case strings.HasPrefix(id, "#"):
		return errors.New("want the channel's id (C0123ABCD, at the bottom of the channel's About tab), not its name")
	case strings.ContainsAny(id, "/:."):
		return errors.New("want the channel's id (C0123ABCD), not a link")
	}
	return nil
}

// ruleProblems reports the routes naming a rule the policy does not have.
func (c Config) ruleProblems(rules []string) []error {
	var errs []error
	for i, r := range c.Routes {
		if r.Rule != "" && !slices.Contains(rules, r.Rule) {
			errs = append(errs, valueErr(fmt.Sprintf("routes[%d].rule", i), r.Rule, "the policy has no such rule (its rules: %s)", strings.Join(rules, ", ")))
		}
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
		errs = append(errs, fieldErr("bot_token_env", "environment variable %s is not set: set it to the app's Bot User OAuth Token (xoxb-...), from the Slack app's OAuth & Permissions page", c.BotTokenEnv))
	case strings.HasPrefix(s.botToken, "xapp-"):
		errs = append(errs, fieldErr("bot_token_env", "environment variable %s holds an app-level token (xapp-...): it wants the Bot User OAuth Token (xoxb-...) from OAuth & Permissions; app-level tokens go in %s", c.BotTokenEnv, c.AppTokenEnv))
	}
	switch c.Mode {
	case ModeHTTP:
		s.signingSecret = strings.TrimSpace(os.Getenv(c.SigningSecretEnv))
		if s.signingSecret == "" {
			errs = append(errs, fieldErr("signing_secret_env", "environment variable %s is not set: set it to the app's Signing Secret (Basic Information, App Credentials), which authenticates clicks in mode %q", c.SigningSecretEnv, ModeHTTP))
		}
	case ModeSocket:
		s.appToken = strings.TrimSpace(os.Getenv(c.AppTokenEnv))
		switch {
		case s.appToken == "":
			errs = append(errs, fieldErr("app_token_env", "environment variable %s is not set: mode %q needs an app-level token (xapp-...) with the connections:write scope, made under Basic Information, App-Level Tokens", c.AppTokenEnv, ModeSocket))
		case !strings.HasPrefix(s.appToken, "xapp-"):
			errs = append(errs, fieldErr("app_token_env", "environment variable %s does not hold an app-level token: they start with xapp- (Basic Information, App-Level Tokens); bot tokens (xoxb-...) go in %s", c.AppTokenEnv, c.BotTokenEnv))
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
