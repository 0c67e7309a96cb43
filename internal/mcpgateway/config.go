package mcpgateway

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/assent-dev/assent/internal/httptls"
	"github.com/assent-dev/assent/internal/natsconn"
	"github.com/assent-dev/assent/pkg/events"
)

// Config is the gateway's configuration: a YAML file (Load), flags, or both.
type Config struct {
	// Upstreams are the MCP servers whose tools the gateway offers.
	Upstreams []Upstream `yaml:"upstreams"`
	// Identity names who asks; what it leaves empty comes from the client.
	Identity Identity `yaml:"identity"`
	// NATS says how to reach Assent.
	NATS NATS `yaml:"nats"`
	// Timeout is asked for each request; zero leaves it to the broker's
	// default. The broker clamps it to its policy either way. Keep it below
	// the client's own limit on a tool call (60s in the MCP TypeScript
	// SDK), so that the call ends in Assent, on the record.
	Timeout time.Duration `yaml:"timeout"`
	// Elicitation asks the connected user in the client, too.
	Elicitation Elicitation `yaml:"elicitation"`
	// ClientPing is how often the gateway pings a client whose call waits
	// for a decision (and reports progress, when the client asked for it);
	// a client that does not answer within that time is taken as gone and
	// its request cancelled. Zero means DefaultClientPing; negative, never.
	ClientPing time.Duration `yaml:"client_ping"`
	// BrokerWait is how long a broker may take to take up (store) a call's
	// request before the call fails as not run (ErrNoBroker), rather than
	// waiting its whole timeout for a broker that is not there. Zero means
	// DefaultBrokerWait; negative, as long as the request's timeout.
	BrokerWait time.Duration `yaml:"broker_wait"`
	// SessionIdle is how long a client's session over HTTP may go without
	// a request or an open stream before the gateway ends it, with its
	// upstream sessions (a stdio upstream runs once per client session), so
	// that a client that vanished without ending its session leaves nothing
	// running. Zero means DefaultSessionIdle.
	SessionIdle time.Duration `yaml:"session_idle"`
	// TLS serves the clients over streamable HTTP (--http) with HTTPS.
	TLS TLS `yaml:"tls"`

	// File is the file the configuration was read from; messages about it
	// carry file:line.
	File string `yaml:"-"`
	// lines maps a setting's path ("upstreams[1].url") to its line in File.
	lines map[string]int
	// parseErrs are the problems found while reading File.
	parseErrs []error
}

// Upstream is one MCP server: a command the gateway starts and talks to
// over stdio, or a URL it reaches over streamable HTTP.
type Upstream struct {
	// Name names the server: in messages, logs, and the requests' label
	// mcp_server. A subject token (A-Z a-z 0-9 _ -).
	Name string `yaml:"name"`
	// Command, Args, Env and Dir start a stdio server. Env is added to
	// the gateway's own environment; Dir defaults to the gateway's.
	Command string            `yaml:"command"`
	Args    []string          `yaml:"args"`
	Env     map[string]string `yaml:"env"`
	Dir     string            `yaml:"dir"`
	// URL reaches a streamable HTTP server; Headers go with every request
	// to it (an Authorization header, say).
	URL     string            `yaml:"url"`
	Headers map[string]string `yaml:"headers"`
	// Prefix is put before the names of the server's tools as the client
	// sees them ("fs__" offers delete_file as fs__delete_file). Requests to
	// Assent name the tool as the server does, without it.
	Prefix string `yaml:"prefix"`
	// Guard lists what else of the server's, besides its tool calls, is
	// put to Assent before the client gets it: "resources" (each
	// resources/read, asked as tool resource:read with args {"uri": ...})
	// and "prompts" (each prompts/get, asked as tool prompt:get with args
	// {"name": ..., "arguments": {...}}). None by default: the policy's
	// rules then decide them as they decide tool calls.
	Guard []string `yaml:"guard"`
	// AutoName says Name was not given but made up (ParseArgs, for the
	// upstream on the command line, by CommandName or from the URL's
	// host): once connected, the upstream is named as the server names
	// itself (its initialize result's serverInfo.name, as a subject
	// token), unless another upstream has that name.
	AutoName bool `yaml:"-"`
}

// What an upstream's Guard may name.
const (
	GuardResources = "resources"
	GuardPrompts   = "prompts"
)

// guards reports whether u's Guard names kind.
func (u Upstream) guards(kind string) bool { return slices.Contains(u.Guard, kind) }

