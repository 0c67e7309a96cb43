package itest

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// BrokerAt returns cmd/broker as it was at commit rev of this repository:
// built from that commit's tree, taken from the repository's git history, so
// that tests can run a previous version against what the current one must
// read (a data directory, a NATS account). The binary is kept under the
// user's cache directory, keyed by the commit, and later calls, in this test
// binary or the next, reuse it.
//
// It skips the test when go or git is not on PATH, or when the repository
// lacks the commit (a shallow clone), saying how to fetch it.
func BrokerAt(t testing.TB, rev string) string {
	t.Helper()
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("go is not on PATH; cannot build the broker of " + rev)
	}
	commit := commitOf(t, rev)

	built.mu.Lock()
	defer built.mu.Unlock()
	name := fmt.Sprintf("broker-%s-%s-%s", commit, runtime.GOOS, runtime.GOARCH)
	cache, err := os.UserCacheDir()
	if err == nil {
		cache = filepath.Join(cache, "assent-itest")
		err = os.MkdirAll(cache, 0o755)
	}
	if err != nil {
		// Nowhere to keep it: build it for this test only.
		t.Logf("no cache directory (%v); building the broker of %s for this test only", err, rev)
		cache = t.TempDir()
	}
	path := filepath.Join(cache, name)
	if fi, err := os.Stat(path); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o100 != 0 {
		return path
	}

	src := TreeAt(t, commit)
	tmp, err := os.CreateTemp(cache, name+".*.tmp")
	if err != nil {
		t.Fatal(err)
	}
	tmp.Close()
	defer os.Remove(tmp.Name()) // after a failed build; renamed away otherwise
	cmd := exec.Command(gobin, "build", "-trimpath", "-ldflags=-X main.version="+rev, "-o", tmp.Name(), "./cmd/broker")
	cmd.Dir = src
	// Build that tree as its own module, whatever go.work lies around.
	cmd.Env = append(os.Environ(), "GOWORK=off")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/broker at %s: %v\n%s", rev, err, out)
	}
	// Atomically, so that a concurrent test binary finds a whole file or none.
	if err := os.Rename(tmp.Name(), path); err != nil {
		t.Fatal(err)
	}
	t.Logf("built the broker of %s into %s", rev, path)
	return path
}

// TreeAt returns a directory, removed when the test ends, holding the tree
// of this repository's commit rev, as git archive gives it: a previous
// release to build or run. It skips the test as BrokerAt does when git or
// the commit is missing.
func TreeAt(t testing.TB, rev string) string {
	t.Helper()
	commit := commitOf(t, rev)
	dir := t.TempDir()
	if err := extractCommit(RepoRoot(), commit, dir); err != nil {
		t.Fatalf("extract %s: %v", rev, err)
	}
	return dir
}

// commitOf resolves rev to a commit of this repository, or skips the test
// saying how to get it.
func commitOf(t testing.TB, rev string) string {
	t.Helper()
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("git is not on PATH; cannot read " + rev + " from the repository's history")
	}
	root := RepoRoot()
	commit, err := gitOutput(root, "rev-parse", "--verify", "--quiet", rev+"^{commit}")
	if err != nil {
		how := "fetch it (git fetch origin " + rev + ")"
		if shallow, _ := gitOutput(root, "rev-parse", "--is-shallow-repository"); shallow == "true" {
			how = "this is a shallow clone: run `git fetch --unshallow` to get the whole history"
		}
		t.Skipf("commit %s is not in the repository at %s; %s", rev, root, how)
	}
	return commit
}

func gitOutput(dir string, args ...string) (string, error) {
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	out, err := cmd.Output()
	return strings.TrimSpace(string(out)), err
}

// extractCommit writes the tree of commit into dir, as git archive gives it.
func extractCommit(repo, commit, dir string) error {
	cmd := exec.Command("git", "archive", "--format=tar", commit)
	cmd.Dir = repo
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	xerr := untar(out, dir)
	_, _ = io.Copy(io.Discard, out)
	if err := cmd.Wait(); err != nil {
		return fmt.Errorf("git archive %s: %w: %s", commit, err, stderr.String())
	}
	return xerr
}

// untar writes the directories, files and symbolic links of the tar stream r
// under dir.
func untar(r io.Reader, dir string) error {
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if !filepath.IsLocal(h.Name) {
			return fmt.Errorf("archive entry %q leaves the directory", h.Name)
		}
		path := filepath.Join(dir, filepath.FromSlash(h.Name))
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(path, 0o755); err != nil {
				return err
			}
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
				return err
			}
			f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, os.FileMode(h.Mode)&0o755|0o600)
			if err != nil {
				return err
			}
			_, err = io.Copy(f, tr)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return err
			}
		case tar.TypeSymlink:
			if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
				return err
			}
			if err := os.Symlink(h.Linkname, path); err != nil {
				return err
			}
		}
		// Other entries (git archive's global header) hold no files.
	}
}
