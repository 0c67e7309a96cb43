package mcpgateway_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/assent-dev/assent/internal/mcpgateway"
	"github.com/assent-dev/assent/pkg/events"
)

// TestGateway runs every scenario with clients over a pipe (as on stdio) and
// over streamable HTTP, in front of agent-worker over stdio and of an MCP
// server over streamable HTTP: a real broker on a real NATS server decides.
func TestGateway(t *testing.T) {
	for _, be := range []backend{workerBackend, notesBackend} {
		for _, fe := range []frontend{memoryFrontend, httpFrontend} {
			t.Run(fe.name+"-to-"+be.name, func(t *testing.T) {
				f := newFixture(t, be, fe, mcpgateway.Config{
					Identity:    mcpgateway.Identity{User: "carol"},
					Elicitation: mcpgateway.Elicitation{Principal: "carol", OverHTTP: true},
				})
				for _, sc := range scenarios {
					t.Run(sc.name, func(t *testing.T) { sc.run(t, f) })
				}
			})
		}
	}
}

// A scenario is one thing a client does through the gateway; each has a
// client (and so an agent) of its own.
var scenarios = []struct {
	name string
	run  func(t *testing.T, f *fixture)
}{
	{"tools offered unchanged", func(t *testing.T, f *fixture) {
		cs := f.client(t, "lister", nil)
		offered := map[string]*mcp.Tool{}
		for tool, err := range cs.Tools(t.Context(), nil) {
			if err != nil {
				t.Fatal(err)
			}
			offered[tool.Name] = tool
		}
		n := 0
		for want, err := range f.direct.Tools(t.Context(), nil) {
			if err != nil {
				t.Fatal(err)
			}
			n++
			got := offered[f.prefix+want.Name]
			if got == nil {
				t.Errorf("%s not offered as %s%s (offered: %v)", want.Name, f.prefix, want.Name, offered)
				continue
			}
			if got.Description != want.Description || got.Title != want.Title || !reflect.DeepEqual(got.InputSchema, want.InputSchema) ||
				!reflect.DeepEqual(got.OutputSchema, want.OutputSchema) || !reflect.DeepEqual(got.Annotations, want.Annotations) {
				t.Errorf("%s offered as %+v, the upstream has %+v", want.Name, got, want)
			}
		}
		if len(offered) != n {
			t.Errorf("%d tools offered, the upstream has %d", len(offered), n)
		}
	}},
	{"approved as asked", func(t *testing.T, f *fixture) {
		ch, p := f.deleteWaiting(t, t.Context(), f.client(t, "approve-as-asked", nil), "approve-as-asked", "aa.txt", "ab.txt")
		r := p.Request
		if r.Tool != "delete_file" || r.Agent != "approve-as-asked" || r.User != "carol" || r.Session == "" || !sameJSON(r.Args, `{"path":"aa.txt"}`) ||
			r.Labels["mcp_server"] != f.server || r.Labels["mcp_read_only"] != "false" || r.Labels["mcp_destructive"] != "true" ||
			!strings.Contains(r.Hint, "MCP tool "+f.prefix+"delete_file of server "+f.server) {
			t.Errorf("request %+v", r)
		}
		// The tool's input schema goes in input_schema, as the upstream
		// declares it; the hint is for people: title, description and
		// name, without the schema.
		up := f.upstreamTool(t, "delete_file")
		want, _ := json.Marshal(up.InputSchema)
		if hint := up.Title + ": " + up.Description + "\nMCP tool " + f.prefix + "delete_file of server " + f.server + "."; r.Hint != hint || !sameJSON(r.InputSchema, string(want)) {
			t.Errorf("input_schema %s, want %s\nhint %q, want %q", r.InputSchema, want, r.Hint, hint)
		}
		f.answer(t, "alice", p.RequestID, events.Responded{Decision: events.Approve, Channel: "test"})
		res := mustResult(t, await(t, ch))
		if res.IsError {
			t.Fatalf("approved call failed: %s", text(t, res))
		}
		if v := verdict(t, res); v.RequestID != p.RequestID || v.Outcome != events.Approved || v.Edited || len(v.DecidedBy) != 1 || v.DecidedBy[0].Principal != "alice" {
			t.Errorf("verdict %+v", v)
		}
		if f.files.exists(t, "aa.txt") || !f.files.exists(t, "ab.txt") {
			t.Error("the approved call did not delete aa.txt, and only it")
		}
	}},
	{"approved with edited args", func(t *testing.T, f *fixture) {
		ch, p := f.deleteWaiting(t, t.Context(), f.client(t, "approve-edited", nil), "approve-edited", "ea.txt", "eb.txt")
		f.answer(t, "alice", p.RequestID, events.Responded{Decision: events.Approve, Args: json.RawMessage(`{"path":"eb.txt"}`), Reason: "the other one"})
		res := mustResult(t, await(t, ch))
		if v := verdict(t, res); res.IsError || v.Outcome != events.Approved || !v.Edited {
			t.Fatalf("result %+v, verdict %+v", res, v)
		}
		if !f.files.exists(t, "ea.txt") || f.files.exists(t, "eb.txt") {
			t.Error("the upstream did not run the edited call: eb.txt should be gone, ea.txt kept")
		}
	}},
	{"denied", func(t *testing.T, f *fixture) {
		ch, p := f.deleteWaiting(t, t.Context(), f.client(t, "deny", nil), "deny", "da.txt")
		f.answer(t, "alice", p.RequestID, events.Responded{Decision: events.Deny, Reason: "keep it until Friday", Channel: "web"})
		res := mustResult(t, await(t, ch))
		txt := text(t, res)
		for _, want := range []string{"Not run", "denied", "alice (web)", "keep it until Friday", p.RequestID} {
			if !strings.Contains(txt, want) {
				t.Errorf("text %q lacks %q", txt, want)
			}
		}
		if v := verdict(t, res); !res.IsError || v.Outcome != events.Denied || v.Reason != "keep it until Friday" {
			t.Errorf("IsError %v, verdict %+v", res.IsError, v)
		}
		if sc := structured(t, res); sc.Outcome != events.Denied || sc.RequestID != p.RequestID {
			t.Errorf("structured content %+v", sc)
		}
		if !f.files.exists(t, "da.txt") {
			t.Error("the denied call ran")
		}
	}},
	{"expired", func(t *testing.T, f *fixture) {
		cs := f.client(t, "quick-expire", nil) // policy rule quick: one second
		f.files.seed(t, "xa.txt")
		res := call(t, cs, f.prefix+"delete_file", `{"path":"xa.txt"}`)
		if v := verdict(t, res); !res.IsError || v.Outcome != events.Expired || !strings.Contains(text(t, res), "in time") {
			t.Errorf("IsError %v, verdict %+v, text %q", res.IsError, v, text(t, res))
		}
		if !f.files.exists(t, "xa.txt") {
			t.Error("the expired call ran")
		}
	}},
	{"cancelled by the client", func(t *testing.T, f *fixture) {
		ctx, cancel := context.WithCancel(t.Context())
		ch, p := f.deleteWaiting(t, ctx, f.client(t, "cancel", nil), "cancel", "ca.txt")
		cancel() // the SDK sends notifications/cancelled
		if r := await(t, ch); !errors.Is(r.err, context.Canceled) {
			t.Errorf("the cancelled call returned %+v, %v", r.res, r.err)
		}
		// The Go SDK's reason is its context's error.
		if d := f.decision(t, p.RequestID); d.Outcome != events.Cancelled || d.Reason != "requester stopped waiting: the MCP client cancelled the call: context canceled" {
			t.Errorf("decision %+v, want cancelled by the client", d)
		}
		if !f.files.exists(t, "ca.txt") {
			t.Error("the cancelled call ran")
		}
	}},
	{"cancelled by the client with a reason", func(t *testing.T, f *fixture) {
		// The TypeScript SDK's abort("user pressed stop") sends that
		// reason; its own timeout sends the timeout error's text.
		for i, reason := range []string{"user pressed stop", "McpError: MCP error -32001: Request timed out"} {
			agent := fmt.Sprintf("cancel-reason-%d", i)
			cs, _ := f.front.connect(t, f.gw, agent, nil, nil, func(tr mcp.Transport) mcp.Transport { return reasonTransport{tr, reason} })
			ctx, cancel := context.WithCancel(t.Context())
			file := agent + ".txt"
			ch, p := f.deleteWaiting(t, ctx, cs, agent, file)
			cancel()
			await(t, ch)
			if d := f.decision(t, p.RequestID); d.Outcome != events.Cancelled || d.Reason != "requester stopped waiting: the MCP client cancelled the call: "+reason {
				t.Errorf("decision %+v, want cancelled with the client's reason %q", d, reason)
			}
			if !f.files.exists(t, file) {
				t.Error("the cancelled call ran")
			}
		}
	}},
	{"client disconnects", func(t *testing.T, f *fixture) {
		cs, disconnect := f.front.connect(t, f.gw, "disconnect", nil, nil, nil)
		ch, p := f.deleteWaiting(t, t.Context(), cs, "disconnect", "qa.txt")
		disconnect()
		want := map[string]string{"memory": "client disconnected", "http": "the client ended its session"}[f.front.name]
		if d := f.decision(t, p.RequestID); d.Outcome != events.Cancelled || d.Reason != "requester stopped waiting: the MCP client went away: "+want {
			t.Errorf("decision %+v, want cancelled: %s", d, want)
		}
		if r := await(t, ch); r.err == nil {
			t.Errorf("the call of a client gone returned %+v", r.res)
		}
		if !f.files.exists(t, "qa.txt") {
			t.Error("the call ran")
		}
	}},
	{"policy allows at once", func(t *testing.T, f *fixture) {
		cs := f.client(t, "policy-allow", nil)
		res := call(t, cs, f.prefix+"list_files", `{}`) // nobody answers: only the policy can
		if v := verdict(t, res); res.IsError || v.Outcome != events.Approved || !v.Auto || v.Rule != "read-only" {
			t.Errorf("IsError %v, verdict %+v", res.IsError, v)
		}
	}},
	{"policy denies at once", func(t *testing.T, f *fixture) {
		cs := f.client(t, "policy-deny", nil)
		f.files.seed(t, "locked.txt")
		res := call(t, cs, f.prefix+"delete_file", `{"path":"locked.txt"}`)
		v := verdict(t, res)
		if !res.IsError || v.Outcome != events.Denied || !v.Auto || v.Rule != "keep-locked" ||
			!strings.Contains(text(t, res), "policy rule keep-locked") || !strings.Contains(text(t, res), "locked files stay") {
			t.Errorf("IsError %v, verdict %+v, text %q", res.IsError, v, text(t, res))
		}
		if !f.files.exists(t, "locked.txt") {
			t.Error("the denied call ran")
		}
	}},
	{"elicitation accepted", func(t *testing.T, f *fixture) {
		var asked atomic.Value
		cs := f.client(t, "elicit-accept", &mcp.ClientOptions{ElicitationHandler: func(_ context.Context, req *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
			asked.Store(req.Params.Message)
			return &mcp.ElicitResult{Action: "accept", Content: map[string]any{"reason": "fine by me"}}, nil
		}})
		f.files.seed(t, "ya.txt")
		res := call(t, cs, f.prefix+"delete_file", `{"path":"ya.txt"}`)
		v := verdict(t, res)
		if res.IsError || v.Outcome != events.Approved || v.Reason != "fine by me" || len(v.DecidedBy) != 1 ||
			v.DecidedBy[0].Principal != "carol" || v.DecidedBy[0].Channel != mcpgateway.ElicitChannel {
			t.Errorf("IsError %v, verdict %+v", res.IsError, v)
		}
		if msg, _ := asked.Load().(string); !strings.Contains(msg, "delete_file") || !strings.Contains(msg, "ya.txt") || !strings.Contains(msg, "carol") {
			t.Errorf("the user was asked %q", msg)
		}
		if f.files.exists(t, "ya.txt") {
			t.Error("the approved call did not run")
		}
	}},
	{"elicitation declined", func(t *testing.T, f *fixture) {
		cs := f.client(t, "elicit-decline", &mcp.ClientOptions{ElicitationHandler: func(context.Context, *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
			return &mcp.ElicitResult{Action: "decline", Content: map[string]any{"reason": "not now"}}, nil
		}})
		f.files.seed(t, "na.txt")
		res := call(t, cs, f.prefix+"delete_file", `{"path":"na.txt"}`)
		v := verdict(t, res)
		if !res.IsError || v.Outcome != events.Denied || v.Reason != "not now" || len(v.DecidedBy) != 1 || v.DecidedBy[0].Principal != "carol" ||
			!strings.Contains(text(t, res), "carol (mcp)") {
			t.Errorf("IsError %v, verdict %+v, text %q", res.IsError, v, text(t, res))
		}
		if !f.files.exists(t, "na.txt") {
			t.Error("the declined call ran")
		}
	}},
	{"elicitation approves with edited arguments", func(t *testing.T, f *fixture) {
		var schema atomic.Value
		cs := f.client(t, "elicit-edit", &mcp.ClientOptions{ElicitationHandler: func(_ context.Context, req *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
			raw, _ := json.Marshal(req.Params.RequestedSchema)
			schema.Store(string(raw))
			return &mcp.ElicitResult{Action: "accept", Content: map[string]any{"arg:path": "edb.txt"}}, nil
		}})
		f.files.seed(t, "eda.txt", "edb.txt")
		res := call(t, cs, f.prefix+"delete_file", `{"path":"eda.txt"}`)
		if v := verdict(t, res); res.IsError || v.Outcome != events.Approved || !v.Edited {
			t.Errorf("IsError %v, verdict %+v", res.IsError, v)
		}
		// The form offered the path, filled in with the call's.
		if got, _ := schema.Load().(string); !strings.Contains(got, `"arg:path":{`) || !strings.Contains(got, `"default":"eda.txt"`) {
			t.Errorf("the form: %s", got)
		}
		if !f.files.exists(t, "eda.txt") || f.files.exists(t, "edb.txt") {
			t.Error("the call did not run with the user's arguments")
		}
	}},
	{"elicitation asks again when the edit does not fit", func(t *testing.T, f *fixture) {
		var asked atomic.Int32
		var second atomic.Value
		// The SDK's client checks the form's answer against the form; a
		// client that does not sends what the form does not allow, as
		// the wrapped transport below does.
		cs, _ := f.front.connect(t, f.gw, "elicit-bad-edit", &mcp.ClientOptions{ElicitationHandler: func(_ context.Context, req *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
			if asked.Add(1) == 1 {
				return &mcp.ElicitResult{Action: "accept", Content: map[string]any{"arg:path": "NOT-A-STRING"}}, nil
			}
			second.Store(req.Params.Message)
			return &mcp.ElicitResult{Action: "accept", Content: map[string]any{}}, nil
		}}, nil, func(tr mcp.Transport) mcp.Transport { return rewriteTransport{tr, `"NOT-A-STRING"`, `42`} })
		f.files.seed(t, "bad.txt")
		res := call(t, cs, f.prefix+"delete_file", `{"path":"bad.txt"}`)
		if v := verdict(t, res); res.IsError || v.Outcome != events.Approved || v.Edited {
			t.Errorf("IsError %v, verdict %+v", res.IsError, v)
		}
		if msg, _ := second.Load().(string); asked.Load() != 2 || !strings.Contains(msg, "Your changes were not used: path: 42 is not a string") {
			t.Errorf("asked %d times; the second time %q", asked.Load(), msg)
		}
	}},
	{"elicitation approves for the session", func(t *testing.T, f *fixture) {
		var asked atomic.Int32
		cs := f.client(t, "elicit-session", &mcp.ClientOptions{ElicitationHandler: func(context.Context, *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
			asked.Add(1)
			return &mcp.ElicitResult{Action: "accept", Content: map[string]any{"remember": true}}, nil
		}})
		f.files.seed(t, "s1.txt", "s2.txt")
		if v := verdict(t, call(t, cs, f.prefix+"delete_file", `{"path":"s1.txt"}`)); v.Outcome != events.Approved || v.Auto {
			t.Errorf("the first call: %+v", v)
		}
		v := verdict(t, call(t, cs, f.prefix+"delete_file", `{"path":"s2.txt"}`))
		if v.Outcome != events.Approved || !v.Auto || !strings.HasPrefix(v.Rule, "remembered:") || asked.Load() != 1 {
			t.Errorf("the second call: %+v, the user asked %d times", v, asked.Load())
		}
		if f.files.exists(t, "s1.txt") || f.files.exists(t, "s2.txt") {
			t.Error("an approved call did not run")
		}
	}},
	{"elicitation withdrawn when another approver decides", func(t *testing.T, f *fixture) {
		asked := make(chan struct{})
		withdrawn := make(chan error, 1)
		var once sync.Once
		cs := f.client(t, "elicit-race", &mcp.ClientOptions{ElicitationHandler: func(ctx context.Context, _ *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
			once.Do(func() { close(asked) })
			select { // the user looks at the question until it goes away
			case <-ctx.Done():
				withdrawn <- ctx.Err()
			case <-time.After(patience):
				withdrawn <- nil
			}
			return nil, ctx.Err()
		}})
		ch, p := f.deleteWaiting(t, t.Context(), cs, "elicit-race", "ra.txt")
		select {
		case <-asked:
		case <-time.After(patience):
			t.Fatal("the client's user was not asked")
		}
		f.answer(t, "alice", p.RequestID, events.Responded{Decision: events.Approve, Channel: "web"})
		res := mustResult(t, await(t, ch))
		if v := verdict(t, res); res.IsError || v.Outcome != events.Approved || v.DecidedBy[0].Principal != "alice" {
			t.Errorf("IsError %v, verdict %+v", res.IsError, v)
		}
		if err := <-withdrawn; err == nil {
			t.Error("the question stayed in the client after alice decided")
		}
		if f.files.exists(t, "ra.txt") {
			t.Error("the approved call did not run")
		}
	}},
}

