// Package bot is cmd/approver-bot: it reads the bot's configuration, maps the
// policy's principals to channel identities, and runs each configured channel
// (Slack, email, webhooks) on the approver runtime of pkg/handler, behind one
// HTTP server for their callbacks.
package bot

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/assent-dev/assent/internal/natsconn"
	"github.com/assent-dev/assent/pkg/events"
)

// Config is the bot's configuration file.
type Config struct {
	NATS struct {
		// URL of the NATS server or cluster; default nats://127.0.0.1:4222.
		URL string `yaml:"url"`
		// Creds is a NATS credentials file (user JWT and nkey seed), as
		// `broker creds bot` writes.
		Creds string `yaml:"creds"`
		// CAFile is the CA of the server's TLS certificate (tls:// URLs),
		// if the system does not trust it.
		CAFile string `yaml:"ca_file"`
		// CertFile and KeyFile are a client certificate, for a server that
		// asks for one (mutual TLS).
		CertFile string `yaml:"cert_file"`
		KeyFile  string `yaml:"key_file"`
	} `yaml:"nats"`
	// Policy is the policy file the brokers use: the bot reads its
	// principals, roles and channel identities, and its rules' approvers.
	Policy string `yaml:"policy"`
	HTTP   struct {
		// Listen is the address of the bot's HTTP server (Slack
		// interactions, email links, inbound webhooks); default
		// 127.0.0.1:8090.
		Listen string `yaml:"listen"`
		// PublicURL is where people and services reach that server;
		// default http://<listen>.
		PublicURL string `yaml:"public_url"`
	} `yaml:"http"`
	// WebUI is the broker's web UI, for links to a request's page.
	WebUI string `yaml:"web_ui"`
	// RemindText sends a reminder this long before a request's deadline
	// ("2m"); "0" sends none. Default 1m. Remind is it, parsed.
	RemindText string        `yaml:"remind"`
	Remind     time.Duration `yaml:"-"`
	// Agents limits the bot to these agents' requests; empty: all.
	Agents []string `yaml:"agents"`
	// TrustedDecisionKeys are the public keys of the brokers' decision keys
	// (broker decision-key new). When set, a decision counts only if one of
	// them signed it: a forged decided event neither updates a message nor
	// reaches a webhook. Trusted is them, parsed.
	TrustedDecisionKeys []string            `yaml:"trusted_decision_keys"`
	Trusted             *events.TrustedKeys `yaml:"-"`

	// The channels' sections: each channel is on when its section is
	// present. Each channel reads its own (Section).
	Slack    *yaml.Node `yaml:"-"`
	Email    *yaml.Node `yaml:"-"`
	Webhooks *yaml.Node `yaml:"-"`

	// File is the name the configuration was read from.
	File string `yaml:"-"`
}

// NATSSettings are how the bot connects to NATS.
func (c *Config) NATSSettings() natsconn.Settings {
	return natsconn.Settings{URL: c.NATS.URL, Creds: c.NATS.Creds, CAFile: c.NATS.CAFile, CertFile: c.NATS.CertFile, KeyFile: c.NATS.KeyFile}
}

// Defaults.
const (
	DefaultNATS   = "nats://127.0.0.1:4222"
	DefaultListen = "127.0.0.1:8090"
	DefaultRemind = time.Minute
)

// LoadConfig reads and checks the configuration file at path.
func LoadConfig(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	return ParseConfig(data, path)
}

// ParseConfig reads a configuration; name is used in errors, which carry
// file:line.
func ParseConfig(data []byte, name string) (*Config, error) {
	c := &Config{File: name}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, yamlError(name, 0, "", err)
	}
	var errs []error
	if len(doc.Content) == 1 {
		root := doc.Content[0]
		errs = append(errs, unknownKeys(name, "", root, "nats", "policy", "http", "web_ui", "remind", "agents", "trusted_decision_keys", "slack", "email", "webhooks")...)
		for i := 0; i+1 < len(root.Content); i += 2 {
			k, v := root.Content[i], root.Content[i+1]
			switch k.Value {
			case "nats":
				errs = append(errs, unknownKeys(name, "nats.", v, "url", "creds", "ca_file", "cert_file", "key_file")...)
			case "http":
				errs = append(errs, unknownKeys(name, "http.", v, "listen", "public_url")...)
			case "slack":
				c.Slack = v
			case "email":
				c.Email = v
			case "webhooks":
				c.Webhooks = v
			}
		}
		if err := root.Decode(c); err != nil {
			return nil, yamlError(name, 0, "", err)
		}
	}
	if c.NATS.URL == "" {
		c.NATS.URL = DefaultNATS
	}
	if c.Policy == "" {
		errs = append(errs, fmt.Errorf("%s: policy: missing: the policy file the brokers use, for its principals (who is who on each channel) and its rules' approvers", name))
	}
	if c.HTTP.Listen == "" {
		c.HTTP.Listen = DefaultListen
	}
	if _, _, err := net.SplitHostPort(c.HTTP.Listen); err != nil {
		errs = append(errs, fmt.Errorf("%s: http.listen %q: want host:port, such as 127.0.0.1:8090", name, c.HTTP.Listen))
	}
	if c.HTTP.PublicURL == "" {
		c.HTTP.PublicURL = "http://" + c.HTTP.Listen
	}
	c.HTTP.PublicURL = strings.TrimRight(c.HTTP.PublicURL, "/")
	c.WebUI = strings.TrimRight(c.WebUI, "/")
	for field, v := range map[string]string{"http.public_url": c.HTTP.PublicURL, "web_ui": c.WebUI} {
		if v == "" {
			continue
		}
		if u, err := url.Parse(v); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			errs = append(errs, fmt.Errorf("%s: %s %q: want an http(s) URL", name, field, v))
		}
	}
	c.Remind = DefaultRemind
	if c.RemindText != "" {
		d, err := time.ParseDuration(c.RemindText)
		if c.RemindText == "0" {
			d, err = 0, nil
		}
		if err != nil || d < 0 {
			errs = append(errs, fmt.Errorf("%s: remind %q: want a duration such as 2m, or 0 for no reminders", name, c.RemindText))
		}
		c.Remind = d
	}
	for _, a := range c.Agents {
		if err := events.CheckToken("agent", a); err != nil {
			errs = append(errs, fmt.Errorf("%s: agents: %w", name, err))
		}
	}
	if len(c.TrustedDecisionKeys) > 0 {
		t, err := events.NewTrustedKeys(c.TrustedDecisionKeys...)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: trusted_decision_keys: %w", name, err))
		}
		c.Trusted = t
	}
	if c.Slack == nil && c.Email == nil && c.Webhooks == nil {
		errs = append(errs, fmt.Errorf("%s: no channel configured: add a slack, email or webhooks section (docs/channels.md)", name))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return c, nil
}

