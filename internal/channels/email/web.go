package email

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	htmltemplate "html/template"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/assent-dev/assent/internal/channels"
	"github.com/assent-dev/assent/internal/textsafe"
	"github.com/assent-dev/assent/pkg/events"
	"github.com/assent-dev/assent/pkg/handler"
)

// The link pages. A link's GET shows the request and a form; only the form's
// POST answers. The form needs no CSRF token of its own: the link's token is
// in the URL it posts to, and it is a secret of one principal, signed, bound
// to one decision and used once, so a page elsewhere cannot make a browser
// post one it does not know. The pages load nothing (a strict CSP allows
// only their own inline style, and forms only to this origin), are never
// framed, cached or indexed, and send no Referer that could leak the token.

var pageTemplate = htmltemplate.Must(htmltemplate.New("page.html").Funcs(htmltemplate.FuncMap{"shown": shown}).ParseFS(templateFS, "templates/page.html"))

// pageCSS is the pages' only style, inline; the CSP allows it by its hash.
const pageCSS = `
*{box-sizing:border-box}
body{margin:0;background:#f4f5f7;color:#172b4d;font:15px/1.5 -apple-system,"Segoe UI",Roboto,Helvetica,Arial,sans-serif}
main{max-width:640px;margin:32px auto;padding:0 16px}
.card{background:#fff;border:1px solid #dfe1e6;border-radius:8px;padding:24px 28px}
.eyebrow{margin:0 0 4px;font-size:12px;letter-spacing:.06em;text-transform:uppercase;color:#626f86}
h1{margin:0 0 8px;font-size:22px;line-height:1.3}
.lead{margin:0 0 16px;color:#44546f}
.note{margin:0 0 16px;padding:10px 14px;border-left:4px solid #8590a2;background:#f7f8f9}
.ok .note{border-color:#1f845a;background:#dcfff1}
.bad .note{border-color:#c9372c;background:#ffeceb}
.warn .note{border-color:#e56910;background:#fff7e6}
dl{display:grid;grid-template-columns:max-content 1fr;gap:6px 16px;margin:16px 0;padding-top:12px;border-top:1px solid #dfe1e6}
dt{color:#626f86;font-size:13px;padding-top:1px}
dd{margin:0;word-break:break-word}
.hint{white-space:pre-wrap;word-break:break-word;padding:10px 14px;background:#f7f8f9;border-left:4px solid #8590a2;margin:0 0 16px}
.record{margin:0 0 16px;padding:8px 12px;background:#f7f8f9;border-left:4px solid #8590a2;font-size:14px}
.record.notable{background:#fff7e6;border-color:#e56910}
.record span{font-size:12px;letter-spacing:.06em;text-transform:uppercase;color:#626f86;font-weight:600;margin-right:6px}
h2{font-size:13px;font-weight:400;color:#626f86;margin:16px 0 6px}
h2 code{font:600 13px SFMono-Regular,Menlo,Consolas,monospace;color:#172b4d}
.args{width:100%;border-collapse:separate;border-spacing:0;background:#f7f8f9;border:1px solid #dfe1e6;border-radius:6px;font:13px/1.5 SFMono-Regular,Menlo,Consolas,monospace}
.args th{text-align:left;vertical-align:top;padding:6px 12px 6px 14px;width:1%;white-space:nowrap}
.args th.long{white-space:normal;word-break:break-all;padding-bottom:0}
.args tr.under th,.args tr.under td{border-top:0}
.args td{vertical-align:top;padding:6px 14px 6px 0;white-space:pre-wrap;word-break:break-word}
.args tr+tr th,.args tr+tr td{border-top:1px solid #dfe1e6}
.more{display:inline-block;margin-left:6px;padding:0 8px;border-radius:9px;background:#e9f2ff;color:#0055cc;font:12px/18px -apple-system,"Segoe UI",Roboto,Helvetica,Arial,sans-serif;white-space:nowrap}
pre{margin:0;padding:12px 14px;background:#f7f8f9;border:1px solid #dfe1e6;border-radius:6px;font:12px/1.5 SFMono-Regular,Menlo,Consolas,monospace;white-space:pre-wrap;word-break:break-word;overflow-wrap:anywhere;max-height:420px;overflow:auto}
form{margin-top:20px;padding-top:16px;border-top:1px solid #dfe1e6}
label{display:block;font-weight:600;margin-bottom:6px}
textarea{width:100%;min-height:88px;padding:8px 10px;border:1px solid #8590a2;border-radius:6px;font:inherit;resize:vertical}
button{margin-top:12px;padding:10px 26px;border:0;border-radius:6px;font-family:inherit;font-size:16px;font-weight:600;line-height:1.25;color:#fff;cursor:pointer}
.approve{background:#1f845a}.deny{background:#c9372c}
.who{margin-top:10px;font-size:13px;color:#626f86}
footer{margin-top:16px;font-size:12px;color:#626f86;text-align:center}
`

