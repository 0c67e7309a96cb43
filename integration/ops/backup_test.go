package ops

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/assent-dev/assent/integration/itest"
	"github.com/assent-dev/assent/internal/app"
	"github.com/assent-dev/assent/internal/broker"
	"github.com/assent-dev/assent/internal/httpapi"
	"github.com/assent-dev/assent/internal/testenv"
	"github.com/assent-dev/assent/pkg/events"
)

// lateness bounds how long after its deadline a restored request may expire:
// the local timers fire at the moment, the durable tick by the end of that
// second; the rest is a busy machine.
const lateness = 3 * time.Second

// runCLI runs one broker command in process and returns its exit status
// and output.
func runCLI(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code := app.CLI{Version: "test", Stdout: &out, Stderr: &errOut}.Run(itest.TestCtx(t, 2*time.Minute), args)
	t.Logf("broker %s: exit %d\n%s%s", strings.Join(args, " "), code, out.String(), errOut.String())
	return code, out.String(), errOut.String()
}

// auditLines returns the audit log as the HTTP API serves it, one JSON
// object a line, up to stream sequence last.
func auditLines(t *testing.T, api string, last uint64) []string {
	t.Helper()
	var lines []string
	after := ""
	for {
		r := itest.Call(t, http.MethodGet, api+"/v1/audit?format=ndjson&limit=1000"+after, nil)
		if r.Status != http.StatusOK {
			t.Fatalf("audit: %d %s", r.Status, r.Body)
		}
		sc := bufio.NewScanner(bytes.NewReader(r.Body))
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			var e struct {
				Seq uint64 `json:"seq"`
			}
			if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
				t.Fatalf("audit line %s: %v", sc.Text(), err)
			}
			if e.Seq == 0 {
				t.Fatalf("audit line without a stream sequence: %s", sc.Text())
			}
			if e.Seq <= last {
				lines = append(lines, sc.Text())
			}
		}
		next := r.Header.Get("X-Next-After")
		if next == "" {
			return lines
		}
		after = "&after=" + next
	}
}

