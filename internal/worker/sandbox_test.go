package worker_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/assent-dev/assent/internal/worker"
)

// sandboxFixture makes base/sb (the sandbox) and base/outside (a secret next
// to it), with symbolic links of every kind inside the sandbox.
type sandboxFixture struct {
	sb      *worker.Sandbox
	dir     string // the sandbox directory
	outside string // a directory next to it
	linkDir string // a symbolic link to the sandbox directory
}

func newSandbox(t testing.TB) sandboxFixture {
	t.Helper()
	base := t.TempDir()
	f := sandboxFixture{dir: filepath.Join(base, "sb"), outside: filepath.Join(base, "outside"), linkDir: filepath.Join(base, "sblink")}
	writeFiles(t, f.dir, map[string]string{"a.txt": "alpha", "sub/b.txt": "beta"})
	writeFiles(t, f.outside, map[string]string{"secret.txt": "secret"})
	links := map[string]string{
		"inlink":        "sub/b.txt",
		"sub/up":        "..",
		"out-rel":       "../outside",
		"out-abs":       f.outside,
		"abs-in":        filepath.Join(f.dir, "a.txt"),
		"dangling-out":  "../outside/new.txt",
		"dangling-in":   "sub/new.txt",
		"sub/deep":      "../../outside",
		"sub/via-up":    "up/out-rel",
		"loop1":         "loop2",
		"loop2":         "loop1",
		"sub/b-sibling": "b.txt",
	}
	for name, target := range links {
		if err := os.Symlink(target, filepath.Join(f.dir, filepath.FromSlash(name))); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(f.dir, f.linkDir); err != nil {
		t.Fatal(err)
	}
	sb, err := worker.OpenSandbox(f.dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sb.Close() })
	f.sb = sb
	return f
}

func TestResolve(t *testing.T) {
	f := newSandbox(t)
	tests := []struct {
		name    string
		path    string
		want    string
		wantErr error
	}{
		{"file", "a.txt", "a.txt", nil},
		{"root", ".", ".", nil},
		{"nested", "sub/b.txt", "sub/b.txt", nil},
		{"dot dot that stays inside", "./sub/../a.txt", "a.txt", nil},
		{"not there yet", "new/dir/file.txt", "new/dir/file.txt", nil},
		{"absolute inside", filepath.Join(f.dir, "sub", "b.txt"), "sub/b.txt", nil},
		{"link inside", "inlink", "inlink", nil},
		{"link to a sibling", "sub/b-sibling", "sub/b-sibling", nil},
		{"link up to the root", "sub/up/a.txt", "sub/up/a.txt", nil},
		{"dangling link inside", "dangling-in", "dangling-in", nil},

		{"empty", "", "", worker.ErrBadPath},
		{"NUL byte", "a\x00b", "", worker.ErrBadPath},
		{"link loop", "loop1", "", worker.ErrBadPath},
		{"dot dot", "..", "", worker.ErrEscape},
		{"dot dot to a sibling", "../outside/secret.txt", "", worker.ErrEscape},
		{"dot dot deeper", "sub/../../outside", "", worker.ErrEscape},
		{"absolute elsewhere", "/etc/passwd", "", worker.ErrEscape},
		{"absolute next door", filepath.Join(f.outside, "secret.txt"), "", worker.ErrEscape},
		{"relative link out", "out-rel/secret.txt", "", worker.ErrSymlinkEscape},
		{"relative link out, itself", "out-rel", "", worker.ErrSymlinkEscape},
		{"absolute link out", "out-abs/secret.txt", "", worker.ErrSymlinkEscape},
		{"absolute link in", "abs-in", "", worker.ErrSymlinkEscape},
		{"dangling link out", "dangling-out", "", worker.ErrSymlinkEscape},
		{"nested link out", "sub/deep/secret.txt", "", worker.ErrSymlinkEscape},
		{"chain of links out", "sub/via-up/secret.txt", "", worker.ErrSymlinkEscape},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := f.sb.Resolve(tt.path)
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("Resolve(%q) = %q, %v; want error %v", tt.path, got, err, tt.wantErr)
				}
				return
			}
			if err != nil || got != filepath.FromSlash(tt.want) {
				t.Fatalf("Resolve(%q) = %q, %v; want %q", tt.path, got, err, tt.want)
			}
		})
	}
}

