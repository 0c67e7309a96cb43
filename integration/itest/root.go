package itest

import (
	"os"
	"path/filepath"
	"sync"
)

var root struct {
	once sync.Once
	dir  string
}

// RepoRoot returns the module's root directory: the nearest directory, from
// the test's working directory up, that holds a go.mod. Tests run in their
// package's directory, which differs between the packages that use itest.
func RepoRoot() string {
	root.once.Do(func() {
		dir, err := os.Getwd()
		if err != nil {
			panic(err)
		}
		for d := dir; ; d = filepath.Dir(d) {
			if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
				root.dir = d
				return
			}
			if filepath.Dir(d) == d {
				panic("itest: no go.mod above " + dir)
			}
		}
	})
	return root.dir
}

// RepoPath returns the path of rel (slash-separated, relative to the module's
// root).
func RepoPath(rel string) string {
	return filepath.Join(RepoRoot(), filepath.FromSlash(rel))
}
