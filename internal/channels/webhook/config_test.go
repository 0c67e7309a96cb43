package webhook_test

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"gopkg.in/yaml.v3"

	"github.com/assent-dev/assent/internal/channels"
	"github.com/assent-dev/assent/internal/channels/webhook"
	"github.com/assent-dev/assent/pkg/handler"
)

// TestConfigYAML: the configuration reads as documented in docs/channels.md, with
// unknown settings refused the way the bot reads its sections.
func TestConfigYAML(t *testing.T) {
	src := `
endpoints:
  - name: audit-sink
    url: https://audit.example.com/assent
    secret_env: AUDIT_WEBHOOK_SECRET
    timeout: 3s
  - name: pager
    url: https://pager.example.com/hooks/assent
    secret_env: PAGER_WEBHOOK_SECRET
    types: [pending, escalated, dev.assent.approval.decided]
    agents: [deployer, billing]
inbound:
  - name: ci
    secret_env: CI_WEBHOOK_SECRET
    principal: ci-bot
`
	var cfg webhook.Config
	dec := yaml.NewDecoder(strings.NewReader(src))
	dec.KnownFields(true)
	if err := dec.Decode(&cfg); err != nil {
		t.Fatal(err)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	if ep := cfg.Endpoints[0]; ep.Timeout != 3*time.Second || ep.SecretEnv != "AUDIT_WEBHOOK_SECRET" {
		t.Fatalf("endpoint 0: %+v", ep)
	}
	if ep := cfg.Endpoints[1]; len(ep.Types) != 3 || !slices.Equal(ep.Agents, []string{"deployer", "billing"}) {
		t.Fatalf("endpoint 1: %+v", ep)
	}
	if in := cfg.Inbound[0]; in.Name != "ci" || in.Principal != "ci-bot" {
		t.Fatalf("inbound: %+v", in)
	}
	dec = yaml.NewDecoder(strings.NewReader("endpoints:\n  - name: x\n    secret: whsec_abc\n"))
	dec.KnownFields(true)
	if err := dec.Decode(&cfg); err == nil || !strings.Contains(err.Error(), "field secret not found") {
		t.Fatalf("an unknown setting: %v", err)
	}
}

// TestNewErrors: New reports every problem at once, each naming its setting
// and what to do.
func TestNewErrors(t *testing.T) {
	good, _ := newSecret(t)
	t.Setenv("WH_GOOD", good)
	t.Setenv("WH_SHORT", "whsec_c2hvcnQ=")
	t.Setenv("WH_GARBAGE", "whsec_***")
	env := channels.Env{NATS: &nats.Conn{}}
	ep := func(f func(*webhook.Endpoint)) webhook.Config {
		e := webhook.Endpoint{Name: "sink", URL: "https://example.com/hook", SecretEnv: "WH_GOOD"}
		f(&e)
		return webhook.Config{Endpoints: []webhook.Endpoint{e}}
	}
	in := func(f func(*webhook.Inbound)) webhook.Config {
		i := webhook.Inbound{Name: "ci", SecretEnv: "WH_GOOD", Principal: "ci-bot"}
		f(&i)
		return webhook.Config{Inbound: []webhook.Inbound{i}}
	}
	for _, c := range []struct {
		name string
		cfg  webhook.Config
		env  channels.Env
		want []string // substrings of the error; none: no error
		is   error
	}{
		{"valid endpoint", ep(func(*webhook.Endpoint) {}), env, nil, nil},
		{"valid inbound", in(func(*webhook.Inbound) {}), env, nil, nil},
		{"nothing", webhook.Config{}, env, []string{"nothing configured"}, nil},
		{"no NATS", ep(func(*webhook.Endpoint) {}), channels.Env{}, []string{"no NATS connection"}, nil},
		{"endpoint name missing", ep(func(e *webhook.Endpoint) { e.Name = "" }), env, []string{"endpoints[0]: name: missing"}, nil},
		{"endpoint name not a token", ep(func(e *webhook.Endpoint) { e.Name = "a.b" }), env, []string{`name "a.b"`}, nil},
		{"endpoint url missing", ep(func(e *webhook.Endpoint) { e.URL = "" }), env, []string{"url: missing"}, nil},
		{"endpoint url relative", ep(func(e *webhook.Endpoint) { e.URL = "/hook" }), env, []string{"want an absolute http or https URL"}, nil},
		{"endpoint url ftp", ep(func(e *webhook.Endpoint) { e.URL = "ftp://example.com/?key=s3cret" }), env, []string{"absolute http or https"}, nil},
		{"unknown type", ep(func(e *webhook.Endpoint) { e.Types = []string{"pending", "approved"} }), env, []string{`unknown event type "approved"`, "requested, pending, escalated"}, nil},
		{"bad agent", ep(func(e *webhook.Endpoint) { e.Agents = []string{"a b"} }), env, []string{`agents: "a b"`}, nil},
		{"negative timeout", ep(func(e *webhook.Endpoint) { e.Timeout = -time.Second }), env, []string{"timeout -1s"}, nil},
		{"secret env unset", ep(func(e *webhook.Endpoint) { e.SecretEnv = "WH_UNSET" }), env, []string{"WH_UNSET is not set", "openssl rand"}, nil},
		{"secret too short", ep(func(e *webhook.Endpoint) { e.SecretEnv = "WH_SHORT" }), env, []string{"WH_SHORT", "at least 24"}, webhook.ErrBadSecret},
		{"secret not base64", ep(func(e *webhook.Endpoint) { e.SecretEnv = "WH_GARBAGE" }), env, []string{"WH_GARBAGE"}, webhook.ErrBadSecret},
		{"duplicate endpoints", webhook.Config{Endpoints: []webhook.Endpoint{
			{Name: "a", URL: "https://x.example", SecretEnv: "WH_GOOD"}, {Name: "a", URL: "https://y.example", SecretEnv: "WH_GOOD"},
		}}, env, []string{"used by another endpoint"}, nil},
		{"inbound principal missing", in(func(i *webhook.Inbound) { i.Principal = "" }), env, []string{"principal: missing"}, nil},
		{"inbound secret_env missing", in(func(i *webhook.Inbound) { i.SecretEnv = "" }), env, []string{"inbound[0] (ci): secret_env: missing"}, nil},
		{"inbound name bad", in(func(i *webhook.Inbound) { i.Name = "c/i" }), env, []string{`name "c/i"`}, nil},
		{"every problem at once", webhook.Config{
			Endpoints: []webhook.Endpoint{{Name: "a"}},
			Inbound:   []webhook.Inbound{{Name: "b"}},
		}, env, []string{"url: missing", "endpoints[0] (a): secret_env: missing", "inbound[0] (b): secret_env: missing", "principal: missing"}, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			a, err := webhook.New(c.cfg, c.env)
			if len(c.want) == 0 {
				if err != nil || a == nil {
					t.Fatalf("New: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatal("New accepted it")
			}
			if c.is != nil && !errors.Is(err, c.is) {
				t.Errorf("error %v is not %v", err, c.is)
			}
			if strings.Contains(err.Error(), "s3cret") {
				t.Errorf("error shows a URL's credential: %v", err)
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
}

// TestAdapterBasics: the name, the principals reached, and the no-op
// notifier.
func TestAdapterBasics(t *testing.T) {
	s, _ := newSecret(t)
	t.Setenv("WH", s)
	a, err := webhook.New(webhook.Config{Inbound: []webhook.Inbound{
		{Name: "ci", SecretEnv: "WH", Principal: "ci-bot"},
		{Name: "ci2", SecretEnv: "WH", Principal: "ci-bot"},
		{Name: "ops", SecretEnv: "WH", Principal: "alice"},
	}}, channels.Env{NATS: &nats.Conn{}})
	if err != nil {
		t.Fatal(err)
	}
	var _ channels.Adapter = a
	if a.Name() != "webhook" || !slices.Equal(a.Reaches(), []string{"alice", "ci-bot"}) {
		t.Fatalf("Name %q, Reaches %v", a.Name(), a.Reaches())
	}
	if ref, err := a.Notify(t.Context(), handler.Notice{}); ref != nil || err != nil {
		t.Fatalf("Notify = %s, %v", ref, err)
	}
	if err := a.Resolve(t.Context(), handler.Outcome{}); err != nil {
		t.Fatalf("Resolve = %v", err)
	}
}
