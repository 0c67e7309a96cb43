package bot

import (
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/assent-dev/assent/internal/broker"
	"github.com/assent-dev/assent/internal/brokertest"
	"github.com/assent-dev/assent/internal/slacktest"
	"github.com/assent-dev/assent/internal/testenv"
	"github.com/assent-dev/assent/pkg/events"
	"github.com/assent-dev/assent/pkg/handler"
	"github.com/assent-dev/assent/pkg/policy"
)

// TestHealthSaysWhyNotDelivering: a running bot whose Slack channel does
// not exist says so in its status, its metrics and the health command,
// which fails (issue 22.3).
func TestHealthSaysWhyNotDelivering(t *testing.T) {
	ns := testenv.Server(t)
	p, err := policy.Parse([]byte(cliPolicy), "policy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	brokertest.Run(t, testenv.Conn(t, ns), broker.Config{Policy: p})
	fake := slacktest.New(t, "xoxb-1", "xapp-1")
	fake.Fail("CGONE", "channel_not_found")
	dir := t.TempDir()
	policyFile := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(policyFile, []byte(cliPolicy), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("HEALTH_SLACK_BOT", "xoxb-1")
	t.Setenv("HEALTH_SLACK_SECRET", "s3cret")
	cfg, err := ParseConfig([]byte("nats: {url: "+ns.ClientURL()+"}\npolicy: "+policyFile+`
http: {listen: "127.0.0.1:0"}
slack:
  channel: CGONE
  bot_token_env: HEALTH_SLACK_BOT
  signing_secret_env: HEALTH_SLACK_SECRET
  api_url: `+fake.URL()+"\n"), "bot.yaml")
	if err != nil {
		t.Fatal(err)
	}
	b, err := New(cfg, testenv.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	addr := make(chan string, 1)
	b.Ready = func(a string) { addr <- a }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- b.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("run: %v", err)
		}
	})
	base := "http://" + <-addr

	agent, err := handler.NewClient(testenv.Conn(t, ns), handler.Config{Agent: "coder"})
	if err != nil {
		t.Fatal(err)
	}
	brokertest.Ask(t, agent, handler.Request{Requested: events.Requested{Tool: "deploy", Timeout: events.Duration(time.Minute)}})

	var errOut string
	fake.Wait(t, "health failing", func() bool {
		var code int
		code, _, errOut = runMain(t, "health", "--url", base+"/readyz")
		return code == ExitError
	})
	for _, want := range []string{"a channel cannot deliver", "slack cannot deliver to alice since", "in CGONE: channel_not_found: check that the channel id"} {
		if !strings.Contains(errOut, want) {
			t.Errorf("health lacks %q:\n%s", want, errOut)
		}
	}
	metrics := get(t, base+MetricsPath)
	for _, want := range []string{`assent_bot_channel_delivering{channel="slack"} 0`, `assent_bot_channel_problem{channel="slack",code="channel_not_found",target="CGONE"} 1`, `assent_bot_channel_principals{channel="slack"} 0`} {
		if !strings.Contains(metrics, want) {
			t.Errorf("metrics lack %s:\n%s", want, metrics)
		}
	}
}

func get(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}
