//go:build unix

package ops

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"
	k8syaml "sigs.k8s.io/yaml"

	"github.com/assent-dev/assent/internal/app"
	"github.com/assent-dev/assent/internal/bot"
	"github.com/assent-dev/assent/internal/envflag"
	"github.com/assent-dev/assent/internal/mcpgateway"
)

// The Helm chart of deploy/helm/assent (docs/deploy.md, "Kubernetes with
// Helm") is checked here with a real helm, built from the Go module proxy at
// helmVersion: helm lint and helm template with every documented values
// file, every rendered document decoded strictly into the Kubernetes API's
// Go types (a misspelt or misplaced field fails), and what the documents say
// checked against the programs: every flag and ASSENT_ variable against
// their flag sets (internal/programs), every file a flag or a configuration
// names against the volumes, the bot's and the gateway's configurations and
// the policy with the programs' own parsers, probes against the real health
// endpoints, selectors, ports and the security settings of every container.

const (
	// helmVersion is the Helm the tests build (go install
	// helm.sh/helm/v3/cmd/helm@helmVersion), cached under GOCACHE.
	helmVersion = "v3.22.0"
	// helmKubeVersion is the Kubernetes version helm template renders for
	// (a helm built by go install has no default of its own that the
	// chart's kubeVersion accepts).
	helmKubeVersion = "1.31.0"
	chartDir        = deployDir + "/helm/assent"
)

var (
	helmOnce sync.Once
	helmPath string
	helmErr  error
)

// helm returns the path of a helm binary at helmVersion, built once into
// $(go env GOCACHE)/assent-helm/VERSION. If it cannot be built, the test
// is skipped, or fails with CI=true.
func helm(t *testing.T) string {
	t.Helper()
	helmOnce.Do(func() { helmPath, helmErr = buildHelm() })
	if helmErr != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("helm %s: %v", helmVersion, helmErr)
		}
		t.Skipf("helm %s could not be built from the Go module proxy (go install helm.sh/helm/v3/cmd/helm@%s): %v", helmVersion, helmVersion, helmErr)
	}
	return helmPath
}

func buildHelm() (string, error) {
	out, err := exec.Command("go", "env", "GOCACHE").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOCACHE: %w", err)
	}
	dir := filepath.Join(strings.TrimSpace(string(out)), "assent-helm", helmVersion)
	bin := filepath.Join(dir, "helm")
	if _, err := os.Stat(bin); err == nil {
		return bin, nil
	}
	if testing.Short() {
		return "", errors.New("not built yet, and -short builds nothing that large")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	tmp, err := os.MkdirTemp(dir, "build-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	cmd := exec.Command("go", "install", "helm.sh/helm/v3/cmd/helm@"+helmVersion)
	cmd.Dir = tmp // outside the module: go install pkg@version ignores it anyway
	cmd.Env = append(os.Environ(), "GOBIN="+tmp, "GOWORK=off", "GOFLAGS=-buildvcs=false", "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go install: %v\n%s", err, out)
	}
	// Renamed into place whole: a concurrent run sees a complete binary or none.
	if err := os.Rename(filepath.Join(tmp, "helm"), bin); err != nil {
		return "", err
	}
	return bin, nil
}

// runHelm runs helm with args from the repository's root and returns its
// standard output.
func runHelm(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(helm(t), args...)
	cmd.Dir = "../.."
	cmd.Env = append(os.Environ(), "HELM_CONFIG_HOME="+t.TempDir(), "HELM_CACHE_HOME="+t.TempDir(), "HELM_DATA_HOME="+t.TempDir())
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if err != nil {
		err = fmt.Errorf("helm %s: %v\n%s%s", strings.Join(args, " "), err, stderr.String(), stdout.String())
	}
	return stdout.String(), err
}

// helmCase is one way of installing the chart: a documented values file,
// or values set on the command line.
type helmCase struct {
	name string
	args []string // -f FILE, --set ...
}

