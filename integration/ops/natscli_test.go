package ops

import (
	"bytes"
	"encoding/json"
	"net/http"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/assent-dev/assent/integration/itest"
	"github.com/assent-dev/assent/internal/app"
	"github.com/assent-dev/assent/pkg/events"
)

// buildNatsCLI builds the pinned nats CLI (tools/natscli) into a temp dir.
func buildNatsCLI(t *testing.T) string {
	t.Helper()
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("go is not on PATH; cannot build the nats CLI")
	}
	_, file, _, _ := runtime.Caller(0)
	toolDir := filepath.Join(filepath.Dir(file), "../..", "tools", "natscli")
	bin := filepath.Join(t.TempDir(), "nats")
	cmd := exec.Command("go", "build", "-o", bin, "github.com/nats-io/natscli/nats")
	cmd.Dir = toolDir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build nats CLI: %v\n%s", err, out)
	}
	return bin
}

// TestNatsCLIReadme runs the README's nats commands, as written, against a
// running broker: ask with `nats pub`, answer with `nats pub`, read the decision
// with a direct get of the first message on the decision subject.
func TestNatsCLIReadme(t *testing.T) {
	nats := buildNatsCLI(t)
	addrs := itest.StartApp(t, app.Options{NATSListen: "127.0.0.1:0", DataDir: t.TempDir(), HTTPListen: "127.0.0.1:0"})
	run := func(args ...string) string {
		t.Helper()
		cmd := exec.Command(nats, append([]string{"--server", addrs.NATS}, args...)...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("nats %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	id := events.NewID()
	run("pub", "assent.request.file-manager", "-H", "Nats-Msg-Id:"+id, `{"specversion":"1.0","id":"`+id+`",
  "type":"dev.assent.approval.requested","source":"agent/file-manager",
  "datacontenttype":"application/json",
  "data":{"tool":"delete_file","args":{"path":"/srv/reports/q3.csv"},"timeout":"2m"}}`)

	// The request shows up as pending over HTTP.
	var got struct {
		State string `json:"state"`
	}
	for deadline := time.Now().Add(10 * time.Second); got.State != "pending"; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("request %s not pending: %+v", id, got)
		}
		resp, err := http.Get(addrs.HTTP + "/v1/approvals/" + id)
		if err != nil {
			t.Fatal(err)
		}
		_ = json.NewDecoder(resp.Body).Decode(&got)
		resp.Body.Close()
	}

	run("pub", "assent.response.alice."+id, `{"specversion":"1.0","id":"`+events.NewID()+`",
  "type":"dev.assent.approval.responded","source":"approver/alice",
  "datacontenttype":"application/json",
  "data":{"decision":"approve","reason":"ok","channel":"cli"}}`)

	var d events.Decided
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		cmd := exec.Command(nats, "--server", addrs.NATS, "req", "--raw", "$JS.API.DIRECT.GET.ASSENT", `{"seq":1,"next_by_subj":"assent.decision.`+id+`"}`)
		body, err := cmd.Output()
		if err == nil && len(bytes.TrimSpace(body)) > 0 {
			e, err := events.Decode(nil, body)
			if err != nil {
				t.Fatal(err)
			}
			if d, err = events.DecodeDecided(&e); err != nil {
				t.Fatal(err)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no decision: %v\n%s", err, body)
		}
	}
	if d.Outcome != events.Approved || d.DecidedBy[0].Principal != "alice" || d.DecidedBy[0].Channel != "cli" || string(d.Args) != `{"path":"/srv/reports/q3.csv"}` {
		t.Fatalf("decision %+v", d)
	}
}
