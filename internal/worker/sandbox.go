package worker

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// Errors about paths; branch on them with errors.Is.
var (
	// ErrEscape: the path leads outside the sandbox (an absolute path
	// elsewhere, or ".." climbing above the sandbox root).
	ErrEscape = errors.New("path escapes the sandbox")
	// ErrSymlinkEscape: a symbolic link on the path leads outside the sandbox,
	// or is absolute (only relative links inside the sandbox are followed). It
	// also matches ErrEscape.
	ErrSymlinkEscape = fmt.Errorf("%w through a symbolic link", ErrEscape)
	// ErrBadPath: the path is empty, holds a NUL byte, names the sandbox root
	// where a file is needed, or has too many levels of symbolic links.
	ErrBadPath = errors.New("bad path")
)

// maxSymlinkHops bounds link expansion while resolving one path, as the
// kernel's ELOOP does.
const maxSymlinkHops = 40

// Sandbox is a directory that the tools may not leave. It is safe for
// concurrent use.
type Sandbox struct {
	dir  string // absolute, as given
	real string // dir with symbolic links evaluated
	root *os.Root
}

// OpenSandbox opens dir, which must be an existing directory, as a sandbox.
// Close it when done.
func OpenSandbox(dir string) (*Sandbox, error) {
	if dir == "" {
		return nil, fmt.Errorf("sandbox: %w: empty directory name", ErrBadPath)
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: %w", dir, err)
	}
	real, err := filepath.EvalSymlinks(abs)
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: %w", dir, err)
	}
	fi, err := os.Stat(real)
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: %w", dir, err)
	}
	if !fi.IsDir() {
		return nil, fmt.Errorf("sandbox %s: not a directory", dir)
	}
	root, err := os.OpenRoot(real)
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: %w", dir, err)
	}
	return &Sandbox{dir: abs, real: real, root: root}, nil
}

// Dir returns the sandbox directory as an absolute path.
func (s *Sandbox) Dir() string { return s.dir }

// Close releases the sandbox's directory handle. It is safe to call twice.
func (s *Sandbox) Close() error {
	err := s.root.Close()
	if errors.Is(err, os.ErrClosed) {
		return nil
	}
	return err
}

// Resolve checks that p names a place inside the sandbox and returns it as a
// clean path relative to the sandbox root ("." for the root itself). p may be
// relative to the root or absolute (under the sandbox directory, as given or
// with its symbolic links evaluated). The place need not exist yet.
//
// An absolute path elsewhere or a ".." that climbs above the root gives an
// error wrapping ErrEscape; a symbolic link on the way that leads outside, or
// is absolute, one wrapping ErrSymlinkEscape; an empty path, a NUL byte or a
// link loop one wrapping ErrBadPath.
func (s *Sandbox) Resolve(p string) (string, error) {
	if p == "" {
		return "", fmt.Errorf("%w: empty path", ErrBadPath)
	}
	if strings.IndexByte(p, 0) >= 0 {
		return "", fmt.Errorf("%w: %q holds a NUL byte", ErrBadPath, p)
	}
	var rel string
	if filepath.IsAbs(p) {
		c := filepath.Clean(p)
		r, ok := within(s.real, c)
		if !ok {
			r, ok = within(s.dir, c)
		}
		if !ok {
			return "", fmt.Errorf("%w: %s is outside the sandbox %s", ErrEscape, p, s.dir)
		}
		rel = r
	} else {
		rel = filepath.Clean(p)
		if isDotDot(rel) {
			return "", fmt.Errorf("%w: %s climbs above the sandbox root with ..", ErrEscape, p)
		}
	}
	if err := s.checkLinks(p, rel); err != nil {
		return "", err
	}
	return rel, nil
}

