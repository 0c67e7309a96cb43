package integration

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nats.go"

	"github.com/assent-dev/assent/integration/itest"
	"github.com/assent-dev/assent/internal/broker"
	"github.com/assent-dev/assent/internal/creds"
	"github.com/assent-dev/assent/internal/mcpgateway"
	"github.com/assent-dev/assent/internal/testenv"
	"github.com/assent-dev/assent/pkg/events"
	"github.com/assent-dev/assent/pkg/handler"
)

// TestGatewayWithCredentials runs the MCP gateway on the credentials
// `broker creds gateway gw-1 --agent coder --principal bob` issues, on an
// operator-mode server with the broker on its own: a call is asked as coder,
// answered in the client by elicitation as bob (accepted: it runs;
// declined: it does not) with no permission refused; and the server refuses
// the gateway's connection another agent's request, another principal's
// answer, a decision, a consumer of the stream, and another agent's (or
// every agent's) pending events. The request the gateway tried to touch stays
// pending.
func TestGatewayWithCredentials(t *testing.T) {
	a, ns, b, js := operatorBroker(t, "gateway")
	gwNC, gwV := connectAs(t, ns, a, creds.Identity{Role: creds.RoleGateway, Name: "gw-1", Agent: "coder", Principal: "bob"})

	var asked atomic.Int32
	cs, runs := gatewayOn(t, gwNC, mcpgateway.Config{
		Identity:    mcpgateway.Identity{Agent: "coder"},
		NATS:        mcpgateway.NATS{URL: ns.ClientURL()},
		Elicitation: mcpgateway.Elicitation{Principal: "bob"},
	}, func(context.Context, *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
		if asked.Add(1) == 1 {
			return &mcp.ElicitResult{Action: "accept", Content: map[string]any{"reason": "ship it"}}, nil
		}
		return &mcp.ElicitResult{Action: "decline", Content: map[string]any{"reason": "not twice"}}, nil
	})

	res := callMCP(t, cs, "deploy", `{"v":1}`)
	v := verdictOf(t, res)
	if res.IsError || v.Outcome != events.Approved || len(v.DecidedBy) != 1 || v.DecidedBy[0].Principal != "bob" ||
		v.DecidedBy[0].Channel != mcpgateway.ElicitChannel || runs.Load() != 1 {
		t.Fatalf("accepted in the client: IsError %v, verdict %+v, %d run(s)", res.IsError, v, runs.Load())
	}
	if rec := itest.WaitState(t, b, v.RequestID, broker.StateApproved); rec.Request.Agent != "coder" {
		t.Fatalf("asked as %q", rec.Request.Agent)
	}
	res = callMCP(t, cs, "deploy", `{"v":2}`)
	if v := verdictOf(t, res); !res.IsError || v.Outcome != events.Denied || v.DecidedBy[0].Principal != "bob" || runs.Load() != 1 {
		t.Fatalf("declined in the client: IsError %v, verdict %+v, %d run(s)", res.IsError, v, runs.Load())
	}
	gwV.none(t, "the gateway, on its own credentials,")

	// A request of another agent's that the gateway tries to touch.
	otherNC, _ := connectAs(t, ns, a, creds.Identity{Role: creds.RoleAgent, Name: "other"})
	victim, req := askPending(t, b, otherNC, "other")
	decided, answer := forgeries(t, victim, "alice")
	for _, c := range []struct {
		what    string
		subject string
		m       *nats.Msg
	}{
		{"asking as another agent", events.RequestPrefix + "other", req},
		{"answering as another principal", events.ResponsePrefix + "alice." + victim, answer},
		{"publishing a decision", events.DecisionPrefix + victim, decided},
		{"making a consumer of the stream", "$JS.API.CONSUMER.CREATE." + events.StreamName, &nats.Msg{Data: []byte(`{"stream_name":"ASSENT","config":{"filter_subject":"assent.pending.other"}}`)}},
	} {
		t.Run(c.what, func(t *testing.T) { gwV.refused(t, gwNC, c.subject, c.m) })
	}
	for _, subj := range []string{events.PendingPrefix + "other", events.PendingPrefix + ">"} {
		t.Run("reading "+subj, func(t *testing.T) { gwV.refusedSub(t, gwNC, subj) })
	}
	untouched(t, b, js, victim)
}

// TestGatewayWithPrivateCredentials: with `broker creds gateway gw-2 --agent
// coder --principal bob --private` and nats.private, the gateway reads its
// decisions through coder's own subjects and inbox, never the stream, and the
// server refuses it nothing: an answer given in the client decides.
func TestGatewayWithPrivateCredentials(t *testing.T) {
	a, ns, b, _ := operatorBroker(t, "gateway-private")
	file := credsFile(t, a, creds.Identity{Role: creds.RoleGateway, Name: "gw-2", Agent: "coder", Principal: "bob", Private: true})
	v := &violations{}
	gwNC, err := nats.Connect(ns.ClientURL(), nats.UserCredentials(file), nats.CustomInboxPrefix(handler.PrivateInbox("coder")),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { v.add(err) }))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(gwNC.Close)
	cs, runs := gatewayOn(t, gwNC, mcpgateway.Config{
		Identity:    mcpgateway.Identity{Agent: "coder"},
		NATS:        mcpgateway.NATS{URL: ns.ClientURL(), Private: true},
		Elicitation: mcpgateway.Elicitation{Principal: "bob"},
	}, func(context.Context, *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
		return &mcp.ElicitResult{Action: "accept"}, nil
	})
	res := callMCP(t, cs, "deploy", `{"v":1}`)
	verdict := verdictOf(t, res)
	if res.IsError || verdict.Outcome != events.Approved || runs.Load() != 1 {
		t.Fatalf("accepted in the client: IsError %v, verdict %+v, %d run(s)", res.IsError, verdict, runs.Load())
	}
	itest.WaitState(t, b, verdict.RequestID, broker.StateApproved)
	v.none(t, "the gateway, on private credentials,")
}

// gatewayOn runs the MCP gateway on nc in front of an upstream with one tool,
// deploy, that counts its runs, and connects a client to it on a pipe, as on
// stdio, whose user answers questions with elicit.
func gatewayOn(t *testing.T, nc *nats.Conn, cfg mcpgateway.Config, elicit func(context.Context, *mcp.ElicitRequest) (*mcp.ElicitResult, error)) (*mcp.ClientSession, *atomic.Int32) {
	t.Helper()
	runs := &atomic.Int32{}
	up := mcp.NewServer(&mcp.Implementation{Name: "ops", Version: "v1"}, nil)
	up.AddTool(&mcp.Tool{Name: "deploy", Description: "Deploy.", InputSchema: map[string]any{"type": "object"}},
		func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			runs.Add(1)
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "deployed"}}}, nil
		})
	upSrv := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return up }, nil))
	t.Cleanup(upSrv.Close)

	cfg.Upstreams = []mcpgateway.Upstream{{Name: "ops", URL: upSrv.URL}}
	g, err := mcpgateway.New(nc, cfg, testenv.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := g.Close(); err != nil {
			t.Errorf("close the gateway: %v", err)
		}
	})
	if err := g.Start(itest.TestCtx(t, itest.Patience)); err != nil {
		t.Fatal(err)
	}
	server, client := net.Pipe()
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- g.Serve(ctx, &mcp.IOTransport{Reader: server, Writer: server}) }()
	t.Cleanup(func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "desktop", Version: "1"}, &mcp.ClientOptions{ElicitationHandler: elicit}).
		Connect(itest.TestCtx(t, itest.Patience), &mcp.IOTransport{Reader: client, Writer: client}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cs.Close() })
	return cs, runs
}
