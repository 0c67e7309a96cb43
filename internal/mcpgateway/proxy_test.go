package mcpgateway_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/assent-dev/assent/internal/broker"
	"github.com/assent-dev/assent/internal/brokertest"
	"github.com/assent-dev/assent/internal/mcpgateway"
	"github.com/assent-dev/assent/internal/testenv"
	"github.com/assent-dev/assent/pkg/events"
	"github.com/assent-dev/assent/pkg/handler"
	"github.com/assent-dev/assent/pkg/policy"
)

// newLibrary serves, over streamable HTTP, an MCP server with what the
// protocol lets a server offer besides tools: a resource and a template
// (subscribable), a prompt with a completable argument, logging, and tools
// that ask the client to sample, to elicit and for its roots, and one that
// reports progress.
func newLibrary(t testing.TB) string {
	t.Helper()
	s := mcp.NewServer(&mcp.Implementation{Name: "library", Version: "v1"}, &mcp.ServerOptions{
		CompletionHandler: func(_ context.Context, req *mcp.CompleteRequest) (*mcp.CompleteResult, error) {
			return &mcp.CompleteResult{Completion: mcp.CompletionResultDetails{Values: []string{req.Params.Argument.Value + "-completed"}}}, nil
		},
		SubscribeHandler:   func(context.Context, *mcp.SubscribeRequest) error { return nil },
		UnsubscribeHandler: func(context.Context, *mcp.UnsubscribeRequest) error { return nil },
	})
	s.AddResource(&mcp.Resource{URI: "lib://readme", Name: "readme", MIMEType: "text/plain"}, func(_ context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
		return &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{{URI: req.Params.URI, MIMEType: "text/plain", Text: "read me"}}}, nil
	})
	s.AddResourceTemplate(&mcp.ResourceTemplate{URITemplate: "lib://books/{id}", Name: "book"}, func(_ context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
		return &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{{URI: req.Params.URI, Text: "the book " + strings.TrimPrefix(req.Params.URI, "lib://books/")}}}, nil
	})
	s.AddPrompt(&mcp.Prompt{Name: "summarize", Arguments: []*mcp.PromptArgument{{Name: "topic", Required: true}}}, func(_ context.Context, req *mcp.GetPromptRequest) (*mcp.GetPromptResult, error) {
		return &mcp.GetPromptResult{Messages: []*mcp.PromptMessage{{Role: "user", Content: &mcp.TextContent{Text: "Summarize " + req.Params.Arguments["topic"]}}}}, nil
	})
	obj := map[string]any{"type": "object"}
	s.AddTool(&mcp.Tool{Name: "ask_model", InputSchema: obj}, func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		res, err := req.Session.CreateMessage(ctx, &mcp.CreateMessageParams{MaxTokens: 10, Messages: []*mcp.SamplingMessage{{Role: "user", Content: &mcp.TextContent{Text: "hello?"}}}})
		if err != nil {
			return nil, err
		}
		return &mcp.CallToolResult{Content: []mcp.Content{res.Content}}, nil
	})
	s.AddTool(&mcp.Tool{Name: "ask_user", InputSchema: obj}, func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		res, err := req.Session.Elicit(ctx, &mcp.ElicitParams{Message: "your name?", RequestedSchema: map[string]any{"type": "object", "properties": map[string]any{"name": map[string]any{"type": "string"}}}})
		if err != nil {
			return nil, err
		}
		name, _ := res.Content["name"].(string)
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: res.Action + " " + name}}}, nil
	})
	s.AddTool(&mcp.Tool{Name: "roots", InputSchema: obj}, func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		res, err := req.Session.ListRoots(ctx, nil)
		if err != nil {
			return nil, err
		}
		var uris []string
		for _, r := range res.Roots {
			uris = append(uris, r.URI)
		}
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: strings.Join(uris, " ")}}}, nil
	})
	s.AddTool(&mcp.Tool{Name: "slow", InputSchema: obj}, func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		for i := 1; i <= 3; i++ {
			_ = req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: req.Params.GetProgressToken(), Progress: float64(i), Total: 3})
		}
		_ = req.Session.Log(ctx, &mcp.LoggingMessageParams{Level: "info", Data: "slow is done"})
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "done"}}}, nil
	})
	srv := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, nil))
	t.Cleanup(srv.Close)
	return srv.URL
}