// helmCases are the chart's defaults, every example under
// deploy/helm/examples, and inline secrets (the Secret the chart makes).
func helmCases(t *testing.T) []helmCase {
	t.Helper()
	cases := []helmCase{{name: "values.yaml"}}
	files, err := filepath.Glob(filepath.Join(deployDir, "helm", "examples", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("deploy/helm/examples: no values files (%v)", err)
	}
	for _, f := range files {
		rel, _ := filepath.Rel("../..", f)
		cases = append(cases, helmCase{name: "examples/" + filepath.Base(f), args: []string{"-f", rel}})
	}
	cases = append(cases, helmCase{name: "inline secrets", args: []string{
		"-f", "deploy/helm/examples/gateway-and-bot.yaml",
		"--set", "broker.auth.value=tokens: []",
		"--set", "broker.natsCreds.value=creds",
		"--set", "approverBot.natsCreds.value=bot creds",
		"--set", "broker.metrics.token.value=0123456789abcdef0123",
		"--set", "approverBot.env.values.CI_WEBHOOK_SECRET=whsec_x",
		"--set", "serviceMonitor.enabled=true",
	}})
	return cases
}

// TestHelmChart lints and renders the chart with each documented values
// file and checks what it renders.
func TestHelmChart(t *testing.T) {
	helm(t)
	doc, err := os.ReadFile("../../docs/deploy.md")
	if err != nil {
		t.Fatal(err)
	}
	stages := dockerfile(t)
	for _, c := range helmCases(t) {
		t.Run(c.name, func(t *testing.T) {
			if _, err := runHelm(t, append([]string{"lint", "--strict", "deploy/helm/assent", "--kube-version", helmKubeVersion}, c.args...)...); err != nil {
				t.Error(err)
			}
			out, err := runHelm(t, append([]string{"template", "assent", "deploy/helm/assent", "--namespace", "assent", "--kube-version", helmKubeVersion}, c.args...)...)
			if err != nil {
				t.Fatal(err)
			}
			if c.args != nil && c.args[0] == "-f" && !strings.Contains(string(doc), c.args[1]) {
				t.Errorf("docs/deploy.md does not mention %s", c.args[1])
			}
			checkRendered(t, decodeRendered(t, out), string(doc), stages)
		})
	}
}

// TestHelmChartRefuses checks that the chart refuses, with its reason,
// values that would make pods that cannot start.
func TestHelmChartRefuses(t *testing.T) {
	helm(t)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--set", "broker.auth.existingSecret="}, "broker.auth"},
		{[]string{"--set", "mcpGateway.enabled=true"}, "mcpGateway.config.upstreams"},
		{[]string{"--set", "broker.auth.value=a", "--set", "broker.auth.key=k", "--set", "broker.natsCreds.value=b", "--set", "broker.natsCreds.key=k"}, "two secret values with the key k"},
	} {
		_, err := runHelm(t, append([]string{"template", "assent", "deploy/helm/assent", "--kube-version", helmKubeVersion}, tc.args...)...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("helm template %v: %v, want an error naming %q", tc.args, err, tc.want)
		}
	}
}

// rendered is what helm template printed, decoded.
type rendered struct {
	deployments     []*appsv1.Deployment
	services        []*corev1.Service
	configMaps      map[string]*corev1.ConfigMap
	secrets         map[string]*corev1.Secret
	pdbs            []*policyv1.PodDisruptionBudget
	netpols         []*networkingv1.NetworkPolicy
	serviceMonitors []*monitoringv1.ServiceMonitor
}

// strictDecode decodes one YAML document into obj as the API server's
// strict field validation would: through JSON, refusing unknown and
// duplicate fields.
func strictDecode(doc []byte, obj any) error {
	return k8syaml.UnmarshalStrict(doc, obj)
}

// decodeRendered splits helm template's output into documents and decodes
// each strictly into its kind's API type; a kind the test does not know
// fails.
func decodeRendered(t *testing.T, out string) rendered {
	t.Helper()
	r := rendered{configMaps: map[string]*corev1.ConfigMap{}, secrets: map[string]*corev1.Secret{}}
	for _, d := range strings.Split("\n"+out, "\n---\n") {
		if strings.TrimSpace(stripComments(d)) == "" {
			continue
		}
		var tm metav1.TypeMeta
		if err := k8syaml.Unmarshal([]byte(d), &tm); err != nil {
			t.Fatalf("not YAML: %v\n%s", err, d)
		}
		var obj interface{ GetName() string }
		switch tm.APIVersion + " " + tm.Kind {
		case "apps/v1 Deployment":
			o := &appsv1.Deployment{}
			r.deployments, obj = append(r.deployments, o), o
		case "v1 Service":
			o := &corev1.Service{}
			r.services, obj = append(r.services, o), o
		case "v1 ConfigMap":
			obj = &corev1.ConfigMap{}
		case "v1 Secret":
			obj = &corev1.Secret{}
		case "policy/v1 PodDisruptionBudget":
			o := &policyv1.PodDisruptionBudget{}
			r.pdbs, obj = append(r.pdbs, o), o
		case "networking.k8s.io/v1 NetworkPolicy":
			o := &networkingv1.NetworkPolicy{}
			r.netpols, obj = append(r.netpols, o), o
		case "monitoring.coreos.com/v1 ServiceMonitor":
			o := &monitoringv1.ServiceMonitor{}
			r.serviceMonitors, obj = append(r.serviceMonitors, o), o
		default:
			t.Fatalf("%s %s: a kind this test does not decode: add its API type\n%s", tm.APIVersion, tm.Kind, d)
		}
		if err := strictDecode([]byte(d), obj); err != nil {
			t.Fatalf("%s %s: not a valid object of the Kubernetes API: %v\n%s", tm.Kind, obj.GetName(), err, d)
		}
		switch o := obj.(type) {
		case *corev1.ConfigMap:
			r.configMaps[o.Name] = o
		case *corev1.Secret:
			r.secrets[o.Name] = o
		}
		for _, msg := range validation.IsDNS1123Subdomain(obj.GetName()) {
			t.Errorf("%s %q: name: %s", tm.Kind, obj.GetName(), msg)
		}
	}
	return r
}

