package creds_test

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/assent-dev/assent/internal/creds"
)

// TestSecurityDocPermissions: the subjects docs/security.md lists for each
// role are exactly those the credentials carry.
func TestSecurityDocPermissions(t *testing.T) {
	doc, err := os.ReadFile("../../docs/security.md")
	if err != nil {
		t.Fatal(err)
	}
	blocks := regexp.MustCompile("(?s)```permissions ([a-z-]+) (\\S+)\n(.*?)```").FindAllStringSubmatch(string(doc), -1)
	if len(blocks) != 4 {
		t.Fatalf("docs/security.md has %d permissions blocks, want 4", len(blocks))
	}
	lines := func(pub, sub []string) []string {
		var out []string
		for _, s := range pub {
			out = append(out, "pub "+s)
		}
		for _, s := range sub {
			out = append(out, "sub "+s)
		}
		slices.Sort(out)
		return out
	}
	for _, b := range blocks {
		role, name := b[1], b[2]
		listed := strings.Split(strings.TrimSpace(b[3]), "\n")
		slices.Sort(listed)
		var want []string
		switch role {
		case "agent", "approver", "private-agent":
			who := creds.Identity{Role: creds.Role(role), Name: name}
			if role == "private-agent" {
				who = creds.Identity{Role: creds.RoleAgent, Name: name, Private: true}
			}
			p, err := who.Permissions()
			if err != nil {
				t.Fatal(err)
			}
			want = lines(p.Pub.Allow, p.Sub.Allow)
		case "bot-extra":
			p, err := creds.Identity{Role: creds.RoleBot, Name: "bot", Principals: []string{"P"}}.Permissions()
			if err != nil {
				t.Fatal(err)
			}
			for _, l := range lines(p.Pub.Allow, p.Sub.Allow) {
				if strings.Contains(l, name+".") || strings.HasSuffix(l, name) || strings.Contains(l, "$KV.assent-channels.") || strings.Contains(l, "assent-bot.") {
					want = append(want, l)
				}
			}
		default:
			t.Fatalf("unknown block %q", role)
		}
		if !slices.Equal(listed, want) {
			t.Errorf("docs/security.md, %s %s:\nlisted %q\nissued %q", role, name, listed, want)
		}
	}
}
