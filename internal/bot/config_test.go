package bot

import (
	"strings"
	"testing"
)

func TestConfigDefaults(t *testing.T) {
	c, err := ParseConfig([]byte("policy: policy.yaml\nwebhooks:\n  endpoints: []\n"), "bot.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if c.NATS.URL != DefaultNATS || c.HTTP.Listen != DefaultListen || c.HTTP.PublicURL != "http://"+DefaultListen || c.Remind != DefaultRemind {
		t.Fatalf("defaults: %+v remind %s", c, c.Remind)
	}
	if got := c.sections(); len(got) != 1 || got[0].name != "webhooks" {
		t.Fatalf("sections: %+v", got)
	}
}

func TestConfigErrors(t *testing.T) {
	for _, c := range []struct{ src, want string }{
		{"policy: p.yaml\nslack: {}\nsurprise: 1\n", "bot.yaml:3: unknown setting surprise"},
		{"slack: {}\n", "policy: missing"},
		{"policy: p.yaml\n", "no channel configured"},
		{"policy: p.yaml\nslack: {}\nremind: -1m\n", "remind \"-1m\""},
		{"policy: p.yaml\nslack: {}\nhttp: {listen: nowhere}\n", `http.listen "nowhere"`},
		{"policy: p.yaml\nslack: {}\nweb_ui: assent.example.com\n", `web_ui "assent.example.com": want an http(s) URL`},
		{"policy: p.yaml\nslack: {}\nagents: [\"a b\"]\n", "agents:"},
		{"policy: [\n", "bot.yaml:"},
		{"policy: p.yaml\nslack: {}\ntrusted_decision_keys: [UNOTAKEY]\n", "bot.yaml: trusted_decision_keys"},
		{"policy: p.yaml\nslack: {}\nhttp: {listen: \"127.0.0.1:1\", port: 2}\n", "bot.yaml:3: unknown setting http.port"},
	} {
		_, err := ParseConfig([]byte(c.src), "bot.yaml")
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: error %v, want %q", c.src, err, c.want)
		}
	}
}

// TestConfigSectionLines: a channel section's unknown field is reported at
// its line in the whole file.
func TestConfigSectionLines(t *testing.T) {
	src := "policy: p.yaml\nremind: 0s\nwebhooks:\n  endpoints: []\n  surprise: true\n"
	c, err := ParseConfig([]byte(src), "bot.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if c.Remind != 0 {
		t.Fatalf("remind 0s: %s", c.Remind)
	}
	var v struct {
		Endpoints []string `yaml:"endpoints"`
	}
	err = c.Section("webhooks", c.Webhooks, &v)
	if err == nil || !strings.Contains(err.Error(), "bot.yaml:5: webhooks: field surprise not found") {
		t.Fatalf("section error: %v", err)
	}
}
