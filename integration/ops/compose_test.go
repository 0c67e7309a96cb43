//go:build containers && unix

package ops

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/assent-dev/assent/integration/itest"
	"github.com/assent-dev/assent/internal/broker"
	"github.com/assent-dev/assent/internal/channels/webhook"
	"github.com/assent-dev/assent/pkg/events"
	"github.com/assent-dev/assent/pkg/handler"
)

// The tests here build and run what users deploy: deploy/Dockerfile's
// images and deploy/compose's stack, on a real container engine. They only
// build with the tag containers:
//
//	go test -tags containers -run TestCompose -v ./integration/ops/
//
// (.ci/run's "containers" stage, docs/deploy.md). The engine is podman
// (Debian: apt-get install podman buildah runc busybox-static), whose Docker
// API the test serves itself for Compose, or a Docker daemon that answers
// `docker info`. Compose is ASSENT_COMPOSE (a command, such as "docker
// compose"), else `docker compose` where it answers, else the pinned
// Compose of tools/containers/compose, built here. Where the base images
// cannot be pulled, tools/containers/standins.sh builds stand-ins for them
// under their names, and the test says so.

// composeProject is the Compose project the test runs, not the file's own
// (assent), so that a stack of the user's is left alone; its ports are the
// file's, which must be free.
const composeProject = "assent-test"

// containerEngine is what runs the containers and Compose.
type containerEngine struct {
	cli     string   // podman or docker
	compose []string // the Compose command
	env     []string // the environment of both: DOCKER_HOST for podman's API
	podman  bool     // health checks run by the test (no systemd timers)
}

func (e *containerEngine) run(ctx context.Context, dir string, name string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), e.env...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// startEngine finds the engine and Compose, or skips the test saying what is
// missing.
func startEngine(t *testing.T) *containerEngine {
	t.Helper()
	root := itest.RepoRoot()
	e := &containerEngine{}
	if _, err := exec.LookPath("podman"); err == nil {
		e.cli, e.podman = "podman", true
		if os.Getenv("CONTAINERS_CONF") == "" {
			e.env = append(e.env, "CONTAINERS_CONF="+filepath.Join(root, "tools", "containers", "containers.conf"))
		}
		// podman's Docker API, for Compose, on a socket of this test's.
		sock := filepath.Join(t.TempDir(), "podman.sock")
		svc := exec.Command("podman", "system", "service", "--time=0", "unix://"+sock)
		svc.Env = append(os.Environ(), e.env...)
		log := &itest.LockedBuffer{}
		svc.Stdout, svc.Stderr = log, log
		if err := svc.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = svc.Process.Kill()
			_ = svc.Wait()
		})
		itest.Eventually(t, itest.Patience, func() (bool, string) {
			_, err := os.Stat(sock)
			return err == nil, "podman system service has no socket yet: " + log.String()
		})
		e.env = append(e.env, "DOCKER_HOST=unix://"+sock, "DOCKER_BUILDKIT=0")
	} else if out, err := exec.Command("docker", "info").CombinedOutput(); err == nil {
		e.cli = "docker"
	} else {
		msg := "no container engine: podman is not installed (Debian: apt-get install podman buildah runc busybox-static) and docker info fails: " + strings.TrimSpace(string(out))
		if os.Getenv("ASSENT_CONTAINERS_REQUIRED") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}

	ctx := itest.TestCtx(t, 10*time.Minute)
	switch c := os.Getenv("ASSENT_COMPOSE"); {
	case c != "":
		e.compose = strings.Fields(c)
	default:
		if _, err := e.run(ctx, root, "docker", "compose", "version"); err == nil {
			e.compose = []string{"docker", "compose"}
			break
		}
		// The pinned Compose, built into the user's cache (Go's build cache
		// makes the next build a link).
		cache, err := os.UserCacheDir()
		if err != nil {
			cache = t.TempDir()
		}
		bin := filepath.Join(cache, "assent-itest", "docker-compose")
		build := exec.CommandContext(ctx, "go", "build", "-o", bin, "github.com/docker/compose/v2/cmd")
		build.Dir = filepath.Join(root, "tools", "containers", "compose")
		if out, err := build.CombinedOutput(); err != nil {
			t.Fatalf("go build the pinned Compose (tools/containers/compose): %v\n%s", err, out)
		}
		e.compose = []string{bin}
	}
	out, err := e.run(ctx, root, e.compose[0], append(e.compose[1:], "version")...)
	if err != nil {
		t.Fatalf("%v version: %v\n%s", e.compose, err, out)
	}
	t.Logf("engine %s, %s", e.cli, strings.TrimSpace(out))
	return e
}

