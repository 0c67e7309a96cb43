// Package channels is what every approver channel of cmd/approver-bot shares:
// the Adapter a channel implements, the Runtime it answers through, and the
// Directory that maps the policy's principals and roles to channel identities
// (DESIGN section 6). Each channel lives in a package of its own beneath this
// one; internal/bot assembles them.
package channels

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sort"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"

	"github.com/assent-dev/assent/pkg/events"
	"github.com/assent-dev/assent/pkg/handler"
	"github.com/assent-dev/assent/pkg/policy"
)

// Adapter is one channel: it shows requests (handler.Notifier), reaches some
// principals, and takes people's answers in over its own transport.
type Adapter interface {
	handler.Notifier
	// Name is the channel's name in decisions and presence ("slack").
	Name() string
	// Reaches lists the principals the channel can reach now.
	Reaches() []string
	// Start is called once, before any Notify, with the runtime to answer
	// through and the bot's HTTP mux for the channel's routes. Work it
	// starts runs until ctx ends.
	Start(ctx context.Context, rt Runtime, mux *http.ServeMux) error
}

// Problem is something that keeps a channel from delivering: a Slack
// channel that does not exist or the app is not in, a token its service
// refuses. While it lasts the channel leaves Principals out of its presence
// (Adapter.Reaches), so that brokers stop counting them as reachable.
type Problem struct {
	// Target is what cannot be reached: a Slack conversation's id, a
	// user's, or "" for the whole channel (its credentials).
	Target string `json:"target,omitempty"`
	// Code is the service's error ("not_in_channel"); Message says it with
	// what to do about it.
	Code    string `json:"code"`
	Message string `json:"message"`
	// Principals are those it keeps from being reached; empty with Target
	// "" means everyone.
	Principals []string  `json:"principals,omitempty"`
	Since      time.Time `json:"since"`
}

// Reporter is an Adapter that can say what keeps it from delivering (the
// bot's status page, health command and metrics show it).
type Reporter interface {
	Problems() []Problem
}

// Checker is an Adapter that can check its credentials and destinations
// against its service (approver-bot check): it returns what it checked, one
// line each, and every problem found.
type Checker interface {
	Check(ctx context.Context) (checked []string, err error)
}

// Runtime is what a channel answers through: a *handler.Channel.
type Runtime interface {
	// Answer publishes principal's answer to request id, as this channel.
	Answer(ctx context.Context, principal, id string, r handler.Response) error
	// Lookup returns the last notice this channel showed for request id,
	// from any process running it.
	Lookup(ctx context.Context, id string) (n handler.Notice, resolved, ok bool, err error)
	// Decision returns request id's decision, if it has one.
	Decision(ctx context.Context, id string) (handler.Decision, bool, error)
}

// Env is what the bot gives every channel it makes.
type Env struct {
	// NATS is the bot's connection, for channels that read the stream
	// themselves (webhooks out, the terminal).
	NATS *nats.Conn
	// Directory maps principals to channel identities.
	Directory *Directory
	// PublicURL is where people and services reach the bot's HTTP server
	// ("https://assent-bot.example.com"), for links and callbacks; no
	// trailing slash.
	PublicURL string
	// WebUI is the broker's web UI ("https://assent.example.com"), for
	// links to a request's page (WebUI + "/approvals/" + id); empty if none.
	WebUI string
	// Trusted, if set, are the broker's decision keys: channels that read
	// decided events themselves (webhooks out, the terminal) then take only
	// those one of them signed (docs/protocol.md, signed decisions).
	Trusted *events.TrustedKeys
	// Logger, never nil.
	Logger *zap.Logger
}

// RequestPage returns the web UI's page for request id, or "" without a web UI.
func (e *Env) RequestPage(id string) string {
	if e.WebUI == "" {
		return ""
	}
	return e.WebUI + "/approvals/" + id
}

// ErrUnknown is returned for a channel identity that maps to no principal.
var ErrUnknown = errors.New("not a principal of the policy")

// Directory maps principals and roles to channel identities, and tells whether
// a principal may answer a request, from the policy file the brokers use. It
// is safe for concurrent use; Set swaps the policy (on reload).
type Directory struct {
	p atomic.Pointer[policy.Policy]
}

// NewDirectory returns a directory over p.
func NewDirectory(p *policy.Policy) *Directory {
	d := &Directory{}
	d.Set(p)
	return d
}

// Set replaces the policy.
func (d *Directory) Set(p *policy.Policy) { d.p.Store(p) }

// Policy returns the policy in use.
func (d *Directory) Policy() *policy.Policy { return d.p.Load() }

