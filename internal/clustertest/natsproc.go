package clustertest

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// A node runs as a process of a nats-server binary when Config.Binary is
// set: written here are its configuration file, its start and the reading
// of its state from its monitoring port.

// startProcess starts the node's nats-server process, unless it runs, and
// waits until its monitoring port answers. The caller holds n.mu.
func (n *Node) startProcess() error {
	if n.proc != nil && n.proc.running() {
		return nil
	}
	conf := filepath.Join(filepath.Dir(n.Dir), n.Name+".conf")
	if err := os.WriteFile(conf, []byte(n.configFile()), 0o644); err != nil {
		return err
	}
	logFile := filepath.Join(filepath.Dir(n.Dir), n.Name+".log")
	f, err := os.OpenFile(logFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	fmt.Fprintf(f, "=== clustertest: start %s %s\n", n.Name, time.Now().UTC().Format(time.RFC3339Nano))
	cmd := exec.Command(n.cluster.cfg.Binary, "-c", conf)
	cmd.Stdout, cmd.Stderr = f, f
	dieWithParent(cmd)
	if err := cmd.Start(); err != nil {
		f.Close()
		return fmt.Errorf("start %s: %w", n.Name, err)
	}
	p := &process{cmd: cmd, log: f, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		f.Close()
		close(p.done)
	}()
	client := &http.Client{Timeout: 2 * time.Second}
	deadline := time.Now().Add(Patience)
	for time.Now().Before(deadline) {
		select {
		case <-p.done:
			return fmt.Errorf("%s exited before it was ready (%v; port taken?); its log is %s", n.Name, p.err, logFile)
		case <-time.After(50 * time.Millisecond):
		}
		resp, err := client.Get(n.monitorURL("/varz"))
		if err != nil {
			continue
		}
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			n.proc = p
			return nil
		}
	}
	_ = p.kill()
	return fmt.Errorf("%s: monitoring port %d not answering after %s; its log is %s", n.Name, n.MonitorPort, Patience, logFile)
}

// configFile is the node's nats-server configuration, the same as Options
// gives an in-process node, plus its monitoring port.
func (n *Node) configFile() string {
	o := n.Options()
	var routes []string
	for _, r := range o.Routes {
		routes = append(routes, strconv.Quote(r.String()))
	}
	sync := strconv.Quote(o.SyncInterval.String())
	if o.SyncAlways {
		sync = "always"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "server_name: %q\n", o.ServerName)
	fmt.Fprintf(&b, "listen: \"127.0.0.1:%d\"\n", n.ClientPort)
	fmt.Fprintf(&b, "http: \"127.0.0.1:%d\"\n", n.MonitorPort)
	if o.MaxPayload > 0 {
		fmt.Fprintf(&b, "max_payload: %d\n", o.MaxPayload)
	}
	fmt.Fprintf(&b, "jetstream {\n  store_dir: %q\n  sync_interval: %s\n}\n", n.Dir, sync)
	fmt.Fprintf(&b, "cluster {\n  name: %q\n  listen: \"127.0.0.1:%d\"\n  routes: [%s]\n  no_advertise: %v\n}\n",
		o.Cluster.Name, n.ClusterPort, strings.Join(routes, ", "), o.Cluster.NoAdvertise)
	return b.String()
}

func (n *Node) monitorURL(path string) string {
	return "http://127.0.0.1:" + strconv.Itoa(n.MonitorPort) + path
}

// processView reads a process node's view of the cluster from its
// monitoring endpoints: /routez, /jsz and /healthz?js-meta-only=true (200
// once it is current with a meta leader).
func (n *Node) processView() (nodeView, error) {
	v := nodeView{name: n.Name, routes: map[string]bool{}}
	client := &http.Client{Timeout: 2 * time.Second}
	get := func(path string, into any) (int, error) {
		resp, err := client.Get(n.monitorURL(path))
		if err != nil {
			return 0, err
		}
		defer resp.Body.Close()
		if into == nil {
			return resp.StatusCode, nil
		}
		return resp.StatusCode, json.NewDecoder(resp.Body).Decode(into)
	}
	var rz struct {
		Routes []struct {
			RemoteName string `json:"remote_name"`
		} `json:"routes"`
	}
	if _, err := get("/routez", &rz); err != nil {
		return v, fmt.Errorf("routez: %w", err)
	}
	for _, r := range rz.Routes {
		v.routes[r.RemoteName] = true
	}
	var jsz struct {
		Meta *struct {
			Leader  string `json:"leader"`
			Size    int    `json:"cluster_size"`
			Pending int    `json:"pending"`
		} `json:"meta_cluster"`
	}
	if _, err := get("/jsz", &jsz); err != nil {
		return v, fmt.Errorf("jsz: %w", err)
	}
	if m := jsz.Meta; m != nil {
		v.clustered, v.leader = true, m.Leader == n.Name
		v.meta = fmt.Sprintf("%s sees leader %q, size %d, %d pending", n.Name, m.Leader, m.Size, m.Pending)
	} else {
		v.meta = n.Name + ": no meta view"
	}
	status, err := get("/healthz?js-meta-only=true", nil)
	if err != nil {
		return v, fmt.Errorf("healthz: %w", err)
	}
	v.current = status == http.StatusOK
	return v, nil
}

// running reports whether the process has not exited.
func (p *process) running() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// terminate sends SIGTERM and waits for the process to exit, Patience at
// most, then kills it.
func (p *process) terminate() {
	if !p.running() {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(Patience):
		_ = p.kill()
	}
}
