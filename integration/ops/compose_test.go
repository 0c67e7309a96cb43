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
	"github.com/assent-dev/assent/internal/httpapi"
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
	standins(t, e)
	ctx := itest.TestCtx(t, 20*time.Minute)
	buildImages(t, e, ctx)
	for _, p := range []string{"broker", "approver-bot", "agent-worker", "mcp-gateway"} {
		out, err := e.run(ctx, "", e.cli, "image", "inspect", "--format", "{{.Config.User}}", "assent/"+p+":dev")
		if err != nil {
			t.Fatalf("image inspect assent/%s:dev: %v\n%s", p, err, out)
		}
		if u := strings.TrimSpace(out); u != "65532:65532" {
			t.Errorf("assent/%s:dev runs as %q, want 65532:65532", p, u)
		}
	}

	s := newStack(t, e, ctx)
	env, err := os.ReadFile(filepath.Join(s.dir, ".env"))
	if err != nil {
		t.Fatal(err)
	}
	if os.Geteuid() == 0 && strings.TrimSpace(string(env)) != "HOST_USER=65532:65532" {
		t.Errorf("setup.sh as root wrote %q: the containers would run as root", env)
	}
	s.up("start")

	// Every container runs as 65532 (root's setup.sh) or as the user who
	// ran setup.sh, never root.
	out, err := e.run(ctx, "", e.cli, "ps", "-q", "--filter", "label=com.docker.compose.project="+composeProject)
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range strings.Fields(out) {
		u, _ := e.run(ctx, "", e.cli, "inspect", "--format", "{{.Name}} {{.Config.User}}", id)
		if name, user, _ := strings.Cut(strings.TrimSpace(u), " "); user == "" || user == "0" || strings.HasPrefix(user, "0:") || user == "root" {
			t.Errorf("container %s runs as %q", name, user)
		}
	}
	s.connect()

	// An approval through the stack.
	r := s.ask("Delete the Q3 report?", 0)
	s.pendingOn(r.id, 8082)
	s.answer(r.id)
	s.decided(r)
	t.Logf("approval through the stack: %s approved by ci-bot", r.id)

	// A request pending through a restart of a broker, then of a NATS node.
	r = s.ask("Delete the Q3 report, across restarts?", 0)
	s.pendingOn(r.id, 8081, 8082)
	for _, svc := range []string{"broker-1", "nats-1"} {
		start := time.Now()
		if out, err := s.compose(ctx, "restart", svc); err != nil {
			t.Fatalf("compose restart %s: %v\n%s", svc, err, out)
		}
		t.Logf("restarted %s in %s", svc, time.Since(start).Round(time.Second))
		s.up("after restarting " + svc)
		s.pendingOn(r.id, 8081, 8082)
		s.waiting(r)
	}
	s.answer(r.id)
	s.decided(r)
	t.Logf("request %s pending through restarts of broker-1 and nats-1, then approved once", r.id)
}

// buildImages builds every image of deploy/Dockerfile at tag dev, as
// docs/deploy.md does: Compose's two, then the other two (the build stage is
// shared: they only copy their program).
func buildImages(t *testing.T, e *containerEngine, ctx context.Context) {
	t.Helper()
	root := itest.RepoRoot()
	start := time.Now()
	buildStack(t, e, ctx, filepath.Join(root, "deploy", "compose", "compose.yaml"), "dev")
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
}

// buildStack builds the images of the Compose file at file, tagged tag:
// the broker's and the approver bot's, from the tree the file is in.
func buildStack(t *testing.T, e *containerEngine, ctx context.Context, file, tag string) {
	t.Helper()
	start := time.Now()
	// The file needs HOST_USER (setup.sh's .env), not to build. One image
	// at a time: in parallel, each would compile the shared build stage.
	cmd := append(slices.Clone(e.compose[1:]), "-p", composeProject, "-f", file, "build")
	env := append(slices.Clone(e.env), "HOST_USER=65532:65532", "COMPOSE_PARALLEL_LIMIT=1", "IMAGE_TAG="+tag)
	c := exec.CommandContext(ctx, e.compose[0], cmd...)
	c.Env = append(os.Environ(), env...)
	if out, err := c.CombinedOutput(); err != nil {
		t.Fatalf("compose build (%s): %v\n%s", tag, err, out)
	}
	t.Logf("compose build of %s: %s", tag, time.Since(start).Round(time.Second))
}

// stack is deploy/compose's stack as a test runs it: a copy of the
// directory with its own generated/ and .env, the images at tag, and,
// once connect is called, the agent demo on the host.
type stack struct {
	t    *testing.T
	e    *containerEngine
	ctx  context.Context
	dir  string // the copy of deploy/compose
	gen  string // its generated/
	file string // its compose.yaml
	tag  string // IMAGE_TAG of Compose's environment: the release of Assent's containers, "" for .env's

	client *handler.Client
	nc     *nats.Conn
	auth   http.Header // the ops token's
	secret []byte      // the inbound webhook ci's
}

