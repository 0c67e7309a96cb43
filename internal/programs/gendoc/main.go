// Command gendoc writes the table of every program's flags and environment
// variables into docs/configuration.md, between its BEGIN and END lines:
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
	flag.Parse()
	if err := run(*doc); err != nil {
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
	if doc == string(old) {
		fmt.Fprintf(os.Stderr, "gendoc: %s is up to date\n", path)
		return nil
	}
	if err := os.WriteFile(path, []byte(doc), 0o644); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "gendoc: %s updated\n", path)
	return nil
}
