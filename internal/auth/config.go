// Package auth is who calls the broker's HTTP API and web UI: API tokens
// stored as hashes, browser sessions from OIDC single sign-on or a trusted
// reverse proxy, CSRF protection, and a rate limit on failed attempts.
//
// Identities resolve to the principals of the policy (DESIGN section 6): a
// token names its principal (and the agent it may ask for, and whether it is
// an admin, who reads and cancels everything); a person signing
// in is mapped through the policy's principals by OIDC subject or verified
// email, or by the header a trusted proxy sets. The auth file is read at start
// and again when it changes, so a revoked token stops working without a
// restart.
package auth

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"regexp"
	"slices"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/assent-dev/assent/pkg/events"
)

// Errors of Parse and Load; each also matches ErrInvalid.
var (
	ErrInvalid      = errors.New("invalid auth file")
	ErrSyntax       = problemKind("syntax")
	ErrUnknownField = problemKind("unknown field")
	ErrMissing      = problemKind("missing field")
	ErrBadValue     = problemKind("bad value")
	ErrDuplicate    = problemKind("duplicate")
)

// kind is a class of problem; it matches ErrInvalid.
type kind struct{ msg string }

func problemKind(msg string) error   { return &kind{msg} }
func (k *kind) Error() string        { return k.msg }
func (k *kind) Is(target error) bool { return target == ErrInvalid }

// Problem is one problem in an auth file, at a line. It wraps its kind.
type Problem struct {
	File string
	Line int
	Msg  string
	Err  error
}

func (e *Problem) Error() string { return fmt.Sprintf("%s:%d: %s", e.File, e.Line, e.Msg) }
func (e *Problem) Unwrap() error { return e.Err }

func joinProblems(ps []*Problem) error {
	errs := make([]error, len(ps))
	for i, p := range ps {
		errs[i] = p
	}
	return errors.Join(errs...)
}

// Config is a parsed auth file.
type Config struct {
	// Tokens are the API tokens, by their hashes.
	Tokens []Token
	// OIDC, if set, signs people in with an OpenID provider.
	OIDC *OIDC
	// Proxy, if set, trusts a reverse proxy's header from some addresses.
	Proxy *Proxy
	// Sessions configures browser sessions.
	Sessions Sessions
	// Admins are principals who may read, follow and cancel every request
	// and revoke every remembered choice over HTTP, however they sign in
	// (a token, OIDC, a proxy). Answering stays with the policy.
	Admins []string
	// File is the name given to Parse.
	File string
}

// Token is an API token: only its hash is kept.
type Token struct {
	Name      string `yaml:"name"`
	Principal string `yaml:"principal,omitempty"`
	Agent     string `yaml:"agent,omitempty"`
	// Admin tokens may read, follow and cancel every request and revoke
	// every remembered choice (docs/web.md, "Who sees what").
	Admin   bool      `yaml:"admin,omitempty"`
	Hash    string    `yaml:"hash"`
	Created time.Time `yaml:"created,omitempty"`
}

// OIDC configures single sign-on with an OpenID provider.
type OIDC struct {
	Issuer          string
	ClientID        string
	ClientSecret    string // from the file, ClientSecretEnv, or ASSENT_OIDC_CLIENT_SECRET
	ClientSecretEnv string
	RedirectURL     string
	Scopes          []string
}

// Proxy configures a trusted reverse proxy that signs people in and passes
// who they are in a header.
type Proxy struct {
	Header string
	// Channel says what the header holds: "email", another identities
	// channel of the policy's principals, or "principal" (the name itself).
	Channel string
	Trusted []netip.Prefix
}

// Sessions configures browser sessions.
type Sessions struct {
	TTL    time.Duration
	Cookie string
	// Secure is "auto" (Secure cookies over TLS), "always" or "never".
	Secure string
}

