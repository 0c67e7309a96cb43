package email_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/assent-dev/assent/internal/broker"
	"github.com/assent-dev/assent/internal/brokertest"
	"github.com/assent-dev/assent/internal/channels"
	"github.com/assent-dev/assent/internal/channels/email"
	"github.com/assent-dev/assent/internal/smtptest"
	"github.com/assent-dev/assent/internal/testenv"
	"github.com/assent-dev/assent/pkg/events"
	"github.com/assent-dev/assent/pkg/handler"
	"github.com/assent-dev/assent/pkg/policy"
)

// linksFuzz is what FuzzLinkPages runs against: a broker, a local SMTP
// server and the email channel on one embedded NATS server, shared by every
// input.
type linksFuzz struct {
	b       *broker.Broker
	adapter *email.Adapter
	rt      *handler.Channel
	mux     *http.ServeMux
	// answers receives every answer put on the stream.
	answers *testenv.Tap
	// current is the request links are made for: pending when it was made.
	current string
	made    time.Time
	n       int
}

// fuzzArgs are the arguments of the requests FuzzLinkPages makes.
var fuzzArgs = json.RawMessage(`{"env":"prod","replicas":3}`)

func newLinksFuzz(f *testing.F) *linksFuzz {
	f.Setenv(email.DefaultLinkSecretEnv, linkSecret)
	f.Setenv(email.DefaultPasswordEnv, smtptest.Password)
	p, err := policy.Parse([]byte(teamPolicy), "email.yaml")
	if err != nil {
		f.Fatal(err)
	}
	ns := testenv.Server(f)
	// Deadlines an hour away and no reminders: nothing expires or is mailed
	// again while the fuzzer runs.
	b, _ := brokertest.RunLogged(f, testenv.InProcessConn(f, ns), broker.Config{Name: "fuzz", Policy: p, MinTimeout: time.Hour, DefaultTimeout: time.Hour}, zap.NewNop())
	mail := smtptest.Start(f)
	nc := testenv.InProcessConn(f, ns)
	e := &linksFuzz{b: b, mux: http.NewServeMux(), answers: testenv.NewTap(f, ns, events.ResponsePrefix+">")}
	e.adapter, err = email.New(email.Config{
		SMTP: email.SMTPConfig{Host: mail.Host, Port: mail.Port, Username: smtptest.User, CAFile: mail.CAFile},
		From: "Assent <assent@example.com>",
	}, channels.Env{NATS: nc, Directory: channels.NewDirectory(p), PublicURL: "https://bot.example.com", Logger: zap.NewNop()})
	if err != nil {
		f.Fatal(err)
	}
	e.rt, _ = brokertest.RunAdapter(f, nc, handler.ChannelConfig{Logger: zap.NewNop()}, e.adapter, e.mux)
	return e
}

// request returns the request links are made for: a new pending one once
// the last was decided, but at most one a second, since taking a link's
// answer waits a moment for the decision.
func (e *linksFuzz) request(t *testing.T) string {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if e.current != "" {
		if rec, err := e.b.Get(ctx, e.current); err == nil && rec.State == broker.StatePending || time.Since(e.made) < time.Second {
			return e.current
		}
	}
	e.n++
	id := fmt.Sprintf("fuzz-%d-%d", os.Getpid(), e.n)
	rec, err := e.b.Submit(ctx, id, "fuzz", events.Requested{Tool: "deploy", Agent: "coder", User: "carol", Args: fuzzArgs})
	if err != nil || rec.State != broker.StatePending {
		t.Fatalf("make a pending request: %v (state %q)", err, rec.State)
	}
	// The page needs the notice the channel recorded when it mailed it.
	for {
		if _, _, ok, err := e.rt.Lookup(ctx, id); err == nil && ok {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("request %s not mailed: %v", id, ctx.Err())
		case <-time.After(2 * time.Millisecond):
		}
	}
	e.current, e.made = id, time.Now()
	return id
}

// token returns the token of a link for the current request, as the
// placeholder kind names it.
func (e *linksFuzz) token(t *testing.T, kind string) (tok, principal string, d events.Verdict) {
	id := e.request(t)
	principal, addr, d, args, expires := "alice", "alice@example.com", events.Approve, fuzzArgs, time.Now().Add(time.Hour)
	switch kind {
	case "$DENY":
		d = events.Deny
	case "$BOB": // his address as the policy spells it, in another case
		principal, addr = "bob", "bob@example.com"
	case "$MALLORY": // not an approver of deploys
		principal, addr = "mallory", "mallory@example.com"
	case "$OLDADDR":
		addr = "alice@old.example.com"
	case "$OLDARGS":
		args = json.RawMessage(`{"env":"staging"}`)
	case "$EXPIRED":
		expires = time.Now().Add(-time.Minute)
	}
	u := e.adapter.LinkForTest(id, principal, addr, d, args, expires)
	_, tok, _ = strings.Cut(u, "/email/a/")
	return tok, principal, d
}

// linkPlaceholders stand, in a fuzzed token, for a link to the current
// request: alice's approve and deny links, bob's, mallory's (who may not
// answer), one mailed to an address alice no longer has, one for other
// arguments, and an expired one.
var linkPlaceholders = []string{"$APPROVE", "$DENY", "$BOB", "$MALLORY", "$OLDADDR", "$OLDARGS", "$EXPIRED"}

// linkStatus are the statuses the link pages answer (web.go).
var linkStatus = map[int]bool{200: true, 400: true, 403: true, 404: true, 409: true, 410: true, 503: true}

