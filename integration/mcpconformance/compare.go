package mcpconformance

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/big"
	"slices"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"
)

// How two transcripts are compared. Each is normalised (normalize.go) and
// cut into units, and units with the same key are compared field by
// field; a unit only one transcript has is a difference too.
//
//   - The client's requests, each with the server's response: keyed by
//     the script step that sent it. The script waits for each response
//     before its next step, so these are in a fixed order; a request
//     without a response (the call the script cancels) is compared with
//     its missing response.
//   - The client's notifications, keyed by step.
//   - The server's requests, each with the client's answer: keyed by
//     method and count ("sampling/createMessage #1").
//   - The server's notifications, keyed by stream and count: progress by
//     progressToken, log messages by logger, resources/updated by URI,
//     tasks/status by task, cancelled by request, anything else by method.
//     Within a stream the order is strict; between streams, and between
//     a notification and the requests and responses around it, it is not,
//     since over streamable HTTP the response to a request and what the
//     server sends outside it travel on different streams, and a proxy
//     may deliver them in either order. One order is checked, since it is
//     not timing but meaning: a progress notification arrives before the
//     response to the request that carried its token.
//   - Responses to no request, and messages that are no JSON-RPC, in the
//     order they came.
//
// Strict about content, then, and tolerant only of interleaving that no
// client can rely on.

// parsed is one message of a transcript, decoded.
type parsed struct {
	at   int // index in the transcript
	dir  Dir
	step string
	m    message
	kind kind
	v    map[string]any
}

// unit is what is compared between transcripts.
type unit struct {
	// stream is what the unit is matched within: a client's request by
	// its step (one unit), a server's notifications by stream (many).
	stream string
	// msgs are the unit's messages (a request and its response), as
	// compared; a missing one is nil.
	names []string
	msgs  []map[string]any
	at    []int // their indexes, -1 when missing
	// order is a broken ordering rule, empty when none.
	order string
}

// Difference is one way two transcripts differ.
type Difference struct {
	// Unit names what differs: "client request tools/list page 1 (tools/list)".
	Unit string
	// AAt and BAt are the indexes of the messages in each transcript
	// ("#12", "-" when it has none).
	AAt, BAt string
	// Path is where in the message: "response $.result.tools[name=echo].title".
	Path string
	// A and B are the values, as JSON, or "<absent>".
	A, B string
}

// Report is the comparison of two transcripts.
type Report struct {
	A, B        string // the transcripts' names
	Differences []Difference
}

// Equal reports whether no difference was found.
func (r Report) Equal() bool { return len(r.Differences) == 0 }

