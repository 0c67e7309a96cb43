//go:build containers && unix

package ops

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/assent-dev/assent/integration/itest"
	"github.com/assent-dev/assent/internal/app"
	"github.com/assent-dev/assent/internal/broker"
	"github.com/assent-dev/assent/pkg/events"
	"github.com/assent-dev/assent/pkg/handler"
)

// TestUpgrade runs docs/deploy.md's upgrade runbook on the compose stack:
// the stack up at previousRelease's images (built from that commit's tree)
// with requests decided, pending and about to expire; a backup taken by the
// previous release; the brokers rolled to this tree's images one at a time,
// a request made and one answered while the two replicas run different
// releases, then the approver bot; every request decided once, the pending
// one expiring on its deadline, and the record verified. Then the backup
// from before the upgrade is restored by this release into an emptied
// cluster: what was decided is decided, what was pending is pending with its
// deadline, and the stack takes requests.
func TestUpgrade(t *testing.T) {
	e := startEngine(t)
	standins(t, e)
	ctx := itest.TestCtx(t, 25*time.Minute)
	root := itest.RepoRoot()

	// The images: this tree's at dev, the previous release's from its
	// tree, built with this compose.yaml (which names IMAGE_TAG) over that
	// tree's Dockerfile and sources.
	buildStack(t, e, ctx, filepath.Join(root, "deploy", "compose", "compose.yaml"), "dev")
	tree := itest.TreeAt(t, previousRelease)
	file := filepath.Join(tree, "deploy", "compose", "compose.yaml")
	data, err := os.ReadFile(filepath.Join(root, "deploy", "compose", "compose.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, data, 0o644); err != nil {
		t.Fatal(err)
	}
	buildStack(t, e, ctx, file, previousRelease)

	s := newStack(t, e, ctx)
	s.tag = previousRelease
	s.up("the stack at " + previousRelease)
	s.versions(map[string]string{"broker-1": previousRelease, "broker-2": previousRelease})
	s.connect()

	// Before the upgrade: a request decided, two pending, one that expires
	// meanwhile (its deadline armed by the previous release).
	done := s.ask("decided before the upgrade", 0)
	s.pendingOn(done.id, 8081, 8082)
	s.answer(done.id)
	s.decided(done)
	kept := s.ask("pending across the upgrade", 0)
	between := s.ask("answered between the brokers' upgrades", 0)
	const expiry = 90 * time.Second
	expiring := s.ask("expires during the upgrade", expiry)
	s.pendingOn(kept.id, 8081, 8082)
	s.pendingOn(between.id, 8081, 8082)
	s.pendingOn(expiring.id, 8081, 8082)
	before, err := s.approval(8081, kept.id)
	if err != nil {
		t.Fatal(err)
	}
	deadline, err := s.approval(8081, expiring.id)
	if err != nil {
		t.Fatal(err)
	}

	// 1. The new release's setup.sh, again: it keeps keys, certificates,
	// the token and the secret, keeps IMAGE_TAG in .env, and makes
	// generated/backups.
	env := filepath.Join(s.dir, ".env")
	old, err := os.ReadFile(env)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(env, append([]byte("IMAGE_TAG="+previousRelease+"\n"), old...), 0o600); err != nil {
		t.Fatal(err)
	}
	s.tag = "" // from here on, .env's
	token, _ := os.ReadFile(filepath.Join(s.gen, "auth", "ops.token"))
	s.run(runbook.setup+" --broker "+itest.Binary(t, "broker"), "", "")
	again, _ := os.ReadFile(filepath.Join(s.gen, "auth", "ops.token"))
	now, _ := os.ReadFile(env)
	if string(again) != string(token) || !strings.Contains(string(now), "IMAGE_TAG="+previousRelease+"\n") || !strings.Contains(string(now), "HOST_USER=") {
		t.Errorf("setup.sh, run again, changed the token (%t) or .env: %q", string(again) != string(token), now)
	}
	// (runbook.build ran at the start, as buildStack: Compose's build
	// context is the repository, which the stack's copy is not in.)

	// 2. A backup, by the running release.
	backup := s.run(runbook.backup, "dev", "")
	m, err := app.ReadManifest(filepath.Join(s.gen, "backups", "before-dev"))
	if err != nil {
		t.Fatalf("the backup: %v\n%s", err, backup)
	}
	if m.BrokerVersion != previousRelease || len(m.Streams) == 0 || m.Streams[0].Name != events.StreamName {
		t.Fatalf("the backup's manifest: version %q, streams %+v", m.BrokerVersion, m.Streams)
	}
	t.Logf("backup by %s: %d streams, %d messages in %s", previousRelease, len(m.Streams), m.Streams[0].Messages, m.Streams[0].Name)

	// 3. The brokers, one at a time, then the bot, each healthy before the
	// next. Between the two brokers, one request is answered and another
	// made.
	s.run(runbook.roll, "dev", "broker-1")
	s.versions(map[string]string{"broker-1": "dev", "broker-2": previousRelease})
	for _, a := range []asked{kept, between, expiring} {
		s.pendingOn(a.id, 8081, 8082)
		s.waiting(a)
	}
	s.answer(between.id)
	s.decided(between)
	during := s.ask("made between the brokers' upgrades", 0)
	s.pendingOn(during.id, 8081, 8082)
	s.run(runbook.roll, "dev", "broker-2")
	s.versions(map[string]string{"broker-1": "dev", "broker-2": "dev"})
	s.run(runbook.roll, "dev", "approver-bot")
	s.run(runbook.keep, "dev", "")
	checkHealthy(t, e, s.compose)
	t.Logf("rolled to this tree's images; the deadline of %s is %s away", expiring.id, time.Until(deadline.Deadline).Round(time.Second))

	// Every request decided once: two answered, one expired on its deadline.
	for _, a := range []asked{kept, during} {
		s.pendingOn(a.id, 8081, 8082)
		s.waiting(a)
		s.answer(a.id)
		s.decided(a)
	}
	if wait := time.Until(deadline.Deadline); wait > 0 {
		time.Sleep(wait)
	}
	s.outcome(expiring, broker.StateExpired, func(d handler.Decision) bool {
		return d.Outcome == events.Expired && !d.DecidedAt.Before(deadline.Deadline)
	})
	t.Logf("audit verify:\n%s", s.run(runbook.verify, "dev", ""))

	// 4. The backup from before the upgrade, restored by this release into
	// an emptied cluster.
	s.run(runbook.down, "dev", "")
	s.run(runbook.empty, "dev", "")
	s.run(runbook.nats, "dev", "")
	t.Logf("restore:\n%s", s.run(runbook.restore, "dev", ""))
	s.run(runbook.start, "dev", "")
	checkHealthy(t, e, s.compose)
	for _, port := range []int{8081, 8082} {
		a, err := s.approval(port, done.id)
		if err != nil || a.State != broker.StateApproved {
			t.Errorf("restored, the broker at :%d shows %s for %s, decided before the backup: %v", port, a.State, done.id, err)
		}
		a, err = s.approval(port, kept.id)
		if err != nil || a.State != broker.StatePending || !a.Deadline.Equal(before.Deadline) {
			t.Errorf("restored, the broker at :%d shows %s, deadline %s for %s, pending with deadline %s at the backup: %v", port, a.State, a.Deadline, kept.id, before.Deadline, err)
		}
		a, err = s.approval(port, expiring.id)
		if err != nil || a.State != broker.StateExpired {
			t.Errorf("restored, the broker at :%d shows %s for %s, whose deadline passed: %v", port, a.State, expiring.id, err)
		}
	}
	after := s.ask("after the restore", 0)
	s.pendingOn(after.id, 8081, 8082)
	s.answer(after.id)
	s.decided(after)
	t.Logf("the backup of %s restored by this release: decided, pending and expired as they stood", previousRelease)
}

// run runs a line of the runbook as a shell would in the directory that
// holds the stack's copy of deploy/compose, NEW standing for tag and SERVICE
// for service, with the test's Compose and project for "docker compose";
// it returns the output.
func (s *stack) run(line, tag, service string) string {
	s.t.Helper()
	compose := ""
	for _, w := range s.e.compose {
		compose += "'" + w + "' "
	}
	line = strings.NewReplacer("NEW", tag, "SERVICE", service, "docker compose", compose+"-p "+composeProject).Replace(line)
	start := time.Now()
	cmd := exec.CommandContext(s.ctx, "bash", "-c", line)
	cmd.Dir = filepath.Dir(filepath.Dir(s.dir))
	cmd.Env = append(os.Environ(), s.e.env...)
	if s.tag != "" {
		cmd.Env = append(cmd.Env, "IMAGE_TAG="+s.tag)
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		s.t.Fatalf("%s: %v\n%s\n%s", line, err, out, s.logs())
	}
	s.t.Logf("%s: %s", line, time.Since(start).Round(time.Second))
	return string(out)
}

// versions checks what `broker version` prints in each service's container.
func (s *stack) versions(want map[string]string) {
	s.t.Helper()
	for svc, v := range want {
		out, err := s.compose(s.ctx, "exec", "-T", svc, "/usr/local/bin/broker", "version")
		if err != nil || !strings.Contains(out, v) {
			s.t.Errorf("%s: broker version printed %q, %v; want %s", svc, strings.TrimSpace(out), err, v)
		}
	}
}