// stripComments drops helm's "# Source:" lines and other comment lines.
func stripComments(doc string) string {
	var b strings.Builder
	for _, l := range strings.Split(doc, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "#") {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}

// checkRendered checks the objects one rendering made.
func checkRendered(t *testing.T, r rendered, doc string, stages map[string]*dockerStage) {
	t.Helper()
	if len(r.deployments) == 0 {
		t.Fatal("no Deployment")
	}
	for _, o := range allLabelled(r) {
		for k, v := range o.labels {
			if msgs := append(validation.IsQualifiedName(k), validation.IsValidLabelValue(v)...); len(msgs) > 0 {
				t.Errorf("%s: label %s=%s: %v", o.where, k, v, msgs)
			}
		}
	}
	components := map[string]bool{}
	for _, d := range r.deployments {
		where := "Deployment " + d.Name
		sel, err := metav1.LabelSelectorAsSelector(d.Spec.Selector)
		if err != nil || sel.Empty() || !sel.Matches(labels.Set(d.Spec.Template.Labels)) {
			t.Errorf("%s: selector %v does not match its pods' labels %v (%v)", where, d.Spec.Selector, d.Spec.Template.Labels, err)
		}
		pod := d.Spec.Template.Spec
		checkPodSecurity(t, where, pod)
		if len(pod.Containers) != 1 {
			t.Fatalf("%s: %d containers, want the program's", where, len(pod.Containers))
		}
		c := pod.Containers[0]
		target := imageProgram(t, where, c.Image, stages)
		components[target] = true
		if c.Name != target || d.Spec.Template.Labels["app.kubernetes.io/component"] != target {
			t.Errorf("%s: container %s, component %s, image of %s", where, c.Name, d.Spec.Template.Labels["app.kubernetes.io/component"], target)
		}
		flags := checkContainerFlags(t, where, target, c, r)
		checkFiles(t, where, pod, c, flags, r, doc)
		checkPorts(t, where, d, c, r)
		switch target {
		case "broker":
			checkHelmBroker(t, where, d, c, flags, r)
		case "approver-bot":
			checkHelmBot(t, where, pod, c, flags, r, doc)
		case "mcp-gateway":
			checkHelmGateway(t, where, pod, c, flags, r, doc)
		default:
			t.Errorf("%s: %s is not a program the chart runs", where, target)
		}
	}
	if !components["broker"] {
		t.Error("no broker Deployment")
	}
	checkPolicyConfigMap(t, r)
	checkPDBs(t, r)
	checkNetworkPolicies(t, r)
	checkServiceMonitors(t, r)
}

type labelled struct {
	where  string
	labels map[string]string
}

func allLabelled(r rendered) []labelled {
	var l []labelled
	for _, d := range r.deployments {
		l = append(l, labelled{"Deployment " + d.Name, d.Labels}, labelled{"Deployment " + d.Name + " pods", d.Spec.Template.Labels})
	}
	for _, s := range r.services {
		l = append(l, labelled{"Service " + s.Name, s.Labels})
	}
	for _, c := range r.configMaps {
		l = append(l, labelled{"ConfigMap " + c.Name, c.Labels})
	}
	for _, s := range r.secrets {
		l = append(l, labelled{"Secret " + s.Name, s.Labels})
	}
	return l
}

// imageProgram checks that image is [REGISTRY/]PREFIX/PROGRAM:TAG with
// PROGRAM a target of deploy/Dockerfile, and returns PROGRAM.
func imageProgram(t *testing.T, where, image string, stages map[string]*dockerStage) string {
	t.Helper()
	repo, tag, ok := strings.Cut(image, ":")
	target := path.Base(repo)
	if !ok || tag == "" || stages[target] == nil || target == "build" {
		t.Errorf("%s: image %q is not PREFIX/TARGET:TAG of a target of deploy/Dockerfile", where, image)
	}
	return target
}

// checkPodSecurity checks what every pod must: a non-root numeric user,
// no privilege escalation, no capabilities, a read-only root file system,
// the runtime's seccomp profile, no service account token, resources and
// probes.
func checkPodSecurity(t *testing.T, where string, pod corev1.PodSpec) {
	t.Helper()
	psc := pod.SecurityContext
	if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || psc.RunAsUser == nil || *psc.RunAsUser != 65532 {
		t.Errorf("%s: pod security context %+v: want runAsNonRoot and the images' user 65532", where, psc)
	}
	if pod.AutomountServiceAccountToken == nil || *pod.AutomountServiceAccountToken {
		t.Errorf("%s: the service account's token is mounted: no program talks to the Kubernetes API", where)
	}
	for _, c := range append(slices.Clone(pod.InitContainers), pod.Containers...) {
		w := where + " container " + c.Name
		sc := c.SecurityContext
		if sc == nil {
			t.Errorf("%s: no security context", w)
			continue
		}
		if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
			t.Errorf("%s: privilege escalation allowed", w)
		}
		if sc.Privileged != nil && *sc.Privileged {
			t.Errorf("%s: privileged", w)
		}
		if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
			t.Errorf("%s: the root file system is writable", w)
		}
		if sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot || sc.RunAsUser != nil && *sc.RunAsUser == 0 {
			t.Errorf("%s: may run as root", w)
		}
		if sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") || len(sc.Capabilities.Add) > 0 {
			t.Errorf("%s: capabilities %+v: want drop ALL, add none", w, sc.Capabilities)
		}
		seccomp := sc.SeccompProfile
		if seccomp == nil && psc != nil {
			seccomp = psc.SeccompProfile
		}
		if seccomp == nil || seccomp.Type != corev1.SeccompProfileTypeRuntimeDefault {
			t.Errorf("%s: seccomp %+v: want RuntimeDefault", w, seccomp)
		}
		req, lim := c.Resources.Requests, c.Resources.Limits
		if req.Cpu().IsZero() || req.Memory().IsZero() || lim.Memory().IsZero() {
			t.Errorf("%s: resources %+v: want cpu and memory requested, memory limited", w, c.Resources)
		}
		if c.ReadinessProbe == nil || c.LivenessProbe == nil {
			t.Errorf("%s: readiness probe %v, liveness probe %v: want both", w, c.ReadinessProbe != nil, c.LivenessProbe != nil)
		}
		for _, p := range c.Ports {
			if msgs := validation.IsValidPortName(p.Name); len(msgs) > 0 {
				t.Errorf("%s: port %q: %v", w, p.Name, msgs)
			}
		}
	}
}