var pageCSP = func() string {
	sum := sha256.Sum256([]byte(pageCSS))
	return "default-src 'none'; style-src 'sha256-" + base64.StdEncoding.EncodeToString(sum[:]) + "'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
}()

// maxForm bounds a form's body.
const maxForm = 64 << 10

// pageTimeout bounds the work behind one page (reads and writes on NATS).
const pageTimeout = 15 * time.Second

// page is one rendered link page.
type page struct {
	status int
	Title  string
	// Tone colours the note: "ok", "bad", "warn" or "" (neutral).
	Tone    string
	Lead    string
	Note    string
	Summary *summary
	Form    *form
	CSS     htmltemplate.CSS
}

// form is a page's confirmation form.
type form struct {
	Approve   bool
	Principal string
	MaxLength int
}

// refuse returns a page that refuses a link with status.
func refuse(status int, title, note string) *page {
	return &page{status: status, Title: title, Tone: "bad", Note: note}
}

// checked is a link that passed every check but its use.
type checked struct {
	token  string
	link   link
	notice handler.Notice
}

// serveLink shows a link's confirmation page (GET): it never answers.
func (a *Adapter) serveLink(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), pageTimeout)
	defer cancel()
	c, p := a.examine(ctx, r.PathValue("token"))
	if p == nil {
		sum := summarize(c.notice, a.now(), pageFull)
		p = &page{status: http.StatusOK, Summary: &sum, Form: &form{Approve: c.link.Decision == events.Approve, Principal: c.link.Principal, MaxLength: events.MaxTextLength}}
		if c.link.Decision == events.Approve {
			p.Title = "Approve " + sum.Tool + "?"
			p.Lead = sum.Agent + " asks to run " + sum.Tool + ". Check the request, then confirm below."
		} else {
			p.Title = "Deny " + sum.Tool + "?"
			p.Lead = sum.Agent + " asks to run " + sum.Tool + ". Say why you deny it: the agent is told."
		}
	}
	a.render(w, p)
}

// answerLink answers as a link's principal (POST): it checks the link again,
// uses it up, and publishes the answer.
func (a *Adapter) answerLink(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), pageTimeout)
	defer cancel()
	if r.Header.Get("Sec-Fetch-Site") == "cross-site" {
		a.render(w, refuse(http.StatusForbidden, "Answer refused", "This form was sent from another site. Open the link from your mail and confirm on its page."))
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, maxForm)
	if err := r.ParseForm(); err != nil {
		a.render(w, refuse(http.StatusBadRequest, "Answer refused", "The form could not be read: "+err.Error()))
		return
	}
	reason := strings.TrimSpace(strings.ReplaceAll(r.PostForm.Get("reason"), "\r\n", "\n"))
	if len(reason) > events.MaxTextLength {
		a.render(w, refuse(http.StatusBadRequest, "Reason too long", fmt.Sprintf("The reason has %d bytes; at most %d are kept. Go back, shorten it and confirm again.", len(reason), events.MaxTextLength)))
		return
	}
	c, p := a.examine(ctx, r.PathValue("token"))
	if p != nil {
		if p.status == http.StatusOK {
			p.status = http.StatusConflict // decided: the answer was not taken
		}
		a.render(w, p)
		return
	}
	st := a.st.Load()
	l := c.link
	log := a.log.With(zap.String("request_id", l.Request), zap.String("principal", l.Principal), zap.String("decision", string(l.Decision)))
	switch err := use(ctx, st.kv, c.token, l.Principal, a.now()); {
	case errors.Is(err, jetstream.ErrKeyExists):
		a.render(w, a.usedPage(ctx, l))
		return
	case err != nil:
		log.Warn("record link use", zap.Error(err))
		a.render(w, unavailable())
		return
	}
	// Answered from this page, which shows the whole request: with its
	// detail in view. Shown when the first mail about it went to them.
	err := st.rt.Answer(ctx, l.Principal, l.Request, handler.Response{Decision: l.Decision, Reason: reason,
		ShownAt: mailedAt(ctx, st.kv, l.Request, l.Principal), Detail: true})
	if err != nil {
		// Not answered: let the link be used again.
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		_ = st.kv.Delete(dctx, usedKey(c.token))
		cancel()
		if errors.Is(err, events.ErrInvalid) {
			a.render(w, refuse(http.StatusBadRequest, "Answer refused", "The answer was not accepted: "+textsafe.Line(err.Error())))
			return
		}
		log.Warn("publish answer", zap.Error(err))
		a.render(w, unavailable())
		return
	}
	log.Info("answered by email link")
	a.render(w, a.answeredPage(ctx, st.rt, c))
}

