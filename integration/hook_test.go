package integration

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/assent-dev/assent/integration/itest"
	"github.com/assent-dev/assent/internal/broker"
	"github.com/assent-dev/assent/internal/doccheck"
	"github.com/assent-dev/assent/internal/httpapi"
	"github.com/assent-dev/assent/internal/testenv"
	"github.com/assent-dev/assent/pkg/events"
)

// hookPolicy is the coding agents' policy of docs/integrations.md.
func hookPolicy(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile(itest.RepoPath("docs/integrations.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range doccheck.Extract("docs/integrations.md", string(data)) {
		if b.Lang == "yaml" && strings.HasPrefix(b.Text, "# coding-agents.yaml\n") {
			return b.Text
		}
	}
	t.Fatal("docs/integrations.md has no coding-agents.yaml")
	return ""
}

// hookRun is one run of the built assent-hook: what it printed on each
// stream, and its exit status.
type hookRun struct {
	stdout, stderr string
	code           int
}

// startHook starts the built assent-hook with args, the recorded hook input
// file (internal/hook/testdata) on its stdin, in an environment without
// ASSENT_ variables; wait waits for it to end.
func startHook(t *testing.T, bin, input string, args ...string) (cmd *exec.Cmd, wait func() hookRun) {
	t.Helper()
	in, err := os.Open(itest.RepoPath("internal/hook/testdata/" + input))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { in.Close() })
	var stdout, stderr bytes.Buffer
	cmd = exec.Command(bin, args...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = in, &stdout, &stderr
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir()}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := testenv.Go(t, func() hookRun {
		err := cmd.Wait()
		code := 0
		if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
			code = ee.ExitCode()
		} else if err != nil {
			code = -1
		}
		return hookRun{stdout.String(), stderr.String(), code}
	})
	return cmd, func() hookRun {
		t.Helper()
		return testenv.Await(t, done, 2*itest.Patience, "assent-hook")
	}
}

// claudeAnswer reads what assent-hook claude printed: exactly one line, a
// PreToolUse answer.
func claudeAnswer(t *testing.T, r hookRun) (decision, reason string, updated json.RawMessage) {
	t.Helper()
	if r.code != 0 || strings.Count(r.stdout, "\n") != 1 || !strings.HasSuffix(r.stdout, "\n") {
		t.Fatalf("exit %d, stdout %q, want one line; stderr:\n%s", r.code, r.stdout, r.stderr)
	}
	var v struct {
		HookSpecificOutput struct {
			HookEventName            string          `json:"hookEventName"`
			PermissionDecision       string          `json:"permissionDecision"`
			PermissionDecisionReason string          `json:"permissionDecisionReason"`
			UpdatedInput             json.RawMessage `json:"updatedInput"`
		} `json:"hookSpecificOutput"`
	}
	if err := testenv.StrictJSON([]byte(r.stdout), &v); err != nil || v.HookSpecificOutput.HookEventName != "PreToolUse" {
		t.Fatalf("stdout %q: %v", r.stdout, err)
	}
	return v.HookSpecificOutput.PermissionDecision, v.HookSpecificOutput.PermissionDecisionReason, v.HookSpecificOutput.UpdatedInput
}

// pendingApproval waits for the one pending request of agent on the HTTP
// API.
func pendingApproval(t *testing.T, api, agent string) httpapi.Approval {
	t.Helper()
	var found httpapi.Approval
	itest.Eventually(t, itest.Patience, func() (bool, string) {
		r := itest.Call(t, "GET", api+"/v1/approvals?state=pending&agent="+agent, nil)
		var list struct {
			Approvals []httpapi.Approval `json:"approvals"`
		}
		if err := json.Unmarshal(r.Body, &list); err != nil || len(list.Approvals) != 1 {
			return false, string(r.Body)
		}
		found = list.Approvals[0]
		return true, ""
	})
	return found
}