// checkContainerFlags checks every flag of the container's args and every
// ASSENT_ variable of its environment against the program's flag set, and
// returns the flags they set.
func checkContainerFlags(t *testing.T, where, program string, c corev1.Container, r rendered) map[string]string {
	t.Helper()
	if len(c.Command) > 0 {
		t.Errorf("%s: command %v replaces the image's entrypoint, the program", where, c.Command)
	}
	flags := checkCommandLine(t, where+" args", program, c.Args)
	env := map[string]string{}
	for _, e := range c.Env {
		env[e.Name] = e.Value
	}
	// Variables from Secrets the chart makes, each key a variable.
	for _, ef := range c.EnvFrom {
		if ef.SecretRef == nil {
			continue
		}
		if s, ok := r.secrets[ef.SecretRef.Name]; ok {
			for k := range s.Data {
				if msgs := validation.IsEnvVarName(k); len(msgs) > 0 {
					t.Errorf("%s: Secret %s: key %s is not a variable name: %v", where, s.Name, k, msgs)
				}
				env[k] = string(s.Data[k])
			}
		}
	}
	for k, v := range checkEnv(t, where+" env", program, c.Args, env) {
		flags[k] = v
	}
	return flags
}

// checkFiles checks that each file a flag names is in a volume mounted at
// its directory, and that the volume holds it: a ConfigMap rendered here
// with that key, a Secret rendered here with that key, or a Secret of the
// operator's that docs/deploy.md says how to make.
func checkFiles(t *testing.T, where string, pod corev1.PodSpec, c corev1.Container, flags map[string]string, r rendered, doc string) {
	t.Helper()
	for _, f := range []string{"nats-creds", "creds", "nats-ca", "policy", "auth", "config", "decision-key", "metrics-token"} {
		if p, ok := flags[f]; ok {
			checkFile(t, fmt.Sprintf("%s: --%s %s", where, f, p), pod, c, p, r, doc)
		}
	}
}