// newStack copies deploy/compose, runs setup.sh as the test's user (root in
// CI: the containers then run as 65532), and tears the stack down, volumes
// and all, when the test ends.
func newStack(t *testing.T, e *containerEngine, ctx context.Context) *stack {
	t.Helper()
	root := itest.RepoRoot()
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
	s := &stack{t: t, e: e, ctx: ctx, dir: dir, gen: filepath.Join(dir, "generated"), file: filepath.Join(dir, "compose.yaml")}
	healthLoop(t, e)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		if t.Failed() {
			t.Logf("compose logs:\n%s", s.logs())
		}
		if s.nc != nil {
			s.nc.Close()
		}
		if out, err := s.compose(ctx, "down", "--volumes", "--remove-orphans", "--timeout", "30"); err != nil {
			t.Errorf("compose down: %v\n%s", err, out)
		}
	})
	return s
}

// compose runs Compose on the stack's file, with IMAGE_TAG s.tag if set
// (else the stack's .env says, else dev).
func (s *stack) compose(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, s.e.compose[0], append(append(slices.Clone(s.e.compose[1:]), "-p", composeProject, "-f", s.file), args...)...)
	cmd.Dir = s.dir
	cmd.Env = append(os.Environ(), s.e.env...)
	if s.tag != "" {
		cmd.Env = append(cmd.Env, "IMAGE_TAG="+s.tag)
	}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func (s *stack) logs() string {
	out, _ := s.compose(context.Background(), "logs", "--no-color", "--tail", "40")
	return out
}

// up brings up services (all by default) without building, waits for
// their health checks, and checks every service is healthy.
func (s *stack) up(what string, services ...string) {
	s.t.Helper()
	start := time.Now()
	args := []string{"up", "--detach", "--no-build", "--wait", "--wait-timeout", "240"}
	if len(services) > 0 {
		args = append(append(args, "--no-deps"), services...)
	}
	if out, err := s.compose(s.ctx, args...); err != nil {
		s.t.Fatalf("compose up (%s): %v\n%s\n%s", what, err, out, s.logs())
	}
	if len(services) == 0 {
		checkHealthy(s.t, s.e, s.compose)
	}
	s.t.Logf("%s: healthy in %s", what, time.Since(start).Round(time.Second))
}

// connect connects the agent demo from the host (its credentials, the CA,
// the three nodes) and reads the ops token and the webhook secret.
func (s *stack) connect() {
	t := s.t
	t.Helper()
	nc, err := nats.Connect("tls://localhost:4222,tls://localhost:4223,tls://localhost:4224",
		nats.UserCredentials(filepath.Join(s.gen, "creds", "agent-demo.creds")),
		nats.RootCAs(filepath.Join(s.gen, "tls", "ca.pem")), nats.MaxReconnects(-1), nats.ReconnectWait(500*time.Millisecond))
	if err != nil {
		t.Fatalf("agent: %v\n%s", err, s.logs())
	}
	s.nc = nc
	if s.client, err = handler.NewClient(nc, handler.Config{Agent: "demo"}); err != nil {
		t.Fatal(err)
	}
	token, err := os.ReadFile(filepath.Join(s.gen, "auth", "ops.token"))
	if err != nil {
		t.Fatal(err)
	}
	s.auth = http.Header{"Authorization": {"Bearer " + strings.TrimSpace(string(token))}}
	botEnv, err := os.ReadFile(filepath.Join(s.gen, "bot.env"))
	if err != nil {
		t.Fatal(err)
	}
	if s.secret, err = webhook.ParseSecret(strings.TrimSpace(strings.TrimPrefix(string(botEnv), "CI_WEBHOOK_SECRET="))); err != nil {
		t.Fatal(err)
	}
}

// asked is a request the agent made and waits on.
type asked struct {
	id     string
	result chan asking
	count  func() int // decisions stored (each republished on its decided subject)
}

type asking struct {
	d   handler.Decision
	err error
}

// ask sends a request as the agent (delete_file: the rule everything-else
// asks ops), with timeout if not zero, and waits for its decision in the
// background.
func (s *stack) ask(hint string, timeout time.Duration) asked {
	t := s.t
	t.Helper()
	id := events.NewID()
	subj, _ := events.DecidedSubject(id)
	var mu sync.Mutex
	n := 0
	sub, err := s.nc.Subscribe(subj, func(*nats.Msg) { mu.Lock(); n++; mu.Unlock() })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	a := asked{id: id, result: make(chan asking, 1), count: func() int { mu.Lock(); defer mu.Unlock(); return n }}
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
		defer cancel()
		d, err := s.client.Request(ctx, handler.Request{ID: id, Requested: events.Requested{
			Tool: "delete_file", Args: []byte(`{"path":"/srv/reports/q3.csv"}`), User: "carol", Hint: hint,
			Timeout: events.Duration(timeout),
		}})
		a.result <- asking{d, err}
	}()
	return a
}

