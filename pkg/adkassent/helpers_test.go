package adkassent_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"iter"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/glebarez/sqlite"
	"github.com/nats-io/nats.go"
	"google.golang.org/adk/agent"
	"google.golang.org/adk/agent/llmagent"
	"google.golang.org/adk/model"
	"google.golang.org/adk/runner"
	"google.golang.org/adk/session"
	"google.golang.org/adk/session/database"
	"google.golang.org/adk/tool"
	"google.golang.org/adk/tool/functiontool"
	"google.golang.org/adk/tool/toolconfirmation"
	"google.golang.org/genai"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/assent-dev/assent/internal/broker"
	"github.com/assent-dev/assent/internal/brokertest"
	"github.com/assent-dev/assent/internal/testenv"
	"github.com/assent-dev/assent/pkg/adkassent"
	"github.com/assent-dev/assent/pkg/events"
	"github.com/assent-dev/assent/pkg/handler"
)

// patience bounds every wait in these tests: only a hang misses it.
const patience = 30 * time.Second

const (
	appName   = "files"
	agentName = "file-manager"
	userID    = "carol"
)

// scripted is a model.LLM that makes its calls (in one response), then, once
// the conversation ends with a function response, says it is done. It keeps
// no state, so a restarted agent gets a new one.
type scripted struct {
	calls []*genai.FunctionCall
}

func (m scripted) Name() string { return "scripted" }

func (m scripted) GenerateContent(_ context.Context, req *model.LLMRequest, _ bool) iter.Seq2[*model.LLMResponse, error] {
	return func(yield func(*model.LLMResponse, error) bool) {
		var last *genai.Content
		if n := len(req.Contents); n > 0 {
			last = req.Contents[n-1]
		}
		if last != nil && hasResponse(last) {
			yield(&model.LLMResponse{Content: genai.NewContentFromText("done", genai.RoleModel), TurnComplete: true}, nil)
			return
		}
		var parts []*genai.Part
		for _, c := range m.calls {
			call := *c
			parts = append(parts, &genai.Part{FunctionCall: &call})
		}
		yield(&model.LLMResponse{Content: &genai.Content{Role: genai.RoleModel, Parts: parts}, TurnComplete: true}, nil)
	}
}

func hasResponse(c *genai.Content) bool {
	for _, p := range c.Parts {
		if p.FunctionResponse != nil {
			return true
		}
	}
	return false
}

// runs records every execution of a tool: the arguments and the
// confirmation it ran with.
type runs struct {
	mu   sync.Mutex
	args []json.RawMessage
	conf []*toolconfirmation.ToolConfirmation
}

func (r *runs) add(args any, tc *toolconfirmation.ToolConfirmation) {
	raw, _ := json.Marshal(args)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.args = append(r.args, raw)
	r.conf = append(r.conf, tc)
}

func (r *runs) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.args)
}

func (r *runs) last(t *testing.T) (json.RawMessage, *toolconfirmation.ToolConfirmation) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.args) == 0 {
		t.Fatal("the tool never ran")
	}
	return r.args[len(r.args)-1], r.conf[len(r.conf)-1]
}

type deleteArgs struct {
	Path string `json:"path"`
}

type deleteResult struct {
	Deleted string `json:"deleted"`
}

// deleteTool is a functiontool that always needs a confirmation; it records
// each time it really runs.
func deleteTool(t *testing.T, rec *runs) tool.Tool {
	t.Helper()
	tl, err := functiontool.New(functiontool.Config{Name: "delete_file", Description: "Deletes a file.", RequireConfirmation: true},
		func(ctx agent.ToolContext, a deleteArgs) (deleteResult, error) {
			rec.add(a, ctx.ToolConfirmation())
			return deleteResult{Deleted: a.Path}, nil
		})
	if err != nil {
		t.Fatal(err)
	}
	return tl
}

type daysArgs struct {
	Days int `json:"days"`
}

// daysPayload is the structured answer the vacation tool asks for.
type daysPayload struct {
	DaysApproved int `json:"days_approved"`
}

type daysResult struct {
	Status string `json:"status"`
	Days   int    `json:"days"`
}

