package app

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/assent-dev/assent/internal/broker"
	"github.com/assent-dev/assent/internal/natsconn"
	"github.com/assent-dev/assent/internal/replay"
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

// policyCommands are the policy commands beside check and test, which
// commands() lists itself: replay.
func policyCommands() []*command {
	return []*command{{
		name: "policy replay", synopsis: "FILE [--since TIME] [--until TIME] [--fail-on KINDS] [--json] [--limit N] [--nats-url URL]", args: []string{"FILE"},
		summary: "evaluate a policy against the recorded requests",
		about: `Evaluates the policy FILE against every request the broker's stream recorded
in the window (--since, --until), as the broker would have judged each when
it was stored, with the remembered choices and limits' totals as they stood,
and reports how many outcomes would change, by kind and by rule, and the
changed requests (--limit of them). With --fail-on KINDS (comma-separated)
the exit status is 1 if any request changes in one of those ways, so it can
run in CI before a policy is rolled out. The kinds:
` + kindNames() + `.
It reads the stream over NATS (--nats-url) from its first message;
progress goes to standard error. docs/policy.md, "Replaying a policy
against the record".`,
		define: func(fs *flag.FlagSet) func(context.Context, CLI, []string) error {
			s := natsFlags(fs, "NATS credentials `file` that may read the stream with a consumer of its own (an auditor's: broker creds auditor)")
			var q ReplayQuery
			since := timeFlag(fs, "since", "report the requests stored at or after this `time`: RFC 3339, or a duration before --until (or now) such as 7d, 36h or 90m (default: all)")
			until := timeFlag(fs, "until", "and at or before this `time`: RFC 3339, or a duration before now (default: all)")
			fs.Func("fail-on", "exit 1 if any request changes in one of these `kinds`, comma-separated (allow-what-people-denied, ...)", func(v string) error {
				k, err := replay.ParseKinds(v)
				q.FailOn = append(q.FailOn, k...)
				return err
			})
			fs.BoolVar(&q.JSON, "json", false, "print the report as one JSON object")
			q.Limit = 100
			fs.Var((*count)(&q.Limit), "limit", "list at most `N` changed requests (0: all); every change is counted")
			return func(ctx context.Context, c CLI, args []string) error {
				q.Policy = args[0]
				now := time.Now()
				q.Until, _ = replay.ParseTime(*until, now)
				if !q.Until.IsZero() {
					now = q.Until
				}
				q.Since, _ = replay.ParseTime(*since, now)
				return PolicyReplay(ctx, c, *s, q)
			}
		},
	}}
}

// count is a flag of a number of things: 0 or more.
type count int

func (n *count) String() string { return strconv.Itoa(int(*n)) }

func (n *count) Set(s string) error {
	v, err := strconv.Atoi(s)
	if err != nil || v < 0 {
		return fmt.Errorf("%q: want a whole number, 0 or more", s)
	}
	*n = count(v)
	return nil
}

// timeFlag defines a flag of a time as replay.ParseTime reads it: its
// value is checked when given, and read against the right moment once
// every flag is.
func timeFlag(fs *flag.FlagSet, name, usage string) *string {
	var v string
	fs.Func(name, usage, func(s string) error {
		_, err := replay.ParseTime(s, time.Now())
		v = s
		return err
	})
	return &v
}

// kindNames lists the kinds of change, in lines of at most 76 columns.
func kindNames() string {
	var b strings.Builder
	col := 0
	for i, k := range replay.Kinds() {
		name := string(k)
		if i > 0 {
			b.WriteString(",")
			if col+2+len(name) > 76 {
				b.WriteString("\n")
				col = 0
			} else {
				b.WriteString(" ")
				col += 2
			}
		}
		b.WriteString(name)
		col += len(name)
	}
	return b.String()
}

// ReplayQuery is what `broker policy replay` replays and reports.
type ReplayQuery struct {
	Policy       string        // the policy file
	Since, Until time.Time     // the window; zero: open
	FailOn       []replay.Kind // the kinds of change that fail the command
	JSON         bool          // the report as JSON
	Limit        int           // changed requests listed; 0: all
}

// PolicyReplay replays the policy file q.Policy over the stream of the
// broker that s reaches and writes the report to c.Stdout, progress to
// c.Stderr. A policy file with problems is reported on c.Stderr, each
// problem on its own line. If a change of a kind in q.FailOn is found, the
// error names each kind and how many requests it changes.
func PolicyReplay(ctx context.Context, c CLI, s natsconn.Settings, q ReplayQuery) error {
	p, err := LoadPolicy(q.Policy)
	if err != nil {
		for _, e := range flatten(err) {
			fmt.Fprintf(c.Stderr, "broker policy replay: %s\n", textsafe.Line(e.Error()))
		}
		return errReported
	}
	if !q.Since.IsZero() && !q.Until.IsZero() && q.Until.Before(q.Since) {
		return fmt.Errorf("--until %s is before --since %s", q.Until.Format(time.RFC3339), q.Since.Format(time.RFC3339))
	}
	nc, err := natsconn.Connect(s, nats.Name("assent-replay"))
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	cfg := replay.Config{Since: q.Since, Until: q.Until, List: q.Limit}
	shown := false
	cfg.Progress = func(p replay.Progress) {
		shown = true
		fmt.Fprintf(c.Stderr, "read to stream sequence %d of %d, %d requests replayed\r", p.Seq, p.Last, p.Requests)
	}
	rep, err := replay.Run(ctx, js, broker.StreamName, p, cfg)
	if errors.Is(err, replay.ErrNoStream) {
		return fmt.Errorf("no %s stream on %s: is this the NATS server (and account) the broker uses? Point --nats-url (and --nats-creds) at it", broker.StreamName, nc.ConnectedUrlRedacted())
	}
	if err != nil {
		return err
	}
	rate := ""
	if secs := rep.Elapsed.Seconds(); secs > 0 {
		rate = fmt.Sprintf(", %.0f requests/s", float64(rep.Replayed)/secs)
	}
	if shown {
		fmt.Fprintln(c.Stderr)
	}
	fmt.Fprintf(c.Stderr, "read %d messages, replayed %d requests in %s%s\n", rep.Messages, rep.Replayed, rep.Elapsed.Round(time.Millisecond), rate)
	broken := rep.Broken(q.FailOn)
	if q.JSON {
		out := struct {
			*replay.Report
			FailOn []replay.Kind      `json:"fail_on,omitempty"`
			Broken []replay.KindCount `json:"broken,omitempty"`
		}{rep, q.FailOn, broken}
		enc := json.NewEncoder(c.Stdout)
		enc.SetEscapeHTML(false)
		enc.SetIndent("", "  ")
		if err := enc.Encode(out); err != nil {
			return err
		}
	} else if err := rep.WriteText(c.Stdout); err != nil {
		return err
	}
	if len(broken) == 0 {
		return nil
	}
	var parts []string
	for _, b := range broken {
		n := fmt.Sprintf("%d requests", b.Requests)
		if b.Requests == 1 {
			n = "1 request"
		}
		parts = append(parts, fmt.Sprintf("%s (%s)", b.Kind, n))
	}
	what := "guard broken: "
	if len(broken) > 1 {
		what = "guards broken: "
	}
	return errors.New(what + strings.Join(parts, ", "))
}