// Defaults.
const (
	DefaultSessionTTL = 12 * time.Hour
	DefaultCookie     = "assent_session"
	// SecretEnv is where the OIDC client secret may come from.
	SecretEnv = "ASSENT_OIDC_CLIENT_SECRET"
)

var hashPattern = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)

// Load reads and validates the auth file at path. Every problem is reported,
// each with file:line.
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("auth file: %w", err)
	}
	return Parse(data, path)
}

// Parse reads an auth file's contents; name is used in errors.
func Parse(data []byte, name string) (*Config, error) {
	p := &parser{file: name}
	c := &Config{File: name, Sessions: Sessions{TTL: DefaultSessionTTL, Cookie: DefaultCookie, Secure: "auto"}}
	var doc yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return c, nil // an empty file: authentication on, nothing configured yet
		}
		p.add(nil, ErrSyntax, "%s", strings.TrimPrefix(err.Error(), "yaml: "))
		return nil, joinProblems(p.problems)
	}
	if len(doc.Content) == 0 {
		return c, nil
	}
	root := doc.Content[0]
	p.fields(root, "", map[string]func(*yaml.Node){
		"tokens":   func(n *yaml.Node) { c.Tokens = p.tokens(n) },
		"oidc":     func(n *yaml.Node) { c.OIDC = p.oidc(n) },
		"proxy":    func(n *yaml.Node) { c.Proxy = p.proxy(n) },
		"sessions": func(n *yaml.Node) { p.sessions(n, &c.Sessions) },
		"admins":   func(n *yaml.Node) { c.Admins = p.admins(n) },
	})
	if len(p.problems) > 0 {
		return nil, joinProblems(p.problems)
	}
	return c, nil
}

type parser struct {
	file     string
	problems []*Problem
}

func (p *parser) add(n *yaml.Node, kind error, format string, args ...any) {
	line := 1
	if n != nil && n.Line > 0 {
		line = n.Line
	}
	p.problems = append(p.problems, &Problem{File: p.file, Line: line, Msg: fmt.Sprintf(format, args...), Err: kind})
}

// fields walks a mapping, calling the handler of each known key and
// reporting unknown ones.
func (p *parser) fields(n *yaml.Node, path string, known map[string]func(*yaml.Node)) {
	if n.Kind != yaml.MappingNode {
		p.add(n, ErrBadValue, "%s: want a mapping", orTop(path))
		return
	}
	seen := map[string]bool{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		handle, ok := known[k.Value]
		switch {
		case !ok:
			p.add(k, ErrUnknownField, "%s: unknown field %q", orTop(path), k.Value)
		case seen[k.Value]:
			p.add(k, ErrDuplicate, "%s: %s given twice", orTop(path), k.Value)
		default:
			seen[k.Value] = true
			if v.Tag != "!!null" {
				handle(v)
			}
		}
	}
}

func orTop(path string) string {
	if path == "" {
		return "auth file"
	}
	return path
}

func (p *parser) str(n *yaml.Node, path string) string {
	if n.Kind != yaml.ScalarNode {
		p.add(n, ErrBadValue, "%s: want a string", path)
		return ""
	}
	return n.Value
}

