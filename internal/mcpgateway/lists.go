package mcpgateway

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"go.uber.org/zap"

	"github.com/assent-dev/assent/pkg/events"
)

// listTools answers tools/list: one upstream's answer as it gave it (names
// behind its prefix), several upstreams' tools one after the other, in the
// configuration's order and each in its own.
func (s *session) listTools(ctx context.Context, req *jsonrpc.Request) {
	if l := s.only(); l != nil {
		raw, res, items, ok := s.listOne(ctx, req, l, "tools")
		if !ok {
			return
		}
		p, _ := objectOf(req.Params)
		first := p.str("cursor") == ""
		s.storeTools(l, items, first, res.str("nextCursor") == "")
		if l.cfg.Prefix == "" {
			s.answer(req.ID, raw, nil) // byte for byte as the server gave it
			return
		}
		res.set("tools", renamed(items, l.cfg.Prefix))
		s.answer(req.ID, res.bytes(), nil)
		return
	}
	var all []object
	for _, l := range s.linksOf() {
		if !l.capable("tools") {
			continue
		}
		items, err := l.list(ctx, "tools/list", "tools")
		if err != nil {
			if ctx.Err() == nil {
				s.answer(req.ID, nil, wireError(codeInternal, "upstream %s: list tools: %v", l.cfg.Name, err))
			}
			return
		}
		for _, t := range s.storeTools(l, items, true, true) {
			all = append(all, t)
		}
	}
	res := object{}
	res.set("tools", nonNil(all))
	s.answer(req.ID, res.bytes(), nil)
}

// listOne forwards a list request to the one upstream l and reads its
// answer: the result as it came and read, and its items under key. ok is false when the client
// was answered already (an error, or a result that is not an object, passed
// on as it came) or is not to be (cancelled).
func (s *session) listOne(ctx context.Context, req *jsonrpc.Request, l *link, key string) (raw json.RawMessage, res object, items []object, ok bool) {
	resp, err := s.call(ctx, req, l, req.Params)
	if err != nil {
		return nil, nil, nil, false
	}
	if resp.Error != nil {
		s.answer(req.ID, nil, resp.Error)
		return nil, nil, nil, false
	}
	if res, err = objectOf(resp.Result); err != nil {
		s.answer(req.ID, resp.Result, nil)
		return nil, nil, nil, false
	}
	_ = json.Unmarshal(res[key], &items)
	return resp.Result, res, items, true
}

// storeTools notes the tools l listed (a page of them; reset for the
// first, done for the last) and returns them as offered. A tool whose name
// another upstream offers already is left out, with a warning.
func (s *session) storeTools(l *link, items []object, reset, done bool) []object {
	s.mu.Lock()
	defer s.mu.Unlock()
	if reset {
		for name, t := range s.tools {
			if t.link == l {
				delete(s.tools, name)
			}
		}
	}
	var offered []object
	for _, item := range items {
		name := item.str("name")
		as := l.cfg.Prefix + name
		if t, taken := s.tools[as]; taken && t.link != l {
			s.log.Warn("tool left out", zap.Error(fmt.Errorf("%w: %s is offered by upstreams %s and %s: give one of them a prefix", ErrToolConflict, as, t.link.cfg.Name, l.cfg.Name)))
			continue
		}
		t := &tool{link: l, name: name, def: item}
		if err := json.Unmarshal(item.bytes(), &t.t); err != nil {
			s.log.Warn("tool left out: not a tool", zap.String("upstream", l.cfg.Name), zap.String("tool", name), zap.Error(err))
			continue
		}
		t.schema = inputSchema(&t.t)
		t.check = events.NewArgsChecker(t.schema)
		s.tools[as] = t
		c := clone(item)
		c.set("name", as)
		offered = append(offered, c)
	}
	if done {
		s.listed[l] = true
	}
	return offered
}

