package hook_test

import (
	"bytes"
	"errors"
	"flag"
	"strings"
	"testing"
	"time"

	"github.com/assent-dev/assent/internal/envflag"
	"github.com/assent-dev/assent/internal/hook"
)

// The command line selects the dialect and takes the flags, from the
// environment too; what is wrong is said in a line on stderr (the agent may
// show it to its model), not with the whole usage.
func TestParseArgs(t *testing.T) {
	for _, tc := range []struct {
		name    string
		args    []string
		env     map[string]string
		wantErr error
		stderr  string
		check   func(t *testing.T, c hook.Command)
	}{
		{name: "claude", args: []string{"claude", "--user", "carol", "--label", "team=payments", "--trust-decision-key", "ABJHLOVMPA4CI6R5KLNGOB4GSLNIY7IOUPAJC4YFNDLQVIOBYQGUWVLA"},
			check: func(t *testing.T, c hook.Command) {
				if c.Dialect.Name != "claude" || c.Config.Agent != "claude-code" || c.Config.User != "carol" || c.Config.Labels["team"] != "payments" ||
					c.Config.HookTimeout != time.Minute || c.Config.Timeout != 50*time.Second || len(c.Config.TrustedKeys) != 1 {
					t.Errorf("%+v", c)
				}
			}},
		{name: "from the environment", args: []string{"gemini"}, env: map[string]string{"ASSENT_HOOK_TIMEOUT": "5m", "ASSENT_NATS_URL": "nats://assent.internal:4222", "ASSENT_AGENT": "gemini-carol"},
			check: func(t *testing.T, c hook.Command) {
				if c.Config.HookTimeout != 5*time.Minute || c.Config.Timeout != 290*time.Second || c.Config.NATS.URL != "nats://assent.internal:4222" || c.Config.Agent != "gemini-carol" {
					t.Errorf("%+v", c.Config)
				}
			}},
		{name: "help", args: []string{"codex", "-h"}, wantErr: flag.ErrHelp, stderr: "usage: assent-hook claude|codex|gemini"},
		{name: "no command", args: nil, wantErr: hook.ErrUsage, stderr: "usage: assent-hook"},
		{name: "unknown command", args: []string{"cursor"}, wantErr: hook.ErrUsage, stderr: `assent-hook: unknown command "cursor": want one of claude, codex, gemini`},
		{name: "timeout over the hook's", args: []string{"claude", "--hook-timeout", "30s", "--timeout", "25s"}, wantErr: hook.ErrUsage,
			stderr: "assent-hook claude: --timeout 25s: want 1s up to 22s"},
		{name: "arguments", args: []string{"claude", "extra"}, wantErr: hook.ErrUsage, stderr: "unexpected arguments: extra"},
		{name: "bad label", args: []string{"claude", "--label", "novalue"}, wantErr: hook.ErrUsage, stderr: "want key=value"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stderr bytes.Buffer
			c, err := hook.ParseArgs(tc.args, envflag.Map(tc.env), &stderr)
			if tc.wantErr == nil && err != nil || tc.wantErr != nil && !errors.Is(err, tc.wantErr) {
				t.Fatalf("error %v, want %v; stderr:\n%s", err, tc.wantErr, stderr.String())
			}
			if !strings.Contains(stderr.String(), tc.stderr) {
				t.Errorf("stderr %q, want %q", stderr.String(), tc.stderr)
			}
			if tc.wantErr == hook.ErrUsage && tc.name != "no command" && tc.name != "bad label" && strings.Contains(stderr.String(), "flags:") {
				t.Errorf("the whole usage on stderr:\n%s", stderr.String())
			}
			if tc.check != nil {
				tc.check(t, c)
			}
		})
	}
}