// standins builds stand-ins for the base images that cannot be pulled, and
// says which images are stand-ins.
func standins(t *testing.T, e *containerEngine) {
	t.Helper()
	if !e.podman {
		return // a Docker daemon pulls them
	}
	root := itest.RepoRoot()
	ctx := itest.TestCtx(t, 10*time.Minute)
	pulled := true
	for _, img := range []string{"docker.io/library/golang:1.26", "gcr.io/distroless/static-debian12:nonroot", "docker.io/library/nats:2.15.2-alpine"} {
		if _, err := e.run(ctx, root, "podman", "image", "exists", img); err == nil {
			continue
		}
		if out, err := e.run(ctx, root, "podman", "pull", "--quiet", img); err != nil {
			t.Logf("cannot pull %s: %s", img, lastLine(out))
			pulled = false
		}
	}
	if !pulled {
		out, err := e.run(ctx, root, "bash", filepath.Join(root, "tools", "containers", "standins.sh"))
		if err != nil {
			t.Fatalf("tools/containers/standins.sh: %v\n%s", err, out)
		}
		t.Logf("tools/containers/standins.sh:\n%s", out)
	}
	for _, img := range []string{"docker.io/library/golang:1.26", "gcr.io/distroless/static-debian12:nonroot", "docker.io/library/nats:2.15.2-alpine"} {
		out, _ := e.run(ctx, root, "podman", "image", "inspect", "--format", `{{index .Labels "assent.standin"}}`, img)
		if strings.TrimSpace(out) == "true" {
			t.Logf("NOTE: %s is a stand-in built on this machine (tools/containers/standins.sh), not the upstream image", img)
		}
	}
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	return s[strings.LastIndex(s, "\n")+1:]
}

// healthLoop runs the containers' health checks every two seconds, as
// podman's systemd timers would, until the test ends.
func healthLoop(t *testing.T, e *containerEngine) {
	t.Helper()
	if !e.podman {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			out, _ := e.run(ctx, "", "podman", "ps", "-q", "--filter", "label=com.docker.compose.project="+composeProject)
			for _, id := range strings.Fields(out) {
				_, _ = e.run(ctx, "", "podman", "healthcheck", "run", id)
			}
			select {
			case <-ctx.Done():
			case <-time.After(2 * time.Second):
			}
		}
	}()
	t.Cleanup(func() { cancel(); wg.Wait() })
}