// lookup is the tool the client calls name, listing the tools again if an
// upstream's changed since (or were never listed).
func (s *session) lookup(ctx context.Context, name string) (*tool, error) {
	s.mu.Lock()
	t := s.tools[name]
	var stale []*link
	for _, l := range s.links {
		if !s.listed[l] {
			stale = append(stale, l)
		}
	}
	s.mu.Unlock()
	if t != nil && len(stale) == 0 {
		return t, nil
	}
	for _, l := range stale {
		if !l.capable("tools") {
			continue
		}
		items, err := l.list(ctx, "tools/list", "tools")
		if err != nil {
			return nil, fmt.Errorf("upstream %s: list tools: %w", l.cfg.Name, err)
		}
		s.storeTools(l, items, true, true)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.tools[name], nil
}

// renamed is items with prefix before each name.
func renamed(items []object, prefix string) []object {
	out := make([]object, len(items))
	for i, item := range items {
		c := clone(item)
		c.set("name", prefix+item.str("name"))
		out[i] = c
	}
	return out
}

// nonNil is items, or an empty list: a list answer's member is never null.
func nonNil(items []object) []object {
	if items == nil {
		return []object{}
	}
	return items
}

// capabilityOf is the capability a list's items belong to.
func capabilityOf(key string) string {
	switch key {
	case "resourceTemplates":
		return "resources"
	}
	return key
}

// listMerged answers prompts/list, resources/list,
// resources/templates/list and tasks/list: one upstream's answer as it gave
// it (prompts behind its prefix), several upstreams' items one after the
// other. What is listed is noted, to send later requests to whose it is.
func (s *session) listMerged(ctx context.Context, req *jsonrpc.Request, key string, rename bool) {
	if l := s.only(); l != nil {
		raw, res, items, ok := s.listOne(ctx, req, l, key)
		if !ok {
			return
		}
		s.note(l, key, items)
		if !rename || l.cfg.Prefix == "" {
			s.answer(req.ID, raw, nil) // byte for byte as the server gave it
			return
		}
		res.set(key, renamed(items, l.cfg.Prefix))
		s.answer(req.ID, res.bytes(), nil)
		return
	}
	var all []object
	for _, l := range s.linksOf() {
		if !l.capable(capabilityOf(key)) {
			continue
		}
		items, err := l.list(ctx, req.Method, key)
		if err != nil {
			if ctx.Err() == nil {
				s.answer(req.ID, nil, wireError(codeInternal, "upstream %s: %s: %v", l.cfg.Name, req.Method, err))
			}
			return
		}
		s.note(l, key, items)
		if rename {
			items = renamed(items, l.cfg.Prefix)
		}
		all = append(all, items...)
	}
	res := object{}
	res.set(key, nonNil(all))
	s.answer(req.ID, res.bytes(), nil)
}

// note remembers whose the listed items are.
func (s *session) note(l *link, key string, items []object) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, item := range items {
		switch key {
		case "prompts":
			s.prompts[l.cfg.Prefix+item.str("name")] = named{link: l, name: item.str("name")}
		case "resources":
			s.uris[item.str("uri")] = l
		case "resourceTemplates":
			tmpl := item.str("uriTemplate")
			if i := strings.IndexByte(tmpl, '{'); i >= 0 {
				tmpl = tmpl[:i]
			}
			s.patterns = append(s.patterns, pattern{link: l, prefix: tmpl})
		case "tasks":
			s.tasks[item.str("taskId")] = l
		}
	}
}

// getPrompt answers prompts/get from the prompt's upstream, under its own
// name there.
func (s *session) getPrompt(ctx context.Context, req *jsonrpc.Request) {
	p, err := objectOf(req.Params)
	if err != nil {
		s.answer(req.ID, nil, wireError(codeInvalidParams, "params: %v", err))
		return
	}
	n, ok := s.prompt(ctx, p.str("name"))
	if !ok {
		s.answer(req.ID, nil, wireError(codeInvalidParams, "unknown prompt %q", p.str("name")))
		return
	}
	p.set("name", n.name)
	if n.link.cfg.guards(GuardPrompts) {
		args := object{}
		args.set("name", n.name)
		if a, ok := p["arguments"]; ok {
			args["arguments"] = a
		}
		decided, ok := s.guard(ctx, req, n.link, ToolGetPrompt, args.bytes())
		if !ok {
			return
		}
		if d, err := objectOf(decided); err == nil {
			p["name"], p["arguments"] = d["name"], d["arguments"]
			if p["arguments"] == nil {
				delete(p, "arguments")
			}
		}
	}
	s.forward(ctx, req, n.link, p.bytes())
}

// prompt is whose the prompt the client calls name is, and its name there.
func (s *session) prompt(ctx context.Context, name string) (named, bool) {
	if l := s.only(); l != nil {
		if l.cfg.Prefix == "" {
			return named{link: l, name: name}, true
		}
		rest, ok := strings.CutPrefix(name, l.cfg.Prefix)
		return named{link: l, name: rest}, ok
	}
	for try := 0; try < 2; try++ {
		s.mu.Lock()
		n, ok := s.prompts[name]
		s.mu.Unlock()
		if ok || try == 1 {
			return n, ok
		}
		for _, l := range s.linksOf() {
			if l.capable("prompts") {
				if items, err := l.list(ctx, "prompts/list", "prompts"); err == nil {
					s.note(l, "prompts", items)
				}
			}
		}
	}
	return named{}, false
}

