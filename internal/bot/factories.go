package bot

import (
	"context"

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
	a, err := slack.New(cfg, env)
	if err != nil {
		return nil, sectionErrors(c.File, "slack", n, err)
	}
	return a, nil
}

// isSentinel reports the errors channels wrap their configuration problems
// in, which say nothing of their own once the problems are listed.
func isSentinel(err error) bool { return err == slack.ErrConfig }

// checkSlack checks the Slack channel against Slack.
func checkSlack(ctx context.Context, _ *Config, _ *yaml.Node, a channels.Adapter) ([]string, error) {
	c, ok := a.(channels.Checker)
	if !ok {
		return nil, nil // not made: its settings are reported already
	}
	return c.Check(ctx)
}

// checkEmail checks the email channel against its SMTP server.
func checkEmail(ctx context.Context, c *Config, n *yaml.Node, _ channels.Adapter) ([]string, error) {
	var cfg email.Config
	if err := c.Section("email", n, &cfg); err != nil {
		return nil, err
	}
	return email.Check(ctx, cfg)
}

// checkWebhooks checks that the webhook endpoints answer.
func checkWebhooks(ctx context.Context, c *Config, n *yaml.Node, _ channels.Adapter) ([]string, error) {
	var cfg webhook.Config
	if err := c.Section("webhooks", n, &cfg); err != nil {
		return nil, err
	}
	return webhook.Check(ctx, cfg)
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
