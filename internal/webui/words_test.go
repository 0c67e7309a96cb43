package webui_test

import (
	"context"
	"encoding/json"
	"html"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/assent-dev/assent/internal/webui"
	"github.com/assent-dev/assent/pkg/events"
)

// visibleText is what a page shows: its markup without tags and attributes
// (tooltips are not shown on phones), unescaped, spaces collapsed.
func visibleText(page string) string {
	page = regexp.MustCompile(`(?s)<[^>]*>`).ReplaceAllString(page, " ")
	return strings.Join(strings.Fields(html.UnescapeString(page)), " ")
}

// TestCardSaysWhoMayApproveInWords: who may approve, how many must, and
// what happens at the deadline are written on the card in plain words, not
// in the policy's syntax and not only in a tooltip.
func TestCardSaysWhoMayApproveInWords(t *testing.T) {
	s := newSiteWith(t, strings.Replace(testPolicy, "  - name: rest\n", `  - name: two
    tools: [deploy]
    action: require_approval
    approvers: [alice, bob]
    quorum: 2
  - name: rest
`, 1), false, 0)
	other := newSiteWith(t, "version: 1\nmode: manual\n", false, 0)
	for _, tc := range []struct {
		s     *site
		tool  string
		wants []string
	}{
		{s, "wire_money", []string{"Only bob may approve", "Rule payments"}},
		{s, "write_file", []string{"Anyone with role ops may approve", "Rule rest"}},
		{s, "deploy", []string{"Needs 2 of: alice, bob", "0 so far", "Rule two"}},
		{other, "write_file", []string{"Anyone may approve", "No rule matched this call, so the policy asks a person."}},
	} {
		rec := tc.s.submit(t, events.Requested{Tool: tc.tool, Args: json.RawMessage(`{"a":1}`)})
		_, body, _ := tc.s.get(t, "", "/ui/cards/"+rec.ID)
		text := visibleText(body)
		for _, want := range append(tc.wants, "then denied if nobody answers") {
			if !strings.Contains(text, want) {
				t.Errorf("%s: the card does not say %q:\n%s", tc.tool, want, text)
			}
		}
		for _, jargon := range []string{"approvers:", "mode:manual", "role:ops"} {
			if strings.Contains(text, jargon) {
				t.Errorf("%s: the card says %q:\n%s", tc.tool, jargon, text)
			}
		}
	}
}

// TestHistoryMarksEditedApprovals: an approval made with arguments an
// approver changed is marked so in the history.
func TestHistoryMarksEditedApprovals(t *testing.T) {
	s := newSite(t, false, 0)
	edited := s.submit(t, events.Requested{Tool: "write_file", Args: json.RawMessage(`{"path":"/etc/passwd"}`)})
	plain := s.submit(t, events.Requested{Tool: "write_file", Args: json.RawMessage(`{"path":"/tmp/a"}`)})
	if _, err := s.b.Respond(context.Background(), "alice", edited.ID, events.Responded{Decision: events.Approve, Args: json.RawMessage(`{"path":"/tmp/passwd"}`)}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.b.Respond(context.Background(), "alice", plain.ID, events.Responded{Decision: events.Approve}); err != nil {
		t.Fatal(err)
	}
	var body string
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		_, body, _ = s.get(t, "", "/history")
		if strings.Contains(body, edited.ID) && strings.Contains(body, plain.ID) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the history lacks the decisions:\n%s", body)
		}
	}
	row := func(id string) string {
		i := strings.Index(body, id)
		return body[strings.LastIndex(body[:i], "<tr>"):][:strings.Index(body[strings.LastIndex(body[:i], "<tr>"):], "</tr>")]
	}
	if !strings.Contains(visibleText(row(edited.ID)), "edited args") {
		t.Errorf("the edited approval is not marked:\n%s", row(edited.ID))
	}
	if strings.Contains(row(plain.ID), "edited") {
		t.Errorf("an approval as asked is marked edited:\n%s", row(plain.ID))
	}
	// Its page shows which argument the approver changed.
	_, page, _ := s.get(t, "", "/approvals/"+edited.ID)
	if text := visibleText(page); !strings.Contains(text, "approved by alice with edited arguments") || !strings.Contains(text, "The arguments approved: path changed /tmp/passwd") {
		t.Errorf("the page does not show the changed argument:\n%s", text)
	}
}

// TestEditedArgumentsMarked: of edited arguments, those not as the agent
// asked are marked changed, and those left out are named.
func TestEditedArgumentsMarked(t *testing.T) {
	s := newSite(t, false, 0)
	rec := s.submit(t, events.Requested{Tool: "send_email", Args: json.RawMessage(`{"body":"hi","to":"mallory@evil.example","cc":"x@example.com"}`)})
	if _, err := s.b.Respond(context.Background(), "alice", rec.ID, events.Responded{Decision: events.Approve, Args: json.RawMessage(`{"body":"hi","to":"billing@example.com","bcc":"audit@example.com"}`)}); err != nil {
		t.Fatal(err)
	}
	_, body, _ := s.get(t, "", "/ui/cards/"+rec.ID)
	text := visibleText(body[strings.Index(body, `<div class="outcome`):])
	for _, want := range []string{"bcc changed audit@example.com body hi to changed billing@example.com cc removed (left out by the approver)"} {
		if !strings.Contains(text, want) {
			t.Errorf("the decision does not say %q:\n%s", want, text)
		}
	}
}

// TestAnsweringAsTakesTheBrokersNames: without sign-in, the page's name
// field accepts exactly the principal names the broker does, and says the
// rule.
func TestAnsweringAsTakesTheBrokersNames(t *testing.T) {
	s := newSite(t, false, 0)
	code, body, _ := s.get(t, "", "/")
	if code != http.StatusOK {
		t.Fatalf("status %d", code)
	}
	m := regexp.MustCompile(`<input id="as"[^>]* pattern="([^"]*)"`).FindStringSubmatch(body)
	if m == nil {
		t.Fatalf("the name field has no pattern:\n%s", body)
	}
	// An <input pattern> must match the whole value.
	re, err := regexp.Compile("^(?:" + html.UnescapeString(m[1]) + ")$")
	if err != nil {
		t.Fatalf("pattern %q: %v", m[1], err)
	}
	for _, name := range []string{"alice", "Bob_2", "ops-on-call", "a", strings.Repeat("x", 128),
		"", "alice smith", "alice.b", "alice@example.com", "élise", "a/b", "a*", "a>", strings.Repeat("x", 129)} {
		if got, want := re.MatchString(name), events.ValidToken(name); got != want {
			t.Errorf("the page takes %q: %v, the broker: %v", name, got, want)
		}
	}
	if !strings.Contains(html.UnescapeString(body), webui.NameRule) {
		t.Errorf("the page does not say the rule %q", webui.NameRule)
	}
}