// FuzzLinkPages opens (GET) or confirms (POST) /email/a/{token} with any
// token, Content-Type, Sec-Fetch-Site and form; a placeholder in the token
// (see linkPlaceholders) becomes a real link's token. Whatever comes, the
// pages must not panic; answer an HTML page with their security headers and
// one of their statuses (503 only for the unavailable page), with no script;
// decide nothing on a GET; refuse a cross-site POST; and put at most one
// answer on the stream, only for a POST of a real link, as the link's
// principal for the link's request, with 200.
func FuzzLinkPages(f *testing.F) {
	e := newLinksFuzz(f)
	for _, s := range []struct {
		post                     bool
		token, contentType, site string
		form                     string
	}{
		// Refusals first: a seed that answers decides the request, and the
		// next request comes a second later.
		{false, "$APPROVE", "", "", ""},
		{false, "$DENY", "", "", ""},
		{true, "$MALLORY", "application/x-www-form-urlencoded", "", "reason=mine"},
		{false, "$OLDADDR", "", "", ""},
		{true, "$OLDARGS", "application/x-www-form-urlencoded", "", ""},
		{false, "$EXPIRED", "", "", ""},
		{true, "$APPROVE", "application/x-www-form-urlencoded", "cross-site", "reason=csrf"},
		{true, "$APPROVE", "application/x-www-form-urlencoded", "", "reason=%zz"},
		{true, "$APPROVE", "application/x-www-form-urlencoded", "", "reason=" + strings.Repeat("x", events.MaxTextLength+1)},
		{false, "$APPROVE.x", "", "", ""},
		{false, "$APPROVEA", "", "", ""},
		{false, "eyJ2IjoxfQ.AAAA", "", "", ""},
		{true, "not-a-token", "application/x-www-form-urlencoded", "", "reason=%3Cscript%3Ealert(1)%3C%2Fscript%3E"},
		{false, "", "", "", ""},
		{false, "%2e%2e", "", "", ""},
		{false, strings.Repeat("A", 1100) + ".B", "", "", ""},
		{true, "$DENY", "application/x-www-form-urlencoded", "", "reason=not+on+a+Friday%0D%0Aplease&reason=2"},
		{true, "$APPROVE", "application/x-www-form-urlencoded", "same-origin", "reason=ship+it"},
		{true, "$BOB", "multipart/form-data; boundary=x", "none", "--x\r\nContent-Disposition: form-data; name=\"reason\"\r\n\r\nhi\r\n--x--\r\n"},
	} {
		f.Add(s.post, s.token, s.contentType, s.site, []byte(s.form))
	}
	f.Fuzz(func(t *testing.T, post bool, token, contentType, site string, form []byte) {
		minted, principal, verdict := "", "", events.Verdict("")
		for _, p := range linkPlaceholders {
			if strings.Contains(token, p) {
				minted, principal, verdict = e.token(t, p)
				token = strings.Replace(token, p, minted, 1)
				break
			}
		}
		method := http.MethodGet
		if post {
			method = http.MethodPost
		}
		r, ok := testenv.WireRequest(method, "/email/a/"+token, "bot.example.com", [][2]string{{"Content-Type", contentType}, {"Sec-Fetch-Site", site}}, form)
		if !ok {
			return // not a request net/http would serve
		}
		if _, pattern := e.mux.Handler(r); pattern != method+" /email/a/{token}" {
			return // not a link page
		}
		r.RemoteAddr = "192.0.2.7:40000"
		e.answers.Drain(t)
		w := httptest.NewRecorder()
		e.mux.ServeHTTP(w, r)
		answers := e.answers.Drain(t)

		input := fmt.Sprintf("%s %q (Content-Type %q, Sec-Fetch-Site %q) form %q", method, token, contentType, site, form)
		status, h, body := w.Code, w.Header(), w.Body.String()
		if status == http.StatusMovedPermanently || status == http.StatusTemporaryRedirect {
			return // the mux's, to the clean path
		}
		if ct := h.Get("Content-Type"); ct != "text/html; charset=utf-8" {
			t.Fatalf("%s: %d with Content-Type %q, want an HTML page: %.300s", input, status, ct, body)
		}
		if !linkStatus[status] {
			t.Fatalf("%s: %d, which the link pages do not answer: %.300s", input, status, body)
		}
		if status == http.StatusServiceUnavailable && !strings.Contains(body, "Try again in a moment") {
			t.Fatalf("%s: 503 other than the unavailable page: %.300s", input, body)
		}
		for k, want := range map[string]string{"X-Frame-Options": "DENY", "Referrer-Policy": "no-referrer", "Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"} {
			if h.Get(k) != want {
				t.Fatalf("%s: %d with %s %q, want %q", input, status, k, h.Get(k), want)
			}
		}
		if !strings.HasPrefix(h.Get("Content-Security-Policy"), "default-src 'none'") {
			t.Fatalf("%s: Content-Security-Policy %q", input, h.Get("Content-Security-Policy"))
		}
		if strings.Contains(strings.ToLower(body), "<script") {
			t.Fatalf("%s: the page holds a script: %s", input, body)
		}
		switch {
		case len(answers) == 0:
		case !post:
			t.Fatalf("%s: a GET put answers on the stream: %v", input, answers)
		case site == "cross-site":
			t.Fatalf("%s: a cross-site POST put answers on the stream: %v", input, answers)
		case len(answers) > 1 || status != http.StatusOK || minted == "" || r.PathValue("token") != minted:
			t.Fatalf("%s: %d with answers %v (link made: %q)", input, status, answers, minted)
		case answers[0] != events.ResponsePrefix+principal+"."+e.current:
			t.Fatalf("%s: answer %s, from a link of %s for %s (%s)", input, answers[0], principal, e.current, verdict)
		}
		if post && site == "cross-site" && status != http.StatusForbidden {
			t.Fatalf("%s: a cross-site POST got %d", input, status)
		}
	})
}
