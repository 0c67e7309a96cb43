//go:build unix

package ops

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/assent-dev/assent/integration/itest"
)

// The container tests (compose_test.go, tag containers) need an engine;
// these check, in every run, what keeps them and the images honest: the
// stand-ins of tools/containers are the images deploy/ names, at the
// versions it names, and the build context leaves out data and build output.

// qualified is an image reference as engines store it: a name without a
// registry is Docker Hub's, and one without a path its library's.
func qualified(ref string) string {
	name, _, _ := strings.Cut(ref, ":")
	first, _, ok := strings.Cut(name, "/")
	switch {
	case !ok:
		return "docker.io/library/" + ref
	case !strings.ContainsAny(first, ".:") && first != "localhost":
		return "docker.io/" + ref
	}
	return ref
}

// TestContainersStandins checks tools/containers/standins.sh against
// deploy/: it builds a stand-in under the name of every base image of
// deploy/Dockerfile (its ARG defaults applied) and every image Compose pulls,
// and the nats stand-in's nats-server (go.mod's) is the version its tag
// says.
func TestContainersStandins(t *testing.T) {
	src, err := os.ReadFile(filepath.Join(itest.RepoRoot(), "tools", "containers", "standins.sh"))
	if err != nil {
		t.Fatal(err)
	}
	var standins []string
	for _, m := range regexp.MustCompile(`(?m)^name=(\S+)$`).FindAllStringSubmatch(string(src), -1) {
		standins = append(standins, m[1])
	}

	df, err := os.ReadFile(filepath.Join(deployDir, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	args := map[string]string{}
	stages := map[string]bool{}
	var bases []string
	for _, l := range strings.Split(string(df), "\n") {
		f := strings.Fields(l)
		switch {
		case len(f) == 2 && f[0] == "ARG":
			if k, v, ok := strings.Cut(f[1], "="); ok {
				args[k] = v
			}
		case len(f) >= 2 && f[0] == "FROM":
			img := os.Expand(f[1], func(k string) string { return args[k] })
			if !stages[img] { // FROM an earlier stage is no base image
				bases = append(bases, img)
			}
			if len(f) == 4 {
				stages[f[3]] = true
			}
		}
	}
	var natsTag string
	for name, s := range composeFileOf(t).Services {
		if s.Build == nil {
			bases = append(bases, s.Image)
			if strings.HasPrefix(name, "nats-") {
				_, natsTag, _ = strings.Cut(s.Image, ":")
			}
		}
	}
	if len(bases) < 3 {
		t.Fatalf("found base images %v: want golang, distroless and nats", bases)
	}
	for _, b := range bases {
		if b == "scratch" {
			continue
		}
		if !slices.Contains(standins, qualified(b)) {
			t.Errorf("%s (deploy/) has no stand-in in tools/containers/standins.sh (name=%s)", b, qualified(b))
		}
	}

	out, err := exec.Command("go", "list", "-m", "-f", "{{.Version}}", "github.com/nats-io/nats-server/v2").Output()
	if err != nil {
		t.Skipf("go list -m nats-server: %v", err)
	}
	have := strings.TrimPrefix(strings.TrimSpace(string(out)), "v")
	if tag, _, _ := strings.Cut(natsTag, "-"); tag != have {
		t.Errorf("compose.yaml runs nats:%s, but the stand-in builds nats-server %s (go.mod's): bump them together", natsTag, have)
	}
}

// TestContainersBuildContext checks that .dockerignore leaves out the data,
// secrets and build output that a working tree holds, and that every image
// in compose.yaml that is built is built from the repository's root.
func TestContainersBuildContext(t *testing.T) {
	ignore, err := os.ReadFile(filepath.Join(itest.RepoRoot(), ".dockerignore"))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(ignore), "\n")
	for _, want := range []string{
		".git", "**/node_modules", "examples/typescript/dist", // sources' tooling and output
		"deploy/compose/generated", "deploy/local/run", // keys, credentials, NATS data
		"assent-data", "bin", "*.test", "*.out", // the quick start's data, built programs
	} {
		if !slices.Contains(lines, want) {
			t.Errorf(".dockerignore does not leave out %s", want)
		}
	}
}

// previousRelease is the release TestUpgrade rolls from: the tip of the
// last landed stop before this one's, whose broker made the ASSENT stream
// taking message schedules and kept its durable ticks there (before
// ASSENT_TIMERS). Move it forward with each release.
const previousRelease = "61ddd16"

// runbook is the upgrade of the compose stack as docs/deploy.md
// ("Upgrading the compose stack") gives it, command by command, NEW
// standing for the new release's tag and SERVICE for each of broker-1,
// broker-2 and approver-bot in turn. TestUpgrade runs these lines as they
// are (with its own Compose and project), and TestUpgradeRunbook checks
// that the page shows each.
var runbook = struct {
	setup, build, backup, roll, keep, verify string // the upgrade
	down, empty, nats, restore, start        string // the backup restored into an emptied cluster
}{
	setup:   "deploy/compose/setup.sh",
	build:   "IMAGE_TAG=NEW docker compose -f deploy/compose/compose.yaml build",
	backup:  `docker compose -f deploy/compose/compose.yaml run --rm --no-deps -v "$PWD/deploy/compose/generated/backups:/backups" broker-1 backup --nats-creds /etc/assent/creds/broker.creds --out /backups/before-NEW`,
	roll:    "IMAGE_TAG=NEW docker compose -f deploy/compose/compose.yaml up --detach --no-deps --wait SERVICE",
	keep:    "sed -i '/^IMAGE_TAG=/d' deploy/compose/.env && echo IMAGE_TAG=NEW >>deploy/compose/.env",
	verify:  "docker compose -f deploy/compose/compose.yaml run --rm --no-deps broker-1 audit verify --nats-creds /etc/assent/creds/broker.creds",
	down:    "docker compose -f deploy/compose/compose.yaml down",
	empty:   "rm -rf deploy/compose/generated/data/nats-*/*",
	nats:    "docker compose -f deploy/compose/compose.yaml up --detach --wait nats-1 nats-2 nats-3",
	restore: `docker compose -f deploy/compose/compose.yaml run --rm --no-deps -v "$PWD/deploy/compose/generated/backups:/backups" broker-1 restore --nats-creds /etc/assent/creds/broker.creds --from /backups/before-NEW`,
	start:   "docker compose -f deploy/compose/compose.yaml up --detach --wait",
}

// TestUpgradeRunbook checks that docs/deploy.md shows every command of the
// runbook TestUpgrade runs, each on a line of its own in a sh block.
func TestUpgradeRunbook(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(itest.RepoRoot(), "docs", "deploy.md"))
	if err != nil {
		t.Fatal(err)
	}
	lines := map[string]bool{}
	for _, l := range strings.Split(string(data), "\n") {
		l, _, _ = strings.Cut(l, "  #") // a comment after the command
		lines[strings.TrimSpace(l)] = true
	}
	r := runbook
	want := []string{r.setup, r.build, r.backup, r.keep, r.verify, r.down, r.empty, r.nats, r.restore, r.start}
	for _, svc := range []string{"broker-1", "broker-2", "approver-bot"} {
		want = append(want, strings.ReplaceAll(r.roll, "SERVICE", svc))
	}
	for _, c := range want {
		if !lines[c] {
			t.Errorf("docs/deploy.md does not show, on a line of its own, the runbook's\n\t%s", c)
		}
	}
}