// proxyPolicy allows every call at once, and holds reading a book for
// alice (an allow rule beats a require_approval rule: the allow rule leaves
// books out).
const proxyPolicy = `version: 1
principals:
  alice: {}
rules:
  - name: books-need-alice
    tools: ["resource:read"]
    when: 'args.uri.startsWith("lib://books/")'
    action: require_approval
    approvers: [alice]
  - name: everything-else
    tools: ["*"]
    when: '!args.?uri.orValue("").startsWith("lib://books/")'
    action: allow
`

// TestProxy: with two upstreams, what they offer besides tools passes
// through both ways, merged and routed to whose it is: resources,
// templates, prompts (behind the upstream's prefix), completions, logging,
// the upstream's sampling, elicitation and roots requests answered by the
// client, progress; and a guarded resource read waits for its approval.
func TestProxy(t *testing.T) {
	for _, fe := range []frontend{memoryFrontend, httpFrontend} {
		t.Run(fe.name, func(t *testing.T) {
			ns := testenv.Server(t)
			pol, err := policy.Parse([]byte(proxyPolicy), "policy.yaml")
			if err != nil {
				t.Fatal(err)
			}
			brokertest.Run(t, testenv.Conn(t, ns), broker.Config{Name: "proxy", Policy: pol})
			_, notesURL := newNotes(t)
			gw := runGateway(t, testenv.Conn(t, ns), mcpgateway.Config{
				Upstreams: []mcpgateway.Upstream{
					{Name: "notes", URL: notesURL, Prefix: "n."},
					{Name: "library", URL: newLibrary(t), Prefix: "lib.", Guard: []string{mcpgateway.GuardResources}},
				},
				NATS: mcpgateway.NATS{URL: ns.ClientURL()},
			})
			var mu sync.Mutex
			var progress []float64
			var logged []string
			logs := make(chan struct{}, 4)
			client := mcp.NewClient(&mcp.Implementation{Name: "proxy-client", Version: "v0"}, &mcp.ClientOptions{
				CreateMessageHandler: func(_ context.Context, req *mcp.CreateMessageRequest) (*mcp.CreateMessageResult, error) {
					return &mcp.CreateMessageResult{Model: "test-model", Role: "assistant", Content: &mcp.TextContent{Text: "sampled"}}, nil
				},
				ElicitationHandler: func(context.Context, *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
					return &mcp.ElicitResult{Action: "accept", Content: map[string]any{"name": "carol"}}, nil
				},
				ProgressNotificationHandler: func(_ context.Context, req *mcp.ProgressNotificationClientRequest) {
					mu.Lock()
					progress = append(progress, req.Params.Progress)
					mu.Unlock()
				},
				LoggingMessageHandler: func(_ context.Context, req *mcp.LoggingMessageRequest) {
					mu.Lock()
					logged = append(logged, req.Params.Data.(string))
					mu.Unlock()
					logs <- struct{}{}
				},
			})
			client.AddRoots(&mcp.Root{URI: "file:///work/project", Name: "project"})
			cs := connectClientTo(t, gw, fe, client)
			ctx := t.Context()

			init := cs.InitializeResult()
			if init.ServerInfo.Name != "assent-mcp-gateway" || init.Capabilities.Resources == nil || init.Capabilities.Prompts == nil ||
				init.Capabilities.Completions == nil || init.Capabilities.Logging == nil || init.Capabilities.Tools == nil {
				t.Errorf("initialize: %+v, capabilities %+v", init.ServerInfo, init.Capabilities)
			}
			tools, err := cs.ListTools(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			var names []string
			for _, tl := range tools.Tools {
				names = append(names, tl.Name)
			}
			// Each upstream's tools, in its order, one upstream after the
			// other (the library's: as added, which the SDK lists sorted).
			if got := strings.Join(names, " "); got != "n.delete_file n.list_files lib.ask_model lib.ask_user lib.roots lib.slow" {
				t.Errorf("tools: %s", got)
			}
			res, err := cs.ListResources(ctx, nil)
			if err != nil || len(res.Resources) != 1 || res.Resources[0].URI != "lib://readme" {
				t.Fatalf("resources: %+v, %v", res, err)
			}
			tmpl, err := cs.ListResourceTemplates(ctx, nil)
			if err != nil || len(tmpl.ResourceTemplates) != 1 || tmpl.ResourceTemplates[0].URITemplate != "lib://books/{id}" {
				t.Fatalf("templates: %+v, %v", tmpl, err)
			}
			prompts, err := cs.ListPrompts(ctx, nil)
			if err != nil || len(prompts.Prompts) != 1 || prompts.Prompts[0].Name != "lib.summarize" {
				t.Fatalf("prompts: %+v, %v", prompts, err)
			}
			got, err := cs.GetPrompt(ctx, &mcp.GetPromptParams{Name: "lib.summarize", Arguments: map[string]string{"topic": "bees"}})
			if err != nil || got.Messages[0].Content.(*mcp.TextContent).Text != "Summarize bees" {
				t.Fatalf("prompt: %+v, %v", got, err)
			}
			done, err := cs.Complete(ctx, &mcp.CompleteParams{Ref: &mcp.CompleteReference{Type: "ref/prompt", Name: "lib.summarize"}, Argument: mcp.CompleteParamsArgument{Name: "topic", Value: "be"}})
			if err != nil || len(done.Completion.Values) != 1 || done.Completion.Values[0] != "be-completed" {
				t.Fatalf("complete: %+v, %v", done, err)
			}
			read, err := cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: "lib://readme"})
			if err != nil || read.Contents[0].Text != "read me" {
				t.Fatalf("read: %+v, %v", read, err)
			}
			if err := cs.Subscribe(ctx, &mcp.SubscribeParams{URI: "lib://readme"}); err != nil {
				t.Errorf("subscribe: %v", err)
			}
			if err := cs.SetLoggingLevel(ctx, &mcp.SetLoggingLevelParams{Level: "debug"}); err != nil {
				t.Errorf("setLevel: %v", err)
			}
			for tool, want := range map[string]string{"lib.ask_model": "sampled", "lib.ask_user": "accept carol", "lib.roots": "file:///work/project"} {
				out, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: map[string]any{}})
				if err != nil || out.IsError || out.Content[0].(*mcp.TextContent).Text != want {
					t.Errorf("%s: %+v, %v", tool, out, err)
				}
			}
			params := &mcp.CallToolParams{Name: "lib.slow", Arguments: map[string]any{}}
			params.SetProgressToken("slow-1")
			if out, err := cs.CallTool(ctx, params); err != nil || out.IsError {
				t.Errorf("slow: %+v, %v", out, err)
			}
			<-logs
			mu.Lock()
			if len(progress) != 3 || len(logged) != 1 || logged[0] != "slow is done" {
				t.Errorf("progress %v, log %v", progress, logged)
			}
			mu.Unlock()

			// A book is guarded: the read waits for alice, and one she
			// denies is an error with her reason.
			nc := testenv.Conn(t, ns)
			js, err := jetstream.New(nc)
			if err != nil {
				t.Fatal(err)
			}
			reader, err := handler.NewClient(nc, handler.Config{})
			if err != nil {
				t.Fatal(err)
			}
			f := &fixture{nc: nc, js: js, reader: reader}
			next := f.pendingOf(t, "proxy-client")
			type readResult struct {
				res *mcp.ReadResourceResult
				err error
			}
			ch := make(chan readResult, 1)
			go func() {
				r, err := cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: "lib://books/7"})
				ch <- readResult{r, err}
			}()
			p := next()
			if p.Request.Tool != mcpgateway.ToolReadResource || string(p.Request.Args) != `{"uri":"lib://books/7"}` || p.Request.Labels["mcp_kind"] != "resource" {
				t.Errorf("the request: %+v", p.Request)
			}
			f.answer(t, "alice", p.RequestID, events.Responded{Decision: events.Approve})
			if r := <-ch; r.err != nil || r.res.Contents[0].Text != "the book 7" {
				t.Errorf("the approved read: %+v, %v", r.res, r.err)
			}
			go func() {
				r, err := cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: "lib://books/8"})
				ch <- readResult{r, err}
			}()
			p = next()
			f.answer(t, "alice", p.RequestID, events.Responded{Decision: events.Deny, Reason: "not that one"})
			r := <-ch
			var werr *jsonrpc.Error
			if !errors.As(r.err, &werr) || !strings.Contains(werr.Message, "not that one") {
				t.Errorf("the denied read: %+v, %v", r.res, r.err)
			} else {
				var v mcpgateway.Verdict
				if err := json.Unmarshal(werr.Data, &v); err != nil || v.Outcome != events.Denied {
					t.Errorf("the denied read's data: %s", werr.Data)
				}
			}
		})
	}
}