// checkLinks walks rel from the sandbox root, expanding every symbolic link
// it meets the way the kernel would, and fails if the walk leaves the root.
// Components that do not exist are taken as written.
func (s *Sandbox) checkLinks(p, rel string) error {
	pending := splitPath(rel)
	cur := "" // resolved so far, relative to the root, free of links
	link := ""
	hops := 0
	for len(pending) > 0 {
		c := pending[0]
		pending = pending[1:]
		switch c {
		case "", ".":
			continue
		case "..":
			if cur == "" {
				return fmt.Errorf("%w: %s: link %s leads outside the sandbox", ErrSymlinkEscape, p, link)
			}
			cur = filepath.Dir(cur)
			if cur == "." {
				cur = ""
			}
			continue
		}
		next := filepath.Join(cur, c)
		fi, err := os.Lstat(filepath.Join(s.real, next))
		if err != nil || fi.Mode()&fs.ModeSymlink == 0 {
			// A file, a directory, or nothing yet: the tool will say which
			// if that is a problem.
			cur = next
			continue
		}
		if hops++; hops > maxSymlinkHops {
			return fmt.Errorf("%w: %s: too many levels of symbolic links", ErrBadPath, p)
		}
		target, err := os.Readlink(filepath.Join(s.real, next))
		if err != nil {
			return fmt.Errorf("resolve %s: %w", p, err)
		}
		link = filepath.ToSlash(next) + " -> " + target
		if filepath.IsAbs(target) {
			return fmt.Errorf("%w: %s: link %s is absolute (only relative links inside the sandbox are followed)", ErrSymlinkEscape, p, link)
		}
		pending = append(splitPath(target), pending...)
	}
	return nil
}

// within returns target relative to base, if target is base or beneath it.
func within(base, target string) (string, bool) {
	r, err := filepath.Rel(base, target)
	if err != nil || isDotDot(r) {
		return "", false
	}
	return r, true
}

func isDotDot(rel string) bool {
	return rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator))
}

func splitPath(p string) []string {
	return strings.Split(filepath.ToSlash(p), "/")
}

// DemoMarker is the file that marks a directory as a demo sandbox made by
// InitDemoSandbox, which may therefore be reset.
const DemoMarker = ".assent-demo-sandbox"

// ErrNotDemoSandbox: InitDemoSandbox refuses to touch a non-empty directory
// that it did not make.
var ErrNotDemoSandbox = errors.New("directory is not empty and is not a demo sandbox")

// demoFiles is what a demo sandbox holds, to go with examples/plan.json.
var demoFiles = map[string]string{
	DemoMarker:          "This directory was made by agent-worker --init-sandbox and is reset by it.\n",
	"README.txt":        "A demo sandbox for the Assent agent worker.\nEvery path the worker touches stays in here.\n",
	"old-report.csv":    "quarter,revenue\nQ1,100\nQ2,120\n",
	"scratch.tmp":       "temporary notes, safe to delete\n",
	"inbox/todo.txt":    "- review the Q3 report\n- archive the inbox\n",
	"inbox/meeting.txt": "Monday 10:00, room 4\n",
}

// InitDemoSandbox makes dir a fresh demo sandbox with a few files to go with
// examples/plan.json. A missing dir is created; an empty one, or a demo sandbox
// made earlier (it holds DemoMarker), is reset. Any other non-empty directory
// is left alone and ErrNotDemoSandbox is returned.
func InitDemoSandbox(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("init sandbox: %w", err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("init sandbox: %w", err)
	}
	if len(entries) > 0 {
		if _, err := os.Lstat(filepath.Join(dir, DemoMarker)); err != nil {
			return fmt.Errorf("init sandbox %s: %w (it has no %s file)", dir, ErrNotDemoSandbox, DemoMarker)
		}
		for _, e := range entries {
			if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
				return fmt.Errorf("init sandbox: reset: %w", err)
			}
		}
	}
	for name, content := range demoFiles {
		p := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return fmt.Errorf("init sandbox: %w", err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			return fmt.Errorf("init sandbox: %w", err)
		}
	}
	return nil
}
