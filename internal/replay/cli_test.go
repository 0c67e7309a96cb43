package replay_test

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/assent-dev/assent/internal/app"
	"github.com/assent-dev/assent/internal/replay"
	"github.com/assent-dev/assent/internal/testenv"
)

// testCLI runs `broker policy replay` end to end over h's stream: exit
// statuses for guards kept and broken, usage errors, reports in text and
// JSON, and the errors that say what to fix.
func testCLI(t *testing.T, h *history) {
	live := writeFile(t, "live.yaml", livePolicy)
	candidate := writeFile(t, "candidate.yaml", candidatePolicy)
	bad := writeFile(t, "bad.yaml", "version: 1\nmode: sometimes\n")
	url := h.ns.ClientURL()
	empty := testenv.Server(t) // a NATS server no broker ever used

	tests := []struct {
		name       string
		args       []string
		code       int
		stdout     []string // substrings
		stderr     []string
		jsonChange int // with --json: the changes counted
	}{
		{"same policy keeps every guard", []string{live, "--nats-url", url, "--fail-on", "allow-what-people-denied,deny-what-was-allowed", "--since", "7d"}, app.ExitOK,
			[]string{"policy " + live + " replayed over stream ASSENT", "0 changed", "no outcome changes"}, []string{"replayed"}, -1},
		{"changes without guards", []string{candidate, "--nats-url", url}, app.ExitOK,
			[]string{"14 changed", "no-big-pay", "approved by alice (big-pay)"}, nil, -1},
		{"a guard broken", []string{"--fail-on", "allow-what-people-denied", candidate, "--nats-url", url}, app.ExitFailed,
			[]string{"14 changed"}, []string{"broker policy replay: guard broken: allow-what-people-denied (1 request)"}, -1},
		{"guards broken", []string{candidate, "--nats-url", url, "--fail-on", "ask-what-was-denied, deny-what-was-allowed,other-rule"}, app.ExitFailed,
			nil, []string{"guards broken: deny-what-was-allowed (1 request), ask-what-was-denied (2 requests), other-rule (1 request)"}, -1},
		{"json", []string{candidate, "--nats-url", url, "--json", "--limit", "3", "--fail-on", "deny-what-went-unanswered"}, app.ExitFailed,
			[]string{`"kind": "deny-what-went-unanswered"`, `"broken"`}, []string{"guard broken: deny-what-went-unanswered (1 request)"}, 14},
		{"unknown kind", []string{candidate, "--nats-url", url, "--fail-on", "allow-everything"}, app.ExitUsage,
			nil, []string{`no such kind of change: "allow-everything"`, "usage: broker policy replay FILE"}, -1},
		{"bad since", []string{candidate, "--nats-url", url, "--since", "last week"}, app.ExitUsage,
			nil, []string{`not a time: "last week"`}, -1},
		{"bad limit", []string{candidate, "--nats-url", url, "--limit", "-1"}, app.ExitUsage,
			nil, []string{`invalid value "-1" for flag -limit`}, -1},
		{"a window before the history", []string{candidate, "--nats-url", url, "--until", "1d", "--since", "2d"}, app.ExitOK,
			[]string{"requests stored from ", "0 requests decided", "no outcome changes"}, nil, -1},
		{"until before since", []string{candidate, "--nats-url", url, "--since", "2026-06-01T00:00:00Z", "--until", "2026-01-01T00:00:00Z"}, app.ExitFailed,
			nil, []string{"--until 2026-01-01T00:00:00Z is before --since"}, -1},
		{"no file", []string{"--nats-url", url}, app.ExitUsage,
			nil, []string{"broker policy replay: missing FILE"}, -1},
		{"bad policy", []string{bad, "--nats-url", url}, app.ExitFailed,
			nil, []string{"broker policy replay: " + bad + ":2: mode"}, -1},
		{"missing policy", []string{bad + ".missing", "--nats-url", url}, app.ExitFailed,
			nil, []string{"no such file"}, -1},
		{"no stream", []string{live, "--nats-url", empty.ClientURL()}, app.ExitFailed,
			nil, []string{"no ASSENT stream on", "--nats-url"}, -1},
		{"no server", []string{live, "--nats-url", "nats://127.0.0.1:1"}, app.ExitFailed,
			nil, []string{"connect to NATS at nats://127.0.0.1:1"}, -1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := app.CLI{Version: "test", Stdout: &stdout, Stderr: &stderr}.Run(ctxFor(t), append([]string{"policy", "replay"}, tt.args...))
			if code != tt.code {
				t.Errorf("exit status %d, want %d\nstdout:\n%s\nstderr:\n%s", code, tt.code, stdout.String(), stderr.String())
			}
			for _, s := range tt.stdout {
				if !strings.Contains(stdout.String(), s) {
					t.Errorf("stdout lacks %q:\n%s", s, stdout.String())
				}
			}
			for _, s := range tt.stderr {
				if !strings.Contains(stderr.String(), s) {
					t.Errorf("stderr lacks %q:\n%s", s, stderr.String())
				}
			}
			if tt.jsonChange < 0 {
				return
			}
			var got struct {
				replay.Report
				Broken []replay.KindCount `json:"broken"`
			}
			if err := json.Unmarshal(stdout.Bytes(), &got); err != nil {
				t.Fatalf("not JSON: %v\n%s", err, stdout.String())
			}
			if got.Changed != tt.jsonChange || got.Listed != 3 || len(got.Changes) != 3 || got.Requests != h.requests || len(got.Broken) != 1 {
				t.Errorf("JSON report: %d changed, %d listed, %d requests, broken %v", got.Changed, got.Listed, got.Requests, got.Broken)
			}
		})
	}
}
