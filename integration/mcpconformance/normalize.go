package mcpconformance

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"unicode/utf8"

	"github.com/assent-dev/assent/internal/mcpgateway"
)

// What two runs of the same script may legitimately differ in, and how a
// transcript is normalised so that they compare equal. Every rule is here,
// each with why; nothing else is loosened. Numbers compare by value and
// objects regardless of key order, since JSON does not distinguish them.
//
// Left out of the comparison:
//
//   - Pings from the server, and the client's answers. Either side may
//     ping at any moment to see the other is alive (a proxy pings its
//     client while a call waits), so their number and place say nothing
//     about what passed through. The script's own pings are steps, kept.
//   - An approval's own messages (approvalOwn): what mcp-gateway adds
//     while it asks Assent, which no upstream sent. A progress notification
//     whose message starts "waiting for approval" (the gateway's keep-alive
//     to a client that asked for progress), an elicitation/create whose
//     message starts "Approve this tool call?" (asking the user in the
//     client), any request or notification whose _meta has a key under
//     "dev.assent/", and the client's answers to those requests; and, in a
//     result, the _meta keys under "dev.assent/" (the Verdict under
//     "dev.assent/decision"). A proxy that marks what it adds with such a
//     _meta key needs no other rule.
//   - A tool error in a step the gateway answered itself, before any
//     decision and without calling its server (refusedSteps: an unknown
//     tool, arguments that break the tool's input schema): the gateway
//     checks such a call before it asks anyone, so what the error says is
//     its own by design. That both sides answer with a tool error is
//     compared (refuse).
//   - The paragraph the gateway adds to the server's instructions
//     (mcpgateway.Instructions), which tells the model calls are approved.
//   - An empty _meta object: it says nothing, and a proxy that removes
//     its own key from a result leaves one where the server sent none.
//
// Replaced by a placeholder:
//
//   - Ids of the server's requests become "<id of a METHOD request>"
//     (also in the client's answers, and in a notifications/cancelled from
//     the server), once each answer is paired with its request. The server
//     numbers its requests as it likes, and a proxy, which may speak for
//     several servers, must number its own. The client's
//     requests are matched by their script step, and their ids become
//     "<request id>": they differ only when an earlier step was skipped.
//     A notifications/cancelled from the client names the step it cancels.
//   - The Mcp-Session-Id, a random UUID, becomes "<session>" wherever the
//     server writes it in a text (server-everything names its session in
//     tool results and logs). Over stdio there is no session and
//     server-everything writes "session undefined", which becomes "session
//     <session>", or writes nothing where over HTTP it writes "from session
//     <id>", which is removed.
//   - Task ids, which the server draws at random, become "<task-n>", n
//     counting the tasks in the order the client's requests created them
//     (then any other task id in the order it first appears).
//   - Timestamps (RFC 3339, such as a task's createdAt and lastUpdatedAt)
//     become "<timestamp>", and times of day in a text ("10:40:04 AM",
//     server-everything's dynamic resources say when they were made)
//     "<time>"; a base64 blob whose text holds a time becomes "<base64 of:
//     TEXT>" with the time replaced, since its bytes change with the time.
//
// Counted as one:
//
//   - A run of identical notifications/resources/updated for one URI: the
//     server sends them on a 5-second timer, so how many fall before the
//     script unsubscribes depends on timing only.

// approvalOwn reports whether a request or notification m, decoded as v,
// is an approval's own message rather than one a server sent.
func approvalOwn(m message, v map[string]any) bool {
	params, _ := v["params"].(map[string]any)
	text, _ := params["message"].(string)
	switch {
	case m.Method == "notifications/progress" && strings.HasPrefix(text, "waiting for approval"):
		return true
	case m.Method == "elicitation/create" && strings.HasPrefix(text, "Approve this tool call?"):
		return true
	}
	meta, _ := params["_meta"].(map[string]any)
	for k := range meta {
		if strings.HasPrefix(k, approvalMetaPrefix) {
			return true
		}
	}
	return false
}

