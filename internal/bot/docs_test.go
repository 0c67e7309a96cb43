package bot

import (
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/assent-dev/assent/internal/channels/slack"
)

// TestDocsSlackConfigs: every bot configuration in docs/channels.md with a
// slack section parses, and its section is valid, routes included.
func TestDocsSlackConfigs(t *testing.T) {
	doc, err := os.ReadFile("../../docs/channels.md")
	if err != nil {
		t.Fatal(err)
	}
	blocks := regexp.MustCompile("(?s)```yaml\n(.*?)```").FindAllStringSubmatch(string(doc), -1)
	n := 0
	for _, b := range blocks {
		src := b[1]
		if !strings.HasPrefix(src, "policy:") || !strings.Contains(src, "\nslack:") {
			continue
		}
		n++
		c, err := ParseConfig([]byte(src), "channels.md")
		if err != nil {
			t.Errorf("%s\n%v", src, err)
			continue
		}
		var cfg slack.Config
		if err := c.Section("slack", c.Slack, &cfg); err != nil {
			t.Errorf("%s\n%v", src, err)
			continue
		}
		if err := cfg.Validate(); err != nil {
			t.Errorf("%s\n%v", src, err)
		}
	}
	if n < 3 {
		t.Fatalf("%d Slack configurations in docs/channels.md, want at least 3", n)
	}
}