// A client over HTTP that vanishes without a word (its network cut) stops
// answering pings; its call's request is cancelled.
func TestClientGoneSilently(t *testing.T) {
	f := newFixture(t, notesBackend, httpFrontend, mcpgateway.Config{ClientPing: 100 * time.Millisecond})
	cut := newCuttable()
	cs, _ := f.front.connect(t, f.gw, "vanish", nil, &http.Client{Transport: cut}, nil)
	_, p := f.deleteWaiting(t, t.Context(), cs, "vanish", "va.txt")
	cut.cut()
	if d := f.decision(t, p.RequestID); d.Outcome != events.Cancelled {
		t.Errorf("decision %+v, want cancelled", d)
	}
}

// cuttable is an HTTP transport whose connections all fail at once, and
// stay failing, when it is cut.
type cuttable struct {
	ctx  context.Context
	cut  context.CancelFunc
	next *http.Transport
}

func newCuttable() *cuttable {
	ctx, cut := context.WithCancel(context.Background())
	return &cuttable{ctx: ctx, cut: cut, next: &http.Transport{}}
}

func (c *cuttable) RoundTrip(r *http.Request) (*http.Response, error) {
	if c.ctx.Err() != nil {
		return nil, errors.New("network cut")
	}
	ctx, cancel := context.WithCancel(r.Context())
	stop := context.AfterFunc(c.ctx, cancel)
	resp, err := c.next.RoundTrip(r.WithContext(ctx))
	if err != nil {
		stop()
		cancel()
		return nil, err
	}
	resp.Body = &closeFunc{resp.Body, func() { stop(); cancel() }}
	return resp, nil
}

