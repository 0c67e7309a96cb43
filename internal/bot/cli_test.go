package bot

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/assent-dev/assent/internal/envflag"
	"github.com/assent-dev/assent/internal/slacktest"
	"github.com/assent-dev/assent/internal/smtptest"
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
// secrets, checks each channel against its own service (Slack takes the
// token and lets the bot post in its channels, the SMTP server takes the
// login, the webhook endpoints answer) and NATS, and says what each channel
// reaches; each problem is named, once, with what to do (issue 22.9).
func TestCheck(t *testing.T) {
	ns := testenv.Server(t)
	fake := slacktest.New(t, "xoxb-1", "xapp-1")
	mail := smtptest.Start(t)
	receiver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusMethodNotAllowed) }))
	t.Cleanup(receiver.Close)
	closed := httptest.NewServer(http.NotFoundHandler())
	closed.Close()
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
	config := func(name, natsURL, hook string) string {
		return write(name, "nats: {url: "+natsURL+"}\npolicy: "+policy+`
http: {public_url: "https://bot.example.com"}
webhooks:
  inbound: [{name: ci, secret_env: CHECK_HOOK_CI, principal: ci-bot}]
  endpoints: [{name: sink, url: "`+hook+`", secret_env: CHECK_HOOK_CI}]
slack:
  channel: C1
  routes: [{rule: deploys, channel: C2}]
  bot_token_env: CHECK_SLACK_BOT
  signing_secret_env: CHECK_SLACK_SECRET
  api_url: `+fake.URL()+`
email:
  smtp: {host: 127.0.0.1, port: `+strconv.Itoa(mail.Port)+`, username: `+smtptest.User+`, password_env: CHECK_SMTP_PASSWORD, ca_file: `+mail.CAFile+`}
  from: assent@example.com
  link_secret_env: CHECK_LINK_SECRET
`)
	}
	good := config("bot.yaml", ns.ClientURL(), receiver.URL)
	t.Setenv("CHECK_HOOK_CI", "whsec_"+strings.Repeat("QUJD", 8))
	t.Setenv("CHECK_SLACK_BOT", "xoxb-1")
	t.Setenv("CHECK_SLACK_SECRET", "s3cret")
	t.Setenv("CHECK_SMTP_PASSWORD", smtptest.Password)
	t.Setenv("CHECK_LINK_SECRET", strings.Repeat("k", 40))
	code, out, errOut := runMain(t, "check", "--config", good)
	for _, want := range []string{
		"slack: ok, reaches 1 principal(s): alice", "bot token accepted (team Acme, bot user UBOT)", "can post in channel C1", "can post in channel C2",
		"email: ok", "smtp 127.0.0.1:" + strconv.Itoa(mail.Port) + ": connected with STARTTLS, logged in as " + smtptest.User,
		"webhook: ok", "endpoint sink: " + receiver.URL + " answers (405 Method Not Allowed)",
		"nats: ok", good + ": ok (policy",
	} {
		if code != ExitOK || !strings.Contains(out, want) {
			t.Errorf("check lacks %q: %d\n%s%s", want, code, out, errOut)
		}
	}
	if calls := fake.Calls("conversations.info"); len(calls) != 2 {
		t.Errorf("conversations.info called %d times, want once for each channel", len(calls))
	}

	// Everything wrong at once: each reported, with what to do, and the
	// channels checked though NATS does not answer.
	t.Setenv("CHECK_SLACK_BOT", "xoxb-wrong")
	t.Setenv("CHECK_SMTP_PASSWORD", "wrong")
	bad := config("bad.yaml", "nats://127.0.0.1:1", closed.URL)
	code, out, errOut = runMain(t, "check", "--config", bad)
	for _, want := range []string{
		"slack: Slack refused the bot token in CHECK_SLACK_BOT (invalid_auth)",
		"email: smtp 127.0.0.1:" + strconv.Itoa(mail.Port) + ":", "check smtp.username and the password in CHECK_SMTP_PASSWORD",
		"webhooks: endpoint sink: " + closed.URL, "connection refused",
		"nats: connect to NATS at nats://127.0.0.1:1", "is the server running?",
	} {
		if code != ExitError || !strings.Contains(errOut, want) {
			t.Errorf("check lacks %q: %d\n%s%s", want, code, out, errOut)
		}
	}
	if strings.Contains(errOut, "slack: slack:") {
		t.Errorf("doubled prefix:\n%s", errOut)
	}

	// A channel the app is not in, and one that does not exist.
	t.Setenv("CHECK_SLACK_BOT", "xoxb-1")
	t.Setenv("CHECK_SMTP_PASSWORD", smtptest.Password)
	fake.Fail("C1", "not_in_channel")
	fake.Fail("C2", "channel_not_found")
	code, _, errOut = runMain(t, "check", "--config", good)
	for _, want := range []string{"slack: channel C1: cannot post: not_in_channel: invite the app", "channel C2: cannot post: channel_not_found"} {
		if code != ExitError || !strings.Contains(errOut, want) {
			t.Errorf("check lacks %q: %d\n%s", want, code, errOut)
		}
	}
	fake.Fail("C1", "")
	fake.Fail("C2", "")

	t.Setenv("CHECK_SLACK_BOT", "")
	code, _, errOut = runMain(t, "check", "--config", good)
	if code != ExitError || !strings.Contains(errOut, "CHECK_SLACK_BOT") {
		t.Fatalf("check without the Slack token: %d\n%s", code, errOut)
	}

	badPolicy := write("badpolicy.yaml", "policy: "+filepath.Join(dir, "missing.yaml")+"\nwebhooks:\n  inbound: []\n")
	if code, _, errOut = runMain(t, "check", "--config", badPolicy); code != ExitError || !strings.Contains(errOut, "missing.yaml") {
		t.Fatalf("check with a missing policy: %d\n%s", code, errOut)
	}
}

