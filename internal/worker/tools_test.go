package worker_test

import (
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"

	"github.com/assent-dev/assent/internal/worker"
)

func exec(t *testing.T, sb *worker.Sandbox, tool, args string) (worker.Result, error) {
	t.Helper()
	return sb.Exec(context.Background(), tool, json.RawMessage(args))
}

func mustExec(t *testing.T, sb *worker.Sandbox, tool, args string) worker.Result {
	t.Helper()
	res, err := exec(t, sb, tool, args)
	if err != nil {
		t.Fatalf("%s %s: %v", tool, args, err)
	}
	return res
}

func TestListFiles(t *testing.T) {
	f := newSandbox(t)
	res := mustExec(t, f.sb, worker.ToolListFiles, `{}`).(*worker.ListResult)
	got := map[string]worker.Entry{}
	for _, e := range res.Entries {
		got[e.Path] = e
	}
	if e := got["a.txt"]; e.Size != 5 || e.Dir {
		t.Errorf("a.txt: %+v", e)
	}
	if e := got["sub"]; !e.Dir {
		t.Errorf("sub: %+v", e)
	}
	if e := got["out-rel"]; !e.Link {
		t.Errorf("out-rel: %+v (links are listed, not followed)", e)
	}
	if _, ok := got["sub/b.txt"]; ok {
		t.Error("non-recursive listing went into sub")
	}

	res = mustExec(t, f.sb, worker.ToolListFiles, `{"path": "sub", "recursive": true}`).(*worker.ListResult)
	var paths []string
	for _, e := range res.Entries {
		paths = append(paths, e.Path)
	}
	if !strings.Contains(strings.Join(paths, " "), "sub/b.txt") {
		t.Errorf("recursive listing of sub: %v", paths)
	}
	if _, err := exec(t, f.sb, worker.ToolListFiles, `{"path": "a.txt"}`); !errors.Is(err, worker.ErrNotFile) {
		t.Errorf("listing a file: %v", err)
	}
	if _, err := exec(t, f.sb, worker.ToolListFiles, `{"path": "out-abs"}`); !errors.Is(err, worker.ErrSymlinkEscape) {
		t.Errorf("listing through a link out: %v", err)
	}
}

func TestReadFile(t *testing.T) {
	f := newSandbox(t)
	res := mustExec(t, f.sb, worker.ToolReadFile, `{"path": "sub/b.txt"}`).(*worker.ReadResult)
	if res.Content != "beta" || res.Size != 4 {
		t.Errorf("read sub/b.txt: %+v", res)
	}
	if res := mustExec(t, f.sb, worker.ToolReadFile, `{"path": "inlink"}`).(*worker.ReadResult); res.Content != "beta" {
		t.Errorf("read through a link inside: %+v", res)
	}
	if _, err := exec(t, f.sb, worker.ToolReadFile, `{"path": "out-rel/secret.txt"}`); !errors.Is(err, worker.ErrSymlinkEscape) {
		t.Errorf("read through a link out: %v", err)
	}
	if _, err := exec(t, f.sb, worker.ToolReadFile, `{"path": "missing.txt"}`); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("read a missing file: %v", err)
	}
	if _, err := exec(t, f.sb, worker.ToolReadFile, `{"path": "sub"}`); !errors.Is(err, worker.ErrNotFile) {
		t.Errorf("read a directory: %v", err)
	}
	writeFiles(t, f.dir, map[string]string{"big": strings.Repeat("x", worker.MaxReadSize+1)})
	if _, err := exec(t, f.sb, worker.ToolReadFile, `{"path": "big"}`); !errors.Is(err, worker.ErrTooLarge) {
		t.Errorf("read a large file: %v", err)
	}
}

