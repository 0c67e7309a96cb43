package bot

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/assent-dev/assent/internal/envflag"
	"github.com/assent-dev/assent/internal/testenv"
)

const cliPolicy = `version: 1
principals:
  alice: {slack: UALICE, roles: [ops]}
  ci-bot: {roles: [ops]}
rules:
  - name: deploys
    tools: [deploy]
    action: require_approval
    approvers: ["role:ops"]
`

// runMain runs Main with args and returns its exit code and output.
func runMain(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code := Main(context.Background(), "v-test", args, envflag.Env{}, &out, &errOut)
	return code, out.String(), errOut.String()
}

// TestCheck: check reads the configuration, the policy and each channel's
// secrets, connects to NATS, and says what each channel reaches; each
// problem is named with what to do.
func TestCheck(t *testing.T) {
	ns := testenv.Server(t)
	dir := t.TempDir()
	policy := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(policy, []byte(cliPolicy), 0o600); err != nil {
		t.Fatal(err)
	}
	write := func(name, src string) string {
		f := filepath.Join(dir, name)
		if err := os.WriteFile(f, []byte(src), 0o600); err != nil {
			t.Fatal(err)
		}
		return f
	}
	good := write("bot.yaml", "nats: {url: "+ns.ClientURL()+"}\npolicy: "+policy+`
webhooks:
  inbound: [{name: ci, secret_env: CHECK_HOOK_CI, principal: ci-bot}]
slack:
  channel: C1
  bot_token_env: CHECK_SLACK_BOT
  signing_secret_env: CHECK_SLACK_SECRET
`)
	t.Setenv("CHECK_HOOK_CI", "whsec_"+strings.Repeat("QUJD", 8))
	t.Setenv("CHECK_SLACK_BOT", "xoxb-1")
	t.Setenv("CHECK_SLACK_SECRET", "s3cret")
	code, out, errOut := runMain(t, "check", "--config", good)
	if code != ExitOK || !strings.Contains(out, "slack: ok, reaches 1 principal(s): alice") || !strings.Contains(out, "webhook: ok") || !strings.Contains(out, good+": ok (policy") {
		t.Fatalf("check: %d\n%s%s", code, out, errOut)
	}

	t.Setenv("CHECK_SLACK_BOT", "")
	code, _, errOut = runMain(t, "check", "--config", good)
	if code != ExitError || !strings.Contains(errOut, "CHECK_SLACK_BOT") {
		t.Fatalf("check without the Slack token: %d\n%s", code, errOut)
	}

	noNATS := write("nonats.yaml", "nats: {url: nats://127.0.0.1:1}\npolicy: "+policy+"\nwebhooks:\n  inbound: [{name: ci, secret_env: CHECK_HOOK_CI, principal: ci-bot}]\n")
	code, _, errOut = runMain(t, "check", "--config", noNATS)
	if code != ExitError || !strings.Contains(errOut, "connect to NATS at nats://127.0.0.1:1") || !strings.Contains(errOut, "is the server running?") {
		t.Fatalf("check without NATS: %d\n%s", code, errOut)
	}

	badPolicy := write("badpolicy.yaml", "policy: "+filepath.Join(dir, "missing.yaml")+"\nwebhooks:\n  inbound: []\n")
	if code, _, errOut = runMain(t, "check", "--config", badPolicy); code != ExitError || !strings.Contains(errOut, "missing.yaml") {
		t.Fatalf("check with a missing policy: %d\n%s", code, errOut)
	}
}

// TestMainUsage: a wrong command line prints what is wrong and the usage,
// with exit code 2.
func TestMainUsage(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{nil, "Usage:"},
		{[]string{"launch"}, `unknown command "launch"`},
		{[]string{"run"}, "missing --config FILE"},
		{[]string{"check", "--config", "x.yaml", "extra"}, `unexpected arguments ["extra"]`},
		{[]string{"cli"}, "missing --principal"},
		{[]string{"webhooks"}, "want a subcommand: log"},
		{[]string{"run", "--nope"}, "flag provided but not defined: -nope"},
	} {
		code, _, errOut := runMain(t, c.args...)
		if code != ExitUsage || !strings.Contains(errOut, c.want) {
			t.Errorf("%q: exit %d, stderr:\n%s\nwant exit %d and %q", c.args, code, errOut, ExitUsage, c.want)
		}
	}
	if code, out, _ := runMain(t, "version"); code != ExitOK || out != "assent approver-bot v-test\n" {
		t.Errorf("version: %d %q", code, out)
	}
	if code, out, _ := runMain(t, "help"); code != ExitOK || !strings.Contains(out, "approver-bot run --config FILE") {
		t.Errorf("help: %d %q", code, out)
	}
}

