package email

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	netmail "net/mail"
	"os"
	"slices"
	"sort"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	gomail "github.com/wneessen/go-mail"
	"go.uber.org/zap"

	"github.com/assent-dev/assent/internal/channels"
	"github.com/assent-dev/assent/pkg/events"
	"github.com/assent-dev/assent/pkg/handler"
)

// Name is the channel's name, in decisions and presence.
const Name = "email"

// sendTimeout bounds one notification's SMTP session when the caller's
// context sets no deadline.
const sendTimeout = 2 * time.Minute

// Adapter is the email channel (channels.Adapter): it mails pending requests
// and serves the pages of its approval links.
type Adapter struct {
	s     settings
	env   channels.Env
	log   *zap.Logger
	links signer
	now   func() time.Time
	st    atomic.Pointer[state]
}

// state is what Start gives the adapter.
type state struct {
	rt channels.Runtime
	kv jetstream.KeyValue
}

var _ channels.Adapter = (*Adapter)(nil)

// New returns the email channel for cfg. It checks cfg and reads the
// environment variables it names (the link secret, the SMTP password) and
// its CA file, and reports every problem at once. env must have a NATS
// connection, a Directory and a PublicURL (links point there).
func New(cfg Config, env channels.Env) (*Adapter, error) {
	var errs []error
	if env.NATS == nil {
		errs = append(errs, errors.New("no NATS connection"))
	}
	if env.Directory == nil {
		errs = append(errs, errors.New("no directory of principals"))
	}
	s, err := load(cfg, env.PublicURL, os.Getenv)
	if err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		return nil, located(errs)
	}
	log := env.Logger
	if log == nil {
		log = zap.NewNop()
	}
	a := &Adapter{s: s, env: env, log: log.Named("email"), links: signer{key: s.secret}, now: time.Now}
	for _, w := range a.Warnings() {
		a.log.Warn(w)
	}
	return a, nil
}

// located joins errs, one a line: a setting's problem that says where it is
// (file:line) as it is, the others after "email channel: ".
func located(errs []error) error {
	var out []error
	var flat func(err error)
	flat = func(err error) {
		if j, ok := err.(interface{ Unwrap() []error }); ok {
			for _, e := range j.Unwrap() {
				flat(e)
			}
			return
		}
		if ce, ok := err.(*ConfigError); ok && ce.Where != "" {
			out = append(out, err)
			return
		}
		out = append(out, fmt.Errorf("email channel: %w", err))
	}
	for _, err := range errs {
		flat(err)
	}
	return errors.Join(out...)
}

// Warnings says what in the channel's configuration, though valid, is
// unsafe outside development (Config.Warnings). New logs them; `approver-bot
// check` prints them.
func (a *Adapter) Warnings() []string { return a.s.cfg.Warnings() }

// Name returns "email".
func (a *Adapter) Name() string { return Name }

// Reaches lists the principals the policy gives an email address.
func (a *Adapter) Reaches() []string { return a.env.Directory.Reachable(Name) }

// Start opens (or makes) LinkBucket and serves the link pages on mux:
// GET and POST /email/a/{token}. It may be called once.
func (a *Adapter) Start(ctx context.Context, rt channels.Runtime, mux *http.ServeMux) error {
	if rt == nil || mux == nil {
		return errors.New("email channel: Start needs a runtime and a mux")
	}
	js, err := jetstream.New(a.env.NATS)
	if err != nil {
		return fmt.Errorf("email channel: %w", err)
	}
	kv, err := js.CreateOrUpdateKeyValue(ctx, linkBucketConfig)
	if err != nil {
		return fmt.Errorf("email channel: bucket %s: %w (the bot's NATS user needs JetStream access to KV_%s)", LinkBucket, err, LinkBucket)
	}
	if !a.st.CompareAndSwap(nil, &state{rt: rt, kv: kv}) {
		return errors.New("email channel: Start called twice")
	}
	mux.HandleFunc("GET "+linkPath+"{token}", a.serveLink)
	mux.HandleFunc("POST "+linkPath+"{token}", a.answerLink)
	return nil
}

// linkPath is where approval links point, below the public URL.
const linkPath = "/email/a/"

// ref is what Notify returns: who was mailed about the request so far.
type ref struct {
	Sent []string `json:"sent"`
}