// TestCompose builds every image of deploy/Dockerfile, brings up
// deploy/compose's stack (setup.sh run as the test's user: root in CI),
// waits for every health check, makes an approval through it (an agent over
// NATS with its credentials, the broker, the approver bot's inbound webhook,
// the decision back to the agent), then, with a request pending, restarts
// broker-1 and then nats-1, and checks that the request is still pending on
// both brokers, is decided once when answered, and the agent gets that
// decision; then tears the stack down.
func TestCompose(t *testing.T) {
	e := startEngine(t)
	root := itest.RepoRoot()
	standins(t, e)

	// Every image, as docs/deploy.md builds them: Compose's two, then the
	// other two (the build stage is shared: they only copy their program).
	ctx := itest.TestCtx(t, 20*time.Minute)
	start := time.Now()
	file := filepath.Join(root, "deploy", "compose", "compose.yaml")
	compose := func(ctx context.Context, file string, args ...string) (string, error) {
		return e.run(ctx, root, e.compose[0], append(append(slices.Clone(e.compose[1:]), "-p", composeProject, "-f", file), args...)...)
	}
	// The file needs HOST_USER (setup.sh's .env), not to build. One image
	// at a time: in parallel, each would compile the shared build stage.
	e.env = append(e.env, "HOST_USER=65532:65532", "COMPOSE_PARALLEL_LIMIT=1")
	if out, err := compose(ctx, file, "build"); err != nil {
		t.Fatalf("compose build: %v\n%s", err, out)
	}
	t.Logf("compose build: %s", time.Since(start).Round(time.Second))
	for _, target := range []string{"agent-worker", "mcp-gateway"} {
		args := []string{"build", "-f", "deploy/Dockerfile", "--target", target, "-t", "assent/" + target + ":dev", "."}
		if e.podman {
			args = append([]string{"build", "--format", "docker"}, args[1:]...)
		}
		if out, err := e.run(ctx, root, e.cli, args...); err != nil {
			t.Fatalf("%s %v: %v\n%s", e.cli, args, err, out)
		}
	}
	t.Logf("every image built: %s", time.Since(start).Round(time.Second))
	for _, p := range []string{"broker", "approver-bot", "agent-worker", "mcp-gateway"} {
		out, err := e.run(ctx, root, e.cli, "image", "inspect", "--format", "{{.Config.User}}", "assent/"+p+":dev")
		if err != nil {
			t.Fatalf("image inspect assent/%s:dev: %v\n%s", p, err, out)
		}
		if u := strings.TrimSpace(out); u != "65532:65532" {
			t.Errorf("assent/%s:dev runs as %q, want 65532:65532", p, u)
		}
	}
	e.env = e.env[:len(e.env)-2]

	// A copy of deploy/compose, so that its generated/ and .env are the
	// test's; setup.sh as the test's user (root in CI: the containers then
	// run as 65532).
	dir := filepath.Join(t.TempDir(), "deploy", "compose")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"compose.yaml", "nats.conf", "policy.yaml", "bot.yaml", "setup.sh"} {
		data, err := os.ReadFile(filepath.Join(root, "deploy", "compose", f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, f), data, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if out, err := e.run(ctx, dir, "bash", "setup.sh", "--broker", itest.Binary(t, "broker")); err != nil {
		t.Fatalf("setup.sh: %v\n%s", err, out)
	}
	env, err := os.ReadFile(filepath.Join(dir, ".env"))
	if err != nil {
		t.Fatal(err)
	}
	if os.Geteuid() == 0 && strings.TrimSpace(string(env)) != "HOST_USER=65532:65532" {
		t.Errorf("setup.sh as root wrote %q: the containers would run as root", env)
	}
	gen := filepath.Join(dir, "generated")
	file = filepath.Join(dir, "compose.yaml")

	healthLoop(t, e)
	logs := func() string {
		out, _ := compose(context.Background(), file, "logs", "--no-color", "--tail", "40")
		return out
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		if t.Failed() {
			t.Logf("compose logs:\n%s", logs())
		}
		if out, err := compose(ctx, file, "down", "--volumes", "--remove-orphans", "--timeout", "30"); err != nil {
			t.Errorf("compose down: %v\n%s", err, out)
		}
	})
	up := func(what string) {
		t.Helper()
		start := time.Now()
		if out, err := compose(ctx, file, "up", "--detach", "--no-build", "--wait", "--wait-timeout", "240"); err != nil {
			t.Fatalf("compose up (%s): %v\n%s\n%s", what, err, out, logs())
		}
		checkHealthy(t, e, compose, file)
		t.Logf("%s: every container healthy in %s", what, time.Since(start).Round(time.Second))
	}
	up("start")

	// Every container runs as 65532 (root's setup.sh) or as the user who
	// ran setup.sh, never root.
	out, err := e.run(ctx, root, e.cli, "ps", "-q", "--filter", "label=com.docker.compose.project="+composeProject)
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range strings.Fields(out) {
		u, _ := e.run(ctx, root, e.cli, "inspect", "--format", "{{.Name}} {{.Config.User}}", id)
		if name, user, _ := strings.Cut(strings.TrimSpace(u), " "); user == "" || user == "0" || strings.HasPrefix(user, "0:") || user == "root" {
			t.Errorf("container %s runs as %q", name, user)
		}
	}

	// The agent, on the host: its credentials, the CA, the three nodes.
	nc, err := nats.Connect("tls://localhost:4222,tls://localhost:4223,tls://localhost:4224",
		nats.UserCredentials(filepath.Join(gen, "creds", "agent-demo.creds")),
		nats.RootCAs(filepath.Join(gen, "tls", "ca.pem")), nats.MaxReconnects(-1), nats.ReconnectWait(500*time.Millisecond))
	if err != nil {
		t.Fatalf("agent: %v\n%s", err, logs())
	}
	defer nc.Close()
	client, err := handler.NewClient(nc, handler.Config{Agent: "demo"})
	if err != nil {
		t.Fatal(err)
	}
	token, err := os.ReadFile(filepath.Join(gen, "auth", "ops.token"))
	if err != nil {
		t.Fatal(err)
	}
	auth := http.Header{"Authorization": {"Bearer " + strings.TrimSpace(string(token))}}
	botEnv, err := os.ReadFile(filepath.Join(gen, "bot.env"))
	if err != nil {
		t.Fatal(err)
	}
	secret, err := webhook.ParseSecret(strings.TrimSpace(strings.TrimPrefix(string(botEnv), "CI_WEBHOOK_SECRET=")))
	if err != nil {
		t.Fatal(err)
	}

	type result struct {
		d   handler.Decision
		err error
	}
	// ask sends a request as the agent and counts the decisions stored for
	// it (each republished on its decided subject).
	ask := func(hint string) (string, <-chan result, func() int) {
		id := events.NewID()
		subj, _ := events.DecidedSubject(id)
		var mu sync.Mutex
		n := 0
		sub, err := nc.Subscribe(subj, func(*nats.Msg) { mu.Lock(); n++; mu.Unlock() })
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = sub.Unsubscribe() })
		ch := make(chan result, 1)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
			defer cancel()
			d, err := client.Request(ctx, handler.Request{ID: id, Requested: events.Requested{
				Tool: "delete_file", Args: []byte(`{"path":"/srv/reports/q3.csv"}`), User: "carol", Hint: hint,
			}})
			ch <- result{d, err}
		}()
		return id, ch, func() int { mu.Lock(); defer mu.Unlock(); return n }
	}
	approval := func(port int, id string) string {
		return fmt.Sprintf("http://localhost:%d/v1/approvals/%s", port, id)
	}
	pendingOn := func(port int, id string) {
		t.Helper()
		itest.Eventually(t, 2*itest.Patience, func() (bool, string) {
			r, err := itest.DoHTTPWith(context.Background(), http.MethodGet, approval(port, id), auth, nil)
			return err == nil && r.Status == http.StatusOK && strings.Contains(string(r.Body), `"state":"pending"`), fmt.Sprintf("broker at %d: %v %d %s", port, err, r.Status, r.Body)
		})
	}
	// answer approves through the bot's inbound webhook, signed with its
	// secret: CI answering as ci-bot.
	answer := func(id string) {
		t.Helper()
		body := []byte(`{"request_id":"` + id + `","decision":"approve","reason":"pipeline green"}`)
		h := http.Header{"Content-Type": {"application/json"}}
		now := time.Now()
		h.Set(webhook.HeaderID, "compose-"+id)
		h.Set(webhook.HeaderTimestamp, strconv.FormatInt(now.Unix(), 10))
		h.Set(webhook.HeaderSignature, webhook.Sign(secret, "compose-"+id, now, body))
		r, err := itest.DoHTTPWith(itest.TestCtx(t, itest.Patience), http.MethodPost, "http://localhost:8090/webhooks/in/ci", h, body)
		if err != nil || r.Status != http.StatusAccepted {
			t.Fatalf("inbound webhook: %v %d %s", err, r.Status, r.Body)
		}
	}
	decided := func(id string, ch <-chan result, count func() int) {
		t.Helper()
		select {
		case res := <-ch:
			if res.err != nil || !res.d.Approved() || len(res.d.DecidedBy) != 1 || res.d.DecidedBy[0].Principal != "ci-bot" || res.d.Rule != "everything-else" {
				t.Fatalf("%s: decision %+v, %v", id, res.d, res.err)
			}
		case <-time.After(2 * itest.Patience):
			t.Fatalf("%s: no decision within %s\n%s", id, 2*itest.Patience, logs())
		}
		for _, port := range []int{8081, 8082} {
			a := itest.ApprovalOf(t, call2(t, http.MethodGet, approval(port, id), auth), http.StatusOK)
			if a.State != broker.StateApproved || a.Decision == nil || len(a.Decision.DecidedBy) != 1 {
				t.Errorf("%s: the broker at :%d shows %s, %+v", id, port, a.State, a.Decision)
			}
		}
		// One decision stored: a second would be republished too.
		time.Sleep(2 * time.Second)
		if n := count(); n != 1 {
			t.Errorf("%s: %d decisions stored, want 1", id, n)
		}
	}

	// An approval through the stack.
	id, ch, count := ask("Delete the Q3 report?")
	pendingOn(8082, id)
	answer(id)
	decided(id, ch, count)
	t.Logf("approval through the stack: %s approved by ci-bot", id)

	// A request pending through a restart of a broker, then of a NATS node.
	id, ch, count = ask("Delete the Q3 report, across restarts?")
	pendingOn(8081, id)
	pendingOn(8082, id)
	for _, svc := range []string{"broker-1", "nats-1"} {
		start := time.Now()
		if out, err := compose(ctx, file, "restart", svc); err != nil {
			t.Fatalf("compose restart %s: %v\n%s", svc, err, out)
		}
		t.Logf("restarted %s in %s", svc, time.Since(start).Round(time.Second))
		up("after restarting " + svc)
		pendingOn(8081, id)
		pendingOn(8082, id)
		select {
		case res := <-ch:
			t.Fatalf("the agent got %+v, %v while its request was pending", res.d, res.err)
		default:
		}
	}
	answer(id)
	decided(id, ch, count)
	t.Logf("request %s pending through restarts of broker-1 and nats-1, then approved once", id)
}

// checkHealthy fails the test unless every service of the stack runs and,
// where it has a health check, is healthy.
func checkHealthy(t *testing.T, e *containerEngine, compose func(context.Context, string, ...string) (string, error), file string) {
	t.Helper()
	out, err := compose(itest.TestCtx(t, itest.Patience), file, "ps", "--all", "--format", "json")
	if err != nil {
		t.Fatalf("compose ps: %v\n%s", err, out)
	}
	seen := map[string]bool{}
	for _, l := range bytes.Split(bytes.TrimSpace([]byte(out)), []byte("\n")) {
		var c struct{ Service, State, Health string }
		if err := json.Unmarshal(l, &c); err != nil {
			t.Fatalf("compose ps: %v: %s", err, l)
		}
		seen[c.Service] = true
		if c.State != "running" || c.Health != "healthy" {
			t.Errorf("%s: %s, health %q", c.Service, c.State, c.Health)
		}
	}
	for _, s := range []string{"nats-1", "nats-2", "nats-3", "broker-1", "broker-2", "approver-bot"} {
		if !seen[s] {
			t.Errorf("compose ps lists no %s:\n%s", s, out)
		}
	}
}
