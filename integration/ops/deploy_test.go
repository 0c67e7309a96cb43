//go:build unix

package ops

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"gopkg.in/yaml.v3"

	"github.com/assent-dev/assent/integration/itest"
	"github.com/assent-dev/assent/internal/app"
	"github.com/assent-dev/assent/internal/bot"
	"github.com/assent-dev/assent/internal/broker"
	"github.com/assent-dev/assent/internal/channels/webhook"
	"github.com/assent-dev/assent/internal/creds"
	"github.com/assent-dev/assent/internal/envflag"
	"github.com/assent-dev/assent/internal/programs"
	"github.com/assent-dev/assent/internal/testcerts"
	"github.com/assent-dev/assent/pkg/events"
	"github.com/assent-dev/assent/pkg/handler"
)

// The deployment files of deploy/ (docs/deploy.md) are checked here without
// a container engine: every NATS configuration with nats-server's parser, the
// compose file and the Kubernetes manifests for their structure and against
// the Dockerfile's targets and the programs' real flag sets
// (internal/programs), and the compose topology run as local processes by
// deploy/local/run.sh, through which TestDeployLocal makes an approval.

// deployDir is the repository's deploy/, from the integration package.
const deployDir = "../../deploy"

// minNATS is the oldest nats-server the broker runs on: its deadlines are
// JetStream message schedules (docs/cluster.md).
var minNATS = [2]int{2, 12}

