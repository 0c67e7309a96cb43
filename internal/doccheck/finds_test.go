package doccheck_test

import (
	"strings"
	"testing"
)

// The docs test finds what it is for: each Markdown here has one mistake,
// which must be reported, at its line; the last ones none.
func TestDocCheckFinds(t *testing.T) {
	fence := "```"
	for _, tc := range []struct {
		name, md, want string
	}{
		{"policy without version", fence + "yaml\nrules:\n  - {name: r, tools: [t], action: allow}\n" + fence + "\n", "x.md:1: yaml block of line 1: the policy does not load (broker policy check): x.md:2: version: missing"},
		{"approver not a principal", fence + "yaml\nversion: 1\nrules:\n  - {name: r, tools: [t], action: require_approval, approvers: [carol]}\n" + fence + "\n", `not a principal`},
		{"secret named like a flag", fence + "yaml\npolicy: p.yaml\nwebhooks:\n  inbound:\n    - {name: ci, secret_env: ASSENT_HOOK, principal: ci}\n" + fence + "\n", "x.md:5: yaml block of line 1: secret_env: ASSENT_HOOK"},
		{"exported variable of no flag", fence + "sh\nexport ASSENT_HOOK=x\n" + fence + "\n", "x.md:2: sh block of line 1: ASSENT_HOOK names no flag"},
		{"misspelt flag", fence + "sh\ngo run ./cmd/broker \\\n  --polcy policy.yaml\n" + fence + "\n", "x.md:2: sh block of line 1: broker has no flag --polcy"},
		{"misspelt command", fence + "sh\nbroker polcy check p.yaml\n" + fence + "\n", `"polcy" is no command of broker`},
		{"no such program", fence + "sh\ngo run ./cmd/brokr\n" + fence + "\n", "go run ./cmd/brokr: no such program"},
		{"unknown tool", fence + "sh\nfrobnicate --all\n" + fence + "\n", "frobnicate: a program this test does not know"},
		{"script option", fence + "sh\ndeploy/local/run.sh --ports 4000\n" + fence + "\n", "deploy/local/run.sh has no option --ports"},
		{"no info string", fence + "\nls\n" + fence + "\n", "no info string"},
		{"event that does not decode", fence + "json\n{\"specversion\": \"1.0\", \"id\": \"a b\", \"type\": \"dev.assent.approval.requested\", \"source\": \"x\", \"data\": {}}\n" + fence + "\n", "the event does not decode"},
		{"Go fragment", fence + "go\nx := 1\n" + fence + "\n", "not a complete program"},
		{"Go that does not build", fence + "go\npackage main\n\nfunc main() { undefined() }\n" + fence + "\n", "go vet"},
		{"policy run by its command", fence + "yaml\n# p.yaml\nversion: 1\n" + fence + "\n\n" + fence + "console\n$ broker policy check p.yaml\nall good\n" + fence + "\n", `prints, from this line on, "p.yaml: ok`},
		{"gateway named otherwise than the policy says", fence + "yaml\nversion: 1\nrules:\n  - {name: ro, tools: [t], labels: {mcp_server: fs}, action: allow}\n" + fence + "\n\n" +
			fence + "json\n{\"mcpServers\": {\"f\": {\"command\": \"mcp-gateway\", \"args\": [\"--\", \"agent-worker\", \"mcp\"]}}}\n" + fence + "\n", "upstreams are named [agent-worker]"},
		{"excerpt that is not", fence + "yaml excerpt examples/policies/read-only.yaml\nrules:\n  - name: nothing-like-it\n" + fence + "\n", `has no line "- name: nothing-like-it"`},
		{"event published that does not decode", fence + "sh\nnats pub \"assent.response.alice.$ID\" '{\"specversion\":\"1.0\",\"id\":\"'\"$(uuidgen)\"'\",\"type\":\"dev.assent.approval.responded\",\"source\":\"approver/alice\",\"data\":{\"decision\":\"maybe\"}}'\n" + fence + "\n", "the event does not decode"},
		{"body that is not JSON", fence + "sh\ncurl -s -X POST \"http://127.0.0.1:8080/v1/approvals/$ID/decision\" -d '{\"decision\": approve}'\n" + fence + "\n", "not JSON"},
		{"marked", "<!-- not checked: made up -->\n" + fence + "yaml\nnot: [valid\n" + fence + "\n", ""},
		{"text", fence + "text\nanything\n" + fence + "\n", ""},
		{"a whole policy", fence + "yaml\nversion: 1\nprincipals:\n  carol: {}\nrules:\n  - {name: r, tools: [t], action: require_approval, approvers: [carol]}\n" + fence + "\n", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var problems, ran []string
			d := &doc{t: t, file: "x.md", dir: t.TempDir(), files: map[string]string{}, ran: &ran, problems: &problems}
			d.checkAll(tc.md, map[string]int{})
			if tc.want == "" {
				if len(problems) > 0 {
					t.Errorf("problems in a good document: %q", problems)
				}
				return
			}
			for _, p := range problems {
				if strings.Contains(p, tc.want) {
					return
				}
			}
			t.Errorf("no problem %q reported; reported: %q", tc.want, problems)
		})
	}
}