// Section decodes a channel's section into v, refusing unknown fields, with
// errors at their lines in the whole file.
func (c *Config) Section(name string, n *yaml.Node, v any) error {
	var buf bytes.Buffer
	if err := yaml.NewEncoder(&buf).Encode(n); err != nil {
		return fmt.Errorf("%s: %s: %w", c.File, name, err)
	}
	dec := yaml.NewDecoder(&buf)
	dec.KnownFields(true)
	if err := dec.Decode(v); err != nil && !errors.Is(err, io.EOF) {
		return yamlError(c.File, n.Line-1, name+": ", err)
	}
	return nil
}

// unknownKeys reports the keys of mapping n not among known, each at its line.
func unknownKeys(file, path string, n *yaml.Node, known ...string) []error {
	if n.Kind != yaml.MappingNode {
		if path == "" {
			return []error{fmt.Errorf("%s:%d: want a mapping of settings", file, n.Line)}
		}
		return []error{fmt.Errorf("%s:%d: %s: want a mapping", file, n.Line, strings.TrimSuffix(path, "."))}
	}
	var errs []error
	for i := 0; i+1 < len(n.Content); i += 2 {
		if k := n.Content[i]; !slices.Contains(known, k.Value) {
			errs = append(errs, fmt.Errorf("%s:%d: unknown setting %s%s (known: %s)", file, k.Line, path, k.Value, strings.Join(known, ", ")))
		}
	}
	return errs
}

var yamlLine = regexp.MustCompile(`^line (\d+): (.*)$`)

// yamlError reports a YAML error as file:line: problems, one per line, with
// line numbers moved by offset (for a section decoded on its own).
func yamlError(file string, offset int, prefix string, err error) error {
	var msgs []string
	var te *yaml.TypeError
	if errors.As(err, &te) {
		msgs = te.Errors
	} else {
		msgs = []string{strings.TrimPrefix(err.Error(), "yaml: ")}
	}
	errs := make([]error, len(msgs))
	for i, m := range msgs {
		if g := yamlLine.FindStringSubmatch(m); g != nil {
			n, _ := strconv.Atoi(g[1])
			errs[i] = fmt.Errorf("%s:%d: %s%s", file, n+offset, prefix, g[2])
			continue
		}
		errs[i] = fmt.Errorf("%s: %s%s", file, prefix, m)
	}
	return errors.Join(errs...)
}

// fieldLine returns the line of the setting at path (dotted, with [i] for
// list items: "routes[1].rule") inside section n, or of the deepest part of
// it the section has; n's own line when it has none.
func fieldLine(n *yaml.Node, path string) int {
	line := n.Line
	cur := n
	for part := range strings.SplitSeq(path, ".") {
		name, index, hasIndex := part, 0, false
		if i := strings.IndexByte(part, '['); i >= 0 && strings.HasSuffix(part, "]") {
			idx, err := strconv.Atoi(part[i+1 : len(part)-1])
			if err == nil {
				name, index, hasIndex = part[:i], idx, true
			}
		}
		next := (*yaml.Node)(nil)
		if cur.Kind == yaml.MappingNode {
			for i := 0; i+1 < len(cur.Content); i += 2 {
				if cur.Content[i].Value == name {
					line, next = cur.Content[i].Line, cur.Content[i+1]
					break
				}
			}
		}
		if next == nil {
			return line
		}
		if hasIndex {
			if next.Kind != yaml.SequenceNode || index >= len(next.Content) {
				return line
			}
			next = next.Content[index]
			line = next.Line
		}
		cur = next
	}
	return line
}

// fieldError is a channel's problem with one of its settings, named by its
// path in the section (Field), as the channels' own FieldError types are.
type fieldError interface {
	error
	FieldPath() string
}

// sectionErrors reports err, a channel's refusal of its section n, as
// file:line problems: each at the line of the setting it names when it
// names one (fieldError), else at the section's.
func sectionErrors(file, name string, n *yaml.Node, err error) error {
	var out []error
	var walk func(error)
	walk = func(e error) {
		if fe, ok := e.(fieldError); ok {
			out = append(out, fmt.Errorf("%s:%d: %s: %w", file, fieldLine(n, fe.FieldPath()), name, e))
			return
		}
		if j, ok := e.(interface{ Unwrap() []error }); ok {
			for _, inner := range j.Unwrap() {
				if !isSentinel(inner) {
					walk(inner)
				}
			}
			return
		}
		out = append(out, fmt.Errorf("%s:%d: %s: %w", file, n.Line, name, e))
	}
	walk(err)
	return errors.Join(out...)
}