// TestDeployNATSConfigs parses every NATS configuration under deploy/ with
// nats-server's own parser and checks that it means what it should: a node of
// a three-node cluster named assent, with JetStream fsyncing every write;
// the compose one also with TLS for clients and mutual TLS for routes, and in
// operator mode with the accounts that `broker creds` makes.
func TestDeployNATSConfigs(t *testing.T) {
	var files []string
	err := filepath.WalkDir(deployDir, func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(p, ".conf") {
			files = append(files, p)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	checked := map[string]bool{}
	for _, f := range files {
		rel, _ := filepath.Rel(deployDir, f)
		switch {
		case regexp.MustCompile(`^nats/cluster-node[123]\.conf$`).MatchString(rel):
			// Loopback, no TLS or accounts (docs/cluster.md); clustertest's
			// TestDeployClusterConfigs also runs them.
			o, err := server.ProcessConfigFile(f)
			if err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			checkClusterNode(t, f, o)
			checked[rel] = true
		case rel == "compose/nats.conf":
			// In a subtest: it changes the working directory until it ends.
			t.Run("compose", func(t *testing.T) { checkComposeNATS(t, f) })
			checked[rel] = true
		default:
			t.Errorf("%s: a NATS configuration this test does not know: check it here", f)
		}
	}
	for _, want := range []string{"nats/cluster-node1.conf", "nats/cluster-node2.conf", "nats/cluster-node3.conf", "compose/nats.conf"} {
		if !checked[want] {
			t.Errorf("deploy/%s: missing", want)
		}
	}
}

// checkClusterNode checks what every node of Assent's cluster has.
func checkClusterNode(t *testing.T, file string, o *server.Options) {
	t.Helper()
	if o.ServerName == "" {
		t.Errorf("%s: no server_name", file)
	}
	if !o.JetStream || !o.SyncAlways {
		t.Errorf("%s: jetstream %v, sync_interval always %v", file, o.JetStream, o.SyncAlways)
	}
	if need := broker.NeededMaxPayload(events.DefaultMaxEventSize); int(o.MaxPayload) < need {
		t.Errorf("%s: max_payload %d: the broker needs %d for events of the default 1 MiB, and would lower its limit", file, o.MaxPayload, need)
	}
	if o.Cluster.Name != "assent" || len(o.Routes) != 3 {
		t.Errorf("%s: cluster %q with %d routes, want assent with 3 (every node, itself included)", file, o.Cluster.Name, len(o.Routes))
	}
}

// checkComposeNATS parses deploy/compose/nats.conf as compose.yaml's nats-1
// runs it: its environment, accounts.conf beside it as setup.sh makes it, and
// tls/ in the working directory.
func checkComposeNATS(t *testing.T, file string) {
	file, err := filepath.Abs(file)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	a, _, err := creds.Init(filepath.Join(dir, "keys"))
	if err != nil {
		t.Fatal(err)
	}
	// setup.sh: `broker creds server-config | sed -n '/^operator:/,$p'`.
	sc, err := a.ServerConfig(creds.ServerOptions{Listen: "127.0.0.1:4222", StoreDir: dir, Name: "x", MemoryResolver: true})
	if err != nil {
		t.Fatal(err)
	}
	i := strings.Index(sc, "\noperator:")
	if i < 0 {
		t.Fatalf("broker creds server-config printed no operator line, which setup.sh cuts from:\n%s", sc)
	}
	writeFile(t, filepath.Join(dir, "accounts.conf"), sc[i+1:])
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	conf := filepath.Join(dir, "nats.conf")
	writeFile(t, conf, string(data))
	certs := testcerts.New(t)
	if err := os.Mkdir(filepath.Join(dir, "tls"), 0o700); err != nil {
		t.Fatal(err)
	}
	for src, dst := range map[string]string{certs.CAFile: "ca.pem", certs.ServerCertFile: "nats.pem", certs.ServerKey: "nats-key.pem"} {
		b, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		writeFile(t, filepath.Join(dir, "tls", dst), string(b))
	}
	env := composeFileOf(t).Services["nats-1"].Environment
	for _, k := range []string{"NATS_SERVER_NAME", "NATS_LISTEN", "NATS_MONITOR", "NATS_CLUSTER_LISTEN", "NATS_ROUTES", "NATS_STORE_DIR"} {
		if env[k] == "" {
			t.Fatalf("compose.yaml: nats-1 sets no %s, which nats.conf reads", k)
		}
		t.Setenv(k, env[k])
	}
	t.Setenv("NATS_STORE_DIR", filepath.Join(dir, "store"))
	t.Chdir(dir) // the TLS files are relative to the working directory

	o, err := server.ProcessConfigFile(conf)
	if err != nil {
		t.Fatalf("%s with compose's environment for nats-1: %v", file, err)
	}
	checkClusterNode(t, file, o)
	if o.ServerName != "nats-1" || o.Host != "0.0.0.0" || o.Port != 4222 || o.HTTPPort != 8222 || o.Cluster.Port != 6222 {
		t.Errorf("%s: server %q, clients %s:%d, monitoring %d, routes %d", file, o.ServerName, o.Host, o.Port, o.HTTPPort, o.Cluster.Port)
	}
	var routes []string
	for _, r := range o.Routes {
		routes = append(routes, r.Host)
	}
	if want := []string{"nats-1:6222", "nats-2:6222", "nats-3:6222"}; !slices.Equal(routes, want) {
		t.Errorf("%s: routes %v, want %v", file, routes, want)
	}
	if o.TLSConfig == nil || o.TLSVerify {
		t.Errorf("%s: clients: TLS %v, client certificates required %v; want TLS, credentials rather than certificates", file, o.TLSConfig != nil, o.TLSVerify)
	}
	if o.Cluster.TLSConfig == nil || o.Cluster.TLSConfig.ClientCAs == nil {
		t.Errorf("%s: routes are not mutual TLS", file)
	}
	if !o.Cluster.NoAdvertise {
		t.Errorf("%s: the nodes advertise their container addresses, which neither the host reaches nor the certificate names", file)
	}
	if len(o.TrustedOperators) != 1 || o.SystemAccount != a.SystemAccount {
		t.Errorf("%s: %d trusted operators, system account %q; want operator mode with the authority's", file, len(o.TrustedOperators), o.SystemAccount)
	}
	if _, ok := o.AccountResolver.(*server.MemAccResolver); !ok {
		t.Errorf("%s: resolver %T, want the memory resolver of broker creds server-config", file, o.AccountResolver)
	}
	if o.MaxControlLine < 32768 {
		t.Errorf("%s: max_control_line %d: a bot's user JWT needs 32 KiB", file, o.MaxControlLine)
	}
}

func writeFile(t *testing.T, name, data string) {
	t.Helper()
	if err := os.WriteFile(name, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
}

// composeFile is what deploy/compose/compose.yaml says, of what the tests
// check.
type composeFile struct {
	Services map[string]composeService `yaml:"services"`
}

type composeService struct {
	Image string `yaml:"image"`
	Build *struct {
		Context    string `yaml:"context"`
		Dockerfile string `yaml:"dockerfile"`
		Target     string `yaml:"target"`
	} `yaml:"build"`
	User        string            `yaml:"user"`
	WorkingDir  string            `yaml:"working_dir"`
	Command     []string          `yaml:"command"`
	Environment map[string]string `yaml:"environment"`
	EnvFile     string            `yaml:"env_file"`
	Volumes     []string          `yaml:"volumes"`
	Ports       []string          `yaml:"ports"`
	Healthcheck *struct {
		Test []string `yaml:"test"`
	} `yaml:"healthcheck"`
	DependsOn map[string]struct {
		Condition string `yaml:"condition"`
	} `yaml:"depends_on"`
}

func composeFileOf(t *testing.T) composeFile {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(deployDir, "compose", "compose.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var c composeFile
	if err := yaml.Unmarshal(data, &c); err != nil {
		t.Fatalf("compose.yaml: %v", err)
	}
	return c
}

// dockerStage is one stage of deploy/Dockerfile.
type dockerStage struct {
	Name, From  string
	User        string
	Entrypoint  []string
	Cmd         []string
	HealthCheck []string // CMD's arguments; ["NONE"] for HEALTHCHECK NONE
	Expose      []string
	Run         []string
}

// dockerfile parses deploy/Dockerfile's stages, by name.
func dockerfile(t *testing.T) map[string]*dockerStage {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(deployDir, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	// Join continued lines, drop comments.
	var lines []string
	var cur strings.Builder
	for _, l := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), "#") && cur.Len() == 0 {
			continue
		}
		if s, ok := strings.CutSuffix(l, "\\"); ok {
			cur.WriteString(s + " ")
			continue
		}
		cur.WriteString(l)
		if s := strings.TrimSpace(cur.String()); s != "" {
			lines = append(lines, s)
		}
		cur.Reset()
	}
	stages := map[string]*dockerStage{}
	var st *dockerStage
	execForm := func(s string) []string {
		var v []string
		if err := yaml.Unmarshal([]byte(s), &v); err != nil {
			t.Fatalf("Dockerfile: %q is not in exec form: %v", s, err)
		}
		return v
	}
	for _, l := range lines {
		instr, rest, _ := strings.Cut(l, " ")
		rest = strings.TrimSpace(rest)
		switch strings.ToUpper(instr) {
		case "FROM":
			f := strings.Fields(rest)
			if len(f) != 3 || !strings.EqualFold(f[1], "AS") {
				t.Fatalf("Dockerfile: %q: every stage is named (FROM IMAGE AS NAME)", l)
			}
			st = &dockerStage{Name: f[2], From: f[0]}
			stages[st.Name] = st
		case "USER":
			st.User = rest
		case "ENTRYPOINT":
			st.Entrypoint = execForm(rest)
		case "CMD":
			st.Cmd = execForm(rest)
		case "EXPOSE":
			st.Expose = append(st.Expose, strings.Fields(rest)...)
		case "RUN":
			st.Run = append(st.Run, rest)
		case "HEALTHCHECK":
			if rest == "NONE" {
				st.HealthCheck = []string{"NONE"}
				continue
			}
			_, c, ok := strings.Cut(rest, " CMD ")
			if !ok {
				t.Fatalf("Dockerfile: %q: want HEALTHCHECK [OPTIONS] CMD [...]", l)
			}
			st.HealthCheck = execForm(c)
		}
	}
	return stages
}

// TestDeployDockerfile checks deploy/Dockerfile: one static build of every
// program, with the version where the programs read it, and one named,
// non-root final stage per program whose health check is a health command
// the program has, on the port it exposes.
func TestDeployDockerfile(t *testing.T) {
	stages := dockerfile(t)
	build := stages["build"]
	if build == nil || len(build.Run) == 0 {
		t.Fatal("Dockerfile: no build stage")
	}
	compile := build.Run[len(build.Run)-1]
	for _, want := range []string{"CGO_ENABLED=0", "-trimpath", "-X main.version=${VERSION}"} {
		if !strings.Contains(compile, want) {
			t.Errorf("Dockerfile: the build does not use %s: %s", want, compile)
		}
	}
	// The programs that have a version read it from main.version.
	for _, p := range programs.All() {
		if p.Local {
			continue // runs where its caller runs: no image
		}
		src, err := os.ReadFile(filepath.Join("../..", "cmd", p.Name, "main.go"))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(compile, "./cmd/"+p.Name) {
			t.Errorf("Dockerfile: the build does not build ./cmd/%s", p.Name)
		}
		if strings.Contains(string(src), "var version") != slices.Contains(commandNames(p), "version") {
			t.Errorf("cmd/%s: a version command and main.version go together", p.Name)
		}
	}

	port := map[string]string{} // program: the port its health check asks
	for _, p := range programs.All() {
		if p.Local {
			continue
		}
		st := stages[p.Name]
		if st == nil {
			t.Errorf("Dockerfile: no target %s", p.Name)
			continue
		}
		bin := "/usr/local/bin/" + p.Name
		if uid, _, _ := strings.Cut(st.User, ":"); uid == "" || uid == "0" || strings.Trim(uid, "0123456789") != "" {
			t.Errorf("Dockerfile: %s runs as %q, want a numeric user other than root", p.Name, st.User)
		}
		if !strings.HasPrefix(st.From, "gcr.io/distroless/static") && st.From != "scratch" {
			t.Errorf("Dockerfile: %s is FROM %s, want a static base", p.Name, st.From)
		}
		if len(st.Entrypoint) != 1 || st.Entrypoint[0] != bin {
			t.Errorf("Dockerfile: %s's ENTRYPOINT %v, want [%s]", p.Name, st.Entrypoint, bin)
		}
		if len(st.Cmd) > 0 {
			checkCommandLine(t, "Dockerfile "+p.Name+" CMD", p.Name, st.Cmd)
		}
		switch hc := st.HealthCheck; {
		case len(hc) == 0:
			t.Errorf("Dockerfile: %s has no HEALTHCHECK (HEALTHCHECK NONE says it has none on purpose)", p.Name)
		case hc[0] == "NONE":
			if p.Name != "agent-worker" {
				t.Errorf("Dockerfile: %s serves HTTP and has no health check", p.Name)
			}
		default:
			if len(hc) < 2 || hc[0] != bin || hc[1] != "health" {
				t.Errorf("Dockerfile: %s's HEALTHCHECK %v, want [%s health ...]", p.Name, hc, bin)
				continue
			}
			u, err := url.Parse(healthURL(t, p.Name, hc[2:]))
			if err != nil || u.Hostname() != "127.0.0.1" {
				t.Errorf("Dockerfile: %s's health check asks %v, want the container's own loopback", p.Name, u)
				continue
			}
			if !slices.Contains(st.Expose, u.Port()) {
				t.Errorf("Dockerfile: %s's health check asks port %s, which it does not EXPOSE (%v)", p.Name, u.Port(), st.Expose)
			}
			port[p.Name] = u.Port()
		}
	}
	// The health checks are real commands: run each against a closed port,
	// where it must say unhealthy (1), not that it does not know the
	// command or its flags (2).
	closed := closedPort(t)
	for name := range port {
		where := []string{"--url", "http://" + closed + "/healthz"}
		if name == "broker" {
			where = []string{"--http", closed}
		}
		out, err := exec.Command(itest.Binary(t, name), append(append([]string{"health"}, where...), "--wait", "2s")...).CombinedOutput()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 1 || !strings.Contains(string(out), "unhealthy") {
			t.Errorf("%s health against a closed port: %v: %s", name, err, out)
		}
	}

	ignore, err := os.ReadFile("../../.dockerignore")
	if err != nil {
		t.Fatal(err)
	}
	// Secrets, and what the quick start (./assent-data) and builds (./bin,
	// .gitignore) leave in the repository.
	for _, secret := range []string{"deploy/compose/generated", "deploy/local/run", ".git", "assent-data", "bin"} {
		if !slices.Contains(strings.Split(string(ignore), "\n"), secret) {
			t.Errorf(".dockerignore: %s is not ignored: it would go into the build context", secret)
		}
	}
	// A "# syntax=" directive makes BuildKit pull a frontend image before
	// building, which an air-gapped builder cannot: the Dockerfile uses only
	// what the built-in frontend has.
	src, err := os.ReadFile(filepath.Join(deployDir, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	for i, l := range strings.Split(string(src), "\n") {
		if !strings.HasPrefix(l, "#") {
			break // parser directives come first, before any instruction or blank line
		}
		if k, _, ok := strings.Cut(strings.TrimSpace(strings.TrimPrefix(l, "#")), "="); ok && strings.EqualFold(strings.TrimSpace(k), "syntax") {
			t.Errorf("deploy/Dockerfile:%d: %q makes BuildKit fetch a frontend image: air-gapped builds fail", i+1, l)
		}
	}
}

// TestDeploySetupUser runs deploy/compose/setup.sh as root and as another
// user (id and chown stand-ins on PATH): as root, Compose must run the
// containers as the images' user 65532, never root, and every file it mounts
// from generated/ must be 65532's; as another user, as that user, given
// nothing.
func TestDeploySetupUser(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the broker and runs setup.sh")
	}
	if _, err := exec.LookPath("openssl"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("openssl is not installed; .ci/run installs it")
		}
		t.Skip("openssl is not installed (Debian: apt-get install openssl): deploy/compose/setup.sh makes the certificates with it")
	}
	broker := itest.Binary(t, "broker")
	script, err := os.ReadFile(filepath.Join(deployDir, "compose", "setup.sh"))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ uid, want string }{{"0", "65532:65532"}, {"1000", "1000:1000"}} {
		t.Run("uid "+tc.uid, func(t *testing.T) {
			// setup.sh writes .env only for its default output, beside itself.
			dir := t.TempDir()
			compose := filepath.Join(dir, "deploy", "compose")
			if err := os.MkdirAll(compose, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(compose, "setup.sh"), script, 0o755); err != nil {
				t.Fatal(err)
			}
			shims := filepath.Join(dir, "shims")
			if err := os.Mkdir(shims, 0o755); err != nil {
				t.Fatal(err)
			}
			chowned := filepath.Join(dir, "chowned")
			writeFile(t, filepath.Join(shims, "id"), "#!/bin/sh\necho "+tc.uid+"\n")
			writeFile(t, filepath.Join(shims, "chown"), "#!/bin/sh\necho \"$*\" >>"+chowned+"\n")
			for _, f := range []string{"id", "chown"} {
				if err := os.Chmod(filepath.Join(shims, f), 0o755); err != nil {
					t.Fatal(err)
				}
			}
			gen := filepath.Join(compose, "generated")
			cmd := exec.Command("bash", filepath.Join(compose, "setup.sh"), "--out", gen, "--broker", broker)
			cmd.Env = append(os.Environ(), "PATH="+shims+string(os.PathListSeparator)+os.Getenv("PATH"))
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("setup.sh: %v\n%s", err, out)
			}
			env, err := os.ReadFile(filepath.Join(compose, ".env"))
			if err != nil {
				t.Fatal(err)
			}
			if got := strings.TrimSpace(string(env)); got != "HOST_USER="+tc.want {
				t.Errorf(".env: %q, want HOST_USER=%s", got, tc.want)
			}
			log, _ := os.ReadFile(chowned)
			if tc.uid != "0" {
				if len(log) > 0 {
					t.Errorf("setup.sh as uid %s changed owners: %s", tc.uid, log)
				}
				return
			}
			// What chown was given: each file, or a directory with -R.
			owned := func(p string) bool {
				for _, l := range strings.Split(strings.TrimSpace(string(log)), "\n") {
					f := strings.Fields(l)
					recursive := len(f) > 0 && f[0] == "-R"
					if recursive {
						f = f[1:]
					}
					if len(f) < 2 || f[0] != tc.want {
						continue
					}
					for _, x := range f[1:] {
						if x == p || recursive && strings.HasPrefix(p, x+"/") {
							return true
						}
					}
				}
				return false
			}
			for name, s := range composeFileOf(t).Services {
				for _, v := range s.Volumes {
					src, _, _ := strings.Cut(v, ":")
					if rel, ok := strings.CutPrefix(src, "./generated/"); ok && !owned(filepath.Join(gen, rel)) {
						t.Errorf("compose.yaml %s mounts %s, which setup.sh as root did not give to %s (chown: %s)", name, src, tc.want, log)
					}
				}
			}
			for _, private := range []string{"keys", "tls/ca-key.pem"} {
				if owned(filepath.Join(gen, private)) {
					t.Errorf("setup.sh as root gave %s to %s: no container needs it", private, tc.want)
				}
			}
		})
	}
}

