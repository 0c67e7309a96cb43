package app_test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/assent-dev/assent/internal/app"
	"github.com/assent-dev/assent/internal/testenv"
)

// patience bounds every wait here; only a hang misses it.
const patience = 30 * time.Second

func getURL(t *testing.T, url string) (int, []byte, error) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, body, err
}

// TestStoppingNotReadyFirst stops the process (its context ends, as on
// SIGTERM) with long polls (a GET, and a POST that asks and waits) and an
// event stream open: /readyz answers 503 at once, while the API still serves
// for the drain delay; then the long polls answer with what they have, the
// event stream ends, and Run returns without an error, not waiting for them.
func TestStoppingNotReadyFirst(t *testing.T) {
	const drainDelay = 5 * time.Second
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ready := make(chan app.Addrs, 1)
	done := testenv.Go(t, func() error {
		return app.Run(ctx, app.Options{NATSListen: "127.0.0.1:0", DataDir: t.TempDir(), HTTPListen: "127.0.0.1:0",
			DrainDelay: drainDelay, Ready: func(a app.Addrs) { ready <- a }}, testenv.Logger(t))
	})
	var base string
	select {
	case a := <-ready:
		base = a.HTTP
	case err := <-done:
		t.Fatalf("Run returned before it was ready: %v", err)
	case <-time.After(patience):
		t.Fatal("not ready")
	}

	resp, err := http.Post(base+"/v1/approvals", "application/json", strings.NewReader(`{"tool":"rm","agent":"drainer","timeout":"5m"}`))
	if err != nil {
		t.Fatal(err)
	}
	var created struct {
		ID string `json:"id"`
	}
	err = json.NewDecoder(resp.Body).Decode(&created)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusCreated {
		t.Fatalf("create: %d %v", resp.StatusCode, err)
	}
	type polled struct {
		status int
		body   []byte
		err    error
	}
	poll := testenv.Go(t, func() polled {
		status, body, err := getURL(t, base+"/v1/approvals/"+created.ID+"?wait=2m")
		return polled{status, body, err}
	})
	asked := testenv.Go(t, func() polled {
		resp, err := http.Post(base+"/v1/approvals?wait=2m", "application/json", strings.NewReader(`{"tool":"rm","agent":"drainer","timeout":"5m"}`))
		if err != nil {
			return polled{err: err}
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		return polled{resp.StatusCode, body, err}
	})
	events, err := http.Get(base + "/v1/events")
	if err != nil {
		t.Fatal(err)
	}
	defer events.Body.Close()
	streamEnded := testenv.Go(t, func() error {
		_, err := io.Copy(io.Discard, bufio.NewReader(events.Body))
		return err
	})
	if status, body, err := getURL(t, base+"/readyz"); err != nil || status != http.StatusOK {
		t.Fatalf("readyz before stopping: %d %s %v", status, body, err)
	}

	cancel()
	stopping := time.Now()
	for {
		status, body, err := getURL(t, base+"/readyz")
		if err != nil {
			t.Fatalf("readyz refused %s after stopping began, before it said 503: %v", time.Since(stopping), err)
		}
		if status == http.StatusServiceUnavailable {
			t.Logf("not ready %s after stopping began: %s", time.Since(stopping), body)
			break
		}
		if status != http.StatusOK {
			t.Fatalf("readyz while stopping: %d %s", status, body)
		}
		if time.Since(stopping) > drainDelay {
			t.Fatal("readyz still said ready after the drain delay")
		}
	}
	// The API still serves while load balancers catch up.
	if status, body, err := getURL(t, base+"/v1/approvals/"+created.ID); err != nil || status != http.StatusOK {
		t.Errorf("GET while draining: %d %s %v", status, body, err)
	}

	p := testenv.Await(t, poll, patience, "the long poll")
	if p.err != nil || p.status != http.StatusOK || !strings.Contains(string(p.body), `"state":"pending"`) {
		t.Errorf("the long poll got %d %s %v, want the pending request", p.status, p.body, p.err)
	}
	a := testenv.Await(t, asked, patience, "the request that long-polls")
	if a.err != nil || a.status != http.StatusCreated || !strings.Contains(string(a.body), `"state":"pending"`) {
		t.Errorf("the request that long-polls got %d %s %v, want the pending request", a.status, a.body, a.err)
	}
	testenv.Await(t, streamEnded, patience, "the event stream's end")
	if err := testenv.Await(t, done, patience, "Run"); err != nil {
		t.Errorf("Run: %v", err)
	}
	if took := time.Since(stopping); took < drainDelay {
		t.Errorf("stopped %s after its context ended, before the drain delay %s", took, drainDelay)
	}
}