// checkFile checks that file p is mounted into c.
func checkFile(t *testing.T, where string, pod corev1.PodSpec, c corev1.Container, p string, r rendered, doc string) {
	t.Helper()
	var vol string
	for _, m := range c.VolumeMounts {
		if m.MountPath == path.Dir(p) {
			vol = m.Name
			if !m.ReadOnly {
				t.Errorf("%s: mounted writable", where)
			}
		}
	}
	if vol == "" {
		t.Errorf("%s: %s is not mounted", where, path.Dir(p))
		return
	}
	key := path.Base(p)
	for _, v := range pod.Volumes {
		if v.Name != vol {
			continue
		}
		switch {
		case v.ConfigMap != nil:
			cm, ok := r.configMaps[v.ConfigMap.Name]
			if !ok || cm.Data[key] == "" {
				t.Errorf("%s: ConfigMap %s (rendered: %v) has no %s", where, v.ConfigMap.Name, ok, key)
			}
		case v.Secret != nil:
			if len(v.Secret.Items) > 0 && !slices.ContainsFunc(v.Secret.Items, func(i corev1.KeyToPath) bool { return i.Path == key }) {
				t.Errorf("%s: Secret volume %s has no item at %s", where, vol, key)
			}
			if s, ok := r.secrets[v.Secret.SecretName]; ok {
				if len(s.Data[key]) == 0 {
					t.Errorf("%s: Secret %s, made by the chart, has no %s", where, s.Name, key)
				}
			} else if !strings.Contains(doc, v.Secret.SecretName) || !strings.Contains(doc, key) {
				t.Errorf("%s: docs/deploy.md does not say how to make Secret %s with %s", where, v.Secret.SecretName, key)
			}
		default:
			t.Errorf("%s: volume %s is neither a ConfigMap nor a Secret", where, vol)
		}
		return
	}
	t.Errorf("%s: no volume %s", where, vol)
}

// checkPorts checks the container's named ports against its probes and
// the Services that select its pods.
func checkPorts(t *testing.T, where string, d *appsv1.Deployment, c corev1.Container, r rendered) {
	t.Helper()
	named := map[string]int32{}
	for _, p := range c.Ports {
		named[p.Name] = p.ContainerPort
	}
	for name, pr := range map[string]*corev1.Probe{"readiness": c.ReadinessProbe, "liveness": c.LivenessProbe} {
		if pr == nil {
			continue
		}
		var port string
		switch {
		case pr.HTTPGet != nil:
			port = pr.HTTPGet.Port.String()
		case pr.TCPSocket != nil:
			port = pr.TCPSocket.Port.String()
		default:
			t.Errorf("%s: %s probe: neither HTTP nor TCP", where, name)
			continue
		}
		if _, ok := named[port]; !ok {
			t.Errorf("%s: %s probe on port %s, which the container does not name", where, name, port)
		}
	}
	found := false
	for _, s := range r.services {
		if len(s.Spec.Selector) == 0 || !labels.SelectorFromSet(s.Spec.Selector).Matches(labels.Set(d.Spec.Template.Labels)) {
			continue
		}
		found = true
		for _, p := range s.Spec.Ports {
			if _, ok := named[p.TargetPort.String()]; !ok {
				t.Errorf("Service %s: port %s targets %s, which %s does not name", s.Name, p.Name, p.TargetPort.String(), where)
			}
		}
	}
	if !found {
		t.Errorf("%s: no Service selects its pods", where)
	}
}

func checkHelmBroker(t *testing.T, where string, d *appsv1.Deployment, c corev1.Container, flags map[string]string, r rendered) {
	t.Helper()
	if d.Spec.Replicas == nil || *d.Spec.Replicas < 2 {
		t.Errorf("%s: replicas %v: want at least two", where, d.Spec.Replicas)
	}
	if flags["replicas"] == "" || flags["nats-url"] == "" || flags["auth"] == "" || flags["policy"] == "" {
		t.Errorf("%s: want --nats-url, --replicas (JetStream's), --auth and --policy: %v", where, flags)
	}
	var name bool
	for _, e := range c.Env {
		if e.Name == envflag.Var("name") && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.name" {
			name = true
		}
	}
	if !name {
		t.Errorf("%s: %s is not the pod's name", where, envflag.Var("name"))
	}
	// /readyz and /healthz on the port of --http.
	httpPort := portOf(t, where+" --http", flags["http"])
	for _, pr := range []struct {
		name  string
		probe *corev1.Probe
		path  string
	}{{"readiness", c.ReadinessProbe, "/readyz"}, {"liveness", c.LivenessProbe, "/healthz"}} {
		if pr.probe == nil || pr.probe.HTTPGet == nil || pr.probe.HTTPGet.Path != pr.path || containerPort(c, pr.probe.HTTPGet.Port.String()) != httpPort {
			t.Errorf("%s: %s probe: want GET %s on the port of --http (%s)", where, pr.name, pr.path, httpPort)
		}
	}
	// --drain-delay outlasts the readiness probe's failing, so that the
	// Service drops a stopping replica before it stops taking work.
	if rp := c.ReadinessProbe; rp != nil {
		delay, err := time.ParseDuration(flags["drain-delay"])
		period, threshold := rp.PeriodSeconds, rp.FailureThreshold
		if period == 0 {
			period = 10 // Kubernetes' defaults
		}
		if threshold == 0 {
			threshold = 3
		}
		probe := time.Duration(period*threshold) * time.Second
		if err != nil || delay <= probe {
			t.Errorf("%s: --drain-delay %q: want more than the readiness probe's %s", where, flags["drain-delay"], probe)
		}
		if g := d.Spec.Template.Spec.TerminationGracePeriodSeconds; g == nil || time.Duration(*g)*time.Second < delay+15*time.Second {
			t.Errorf("%s: terminationGracePeriodSeconds %v: the drain delay and the drain need more", where, g)
		}
	}
	if mp, ok := flags["metrics-listen"]; ok && containerPortName(c, portOf(t, where+" --metrics-listen", mp)) != "metrics" {
		t.Errorf("%s: --metrics-listen %s: no container port metrics there", where, mp)
	}
	if d.Spec.Strategy.RollingUpdate == nil || d.Spec.Strategy.RollingUpdate.MaxUnavailable == nil || d.Spec.Strategy.RollingUpdate.MaxUnavailable.IntValue() != 0 {
		t.Errorf("%s: the rollout may take replicas down before new ones are ready", where)
	}
}