// healthURL is the URL that "PROGRAM health ARGS..." asks: its --url, or
// the broker's --http and --path, their defaults where args do not set them.
func healthURL(t *testing.T, program string, args []string) string {
	t.Helper()
	if program == "mcp-gateway" {
		// Its health command is its main's (cmd/mcp-gateway): --url,
		// default http://127.0.0.1:8931/mcp.
		if len(args) == 2 && args[0] == "--url" {
			return args[1]
		}
		return "http://127.0.0.1:8931/mcp"
	}
	_, fs, _ := command(t, program, append([]string{"health"}, args...))
	if err := fs.Parse(args); err != nil {
		t.Fatalf("%s health %v: %v", program, args, err)
	}
	if f := fs.Lookup("url"); f != nil {
		return f.Value.String()
	}
	base := fs.Lookup("http").Value.String()
	if !strings.Contains(base, "://") {
		base = "http://" + base
	}
	return base + fs.Lookup("path").Value.String()
}

// commandNames are the names of p's commands.
func commandNames(p programs.Program) []string {
	var names []string
	for _, c := range p.Commands {
		names = append(names, c.Name)
	}
	return names
}

// closedPort returns a loopback address nothing listens on.
func closedPort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// command finds the command that args run of program and its flag set
// (programs.Find), failing the test if there is none.
func command(t *testing.T, program string, args []string) (string, *flag.FlagSet, []string) {
	t.Helper()
	name, fs, rest, ok := programs.Find(program, args)
	if !ok {
		t.Fatalf("%s: no command in %q and no default command (internal/programs)", program, args)
	}
	return name, fs, rest
}

