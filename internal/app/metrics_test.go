package app_test

import (
	"bytes"
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/assent-dev/assent/internal/app"
	"github.com/assent-dev/assent/internal/httptls"
	"github.com/assent-dev/assent/internal/testcerts"
	"github.com/assent-dev/assent/internal/testenv"
)

// scrape GETs url/metrics with the bearer token tok ("" for none).
func scrape(t *testing.T, c *http.Client, url, tok string) (int, http.Header, []byte) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, url+"/metrics", nil)
	if err != nil {
		t.Fatal(err)
	}
	if tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body bytes.Buffer
	_, _ = body.ReadFrom(resp.Body)
	return resp.StatusCode, resp.Header, body.Bytes()
}

// writeToken writes tok, and a newline, to path.
func writeToken(t *testing.T, path, tok string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(tok+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestMetricsToken: with --metrics-token, GET /metrics answers 401
// without the token, or with another, and the metrics with it; the other
// routes are as they were. The token is read again on SIGHUP and when its
// file changes; a file that holds no usable token is refused and the token
// in force kept.
func TestMetricsToken(t *testing.T) {
	const first, second, third = "first-metrics-token-0123456789ab", "other-metrics-token-0123456789ab", "a-longer-third-metrics-token-0123456789"
	file := filepath.Join(t.TempDir(), "metrics-token")
	writeToken(t, file, first)
	reload := make(chan struct{}, 1)
	addrs := runApp(t, app.Options{NATSListen: "127.0.0.1:0", DataDir: t.TempDir(), HTTPListen: "127.0.0.1:0", MetricsTokenFile: file, Reload: reload})
	c := &http.Client{Timeout: patience}
	for _, tok := range []string{"", "wrong", second} {
		status, h, body := scrape(t, c, addrs.HTTP, tok)
		if status != http.StatusUnauthorized || !strings.HasPrefix(h.Get("WWW-Authenticate"), "Bearer") || !bytes.Contains(body, []byte(`"code":"unauthenticated"`)) {
			t.Errorf("token %q: %d %v %s, want 401 unauthenticated", tok, status, h, body)
		}
	}
	if status, _, body := scrape(t, c, addrs.HTTP, first); status != http.StatusOK || !bytes.Contains(body, []byte("assent_requests_total")) {
		t.Errorf("the token: %d %.200s", status, body)
	}
	if status, _, _ := call(t, c, http.MethodPost, addrs.HTTP+"/metrics", "{}"); status != http.StatusMethodNotAllowed {
		t.Errorf("POST /metrics: %d, want 405", status)
	}
	if status, body, err := call(t, c, http.MethodGet, addrs.HTTP+"/readyz", ""); err != nil || status != http.StatusOK {
		t.Errorf("/readyz without a token: %d %s %v", status, body, err)
	}

	// SIGHUP, the file looking as it did (same size and time).
	fi, err := os.Stat(file)
	if err != nil {
		t.Fatal(err)
	}
	writeToken(t, file, second)
	if err := os.Chtimes(file, fi.ModTime(), fi.ModTime()); err != nil {
		t.Fatal(err)
	}
	reload <- struct{}{}
	waitScraped(t, c, addrs.HTTP, second)
	if status, _, _ := scrape(t, c, addrs.HTTP, first); status != http.StatusUnauthorized {
		t.Errorf("the token replaced: %d, want 401", status)
	}

	// The file changes.
	writeToken(t, file, third)
	waitScraped(t, c, addrs.HTTP, third)

	// An empty file: refused, the token in force kept.
	writeToken(t, file, "")
	reload <- struct{}{}
	time.Sleep(2500 * time.Millisecond) // the file's change seen too
	if status, _, _ := scrape(t, c, addrs.HTTP, third); status != http.StatusOK {
		t.Errorf("after an empty token file: %d, want the token in force kept", status)
	}
}

// waitScraped waits until tok reads the metrics at url.
func waitScraped(t *testing.T, c *http.Client, url, tok string) {
	t.Helper()
	for deadline := time.Now().Add(patience); ; time.Sleep(50 * time.Millisecond) {
		status, _, _ := scrape(t, c, url, tok)
		if status == http.StatusOK {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("token %q: %d after %s", tok, status, patience)
		}
	}
}

// TestMetricsTokenFileAtStart: a token file that cannot serve stops the
// process at start, saying what to put in it.
func TestMetricsTokenFileAtStart(t *testing.T) {
	dir := t.TempDir()
	for _, tt := range []struct {
		name, content string
		want          string
	}{
		{"missing", "", "metrics token file (--metrics-token): open"},
		{"empty", "\n", "is empty: put a long random token in it"},
		{"short", "s3cret", "holds 6 characters: use at least 16"},
		{"two words", "0123456789abcdef 0123456789abcdef", "holds more than one word"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			file := filepath.Join(dir, tt.name)
			if tt.name != "missing" {
				if err := os.WriteFile(file, []byte(tt.content), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			ctx, cancel := context.WithTimeout(context.Background(), patience)
			defer cancel()
			err := app.Run(ctx, app.Options{NATSListen: "127.0.0.1:0", DataDir: t.TempDir(), HTTPListen: "127.0.0.1:0", MetricsTokenFile: file}, testenv.Logger(t))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("%v, want %q", err, tt.want)
			}
		})
	}
}

// TestMetricsListen: with --metrics-listen, /metrics is served on that
// listener alone, over HTTPS when the API is (and with the token, when
// there is one); the API's listener answers 404. It is served with the API
// off too.
func TestMetricsListen(t *testing.T) {
	t.Run("beside the API", func(t *testing.T) {
		addrs := runApp(t, app.Options{NATSListen: "127.0.0.1:0", DataDir: t.TempDir(), HTTPListen: "127.0.0.1:0", MetricsListen: "127.0.0.1:0"})
		c := &http.Client{Timeout: patience}
		if addrs.Metrics == "" || addrs.Metrics == addrs.HTTP || !strings.HasPrefix(addrs.Metrics, "http://") {
			t.Fatalf("addresses %+v", addrs)
		}
		if status, _, body := scrape(t, c, addrs.HTTP, ""); status != http.StatusNotFound {
			t.Errorf("the API's /metrics: %d %s, want 404", status, body)
		}
		if status, _, body := scrape(t, c, addrs.Metrics, ""); status != http.StatusOK || !bytes.Contains(body, []byte("assent_ready 1")) {
			t.Errorf("the metrics listener's /metrics: %d %.200s", status, body)
		}
		if status, _, _ := call(t, c, http.MethodGet, addrs.Metrics+"/v1/approvals", ""); status != http.StatusNotFound {
			t.Errorf("the metrics listener serves the API: %d", status)
		}
	})
	t.Run("the API off", func(t *testing.T) {
		addrs := runApp(t, app.Options{NATSListen: "127.0.0.1:0", DataDir: t.TempDir(), MetricsListen: "127.0.0.1:0"})
		if addrs.HTTP != "" {
			t.Fatalf("addresses %+v", addrs)
		}
		if status, _, _ := scrape(t, &http.Client{Timeout: patience}, addrs.Metrics, ""); status != http.StatusOK {
			t.Errorf("/metrics with the API off: %d", status)
		}
	})
	t.Run("over HTTPS with a token", func(t *testing.T) {
		set := testcerts.New(t)
		const tok = "metrics-listener-token-0123456789"
		file := filepath.Join(t.TempDir(), "token")
		writeToken(t, file, tok)
		addrs := runApp(t, app.Options{NATSListen: "127.0.0.1:0", DataDir: t.TempDir(), HTTPListen: "127.0.0.1:0", MetricsListen: "127.0.0.1:0",
			TLS: httptls.Files{CertFile: set.ServerCertFile, KeyFile: set.ServerKey}, MetricsTokenFile: file})
		if !strings.HasPrefix(addrs.Metrics, "https://") {
			t.Fatalf("addresses %+v", addrs)
		}
		c := tlsClient(t, httptls.ClientFiles{CAFile: set.CAFile})
		if status, _, _ := scrape(t, c, addrs.Metrics, ""); status != http.StatusUnauthorized {
			t.Errorf("no token: %d, want 401", status)
		}
		if status, _, _ := scrape(t, c, addrs.Metrics, tok); status != http.StatusOK {
			t.Errorf("the token: %d, want 200", status)
		}
		if status, _, _ := scrape(t, c, addrs.HTTP, tok); status != http.StatusNotFound {
			t.Errorf("the API's /metrics with the token: %d, want 404", status)
		}
	})
}