// examine checks a link as it stands: its signature and expiry, the request
// it names, its arguments, the request's state, the link's use and the
// principal's right to answer. It returns the page to show instead of the
// form, if any: a refusal, or (status 200) the request's outcome.
func (a *Adapter) examine(ctx context.Context, token string) (checked, *page) {
	st := a.st.Load()
	now := a.now()
	l, err := a.links.verify(token, now)
	switch {
	case errors.Is(err, errLinkExpired):
		return checked{}, refuse(http.StatusGone, "Link expired",
			"This link expired at "+l.expires().UTC().Format("Mon 2 Jan 2006 15:04 UTC")+", when the request's deadline passed. If the request still waits, answer it from a newer mail or another channel.")
	case err != nil:
		a.log.Info("refused link", zap.Error(err))
		return checked{}, refuse(http.StatusForbidden, "Link not valid",
			"This link is not one Assent made, or it was changed or cut short (some mail clients break long links across lines). Open it again from the mail, or copy the whole address.")
	}
	n, _, ok, err := st.rt.Lookup(ctx, l.Request)
	switch {
	case err != nil:
		a.log.Warn("look up request", zap.String("request_id", l.Request), zap.Error(err))
		return checked{}, unavailable()
	case !ok:
		return checked{}, refuse(http.StatusNotFound, "Request not found",
			"The email channel has no record of request "+l.Request+". It may be too old (records are kept for 72 hours).")
	}
	if digest, err := events.ArgsDigest(n.Args); err != nil || digest != l.Args {
		return checked{}, refuse(http.StatusForbidden, "Link out of date",
			"This link was made for other arguments than the request now has. Use the newest mail about it.")
	}
	if addr, ok := a.env.Directory.Identity(l.Principal, Name); !ok || addressHash(addr) != l.To {
		return checked{}, refuse(http.StatusForbidden, "Link no longer valid",
			"This link was mailed to an address that is no longer "+l.Principal+"'s in the policy.")
	}
	d, decided, err := st.rt.Decision(ctx, l.Request)
	switch {
	case err != nil:
		a.log.Warn("read decision", zap.String("request_id", l.Request), zap.Error(err))
		return checked{}, unavailable()
	case decided:
		return checked{}, a.decidedPage(n, d, "Already decided")
	}
	switch u, err := used(ctx, st.kv, token); {
	case err != nil:
		a.log.Warn("read link use", zap.Error(err))
		return checked{}, unavailable()
	case u:
		return checked{}, a.usedPage(ctx, l)
	}
	if err := a.env.Directory.MayAnswer(l.Principal, n); err != nil {
		return checked{}, refuse(http.StatusForbidden, "You may not answer this request",
			l.Principal+" may not answer this request under the current policy: "+textsafe.Line(err.Error())+".")
	}
	return checked{token: token, link: l, notice: n}, nil
}

