// Package healthcheck is the "health" command of Assent's programs that serve
// HTTP: it asks the program's own health endpoint and exits 0 when it
// answers well, 1 otherwise, with a one-line reason. Images without a shell
// (deploy/Dockerfile) run it as their HEALTHCHECK, and deploy/local's script
// waits on it.
//
//	broker health [--http 127.0.0.1:8080] [--path /readyz] [--wait 3s]
//	approver-bot health [--url http://127.0.0.1:8090/readyz]
//	mcp-gateway health [--url http://127.0.0.1:8931/mcp] [--ca FILE] [--cert FILE --key FILE]
package healthcheck

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/assent-dev/assent/internal/httptls"
)

// Options say what to ask and what counts as healthy.
type Options struct {
	// URL is the endpoint to GET.
	URL string
	// Timeout bounds the whole check; default 3s.
	Timeout time.Duration
	// AnyStatus counts any answer below 500 as healthy, for a server with no
	// health route of its own (the MCP gateway's /mcp answers a plain GET
	// with a client error): the server is up and answering.
	AnyStatus bool
	// TLS trusts the CA of an https URL's server, and presents a client
	// certificate to a server that asks for one.
	TLS httptls.ClientFiles
}

// DefaultTimeout bounds a check when Options.Timeout is zero.
const DefaultTimeout = 3 * time.Second

// Flags defines the command's flags on fs, with d as their defaults, and
// returns the options they fill.
func Flags(fs *flag.FlagSet, d Options) *Options {
	o := WaitFlags(fs, d)
	fs.StringVar(&o.URL, "url", d.URL, "the health endpoint's `URL`")
	return o
}

// WaitFlags defines the flags of Flags other than --url, for a command that
// makes the URL from flags of its own.
func WaitFlags(fs *flag.FlagSet, d Options) *Options {
	o := &Options{}
	timeout := d.Timeout
	if timeout == 0 {
		timeout = DefaultTimeout
	}
	// Not --timeout: the health command runs in the program's container,
	// whose ASSENT_TIMEOUT is the broker's request timeout (envflag).
	fs.DurationVar(&o.Timeout, "wait", timeout, "give up after this `duration`")
	fs.BoolVar(&o.AnyStatus, "any-status", d.AnyStatus, "any HTTP answer below 500 is healthy (for an endpoint that is not a health route)")
	return o
}

// ErrUnhealthy is wrapped by every error of Check about the program's
// answer (as opposed to a malformed URL).
var ErrUnhealthy = errors.New("unhealthy")

// Check GETs o.URL and returns a short description of the answer ("200 OK")
// if it is healthy: a 2xx status, or with AnyStatus any status below 500.
// Otherwise the error, wrapping ErrUnhealthy, says what happened in one line.
func Check(ctx context.Context, o Options) (string, error) {
	if o.Timeout <= 0 {
		o.Timeout = DefaultTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, o.URL, nil)
	if err != nil {
		return "", fmt.Errorf("--url %q: %w", o.URL, err)
	}
	client, err := o.TLS.Client()
	if err != nil {
		return "", err
	}
	resp, err := client.Do(req)
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			return "", fmt.Errorf("%w: %s: no answer within %s", ErrUnhealthy, o.URL, o.Timeout)
		}
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // without the method and URL, said already
		}
		return "", fmt.Errorf("%w: %s: %s", ErrUnhealthy, o.URL, oneLine(err.Error()))
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	healthy := resp.StatusCode >= 200 && resp.StatusCode < 300
	if o.AnyStatus {
		healthy = resp.StatusCode < 500
	}
	if !healthy {
		if b := oneLine(string(body)); b != "" {
			return "", fmt.Errorf("%w: %s answered %s: %s", ErrUnhealthy, o.URL, resp.Status, b)
		}
		return "", fmt.Errorf("%w: %s answered %s", ErrUnhealthy, o.URL, resp.Status)
	}
	return resp.Status, nil
}

// Main runs "NAME health [flags]" for a program whose command line has no
// command table of its own, with d as the flags' defaults, and returns the
// exit status: 0 healthy, 1 not, 2 a wrong command line.
func Main(ctx context.Context, name string, d Options, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: %s [--url URL] [--wait DURATION] [--ca FILE] [--cert FILE --key FILE]\n\nAsks the running program's health endpoint; exits 0 if it answers well, 1 if not.\n\nflags:\n", name)
		fs.PrintDefaults()
	}
	o := Flags(fs, d)
	httptls.ClientFlags(fs, &o.TLS)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "%s: unexpected argument %q\n", name, fs.Arg(0))
		return 2
	}
	status, err := Check(ctx, *o)
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", name, err)
		return 1
	}
	fmt.Fprintf(stdout, "%s: %s\n", o.URL, status)
	return 0
}

// oneLine keeps the first line of s, trimmed and at most 200 bytes.
func oneLine(s string) string {
	s, _, _ = strings.Cut(strings.TrimSpace(s), "\n")
	if len(s) > 200 {
		s = s[:200] + "..."
	}
	return strings.TrimSpace(s)
}
