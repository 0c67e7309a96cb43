package worker_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/assent-dev/assent/internal/worker"
)

func TestParsePlan(t *testing.T) {
	plan, err := worker.ParsePlan("p.json", []byte(`[
  {"tool": "list_files"},
  {"tool": "write_file", "args": {"path": "a", "content": "x"}, "hint": "write"},
  {"tool": "delete_file", "args": {"path": "a"}, "approval": true}
]`))
	if err != nil {
		t.Fatal(err)
	}
	if len(plan.Steps) != 3 || plan.Name != "p.json" {
		t.Fatalf("plan %+v", plan)
	}
	s := plan.Steps[2]
	if s.Tool != "delete_file" || !s.Approval || string(s.Args) != `{"path": "a"}` || s.Line != 4 {
		t.Fatalf("step 3: %+v", s)
	}
	if plan.Steps[0].Approval || plan.Steps[1].Hint != "write" || plan.Steps[1].Line != 3 {
		t.Fatalf("steps 1-2: %+v", plan.Steps[:2])
	}
}

func TestParsePlanErrors(t *testing.T) {
	tests := []struct {
		name string
		plan string
		// wantErrs must all match (errors.Is); wantMsg must all appear.
		wantErrs []error
		wantMsg  []string
	}{
		{"empty file", ``, []error{worker.ErrPlanSyntax}, []string{"p.json:1:1:"}},
		{"bad JSON", "[\n  {\"tool\": \"list_files\",}\n]", []error{worker.ErrPlanSyntax}, []string{"p.json:2:"}},
		{"trailing junk", "[{\"tool\": \"list_files\"}] x", []error{worker.ErrPlanSyntax}, []string{"p.json:1:"}},
		{"object, not array", `{"steps": []}`, []error{worker.ErrPlanSyntax}, []string{"found object"}},
		{"null", `null`, []error{worker.ErrPlanSyntax}, nil},
		{"no steps", ` [ ] `, []error{worker.ErrEmptyPlan}, []string{"p.json:1:2:"}},
		{"step not an object", `[{"tool": "list_files"}, 7]`, []error{worker.ErrBadStep}, []string{"step 2", "p.json:1:26:"}},
		{"unknown tool", "[\n{\"tool\": \"list_files\"},\n{\"tool\": \"rm_rf\", \"args\": {}}]", []error{worker.ErrUnknownTool}, []string{"p.json:3:1: step 2: rm_rf: unknown tool \"rm_rf\""}},
		{"no tool", `[{"args": {}}]`, []error{worker.ErrBadStep}, []string{`missing "tool"`}},
		{"missing args", `[{"tool": "delete_file"}]`, []error{worker.ErrMissingArg}, []string{"step 1: delete_file:", `"path"`}},
		{"missing two args", `[{"tool": "move_file", "args": {}}]`, []error{worker.ErrMissingArg}, []string{`"from"`, `"to"`}},
		{"bad arg type", `[{"tool": "delete_file", "args": {"path": 1}}]`, []error{worker.ErrBadArg}, []string{`"path" must be a string, not number`}},
		{"unknown arg", `[{"tool": "delete_file", "args": {"path": "a", "force": true}}]`, []error{worker.ErrBadArg}, []string{`unknown argument "force"`}},
		{"args not an object", `[{"tool": "delete_file", "args": "a"}]`, []error{worker.ErrBadStep}, []string{`"args" must be a JSON object`}},
		{"misspelt approval", `[{"tool": "delete_file", "args": {"path": "a"}, "aproval": true}]`, []error{worker.ErrBadStep}, []string{`unknown field "aproval"`}},
		{"approval not a bool", "[\n  {\"tool\": \"delete_file\", \"args\": {\"path\": \"a\"},\n   \"approval\": \"yes\"}]", []error{worker.ErrBadStep}, []string{"p.json:3:", `"approval" must be true or false, not string`}},
		{"every problem at once", "[\n{\"tool\": \"nope\"},\n{\"tool\": \"read_file\"},\n{\"tool\": \"list_files\", \"hint\": 1}\n]",
			[]error{worker.ErrUnknownTool, worker.ErrMissingArg, worker.ErrBadStep}, []string{"p.json:2:1: step 1:", "p.json:3:1: step 2:", "p.json:4:", "step 3:"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := worker.ParsePlan("p.json", []byte(tt.plan))
			if err == nil {
				t.Fatal("no error")
			}
			for _, want := range tt.wantErrs {
				if !errors.Is(err, want) {
					t.Errorf("error %q does not match %v", err, want)
				}
			}
			for _, want := range tt.wantMsg {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not say %q", err, want)
				}
			}
			var pe *worker.PlanError
			if !errors.As(err, &pe) {
				t.Errorf("error %q is not a *PlanError", err)
			}
		})
	}
}

func TestLoadExamplePlan(t *testing.T) {
	plan, err := worker.LoadPlan("../../examples/plan.json")
	if err != nil {
		t.Fatal(err)
	}
	guarded := map[string]bool{}
	for _, s := range plan.Steps {
		if s.Approval {
			guarded[s.Tool] = true
		}
	}
	if !guarded[worker.ToolDeleteFile] || !guarded[worker.ToolMoveFile] || len(guarded) != 2 {
		t.Fatalf("example plan guards %v, want delete_file and move_file", guarded)
	}
	if _, err := worker.LoadPlan("no/such/plan.json"); err == nil {
		t.Fatal("loading a missing plan succeeded")
	}
}

func FuzzParsePlan(f *testing.F) {
	for _, seed := range []string{
		``, `[]`, `null`, `[{}]`, `[{"tool": "list_files"}]`,
		`[{"tool": "move_file", "args": {"from": "a", "to": "b", "overwrite": true}, "approval": true, "hint": "h"}]`,
		"[\n{\"tool\": \"rm\"},\n{\"tool\": \"read_file\", \"args\": {\"path\": 1}}]",
		`[{"tool": "write_file", "args": {"path": "a", "content": null}}]`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		plan, err := worker.ParsePlan("fuzz.json", data)
		if err != nil {
			return
		}
		if len(plan.Steps) == 0 {
			t.Fatal("a plan without steps parsed")
		}
		for i, s := range plan.Steps {
			if err := worker.CheckArgs(s.Tool, s.Args); err != nil {
				t.Fatalf("step %d parsed but its args do not check: %v", i+1, err)
			}
			if s.Line < 1 {
				t.Fatalf("step %d has line %d", i+1, s.Line)
			}
		}
	})
}
