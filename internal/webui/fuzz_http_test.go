package webui_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"html"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/assent-dev/assent/internal/broker"
	"github.com/assent-dev/assent/internal/brokertest"
	"github.com/assent-dev/assent/internal/testenv"
	"github.com/assent-dev/assent/internal/webui"
	"github.com/assent-dev/assent/pkg/events"
	"github.com/assent-dev/assent/pkg/policy"
)

// uiHost is the host the fuzzed requests are sent to.
const uiHost = "ui.test"

// uiFuzz is what FuzzUI runs against: the pages over a broker on one
// embedded NATS server, shared by every input, with the viewer named by the
// X-Fuzz-User header (none: nobody, with authentication on).
type uiFuzz struct {
	b    *broker.Broker
	mux  *http.ServeMux
	made int
	// known is a request that exists, for inputs that make none.
	known string
}

func newUIFuzz(f *testing.F) *uiFuzz {
	p, err := policy.Parse([]byte(testPolicy), "policy.yaml")
	if err != nil {
		f.Fatal(err)
	}
	ns := testenv.Server(f)
	nc := testenv.InProcessConn(f, ns)
	// Deadlines an hour away: nothing changes but what the inputs make.
	b, _ := brokertest.RunLogged(f, nc, broker.Config{Name: "fuzz", Policy: p, MinTimeout: time.Hour, DefaultTimeout: time.Hour}, zap.NewNop())
	ui, err := webui.New(b, webui.Config{
		Identify: func(r *http.Request) (webui.Identity, bool) {
			u := r.Header.Get("X-Fuzz-User")
			return webui.Identity{Principal: u, Method: "test"}, u != ""
		},
		CSRFToken: func(*http.Request) string { return "csrf-token" },
		PageSize:  5,
	}, zap.NewNop())
	if err != nil {
		f.Fatal(err)
	}
	e := &uiFuzz{b: b, mux: http.NewServeMux()}
	ui.Register(e.mux)
	rec, err := b.Submit(context.Background(), "fuzz-known", "agent/agent-1", events.Requested{Tool: "wire_money", Agent: "agent-1", Session: "s1",
		Args: json.RawMessage(`{"to":"<fz x>","amount":1}`), Hint: "\u202egnp.exe <fz>", Labels: map[string]string{"<fz>": "javascript:alert(1)"}})
	if err != nil {
		f.Fatal(err)
	}
	if _, err := b.Respond(context.Background(), "bob", rec.ID, events.Responded{Decision: events.Deny, Reason: "<fz> \u202e no", Channel: "web"}); err != nil {
		f.Fatal(err)
	}
	e.known = rec.ID
	return e
}

// submit makes the request an input describes, and returns its id, or ""
// if the broker refuses it. With more than maxPending requests waiting, it
// cancels them first, so that listings stay as fast as at the start.
func (e *uiFuzz) submit(t *testing.T, tool, hint string, args []byte) string {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if e.b.Pending() > 100 {
		page, err := e.b.List(ctx, broker.Filter{State: broker.StatePending, Limit: 1000})
		if err != nil {
			t.Fatalf("list pending requests: %v", err)
		}
		for _, rec := range page.Records {
			if _, err := e.b.Cancel(ctx, rec.ID, "fuzz", "<fz> too many pending"); err != nil && !errors.Is(err, broker.ErrAlreadyDecided) {
				t.Fatalf("cancel %s: %v", rec.ID, err)
			}
		}
	}
	e.made++
	id := fmt.Sprintf("fuzz-%d-%d", os.Getpid(), e.made)
	req := events.Requested{Tool: tool, Agent: "agent-1", Session: "s1", Hint: hint, Labels: map[string]string{"note": hint}}
	if len(args) > 0 {
		req.Args = json.RawMessage(args)
	}
	if _, err := e.b.Submit(ctx, id, "agent/agent-1", req); err != nil {
		if errors.Is(err, broker.ErrInvalid) || errors.Is(err, events.ErrInvalid) {
			return ""
		}
		t.Fatalf("submit: %v", err)
	}
	return id
}

var (
	// linkPattern finds the URLs of a page's links, scripts and forms.
	linkPattern = regexp.MustCompile(`(?i)\b(?:href|src|action)\s*=\s*"([^"]*)"`)
	// canary is what no page may hold as markup: it is in agents' text.
	canary = regexp.MustCompile(`(?i)<fz`)
)