// checkCommandLine checks that every flag in args is one of the flags of the
// command of program that args run.
func checkCommandLine(t *testing.T, where, program string, args []string) map[string]string {
	t.Helper()
	name, fs, rest := command(t, program, args)
	set := map[string]string{}
	for i := 0; i < len(rest); i++ {
		a := rest[i]
		if a == "--" {
			break
		}
		if !strings.HasPrefix(a, "-") {
			t.Errorf("%s: %q: an argument where %s takes flags only", where, a, strings.TrimSpace(program+" "+name))
			continue
		}
		key, val, hasVal := strings.Cut(strings.TrimLeft(a, "-"), "=")
		f := fs.Lookup(key)
		if f == nil {
			t.Errorf("%s: %s has no flag --%s", where, strings.TrimSpace(program+" "+name), key)
			continue
		}
		if b, ok := f.Value.(interface{ IsBoolFlag() bool }); !hasVal && !(ok && b.IsBoolFlag()) {
			i++
			if i < len(rest) {
				val = rest[i]
			}
		}
		set[key] = val
	}
	return set
}

// checkEnv checks that every ASSENT_ variable of env is the variable of a flag
// of the command that args run (or its _FILE form), or one of Assent's other
// variables, and returns the flags they set.
func checkEnv(t *testing.T, where, program string, args []string, env map[string]string) map[string]string {
	t.Helper()
	name, fs, _ := command(t, program, args)
	set := map[string]string{}
	for k, v := range env {
		if !strings.HasPrefix(k, envflag.Prefix) || slices.Contains(envflag.Others(), k) {
			continue
		}
		found := false
		fs.VisitAll(func(f *flag.Flag) {
			if k == envflag.Var(f.Name) || k == envflag.Var(f.Name)+envflag.FileSuffix {
				found = true
				set[f.Name] = v
			}
		})
		if !found {
			t.Errorf("%s: %s is the variable of no flag of %s", where, k, strings.TrimSpace(program+" "+name))
		}
	}
	return set
}

// imageTarget checks that image is one of deploy/Dockerfile's programs,
// named assent/TARGET:TAG, and returns the target.
func imageTarget(t *testing.T, where, image string, stages map[string]*dockerStage) string {
	t.Helper()
	repo, _, _ := strings.Cut(image, ":")
	target, ok := strings.CutPrefix(repo, "assent/")
	if !ok || stages[target] == nil || target == "build" {
		t.Errorf("%s: image %q is not assent/TARGET of a target of deploy/Dockerfile", where, image)
	}
	return target
}

// checkNATSImage checks a NATS image is recent enough for the broker.
func checkNATSImage(t *testing.T, where, tag string) {
	t.Helper()
	m := regexp.MustCompile(`^(\d+)\.(\d+)\.\d+`).FindStringSubmatch(tag)
	if m == nil {
		t.Errorf("%s: NATS image tag %q: want a version", where, tag)
		return
	}
	major, _ := strconv.Atoi(m[1])
	minor, _ := strconv.Atoi(m[2])
	if major < minNATS[0] || major == minNATS[0] && minor < minNATS[1] {
		t.Errorf("%s: NATS %s: the broker needs %d.%d or later (message schedules)", where, tag, minNATS[0], minNATS[1])
	}
}

// portOf returns the port of a host:port.
func portOf(t *testing.T, where, hostport string) string {
	t.Helper()
	_, p, err := net.SplitHostPort(hostport)
	if err != nil {
		t.Errorf("%s: %q: %v", where, hostport, err)
	}
	return p
}

// TestDeployCompose checks deploy/compose: the images against the
// Dockerfile, every flag and ASSENT_ variable against the programs' flag
// sets, the ports and health checks against what the programs listen on, the
// mounts against the paths the programs are given, and the bot's
// configuration and the policy with the programs' own parsers.
func TestDeployCompose(t *testing.T) {
	stages := dockerfile(t)
	c := composeFileOf(t)
	want := []string{"approver-bot", "broker-1", "broker-2", "nats-1", "nats-2", "nats-3"}
	var have []string
	for name := range c.Services {
		have = append(have, name)
	}
	slices.Sort(have)
	if !slices.Equal(have, want) {
		t.Fatalf("compose.yaml: services %v, want %v", have, want)
	}
	var routes []string
	for _, name := range []string{"nats-1", "nats-2", "nats-3"} {
		routes = append(routes, "nats-route://"+name+":6222")
	}
	for name, s := range c.Services {
		where := "compose.yaml " + name
		if s.User == "" {
			t.Errorf("%s: no user: it would run as the image's, which cannot read the generated files", where)
		}
		for _, v := range s.Volumes {
			src, _, _ := strings.Cut(v, ":")
			if strings.HasPrefix(src, "./generated/") {
				continue // made by setup.sh: TestDeployLocal checks them
			}
			if _, err := os.Stat(filepath.Join(deployDir, "compose", src)); err != nil {
				t.Errorf("%s: mounts %s: %v", where, src, err)
			}
		}
		if strings.HasPrefix(name, "nats-") {
			repo, tag, _ := strings.Cut(s.Image, ":")
			if repo != "nats" {
				t.Errorf("%s: image %q, want the official nats", where, s.Image)
			}
			checkNATSImage(t, where, tag)
			if s.Environment["NATS_SERVER_NAME"] != name || s.Environment["NATS_STORE_DIR"] != "/data/"+name {
				t.Errorf("%s: server name %q, store %q", where, s.Environment["NATS_SERVER_NAME"], s.Environment["NATS_STORE_DIR"])
			}
			if r := s.Environment["NATS_ROUTES"]; r != "["+strings.Join(routes, ", ")+"]" {
				t.Errorf("%s: routes %s, want the three nodes %v", where, r, routes)
			}
			if !slices.Contains(s.Ports, "4222:4222") && !slices.ContainsFunc(s.Ports, func(p string) bool { return strings.HasSuffix(p, ":4222") }) ||
				portOf(t, where, s.Environment["NATS_LISTEN"]) != "4222" {
				t.Errorf("%s: clients listen on %s, published %v", where, s.Environment["NATS_LISTEN"], s.Ports)
			}
			if s.Healthcheck == nil || !slices.Contains(s.Healthcheck.Test, "http://127.0.0.1:"+portOf(t, where, s.Environment["NATS_MONITOR"])+"/healthz") {
				t.Errorf("%s: the health check does not ask the monitoring port's /healthz", where)
			}
			continue
		}
		target := imageTarget(t, where, s.Image, stages)
		if s.Build == nil || s.Build.Target != target || s.Build.Dockerfile != "deploy/Dockerfile" || s.Build.Context != "../.." {
			t.Errorf("%s: build %+v, want deploy/Dockerfile's target %s from the repository's root", where, s.Build, target)
		}
		args := s.Command
		if len(args) == 0 {
			args = stages[target].Cmd
		}
		flags := checkCommandLine(t, where, target, args)
		for k, v := range checkEnv(t, where, target, args, s.Environment) {
			flags[k] = v
		}
		// Every file a flag names is mounted.
		for _, f := range []string{"nats-creds", "nats-ca", "policy", "auth", "config"} {
			if p, ok := flags[f]; ok && !slices.ContainsFunc(s.Volumes, func(v string) bool { return strings.Contains(v, ":"+p+":") }) {
				t.Errorf("%s: --%s %s is not mounted", where, f, p)
			}
		}
		switch target {
		case "broker":
			if flags["replicas"] != "3" || flags["nats-url"] != "tls://nats-1:4222,tls://nats-2:4222,tls://nats-3:4222" || flags["auth"] == "" {
				t.Errorf("%s: want --replicas 3, the three nodes over TLS, and --auth: %v", where, flags)
			}
			if p := portOf(t, where, flags["http"]); !slices.ContainsFunc(s.Ports, func(x string) bool { return strings.HasSuffix(x, ":"+p) }) || !slices.Contains(stages[target].Expose, p) {
				t.Errorf("%s: HTTP on %s; published %v", where, flags["http"], s.Ports)
			}
		case "approver-bot":
			checkComposeBot(t, s)
		}
	}
}