func checkHelmBot(t *testing.T, where string, pod corev1.PodSpec, c corev1.Container, flags map[string]string, r rendered, doc string) {
	t.Helper()
	if len(c.Args) == 0 || c.Args[0] != "run" {
		t.Errorf("%s: args %v: want approver-bot run", where, c.Args)
	}
	data := configOf(t, where, pod, c, flags["config"], r)
	cfg, err := bot.ParseConfig([]byte(data), "bot.yaml")
	if err != nil {
		t.Fatalf("%s: bot.yaml: %v\n%s", where, err, data)
	}
	for _, f := range []string{cfg.NATS.Creds, cfg.NATS.CAFile, cfg.Policy} {
		if f != "" {
			checkFile(t, where+": bot.yaml's "+f, pod, c, f, r, doc)
		}
	}
	if cfg.NATS.URL == "" || cfg.NATS.Creds == "" {
		t.Errorf("%s: bot.yaml: NATS %q with credentials %q", where, cfg.NATS.URL, cfg.NATS.Creds)
	}
	port := portOf(t, where+" http.listen", cfg.HTTP.Listen)
	for _, pr := range []struct {
		name  string
		probe *corev1.Probe
		path  string
	}{{"readiness", c.ReadinessProbe, "/readyz"}, {"liveness", c.LivenessProbe, "/healthz"}} {
		if pr.probe == nil || pr.probe.HTTPGet == nil || pr.probe.HTTPGet.Path != pr.path || containerPort(c, pr.probe.HTTPGet.Port.String()) != port {
			t.Errorf("%s: %s probe: want GET %s on http.listen's port %s", where, pr.name, pr.path, port)
		}
	}
	for _, ef := range c.EnvFrom {
		if ef.SecretRef != nil && r.secrets[ef.SecretRef.Name] == nil && !strings.Contains(doc, ef.SecretRef.Name) {
			t.Errorf("%s: docs/deploy.md does not say how to make Secret %s, the channels' secrets", where, ef.SecretRef.Name)
		}
	}
}

func checkHelmGateway(t *testing.T, where string, pod corev1.PodSpec, c corev1.Container, flags map[string]string, r rendered, doc string) {
	t.Helper()
	if len(c.Args) == 0 || c.Args[0] != "serve" {
		t.Errorf("%s: args %v: want mcp-gateway serve", where, c.Args)
	}
	data := configOf(t, where, pod, c, flags["config"], r)
	cfg := mcpgateway.Parse([]byte(data), "gateway.yaml")
	// Validate finds the files the configuration names: those of the pod's
	// mounts (checked below), here under a directory of the test's.
	root := t.TempDir()
	for _, f := range []string{cfg.NATS.Creds, cfg.NATS.CAFile} {
		if strings.HasPrefix(f, "/") {
			if err := os.MkdirAll(filepath.Join(root, path.Dir(f)), 0o700); err != nil {
				t.Fatal(err)
			}
			writeFile(t, filepath.Join(root, f), "mounted from a Secret\n")
		}
	}
	local := mcpgateway.Parse([]byte(strings.ReplaceAll(data, " /etc/", " "+root+"/etc/")), "gateway.yaml")
	if err := local.Validate(); err != nil {
		t.Errorf("%s: gateway.yaml: %v\n%s", where, err, data)
	}
	for _, u := range cfg.Upstreams {
		if u.URL == "" {
			t.Errorf("%s: upstream %s runs a command: the image has no program but the gateway; name it by url", where, u.Name)
		}
	}
	for _, f := range []string{cfg.NATS.Creds, cfg.NATS.CAFile} {
		if f != "" {
			checkFile(t, where+": gateway.yaml's "+f, pod, c, f, r, doc)
		}
	}
	if flags["http"] == "" || containerPortName(c, portOf(t, where+" --http", flags["http"])) != "http" {
		t.Errorf("%s: --http %q: want streamable HTTP on the container's port http", where, flags["http"])
	}
	if flags["agent"] == "" && cfg.Identity.Agent == "" || cfg.NATS.Creds == "" {
		t.Errorf("%s: agent %q, credentials %q: the gateway asks as one agent, with its credentials", where, flags["agent"]+cfg.Identity.Agent, cfg.NATS.Creds)
	}
}