// TestRunWrongSlackToken: run stops when Slack refuses the bot token,
// saying so once (not "slack: slack:") (issue 22.9).
func TestRunWrongSlackToken(t *testing.T) {
	ns := testenv.Server(t)
	fake := slacktest.New(t, "xoxb-1", "xapp-1")
	dir := t.TempDir()
	policy := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(policy, []byte(cliPolicy), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("RUN_SLACK_BOT", "xoxb-wrong")
	t.Setenv("RUN_SLACK_SECRET", "s3cret")
	f := filepath.Join(dir, "bot.yaml")
	src := "nats: {url: " + ns.ClientURL() + "}\npolicy: " + policy + "\nhttp: {listen: \"127.0.0.1:0\"}\nslack:\n  channel: C1\n  bot_token_env: RUN_SLACK_BOT\n  signing_secret_env: RUN_SLACK_SECRET\n  api_url: " + fake.URL() + "\n"
	if err := os.WriteFile(f, []byte(src), 0o600); err != nil {
		t.Fatal(err)
	}
	code, _, errOut := runMain(t, "run", "--config", f, "--log-level", "error")
	if code != ExitError || !strings.Contains(errOut, "approver-bot run: slack: Slack refused the bot token in RUN_SLACK_BOT (invalid_auth)") || strings.Contains(errOut, "slack: slack:") {
		t.Fatalf("run with a wrong token: %d\n%s", code, errOut)
	}
}

// TestCheckSlackRoutes: the Slack section's routes are checked, each
// problem at its line of the file (issue 22.12).
func TestCheckSlackRoutes(t *testing.T) {
	ns := testenv.Server(t)
	dir := t.TempDir()
	policy := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(policy, []byte(cliPolicy), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("ROUTES_SLACK_BOT", "xoxb-1")
	t.Setenv("ROUTES_SLACK_SECRET", "s3cret")
	src := "nats: {url: " + ns.ClientURL() + "}\npolicy: " + policy + `
slack:
  bot_token_env: ROUTES_SLACK_BOT
  signing_secret_env: ROUTES_SLACK_SECRET
  routes:
    - {rule: deploys, channel: C2}
    - rule: deploy
      channel: "#ops"
    - {agent: coder}
    - {agent: coder, dm: true}
`
	f := filepath.Join(dir, "bot.yaml")
	if err := os.WriteFile(f, []byte(src), 0o600); err != nil {
		t.Fatal(err)
	}
	code, _, errOut := runMain(t, "check", "--config", f)
	for _, want := range []string{
		f + ":4: slack: channel: missing",
		f + ":8: slack: routes[1].rule \"deploy\": the policy has no such rule (its rules: deploys)",
		f + ":9: slack: routes[1].channel \"#ops\": want the channel's id",
		f + ":10: slack: routes[2]: says nowhere to send the requests",
		f + ":11: slack: routes[3]: matches the same requests as routes[2]",
	} {
		if code != ExitError || !strings.Contains(errOut, want) {
			t.Errorf("check lacks %q: %d\n%s", want, code, errOut)
		}
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