// Principal returns the principal that channel knows by id: a Slack user id
// ("slack", "U024BE7LH"), an email address ("email", case-insensitive), or
// any channel of the principals' identities.
func (d *Directory) Principal(channel, id string) (string, error) {
	p := d.p.Load()
	if channel == "email" {
		id = strings.ToLower(strings.TrimSpace(id))
		for _, name := range d.names(p) {
			if strings.ToLower(p.Principals[name].Email) == id && id != "" {
				return name, nil
			}
		}
	}
	if name, ok := p.PrincipalFor(channel, id); ok {
		return name, nil
	}
	return "", fmt.Errorf("%s identity %q: %w", channel, id, ErrUnknown)
}

// Identity returns how channel knows principal ("slack" gives the Slack user
// id, "email" the address); ok is false if the policy gives none.
func (d *Directory) Identity(principal, channel string) (string, bool) {
	pr := d.p.Load().Principals[principal]
	if pr == nil {
		return "", false
	}
	var id string
	switch channel {
	case "slack":
		id = pr.Slack
	case "email":
		id = pr.Email
	}
	if id == "" {
		id = pr.Identities[channel]
	}
	return id, id != ""
}

// Reachable lists the principals channel has an identity for, sorted.
func (d *Directory) Reachable(channel string) []string {
	p := d.p.Load()
	var out []string
	for _, name := range d.names(p) {
		if _, ok := d.Identity(name, channel); ok {
			out = append(out, name)
		}
	}
	return out
}

// Expand resolves approvers as a notice gives them (names and role:<role>)
// to principal names, sorted; empty approvers mean every principal.
func (d *Directory) Expand(approvers []string) []string {
	p := d.p.Load()
	all := d.names(p)
	if len(approvers) == 0 {
		return all
	}
	var out []string
	for _, a := range approvers {
		if role, ok := strings.CutPrefix(a, "role:"); ok {
			for _, name := range all {
				if p.HasRole(name, role) {
					out = append(out, name)
				}
			}
			continue
		}
		out = append(out, a)
	}
	sort.Strings(out)
	return slices.Compact(out)
}

// Recipients returns, for the principals a notice is for, their identities
// on channel, by principal; principals without one are left out.
func (d *Directory) Recipients(n handler.Notice, channel string) map[string]string {
	out := map[string]string{}
	for _, name := range d.Expand(n.Approvers) {
		if n.Terms != nil && !n.Terms.AllowSelfApproval && name == n.User {
			continue // may not answer their own request
		}
		if id, ok := d.Identity(name, channel); ok {
			out[name] = id
		}
	}
	return out
}

// MayAnswer reports whether principal may answer the request of n, as the
// broker will judge it under the same policy: nil, or an error that says why
// not (wrapping policy.ErrNotEligible). The broker still checks every answer.
func (d *Directory) MayAnswer(principal string, n handler.Notice) error {
	p := d.p.Load()
	in, err := policy.InputFrom(n.Requested)
	if err != nil {
		return err
	}
	a := p.ModeApproval()
	for _, r := range p.Rules {
		if r.Name == n.Rule && r.Approval != nil {
			a = r.Approval
			break
		}
	}
	return a.Eligible(principal, in)
}

func (d *Directory) names(p *policy.Policy) []string {
	out := make([]string, 0, len(p.Principals))
	for name := range p.Principals {
		out = append(out, name)
	}
	sort.Strings(out)
	return out
}

// Who says who decided, for people: "alice via slack", "policy", "timeout";
// "" for a cancel, which names nobody.
func Who(d handler.Decision) string {
	switch {
	case len(d.DecidedBy) > 0:
		parts := make([]string, len(d.DecidedBy))
		for i, b := range d.DecidedBy {
			parts[i] = b.Principal
			if b.Channel != "" {
				parts[i] += " via " + b.Channel
			}
		}
		return strings.Join(parts, ", ")
	case d.Auto:
		return "policy"
	case d.Outcome == events.Expired:
		return "timeout"
	}
	return ""
}

// ArgsProblem says, for an approver to read where they edit, why the broker
// would refuse an approval with args, edited arguments, for a request whose
// input_schema is inputSchema (events.CheckArgs, the broker's own check);
// "" when it would not. Channels check before they answer, so that the
// approver sees why at once and keeps the edit to fix, rather than an
// answer the broker refuses with nobody looking.
func ArgsProblem(inputSchema, args []byte) string {
	err := events.CheckArgs(inputSchema, args)
	if err == nil {
		return ""
	}
	var fe *events.FieldError
	if errors.As(err, &fe) && fe.Field == "input_schema" {
		return "The request's input schema cannot check edited arguments (" + err.Error() + "); approve or deny the arguments as they are."
	}
	return "The tool's input schema refuses these arguments: " + strings.TrimPrefix(err.Error(), "args: ")
}