// configOf returns the content of the configuration file p of a ConfigMap
// mounted into c.
func configOf(t *testing.T, where string, pod corev1.PodSpec, c corev1.Container, p string, r rendered) string {
	t.Helper()
	for _, m := range c.VolumeMounts {
		if m.MountPath != path.Dir(p) {
			continue
		}
		for _, v := range pod.Volumes {
			if v.Name == m.Name && v.ConfigMap != nil && r.configMaps[v.ConfigMap.Name] != nil {
				return r.configMaps[v.ConfigMap.Name].Data[path.Base(p)]
			}
		}
	}
	t.Fatalf("%s: --config %s: no rendered ConfigMap mounted there", where, p)
	return ""
}

func containerPort(c corev1.Container, nameOrNumber string) string {
	for _, p := range c.Ports {
		if p.Name == nameOrNumber {
			return strconv.Itoa(int(p.ContainerPort))
		}
	}
	return nameOrNumber
}

func containerPortName(c corev1.Container, number string) string {
	for _, p := range c.Ports {
		if strconv.Itoa(int(p.ContainerPort)) == number {
			return p.Name
		}
	}
	return ""
}

// checkPolicyConfigMap loads the policy the chart renders as the broker
// would.
func checkPolicyConfigMap(t *testing.T, r rendered) {
	t.Helper()
	n := 0
	for _, cm := range r.configMaps {
		p, ok := cm.Data["policy.yaml"]
		if !ok {
			continue
		}
		n++
		f := filepath.Join(t.TempDir(), "policy.yaml")
		writeFile(t, f, p)
		if _, err := app.LoadPolicy(f); err != nil {
			t.Errorf("ConfigMap %s: policy.yaml: %v", cm.Name, err)
		}
	}
	if n != 1 {
		t.Errorf("%d ConfigMaps with policy.yaml, want one", n)
	}
}

// checkPDBs checks that every PodDisruptionBudget selects the pods of one
// Deployment and leaves room to drain one.
func checkPDBs(t *testing.T, r rendered) {
	t.Helper()
	broker := false
	for _, p := range r.pdbs {
		sel, err := metav1.LabelSelectorAsSelector(p.Spec.Selector)
		d := selected(r, sel)
		if err != nil || d == nil {
			t.Errorf("PodDisruptionBudget %s: selects no Deployment's pods (%v)", p.Name, err)
			continue
		}
		if p.Spec.MaxUnavailable == nil || p.Spec.MaxUnavailable.IntValue() < 1 || p.Spec.MinAvailable != nil {
			t.Errorf("PodDisruptionBudget %s: want maxUnavailable of at least 1", p.Name)
		}
		if d.Spec.Template.Labels["app.kubernetes.io/component"] == "broker" {
			broker = true
		}
	}
	if !broker {
		t.Error("no PodDisruptionBudget for the brokers")
	}
}

// selected returns the Deployment whose pods sel selects.
func selected(r rendered, sel labels.Selector) *appsv1.Deployment {
	for _, d := range r.deployments {
		if !sel.Empty() && sel.Matches(labels.Set(d.Spec.Template.Labels)) {
			return d
		}
	}
	return nil
}

