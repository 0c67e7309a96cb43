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
	"github.com/assent-dev/assent/internal/textsafe"
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
// per line, and reports whether the file is valid. Problems may quote the
// file; terminal controls in them are escaped (textsafe.Line).
func PolicyCheck(w io.Writer, path string) bool {
	p, err := LoadPolicy(path)
	if err != nil {
		for _, e := range flatten(err) {
			fmt.Fprintln(w, textsafe.Line(e.Error()))
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
// writes the explanation to w, with terminal controls from the request or the
// policy escaped (textsafe.Text).
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
	_, err = io.WriteString(w, textsafe.Text(policy.Explain(p.Trace(in, now, policy.GrantSet{}))))
	return err
}

// watchPolicy reloads the policy files (live and shadow; either may be empty)
// when reload fires (SIGHUP) or a file changes, until ctx ends. A file that
// does not parse is refused: the broker keeps the policy it has, and the
// reason is logged.
func watchPolicy(ctx context.Context, path, shadowPath string, reload <-chan struct{}, b *broker.Broker, log *zap.Logger) {
	files := []*watchedPolicy{
		{path: path, what: "policy", apply: b.SetPolicy},
		{path: shadowPath, what: "shadow policy", apply: func(p *policy.Policy) {
			b.SetShadow(p)
			log.Info("shadow policy reloaded", zap.String("file", shadowPath))
		}},
	}
	for _, f := range files {
		f.last = f.modTime()
	}
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
		for _, f := range files {
			f.reload(force, log)
		}
	}
}

// watchedPolicy is one policy file watchPolicy keeps in force.
type watchedPolicy struct {
	path, what string
	apply      func(*policy.Policy)
	last       time.Time
}

func (f *watchedPolicy) modTime() time.Time {
	if f.path == "" {
		return time.Time{}
	}
	fi, err := os.Stat(f.path)
	if err != nil {
		return time.Time{}
	}
	return fi.ModTime()
}

// reload reads the file again if force is set or it changed since last time.
func (f *watchedPolicy) reload(force bool, log *zap.Logger) {
	m := f.modTime()
	if f.path == "" || (!force && m.Equal(f.last)) {
		return
	}
	f.last = m
	p, err := LoadPolicy(f.path)
	if err != nil {
		log.Error(f.what+" reload refused; keeping the one in force", zap.String("file", f.path), zap.Errors("problems", flatten(err)))
		return
	}
	f.apply(p)
}
