package webhook

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"time"
)

// Check checks cfg as approver-bot check does, without NATS: the settings,
// that every secret_env is set, and that every endpoint answers over HTTP
// (a HEAD request: any answer, even 405, shows it reachable; no event is
// sent). It returns what it checked, a line each, and every problem found.
func Check(ctx context.Context, cfg Config) ([]string, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	var checked []string
	var errs []error
	secret := func(where, name string) {
		if v, ok := os.LookupEnv(name); !ok || v == "" {
			errs = append(errs, fmt.Errorf("%s: secret_env: %s is not set: export it with the signing secret (%s + base64 of %d to 64 random bytes)", where, name, SecretPrefix, MinSecretBytes))
		}
	}
	for _, in := range cfg.Inbound {
		secret("inbound "+in.Name, in.SecretEnv)
	}
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	for _, e := range cfg.Endpoints {
		secret("endpoint "+e.Name, e.SecretEnv)
		timeout := e.Timeout
		if timeout <= 0 {
			timeout = DefaultTimeout
		}
		status, err := reach(ctx, client, e.URL, timeout)
		if err != nil {
			errs = append(errs, fmt.Errorf("endpoint %s: %s: %w (check the URL, that the receiver runs, and the firewall)", e.Name, e.URL, err))
			continue
		}
		checked = append(checked, fmt.Sprintf("endpoint %s: %s answers (%s)", e.Name, e.URL, status))
	}
	return checked, errors.Join(errs...)
}

// reach sends HEAD to url and returns the answer's status.
func reach(ctx context.Context, client *http.Client, url string, timeout time.Duration) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodHead, url, nil)
	if err != nil {
		return "", err
	}
	req.Header.Set("User-Agent", "assent-approver-bot check")
	resp, err := client.Do(req)
	if err != nil {
		return "", err
	}
	resp.Body.Close()
	return resp.Status, nil
}