// checkComposeBot parses the bot's configuration and the policy with their
// programs' parsers.
func checkComposeBot(t *testing.T, s composeService) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(deployDir, "compose", "bot.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := bot.ParseConfig(data, "bot.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if p := portOf(t, "bot.yaml", cfg.HTTP.Listen); !slices.Contains(s.Ports, p+":"+p) {
		t.Errorf("compose.yaml approver-bot: publishes %v, the bot listens on %s", s.Ports, cfg.HTTP.Listen)
	}
	for _, f := range []string{cfg.NATS.Creds, cfg.NATS.CAFile, cfg.Policy} {
		if !slices.ContainsFunc(s.Volumes, func(v string) bool { return strings.HasSuffix(v, ":"+f+":ro") }) {
			t.Errorf("compose.yaml approver-bot: bot.yaml names %s, which is not mounted", f)
		}
	}
	if s.EnvFile != "./generated/bot.env" {
		t.Errorf("compose.yaml approver-bot: env_file %q: the webhook secret comes from setup.sh's generated/bot.env", s.EnvFile)
	}
	if _, err := app.LoadPolicy(filepath.Join(deployDir, "compose", "policy.yaml")); err != nil {
		t.Errorf("policy.yaml: %v", err)
	}
}

// k8sObject is a Kubernetes object, as far as the tests read it.
type k8sObject struct {
	Kind     string `yaml:"kind"`
	Metadata struct {
		Name   string            `yaml:"name"`
		Labels map[string]string `yaml:"labels"`
	} `yaml:"metadata"`
	Data map[string]string `yaml:"data"`
	Spec struct {
		Replicas     int              `yaml:"replicas"`
		MinAvailable any              `yaml:"minAvailable"`
		Selector     yaml.Node        `yaml:"selector"` // matchLabels, or a Service's labels
		Ports        []k8sServicePort `yaml:"ports"`
		Template     k8sPodTemplate   `yaml:"template"`
	} `yaml:"spec"`
}

type k8sServicePort struct {
	Name       string `yaml:"name"`
	Port       int    `yaml:"port"`
	TargetPort any    `yaml:"targetPort"`
}

type k8sPodTemplate struct {
	Metadata struct {
		Labels map[string]string `yaml:"labels"`
	} `yaml:"metadata"`
	Spec struct {
		SecurityContext struct {
			RunAsNonRoot bool `yaml:"runAsNonRoot"`
			RunAsUser    int  `yaml:"runAsUser"`
		} `yaml:"securityContext"`
		Containers []k8sContainer `yaml:"containers"`
		Volumes    []struct {
			Name      string `yaml:"name"`
			ConfigMap *struct {
				Name string `yaml:"name"`
			} `yaml:"configMap"`
			Secret *struct {
				SecretName string `yaml:"secretName"`
			} `yaml:"secret"`
		} `yaml:"volumes"`
	} `yaml:"spec"`
}

type k8sProbe struct {
	HTTPGet *struct {
		Path string `yaml:"path"`
		Port any    `yaml:"port"`
	} `yaml:"httpGet"`
}

type k8sContainer struct {
	Name  string   `yaml:"name"`
	Image string   `yaml:"image"`
	Args  []string `yaml:"args"`
	Env   []struct {
		Name  string `yaml:"name"`
		Value string `yaml:"value"`
	} `yaml:"env"`
	Ports []struct {
		Name          string `yaml:"name"`
		ContainerPort int    `yaml:"containerPort"`
	} `yaml:"ports"`
	ReadinessProbe *k8sProbe `yaml:"readinessProbe"`
	LivenessProbe  *k8sProbe `yaml:"livenessProbe"`
	Resources      struct {
		Requests map[string]string `yaml:"requests"`
	} `yaml:"resources"`
	VolumeMounts []struct {
		Name      string `yaml:"name"`
		MountPath string `yaml:"mountPath"`
	} `yaml:"volumeMounts"`
}

// matchLabels returns a selector's matchLabels.
func matchLabels(t *testing.T, where string, n yaml.Node) map[string]string {
	t.Helper()
	var s struct {
		MatchLabels map[string]string `yaml:"matchLabels"`
	}
	if err := n.Decode(&s); err != nil || len(s.MatchLabels) == 0 {
		t.Fatalf("%s: selector without matchLabels (%v)", where, err)
	}
	return s.MatchLabels
}