// String renders every difference, one a line, grouped by unit.
func (r Report) String() string {
	if r.Equal() {
		return fmt.Sprintf("%s and %s: no difference", r.A, r.B)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%d difference(s) between %s (A) and %s (B):\n", len(r.Differences), r.A, r.B)
	last := ""
	for _, d := range r.Differences {
		if d.Unit != last {
			fmt.Fprintf(&b, "%s [A %s, B %s]\n", d.Unit, d.AAt, d.BAt)
			last = d.Unit
		}
		fmt.Fprintf(&b, "    %s\n        A: %s\n        B: %s\n", d.Path, d.A, d.B)
	}
	return b.String()
}

// Compare normalises a and b and reports every difference between them.
//
// Units are matched within their stream: the longest common subsequence
// of equal units is matched first, then what is left between two matches
// is paired in order (and compared field by field), and the rest is only
// in one transcript. So one extra or missing message is one difference,
// not a shift of all that follow.
func Compare(a, b Transcript) Report {
	refused := refusedSteps(a)
	for step := range refusedSteps(b) {
		refused[step] = true
	}
	ua, ub := units(a, refused), units(b, refused)
	var order []string
	ga, gb := map[string][]*unit{}, map[string][]*unit{}
	for i := range ua {
		if ga[ua[i].stream] == nil {
			order = append(order, ua[i].stream)
		}
		ga[ua[i].stream] = append(ga[ua[i].stream], &ua[i])
	}
	for i := range ub {
		if ga[ub[i].stream] == nil && gb[ub[i].stream] == nil {
			order = append(order, ub[i].stream)
		}
		gb[ub[i].stream] = append(gb[ub[i].stream], &ub[i])
	}
	r := Report{A: a.Name, B: b.Name}
	for _, stream := range order {
		for _, p := range align(ga[stream], gb[stream]) {
			r.Differences = append(r.Differences, compareUnit(p.name, p.a, p.b)...)
		}
	}
	return r
}

// pair is a unit of each transcript matched, or one alone.
type pair struct {
	name string
	a, b *unit
}

// align matches the units of one stream (see Compare).
func align(a, b []*unit) []pair {
	// lcs[i][j]: length of the longest common subsequence of a[i:], b[j:].
	lcs := make([][]int, len(a)+1)
	for i := range lcs {
		lcs[i] = make([]int, len(b)+1)
	}
	for i := len(a) - 1; i >= 0; i-- {
		for j := len(b) - 1; j >= 0; j-- {
			if sameUnit(a[i], b[j]) {
				lcs[i][j] = lcs[i+1][j+1] + 1
			} else {
				lcs[i][j] = max(lcs[i+1][j], lcs[i][j+1])
			}
		}
	}
	name := func(u *unit, i int, n int, side string) string {
		if n == 1 && strings.HasPrefix(u.stream, "client ") {
			return u.stream
		}
		return fmt.Sprintf("%s #%d%s", u.stream, i+1, side)
	}
	var out []pair
	var gapA, gapB []int
	flush := func() {
		for k := 0; k < len(gapA) || k < len(gapB); k++ {
			switch {
			case k < len(gapA) && k < len(gapB):
				out = append(out, pair{name(a[gapA[k]], gapA[k], len(a), ""), a[gapA[k]], b[gapB[k]]})
			case k < len(gapA):
				out = append(out, pair{name(a[gapA[k]], gapA[k], len(a), ""), a[gapA[k]], nil})
			default:
				out = append(out, pair{name(b[gapB[k]], gapB[k], len(b), " of B"), nil, b[gapB[k]]})
			}
		}
		gapA, gapB = nil, nil
	}
	i, j := 0, 0
	for i < len(a) || j < len(b) {
		switch {
		case i < len(a) && j < len(b) && sameUnit(a[i], b[j]) && lcs[i][j] == lcs[i+1][j+1]+1:
			flush()
			out = append(out, pair{name(a[i], i, len(a), ""), a[i], b[j]})
			i++
			j++
		case j >= len(b) || i < len(a) && lcs[i+1][j] >= lcs[i][j+1]:
			gapA = append(gapA, i)
			i++
		default:
			gapB = append(gapB, j)
			j++
		}
	}
	flush()
	return out
}

// sameUnit reports whether a and b compare equal.
func sameUnit(a, b *unit) bool { return len(compareUnit("", a, b)) == 0 }

func atString(u *unit) string {
	if u == nil {
		return "-"
	}
	var s []string
	for _, at := range u.at {
		if at >= 0 {
			s = append(s, "#"+strconv.Itoa(at))
		}
	}
	if len(s) == 0 {
		return "-"
	}
	return strings.Join(s, ",")
}

func compareUnit(name string, a, b *unit) []Difference {
	d := Difference{Unit: name, AAt: atString(a), BAt: atString(b)}
	if a == nil || b == nil {
		d.Path = "(the whole exchange)"
		d.A, d.B = "<absent>", "<absent>"
		if a != nil {
			d.A = renderUnit(a)
		} else {
			d.B = renderUnit(b)
		}
		return []Difference{d}
	}
	var out []Difference
	for i, name := range a.names {
		var diffs []pathDiff
		diffValue(&diffs, "$", anyOrAbsent(a.msgs[i]), anyOrAbsent(b.msgs[i]))
		for _, pd := range diffs {
			e := d
			e.Path = name + " " + pd.path
			e.A, e.B = pd.a, pd.b
			out = append(out, e)
		}
	}
	if a.order != b.order {
		e := d
		e.Path = "(order)"
		e.A, e.B = orString(a.order), orString(b.order)
		out = append(out, e)
	}
	return out
}

func orString(s string) string {
	if s == "" {
		return "in order"
	}
	return s
}

func anyOrAbsent(m map[string]any) any {
	if m == nil {
		return absent{}
	}
	return m
}

func renderUnit(u *unit) string {
	var s []string
	for i, m := range u.msgs {
		if m != nil {
			s = append(s, u.names[i]+" "+render(m))
		} else {
			s = append(s, u.names[i]+" <none>")
		}
	}
	return strings.Join(s, "; ")
}

// absent stands for a value one side does not have.
type absent struct{}

type pathDiff struct{ path, a, b string }

// diffValue appends where x and y differ under path.
func diffValue(out *[]pathDiff, path string, x, y any) {
	switch xv := x.(type) {
	case map[string]any:
		if yv, ok := y.(map[string]any); ok {
			keys := map[string]bool{}
			for k := range xv {
				keys[k] = true
			}
			for k := range yv {
				keys[k] = true
			}
			for _, k := range sortedKeys(keys) {
				xe, xok := xv[k]
				ye, yok := yv[k]
				if !xok {
					xe = absent{}
				}
				if !yok {
					ye = absent{}
				}
				diffValue(out, path+"."+pathKey(k), xe, ye)
			}
			return
		}
	case []any:
		if yv, ok := y.([]any); ok {
			diffArray(out, path, xv, yv)
			return
		}
	case json.Number:
		if yv, ok := y.(json.Number); ok {
			if !sameNumber(xv, yv) {
				*out = append(*out, pathDiff{path, render(x), render(y)})
			}
			return
		}
	case absent:
		if _, ok := y.(absent); ok {
			return
		}
	default:
		if x == y {
			return
		}
	}
	*out = append(*out, pathDiff{path, render(x), render(y)})
}

// arrayKeys are the fields by which the elements of a list (tools,
// prompts, resources, templates, tasks, roots) are matched, rather than
// by position, so that one missing element shows as one difference.
var arrayKeys = []string{"name", "uri", "uriTemplate", "taskId"}

func diffArray(out *[]pathDiff, path string, x, y []any) {
	if key := keyOf(x, y); key != "" {
		xi, yi := index(x, key), index(y, key)
		var xo, yo []string
		for _, e := range x {
			k := e.(map[string]any)[key].(string)
			if _, ok := yi[k]; ok {
				xo = append(xo, k)
			}
			ye, ok := yi[k]
			if !ok {
				ye = absent{}
			}
			diffValue(out, fmt.Sprintf("%s[%s=%s]", path, key, k), e, ye)
		}
		for _, e := range y {
			k := e.(map[string]any)[key].(string)
			if _, ok := xi[k]; !ok {
				diffValue(out, fmt.Sprintf("%s[%s=%s]", path, key, k), absent{}, e)
			} else {
				yo = append(yo, k)
			}
		}
		if !slices.Equal(xo, yo) {
			*out = append(*out, pathDiff{path + " (order)", strings.Join(xo, ", "), strings.Join(yo, ", ")})
		}
		return
	}
	for i := 0; i < len(x) || i < len(y); i++ {
		var xe, ye any = absent{}, absent{}
		if i < len(x) {
			xe = x[i]
		}
		if i < len(y) {
			ye = y[i]
		}
		diffValue(out, fmt.Sprintf("%s[%d]", path, i), xe, ye)
	}
}

// keyOf is the field of arrayKeys every element of x and y is an object
// with, as a string unique in each; empty when there is none.
func keyOf(x, y []any) string {
	if len(x) == 0 && len(y) == 0 {
		return ""
	}
	for _, key := range arrayKeys {
		if uniqueKey(x, key) && uniqueKey(y, key) {
			return key
		}
	}
	return ""
}

func uniqueKey(list []any, key string) bool {
	seen := map[string]bool{}
	for _, e := range list {
		m, ok := e.(map[string]any)
		if !ok {
			return false
		}
		s, ok := m[key].(string)
		if !ok || seen[s] {
			return false
		}
		seen[s] = true
	}
	return true
}

func index(list []any, key string) map[string]any {
	out := map[string]any{}
	for _, e := range list {
		out[e.(map[string]any)[key].(string)] = e
	}
	return out
}

func sameNumber(a, b json.Number) bool {
	if a == b {
		return true
	}
	x, ok1 := new(big.Rat).SetString(string(a))
	y, ok2 := new(big.Rat).SetString(string(b))
	return ok1 && ok2 && x.Cmp(y) == 0
}

func sortedKeys(m map[string]bool) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// pathKey writes a key as a JSON path segment: bare when it is a plain
// identifier, else quoted.
func pathKey(k string) string {
	for i, r := range k {
		if !(r == '_' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || i > 0 && r >= '0' && r <= '9') {
			return strconv.Quote(k)
		}
	}
	if k == "" {
		return `""`
	}
	return k
}

// maxRender bounds how much of a value a difference shows.
const maxRender = 240

// render is v as compact JSON, cut to maxRender bytes.
func render(v any) string {
	if _, ok := v.(absent); ok {
		return "<absent>"
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return fmt.Sprintf("%v", v)
	}
	b := bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
	if len(b) > maxRender {
		cut := maxRender
		for cut > 0 && !utf8.RuneStart(b[cut]) {
			cut--
		}
		return fmt.Sprintf("%s… (%d bytes)", b[:cut], len(b))
	}
	return string(b)
}

// units normalises t and cuts it into what Compare compares.
func units(t Transcript, refused map[string]bool) []unit {
	var msgs []parsed
	for i, e := range t.Entries {
		v, err := decode(e.Msg)
		p := parsed{at: i, dir: e.Dir, step: e.Step, v: v}
		if err == nil {
			p.m, _ = parseMessage(e.Msg)
			p.kind = p.m.kind()
		} else {
			p.v = map[string]any{"undecodable": string(e.Msg)}
		}
		msgs = append(msgs, p)
	}
	msgs = dropUncompared(msgs)

	n := &normalizer{session: t.Session, tasks: taskIDs(msgs)}
	// Labels of the requests each side made, by their id.
	serverLabel := map[string]string{} // the server's requests: their method
	clientStep := map[string]string{}  // the client's requests: their step
	for _, p := range msgs {
		switch {
		case p.kind == kindRequest && p.dir == Received:
			serverLabel[p.m.idKey()] = p.m.Method
		case p.kind == kindRequest && p.dir == Sent:
			step := p.step
			if step == "" {
				step = p.m.Method + " id " + p.m.idKey()
			}
			clientStep[p.m.idKey()] = step
		}
	}
	for i := range msgs {
		p := &msgs[i]
		if p.kind == kindResponse && p.dir == Received && refused[clientStep[p.m.idKey()]] {
			refuse(p.v)
		}
		n.value(p.v)
		relabel(p, serverLabel, clientStep)
	}

	var out []unit
	byReq := map[string]int{} // "dir id" of a request → its unit
	lastInStream := map[string]map[string]any{}
	for _, p := range msgs {
		switch p.kind {
		case kindRequest:
			stream := "server request " + p.m.Method
			if p.dir == Sent {
				stream = "client request " + clientStep[p.m.idKey()] + " (" + p.m.Method + ")"
			}
			byReq[p.dir.String()+" "+p.m.idKey()] = len(out)
			out = append(out, unit{stream: stream, names: []string{"request", "response"},
				msgs: []map[string]any{p.v, nil}, at: []int{p.at, -1}})
		case kindResponse:
			other := Sent
			if p.dir == Sent {
				other = Received
			}
			if i, ok := byReq[other.String()+" "+p.m.idKey()]; ok && out[i].msgs[1] == nil {
				out[i].msgs[1], out[i].at[1] = p.v, p.at
				continue
			}
			out = append(out, unit{stream: p.dir.String() + " response to no request",
				names: []string{"message"}, msgs: []map[string]any{p.v}, at: []int{p.at}})
		case kindNotification:
			stream := "client notification " + p.step + " (" + p.m.Method + ")"
			if p.dir == Received {
				stream = "server notification " + streamOf(p)
				if p.m.Method == "notifications/resources/updated" && sameJSON(lastInStream[stream], p.v) {
					continue // a run of identical updates counts as one
				}
				lastInStream[stream] = p.v
			}
			out = append(out, unit{stream: stream, names: []string{"notification"}, msgs: []map[string]any{p.v}, at: []int{p.at}})
		default:
			out = append(out, unit{stream: p.dir.String() + " invalid message",
				names: []string{"message"}, msgs: []map[string]any{p.v}, at: []int{p.at}})
		}
	}
	checkProgressOrder(out, msgs)
	return out
}

// dropUncompared leaves out the server's pings and an approval's own
// messages, with the client's answers to them (normalize.go).
func dropUncompared(msgs []parsed) []parsed {
	dropped := map[string]bool{} // ids of the server's requests left out
	var out []parsed
	for _, p := range msgs {
		switch {
		case p.dir == Received && p.kind == kindRequest && (p.m.Method == "ping" || approvalOwn(p.m, p.v)):
			dropped[p.m.idKey()] = true
			continue
		case p.dir == Received && p.kind == kindNotification && approvalOwn(p.m, p.v):
			continue
		case p.dir == Sent && p.kind == kindResponse && dropped[p.m.idKey()]:
			continue
		}
		out = append(out, p)
	}
	return out
}

// relabel replaces request ids by what they stand for (normalize.go).
func relabel(p *parsed, serverLabel, clientStep map[string]string) {
	id := p.m.idKey()
	switch {
	case (p.kind == kindRequest && p.dir == Received) || (p.kind == kindResponse && p.dir == Sent):
		if l, ok := serverLabel[id]; ok {
			p.v["id"] = "<id of a " + l + " request>"
		}
	case (p.kind == kindRequest && p.dir == Sent) || (p.kind == kindResponse && p.dir == Received):
		if _, ok := clientStep[id]; ok {
			p.v["id"] = "<request id>"
		}
	case p.kind == kindNotification && p.m.Method == "notifications/cancelled":
		params, _ := p.v["params"].(map[string]any)
		rid, ok := params["requestId"]
		if !ok {
			return
		}
		key := string(compact([]byte(render(rid))))
		if p.dir == Sent {
			if s, ok := clientStep[key]; ok {
				params["requestId"] = "<id of " + s + ">"
			}
		} else if l, ok := serverLabel[key]; ok {
			params["requestId"] = "<id of a " + l + " request>"
		}
	}
}

// streamOf is the stream a server's notification belongs to.
func streamOf(p parsed) string {
	params, _ := p.v["params"].(map[string]any)
	field := map[string]string{
		"notifications/progress":          "progressToken",
		"notifications/message":           "logger",
		"notifications/resources/updated": "uri",
		"notifications/tasks/status":      "taskId",
		"notifications/cancelled":         "requestId",
	}[p.m.Method]
	if field == "" {
		return p.m.Method
	}
	v, ok := params[field]
	if !ok {
		return fmt.Sprintf("%s (no %s)", p.m.Method, field)
	}
	return fmt.Sprintf("%s %s=%s", p.m.Method, field, render(v))
}

// checkProgressOrder marks the progress notifications that came after the
// response to the request that carried their token.
func checkProgressOrder(out []unit, msgs []parsed) {
	responseAt := map[string]int{} // progress token (as JSON) → index of the response to its request
	step := map[string]string{}
	for _, u := range out {
		req := u.msgs[0]
		if len(u.msgs) != 2 || req == nil || u.at[1] < 0 {
			continue
		}
		params, _ := req["params"].(map[string]any)
		meta, _ := params["_meta"].(map[string]any)
		if tok, ok := meta["progressToken"]; ok {
			responseAt[render(tok)] = u.at[1]
			step[render(tok)] = u.stream
		}
	}
	for i := range out {
		u := &out[i]
		if len(u.msgs) != 1 || !strings.HasPrefix(u.stream, "server notification notifications/progress ") {
			continue
		}
		params, _ := u.msgs[0]["params"].(map[string]any)
		tok := render(params["progressToken"])
		if at, ok := responseAt[tok]; ok && u.at[0] > at {
			u.order = "after the response to " + step[tok]
		}
	}
}

func sameJSON(a, b map[string]any) bool {
	if a == nil || b == nil {
		return false
	}
	var d []pathDiff
	diffValue(&d, "$", a, b)
	return len(d) == 0
}

// refusedSteps are the script steps whose tools/call the gateway answered
// itself, before any decision and without calling its server (an unknown
// tool, arguments that break the tool's input schema): their result's
// Verdict has no outcome.
func refusedSteps(t Transcript) map[string]bool {
	steps := map[string]string{} // the client's requests: id → step
	out := map[string]bool{}
	for _, e := range t.Entries {
		m, err := parseMessage(e.Msg)
		if err != nil {
			continue
		}
		switch {
		case m.kind() == kindRequest && e.Dir == Sent && m.Method == "tools/call":
			steps[m.idKey()] = e.Step
		case m.kind() == kindResponse && e.Dir == Received:
			step, ok := steps[m.idKey()]
			if !ok {
				continue
			}
			v, err := decode(e.Msg)
			if err != nil {
				continue
			}
			res, _ := v["result"].(map[string]any)
			meta, _ := res["_meta"].(map[string]any)
			if verdict, ok := meta[approvalMetaPrefix+"decision"].(map[string]any); ok && verdict["outcome"] == nil {
				out[step] = true
			}
		}
	}
	return out
}

// refuse makes a tool error, in a step the gateway answered itself, the
// same on both sides: what the error says is the gateway's own, or the
// server's, by design (the gateway checks the call before it asks anyone,
// and so before the server sees it). That it is a tool error is compared.
func refuse(v map[string]any) {
	res, ok := v["result"].(map[string]any)
	if !ok || res["isError"] != true {
		return
	}
	v["result"] = map[string]any{"isError": true, "content": "<a tool error: refused before the call ran>"}
}
