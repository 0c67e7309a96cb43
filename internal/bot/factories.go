package bot

import (
	"go.uber.org/zap"
	"gopkg.in/yaml.v3"

	"github.com/assent-dev/assent/internal/channels"
	"github.com/assent-dev/assent/internal/channels/email"
	"github.com/assent-dev/assent/internal/channels/slack"
	"github.com/assent-dev/assent/internal/channels/webhook"
)

func newSlack(c *Config, n *yaml.Node, env channels.Env) (channels.Adapter, error) {
	var cfg slack.Config
	if err := c.Section("slack", n, &cfg); err != nil {
		return nil, err
	}
	return slack.New(cfg, env)
}

func newEmail(c *Config, n *yaml.Node, env channels.Env) (channels.Adapter, error) {
	var cfg email.Config
	if err := c.Section("email", n, &cfg); err != nil {
		return nil, err
	}
	cfg.Source = email.SourceOf(c.File, n)
	return email.New(cfg, env)
}

func newWebhooks(c *Config, n *yaml.Node, env channels.Env) (channels.Adapter, error) {
	var cfg webhook.Config
	if err := c.Section("webhooks", n, &cfg); err != nil {
		return nil, err
	}
	return webhook.New(cfg, env)
}

func nopLogger() *zap.Logger { return zap.NewNop() }
