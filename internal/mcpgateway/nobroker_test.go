package mcpgateway_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nats.go"

	"github.com/assent-dev/assent/internal/broker"
	"github.com/assent-dev/assent/internal/brokertest"
	"github.com/assent-dev/assent/internal/mcpgateway"
	"github.com/assent-dev/assent/internal/testenv"
	"github.com/assent-dev/assent/pkg/events"
	"github.com/assent-dev/assent/pkg/handler"
)

// longTimeout is the approval timeout the gateway asks in these tests: a
// call that waited for it would outlast the test's patience many times.
const longTimeout = 10 * time.Minute

// With no broker to answer, a call fails at once with a tool error saying
// so, and does not run, instead of waiting its timeout (here ten minutes)
// and more: whether NATS is down, no broker ever ran on it, the broker
// stopped, or one answers lookups but does not take the request up. A
// request that was published is withdrawn, on the record once a broker is
// back.
func TestNoBroker(t *testing.T) {
	tests := []struct {
		name    string
		private bool
		// broker: a broker ran on NATS, and stopped; down: NATS stops
		// once the gateway started; stuck: something answers the agent's
		// lookups as a broker would that has not stored the request (one
		// far behind, say), and never stores it.
		broker, down, stuck bool
		want                string
		// withdrawn: the request was published, and is found cancelled
		// once a broker is back.
		withdrawn bool
	}{
		{name: "NATS is down", broker: true, down: true, want: "NATS is unreachable"},
		{name: "no broker ever ran", want: "no broker has run on this NATS server"},
		{name: "the broker stopped", broker: true, want: "no broker is connected to NATS"},
		{name: "the broker stopped, private credentials", private: true, broker: true, want: "no broker is connected to NATS"},
		{name: "no broker takes the request up", broker: true, stuck: true, want: "no broker took the request up within 5s", withdrawn: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ns := testenv.Server(t)
			nc := testenv.Conn(t, ns)
			if tt.broker {
				_, stop := brokertest.Run(t, nc, broker.Config{Name: "gone"})
				stop()
			}
			if tt.stuck {
				sub, err := nc.Subscribe(events.PrivatePrefix+"desk.lookup.*", func(m *nats.Msg) {
					_ = m.RespondMsg(&nats.Msg{Header: nats.Header{events.LookupStatus: {events.LookupUnknown}}})
				})
				if err != nil {
					t.Fatal(err)
				}
				if err := nc.Flush(); err != nil {
					t.Fatal(err)
				}
				defer sub.Unsubscribe() //nolint:errcheck // the test ends
			}
			n, url := newNotes(t)
			n.seed(t, "kept.txt")
			cfg := mcpgateway.Config{Upstreams: []mcpgateway.Upstream{{Name: "notes", URL: url}}, NATS: mcpgateway.NATS{URL: ns.ClientURL(), Private: tt.private},
				Identity: mcpgateway.Identity{Agent: "desk"}, Timeout: longTimeout}
			var opts []nats.Option
			if tt.private {
				opts = append(opts, nats.CustomInboxPrefix(handler.PrivateInbox("desk")))
			}
			gw, gwNC := startGateway(t, ns, cfg, opts...)
			cs, _ := memoryFrontend.connect(t, gw, "desk", nil, nil, nil)
			if tt.down {
				// NATS is down, and the gateway knows it, as before a
				// call that comes while NATS is away.
				ns.Stop()
				for deadline := time.Now().Add(patience); gwNC.IsConnected(); time.Sleep(10 * time.Millisecond) {
					if time.Now().After(deadline) {
						t.Fatal("the gateway's connection still says connected")
					}
				}
			}
			ctx, cancel := context.WithTimeout(t.Context(), patience)
			defer cancel()
			res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "delete_file", Arguments: map[string]any{"path": "kept.txt"}})
			if err != nil {
				t.Fatalf("the call returned no result within %s (its approval timeout is %s): %v", patience, longTimeout, err)
			}
			v := verdict(t, res)
			txt := text(t, res)
			if !res.IsError || !strings.Contains(txt, "Not run: no Assent broker answers") || !strings.Contains(txt, tt.want) ||
				!strings.Contains(txt, "did not run") || !strings.Contains(v.Error, tt.want) {
				t.Errorf("IsError %v, text %q, verdict %+v; want a tool error saying %q", res.IsError, txt, v, tt.want)
			}
			if !n.exists(t, "kept.txt") {
				t.Error("the call ran")
			}
			if !tt.withdrawn {
				return
			}
			brokertest.Run(t, testenv.Conn(t, ns), broker.Config{Name: "back"})
			reader, err := handler.NewClient(nc, handler.Config{})
			if err != nil {
				t.Fatal(err)
			}
			f := &fixture{nc: nc, reader: reader}
			if d := f.decision(t, v.RequestID); d.Outcome != events.Cancelled || !strings.Contains(d.Reason, "no Assent broker answers") {
				t.Errorf("decision %+v, want cancelled: no broker answered", d)
			}
		})
	}
}

// startGateway starts a gateway on ns with cfg until the test ends, on a
// connection of its own made with opts.
func startGateway(t *testing.T, ns *testenv.NATS, cfg mcpgateway.Config, opts ...nats.Option) (*mcpgateway.Gateway, *nats.Conn) {
	t.Helper()
	nc, err := nats.Connect(ns.ClientURL(), append([]nats.Option{nats.MaxReconnects(-1), nats.ReconnectWait(50 * time.Millisecond),
		nats.RetryOnFailedConnect(true)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	gw := runGateway(t, nc, cfg)
	return gw, nc
}