func approvalURL(port int, id string) string {
	return fmt.Sprintf("http://localhost:%d/v1/approvals/%s", port, id)
}

// approval reads request id from the broker at port.
func (s *stack) approval(port int, id string) (httpapi.Approval, error) {
	r, err := itest.DoHTTPWith(s.ctx, http.MethodGet, approvalURL(port, id), s.auth, nil)
	if err != nil {
		return httpapi.Approval{}, err
	}
	if r.Status != http.StatusOK {
		return httpapi.Approval{}, fmt.Errorf("GET %s: %d %s", approvalURL(port, id), r.Status, r.Body)
	}
	var a httpapi.Approval
	err = json.Unmarshal(r.Body, &a)
	return a, err
}

// pendingOn waits until each broker at ports shows request id pending.
func (s *stack) pendingOn(id string, ports ...int) {
	s.t.Helper()
	for _, port := range ports {
		itest.Eventually(s.t, 2*itest.Patience, func() (bool, string) {
			a, err := s.approval(port, id)
			return err == nil && a.State == broker.StatePending, fmt.Sprintf("broker at %d: %s %v", port, a.State, err)
		})
	}
}

// waiting fails the test if the agent got a decision for a.
func (s *stack) waiting(a asked) {
	s.t.Helper()
	select {
	case res := <-a.result:
		s.t.Fatalf("%s: the agent got %+v, %v while its request was pending", a.id, res.d, res.err)
	default:
	}
}

// answer approves id through the bot's inbound webhook, signed with its
// secret: CI answering as ci-bot.
func (s *stack) answer(id string) {
	t := s.t
	t.Helper()
	body := []byte(`{"request_id":"` + id + `","decision":"approve","reason":"pipeline green"}`)
	h := http.Header{"Content-Type": {"application/json"}}
	now := time.Now()
	h.Set(webhook.HeaderID, "compose-"+id)
	h.Set(webhook.HeaderTimestamp, strconv.FormatInt(now.Unix(), 10))
	h.Set(webhook.HeaderSignature, webhook.Sign(s.secret, "compose-"+id, now, body))
	r, err := itest.DoHTTPWith(itest.TestCtx(t, itest.Patience), http.MethodPost, "http://localhost:8090/webhooks/in/ci", h, body)
	if err != nil || r.Status != http.StatusAccepted {
		t.Fatalf("inbound webhook: %v %d %s", err, r.Status, r.Body)
	}
}

// decided checks that the agent gets a's approval by ci-bot under the rule
// everything-else, that both brokers show it, and that one decision was
// stored.
func (s *stack) decided(a asked) {
	s.t.Helper()
	s.outcome(a, broker.StateApproved, func(d handler.Decision) bool {
		return d.Approved() && len(d.DecidedBy) == 1 && d.DecidedBy[0].Principal == "ci-bot" && d.Rule == "everything-else"
	})
}

// outcome checks that the agent gets a decision for a that ok accepts,
// that both brokers show state, and that one decision was stored.
func (s *stack) outcome(a asked, state broker.State, ok func(handler.Decision) bool) {
	t := s.t
	t.Helper()
	select {
	case res := <-a.result:
		if res.err != nil || !ok(res.d) {
			t.Fatalf("%s: decision %+v, %v", a.id, res.d, res.err)
		}
	case <-time.After(2 * itest.Patience):
		t.Fatalf("%s: no decision within %s\n%s", a.id, 2*itest.Patience, s.logs())
	}
	for _, port := range []int{8081, 8082} {
		ap, err := s.approval(port, a.id)
		if err != nil || ap.State != state || ap.Decision == nil {
			t.Errorf("%s: the broker at :%d shows %s, %+v, %v", a.id, port, ap.State, ap.Decision, err)
		}
	}
	// One decision stored: a second would be republished too.
	time.Sleep(2 * time.Second)
	if n := a.count(); n != 1 {
		t.Errorf("%s: %d decisions stored, want 1", a.id, n)
	}
}

// checkHealthy fails the test unless every service of the stack runs and,
// where it has a health check, is healthy.
func checkHealthy(t *testing.T, e *containerEngine, compose func(context.Context, ...string) (string, error)) {
	t.Helper()
	out, err := compose(itest.TestCtx(t, itest.Patience), "ps", "--all", "--format", "json")
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