// TestBackupRestoreKeepsDeadlines backs up a running broker's NATS with
// `broker backup`, restores it with `broker restore` into a fresh server,
// and starts a broker there: every pending request is listed with its
// deadline and expires at it, not before and at most a few seconds after;
// decided requests read back the same; remembered choices and the audit log
// are the same.
func TestBackupRestoreKeepsDeadlines(t *testing.T) {
	ns1 := testenv.Server(t)
	b1, stop1 := itest.RunBroker(t, testenv.Conn(t, ns1), broker.Config{Name: "original"})
	api1 := itest.ServeAPI(t, b1)
	ctx := itest.TestCtx(t, 3*time.Minute)

	// History: approved, denied (one with edited args), remembered.
	var decided []string
	for i := range 8 {
		rec, err := b1.Submit(ctx, "", "test/history", events.Requested{Tool: "deploy", Agent: "history", Args: json.RawMessage(fmt.Sprintf(`{"n":%d}`, i)), Timeout: events.Duration(time.Hour)})
		if err != nil {
			t.Fatal(err)
		}
		resp := events.Responded{Decision: events.Approve, Reason: "fine"}
		switch i % 3 {
		case 1:
			resp = events.Responded{Decision: events.Deny, Reason: "not today"}
		case 2:
			resp.Args = json.RawMessage(`{"n":-1}`)
		}
		if _, err := b1.Respond(ctx, "alice", rec.ID, resp); err != nil {
			t.Fatal(err)
		}
		decided = append(decided, rec.ID)
	}
	rec, err := b1.Submit(ctx, "", "test/history", events.Requested{Tool: "restart", Agent: "remembering", Timeout: events.Duration(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b1.Respond(ctx, "alice", rec.ID, events.Responded{Decision: events.Approve, Remember: &events.Remember{Scope: events.ScopeAgent, TTL: events.Duration(time.Hour)}}); err != nil {
		t.Fatal(err)
	}
	decided = append(decided, rec.ID)
	// Decided by the remembered choice.
	auto, err := b1.Submit(ctx, "", "test/history", events.Requested{Tool: "restart", Agent: "remembering", Timeout: events.Duration(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	if auto.State != broker.StateApproved || !auto.Decision.Auto {
		t.Fatalf("the remembered choice did not decide: %s %+v", auto.State, auto.Decision)
	}
	decided = append(decided, auto.ID)

	// Pending, with deadlines spread over the next half minute.
	pending := map[string]time.Time{}
	for i := range 10 {
		rec, err := b1.Submit(ctx, "", "test/pending", events.Requested{Tool: "rm", Agent: "waiting", Args: json.RawMessage(fmt.Sprintf(`{"n":%d}`, i)),
			Timeout: events.Duration(12*time.Second + time.Duration(i)*2*time.Second)})
		if err != nil {
			t.Fatal(err)
		}
		pending[rec.ID] = rec.Deadline
	}
	remembered := itest.Call(t, http.MethodGet, api1+"/v1/remembered", nil).Body
	before := map[string][]byte{}
	for _, id := range decided {
		before[id] = itest.Call(t, http.MethodGet, api1+"/v1/approvals/"+id, nil).Body
	}

	// The backup is taken while the broker runs.
	dir := t.TempDir() + "/backup"
	if code, _, _ := runCLI(t, "backup", "--nats-url", ns1.ClientURL(), "--out", dir); code != app.ExitOK {
		t.Fatalf("backup: exit %d", code)
	}
	m, err := app.ReadManifest(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	var lastSeq uint64
	for _, s := range m.Streams {
		names = append(names, s.Name)
		if s.Name == events.StreamName {
			lastSeq = s.LastSeq
		}
	}
	for _, want := range []string{events.StreamName, "KV_" + broker.GrantBucket, "KV_" + broker.LimitBucket} {
		if !slices.Contains(names, want) {
			t.Errorf("the backup holds %v, not %s", names, want)
		}
	}
	// The stream is the state: a new install has no state bucket to back up
	// (one made by an older broker is backed up with the rest).
	if slices.Contains(names, "KV_"+events.StateBucket) {
		t.Errorf("the backup holds %v: the broker made the state bucket %s", names, events.StateBucket)
	}
	if names[0] != events.StreamName || len(m.Skipped) != 1 || m.Skipped[0].Name != "KV_"+events.PresenceBucket {
		t.Errorf("backup order %v, skipped %+v: want %s first, the presence bucket skipped", names, m.Skipped, events.StreamName)
	}
	audit1 := auditLines(t, api1, lastSeq)
	if len(audit1) < 2*len(decided)+len(pending) {
		t.Fatalf("the audit log holds %d events up to sequence %d; want at least a request and a decision per decided request, and the pending requests", len(audit1), lastSeq)
	}
	stop1()

	ns2 := testenv.Server(t)
	if code, _, _ := runCLI(t, "restore", "--nats-url", ns2.ClientURL(), "--from", dir); code != app.ExitOK {
		t.Fatalf("restore: exit %d", code)
	}
	b2, _ := itest.RunBroker(t, testenv.Conn(t, ns2), broker.Config{Name: "restored"})
	api2 := itest.ServeAPI(t, b2)

	// Every pending request is listed, with its deadline.
	r := itest.Call(t, http.MethodGet, api2+"/v1/approvals?state=pending&agent=waiting", nil)
	var list struct {
		Approvals []httpapi.Approval `json:"approvals"`
	}
	if err := json.Unmarshal(r.Body, &list); err != nil {
		t.Fatalf("list: %v: %s", err, r.Body)
	}
	listed := map[string]time.Time{}
	for _, a := range list.Approvals {
		listed[a.ID] = a.Deadline
	}
	for id, deadline := range pending {
		got, ok := listed[id]
		switch {
		case !ok && time.Now().Before(deadline):
			t.Errorf("pending request %s (deadline %s) is not listed after the restore", id, deadline.Format(time.RFC3339Nano))
		case ok && !got.Equal(deadline):
			t.Errorf("request %s: deadline %s after the restore, %s before", id, got.Format(time.RFC3339Nano), deadline.Format(time.RFC3339Nano))
		}
	}
	if len(listed) != len(pending) {
		t.Errorf("%d pending after the restore, %d before", len(listed), len(pending))
	}

	// Decided requests, remembered choices and the audit log are the same.
	for _, id := range decided {
		if after := itest.Call(t, http.MethodGet, api2+"/v1/approvals/"+id, nil).Body; !itest.SameJSON(after, before[id]) {
			t.Errorf("request %s reads\n%s\nafter the restore, and\n%s\nbefore", id, after, before[id])
		}
	}
	if after := itest.Call(t, http.MethodGet, api2+"/v1/remembered", nil).Body; !itest.SameJSON(after, remembered) {
		t.Errorf("remembered choices after the restore:\n%s\nbefore:\n%s", after, remembered)
	}
	if audit2 := auditLines(t, api2, lastSeq); !slices.Equal(audit1, audit2) {
		t.Errorf("the audit log up to sequence %d differs: %d events before, %d after", lastSeq, len(audit1), len(audit2))
	}

	// Each pending request expires at its deadline on the restored server.
	js2 := itest.NewJS(t, testenv.Conn(t, ns2))
	var worst time.Duration
	for id, deadline := range pending {
		var final broker.Record
		itest.Eventually(t, time.Until(deadline)+itest.Patience, func() (bool, string) {
			var err error
			if final, err = b2.Get(context.Background(), id); err != nil {
				return false, fmt.Sprintf("get %s: %v", id, err)
			}
			return final.State.Terminal(), fmt.Sprintf("request %s is %s, its deadline %s", id, final.State, deadline.Format(time.RFC3339Nano))
		})
		if final.State != broker.StateExpired {
			t.Errorf("request %s ended %s, want expired", id, final.State)
			continue
		}
		late := final.Decision.DecidedAt.Sub(deadline)
		worst = max(worst, late)
		if late < 0 || late > lateness {
			t.Errorf("request %s expired at %s, its deadline %s (%s late)", id, final.Decision.DecidedAt.Format(time.RFC3339Nano), deadline.Format(time.RFC3339Nano), late)
		}
	}
	t.Logf("the latest expiry came %s after its deadline", worst)
	itest.WaitBrokerIdle(t, js2)
	counts := itest.DecisionCounts(t, js2)
	for id := range pending {
		if counts[id] != 1 {
			t.Errorf("request %s has %d decided messages, want 1", id, counts[id])
		}
	}
	for _, id := range decided {
		if counts[id] != 1 {
			t.Errorf("decided request %s has %d decided messages after the restore, want 1", id, counts[id])
		}
	}
}

// TestRestoreRefusals: restore checks before it writes. It refuses a
// directory that is not a backup, a backup with a damaged file (nothing is
// restored), more replicas than a single server has, a server where the
// streams exist already (unless --force), and a server a broker runs
// against; backup refuses a directory that is not empty.
func TestRestoreRefusals(t *testing.T) {
	ns1 := testenv.Server(t)
	b1, stop1 := itest.RunBroker(t, testenv.Conn(t, ns1), broker.Config{Name: "original"})
	ctx := itest.TestCtx(t, 2*time.Minute)
	if _, err := b1.Submit(ctx, "", "test/refusals", events.Requested{Tool: "rm", Agent: "waiting", Timeout: events.Duration(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir() + "/backup"
	if code, _, _ := runCLI(t, "backup", "--nats-url", ns1.ClientURL(), "--out", dir); code != app.ExitOK {
		t.Fatalf("backup: exit %d", code)
	}
	stop1()

	code, _, stderr := runCLI(t, "backup", "--nats-url", ns1.ClientURL(), "--out", dir)
	wantRefusal(t, "backup into a backup", code, stderr, "is not empty")

	ns2 := testenv.Server(t)
	code, _, stderr = runCLI(t, "restore", "--nats-url", ns2.ClientURL(), "--from", t.TempDir())
	wantRefusal(t, "restore from an empty directory", code, stderr, "not a backup")

	m, err := app.ReadManifest(dir)
	if err != nil {
		t.Fatal(err)
	}
	damaged := t.TempDir()
	for _, name := range append([]string{app.ManifestFile}, m.Streams[0].File, m.Streams[1].File) {
		data, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if name == m.Streams[1].File {
			data[len(data)/2] ^= 0x01
		}
		if err := os.WriteFile(filepath.Join(damaged, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	code, _, stderr = runCLI(t, "restore", "--nats-url", ns2.ClientURL(), "--from", damaged)
	wantRefusal(t, "restore of a damaged backup", code, stderr, m.Streams[1].File+" does not match its checksum")
	wantRefusal(t, "restore of a backup with a file missing", code, stderr, m.Streams[2].Name)
	js2 := itest.NewJS(t, testenv.Conn(t, ns2))
	if names := streamNames(t, js2); len(names) != 0 {
		t.Fatalf("a refused restore left streams %v", names)
	}

	code, _, stderr = runCLI(t, "restore", "--nats-url", ns2.ClientURL(), "--from", dir, "--replicas", "3")
	wantRefusal(t, "restore of three replicas into a single server", code, stderr, "restore with --replicas 1")
	if names := streamNames(t, js2); len(names) != 0 {
		t.Fatalf("a refused restore left streams %v", names)
	}

	if code, _, _ := runCLI(t, "restore", "--nats-url", ns2.ClientURL(), "--from", dir, "--replicas", "1"); code != app.ExitOK {
		t.Fatalf("restore: exit %d", code)
	}
	code, _, stderr = runCLI(t, "restore", "--nats-url", ns2.ClientURL(), "--from", dir)
	wantRefusal(t, "restore over existing streams", code, stderr, "--force")
	if code, _, _ := runCLI(t, "restore", "--nats-url", ns2.ClientURL(), "--from", dir, "--force"); code != app.ExitOK {
		t.Fatalf("restore --force: exit %d", code)
	}

	itest.RunBroker(t, testenv.Conn(t, ns2), broker.Config{Name: "running"})
	code, _, stderr = runCLI(t, "restore", "--nats-url", ns2.ClientURL(), "--from", dir, "--force")
	wantRefusal(t, "restore under a running broker", code, stderr, "stop every broker replica")

	// Into a new data directory for the embedded server, then a broker on it.
	data := t.TempDir() + "/data"
	if code, _, _ := runCLI(t, "restore", "--data", data, "--from", dir); code != app.ExitOK {
		t.Fatalf("restore --data: exit %d", code)
	}
	code, _, stderr = runCLI(t, "restore", "--data", data, "--from", dir)
	wantRefusal(t, "restore into a used data directory", code, stderr, "is not empty")
}

func wantRefusal(t *testing.T, what string, code int, stderr, want string) {
	t.Helper()
	if code != app.ExitFailed {
		t.Errorf("%s: exit %d, want %d", what, code, app.ExitFailed)
	}
	if !strings.Contains(stderr, want) {
		t.Errorf("%s: the error does not say %q:\n%s", what, want, stderr)
	}
}

func streamNames(t *testing.T, js jetstream.JetStream) []string {
	t.Helper()
	var names []string
	l := js.StreamNames(context.Background())
	for n := range l.Name() {
		names = append(names, n)
	}
	if err := l.Err(); err != nil {
		t.Fatal(err)
	}
	return names
}