// checkNetworkPolicies checks that each NetworkPolicy selects a
// Deployment's pods, lets in the ports its Services target, and lets out
// DNS and NATS.
func checkNetworkPolicies(t *testing.T, r rendered) {
	t.Helper()
	if len(r.netpols) > 0 && len(r.netpols) != len(r.deployments) {
		t.Errorf("%d NetworkPolicies for %d Deployments", len(r.netpols), len(r.deployments))
	}
	for _, np := range r.netpols {
		sel, err := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector)
		d := selected(r, sel)
		if err != nil || d == nil {
			t.Errorf("NetworkPolicy %s: selects no Deployment's pods (%v)", np.Name, err)
			continue
		}
		c := d.Spec.Template.Spec.Containers[0]
		in := map[int]bool{}
		for _, rule := range np.Spec.Ingress {
			for _, p := range rule.Ports {
				in[p.Port.IntValue()] = true
			}
		}
		for _, p := range c.Ports {
			if !in[int(p.ContainerPort)] {
				t.Errorf("NetworkPolicy %s: port %s (%d) is not let in", np.Name, p.Name, p.ContainerPort)
			}
		}
		out := map[int]bool{}
		for _, rule := range np.Spec.Egress {
			for _, p := range rule.Ports {
				out[p.Port.IntValue()] = true
			}
		}
		if !out[53] || !out[4222] {
			t.Errorf("NetworkPolicy %s: egress %v: want DNS (53) and NATS (4222)", np.Name, out)
		}
	}
}

// checkServiceMonitors checks that each ServiceMonitor selects a Service,
// scrapes one of its ports, and sends the broker's metrics token.
func checkServiceMonitors(t *testing.T, r rendered) {
	t.Helper()
	for _, sm := range r.serviceMonitors {
		sel, err := metav1.LabelSelectorAsSelector(&sm.Spec.Selector)
		if err != nil {
			t.Errorf("ServiceMonitor %s: %v", sm.Name, err)
			continue
		}
		var svc *corev1.Service
		for _, s := range r.services {
			if sel.Matches(labels.Set(s.Labels)) {
				svc = s
			}
		}
		if svc == nil {
			t.Errorf("ServiceMonitor %s: selects no Service", sm.Name)
			continue
		}
		d := selected(r, labels.SelectorFromSet(svc.Spec.Selector))
		for _, ep := range sm.Spec.Endpoints {
			if ep.Port == "" || !slices.ContainsFunc(svc.Spec.Ports, func(p corev1.ServicePort) bool { return p.Name == ep.Port }) {
				t.Errorf("ServiceMonitor %s: port %q is not one of Service %s's", sm.Name, ep.Port, svc.Name)
			}
			if ep.Path != "/metrics" {
				t.Errorf("ServiceMonitor %s: path %q", sm.Name, ep.Path)
			}
			if d == nil || d.Spec.Template.Labels["app.kubernetes.io/component"] != "broker" {
				continue
			}
			// The broker's --metrics-token file's Secret and key.
			var tokenSecret, tokenKey string
			pod := d.Spec.Template.Spec
			for _, a := range pod.Containers[0].Args {
				if p, ok := strings.CutPrefix(a, "--metrics-token="); ok {
					for _, m := range pod.Containers[0].VolumeMounts {
						for _, v := range pod.Volumes {
							if m.MountPath == path.Dir(p) && v.Name == m.Name && v.Secret != nil {
								tokenSecret, tokenKey = v.Secret.SecretName, path.Base(p)
							}
						}
					}
				}
			}
			var have string
			if ep.Authorization != nil && ep.Authorization.Credentials != nil {
				have = ep.Authorization.Credentials.Name + "/" + ep.Authorization.Credentials.Key
			}
			if want := tokenSecret + "/" + tokenKey; tokenSecret != "" && have != want {
				t.Errorf("ServiceMonitor %s: authorization %q, want the broker's --metrics-token %s", sm.Name, have, want)
			}
		}
	}
}

// TestHelmStrictDecode checks that the strict decoding refuses what the API
// server would: a misspelt field, a field at the wrong level, a duplicate.
func TestHelmStrictDecode(t *testing.T) {
	good := "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\nspec:\n  replicas: 2\n  template:\n    spec:\n      containers: [{name: x, image: x}]\n"
	if err := strictDecode([]byte(good), &appsv1.Deployment{}); err != nil {
		t.Fatalf("a valid Deployment: %v", err)
	}
	for _, bad := range []string{
		strings.Replace(good, "replicas:", "replica:", 1),
		strings.Replace(good, "      containers:", "      readOnlyRootFilesystem: true\n      containers:", 1),
		strings.Replace(good, "  replicas: 2\n", "  replicas: 2\n  replicas: 3\n", 1),
		strings.Replace(good, "replicas: 2", "replicas: two", 1),
	} {
		if err := strictDecode([]byte(bad), &appsv1.Deployment{}); err == nil {
			t.Errorf("accepted:\n%s", bad)
		}
	}
	sm := "apiVersion: monitoring.coreos.com/v1\nkind: ServiceMonitor\nmetadata: {name: x}\nspec:\n  selector: {}\n  endpoints: [{port: http, bearerTokenFile: /x, paht: /metrics}]\n"
	if err := strictDecode([]byte(sm), &monitoringv1.ServiceMonitor{}); err == nil {
		t.Error("a ServiceMonitor with a misspelt endpoint field was accepted")
	}
}