// Notify mails the request of n to its recipients, each their own mail with
// their own links: for a new request, everyone the notice names who has an
// email address (except its user, unless the rule lets them approve their
// own request); for an escalation, those it adds; for a reminder, everyone
// mailed before and everyone the notice names, who may still answer. It
// returns the list of principals mailed so far.
//
// A mail that went out is recorded in LinkBucket, so that when some fail
// and the runtime retries the notification, only those are sent again.
func (a *Adapter) Notify(ctx context.Context, n handler.Notice) (json.RawMessage, error) {
	st := a.st.Load()
	if st == nil {
		return nil, errors.New("email channel: Notify before Start")
	}
	var prev ref
	if len(n.Ref) > 0 {
		_ = json.Unmarshal(n.Ref, &prev) // an unreadable ref only means no one was mailed yet
	}
	k := kindNew
	switch {
	case n.Reminder:
		k = kindReminder
	case n.Level > 0:
		k = kindEscalation
	}
	to := a.recipients(n, k, prev.Sent)
	log := a.log.With(zap.String("request_id", n.ID), zap.String("kind", k.String()))
	if len(to) == 0 {
		log.Debug("no one to mail")
		return nil, nil
	}
	digest, err := events.ArgsDigest(n.Args)
	if err != nil {
		return nil, fmt.Errorf("email channel: request %s: %w", n.ID, err)
	}
	now := a.now()
	expires := n.Deadline
	if limit := now.Add(linkLifetime); expires.After(limit) {
		expires = limit
	}
	principals := make([]string, 0, len(to))
	for p := range to {
		principals = append(principals, p)
	}
	sort.Strings(principals)
	sum := summarize(n, now, mailFull)
	var (
		msgs    []*gomail.Msg
		pending []string // the principals of msgs
		sent    = slices.Clone(prev.Sent)
	)
	for _, p := range principals {
		switch _, err := st.kv.Get(ctx, sentKey(n.ID, p, k.String())); {
		case err == nil:
			sent = append(sent, p) // mailed by an earlier attempt
			continue
		case !errors.Is(err, jetstream.ErrKeyNotFound):
			return nil, fmt.Errorf("email channel: request %s: read %s: %w", n.ID, LinkBucket, err)
		}
		m, err := a.message(n, k, sum, p, to[p], digest, expires)
		if err != nil {
			// Retrying cannot fix it; the others still get their mail.
			log.Error("cannot mail this principal", zap.String("principal", p), zap.Error(err))
			continue
		}
		msgs = append(msgs, m)
		pending = append(pending, p)
	}
	var sendErr error
	if len(msgs) > 0 {
		sendErr = a.send(ctx, msgs)
	}
	// What went out is recorded even when ctx ends meanwhile (a shutdown):
	// the mails cannot be taken back.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	sentAt := a.now() // when the mails went: an answer's shown_at
	for i, m := range msgs {
		if !m.IsDelivered() {
			if err := m.SendError(); err != nil {
				log.Warn("mail not sent; will retry", zap.String("principal", pending[i]), zap.Error(err))
			}
			continue
		}
		sent = append(sent, pending[i])
		if _, err := st.kv.Put(rctx, sentKey(n.ID, pending[i], k.String()), []byte(sentAt.UTC().Format(time.RFC3339Nano))); err != nil {
			log.Warn("record mail sent; a retry may mail again", zap.String("principal", pending[i]), zap.Error(err))
		}
		log.Info("mailed", zap.String("principal", pending[i]))
	}
	if sendErr != nil {
		return nil, fmt.Errorf("email channel: request %s: %w", n.ID, sendErr)
	}
	sort.Strings(sent)
	out, _ := json.Marshal(ref{Sent: slices.Compact(sent)})
	return out, nil
}

// recipients returns, by principal, the addresses to mail about n.
func (a *Adapter) recipients(n handler.Notice, k kind, before []string) map[string]string {
	d := a.env.Directory
	to := d.Recipients(n, Name)
	switch k {
	case kindEscalation:
		for _, p := range before {
			delete(to, p) // mailed at an earlier level; their links still work
		}
	case kindReminder:
		for _, p := range before {
			if _, ok := to[p]; ok {
				continue
			}
			if addr, ok := d.Identity(p, Name); ok && d.MayAnswer(p, n) == nil {
				to[p] = addr
			}
		}
	}
	return to
}

