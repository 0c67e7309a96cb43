// Command gendoc writes the table of every program's flags and environment
// variables into docs/configuration.md, between its BEGIN and END lines, and
// the list of those variables into internal/envflag/known.go:
//
//	go generate ./internal/programs
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/assent-dev/assent/internal/programs"
)

func main() {
	doc := flag.String("doc", "docs/configuration.md", "the Markdown `file` to update")
	known := flag.String("known", "internal/envflag/known.go", "the Go `file` to write the variables into")
	flag.Parse()
	err := run(*doc)
	if err == nil {
		var src string
		if src, err = programs.KnownSource(programs.All()); err == nil {
			err = write(*known, src)
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "gendoc:", err)
		os.Exit(1)
	}
}

func run(path string) error {
	old, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	doc, err := programs.UpdateDoc(string(old), programs.All())
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return write(path, doc)
}

// write writes content to path unless path holds it already.
func write(path, content string) error {
	if old, err := os.ReadFile(path); err == nil && string(old) == content {
		fmt.Fprintf(os.Stderr, "gendoc: %s is up to date\n", path)
		return nil
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "gendoc: %s updated\n", path)
	return nil
}
