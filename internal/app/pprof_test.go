package app_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/assent-dev/assent/internal/app"
	"github.com/assent-dev/assent/internal/testenv"
)

// TestPprof: with PprofListen the process serves its heap profile there,
// and only there; without it, no address serves one, the HTTP API's
// included.
func TestPprof(t *testing.T) {
	for _, on := range []bool{true, false} {
		name := "off"
		if on {
			name = "on"
		}
		t.Run(name, func(t *testing.T) {
			o := app.Options{NATSListen: "127.0.0.1:0", DataDir: t.TempDir(), HTTPListen: "127.0.0.1:0"}
			if on {
				o.PprofListen = "127.0.0.1:0"
			}
			addrs := runApp(t, o)
			if status, _ := get(t, addrs.HTTP+"/debug/pprof/heap"); status != http.StatusNotFound {
				t.Errorf("the HTTP API answers /debug/pprof/heap with %d, want 404", status)
			}
			if !on {
				if addrs.Pprof != "" {
					t.Fatalf("profiles served at %s without PprofListen", addrs.Pprof)
				}
				return
			}
			status, body := get(t, addrs.Pprof+"/debug/pprof/heap")
			if status != http.StatusOK || !bytes.HasPrefix(body, []byte{0x1f, 0x8b}) {
				t.Fatalf("GET %s/debug/pprof/heap: %d, %d bytes, want 200 and a gzipped profile", addrs.Pprof, status, len(body))
			}
			if status, body := get(t, addrs.Pprof+"/debug/pprof/"); status != http.StatusOK || !strings.Contains(string(body), "goroutine") {
				t.Fatalf("GET %s/debug/pprof/: %d, want the index", addrs.Pprof, status)
			}
		})
	}
}

// TestPprofServesLoopbackOnly: the profiles have no authentication, so an
// address other machines reach is refused, naming the way round it.
func TestPprofServesLoopbackOnly(t *testing.T) {
	base := app.Options{NATSListen: "127.0.0.1:0", DataDir: t.TempDir()}
	for _, addr := range []string{"127.0.0.1:6060", "[::1]:6060", "localhost:0"} {
		o := base
		o.PprofListen = addr
		if err := o.Validate(); err != nil {
			t.Errorf("pprof on %s: %v", addr, err)
		}
	}
	for _, addr := range []string{"0.0.0.0:6060", ":6060", "10.1.2.3:6060", "127.0.0.1"} {
		o := base
		o.PprofListen = addr
		o.AuthFile = "auth.yaml" // authentication of the HTTP API does not cover the profiles
		if err := o.Validate(); err == nil || !strings.Contains(err.Error(), "pprof") {
			t.Errorf("pprof on %s: %v, want a refusal", addr, err)
		}
	}
}

// runApp runs app.Run with o until the test ends, and returns where it
// listens once it is ready.
func runApp(t *testing.T, o app.Options) app.Addrs {
	t.Helper()
	ready := make(chan app.Addrs, 1)
	o.Ready = func(a app.Addrs) { ready <- a }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- app.Run(ctx, o, testenv.Logger(t)) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("app.Run: %v", err)
			}
		case <-time.After(20 * time.Second):
			t.Errorf("app.Run did not return 20s after its context ended")
		}
	})
	select {
	case a := <-ready:
		return a
	case err := <-done:
		t.Fatalf("app.Run: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("the broker process was not ready within 20s")
	}
	return app.Addrs{}
}

func get(t *testing.T, url string) (int, []byte) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, body
}