func (p *parser) tokens(n *yaml.Node) []Token {
	if n.Kind != yaml.SequenceNode {
		p.add(n, ErrBadValue, "tokens: want a list")
		return nil
	}
	var out []Token
	names, hashes := map[string]int{}, map[string]int{}
	for i, item := range n.Content {
		path := fmt.Sprintf("tokens[%d]", i)
		var t Token
		p.fields(item, path, map[string]func(*yaml.Node){
			"name":      func(v *yaml.Node) { t.Name = p.str(v, path+".name") },
			"principal": func(v *yaml.Node) { t.Principal = p.str(v, path+".principal") },
			"agent":     func(v *yaml.Node) { t.Agent = p.str(v, path+".agent") },
			"hash":      func(v *yaml.Node) { t.Hash = p.str(v, path+".hash") },
			"admin": func(v *yaml.Node) {
				if err := v.Decode(&t.Admin); err != nil {
					p.add(v, ErrBadValue, "%s.admin: want true or false", path)
				}
			},
			"created": func(v *yaml.Node) {
				if err := v.Decode(&t.Created); err != nil {
					p.add(v, ErrBadValue, "%s.created: want an RFC 3339 time", path)
				}
			},
		})
		if item.Kind != yaml.MappingNode {
			continue
		}
		switch {
		case t.Name == "":
			p.add(item, ErrMissing, "%s: name: missing", path)
		case !events.ValidToken(t.Name):
			p.add(item, ErrBadValue, "%s: name %q: want 1-128 characters of A-Z a-z 0-9 _ -", path, t.Name)
		case names[t.Name] != 0:
			p.add(item, ErrDuplicate, "%s: name %q: already used by the token at line %d", path, t.Name, names[t.Name])
		default:
			names[t.Name] = item.Line
		}
		if t.Principal == "" && t.Agent == "" && !t.Admin {
			p.add(item, ErrMissing, "%s (%s): want principal (who answers), agent (who asks), admin: true (who reads and cancels everything), or a mix", path, t.Name)
		}
		for field, v := range map[string]string{"principal": t.Principal, "agent": t.Agent} {
			if v != "" && !events.ValidToken(v) {
				p.add(item, ErrBadValue, "%s (%s): %s %q: want 1-128 characters of A-Z a-z 0-9 _ -", path, t.Name, field, v)
			}
		}
		switch {
		case t.Hash == "":
			p.add(item, ErrMissing, "%s (%s): hash: missing (broker token create writes it)", path, t.Name)
		case !hashPattern.MatchString(t.Hash):
			p.add(item, ErrBadValue, "%s (%s): hash: want sha256: and 64 lower-case hex digits", path, t.Name)
		case hashes[t.Hash] != 0:
			p.add(item, ErrDuplicate, "%s (%s): the same hash as the token at line %d", path, t.Name, hashes[t.Hash])
		default:
			hashes[t.Hash] = item.Line
		}
		out = append(out, t)
	}
	return out
}

// admins reads the list of admin principals.
func (p *parser) admins(n *yaml.Node) []string {
	var out []string
	if n.Kind != yaml.SequenceNode {
		p.add(n, ErrBadValue, "admins: want a list of principals")
		return nil
	}
	for i, v := range n.Content {
		s := p.str(v, fmt.Sprintf("admins[%d]", i))
		switch {
		case s == "":
		case !events.ValidToken(s):
			p.add(v, ErrBadValue, "admins[%d] %q: want a principal: 1-128 characters of A-Z a-z 0-9 _ -", i, s)
		case slices.Contains(out, s):
			p.add(v, ErrDuplicate, "admins[%d] %q: listed twice", i, s)
		default:
			out = append(out, s)
		}
	}
	return out
}

func (p *parser) oidc(n *yaml.Node) *OIDC {
	o := &OIDC{}
	p.fields(n, "oidc", map[string]func(*yaml.Node){
		"issuer":            func(v *yaml.Node) { o.Issuer = p.str(v, "oidc.issuer") },
		"client_id":         func(v *yaml.Node) { o.ClientID = p.str(v, "oidc.client_id") },
		"client_secret":     func(v *yaml.Node) { o.ClientSecret = p.str(v, "oidc.client_secret") },
		"client_secret_env": func(v *yaml.Node) { o.ClientSecretEnv = p.str(v, "oidc.client_secret_env") },
		"redirect_url":      func(v *yaml.Node) { o.RedirectURL = p.str(v, "oidc.redirect_url") },
		"scopes": func(v *yaml.Node) {
			if err := v.Decode(&o.Scopes); err != nil {
				p.add(v, ErrBadValue, "oidc.scopes: want a list of strings")
			}
		},
	})
	for field, v := range map[string]string{"issuer": o.Issuer, "client_id": o.ClientID, "redirect_url": o.RedirectURL} {
		if v == "" && n.Kind == yaml.MappingNode {
			p.add(n, ErrMissing, "oidc.%s: missing", field)
		}
	}
	for field, v := range map[string]string{"issuer": o.Issuer, "redirect_url": o.RedirectURL} {
		if v != "" && !strings.HasPrefix(v, "https://") && !strings.HasPrefix(v, "http://") {
			p.add(n, ErrBadValue, "oidc.%s %q: want an http(s) URL", field, v)
		}
	}
	if len(o.Scopes) == 0 {
		o.Scopes = []string{"openid", "email", "profile"}
	}
	return o
}