// decidedPage shows a decided request's outcome.
func (a *Adapter) decidedPage(n handler.Notice, d handler.Decision, title string) *page {
	sum := summarize(n, a.now(), pageFull)
	tone := "warn"
	if d.Approved() {
		tone = "ok"
	} else if d.Outcome == events.Denied {
		tone = "bad"
	}
	return &page{status: http.StatusOK, Title: title, Tone: tone, Note: decidedText("This request was already", d, a.now()), Summary: &sum}
}

// usedPage refuses a link used before, saying where the request stands.
func (a *Adapter) usedPage(ctx context.Context, l link) *page {
	p := refuse(http.StatusConflict, "Link already used", "This link was already used: each works once.")
	if d, decided, err := a.st.Load().rt.Decision(ctx, l.Request); err == nil && decided {
		p.Note += " " + decidedText("The request was", d, a.now())
	} else if err == nil {
		p.Note += " The request still waits for other answers."
	}
	return p
}

// answeredPage confirms an answer, with the request's outcome if the
// broker decides within a moment.
func (a *Adapter) answeredPage(ctx context.Context, rt channels.Runtime, c checked) *page {
	sum := summarize(c.notice, a.now(), pageFull)
	verb := "approved"
	tone := "ok"
	if c.link.Decision == events.Deny {
		verb, tone = "denied", "bad"
	}
	p := &page{status: http.StatusOK, Title: "You " + verb + " " + sum.Tool, Tone: tone, Summary: &sum}
	d, decided := awaitDecision(ctx, rt, c.link.Request, 2*time.Second)
	switch {
	case !decided:
		p.Note = "Your answer was sent as " + c.link.Principal + ". The request still waits for other approvals."
	case slices.ContainsFunc(d.DecidedBy, func(b events.DecidedBy) bool { return b.Principal == c.link.Principal }):
		p.Note = decidedText("Done: the request was", d, a.now())
	default:
		p.Tone = "warn"
		p.Title = "Decided before your answer counted"
		p.Note = decidedText("The request was already", d, a.now())
	}
	return p
}

// awaitDecision polls for request id's decision for at most wait.
func awaitDecision(ctx context.Context, rt channels.Runtime, id string, wait time.Duration) (handler.Decision, bool) {
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	for {
		if d, ok, err := rt.Decision(ctx, id); err == nil && ok {
			return d, true
		}
		select {
		case <-ctx.Done():
			return handler.Decision{}, false
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// decidedText says how a request was decided, by whom and when, after
// lead: decidedText("This request was already", d, now) is "This request
// was already approved by alice via slack, 2 minutes ago."
func decidedText(lead string, d handler.Decision, now time.Time) string {
	when := ""
	if !d.DecidedAt.IsZero() {
		when = ", " + ago(d.DecidedAt, now)
	}
	var s string
	switch d.Outcome {
	case events.Expired:
		s = lead + " expired" + when + ": nobody answered in time."
	case events.Cancelled:
		s = lead + " cancelled by the agent" + when + "."
	default:
		s = lead + " " + textsafe.Line(string(d.Outcome)) + " by " + textsafe.Line(channels.Who(d)) + when + "."
	}
	if d.Reason != "" {
		s += " Reason: " + cut(textsafe.Line(d.Reason), 500)
	}
	return s
}

// unavailable is the page for a failure of NATS: nothing was done.
func unavailable() *page {
	return &page{status: http.StatusServiceUnavailable, Title: "Try again in a moment", Tone: "warn",
		Note: "Assent could not reach its message bus, so nothing was done. Reload this page in a moment."}
}

// render writes p with the pages' security headers.
func (a *Adapter) render(w http.ResponseWriter, p *page) {
	p.CSS = htmltemplate.CSS(pageCSS)
	var buf bytes.Buffer
	if err := pageTemplate.Execute(&buf, p); err != nil {
		a.log.Error("render link page", zap.Error(err))
		http.Error(w, "internal error", http.StatusInternalServerError)
		return
	}
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Content-Security-Policy", pageCSP)
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Robots-Tag", "noindex, nofollow")
	w.WriteHeader(p.status)
	_, _ = w.Write(buf.Bytes())
}