// approvalMetaPrefix starts the _meta keys of what Assent adds.
const approvalMetaPrefix = "dev.assent/"

var (
	timestampRE = regexp.MustCompile(`\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:Z|[+-]\d{2}:\d{2})`)
	timeOfDayRE = regexp.MustCompile(`\b\d{1,2}:\d{2}:\d{2}(?:\.\d+)?(?:\s?[AP]M)?\b`)
)

// normalizer holds what one transcript's rules replace.
type normalizer struct {
	session string
	tasks   map[string]string // task id → "<task-n>"
}

// text normalises a string.
func (n *normalizer) text(s string) string {
	if n.session != "" {
		s = strings.ReplaceAll(s, n.session, "<session>")
	}
	s = strings.ReplaceAll(s, "session undefined", "session <session>")
	s = strings.ReplaceAll(s, " from session <session>", " ")
	for id, label := range n.tasks {
		s = strings.ReplaceAll(s, id, label)
	}
	s = timestampRE.ReplaceAllString(s, "<timestamp>")
	return timeOfDayRE.ReplaceAllString(s, "<time>")
}

// value normalises a decoded JSON value in place and returns it.
func (n *normalizer) value(v any) any {
	switch x := v.(type) {
	case string:
		return n.text(x)
	case []any:
		for i := range x {
			x[i] = n.value(x[i])
		}
		return x
	case map[string]any:
		for k, e := range x {
			if s, ok := e.(string); ok && k == "blob" {
				x[k] = n.blob(s)
				continue
			}
			if s, ok := e.(string); ok && k == "instructions" {
				e = strings.TrimSuffix(strings.TrimSuffix(s, mcpgateway.Instructions), "\n\n")
			}
			x[k] = n.value(e)
		}
		if meta, ok := x["_meta"].(map[string]any); ok {
			for k := range meta {
				if strings.HasPrefix(k, approvalMetaPrefix) {
					delete(meta, k)
				}
			}
			if len(meta) == 0 {
				delete(x, "_meta")
			}
		}
		return x
	}
	return v
}

// blob is a base64 blob, shown as its text when the text holds something
// the rules replace.
func (n *normalizer) blob(s string) string {
	raw, err := base64.StdEncoding.DecodeString(s)
	if err != nil || !utf8.Valid(raw) {
		return s
	}
	if t := n.text(string(raw)); t != string(raw) {
		return "<base64 of: " + t + ">"
	}
	return s
}

// decode decodes a message with numbers kept as written.
func decode(raw []byte) (map[string]any, error) {
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	var v map[string]any
	if err := d.Decode(&v); err != nil {
		return nil, err
	}
	return v, nil
}

// taskIDs numbers the task ids of t: first those the client's requests
// created (a result's task.taskId, in the order of the client's
// requests), then any other taskId in the order it appears.
func taskIDs(msgs []parsed) map[string]string {
	ids := map[string]string{}
	add := func(id string) {
		if id != "" && ids[id] == "" {
			ids[id] = fmt.Sprintf("<task-%d>", len(ids)+1)
		}
	}
	for _, p := range msgs {
		if p.dir == Received && p.kind == kindResponse {
			result, _ := p.v["result"].(map[string]any)
			task, _ := result["task"].(map[string]any)
			id, _ := task["taskId"].(string)
			add(id)
		}
	}
	for _, p := range msgs {
		walk(p.v, func(k string, v any) {
			if s, ok := v.(string); ok && k == "taskId" {
				add(s)
			}
		})
	}
	return ids
}

// walk calls f with every key and value under v.
func walk(v any, f func(key string, v any)) {
	switch x := v.(type) {
	case []any:
		for _, e := range x {
			walk(e, f)
		}
	case map[string]any:
		for k, e := range x {
			f(k, e)
			walk(e, f)
		}
	}
}
