package worker_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/assent-dev/assent/internal/broker"
	"github.com/assent-dev/assent/internal/worker"
	"github.com/assent-dev/assent/pkg/events"
	"github.com/assent-dev/assent/pkg/handler"
)

func parsePlan(t *testing.T, src string) worker.Plan {
	t.Helper()
	plan, err := worker.ParsePlan("test.json", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	return plan
}

func runPlan(t *testing.T, ctx context.Context, req worker.Requester, sb *worker.Sandbox, plan worker.Plan) ([]worker.StepReport, worker.Summary, error) {
	t.Helper()
	a, err := worker.NewAgent(req, sb, worker.AgentConfig{Timeout: time.Minute}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var reports []worker.StepReport
	sum, err := a.RunPlan(ctx, plan, func(r worker.StepReport) { reports = append(reports, r) })
	if len(reports) > sum.Steps {
		t.Fatalf("%d reports for %d steps", len(reports), sum.Steps)
	}
	return reports, sum, err
}

// A full plan against a manual broker: an approver approves the delete with
// edited args and denies the move.
func TestRunPlanManualBroker(t *testing.T) {
	e := newEnv(t, broker.ModeManual, "file-manager")
	answer(t, e, "file-manager", "alice", func(p events.Pending) *events.Responded {
		switch p.Request.Tool {
		case worker.ToolDeleteFile:
			return &events.Responded{Decision: events.Approve, Args: json.RawMessage(`{"path": "scratch.tmp"}`), Reason: "only the scratch file", Channel: "test"}
		case worker.ToolMoveFile:
			return &events.Responded{Decision: events.Deny, Reason: "keep it in the inbox", Channel: "test"}
		}
		t.Errorf("unguarded tool %s was sent for approval", p.Request.Tool)
		return nil
	})

	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{"report.csv": "r", "scratch.tmp": "s", "inbox/todo.txt": "t"})
	sb, err := worker.OpenSandbox(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close() //nolint:errcheck // test
	plan := parsePlan(t, `[
		{"tool": "list_files"},
		{"tool": "delete_file", "args": {"path": "report.csv"}, "approval": true, "hint": "delete the report?"},
		{"tool": "move_file", "args": {"from": "inbox/todo.txt", "to": "archive/todo.txt"}, "approval": true},
		{"tool": "write_file", "args": {"path": "done.txt", "content": "done"}}
	]`)

	reports, sum, err := runPlan(t, testCtx(t), e.client, sb, plan)
	if err != nil {
		t.Fatalf("RunPlan: %v (denials are not failures)", err)
	}
	if sum != (worker.Summary{Steps: 4, Executed: 3, Declined: 1}) {
		t.Errorf("summary %+v", sum)
	}
	if len(reports) != 4 {
		t.Fatalf("%d reports", len(reports))
	}

	del := reports[1]
	if del.Outcome != worker.OutcomeApproved || !del.Edited || !del.Executed || del.RequestID == "" || del.Reason != "only the scratch file" {
		t.Errorf("delete step: %+v", del)
	}
	if string(del.Args) != `{"path":"scratch.tmp"}` || len(del.DecidedBy) != 1 || del.DecidedBy[0] != "alice" {
		t.Errorf("delete step args %s, decided by %v", del.Args, del.DecidedBy)
	}
	if exists(t, filepath.Join(dir, "scratch.tmp")) {
		t.Error("the approver's edit was ignored: scratch.tmp still exists")
	}
	if !exists(t, filepath.Join(dir, "report.csv")) {
		t.Error("report.csv, which the approver did not approve deleting, is gone")
	}

	mv := reports[2]
	if mv.Outcome != worker.OutcomeDenied || mv.Executed || mv.Failed || mv.Reason != "keep it in the inbox" || mv.RequestID == "" {
		t.Errorf("move step: %+v", mv)
	}
	if !exists(t, filepath.Join(dir, "inbox", "todo.txt")) || exists(t, filepath.Join(dir, "archive")) {
		t.Error("the denied move ran")
	}

	if r := reports[0]; r.Outcome != worker.OutcomeUnguarded || !r.Executed || r.RequestID != "" {
		t.Errorf("list step: %+v", r)
	}
	if r := reports[3]; !r.Executed || readFile(t, filepath.Join(dir, "done.txt")) != "done" {
		t.Errorf("write step after a denial: %+v", r)
	}

	// The broker agrees on what happened.
	rec, err := e.b.Get(testCtx(t), del.RequestID)
	if err != nil || rec.State != broker.StateApproved || rec.Request.Tool != worker.ToolDeleteFile || rec.Request.Hint != "delete the report?" {
		t.Errorf("broker record of the delete: %+v, %v", rec, err)
	}
}

// Stopping the run while a guarded step waits cancels its request.
func TestRunPlanInterrupted(t *testing.T) {
	e := newEnv(t, broker.ModeManual, "file-manager")
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{"a.txt": "a"})
	sb, err := worker.OpenSandbox(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close() //nolint:errcheck // test

	ctx, cancel := context.WithCancel(testCtx(t))
	defer cancel()
	answer(t, e, "file-manager", "nobody", func(events.Pending) *events.Responded {
		cancel() // the request is pending: stop the run, as Ctrl-C would
		return nil
	})
	plan := parsePlan(t, `[
		{"tool": "delete_file", "args": {"path": "a.txt"}, "approval": true},
		{"tool": "write_file", "args": {"path": "b.txt", "content": "b"}}
	]`)
	reports, sum, err := runPlan(t, ctx, e.client, sb, plan)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("RunPlan: %v, want context.Canceled", err)
	}
	if len(reports) != 1 || reports[0].Outcome != worker.OutcomeInterrupted || reports[0].Executed || sum.Executed != 0 || sum.NotRun != 2 {
		t.Fatalf("reports %+v, summary %+v", reports, sum)
	}
	if !exists(t, filepath.Join(dir, "a.txt")) || exists(t, filepath.Join(dir, "b.txt")) {
		t.Fatal("something ran after the interrupt")
	}
	wctx, wcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer wcancel()
	rec, err := e.b.Wait(wctx, reports[0].RequestID)
	if err != nil || rec.State != broker.StateCancelled {
		t.Fatalf("broker state of the interrupted request: %s, %v; want cancelled", rec.State, err)
	}
}

// fakeRequester answers every request with decide's result.
type fakeRequester struct {
	mu     sync.Mutex
	asked  []handler.Request
	decide func(req handler.Request) (handler.Decision, error)
}

func (f *fakeRequester) Request(_ context.Context, req handler.Request) (handler.Decision, error) {
	f.mu.Lock()
	f.asked = append(f.asked, req)
	f.mu.Unlock()
	return f.decide(req)
}

// decision builds a decision for req as the broker would, with args (the
// request's when nil).
func decision(req handler.Request, outcome events.Outcome, args string) handler.Decision {
	a := json.RawMessage(args)
	if args == "" {
		a = req.Args
	}
	c, err := events.CanonicalArgs(a)
	if err != nil {
		panic(err)
	}
	digest, _ := events.ArgsDigest(c)
	return handler.Decision{RequestID: req.ID, Outcome: outcome, Args: c, ArgsDigest: digest, DecidedAt: time.Now()}
}

// What the agent does with each kind of answer, and that it asks only for
// guarded steps whose args the sandbox accepts.
func TestRunPlanDecisions(t *testing.T) {
	tests := []struct {
		name         string
		step         string
		decide       func(handler.Request) (handler.Decision, error)
		wantOutcome  worker.Outcome
		wantExecuted bool
		wantFailed   bool
		wantErr      error // in the report
		wantAsked    int
		wantDeleted  bool // a.txt
	}{
		{
			name:        "approved",
			step:        `{"tool": "delete_file", "args": {"path": "a.txt"}, "approval": true}`,
			decide:      func(r handler.Request) (handler.Decision, error) { return decision(r, events.Approved, ""), nil },
			wantOutcome: worker.OutcomeApproved, wantExecuted: true, wantAsked: 1, wantDeleted: true,
		},
		{
			name:        "unguarded steps are not asked about",
			step:        `{"tool": "delete_file", "args": {"path": "a.txt"}}`,
			wantOutcome: worker.OutcomeUnguarded, wantExecuted: true, wantDeleted: true,
		},
		{
			name:        "expired",
			step:        `{"tool": "delete_file", "args": {"path": "a.txt"}, "approval": true}`,
			decide:      func(r handler.Request) (handler.Decision, error) { return decision(r, events.Expired, ""), nil },
			wantOutcome: worker.OutcomeExpired, wantAsked: 1,
		},
		{
			name:        "cancelled by an admin",
			step:        `{"tool": "delete_file", "args": {"path": "a.txt"}, "approval": true}`,
			decide:      func(r handler.Request) (handler.Decision, error) { return decision(r, events.Cancelled, ""), nil },
			wantOutcome: worker.OutcomeCancelled, wantAsked: 1,
		},
		{
			name: "no decision",
			step: `{"tool": "delete_file", "args": {"path": "a.txt"}, "approval": true}`,
			decide: func(handler.Request) (handler.Decision, error) {
				return handler.Decision{}, fmt.Errorf("%w: waited too long", handler.ErrNoDecision)
			},
			wantOutcome: worker.OutcomeNoDecision, wantAsked: 1,
		},
		{
			name: "request failed",
			step: `{"tool": "delete_file", "args": {"path": "a.txt"}, "approval": true}`,
			decide: func(handler.Request) (handler.Decision, error) {
				return handler.Decision{}, errors.New("no stream")
			},
			wantOutcome: worker.OutcomeError, wantFailed: true, wantAsked: 1,
		},
		{
			name: "args that do not match the digest",
			step: `{"tool": "delete_file", "args": {"path": "a.txt"}, "approval": true}`,
			decide: func(r handler.Request) (handler.Decision, error) {
				d := decision(r, events.Approved, "")
				d.Args = json.RawMessage(`{"path":"b.txt"}`)
				return d, nil
			},
			wantOutcome: worker.OutcomeApproved, wantFailed: true, wantErr: handler.ErrTampered, wantAsked: 1,
		},
		{
			name: "a decision for another request",
			step: `{"tool": "delete_file", "args": {"path": "a.txt"}, "approval": true}`,
			decide: func(r handler.Request) (handler.Decision, error) {
				r.ID = events.NewID()
				return decision(r, events.Approved, ""), nil
			},
			wantOutcome: worker.OutcomeApproved, wantFailed: true, wantErr: handler.ErrTampered, wantAsked: 1,
		},
		{
			name: "an edit that leaves the sandbox",
			step: `{"tool": "delete_file", "args": {"path": "a.txt"}, "approval": true}`,
			decide: func(r handler.Request) (handler.Decision, error) {
				return decision(r, events.Approved, `{"path": "../outside.txt"}`), nil
			},
			wantOutcome: worker.OutcomeApproved, wantFailed: true, wantErr: worker.ErrEscape, wantAsked: 1,
		},
		{
			name: "an edit with bad args",
			step: `{"tool": "delete_file", "args": {"path": "a.txt"}, "approval": true}`,
			decide: func(r handler.Request) (handler.Decision, error) {
				return decision(r, events.Approved, `{"file": "a.txt"}`), nil
			},
			wantOutcome: worker.OutcomeApproved, wantFailed: true, wantErr: worker.ErrBadArg, wantAsked: 1,
		},
		{
			name:        "args the sandbox refuses are not sent for approval",
			step:        `{"tool": "delete_file", "args": {"path": "/etc/passwd"}, "approval": true}`,
			wantOutcome: worker.OutcomeRejected, wantFailed: true, wantErr: worker.ErrEscape,
		},
		{
			name:        "an unguarded step that fails",
			step:        `{"tool": "read_file", "args": {"path": "missing.txt"}}`,
			wantOutcome: worker.OutcomeUnguarded, wantFailed: true,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			base := t.TempDir()
			dir := filepath.Join(base, "sb")
			writeFiles(t, dir, map[string]string{"a.txt": "a", "b.txt": "b"})
			writeFiles(t, base, map[string]string{"outside.txt": "o"})
			sb, err := worker.OpenSandbox(dir)
			if err != nil {
				t.Fatal(err)
			}
			defer sb.Close() //nolint:errcheck // test
			req := &fakeRequester{decide: tt.decide}
			reports, sum, err := runPlan(t, context.Background(), req, sb, parsePlan(t, "["+tt.step+"]"))
			if tt.wantFailed != errors.Is(err, worker.ErrStepsFailed) {
				t.Errorf("RunPlan error %v; want ErrStepsFailed: %v", err, tt.wantFailed)
			}
			if !tt.wantFailed && err != nil {
				t.Errorf("RunPlan: %v", err)
			}
			r := reports[0]
			if r.Outcome != tt.wantOutcome || r.Executed != tt.wantExecuted || r.Failed != tt.wantFailed {
				t.Errorf("report %+v", r)
			}
			if tt.wantErr != nil && !errors.Is(r.Err, tt.wantErr) {
				t.Errorf("report error %v, want %v", r.Err, tt.wantErr)
			}
			if (r.Err != nil) != (r.Error != "") {
				t.Errorf("Err %v but Error %q", r.Err, r.Error)
			}
			if len(req.asked) != tt.wantAsked {
				t.Errorf("asked %d times, want %d", len(req.asked), tt.wantAsked)
			}
			if got := !exists(t, filepath.Join(dir, "a.txt")); got != tt.wantDeleted {
				t.Errorf("a.txt deleted: %v, want %v", got, tt.wantDeleted)
			}
			if !exists(t, filepath.Join(dir, "b.txt")) || !exists(t, filepath.Join(base, "outside.txt")) {
				t.Error("a file that no approved call names is gone")
			}
			if want := 1; sum.Executed+sum.Declined+sum.Failed != want {
				t.Errorf("summary %+v does not count the step", sum)
			}
		})
	}
}