// Identity is who the gateway asks as. Empty fields are taken from the
// client (see the package documentation).
type Identity struct {
	Agent   string `yaml:"agent"`
	Session string `yaml:"session"`
	User    string `yaml:"user"`
}

// NATS is how the gateway reaches Assent.
type NATS struct {
	URL      string `yaml:"url"`
	Creds    string `yaml:"creds"`
	CAFile   string `yaml:"ca_file"`
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
	// TrustedDecisionKeys are the public keys of the broker's decision
	// keys (broker decision-key new): when set, a decision counts only if
	// one of them signed it.
	TrustedDecisionKeys []string `yaml:"trusted_decision_keys"`
	// Private reads decisions through the agent's own subjects and inbox
	// instead of the stream, for credentials issued with --private (broker
	// creds gateway NAME --agent A --private), which read nothing else. It
	// needs identity.agent.
	Private bool `yaml:"private"`
}

// Settings are the NATS connection settings.
func (n NATS) Settings() natsconn.Settings {
	return natsconn.Settings{URL: n.URL, Creds: n.Creds, CAFile: n.CAFile, CertFile: n.CertFile, KeyFile: n.KeyFile}
}

// TLS is how the gateway serves HTTPS, PEM files all: CertFile (its chain
// after it) and KeyFile, re-read when they change; with ClientCAFile, a
// client must present a certificate signed by that CA (mutual TLS), or its
// handshake fails.
type TLS struct {
	CertFile     string `yaml:"cert_file"`
	KeyFile      string `yaml:"key_file"`
	ClientCAFile string `yaml:"client_ca_file"`
}

// Files are t's files, as httptls takes them.
func (t TLS) Files() httptls.Files {
	return httptls.Files{CertFile: t.CertFile, KeyFile: t.KeyFile, ClientCAFile: t.ClientCAFile}
}

// Elicitation is the approval channel in the client itself.
type Elicitation struct {
	// Principal is the approver the person at the client answers as. Set,
	// a client that can elicit is asked about each call that waits for
	// people, and its answer is published as this principal's.
	Principal string `yaml:"principal"`
	// OverHTTP asks clients connected over streamable HTTP too. Off, only
	// the stdio client is asked: whoever reaches the HTTP address could
	// otherwise answer as Principal.
	OverHTTP bool `yaml:"over_http"`
}

// Defaults.
const (
	DefaultNATSURL    = "nats://127.0.0.1:4222"
	DefaultClientPing = 15 * time.Second
	DefaultBrokerWait = 5 * time.Second
	// DefaultSessionIdle is Config.SessionIdle's default.
	DefaultSessionIdle = 30 * time.Minute
)

// WithDefaults returns c with every unset field at its default.
func (c Config) WithDefaults() Config {
	if c.NATS.URL == "" {
		c.NATS.URL = DefaultNATSURL
	}
	if c.ClientPing == 0 {
		c.ClientPing = DefaultClientPing
	}
	if c.BrokerWait == 0 {
		c.BrokerWait = DefaultBrokerWait
	}
	if c.SessionIdle == 0 {
		c.SessionIdle = DefaultSessionIdle
	}
	return c
}

// Load reads the configuration file at path. Problems in it are reported by
// Validate, with every other problem, each at its file:line.
func Load(path string) (Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("config: %w", err)
	}
	return Parse(data, path), nil
}

// Parse reads a configuration; name is the file it came from. Problems are
// kept for Validate to report.
func Parse(data []byte, name string) Config {
	c := Config{File: name, lines: map[string]int{}}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		c.parseErrs = append(c.parseErrs, c.yamlErr(err))
		return c
	}
	if len(doc.Content) == 0 {
		return c
	}
	root := doc.Content[0]
	c.walk(root, reflect.TypeFor[Config](), "")
	if err := root.Decode(&c); err != nil {
		c.parseErrs = append(c.parseErrs, c.yamlErr(err))
	}
	return c
}

// walk records the line of each setting under n, which holds a t at path,
// and reports keys that t has no field for.
func (c *Config) walk(n *yaml.Node, t reflect.Type, path string) {
	if path != "" {
		c.lines[path] = n.Line
	}
	switch {
	case t.Kind() == reflect.Struct && n.Kind == yaml.MappingNode:
		fields := map[string]reflect.Type{}
		var known []string
		for f := range t.Fields() {
			if name, _, _ := strings.Cut(f.Tag.Get("yaml"), ","); f.IsExported() && name != "-" && name != "" {
				fields[name] = f.Type
				known = append(known, name)
			}
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			sub := strings.TrimPrefix(path+"."+k.Value, ".")
			ft, ok := fields[k.Value]
			if !ok {
				c.lines[sub] = k.Line
				c.parseErrs = append(c.parseErrs, c.errorf(sub, "unknown setting (known here: %s)", strings.Join(known, ", ")))
				continue
			}
			c.walk(v, ft, sub)
		}
	case t.Kind() == reflect.Slice && n.Kind == yaml.SequenceNode:
		for i, e := range n.Content {
			c.walk(e, t.Elem(), fmt.Sprintf("%s[%d]", path, i))
		}
	}
}