type closeFunc struct {
	body interface {
		Read([]byte) (int, error)
		Close() error
	}
	after func()
}

func (c *closeFunc) Read(p []byte) (int, error) { return c.body.Read(p) }
func (c *closeFunc) Close() error {
	err := c.body.Close()
	c.after()
	return err
}

// An upstream that adds or removes a tool: the gateway offers the change,
// and tells its clients.
func TestToolListChanges(t *testing.T) {
	for _, fe := range []frontend{memoryFrontend, httpFrontend} {
		t.Run(fe.name, func(t *testing.T) {
			ns, url := newNotes(t)
			f := newFixture(t, backend{"notes", func(t testing.TB) (mcpgateway.Upstream, files, *mcp.ClientSession) {
				return mcpgateway.Upstream{Name: "notes", URL: url, Prefix: "n."}, ns, nil
			}}, fe, mcpgateway.Config{})
			changed := make(chan struct{}, 16)
			cs := f.client(t, "watcher", &mcp.ClientOptions{ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) {
				changed <- struct{}{}
			}})
			offered := func() map[string]bool {
				names := map[string]bool{}
				for tool, err := range cs.Tools(t.Context(), nil) {
					if err != nil {
						t.Fatal(err)
					}
					names[tool.Name] = true
				}
				return names
			}
			// waitFor waits for list_changed notifications until the
			// offered tools are as want says.
			waitFor := func(name string, want bool) {
				t.Helper()
				for offered()[name] != want {
					select {
					case <-changed:
					case <-time.After(patience):
						t.Fatalf("%s offered: %v after %s, want %v", name, !want, patience, want)
					}
				}
			}
			waitFor("n.delete_file", true)
			mcp.AddTool(ns.server, &mcp.Tool{Name: "archive", Description: "Archive the notes."},
				func(context.Context, *mcp.CallToolRequest, struct{}) (*mcp.CallToolResult, any, error) {
					return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "archived"}}}, nil, nil
				})
			waitFor("n.archive", true)
			ns.server.RemoveTools("delete_file")
			waitFor("n.delete_file", false)
			if !offered()["n.archive"] || !offered()["n.list_files"] {
				t.Errorf("the gateway offers %v", offered())
			}
		})
	}
}

// mustResult is r's result; r must not be a protocol error.
func mustResult(t *testing.T, r result) *mcp.CallToolResult {
	t.Helper()
	if r.err != nil {
		t.Fatalf("call: %v", r.err)
	}
	return r.res
}

// structured reads the verdict from res's structured content.
func structured(t *testing.T, res *mcp.CallToolResult) mcpgateway.Verdict {
	t.Helper()
	raw, err := json.Marshal(res.StructuredContent)
	if err != nil {
		t.Fatal(err)
	}
	var sc struct {
		Assent mcpgateway.Verdict `json:"assent"`
	}
	if err := json.Unmarshal(raw, &sc); err != nil {
		t.Fatalf("structured content %s: %v", raw, err)
	}
	return sc.Assent
}

// sameJSON reports whether a holds the JSON value b.
func sameJSON(a json.RawMessage, b string) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal([]byte(b), &y) != nil {
		return false
	}
	return reflect.DeepEqual(x, y)
}