// What the agent sends: the plan's args, hint, labels, session and a call
// id, with the configured timeout.
func TestRunPlanRequestFields(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{"a.txt": "a"})
	sb, err := worker.OpenSandbox(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close() //nolint:errcheck // test
	req := &fakeRequester{decide: func(r handler.Request) (handler.Decision, error) { return decision(r, events.Denied, ""), nil }}
	a, err := worker.NewAgent(req, sb, worker.AgentConfig{Session: "s-1", User: "carol", Timeout: 90 * time.Second, Labels: map[string]string{"env": "test"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	plan := parsePlan(t, `[{"tool": "read_file", "args": {"path": "a.txt"}}, {"tool": "delete_file", "args": {"path": "a.txt"}, "approval": true, "hint": "sure?"}]`)
	if _, err := a.RunPlan(context.Background(), plan, nil); err != nil {
		t.Fatal(err)
	}
	if len(req.asked) != 1 {
		t.Fatalf("asked %d times", len(req.asked))
	}
	r := req.asked[0]
	if r.ID == "" || r.Tool != "delete_file" || string(r.Args) != `{"path": "a.txt"}` || r.Hint != "sure?" ||
		r.Session != "s-1" || r.User != "carol" || r.CallID != "step-2" || r.Timeout.Std() != 90*time.Second ||
		r.Labels["env"] != "test" || r.Labels["step"] != "2" || r.Labels["plan"] != "test.json" {
		t.Fatalf("request %+v", r)
	}
}

func TestAgentConfigValidate(t *testing.T) {
	dir := t.TempDir()
	sb, err := worker.OpenSandbox(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close() //nolint:errcheck // test
	req := &fakeRequester{}
	for _, cfg := range []worker.AgentConfig{
		{Timeout: -time.Second},
		{Timeout: 31 * 24 * time.Hour},
		{Labels: map[string]string{"": "x"}},
	} {
		if _, err := worker.NewAgent(req, sb, cfg, nil); err == nil {
			t.Errorf("NewAgent accepted %+v", cfg)
		}
	}
	if _, err := worker.NewAgent(nil, sb, worker.AgentConfig{}, nil); err == nil {
		t.Error("NewAgent accepted a nil Requester")
	}
}