// daysTool asks for its own confirmation with a payload, as ADK's
// toolconfirmation example does; functiontool runs it again (recorded) only
// when confirmed.
func daysTool(t *testing.T, rec *runs) tool.Tool {
	t.Helper()
	tl, err := functiontool.New(functiontool.Config{Name: "request_days", Description: "Requests vacation days."},
		func(ctx agent.ToolContext, a daysArgs) (daysResult, error) {
			tc := ctx.ToolConfirmation()
			if tc == nil {
				if err := ctx.RequestConfirmation("Grant vacation days?", daysPayload{DaysApproved: 0}); err != nil {
					return daysResult{}, err
				}
				return daysResult{Status: "waiting for a manager"}, nil
			}
			rec.add(a, tc)
			raw, _ := json.Marshal(tc.Payload)
			var p daysPayload
			if err := json.Unmarshal(raw, &p); err != nil {
				return daysResult{}, err
			}
			return daysResult{Status: "granted", Days: p.DaysApproved}, nil
		})
	if err != nil {
		t.Fatal(err)
	}
	return tl
}

// env is an embedded NATS server with a broker on it.
type env struct {
	ns *testenv.NATS
	nc *nats.Conn // the test's own connection: approvers, checks
	b  *broker.Broker
}

func newEnv(t *testing.T, cfg broker.Config) *env {
	t.Helper()
	ns := testenv.Server(t)
	if cfg.Name == "" {
		cfg.Name = "adk"
	}
	b, _ := brokertest.Run(t, testenv.Conn(t, ns), cfg)
	return &env{ns: ns, nc: testenv.Conn(t, ns), b: b}
}

// proc is one agent process: its NATS connection, its ADK session store
// and its Runner.
type proc struct {
	nc       *nats.Conn
	sessions session.Service
	closeDB  func()
	r        *adkassent.Runner
}

