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
	if len(blocks) != 5 {
		t.Fatalf("docs/security.md has %d permissions blocks, want 5", len(blocks))
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
				if strings.Contains(l, name+".") || strings.HasSuffix(l, name) || strings.Contains(l, "$KV.assent-channels.") || strings.Contains(l, "assent-bot.") || strings.Contains(l, "assent-broker.") {
					want = append(want, l)
				}
			}
		case "gateway-extra":
			// What a gateway with a principal has beyond its agent's, the
			// same over an agent's list and over a private agent's.
			agent, principal, _ := strings.Cut(name, ",")
			for i, private := range []bool{false, true} {
				gw, err := creds.Identity{Role: creds.RoleGateway, Name: "gw", Agent: agent, Principal: principal, Private: private}.Permissions()
				if err != nil {
					t.Fatal(err)
				}
				p, err := creds.Identity{Role: creds.RoleAgent, Name: agent, Private: private}.Permissions()
				if err != nil {
					t.Fatal(err)
				}
				own := lines(p.Pub.Allow, p.Sub.Allow)
				var extra []string
				for _, l := range lines(gw.Pub.Allow, gw.Sub.Allow) {
					if !slices.Contains(own, l) {
						extra = append(extra, l)
					}
				}
				if i > 0 && !slices.Equal(extra, want) {
					t.Errorf("a private gateway's extra %q, a gateway's %q", extra, want)
				}
				want = extra
			}
		default:
			t.Fatalf("unknown block %q", role)
		}
		if !slices.Equal(listed, want) {
			t.Errorf("docs/security.md, %s %s:\nlisted %q\nissued %q", role, name, listed, want)
		}
	}
}
