package webhook

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/assent-dev/assent/pkg/events"
)

// Config is the webhooks section of the approver bot's configuration.
type Config struct {
	// Endpoints receive the lifecycle events of requests.
	Endpoints []Endpoint `yaml:"endpoints"`
	// Inbound are decision endpoints: POST /webhooks/in/<name>.
	Inbound []Inbound `yaml:"inbound"`
}

// Endpoint is one receiver of events.
type Endpoint struct {
	// Name identifies the endpoint: in its JetStream consumer
	// (webhook-<name>) and in the delivery log. A subject token: letters,
	// digits, _ and -. Renaming an endpoint starts it afresh.
	Name string `yaml:"name"`
	// URL is where events are POSTed: http or https.
	URL string `yaml:"url"`
	// SecretEnv names the environment variable holding the signing secret,
	// "whsec_" + base64 of 24 to 64 random bytes.
	SecretEnv string `yaml:"secret_env"`
	// Types lists the event types to send, short ("pending", "decided") or
	// in full ("dev.assent.approval.decided"); empty sends every lifecycle
	// event (requested, pending, escalated, responded, cancel, decided,
	// rejected).
	Types []string `yaml:"types"`
	// Agents limits the events to these agents' requests; empty means all.
	Agents []string `yaml:"agents"`
	// Timeout bounds one delivery attempt. Default DefaultTimeout.
	Timeout time.Duration `yaml:"timeout"`
}

// Inbound is one decision endpoint: a sender holding its secret answers
// requests as its principal.
type Inbound struct {
	// Name is the endpoint's path segment: POST /webhooks/in/<name>. A
	// subject token.
	Name string `yaml:"name"`
	// SecretEnv names the environment variable holding the secret the
	// sender signs with, "whsec_" + base64.
	SecretEnv string `yaml:"secret_env"`
	// Principal is who the sender answers as: a principal of the policy.
	Principal string `yaml:"principal"`
}

// DefaultTimeout bounds one delivery attempt when an endpoint sets none.
const DefaultTimeout = 10 * time.Second

// typePrefix starts every lifecycle event type.
const typePrefix = "dev.assent.approval."

// lifecycle lists the event types an endpoint sends by default: every type of
// the wire contract.
var lifecycle = []string{
	events.TypeRequested, events.TypePending, events.TypeEscalated, events.TypeResponded,
	events.TypeCancel, events.TypeDecided, events.TypeRejected,
}

// shortNames returns the short names of the lifecycle types, for messages.
func shortNames() string {
	names := make([]string, len(lifecycle))
	for i, t := range lifecycle {
		names[i] = strings.TrimPrefix(t, typePrefix)
	}
	return strings.Join(names, ", ")
}

// eventType resolves a configured type, short or full, to the full type.
func eventType(s string) (string, bool) {
	t := strings.TrimSpace(s)
	if !strings.HasPrefix(t, typePrefix) {
		t = typePrefix + t
	}
	return t, slices.Contains(lifecycle, t)
}

// Validate reports every problem of c at once, each naming its setting.
// It checks the shape of the configuration; New also reads the secrets.
func (c *Config) Validate() error {
	var errs []error
	if len(c.Endpoints) == 0 && len(c.Inbound) == 0 {
		errs = append(errs, errors.New("nothing configured: add endpoints (to send events to other systems) or inbound (to take their decisions)"))
	}
	seen := map[string]bool{}
	for i, ep := range c.Endpoints {
		where := fmt.Sprintf("endpoints[%d]", i)
		if ep.Name != "" {
			where += fmt.Sprintf(" (%s)", ep.Name)
		}
		bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf(where+": "+format, a...)) }
		switch {
		case ep.Name == "":
			bad("name: missing: name the endpoint (letters, digits, _ and -); it names its consumer and its delivery log")
		case !events.ValidToken(ep.Name):
			bad("name %q: want 1-%d characters of A-Z a-z 0-9 _ -", truncate(ep.Name, 40), events.MaxTokenLength)
		case seen[ep.Name]:
			bad("name %q: used by another endpoint; names must be unique", ep.Name)
		}
		seen[ep.Name] = true
		if err := checkURL(ep.URL); err != nil {
			bad("url: %v", err)
		}
		if ep.SecretEnv == "" {
			bad("secret_env: missing: name the environment variable that holds the endpoint's signing secret")
		}
		for _, t := range ep.Types {
			if _, ok := eventType(t); !ok {
				bad("types: unknown event type %q (want one of %s, short or as dev.assent.approval.<name>)", truncate(t, 60), shortNames())
			}
		}
		for _, a := range ep.Agents {
			if !events.ValidToken(a) {
				bad("agents: %q is not an agent name (1-%d characters of A-Z a-z 0-9 _ -)", truncate(a, 40), events.MaxTokenLength)
			}
		}
		if ep.Timeout < 0 {
			bad("timeout %s: want a positive duration such as 10s, or leave it out for %s", ep.Timeout, DefaultTimeout)
		}
	}
	seen = map[string]bool{}
	for i, in := range c.Inbound {
		where := fmt.Sprintf("inbound[%d]", i)
		if in.Name != "" {
			where += fmt.Sprintf(" (%s)", in.Name)
		}
		bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf(where+": "+format, a...)) }
		switch {
		case in.Name == "":
			bad("name: missing: it is the path of the endpoint, /webhooks/in/<name>")
		case !events.ValidToken(in.Name):
			bad("name %q: want 1-%d characters of A-Z a-z 0-9 _ -", truncate(in.Name, 40), events.MaxTokenLength)
		case seen[in.Name]:
			bad("name %q: used by another inbound endpoint; names must be unique", in.Name)
		}
		seen[in.Name] = true
		if in.SecretEnv == "" {
			bad("secret_env: missing: name the environment variable that holds the secret the sender signs with")
		}
		switch {
		case in.Principal == "":
			bad("principal: missing: the principal of the policy this sender answers as")
		case !events.ValidToken(in.Principal):
			bad("principal %q: want a principal name (1-%d characters of A-Z a-z 0-9 _ -)", truncate(in.Principal, 40), events.MaxTokenLength)
		}
	}
	return errors.Join(errs...)
}

// checkURL accepts absolute http and https URLs with a host.
func checkURL(s string) error {
	if s == "" {
		return errors.New("missing: where to POST the events (https://...)")
	}
	u, err := url.Parse(s)
	if err != nil {
		return fmt.Errorf("%q: %v", redactURL(s), err)
	}
	if u.Scheme != "http" && u.Scheme != "https" || u.Host == "" {
		return fmt.Errorf("%q: want an absolute http or https URL such as https://example.com/assent", redactURL(s))
	}
	return nil
}

// insecure reports whether events to u would cross a network in clear text.
func insecure(u *url.URL) bool {
	if u.Scheme == "https" {
		return false
	}
	host := u.Hostname()
	if host == "localhost" {
		return false
	}
	ip := net.ParseIP(host)
	return ip == nil || !ip.IsLoopback()
}

// redactURL drops what a URL may carry as a credential (user info, query)
// so that it can be logged.
func redactURL(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		return "(unparsable URL)"
	}
	u.User = nil
	if u.RawQuery != "" {
		u.RawQuery = "..."
	}
	u.Fragment = ""
	return u.String()
}
