package bot

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/assent-dev/assent/internal/channels/email"
	"github.com/assent-dev/assent/internal/smtptest"
	"github.com/assent-dev/assent/internal/testenv"
)

// TestCheckEmailPlaintext: `check` refuses tls none to a mail server that is
// not on loopback, at the setting's line, unless insecure_plaintext allows
// it; then it warns, naming the line.
func TestCheckEmailPlaintext(t *testing.T) {
	ns := testenv.Server(t)
	dir := t.TempDir()
	policy := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(policy, []byte(cliPolicy), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("ASSENT_EMAIL_LINK_SECRET", strings.Repeat("s", 32))
	write := func(name, email string) string {
		f := filepath.Join(dir, name)
		src := "nats: {url: " + ns.ClientURL() + "}\npolicy: " + policy + "\nemail:\n" + email
		if err := os.WriteFile(f, []byte(src), 0o600); err != nil {
			t.Fatal(err)
		}
		return f
	}

	refused := write("refused.yaml", "  smtp:\n    host: mailpit\n    port: 1025\n    tls: none\n  from: assent@example.com\n")
	code, out, errOut := runMain(t, "check", "--config", refused)
	if want := refused + ":7: email.smtp.tls none: allowed only to a server on loopback"; code != ExitError || !strings.Contains(errOut, want) || !strings.Contains(errOut, "insecure_plaintext: true") {
		t.Fatalf("check, tls none to mailpit: %d\n%s%s\nwant %q", code, out, errOut, want)
	}

	mismatch := write("mismatch.yaml", "  smtp:\n    host: smtp.example.com\n    insecure_plaintext: true\n  from: assent@example.com\n")
	code, out, errOut = runMain(t, "check", "--config", mismatch)
	if want := mismatch + ":6: email.smtp.insecure_plaintext: only with tls: none"; code != ExitError || !strings.Contains(errOut, want) {
		t.Fatalf("check, insecure_plaintext with starttls: %d\n%s%s\nwant %q", code, out, errOut, want)
	}

	// A mail catcher off loopback, as Mailpit is in Compose: check connects to it.
	catcher := smtptest.StartPlain(t, smtptest.ExternalIP(t))
	allowed := write("allowed.yaml", fmt.Sprintf("  smtp:\n    host: %s\n    port: %d\n    tls: none\n    insecure_plaintext: true\n  from: assent@example.com\n", catcher.Host, catcher.Port))
	code, out, errOut = runMain(t, "check", "--config", allowed)
	if want := fmt.Sprintf("email: WARNING: %s:8: email.smtp.insecure_plaintext: mail goes to %s:%d unencrypted", allowed, catcher.Host, catcher.Port); code != ExitOK || !strings.Contains(out, want) || !strings.Contains(out, "email: ok") {
		t.Fatalf("check, insecure_plaintext: %d\n%s%s\nwant %q", code, out, errOut, want)
	}
}

// TestDocsMailCatcher: the mail catcher configuration of docs/channels.md
// reads with the bot's loader, passes the email channel's checks, and warns
// as the page shows.
func TestDocsMailCatcher(t *testing.T) {
	doc, err := os.ReadFile("../../docs/channels.md")
	if err != nil {
		t.Fatal(err)
	}
	block := func(fence, containing string) string {
		t.Helper()
		for _, part := range strings.Split(string(doc), "```"+fence+"\n")[1:] {
			if b, _, _ := strings.Cut(part, "```"); strings.Contains(b, containing) {
				return b
			}
		}
		t.Fatalf("docs/channels.md has no %s block with %q", fence, containing)
		return ""
	}
	c, err := ParseConfig([]byte(block("yaml", "insecure_plaintext: true")), "bot.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var cfg email.Config
	if err := c.Section("email", c.Email, &cfg); err != nil {
		t.Fatal(err)
	}
	cfg.Source = email.SourceOf(c.File, c.Email)
	if err := cfg.Validate(); err != nil {
		t.Fatalf("the documented configuration is refused: %v", err)
	}
	w := cfg.Warnings()
	if want := strings.TrimSpace(block("text", "WARNING")); len(w) != 1 || "email: WARNING: "+w[0] != want {
		t.Fatalf("warnings %q; the page shows %q", w, want)
	}
}