// subset reports whether every label of sel is in labels.
func subset(sel, labels map[string]string) bool {
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// TestDeployKubernetes checks deploy/k8s/broker.yaml and nats-values.yaml:
// probes on /readyz and /healthz at the broker's HTTP port, selectors that
// match, the Service's target port, resource requests, the image, every flag
// and ASSENT_ variable against the broker's flag set, the policy against the
// policy parser and compose's, every ConfigMap made here and every Secret
// documented as made by the operator, and the Helm values for JetStream, three
// replicas, TLS and the accounts.
func TestDeployKubernetes(t *testing.T) {
	stages := dockerfile(t)
	data, err := os.ReadFile(filepath.Join(deployDir, "k8s", "broker.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	objs := map[string]k8sObject{}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	for {
		var o k8sObject
		if err := dec.Decode(&o); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("broker.yaml: %v", err)
		}
		if _, dup := objs[o.Kind]; dup {
			t.Fatalf("broker.yaml: two %s objects", o.Kind)
		}
		objs[o.Kind] = o
	}
	for _, k := range []string{"ConfigMap", "Deployment", "Service", "PodDisruptionBudget"} {
		if _, ok := objs[k]; !ok {
			t.Fatalf("broker.yaml: no %s", k)
		}
	}
	doc, err := os.ReadFile("../../docs/deploy.md")
	if err != nil {
		t.Fatal(err)
	}

	d := objs["Deployment"]
	pod := d.Spec.Template
	sel := matchLabels(t, "Deployment", d.Spec.Selector)
	if !subset(sel, pod.Metadata.Labels) {
		t.Errorf("Deployment: selector %v does not match its pods' labels %v", sel, pod.Metadata.Labels)
	}
	if pdb := matchLabels(t, "PodDisruptionBudget", objs["PodDisruptionBudget"].Spec.Selector); !subset(pdb, pod.Metadata.Labels) || len(pdb) != len(sel) {
		t.Errorf("PodDisruptionBudget: selector %v, the Deployment's pods %v", pdb, pod.Metadata.Labels)
	}
	if min, ok := objs["PodDisruptionBudget"].Spec.MinAvailable.(int); !ok || min < 1 || min >= d.Spec.Replicas {
		t.Errorf("PodDisruptionBudget: minAvailable %v with %d replicas: want at least 1 and room to drain one", objs["PodDisruptionBudget"].Spec.MinAvailable, d.Spec.Replicas)
	}
	var svcSel map[string]string
	svcNode := objs["Service"].Spec.Selector
	if err := svcNode.Decode(&svcSel); err != nil || len(svcSel) == 0 || !subset(svcSel, pod.Metadata.Labels) {
		t.Errorf("Service: selector %v does not match the Deployment's pods %v", svcSel, pod.Metadata.Labels)
	}
	if !pod.Spec.SecurityContext.RunAsNonRoot || pod.Spec.SecurityContext.RunAsUser == 0 {
		t.Errorf("Deployment: pods may run as root")
	}
	if len(pod.Spec.Containers) != 1 {
		t.Fatalf("Deployment: %d containers, want the broker", len(pod.Spec.Containers))
	}
	c := pod.Spec.Containers[0]
	if imageTarget(t, "Deployment", c.Image, stages) != "broker" {
		t.Errorf("Deployment: image %s is not the broker's", c.Image)
	}
	flags := checkCommandLine(t, "Deployment args", "broker", c.Args)
	env := map[string]string{}
	for _, e := range c.Env {
		env[e.Name] = e.Value
	}
	for k, v := range checkEnv(t, "Deployment env", "broker", c.Args, env) {
		flags[k] = v
	}
	if _, ok := env[envflag.Var("name")]; !ok {
		t.Errorf("Deployment: no %s: replicas would be named after their pods' host names by chance only", envflag.Var("name"))
	}

	// The HTTP port: --http, the container's port, the probes, the Service.
	httpPort := portOf(t, "Deployment --http", flags["http"])
	portName := ""
	for _, p := range c.Ports {
		if strconv.Itoa(p.ContainerPort) == httpPort {
			portName = p.Name
		}
	}
	if portName == "" {
		t.Fatalf("Deployment: --http %s, but no container port %s", flags["http"], httpPort)
	}
	for _, pr := range []struct {
		name  string
		probe *k8sProbe
		path  string
	}{{"readinessProbe", c.ReadinessProbe, "/readyz"}, {"livenessProbe", c.LivenessProbe, "/healthz"}} {
		if pr.probe == nil || pr.probe.HTTPGet == nil || pr.probe.HTTPGet.Path != pr.path ||
			(fmt.Sprint(pr.probe.HTTPGet.Port) != portName && fmt.Sprint(pr.probe.HTTPGet.Port) != httpPort) {
			t.Errorf("Deployment: %s: want GET %s on port %s (%s)", pr.name, pr.path, portName, httpPort)
		}
	}
	svc := objs["Service"].Spec.Ports
	if len(svc) != 1 || (fmt.Sprint(svc[0].TargetPort) != portName && fmt.Sprint(svc[0].TargetPort) != httpPort) {
		t.Errorf("Service: ports %+v, want one with the container's port %s (%s) as its target", svc, portName, httpPort)
	}
	if c.Resources.Requests["cpu"] == "" || c.Resources.Requests["memory"] == "" {
		t.Errorf("Deployment: resource requests %v, want cpu and memory", c.Resources.Requests)
	}

	// Files: each flag's file is in a mounted volume; a ConfigMap volume is
	// the one made here with that key, a Secret's name and key are in
	// docs/deploy.md with how to make it.
	volumes := map[string]string{} // mount path: volume name
	for _, m := range c.VolumeMounts {
		volumes[m.MountPath] = m.Name
	}
	for _, f := range []string{"nats-creds", "nats-ca", "policy", "auth"} {
		p, ok := flags[f]
		if !ok {
			t.Errorf("Deployment: no --%s", f)
			continue
		}
		vol, ok := volumes[path.Dir(p)]
		if !ok {
			t.Errorf("Deployment: --%s %s: %s is not mounted", f, p, path.Dir(p))
			continue
		}
		for _, v := range pod.Spec.Volumes {
			switch {
			case v.Name != vol:
			case v.ConfigMap != nil:
				cm := objs["ConfigMap"]
				if v.ConfigMap.Name != cm.Metadata.Name || cm.Data[path.Base(p)] == "" {
					t.Errorf("Deployment: --%s %s: ConfigMap %s has no %s", f, p, v.ConfigMap.Name, path.Base(p))
				}
			case v.Secret != nil:
				if !strings.Contains(string(doc), v.Secret.SecretName) || !strings.Contains(string(doc), path.Base(p)) {
					t.Errorf("Deployment: --%s %s: docs/deploy.md does not say how to make Secret %s with %s", f, p, v.Secret.SecretName, path.Base(p))
				}
			default:
				t.Errorf("Deployment: volume %s is neither a ConfigMap nor a Secret", v.Name)
			}
		}
	}

	// The policy: valid, and compose's.
	policy := objs["ConfigMap"].Data[path.Base(flags["policy"])]
	pf := filepath.Join(t.TempDir(), "policy.yaml")
	writeFile(t, pf, policy)
	if _, err := app.LoadPolicy(pf); err != nil {
		t.Errorf("ConfigMap %s: %v", objs["ConfigMap"].Metadata.Name, err)
	}
	composePolicy, err := os.ReadFile(filepath.Join(deployDir, "compose", "policy.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var a, b any
	if yaml.Unmarshal([]byte(policy), &a) != nil || yaml.Unmarshal(composePolicy, &b) != nil || fmt.Sprint(a) != fmt.Sprint(b) {
		t.Errorf("ConfigMap %s: not deploy/compose/policy.yaml's policy", objs["ConfigMap"].Metadata.Name)
	}

	checkNATSValues(t, flags["nats-url"], string(doc))
}

// checkNATSValues checks deploy/k8s/nats-values.yaml, the values of NATS's
// Helm chart.
func checkNATSValues(t *testing.T, brokerURL, doc string) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(deployDir, "k8s", "nats-values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	type tls struct {
		Enabled    bool           `yaml:"enabled"`
		SecretName string         `yaml:"secretName"`
		Merge      map[string]any `yaml:"merge"`
	}
	type patch struct {
		Op    string `yaml:"op"`
		Path  string `yaml:"path"`
		Value struct {
			Name      string `yaml:"name"`
			MountPath string `yaml:"mountPath"`
			Secret    struct {
				SecretName string `yaml:"secretName"`
			} `yaml:"secret"`
		} `yaml:"value"`
	}
	var v struct {
		Config struct {
			Cluster struct {
				Enabled  bool `yaml:"enabled"`
				Replicas int  `yaml:"replicas"`
				TLS      tls  `yaml:"tls"`
			} `yaml:"cluster"`
			JetStream struct {
				Enabled   bool `yaml:"enabled"`
				FileStore struct {
					Enabled bool `yaml:"enabled"`
					PVC     struct {
						Enabled bool `yaml:"enabled"`
					} `yaml:"pvc"`
				} `yaml:"fileStore"`
				Merge map[string]any `yaml:"merge"`
			} `yaml:"jetstream"`
			NATS struct {
				Port int `yaml:"port"`
				TLS  tls `yaml:"tls"`
			} `yaml:"nats"`
			Merge map[string]any `yaml:"merge"`
		} `yaml:"config"`
		TLSCA struct {
			Enabled    bool   `yaml:"enabled"`
			SecretName string `yaml:"secretName"`
			Key        string `yaml:"key"`
		} `yaml:"tlsCA"`
		Container struct {
			Image struct {
				Tag string `yaml:"tag"`
			} `yaml:"image"`
			Patch []patch `yaml:"patch"`
		} `yaml:"container"`
		PodTemplate struct {
			Patch []patch `yaml:"patch"`
		} `yaml:"podTemplate"`
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(false)
	if err := dec.Decode(&v); err != nil {
		t.Fatalf("nats-values.yaml: %v", err)
	}
	cfg := v.Config
	if !cfg.Cluster.Enabled || cfg.Cluster.Replicas != 3 {
		t.Errorf("nats-values.yaml: cluster %v with %d replicas, want 3", cfg.Cluster.Enabled, cfg.Cluster.Replicas)
	}
	if !cfg.JetStream.Enabled || !cfg.JetStream.FileStore.Enabled || !cfg.JetStream.FileStore.PVC.Enabled || cfg.JetStream.Merge["sync_interval"] != "always" {
		t.Errorf("nats-values.yaml: JetStream %+v: want a file store on a volume, fsync always", cfg.JetStream)
	}
	if !cfg.NATS.TLS.Enabled || !cfg.Cluster.TLS.Enabled || cfg.Cluster.TLS.Merge["verify"] != true || !v.TLSCA.Enabled {
		t.Errorf("nats-values.yaml: TLS for clients %v, routes %v (verify %v), CA %v", cfg.NATS.TLS.Enabled, cfg.Cluster.TLS.Enabled, cfg.Cluster.TLS.Merge["verify"], v.TLSCA.Enabled)
	}
	if n, ok := cfg.Merge["max_control_line"].(int); !ok || n < 32768 {
		t.Errorf("nats-values.yaml: max_control_line %v: a bot's user JWT needs 32 KiB", cfg.Merge["max_control_line"])
	}
	if n, ok := cfg.Merge["max_payload"].(int); !ok || n < broker.NeededMaxPayload(events.DefaultMaxEventSize) {
		t.Errorf("nats-values.yaml: max_payload %v: the broker needs %d for events of the default 1 MiB", cfg.Merge["max_payload"], broker.NeededMaxPayload(events.DefaultMaxEventSize))
	}
	checkNATSImage(t, "nats-values.yaml", v.Container.Image.Tag)
	u, err := url.Parse(strings.Split(brokerURL, ",")[0])
	if err != nil || u.Scheme != "tls" || u.Hostname() != "nats" || u.Port() != strconv.Itoa(cfg.NATS.Port) {
		t.Errorf("broker.yaml: --nats-url %s: want tls://nats:%d, the chart's service for release nats", brokerURL, cfg.NATS.Port)
	}
	// The accounts: included from a mount of the Secret the docs make.
	inc, _ := cfg.Merge["$include"].(string)
	accounts := path.Clean(path.Join("/etc/nats-config", inc)) // relative to the chart's nats.conf
	var mount, secret string
	for _, p := range v.Container.Patch {
		if p.Op == "add" && p.Path == "/volumeMounts/-" && path.Dir(accounts) == path.Clean(p.Value.MountPath) {
			mount = p.Value.Name
		}
	}
	for _, p := range v.PodTemplate.Patch {
		if p.Op == "add" && p.Path == "/spec/volumes/-" && p.Value.Name == mount && mount != "" {
			secret = p.Value.Secret.SecretName
		}
	}
	if inc == "" || mount == "" || secret == "" {
		t.Errorf("nats-values.yaml: the accounts: $include %q (%s), mounted from volume %q of Secret %q", inc, accounts, mount, secret)
	}
	for _, s := range []string{secret, cfg.NATS.TLS.SecretName, cfg.Cluster.TLS.SecretName, v.TLSCA.SecretName} {
		if s == "" || !strings.Contains(doc, s) {
			t.Errorf("nats-values.yaml: Secret %q: docs/deploy.md does not say how to make it", s)
		}
	}
	if !strings.Contains(doc, path.Base(accounts)) || !strings.Contains(doc, v.TLSCA.Key) {
		t.Errorf("nats-values.yaml: docs/deploy.md does not name the keys %s and %s", path.Base(accounts), v.TLSCA.Key)
	}
}

// TestDeployLocal runs deploy/local/run.sh (three NATS nodes in operator mode
// over TLS, two broker replicas, the approver bot, from deploy/compose's
// files), makes an approval through it: an agent asks over NATS with its
// credentials, the bot's inbound webhook answers, the agent gets the
// decision, and a broker's HTTP API shows it; then stops the script with
// SIGTERM and checks that it and every process it started have exited.
func TestDeployLocal(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the programs and runs the topology")
	}
	if _, err := exec.LookPath("openssl"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("openssl is not installed; .ci/run installs it")
		}
		t.Skip("openssl is not installed (Debian: apt-get install openssl): deploy/compose/setup.sh makes the certificates with it")
	}
	bin := t.TempDir()
	for _, name := range []string{"broker", "approver-bot"} {
		if err := os.Symlink(itest.Binary(t, name), filepath.Join(bin, name)); err != nil {
			t.Fatal(err)
		}
	}
	build := exec.Command("go", "build", "-o", filepath.Join(bin, "nats-server"), "github.com/nats-io/nats-server/v2")
	build.Dir = "../.."
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build nats-server: %v\n%s", err, out)
	}

	var (
		dir    string
		base   int
		cmd    *exec.Cmd
		out    *itest.LockedBuffer
		exited chan error
	)
	// started runs run.sh on ports found free; false if it must run again.
	started := func(attempt int) bool {
		dir = t.TempDir()
		base = freePorts(t, 13)
		c := exec.Command("bash", filepath.Join(deployDir, "local", "run.sh"), "--dir", dir, "--base-port", strconv.Itoa(base), "--bin", bin)
		o, ex := &itest.LockedBuffer{}, make(chan error, 1)
		cmd, out, exited = c, o, ex
		pr, pw := io.Pipe()
		c.Stdout, c.Stderr = io.MultiWriter(o, pw), o
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{}) // closed once the script has exited
		go func() {
			err := c.Wait()
			close(done)
			ex <- err
			pw.Close()
		}()
		t.Cleanup(func() {
			// If the test failed early: stop the script as Ctrl-C would, which
			// stops what it started.
			select {
			case <-done:
			default:
				_ = c.Process.Signal(syscall.SIGTERM)
				select {
				case <-done:
				case <-time.After(time.Minute):
					_ = c.Process.Kill()
				}
			}
		})
		ready := make(chan struct{})
		go func() {
			sc := bufio.NewScanner(pr)
			for sc.Scan() {
				if sc.Text() == "run: ready" {
					close(ready)
				}
			}
			_, _ = io.Copy(io.Discard, pr)
		}()
		select {
		case <-ready:
		case err := <-exited:
			if strings.Contains(out.String(), "address already in use") && attempt < 3 {
				// A port found free was taken since by another test's process.
				t.Logf("run.sh exited: a port was taken since it was found free; again on others:\n%s", out)
				return false
			}
			t.Fatalf("run.sh exited before it was ready: %v\n%s", err, out)
		case <-time.After(2 * time.Minute):
			t.Fatalf("run.sh not ready within 2 minutes:\n%s", out)
		}
		return true
	}
	for attempt := 1; !started(attempt); attempt++ { // each attempt on other ports
	}
	gen := filepath.Join(dir, "generated")
	checkGenerated(t, gen)

	// The agent: its credentials, the CA, all three nodes over TLS.
	urls := fmt.Sprintf("tls://127.0.0.1:%d,tls://127.0.0.1:%d,tls://127.0.0.1:%d", base, base+1, base+2)
	nc, err := nats.Connect(urls, nats.UserCredentials(filepath.Join(gen, "creds", "agent-demo.creds")),
		nats.RootCAs(filepath.Join(gen, "tls", "ca.pem")), nats.MaxReconnects(-1))
	if err != nil {
		t.Fatalf("agent: %v\n%s", err, out)
	}
	defer nc.Close()
	client, err := handler.NewClient(nc, handler.Config{Agent: "demo"})
	if err != nil {
		t.Fatal(err)
	}
	id := events.NewID()
	type result struct {
		d   handler.Decision
		err error
	}
	decided := make(chan result, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		d, err := client.Request(ctx, handler.Request{ID: id, Requested: events.Requested{
			Tool: "delete_file", Args: []byte(`{"path":"/srv/reports/q3.csv"}`), User: "carol", Hint: "Delete the Q3 report?",
		}})
		decided <- result{d, err}
	}()

	// Pending, as broker-2's API shows it to ops with its token.
	token, err := os.ReadFile(filepath.Join(gen, "auth", "ops.token"))
	if err != nil {
		t.Fatal(err)
	}
	auth := http.Header{"Authorization": {"Bearer " + strings.TrimSpace(string(token))}}
	approval := fmt.Sprintf("http://127.0.0.1:%d/v1/approvals/%s", base+11, id)
	itest.Eventually(t, itest.Patience, func() (bool, string) {
		r, err := itest.DoHTTPWith(context.Background(), http.MethodGet, approval, auth, nil)
		return err == nil && r.Status == http.StatusOK && strings.Contains(string(r.Body), `"state":"pending"`), fmt.Sprintf("%v %d %s", err, r.Status, r.Body)
	})

	// CI answers through the bot's inbound webhook, signed with its secret.
	env, err := os.ReadFile(filepath.Join(gen, "bot.env"))
	if err != nil {
		t.Fatal(err)
	}
	secret, err := webhook.ParseSecret(strings.TrimSpace(strings.TrimPrefix(string(env), "CI_WEBHOOK_SECRET=")))
	if err != nil {
		t.Fatal(err)
	}
	body := []byte(`{"request_id":"` + id + `","decision":"approve","reason":"pipeline green"}`)
	h := http.Header{"Content-Type": {"application/json"}}
	now := time.Now()
	h.Set(webhook.HeaderID, "deploy-"+id)
	h.Set(webhook.HeaderTimestamp, strconv.FormatInt(now.Unix(), 10))
	h.Set(webhook.HeaderSignature, webhook.Sign(secret, "deploy-"+id, now, body))
	r, err := itest.DoHTTPWith(itest.TestCtx(t, itest.Patience), http.MethodPost, fmt.Sprintf("http://127.0.0.1:%d/webhooks/in/ci", base+12), h, body)
	if err != nil || r.Status != http.StatusAccepted {
		t.Fatalf("inbound webhook: %v %d %s", err, r.Status, r.Body)
	}
	select {
	case res := <-decided:
		if res.err != nil || !res.d.Approved() || len(res.d.DecidedBy) != 1 || res.d.DecidedBy[0].Principal != "ci-bot" || res.d.Rule != "everything-else" {
			t.Fatalf("decision: %+v, %v", res.d, res.err)
		}
	case <-time.After(itest.Patience):
		t.Fatalf("no decision within %s\n%s", itest.Patience, out)
	}
	a := itest.ApprovalOf(t, call2(t, http.MethodGet, fmt.Sprintf("http://127.0.0.1:%d/v1/approvals/%s", base+10, id), auth), http.StatusOK)
	if a.State != broker.StateApproved {
		t.Errorf("broker-1 shows the request %s", a.State)
	}
	nc.Close()

	// SIGTERM stops everything, in order, and the script exits 0.
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("run.sh after SIGTERM: %v\n%s", err, out)
		}
	case <-time.After(time.Minute):
		t.Fatalf("run.sh did not stop within a minute of SIGTERM:\n%s", out)
	}
	for _, name := range []string{"approver-bot", "broker-2", "broker-1", "nats-3", "nats-2", "nats-1"} {
		if !strings.Contains(out.String(), "run: stopped "+name+"\n") {
			t.Errorf("run.sh did not report stopping %s:\n%s", name, out)
		}
	}
	pids, err := os.ReadFile(filepath.Join(dir, "run.pids"))
	if err != nil {
		t.Fatal(err)
	}
	if n := len(strings.Split(strings.TrimSpace(string(pids)), "\n")); n != 6 {
		t.Errorf("run.pids lists %d processes, want 6:\n%s", n, pids)
	}
	for _, l := range strings.Split(strings.TrimSpace(string(pids)), "\n") {
		name, pid, _ := strings.Cut(l, " ")
		p, err := strconv.Atoi(pid)
		if err != nil {
			t.Fatalf("run.pids: %q", l)
		}
		if err := syscall.Kill(p, 0); !errors.Is(err, syscall.ESRCH) {
			t.Errorf("%s (process %d) still runs after run.sh exited: %v", name, p, err)
			_ = syscall.Kill(p, syscall.SIGKILL)
		}
	}
}