// A sandbox opened through a link to its directory takes absolute paths
// under either name.
func TestResolveSandboxOpenedThroughLink(t *testing.T) {
	f := newSandbox(t)
	sb, err := worker.OpenSandbox(f.linkDir)
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close() //nolint:errcheck // test
	for _, p := range []string{filepath.Join(f.linkDir, "a.txt"), filepath.Join(f.dir, "a.txt")} {
		if got, err := sb.Resolve(p); err != nil || got != "a.txt" {
			t.Errorf("Resolve(%q) = %q, %v; want a.txt", p, got, err)
		}
	}
	if _, err := sb.Resolve(filepath.Join(f.outside, "secret.txt")); !errors.Is(err, worker.ErrEscape) {
		t.Errorf("outside path: %v", err)
	}
}

func TestSymlinkEscapeIsAnEscape(t *testing.T) {
	if !errors.Is(worker.ErrSymlinkEscape, worker.ErrEscape) {
		t.Fatal("ErrSymlinkEscape does not match ErrEscape")
	}
	if errors.Is(worker.ErrEscape, worker.ErrSymlinkEscape) {
		t.Fatal("ErrEscape matches ErrSymlinkEscape")
	}
}

func TestOpenSandbox(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{"file": "x"})
	for _, p := range []string{"", filepath.Join(dir, "missing"), filepath.Join(dir, "file")} {
		if sb, err := worker.OpenSandbox(p); err == nil {
			_ = sb.Close()
			t.Errorf("OpenSandbox(%q) succeeded", p)
		}
	}
	sb, err := worker.OpenSandbox(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := sb.Close(); err != nil {
		t.Fatal(err)
	}
	if err := sb.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

func TestInitDemoSandbox(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "demo")
	if err := worker.InitDemoSandbox(dir); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{worker.DemoMarker, "old-report.csv", "scratch.tmp", "inbox/todo.txt"} {
		if !exists(t, filepath.Join(dir, filepath.FromSlash(name))) {
			t.Errorf("demo sandbox lacks %s", name)
		}
	}
	// A demo sandbox is reset: extra files go, deleted ones come back.
	writeFiles(t, dir, map[string]string{"extra.txt": "x"})
	if err := os.Remove(filepath.Join(dir, "old-report.csv")); err != nil {
		t.Fatal(err)
	}
	if err := worker.InitDemoSandbox(dir); err != nil {
		t.Fatal(err)
	}
	if exists(t, filepath.Join(dir, "extra.txt")) || !exists(t, filepath.Join(dir, "old-report.csv")) {
		t.Fatal("demo sandbox not reset")
	}
	// Anything else is left alone.
	other := t.TempDir()
	writeFiles(t, other, map[string]string{"precious.txt": "keep"})
	if err := worker.InitDemoSandbox(other); !errors.Is(err, worker.ErrNotDemoSandbox) {
		t.Fatalf("init over a non-empty directory: %v", err)
	}
	if readFile(t, filepath.Join(other, "precious.txt")) != "keep" || exists(t, filepath.Join(other, "README.txt")) {
		t.Fatal("non-demo directory was changed")
	}
}

// Whatever the path, a resolved one stays inside the sandbox, links and all.
func FuzzResolve(f *testing.F) {
	for _, seed := range []string{"a.txt", ".", "..", "../x", "/etc/passwd", "sub/up/a.txt", "sub/up/../../x", "out-rel/secret.txt", "sub/deep", "loop1", "dangling-out", "a\x00b", "sub//b.txt/", "./sub/./up/inlink"} {
		f.Add(seed)
	}
	fx := newSandbox(f)
	f.Fuzz(func(t *testing.T, p string) {
		rel, err := fx.sb.Resolve(p)
		if err != nil {
			return
		}
		if filepath.IsAbs(rel) || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
			t.Fatalf("Resolve(%q) = %q", p, rel)
		}
		real, err := filepath.EvalSymlinks(filepath.Join(fx.dir, rel))
		if err != nil {
			return // does not exist (yet)
		}
		base, _ := filepath.EvalSymlinks(fx.dir)
		if r, err := filepath.Rel(base, real); err != nil || r == ".." || strings.HasPrefix(r, ".."+string(filepath.Separator)) {
			t.Fatalf("Resolve(%q) = %q, which is %s, outside %s", p, rel, real, base)
		}
	})
}