// TestAssentHookBinary runs the built assent-hook as Claude Code runs its
// PreToolUse hook (the call on stdin, the answer on stdout) against a broker
// with the docs' coding agents' policy: a Bash call approved with edited
// arguments on the HTTP API runs the edit, a Read runs at once, a hook
// stopped with SIGTERM denies and withdraws its request, NATS unreachable
// and a bad command line block the call. Stdout carries the answer alone.
func TestAssentHookBinary(t *testing.T) {
	bin := itest.Binary(t, "assent-hook")
	e := itest.NewEnv(t, broker.Config{Policy: itest.MustPolicy(t, hookPolicy(t), "coding-agents.yaml")})
	args := []string{"claude", "--user", "carol", "--nats-url", e.NS.ClientURL(), "--hook-timeout", "60s", "--log-level", "info"}

	t.Run("edited", func(t *testing.T) {
		_, wait := startHook(t, bin, "claude/bash.json", args...)
		a := pendingApproval(t, e.API, "claude-code")
		if a.Request.Tool != "Bash" || a.Request.Labels["coding_agent"] != "claude-code" || a.Request.CallID != "toolu_01BashRmRf" ||
			!strings.HasPrefix(a.Request.Hint, "Claude Code wants to run `rm -rf build node_modules/.cache`") {
			t.Errorf("request %+v", a.Request)
		}
		r := itest.Call(t, "POST", e.API+"/v1/approvals/"+a.ID+"/decision",
			map[string]any{"principal": "carol", "decision": "approve", "args": map[string]any{"command": "rm -rf build", "description": "Remove build output"}})
		itest.ApprovalOf(t, r, 200)
		run := wait()
		decision, reason, updated := claudeAnswer(t, run)
		if decision != "allow" || string(updated) != `{"command":"rm -rf build","description":"Remove build output"}` ||
			!strings.Contains(reason, "Approved in Assent by carol (http) under rule coding-agent-changes with changed arguments, which are what runs") {
			t.Errorf("stdout %s", run.stdout)
		}
		if !strings.Contains(run.stderr, `"request_id": "`+a.ID+`"`) || strings.Contains(run.stderr, "hookSpecificOutput") {
			t.Errorf("stderr:\n%s", run.stderr)
		}
	})

	t.Run("read-only", func(t *testing.T) {
		_, wait := startHook(t, bin, "claude/read.json", args...)
		run := wait()
		if decision, reason, updated := claudeAnswer(t, run); decision != "allow" || updated != nil || !strings.Contains(reason, "by policy rule coding-agent-reads") {
			t.Errorf("stdout %s", run.stdout)
		}
	})

	t.Run("SIGTERM", func(t *testing.T) {
		cmd, wait := startHook(t, bin, "claude/write.json", args...)
		a := pendingApproval(t, e.API, "claude-code")
		if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		run := wait()
		if decision, reason, _ := claudeAnswer(t, run); decision != "deny" || !strings.Contains(reason, "assent-hook was stopped before Assent decided; the request was withdrawn (Assent request "+a.ID) {
			t.Errorf("stdout %s", run.stdout)
		}
		d := itest.WaitDecision(t, e.JS, a.ID)
		if d.Outcome != events.Cancelled || !strings.Contains(d.Reason, "requester stopped waiting") {
			t.Errorf("decided %+v", d)
		}
	})

	t.Run("NATS unreachable", func(t *testing.T) {
		start := time.Now()
		_, wait := startHook(t, bin, "claude/bash.json", "claude", "--nats-url", "nats://127.0.0.1:1")
		run := wait()
		if decision, reason, _ := claudeAnswer(t, run); decision != "deny" || !strings.Contains(reason, "because Assent is unreachable") || time.Since(start) > 20*time.Second {
			t.Errorf("after %s, stdout %s", time.Since(start), run.stdout)
		}
	})

	t.Run("bad command line", func(t *testing.T) {
		_, wait := startHook(t, bin, "claude/bash.json", "claude", "--hook-timeout", "5s")
		run := wait()
		if run.code != 2 || run.stdout != "" || !strings.Contains(run.stderr, "assent-hook claude: --hook-timeout 5s: want 11s or more") {
			t.Errorf("exit %d, stdout %q, stderr %q", run.code, run.stdout, run.stderr)
		}
	})
}