// FuzzUI opens any path of the web UI (with "$ID" standing for a request
// made from the input's tool, hint and arguments, or an existing one) as
// the principal who, or nobody. Whatever comes, the pages must not panic or
// answer 5xx; send nobody to sign in, with a redirect that stays on the
// site; answer pages as HTML with their security headers; and show what
// agents sent only as text: no "<fz" from it as markup, no raw
// right-to-left override, one script (the UI's own), and links, scripts and
// forms only to the site.
func FuzzUI(f *testing.F) {
	e := newUIFuzz(f)
	for _, s := range []struct {
		target, who, tool, hint, args string
	}{
		{"/", "alice", "deploy", "ship it", `{"env":"prod"}`},
		{"/", "", "", "", ""},
		{"/?agent=agent-1&session=s1&after=$ID", "alice", "", "", ""},
		{"/?agent=a.b", "alice", "", "", ""},
		{"/approvals/$ID", "bob", "deploy", "\u202e\u2066<fz onerror=alert(1)>\x1b[2J", `{"path":"<fz>","n":1e400}`},
		{"/approvals/$ID", "bob", "<fz onerror=alert(1)>", "", ""},
		{"/approvals/$ID", "alice", "wire_money", "javascript:alert(1)", `{"url":"javascript:alert(1)","html":"</script><fz>"}`},
		{"/approvals/no-such", "alice", "", "", ""},
		{"/approvals/a%2Fb", "alice", "", "", ""},
		{"/history", "alice", "", "", ""},
		{"/history?state=denied&agent=agent-1", "bob", "", "", ""},
		{"/history?state=<fz>", "bob", "", "", ""},
		{"/remembered", "alice", "", "", ""},
		{"/ui/cards?session=s1", "alice", "read_file", "", `{"path":"/etc/hosts"}`},
		{"/ui/cards/$ID?detail=1", "alice", "x", "<fz>", `[1,2]`},
		{"/ui/cards/$ID", "", "", "", ""},
		{"/static/app.js", "", "", "", ""},
		{"/static/../static/app.css?v=1", "alice", "", "", ""},
		{"/approvals/$ID?x=<fz>", "", "", "", ""},
	} {
		f.Add(s.target, s.who, s.tool, s.hint, []byte(s.args))
	}
	base, _ := url.Parse("http://" + uiHost + "/")
	f.Fuzz(func(t *testing.T, target, who, tool, hint string, args []byte) {
		id := e.known
		if tool != "" {
			if made := e.submit(t, tool, hint, args); made != "" {
				id = made
			}
		}
		target = strings.ReplaceAll(target, "$ID", id)
		r, ok := testenv.WireRequest(http.MethodGet, target, uiHost, [][2]string{{"X-Fuzz-User", who}}, nil)
		if !ok {
			return // not a request net/http would serve
		}
		_, pattern := e.mux.Handler(r)
		w := httptest.NewRecorder()
		e.mux.ServeHTTP(w, r)

		input := fmt.Sprintf("GET %q as %q (request %s: tool %q hint %q args %q)", target, r.Header.Get("X-Fuzz-User"), id, tool, hint, args)
		status, h, body := w.Code, w.Header(), w.Body.String()
		if status >= 500 {
			t.Fatalf("%s: %d %.500s", input, status, body)
		}
		if loc := h.Get("Location"); loc != "" {
			if u, err := url.Parse(loc); err != nil || base.ResolveReference(u).Host != uiHost || strings.ContainsAny(loc, "\t\n\r\\") {
				t.Fatalf("%s: %d to %q", input, status, loc)
			}
		}
		if canary.MatchString(body) || strings.Contains(body, "\u202e") {
			t.Fatalf("%s: %d, the page holds what the agent sent as markup:\n%s", input, status, body)
		}
		page := pattern != "" && !strings.HasPrefix(pattern, "GET /ui/") && !strings.HasPrefix(pattern, "GET /static/")
		if !page || status != http.StatusOK && status != http.StatusBadRequest && status != http.StatusNotFound {
			return
		}
		if ct := h.Get("Content-Type"); ct != "text/html; charset=utf-8" || h.Get("X-Frame-Options") != "DENY" || !strings.Contains(h.Get("Content-Security-Policy"), "script-src 'self'") {
			t.Fatalf("%s: %d with Content-Type %q, X-Frame-Options %q, Content-Security-Policy %q", input, status, ct, h.Get("X-Frame-Options"), h.Get("Content-Security-Policy"))
		}
		if n := strings.Count(strings.ToLower(body), "<script"); n != 1 {
			t.Fatalf("%s: %d scripts on the page:\n%s", input, n, body)
		}
		for _, m := range linkPattern.FindAllStringSubmatch(body, -1) {
			ref := html.UnescapeString(m[1])
			if strings.HasPrefix(ref, "data:image/svg+xml,") {
				continue // the layout's icon
			}
			u, err := url.Parse(ref)
			if err != nil || strings.ContainsAny(ref, "\t\n\r\\") || base.ResolveReference(u).Host != uiHost {
				t.Fatalf("%s: the page links to %q", input, m[1])
			}
		}
	})
}
