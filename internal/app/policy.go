package app

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"time"

	"go.uber.org/zap"

	"github.com/assent-dev/assent/internal/broker"
	"github.com/assent-dev/assent/pkg/events"
	"github.com/assent-dev/assent/pkg/policy"
)

// LoadPolicy reads and parses a policy file. Errors carry file:line for every
// problem found.
func LoadPolicy(path string) (*policy.Policy, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("policy: %w", err)
	}
	return policy.Parse(data, path)
}

// PolicyCheck validates the policy file at path, writes every problem to w, one
// per line, and reports whether the file is valid.
func PolicyCheck(w io.Writer, path string) bool {
	p, err := LoadPolicy(path)
	if err != nil {
		for _, e := range flatten(err) {
			fmt.Fprintln(w, e)
		}
		return false
	}
	fmt.Fprintf(w, "%s: ok (%d rules, %d limits, %d principals, mode %s)\n", path, len(p.Rules), len(p.Limits), len(p.Principals), p.Mode)
	return true
}

// flatten splits a joined error into its parts.
func flatten(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		var out []error
		for _, e := range j.Unwrap() {
			out = append(out, flatten(e)...)
		}
		return out
	}
	return []error{err}
}

// PolicyTest evaluates the request in requestPath (the requested data, or a whole
// CloudEvent whose data is used) against the policy in policyPath, offline, and
// writes the explanation to w.
func PolicyTest(w io.Writer, policyPath, requestPath string, now time.Time) error {
	p, err := LoadPolicy(policyPath)
	if err != nil {
		return err
	}
	raw, err := os.ReadFile(requestPath)
	if err != nil {
		return fmt.Errorf("request: %w", err)
	}
	var probe struct {
		SpecVersion string          `json:"specversion"`
		Data        json.RawMessage `json:"data"`
	}
	if err := json.Unmarshal(raw, &probe); err != nil {
		return fmt.Errorf("request %s: %w", requestPath, err)
	}
	if probe.SpecVersion != "" {
		raw = probe.Data
	}
	var req events.Requested
	if err := json.Unmarshal(raw, &req); err != nil {
		return fmt.Errorf("request %s: %w", requestPath, err)
	}
	if err := req.Validate(); err != nil {
		return fmt.Errorf("request %s: %w", requestPath, err)
	}
	in, err := policy.InputFrom(req)
	if err != nil {
		return fmt.Errorf("request %s: %w", requestPath, err)
	}
	_, err = io.WriteString(w, policy.Explain(p.Trace(in, now, policy.GrantSet{})))
	return err
}

// watchPolicy reloads the policy files (live and shadow; either may be empty)
// when reload fires (SIGHUP) or a file changes, until ctx ends. A file that
// does not parse is refused: the broker keeps the policy it has, and the
// reason is logged.
func watchPolicy(ctx context.Context, path, shadowPath string, reload <-chan struct{}, b *broker.Broker, log *zap.Logger) {
	stat := func(p string) time.Time {
		if p == "" {
			return time.Time{}
		}
		fi, err := os.Stat(p)
		if err != nil {
			return time.Time{}
		}
		return fi.ModTime()
	}
	last, lastShadow := stat(path), stat(shadowPath)
	tick := time.NewTicker(2 * time.Second)
	defer tick.Stop()
	for {
		force := false
		select {
		case <-ctx.Done():
			return
		case <-reload:
			force = true
		case <-tick.C:
		}
		if m := stat(path); path != "" && (force || !m.Equal(last)) {
			last = m
			if p, err := LoadPolicy(path); err != nil {
				log.Error("policy reload refused; keeping the policy in force", zap.String("file", path), zap.Errors("problems", flatten(err)))
			} else {
				b.SetPolicy(p)
			}
		}
		if m := stat(shadowPath); shadowPath != "" && (force || !m.Equal(lastShadow)) {
			lastShadow = m
			if p, err := LoadPolicy(shadowPath); err != nil {
				log.Error("shadow policy reload refused; keeping the shadow in force", zap.String("file", shadowPath), zap.Errors("problems", flatten(err)))
			} else {
				b.SetShadow(p)
				log.Info("shadow policy reloaded", zap.String("file", shadowPath))
			}
		}
	}
}