// agent starts an agent process: a connection of its own (closed when the
// test ends, or earlier by the caller to play a crash), the session store in
// the SQLite file path, an llmagent whose scripted model makes calls to tl,
// and a Runner over it.
func (e *env) agent(t *testing.T, path string, tl tool.Tool, calls []*genai.FunctionCall, cfg adkassent.Config) *proc {
	t.Helper()
	nc := testenv.Conn(t, e.ns)
	c, err := handler.NewClient(nc, handler.Config{Agent: agentName, Logger: testenv.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	svc, closeDB := sessions(t, path)
	a, err := llmagent.New(llmagent.Config{Name: "assistant", Model: scripted{calls: calls}, Tools: []tool.Tool{tl}, Instruction: "Use the tools."})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Agent == "" {
		cfg.Agent = agentName
	}
	if cfg.Logger == nil {
		cfg.Logger = testenv.Logger(t)
	}
	r, err := adkassent.NewRunner(c, runner.Config{AppName: appName, Agent: a, SessionService: svc}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &proc{nc: nc, sessions: svc, closeDB: closeDB, r: r}
}

// pendings delivers the pending events the broker publishes for the agent,
// from now on; next reads their request ids.
func (e *env) pendings(t *testing.T) <-chan *nats.Msg {
	t.Helper()
	subj, err := events.PendingSubject(agentName)
	if err != nil {
		t.Fatal(err)
	}
	msgs := make(chan *nats.Msg, 64)
	sub, err := e.nc.ChanSubscribe(subj, msgs)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := e.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return msgs
}

// stored returns the broker's record of request id once its pending event
// is stored: a subscriber on the pending subject (pendings) may see the
// event before the stream has stored it.
func (e *env) stored(t *testing.T, id string) broker.Record {
	t.Helper()
	deadline := time.Now().Add(patience)
	for {
		r, err := e.b.Get(t.Context(), id)
		if err == nil {
			return r
		}
		if !errors.Is(err, broker.ErrNotFound) || time.Now().After(deadline) {
			t.Fatalf("request %s: %v", id, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// next waits for the next pending request on ch and returns its id.
func next(t *testing.T, ch <-chan *nats.Msg) string {
	t.Helper()
	timeout := time.After(patience)
	for {
		select {
		case m := <-ch:
			ev, err := events.Decode(events.Header(m.Header), m.Data)
			if err != nil {
				continue
			}
			if p, err := events.DecodePending(&ev); err == nil {
				return p.RequestID
			}
		case <-timeout:
			t.Fatalf("nothing pending after %s", patience)
		}
	}
}

// sessions opens ADK's database session service on the SQLite file path;
// closing the returned func closes the database, as a process that stops
// would.
func sessions(t *testing.T, path string) (session.Service, func()) {
	t.Helper()
	db, err := sql.Open(sqlite.DriverName, path)
	if err != nil {
		t.Fatal(err)
	}
	svc, err := database.NewSessionService(&sqlite.Dialector{Conn: db}, &gorm.Config{Logger: logger.Default.LogMode(logger.Silent)})
	if err != nil {
		t.Fatal(err)
	}
	if err := database.AutoMigrate(svc); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	closeDB := func() { once.Do(func() { _ = db.Close() }) }
	t.Cleanup(closeDB)
	return svc, closeDB
}

// newSession creates an ADK session for userID and returns its id.
func newSession(t *testing.T, svc session.Service) string {
	t.Helper()
	got, err := svc.Create(t.Context(), &session.CreateRequest{AppName: appName, UserID: userID})
	if err != nil {
		t.Fatal(err)
	}
	return got.Session.ID()
}

// outcome is what one run yielded.
type outcome struct {
	events []*session.Event
	errs   []error
}

// drain collects everything seq yields.
func drain(seq iter.Seq2[*session.Event, error]) outcome {
	var o outcome
	for ev, err := range seq {
		if err != nil {
			o.errs = append(o.errs, err)
		}
		if ev != nil {
			o.events = append(o.events, ev)
		}
	}
	return o
}

// toolResult returns the last response of the tool named name among the
// events.
func (o outcome) toolResult(t *testing.T, name string) map[string]any {
	t.Helper()
	res := o.toolResults(name)
	if len(res) == 0 {
		t.Fatalf("no response of %s among %d events", name, len(o.events))
	}
	return res[len(res)-1]
}

// toolResults returns the responses of the tool named name among the
// events, in order.
func (o outcome) toolResults(name string) []map[string]any {
	var res []map[string]any
	for _, ev := range o.events {
		if ev.Content == nil {
			continue
		}
		for _, p := range ev.Content.Parts {
			if p.FunctionResponse != nil && p.FunctionResponse.Name == name {
				res = append(res, p.FunctionResponse.Response)
			}
		}
	}
	return res
}

// confirmations counts the adk_request_confirmation calls among the events.
func (o outcome) confirmations() int {
	n := 0
	for _, ev := range o.events {
		if ev.Content == nil {
			continue
		}
		for _, p := range ev.Content.Parts {
			if p.FunctionCall != nil && p.FunctionCall.Name == toolconfirmation.FunctionCallName {
				n++
			}
		}
	}
	return n
}

// answers returns the Assent part of every confirmation answer stored in
// the session.
func answers(t *testing.T, svc session.Service, sessionID string) []map[string]any {
	t.Helper()
	got, err := svc.Get(t.Context(), &session.GetRequest{AppName: appName, UserID: userID, SessionID: sessionID})
	if err != nil {
		t.Fatal(err)
	}
	var out []map[string]any
	for ev := range got.Session.Events().All() {
		if ev.Content == nil {
			continue
		}
		for _, p := range ev.Content.Parts {
			if fr := p.FunctionResponse; fr != nil && fr.Name == toolconfirmation.FunctionCallName {
				a, _ := fr.Response["assent"].(map[string]any)
				out = append(out, a)
			}
		}
	}
	return out
}

// userText is a user's message.
func userText(s string) *genai.Content { return genai.NewContentFromText(s, genai.RoleUser) }

// contains reports whether the JSON of v contains s.
func contains(v any, s string) bool {
	raw, _ := json.Marshal(v)
	return strings.Contains(string(raw), s)
}

// dbPath is a fresh SQLite file for a test.
func dbPath(t *testing.T) string {
	t.Helper()
	return filepath.Join(t.TempDir(), "sessions.db")
}
