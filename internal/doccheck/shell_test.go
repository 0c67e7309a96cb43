package doccheck_test

import (
	"reflect"
	"testing"

	"github.com/assent-dev/assent/internal/doccheck"
)

func TestCommands(t *testing.T) {
	for _, tc := range []struct {
		text string
		want []doccheck.Command
	}{
		{"go run ./cmd/broker   # comment\n", []doccheck.Command{{Args: []string{"go", "run", "./cmd/broker"}}}},
		{"ID=$(uuidgen)\nnats sub \"assent.decision.$ID\" --count 1 &\n", []doccheck.Command{
			{Env: []string{"ID=$(uuidgen)"}},
			{Line: 1, Args: []string{"nats", "sub", "assent.decision.$ID", "--count", "1"}},
		}},
		{"curl -s x \\\n  -d '{\"a\":\n 1}' | jq -r .id\n", []doccheck.Command{
			{Args: []string{"curl", "-s", "x", "-d", "{\"a\":\n 1}"}},
			{Line: 2, Args: []string{"jq", "-r", ".id"}},
		}},
		{"(cd /tmp && go build -o /tmp/b ./cmd/broker) 2>/dev/null\n", []doccheck.Command{
			{Args: []string{"cd", "/tmp"}},
			{Args: []string{"go", "build", "-o", "/tmp/b", "./cmd/broker"}},
		}},
		{"for i in 1 2; do\n  x --y \"$i\"\ndone\n", []doccheck.Command{{Line: 1, Args: []string{"x", "--y", "$i"}}}},
		{"export A=1 B=\"two words\"\n", []doccheck.Command{{Env: []string{"A=1", "B=two words"}}}},
		{"broker restore --from DIR [--nats-url URL | --data DIR] [--force]\n", []doccheck.Command{
			{Args: []string{"broker", "restore", "--from", "DIR", "[--nats-url", "URL", "|", "--data", "DIR]", "[--force]"}, Synopsis: true},
		}},
		{"echo x >\"$out/f\"; cat <in\n", []doccheck.Command{{Args: []string{"echo", "x"}}, {Args: []string{"cat"}}}},
	} {
		if got := doccheck.Commands(tc.text); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("Commands(%q):\n got %#v\nwant %#v", tc.text, got, tc.want)
		}
	}
}

func TestExtract(t *testing.T) {
	md := "# t\n\n```sh\nls\n```\n\n<!-- not checked: an excerpt -->\n````yaml excerpt\na: 1\n```\nb: 2\n````\n\n1. item\n\n   ```json\n   {}\n   ```\n~~~\nx\n~~~\nuse `` ```x``` `` inline\n"
	got := doccheck.Extract("f.md", md)
	want := []doccheck.Block{
		{File: "f.md", Line: 3, Lang: "sh", Attrs: nil, Text: "ls\n"},
		{File: "f.md", Line: 8, Lang: "yaml", Attrs: []string{"excerpt"}, Text: "a: 1\n```\nb: 2\n", NotChecked: "an excerpt"},
		{File: "f.md", Line: 16, Lang: "json", Attrs: nil, Text: "{}\n"},
		{File: "f.md", Line: 19, Text: "x\n"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Extract:\n got %#v\nwant %#v", got, want)
	}
	if w := got[1].Where(); w != "f.md:8" {
		t.Errorf("Where: %s", w)
	}
}