func (p *parser) proxy(n *yaml.Node) *Proxy {
	x := &Proxy{Channel: "email"}
	p.fields(n, "proxy", map[string]func(*yaml.Node){
		"header":  func(v *yaml.Node) { x.Header = p.str(v, "proxy.header") },
		"channel": func(v *yaml.Node) { x.Channel = p.str(v, "proxy.channel") },
		"trusted": func(v *yaml.Node) {
			var list []string
			if err := v.Decode(&list); err != nil {
				p.add(v, ErrBadValue, "proxy.trusted: want a list of addresses or CIDR prefixes")
				return
			}
			for _, s := range list {
				pfx, err := netip.ParsePrefix(s)
				if err != nil {
					addr, aerr := netip.ParseAddr(s)
					if aerr != nil {
						p.add(v, ErrBadValue, "proxy.trusted: %q: want an address or a CIDR prefix such as 10.0.0.0/8", s)
						continue
					}
					pfx = netip.PrefixFrom(addr, addr.BitLen())
				}
				x.Trusted = append(x.Trusted, pfx.Masked())
			}
		},
	})
	if n.Kind == yaml.MappingNode {
		if x.Header == "" {
			p.add(n, ErrMissing, "proxy.header: missing")
		}
		if len(x.Trusted) == 0 {
			p.add(n, ErrMissing, "proxy.trusted: missing: the proxy's own addresses, the only ones whose header is believed")
		}
		if x.Channel != "principal" && !events.ValidToken(x.Channel) {
			p.add(n, ErrBadValue, "proxy.channel %q: want email, principal, or an identities channel name", x.Channel)
		}
	}
	return x
}

func (p *parser) sessions(n *yaml.Node, s *Sessions) {
	p.fields(n, "sessions", map[string]func(*yaml.Node){
		"ttl": func(v *yaml.Node) {
			d, err := time.ParseDuration(v.Value)
			if err != nil || d < time.Minute || d > 30*24*time.Hour {
				p.add(v, ErrBadValue, "sessions.ttl %q: want a duration from 1m to 720h, such as 12h", v.Value)
				return
			}
			s.TTL = d
		},
		"cookie": func(v *yaml.Node) {
			s.Cookie = p.str(v, "sessions.cookie")
			if !events.ValidToken(s.Cookie) {
				p.add(v, ErrBadValue, "sessions.cookie %q: want 1-128 characters of A-Z a-z 0-9 _ -", s.Cookie)
			}
		},
		"secure": func(v *yaml.Node) {
			switch s.Secure = p.str(v, "sessions.secure"); s.Secure {
			case "auto", "always", "never":
			default:
				p.add(v, ErrBadValue, "sessions.secure %q: want auto, always or never", s.Secure)
			}
		},
	})
}

// secret returns the OIDC client secret from the file or the environment.
func (o *OIDC) secret() string {
	if o.ClientSecret != "" {
		return o.ClientSecret
	}
	if o.ClientSecretEnv != "" {
		if v := os.Getenv(o.ClientSecretEnv); v != "" {
			return v
		}
	}
	return os.Getenv(SecretEnv)
}