// readResource answers resources/read from the resource's upstream, once
// approved if the upstream's resources are guarded.
func (s *session) readResource(ctx context.Context, req *jsonrpc.Request) {
	p, err := objectOf(req.Params)
	if err != nil {
		s.answer(req.ID, nil, wireError(codeInvalidParams, "params: %v", err))
		return
	}
	l := s.resource(ctx, p.str("uri"))
	if l == nil {
		s.answer(req.ID, nil, wireError(codeInvalidParams, "no server of this gateway lists the resource %q", p.str("uri")))
		return
	}
	params := req.Params
	if l.cfg.guards(GuardResources) {
		args := object{}
		args.set("uri", p.str("uri"))
		decided, ok := s.guard(ctx, req, l, ToolReadResource, args.bytes())
		if !ok {
			return
		}
		if d, err := objectOf(decided); err == nil && d.str("uri") != "" {
			p["uri"] = d["uri"]
			params = p.bytes()
		}
	}
	s.forward(ctx, req, l, params)
}

// byURI sends a request about a resource (read, subscribe, unsubscribe) to
// the upstream that listed it.
func (s *session) byURI(ctx context.Context, req *jsonrpc.Request) {
	p, err := objectOf(req.Params)
	if err != nil {
		s.answer(req.ID, nil, wireError(codeInvalidParams, "params: %v", err))
		return
	}
	l := s.resource(ctx, p.str("uri"))
	if l == nil {
		s.answer(req.ID, nil, wireError(codeInvalidParams, "no server of this gateway lists the resource %q", p.str("uri")))
		return
	}
	s.forward(ctx, req, l, req.Params)
}

// resource is the upstream whose the resource uri is: the one upstream, the
// one that listed it, or the one with the longest template that fits.
func (s *session) resource(ctx context.Context, uri string) *link {
	if l := s.only(); l != nil {
		return l
	}
	for try := 0; try < 2; try++ {
		s.mu.Lock()
		l := s.uris[uri]
		best := -1
		if l == nil {
			for _, p := range s.patterns {
				if strings.HasPrefix(uri, p.prefix) && len(p.prefix) > best {
					l, best = p.link, len(p.prefix)
				}
			}
		}
		s.mu.Unlock()
		if l != nil || try == 1 {
			return l
		}
		for _, l := range s.linksOf() {
			if !l.capable("resources") {
				continue
			}
			for method, key := range map[string]string{"resources/list": "resources", "resources/templates/list": "resourceTemplates"} {
				if items, err := l.list(ctx, method, key); err == nil {
					s.note(l, key, items)
				}
			}
		}
	}
	return nil
}

// complete answers completion/complete from the upstream of the prompt or
// resource it completes for.
func (s *session) complete(ctx context.Context, req *jsonrpc.Request) {
	p, err := objectOf(req.Params)
	if err != nil {
		s.answer(req.ID, nil, wireError(codeInvalidParams, "params: %v", err))
		return
	}
	ref := p.obj("ref")
	switch ref.str("type") {
	case "ref/prompt":
		n, ok := s.prompt(ctx, ref.str("name"))
		if !ok {
			s.answer(req.ID, nil, wireError(codeInvalidParams, "unknown prompt %q", ref.str("name")))
			return
		}
		ref.set("name", n.name)
		p.set("ref", ref)
		s.forward(ctx, req, n.link, p.bytes())
	case "ref/resource":
		l := s.resource(ctx, ref.str("uri"))
		if l == nil {
			s.answer(req.ID, nil, wireError(codeInvalidParams, "no server of this gateway lists the resource %q", ref.str("uri")))
			return
		}
		s.forward(ctx, req, l, req.Params)
	default:
		if l := s.only(); l != nil {
			s.forward(ctx, req, l, req.Params)
			return
		}
		s.answer(req.ID, nil, wireError(codeInvalidParams, "completion/complete: unknown ref type %q", ref.str("type")))
	}
}

// toEvery sends a request every upstream with capability takes
// (logging/setLevel): one upstream's answer as it gave it, else an empty
// result, or the first error.
func (s *session) toEvery(ctx context.Context, req *jsonrpc.Request, capability string) {
	if l := s.only(); l != nil {
		s.forward(ctx, req, l, req.Params)
		return
	}
	for _, l := range s.linksOf() {
		if !l.capable(capability) {
			continue
		}
		resp, err := s.call(ctx, req, l, req.Params)
		if err != nil {
			return
		}
		if resp.Error != nil {
			s.answer(req.ID, nil, resp.Error)
			return
		}
	}
	s.answer(req.ID, nil, nil)
}

// byTask sends a request about a task to the upstream that made it.
func (s *session) byTask(ctx context.Context, req *jsonrpc.Request) {
	if l := s.only(); l != nil {
		s.forward(ctx, req, l, req.Params)
		return
	}
	p, _ := objectOf(req.Params)
	s.mu.Lock()
	l := s.tasks[p.str("taskId")]
	s.mu.Unlock()
	if l == nil {
		s.answer(req.ID, nil, wireError(codeInvalidParams, "unknown task %q", p.str("taskId")))
		return
	}
	s.forward(ctx, req, l, req.Params)
}
