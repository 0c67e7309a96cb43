package main

import (
	"bufio"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// patience bounds every wait: long enough that only a hang misses it.
const patience = 60 * time.Second

// build builds this command into a directory of t's and returns its path.
func build(t *testing.T) string {
	t.Helper()
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("go is not on PATH; cannot build cmd/broker")
	}
	path := filepath.Join(t.TempDir(), "broker")
	if out, err := exec.Command(gobin, "build", "-o", path, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return path
}

// The broker runs from ASSENT_ variables alone, one of them read from a
// file, with its embedded NATS server, and answers /readyz; a variable that
// names no flag is warned of, naming the flag meant.
func TestServeFromEnvironment(t *testing.T) {
	bin := build(t)
	dir := t.TempDir()
	nameFile := filepath.Join(dir, "name")
	if err := os.WriteFile(nameFile, []byte("from-a-file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin)
	cmd.Env = []string{
		"ASSENT_NATS_LISTEN=127.0.0.1:0",
		"ASSENT_HTTP=127.0.0.1:0",
		"ASSENT_DATA=" + filepath.Join(dir, "data"),
		"ASSENT_MODE=auto-approve",
		"ASSENT_LOG_JSON=true",
		"ASSENT_NAME_FILE=" + nameFile,
		"ASSENT_MAX_TIMOUT=1h",
	}
	// stderr's lines go to lines until stopReading, then nowhere: the broker
	// must never block on writing them.
	pr, pw := io.Pipe()
	cmd.Stderr = pw
	lines, drain := make(chan string), make(chan struct{})
	var once sync.Once
	stopReading := func() { once.Do(func() { close(drain) }) }
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			select {
			case lines <- sc.Text():
			case <-drain:
			}
		}
	}()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() {
		err := cmd.Wait()
		pw.Close()
		exited <- err
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-exited:
			if err != nil {
				t.Errorf("the broker exited with %v after SIGTERM", err)
			}
		case <-time.After(patience):
			_ = cmd.Process.Kill()
			t.Error("the broker did not stop on SIGTERM")
		}
	})
	t.Cleanup(stopReading) // first

	// Read stderr until the ready line, which has the HTTP address.
	var httpURL string
	var warned, named bool
	deadline := time.After(patience)
	for httpURL == "" {
		select {
		case line, ok := <-lines:
			if !ok {
				t.Fatal("the broker's stderr ended before it was ready (its lines are above)")
			}
			t.Log(line)
			if line == "broker: warning: ASSENT_MAX_TIMOUT names no flag of any of Assent's programs; it is ignored (did you mean ASSENT_MAX_TIMEOUT, for --max-timeout?)" {
				warned = true
				continue
			}
			var entry map[string]any
			if json.Unmarshal([]byte(line), &entry) != nil {
				t.Errorf("stderr has a line that is neither JSON nor the warning: %q", line)
				continue
			}
			named = named || strings.Contains(line, "from-a-file")
			if msg, _ := entry["msg"].(string); strings.HasPrefix(msg, "ready") {
				httpURL, _ = entry["http"].(string)
			}
		case <-deadline:
			t.Fatal("the broker was not ready in time")
		}
	}
	stopReading()
	if !warned {
		t.Error("no warning about ASSENT_MAX_TIMOUT")
	}
	if !named {
		t.Error("no log line names the replica from-a-file, the contents of ASSENT_NAME_FILE")
	}
	resp, err := http.Get(httpURL + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("/readyz: %s", resp.Status)
	}
}