// call2 is call with a header.
func call2(t *testing.T, method, url string, header http.Header) itest.HTTPResp {
	t.Helper()
	r, err := itest.DoHTTPWith(itest.TestCtx(t, itest.Patience), method, url, header, nil)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// checkGenerated checks that setup.sh made every file that compose.yaml
// mounts from generated/, with private keys and credentials readable by
// their owner only.
func checkGenerated(t *testing.T, gen string) {
	t.Helper()
	for name, s := range composeFileOf(t).Services {
		files := s.Volumes
		if s.EnvFile != "" {
			files = append(files, s.EnvFile+":")
		}
		for _, v := range files {
			src, _, _ := strings.Cut(v, ":")
			rel, ok := strings.CutPrefix(src, "./generated/")
			if !ok {
				continue
			}
			fi, err := os.Stat(filepath.Join(gen, rel))
			if err != nil {
				t.Errorf("compose.yaml %s mounts %s, which setup.sh did not make: %v", name, src, err)
				continue
			}
			secret := strings.HasSuffix(rel, ".creds") || strings.HasSuffix(rel, "-key.pem") || strings.HasSuffix(rel, ".env") || strings.HasPrefix(rel, "auth/")
			if secret && fi.Mode().Perm()&0o077 != 0 {
				t.Errorf("setup.sh: %s is mode %v: others may read it", rel, fi.Mode().Perm())
			}
		}
	}
}

// freePorts returns the first of n consecutive free loopback ports.
func freePorts(t *testing.T, n int) int {
	t.Helper()
	for try := 0; try < 50; try++ {
		base := 20000 + int(time.Now().UnixNano()%40000)
		free := true
		for p := base; p < base+n && free; p++ {
			ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
			if err != nil {
				free = false
				continue
			}
			ln.Close()
		}
		if free {
			return base
		}
	}
	t.Fatalf("no %d consecutive free ports found", n)
	return 0
}