// TestCheckFromEnvironment: check takes its configuration's path from
// ASSENT_CONFIG, or from the file ASSENT_CONFIG_FILE names; the command line
// wins; both variables at once, or one that names no flag, are reported.
func TestCheckFromEnvironment(t *testing.T) {
	ns := testenv.Server(t)
	dir := t.TempDir()
	write := func(name, src string) string {
		f := filepath.Join(dir, name)
		if err := os.WriteFile(f, []byte(src), 0o600); err != nil {
			t.Fatal(err)
		}
		return f
	}
	policy := write("policy.yaml", cliPolicy)
	good := write("bot.yaml", "nats: {url: "+ns.ClientURL()+"}\npolicy: "+policy+"\nwebhooks:\n  inbound: [{name: ci, secret_env: ENV_HOOK_CI, principal: ci-bot}]\n")
	t.Setenv("ENV_HOOK_CI", "whsec_"+strings.Repeat("QUJD", 8))
	run := func(vars map[string]string, args ...string) (int, string, string) {
		t.Helper()
		var out, errOut bytes.Buffer
		code := Main(context.Background(), "v-test", args, envflag.Map(vars), &out, &errOut)
		return code, out.String(), errOut.String()
	}

	code, out, errOut := run(map[string]string{"ASSENT_CONFIG": good, "ASSENT_CONFG": "typo"}, "check")
	if code != ExitOK || !strings.Contains(out, good+": ok (policy") {
		t.Fatalf("check with ASSENT_CONFIG: %d\n%s%s", code, out, errOut)
	}
	if want := "approver-bot check: warning: ASSENT_CONFG names no flag of any of Assent's programs; it is ignored (did you mean ASSENT_CONFIG, for --config?)\n"; errOut != want {
		t.Errorf("stderr %q, want %q", errOut, want)
	}

	pathFile := write("config-path", good+"\n")
	if code, out, errOut = run(map[string]string{"ASSENT_CONFIG_FILE": pathFile}, "check"); code != ExitOK || !strings.Contains(out, good+": ok (policy") {
		t.Fatalf("check with ASSENT_CONFIG_FILE: %d\n%s%s", code, out, errOut)
	}

	missing := filepath.Join(dir, "missing.yaml")
	if code, out, errOut = run(map[string]string{"ASSENT_CONFIG": missing}, "check", "--config", good); code != ExitOK {
		t.Fatalf("--config did not win over ASSENT_CONFIG: %d\n%s%s", code, out, errOut)
	}
	if code, _, errOut = run(map[string]string{"ASSENT_CONFIG": missing}, "check"); code != ExitError || !strings.Contains(errOut, "missing.yaml") {
		t.Fatalf("check with ASSENT_CONFIG naming a missing file: %d\n%s", code, errOut)
	}
	if code, _, errOut = run(map[string]string{"ASSENT_CONFIG": good, "ASSENT_CONFIG_FILE": pathFile}, "check"); code != ExitUsage ||
		!strings.Contains(errOut, "both ASSENT_CONFIG and ASSENT_CONFIG_FILE are set, for --config: unset one") || !strings.Contains(errOut, "-config file") {
		t.Fatalf("check with both: %d\n%s", code, errOut)
	}
	if code, _, errOut = run(map[string]string{"ASSENT_LOG_JSON": "yes"}, "run"); code != ExitUsage ||
		!strings.Contains(errOut, "ASSENT_LOG_JSON, for --log-json: want true or false") {
		t.Fatalf("run with a bad ASSENT_LOG_JSON: %d\n%s", code, errOut)
	}
}