var yamlLine = regexp.MustCompile(`line (\d+): `)

// yamlErr turns a YAML error into one error per problem, at its file:line.
func (c *Config) yamlErr(err error) error {
	msgs := []string{strings.TrimPrefix(err.Error(), "yaml: ")}
	if te := (*yaml.TypeError)(nil); errors.As(err, &te) {
		msgs = te.Errors
	}
	var errs []error
	for _, m := range msgs {
		if g := yamlLine.FindStringSubmatch(m); g != nil {
			m = c.File + ":" + g[1] + ": " + strings.Replace(m, g[0], "", 1)
		} else if c.File != "" {
			m = c.File + ": " + m
		}
		errs = append(errs, errors.New(m))
	}
	return errors.Join(errs...)
}

// errorf is a problem with the setting at path, after the file:line of the
// setting or of the nearest setting that holds it, when it came from a file.
func (c *Config) errorf(path, format string, args ...any) error {
	return c.labelled(path, path, format, args...)
}

// labelled is errorf naming the setting label rather than path.
func (c *Config) labelled(path, label, format string, args ...any) error {
	where := ""
	if c.File != "" {
		where = c.File + ": "
	}
	for p := path; p != "" && c.File != ""; p = p[:max(strings.LastIndexAny(p, ".["), 0)] {
		if line, ok := c.lines[p]; ok {
			where = c.File + ":" + strconv.Itoa(line) + ": "
			break
		}
	}
	return fmt.Errorf("%s%s: %s", where, label, fmt.Sprintf(format, args...))
}