func TestWriteFile(t *testing.T) {
	f := newSandbox(t)
	res := mustExec(t, f.sb, worker.ToolWriteFile, `{"path": "new/deep/c.txt", "content": "gamma"}`).(*worker.WriteResult)
	if res.Bytes != 5 || res.Path != "new/deep/c.txt" {
		t.Errorf("write: %+v", res)
	}
	if got := readFile(t, filepath.Join(f.dir, "new", "deep", "c.txt")); got != "gamma" {
		t.Errorf("on disk: %q", got)
	}
	mustExec(t, f.sb, worker.ToolWriteFile, `{"path": "a.txt", "content": ""}`)
	if got := readFile(t, filepath.Join(f.dir, "a.txt")); got != "" {
		t.Errorf("overwrite with empty content: %q", got)
	}
	mustExec(t, f.sb, worker.ToolWriteFile, `{"path": "dangling-in", "content": "via link"}`)
	if got := readFile(t, filepath.Join(f.dir, "sub", "new.txt")); got != "via link" {
		t.Errorf("write through a dangling link inside: %q", got)
	}

	// Nothing lands outside, whichever way it is asked.
	for _, p := range []string{"dangling-out", "../outside/new.txt", "out-rel/new.txt", "sub/deep/new.txt", filepath.Join(f.outside, "new.txt")} {
		args, _ := json.Marshal(map[string]string{"path": p, "content": "pwned"})
		if _, err := exec(t, f.sb, worker.ToolWriteFile, string(args)); !errors.Is(err, worker.ErrEscape) {
			t.Errorf("write %s: %v, want ErrEscape", p, err)
		}
	}
	if exists(t, filepath.Join(f.outside, "new.txt")) {
		t.Fatal("a file was written outside the sandbox")
	}
	if _, err := exec(t, f.sb, worker.ToolWriteFile, `{"path": ".", "content": "x"}`); !errors.Is(err, worker.ErrBadPath) {
		t.Errorf("write the root: %v", err)
	}
}

func TestDeleteFile(t *testing.T) {
	f := newSandbox(t)
	mustExec(t, f.sb, worker.ToolDeleteFile, `{"path": "a.txt"}`)
	if exists(t, filepath.Join(f.dir, "a.txt")) {
		t.Error("a.txt still there")
	}
	if _, err := exec(t, f.sb, worker.ToolDeleteFile, `{"path": "a.txt"}`); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("delete a missing file: %v", err)
	}
	if _, err := exec(t, f.sb, worker.ToolDeleteFile, `{"path": "sub"}`); !errors.Is(err, worker.ErrNotFile) {
		t.Errorf("delete a directory: %v", err)
	}
	if _, err := exec(t, f.sb, worker.ToolDeleteFile, `{"path": "out-rel/secret.txt"}`); !errors.Is(err, worker.ErrSymlinkEscape) {
		t.Errorf("delete through a link out: %v", err)
	}
	if _, err := exec(t, f.sb, worker.ToolDeleteFile, `{"path": "out-abs"}`); !errors.Is(err, worker.ErrSymlinkEscape) {
		t.Errorf("delete a link out: %v", err)
	}
	if !exists(t, filepath.Join(f.outside, "secret.txt")) || !exists(t, filepath.Join(f.dir, "out-abs")) {
		t.Fatal("delete reached outside the sandbox")
	}
}