// connectClientTo connects client to g through fe's transport.
func connectClientTo(t *testing.T, g *mcpgateway.Gateway, fe frontend, client *mcp.Client) *mcp.ClientSession {
	t.Helper()
	var tr mcp.Transport
	if fe.name == httpFrontend.name {
		srv := httptest.NewServer(g.Handler())
		t.Cleanup(srv.Close)
		tr = &mcp.StreamableClientTransport{Endpoint: srv.URL}
	} else {
		server, c := net.Pipe()
		ctx, cancel := context.WithCancel(context.Background())
		served := make(chan error, 1)
		go func() { served <- g.Serve(ctx, &mcp.IOTransport{Reader: server, Writer: server}) }()
		t.Cleanup(func() { cancel(); <-served })
		tr = &mcp.IOTransport{Reader: c, Writer: c}
	}
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	cs, err := client.Connect(ctx, tr, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cs.Close() })
	return cs
}

// TestIdleHTTPSession: a client's HTTP session with no request and no open
// stream for session_idle is ended, with its upstream sessions; its next
// request is answered 404, and a new session works.
func TestIdleHTTPSession(t *testing.T) {
	ns := testenv.Server(t)
	brokertest.Run(t, testenv.Conn(t, ns), broker.Config{Name: "idle"})
	_, notesURL := newNotes(t)
	gw := runGateway(t, testenv.Conn(t, ns), mcpgateway.Config{
		Upstreams:   []mcpgateway.Upstream{{Name: "notes", URL: notesURL}},
		NATS:        mcpgateway.NATS{URL: ns.ClientURL()},
		SessionIdle: 200 * time.Millisecond,
	})
	srv := httptest.NewServer(gw.Handler())
	t.Cleanup(srv.Close)
	post := func(session, body string) *http.Response {
		t.Helper()
		req, err := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		if session != "" {
			req.Header.Set("Mcp-Session-Id", session)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp
	}
	const initialize = `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"idle","version":"v0"}}}`
	resp := post("", initialize)
	session := resp.Header.Get("Mcp-Session-Id")
	if resp.StatusCode != http.StatusOK || session == "" {
		t.Fatalf("initialize: %s, session %q", resp.Status, session)
	}
	const ping = `{"jsonrpc":"2.0","id":2,"method":"ping"}`
	if resp := post(session, ping); resp.StatusCode != http.StatusOK {
		t.Fatalf("a ping at once: %s", resp.Status)
	}
	deadline := time.Now().Add(patience)
	for post(session, ping).StatusCode != http.StatusNotFound {
		if time.Now().After(deadline) {
			t.Fatal("the idle session was not ended")
		}
		time.Sleep(300 * time.Millisecond) // longer than session_idle: each ping finds it idle
	}
	if resp := post("", initialize); resp.StatusCode != http.StatusOK || resp.Header.Get("Mcp-Session-Id") == session {
		t.Fatalf("a new session: %s", resp.Status)
	}
}