// message returns the mail to principal at addr about n.
func (a *Adapter) message(n handler.Notice, k kind, sum summary, principal, addr, digest string, expires time.Time) (*gomail.Msg, error) {
	rcpt, err := netmail.ParseAddress(addr)
	if err != nil {
		return nil, fmt.Errorf("address %q of principal %s in the policy: %w", addr, principal, err)
	}
	l := link{Request: n.ID, Principal: principal, Args: digest, To: addressHash(rcpt.Address), Expires: expires.Unix()}
	l.Decision = events.Approve
	approve := a.s.public + linkPath + a.links.sign(l)
	l.Decision = events.Deny
	deny := a.s.public + linkPath + a.links.sign(l)

	v := mailView{
		summary:   sum,
		Kind:      k,
		Subject:   subject(a.s.cfg.SubjectPrefix, k, sum),
		Banner:    banner(k, sum),
		Principal: principal,
		To:        rcpt.Address,
		Approve:   approve,
		Deny:      deny,
		WebUI:     a.env.RequestPage(n.ID),
	}
	v.Preheader = cut(v.Headline()+", deadline "+sum.Remaining+".", 140)
	text, html, err := render(v)
	if err != nil {
		return nil, err
	}
	m := gomail.NewMsg()
	m.FromMailAddress(a.s.from)
	m.ToMailAddress(rcpt)
	m.Subject(v.Subject)
	root := messageID(n.ID, principal, "", a.s.domain)
	if k == kindReminder {
		m.SetMessageIDWithValue(messageID(n.ID, principal, k.String(), a.s.domain))
		m.SetGenHeaderPreformatted(gomail.HeaderInReplyTo, "<"+root+">")
		m.SetGenHeaderPreformatted(gomail.HeaderReferences, "<"+root+">")
	} else {
		m.SetMessageIDWithValue(root)
	}
	m.SetDateWithValue(a.now())
	m.SetUserAgent("Assent")
	// RFC 3834: no vacation replies to a machine's mail.
	m.SetGenHeaderPreformatted("Auto-Submitted", "auto-generated")
	m.SetGenHeader(gomail.HeaderXAutoResponseSuppress, "All")
	m.SetBodyString(gomail.TypeTextPlain, text)
	m.AddAlternativeString(gomail.TypeTextHTML, html)
	return m, nil
}

// messageID is the Message-ID (without angle brackets) of a mail about
// request id to principal: the first mail's for an empty suffix, which later
// mails refer to so that clients thread them.
func messageID(id, principal, suffix, domain string) string {
	left := "assent." + id + "." + principal
	if suffix != "" {
		left += "." + suffix
	}
	return left + "@" + domain
}

// send submits msgs in one SMTP session. Each message records whether it
// was delivered (Msg.IsDelivered) and why not (Msg.SendError).
func (a *Adapter) send(ctx context.Context, msgs []*gomail.Msg) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, sendTimeout)
		defer cancel()
	}
	c, err := a.client()
	if err != nil {
		return err
	}
	if err := c.DialAndSendWithContext(ctx, msgs...); err != nil {
		return fmt.Errorf("smtp %s:%d: %w", a.s.cfg.SMTP.Host, a.s.cfg.SMTP.Port, err)
	}
	return nil
}

// client returns an SMTP client for the configured server. One is made per
// notification: a go-mail Client is not meant to be shared by concurrent
// sessions.
func (a *Adapter) client() (*gomail.Client, error) {
	smtp := a.s.cfg.SMTP
	opts := clientOptions(smtp, a.s.tls.Clone(), 30*time.Second, a.s.password)
	c, err := gomail.NewClient(strings.Trim(smtp.Host, "[]"), opts...)
	if err != nil {
		return nil, fmt.Errorf("smtp client: %w", err)
	}
	return c, nil
}

// clientOptions are go-mail's options for a session with smtp: TLS as
// configured (with tc), and a login with password when smtp names a user.
func clientOptions(smtp SMTPConfig, tc *tls.Config, timeout time.Duration, password string) []gomail.Option {
	opts := []gomail.Option{gomail.WithPort(smtp.Port), gomail.WithTimeout(timeout), gomail.WithTLSConfig(tc)}
	switch smtp.TLS {
	case TLSImplicit:
		opts = append(opts, gomail.WithSSL())
	case TLSNone:
		opts = append(opts, gomail.WithTLSPolicy(gomail.NoTLS))
	default:
		opts = append(opts, gomail.WithTLSPolicy(gomail.TLSMandatory))
	}
	if smtp.Username != "" {
		auth := gomail.SMTPAuthAutoDiscover
		switch {
		case smtp.TLS == TLSNone && smtp.InsecurePlaintext && !loopback(smtp.Host):
			auth = gomail.SMTPAuthPlainNoEnc // the password in the clear, as Config.Warnings says
		case smtp.TLS == TLSNone:
			auth = gomail.SMTPAuthPlain // loopback only; discovery refuses plain text
		}
		opts = append(opts, gomail.WithSMTPAuth(auth), gomail.WithUsername(smtp.Username), gomail.WithPassword(password))
	}
	return opts
}

// Resolve does nothing: outcomes are not mailed (the link page shows them).
func (a *Adapter) Resolve(context.Context, handler.Outcome) error { return nil }