func TestMoveFile(t *testing.T) {
	f := newSandbox(t)
	res := mustExec(t, f.sb, worker.ToolMoveFile, `{"from": "a.txt", "to": "archive/a.txt"}`).(*worker.MoveResult)
	if res.From != "a.txt" || res.To != "archive/a.txt" {
		t.Errorf("move: %+v", res)
	}
	if exists(t, filepath.Join(f.dir, "a.txt")) || readFile(t, filepath.Join(f.dir, "archive", "a.txt")) != "alpha" {
		t.Error("a.txt not moved to archive/a.txt")
	}
	if _, err := exec(t, f.sb, worker.ToolMoveFile, `{"from": "archive/a.txt", "to": "sub/b.txt"}`); !errors.Is(err, worker.ErrExists) {
		t.Errorf("move onto an existing file: %v", err)
	}
	if readFile(t, filepath.Join(f.dir, "sub", "b.txt")) != "beta" {
		t.Error("existing destination changed")
	}
	mustExec(t, f.sb, worker.ToolMoveFile, `{"from": "archive/a.txt", "to": "sub/b.txt", "overwrite": true}`)
	if readFile(t, filepath.Join(f.dir, "sub", "b.txt")) != "alpha" {
		t.Error("overwrite did not replace the destination")
	}
	if _, err := exec(t, f.sb, worker.ToolMoveFile, `{"from": "sub/b.txt", "to": "sub"}`); !errors.Is(err, worker.ErrExists) {
		t.Errorf("move onto a directory: %v", err)
	}
	if _, err := exec(t, f.sb, worker.ToolMoveFile, `{"from": "sub", "to": "sub2"}`); !errors.Is(err, worker.ErrNotFile) {
		t.Errorf("move a directory: %v", err)
	}
	if _, err := exec(t, f.sb, worker.ToolMoveFile, `{"from": "sub/b.txt", "to": "../outside/b.txt"}`); !errors.Is(err, worker.ErrEscape) {
		t.Errorf("move out: %v", err)
	}
	if _, err := exec(t, f.sb, worker.ToolMoveFile, `{"from": "out-rel/secret.txt", "to": "stolen.txt"}`); !errors.Is(err, worker.ErrSymlinkEscape) {
		t.Errorf("move in from outside: %v", err)
	}
	if !exists(t, filepath.Join(f.dir, "sub", "b.txt")) || !exists(t, filepath.Join(f.outside, "secret.txt")) || exists(t, filepath.Join(f.dir, "stolen.txt")) {
		t.Fatal("a refused move changed something")
	}
}

func TestCheckArgs(t *testing.T) {
	tests := []struct {
		tool, args string
		wantErr    error
	}{
		{worker.ToolListFiles, ``, nil},
		{worker.ToolListFiles, `null`, nil},
		{worker.ToolListFiles, `{"path": "x", "recursive": true}`, nil},
		{worker.ToolReadFile, `{"path": "x"}`, nil},
		{worker.ToolWriteFile, `{"path": "x", "content": ""}`, nil},
		{worker.ToolDeleteFile, `{"path": "x"}`, nil},
		{worker.ToolMoveFile, `{"from": "x", "to": "y"}`, nil},

		{"rm_rf", `{}`, worker.ErrUnknownTool},
		{"", `{}`, worker.ErrUnknownTool},
		{worker.ToolReadFile, `{}`, worker.ErrMissingArg},
		{worker.ToolReadFile, `{"path": ""}`, worker.ErrMissingArg},
		{worker.ToolWriteFile, `{"path": "x"}`, worker.ErrMissingArg},
		{worker.ToolMoveFile, `{"from": "x"}`, worker.ErrMissingArg},
		{worker.ToolDeleteFile, `{"path": 3}`, worker.ErrBadArg},
		{worker.ToolListFiles, `{"recursive": "yes"}`, worker.ErrBadArg},
		{worker.ToolDeleteFile, `{"pth": "x"}`, worker.ErrBadArg},
		{worker.ToolDeleteFile, `{"PATH": "x"}`, worker.ErrBadArg},
		{worker.ToolDeleteFile, `["x"]`, worker.ErrBadArg},
		{worker.ToolDeleteFile, `"x"`, worker.ErrBadArg},
	}
	for _, tt := range tests {
		t.Run(tt.tool+" "+tt.args, func(t *testing.T) {
			err := worker.CheckArgs(tt.tool, json.RawMessage(tt.args))
			if tt.wantErr == nil && err != nil || !errors.Is(err, tt.wantErr) {
				t.Fatalf("CheckArgs(%s, %s) = %v, want %v", tt.tool, tt.args, err, tt.wantErr)
			}
		})
	}
}

func TestExecCancelled(t *testing.T) {
	f := newSandbox(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := f.sb.Exec(ctx, worker.ToolDeleteFile, json.RawMessage(`{"path": "a.txt"}`)); !errors.Is(err, context.Canceled) {
		t.Fatalf("exec with a cancelled context: %v", err)
	}
	if !exists(t, filepath.Join(f.dir, "a.txt")) {
		t.Fatal("a cancelled exec deleted the file")
	}
}