// Validate reports every problem with c at once: those found reading its
// file, and each setting that cannot work, with what to do about it. Call
// it on WithDefaults' result.
func (c Config) Validate() error {
	errs := slices.Clone(c.parseErrs)
	if len(c.Upstreams) == 0 {
		errs = append(errs, c.errorf("upstreams", "none: name at least one MCP server, with a command to start (stdio) or a url (streamable HTTP)"))
	}
	names := map[string]int{}
	for i, u := range c.Upstreams {
		at := func(field, format string, args ...any) {
			label := fmt.Sprintf("upstreams[%d]", i)
			if u.Name != "" {
				label += " (" + u.Name + ")"
			}
			errs = append(errs, c.labelled(fmt.Sprintf("upstreams[%d].%s", i, field), label+"."+field, format, args...))
		}
		switch {
		case u.Name == "":
			at("name", "missing: give the server a name (A-Z a-z 0-9 _ -), such as fs")
		case !events.ValidToken(u.Name):
			at("name", "%q: want 1-128 characters of A-Z a-z 0-9 _ -", u.Name)
		default:
			if j, dup := names[u.Name]; dup {
				at("name", "%q: already the name of upstreams[%d]", u.Name, j)
			}
			names[u.Name] = i
		}
		switch {
		case u.Command == "" && u.URL == "":
			at("command", "neither command nor url: give a command to start (stdio) or a url (streamable HTTP)")
		case u.Command != "" && u.URL != "":
			at("url", "both command and url: give one, a command to start (stdio) or a url (streamable HTTP)")
		case u.URL != "":
			if v, err := url.Parse(u.URL); err != nil || (v.Scheme != "http" && v.Scheme != "https") || v.Host == "" {
				at("url", "%q: want an http or https URL, such as http://127.0.0.1:3000/mcp", u.URL)
			}
			if len(u.Args) > 0 || len(u.Env) > 0 || u.Dir != "" {
				at("url", "args, env and dir start a command: a url server takes headers only")
			}
			for k := range u.Headers {
				if !validHeaderName(k) {
					at("headers", "%q: not an HTTP header name", k)
				}
			}
		default:
			if len(u.Headers) > 0 {
				at("headers", "headers go to a url server: a command takes args, env and dir")
			}
		}
		for _, g := range u.Guard {
			if g != GuardResources && g != GuardPrompts {
				at("guard", "%q: want %s or %s (tool calls are always guarded)", g, GuardResources, GuardPrompts)
			}
		}
		if len(u.Prefix) > 64 || strings.IndexFunc(u.Prefix, func(r rune) bool { return !isToolNameChar(r) }) >= 0 {
			at("prefix", "%q: want at most 64 characters of A-Z a-z 0-9 _ - . (tool names are made of them)", u.Prefix)
		}
	}
	if a := c.Identity.Agent; a != "" && !events.ValidToken(a) {
		errs = append(errs, c.errorf("identity.agent", "%q: want 1-128 characters of A-Z a-z 0-9 _ - (it is a NATS subject token)", a))
	}
	for field, v := range map[string]string{"identity.session": c.Identity.Session, "identity.user": c.Identity.User} {
		if err := events.CheckIdentifier(field, v); err != nil || len(v) > 256 {
			errs = append(errs, c.errorf(field, "%q: want at most 256 bytes of printable text", v))
		}
	}
	if c.NATS.Private && c.Identity.Agent == "" {
		errs = append(errs, c.errorf("nats.private", "needs identity.agent: private credentials read the decisions of the one agent they were issued for"))
	}
	if err := c.NATS.Settings().Validate(); err != nil {
		errs = append(errs, c.errorf("nats", "%v", err))
	}
	if c.NATS.URL == "" {
		errs = append(errs, c.errorf("nats.url", "empty: the NATS server of the broker, such as %s", DefaultNATSURL))
	}
	if _, err := events.NewTrustedKeys(c.NATS.TrustedDecisionKeys...); err != nil {
		errs = append(errs, c.errorf("nats.trusted_decision_keys", "%v", err))
	}
	if c.Timeout < 0 || c.Timeout > events.MaxTimeout {
		errs = append(errs, c.errorf("timeout", "%s: want 0 (the broker's default) up to %s", c.Timeout, events.MaxTimeout))
	}
	if c.SessionIdle < 0 {
		errs = append(errs, c.errorf("session_idle", "%s: want a duration above 0, such as 30m (the default)", c.SessionIdle))
	}
	if p := c.Elicitation.Principal; p != "" && !events.ValidToken(p) {
		errs = append(errs, c.errorf("elicitation.principal", "%q: want a principal of the policy (A-Z a-z 0-9 _ -)", p))
	}
	if c.Elicitation.OverHTTP && c.Elicitation.Principal == "" {
		errs = append(errs, c.errorf("elicitation.over_http", "without elicitation.principal: name the principal the person at the client answers as"))
	}
	errs = append(errs, c.validateTLS()...)
	return errors.Join(errs...)
}

// validateTLS reports the problems with c.TLS: a certificate without its
// key or the other way round, a client CA without either, a file that is
// not there.
func (c Config) validateTLS() []error {
	t := c.TLS
	var errs []error
	switch {
	case t == TLS{}:
		return nil
	case t.CertFile == "" && t.KeyFile == "":
		errs = append(errs, c.errorf("tls.client_ca_file", "asks HTTPS clients for a certificate: give the gateway's own too, tls.cert_file and tls.key_file (--tls-cert, --tls-key)"))
	case t.CertFile == "":
		errs = append(errs, c.errorf("tls.key_file", "without tls.cert_file (--tls-cert): give both, the certificate file and its key file"))
	case t.KeyFile == "":
		errs = append(errs, c.errorf("tls.cert_file", "without tls.key_file (--tls-key): give both, the certificate file and its key file"))
	}
	for _, f := range []struct{ setting, path string }{{"tls.cert_file", t.CertFile}, {"tls.key_file", t.KeyFile}, {"tls.client_ca_file", t.ClientCAFile}} {
		if f.path == "" {
			continue
		}
		if _, err := os.Stat(f.path); err != nil {
			errs = append(errs, causeError{c.errorf(f.setting, "%v", err), err})
		}
	}
	return errs
}

// causeError is a problem that says where (Config.errorf) and wraps what
// caused it, for errors.Is: a missing file is os.ErrNotExist.
type causeError struct{ where, cause error }

func (e causeError) Error() string { return e.where.Error() }
func (e causeError) Unwrap() error { return e.cause }

// isToolNameChar reports whether r may stand in an MCP tool name.
func isToolNameChar(r rune) bool {
	return r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '-' || r == '.'
}

// validHeaderName reports whether k is an HTTP token.
func validHeaderName(k string) bool {
	return k != "" && strings.IndexFunc(k, func(r rune) bool {
		return r <= ' ' || r >= 0x7f || strings.ContainsRune(`"(),/:;<=>?@[\]{}`, r)
	}) < 0
}
