package mcpgateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.uber.org/zap"

	"github.com/assent-dev/assent/pkg/events"
)

// session is one client's MCP session with the gateway, and the sessions
// it opens with every upstream on the client's behalf: the upstreams see
// the client's own initialize (its name, capabilities and protocol
// version), its roots, its answers to their sampling and elicitation
// requests. Everything passes through as it came except tools/call, which
// Assent decides first; with several upstreams, the lists are merged and
// names carry each upstream's prefix.
type session struct {
	g    *Gateway
	conn mcp.Connection
	// id is the MCP session id of an HTTP client, or one made for a stdio
	// client; a call asks under it unless Identity.Session is set.
	id     string
	http   bool
	served bool // the stdio client of Serve: an upstream's end ends it
	log    *zap.Logger

	ctx  context.Context // ends with the session
	stop context.CancelCauseFunc

	next     atomic.Int64  // the gateway's own request ids towards the client
	ready    chan struct{} // closed once initialize is answered
	finished chan struct{} // closed once run returned and all is closed

	mu       sync.Mutex
	links    []*link
	client   object // the client's initialize params
	tools    map[string]*tool
	listed   map[*link]bool // whose tools are in tools
	prompts  map[string]named
	uris     map[string]*link // resource URIs, as listed
	patterns []pattern        // resource templates, as listed
	tasks    map[string]*link // task ids, as the call that made them answered
	inbound  map[string]*inbound
	outbound map[string]*outbound
	// waited is, by progress token, the last progress the gateway told
	// while the call waited for approval: the upstream's progress on the
	// token comes after it (progress only grows).
	waited map[string]float64
	wg     sync.WaitGroup
}

// tool is an upstream's tool as the gateway offers it.
type tool struct {
	link *link
	name string   // the upstream's name for it
	def  object   // as the upstream listed it
	t    mcp.Tool // the same, read for what the gateway needs of it
	// schema is its input schema as requests carry it, and check its
	// checker, compiled once.
	schema json.RawMessage
	check  events.ArgsChecker
}

// named is an upstream's prompt: whose, and its name there.
type named struct {
	link *link
	name string
}

// pattern is a resource template an upstream listed.
type pattern struct {
	link   *link
	prefix string // the template up to its first variable
}

// inbound is a client request being handled.
type inbound struct {
	cancel context.CancelCauseFunc
}

// outbound is a request sent to the client: an upstream's, forwarded under
// an id of the gateway's choosing, or the gateway's own, answered on ch.
type outbound struct {
	link *link
	id   jsonrpc.ID // the upstream's id for it
	ch   chan *jsonrpc.Response
}

// relatedKey marks, in the context of a write to the client, the client
// request the message is about: the HTTP transport sends it on that
// request's stream.
type relatedKey struct{}

// newSession is a session over conn, not yet run.
func (g *Gateway) newSession(conn mcp.Connection, id string, http, served bool) *session {
	s := &session{g: g, conn: conn, id: id, http: http, served: served, ready: make(chan struct{}), finished: make(chan struct{}),
		tools: map[string]*tool{}, listed: map[*link]bool{}, prompts: map[string]named{}, uris: map[string]*link{},
		tasks: map[string]*link{}, inbound: map[string]*inbound{}, outbound: map[string]*outbound{}, waited: map[string]float64{}}
	s.ctx, s.stop = context.WithCancelCause(g.bg)
	s.log = g.log.With(zap.String("mcp_session", id))
	return s
}

// run serves the client until its connection ends or the session is
// stopped, and returns why it ended (nil: the client left).
func (s *session) run() error {
	defer close(s.finished)
	defer s.end()
	for {
		m, err := s.conn.Read(s.ctx)
		if err != nil {
			s.stop(errDisconnected)
			break
		}
		switch m := m.(type) {
		case *jsonrpc.Response:
			s.fromClientAnswer(m)
		case *jsonrpc.Request:
			switch {
			case !m.IsCall():
				s.fromClientNotification(m)
			case m.Method == "initialize":
				s.initialize(m)
			default:
				s.handle(m)
			}
		}
	}
	if cause := context.Cause(s.ctx); errors.Is(cause, ErrUpstreamEnded) || errors.Is(cause, ErrStopped) {
		return cause
	}
	return nil
}

// end cancels what is in flight, waits for it, and closes the upstreams.
func (s *session) end() {
	s.mu.Lock()
	for _, in := range s.inbound {
		in.cancel(context.Cause(s.ctx))
	}
	s.mu.Unlock()
	s.wg.Wait()
	s.mu.Lock()
	links := s.links
	s.links = nil
	s.mu.Unlock()
	for _, l := range links {
		if err := l.close(); err != nil {
			s.log.Debug("close upstream", zap.String("upstream", l.cfg.Name), zap.Error(err))
		}
	}
	_ = s.conn.Close()
}

// send writes m to the client, on the stream of the request about (HTTP).
// A write that fails while the session lives means the client is gone.
func (s *session) send(m jsonrpc.Message, about jsonrpc.ID) error {
	ctx := s.ctx
	if about.IsValid() {
		ctx = context.WithValue(ctx, relatedKey{}, about)
	}
	err := s.conn.Write(ctx, m)
	if err != nil && s.ctx.Err() == nil {
		s.stop(errDisconnected)
	}
	return err
}

// answer answers the client's request id.
func (s *session) answer(id jsonrpc.ID, result json.RawMessage, err error) {
	_ = s.send(respond(id, result, err), jsonrpc.ID{})
}

// handle handles a client request other than initialize, in the
// background: it is in flight until answered, and the client may cancel it.
func (s *session) handle(req *jsonrpc.Request) {
	ctx, cancel := context.WithCancelCause(s.ctx)
	key := idKey(req.ID)
	s.mu.Lock()
	s.inbound[key] = &inbound{cancel: cancel}
	s.wg.Add(1)
	s.mu.Unlock()
	go func() {
		defer s.wg.Done()
		defer func() {
			cancel(nil)
			s.mu.Lock()
			delete(s.inbound, key)
			s.mu.Unlock()
		}()
		switch req.Method {
		case "ping":
			s.answer(req.ID, nil, nil)
			return
		case "server/discover":
			// The start of the sessionless protocol (2026-07-28): refused,
			// so that clients fall back to initialize and a session. The
			// gateway asks its client's user during a call and withdraws
			// the question when the call is decided elsewhere, which the
			// sessionless protocol has no way to do.
			s.answer(req.ID, nil, wireError(codeMethodNotFound, "server/discover: this server speaks MCP with sessions (initialize)"))
			return
		}
		select {
		case <-s.ready:
		default:
			s.answer(req.ID, nil, wireError(codeInvalidRequest, "%s before initialize: initialize the session first", req.Method))
			return
		}
		s.route(ctx, req)
	}()
}

// route handles a request once the session is open.
func (s *session) route(ctx context.Context, req *jsonrpc.Request) {
	switch req.Method {
	case "tools/list":
		s.listTools(ctx, req)
	case "tools/call":
		s.callTool(ctx, req)
	case "prompts/list":
		s.listMerged(ctx, req, "prompts", true)
	case "resources/list":
		s.listMerged(ctx, req, "resources", false)
	case "resources/templates/list":
		s.listMerged(ctx, req, "resourceTemplates", false)
	case "prompts/get":
		s.getPrompt(ctx, req)
	case "resources/read":
		s.readResource(ctx, req)
	case "resources/subscribe", "resources/unsubscribe":
		s.byURI(ctx, req)
	case "completion/complete":
		s.complete(ctx, req)
	case "logging/setLevel":
		s.toEvery(ctx, req, "logging")
	case "tasks/get", "tasks/result", "tasks/cancel":
		s.byTask(ctx, req)
	default:
		if l := s.only(); l != nil {
			s.forward(ctx, req, l, req.Params)
			return
		}
		if req.Method == "tasks/list" {
			s.listMerged(ctx, req, "tasks", false)
			return
		}
		s.answer(req.ID, nil, wireError(codeMethodNotFound, "%s: not offered by this gateway of several servers", req.Method))
	}
}

// only is the one upstream of a session that has one, else nil.
func (s *session) only() *link {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.links) == 1 {
		return s.links[0]
	}
	return nil
}

// linksOf are the session's upstreams, in the configuration's order.
func (s *session) linksOf() []*link {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.links)
}

// forward sends req to l with params, and the answer back to the client.
// A request the client cancelled gets no answer (the upstream is told).
func (s *session) forward(ctx context.Context, req *jsonrpc.Request, l *link, params json.RawMessage) {
	resp, err := s.call(ctx, req, l, params)
	if err != nil {
		return
	}
	s.answer(req.ID, resp.Result, resp.Error)
}

// call sends req to l with params and returns the answer. When the client
// cancelled it, or the session ended, err is set and the client was not
// answered; when the upstream's connection ended, the client was answered
// with an error saying so.
func (s *session) call(ctx context.Context, req *jsonrpc.Request, l *link, params json.RawMessage) (*jsonrpc.Response, error) {
	resp, err := l.call(ctx, req.Method, params, &forwarded{client: req.ID, token: progressToken(params)})
	switch {
	case err == nil:
		return resp, nil
	case ctx.Err() != nil:
		return nil, err
	default:
		s.answer(req.ID, nil, wireError(codeInternal, "upstream %s: %v", l.cfg.Name, err))
		return nil, err
	}
}

// fromClientNotification passes a client's notification on: a cancel to
// whoever handles the request, initialized and root changes to every
// upstream, anything else to every upstream too.
func (s *session) fromClientNotification(n *jsonrpc.Request) {
	switch n.Method {
	case "notifications/cancelled":
		p, err := objectOf(n.Params)
		if err != nil {
			return
		}
		key := rawIDKey(p["requestId"])
		s.mu.Lock()
		in := s.inbound[key]
		s.mu.Unlock()
		if in != nil {
			in.cancel(cancelled(p.str("reason")))
		}
		return
	case "notifications/initialized":
		// Passed on below, once the upstreams are there.
	}
	for _, l := range s.linksOf() {
		if err := l.notify(s.ctx, n.Method, n.Params); err != nil {
			s.log.Debug("pass a notification on", zap.String("upstream", l.cfg.Name), zap.String("method", n.Method), zap.Error(err))
		}
	}
}

// fromClientAnswer takes the client's answer to a request sent to it: the
// gateway's own, or an upstream's, which gets it under its own id.
func (s *session) fromClientAnswer(resp *jsonrpc.Response) {
	key := idKey(resp.ID)
	s.mu.Lock()
	o := s.outbound[key]
	delete(s.outbound, key)
	s.mu.Unlock()
	switch {
	case o == nil:
		s.log.Debug("an answer to no request of the gateway's", zap.Any("id", resp.ID.Raw()))
	case o.ch != nil:
		o.ch <- resp
	default:
		if err := o.link.reply(s.ctx, &jsonrpc.Response{ID: o.id, Result: resp.Result, Error: resp.Error}); err != nil {
			s.log.Debug("pass an answer on", zap.String("upstream", o.link.cfg.Name), zap.Error(err))
		}
	}
}

// fromUpstream passes what upstream l sends on to the client: its requests
// under an id of the gateway's (a single upstream's keep theirs), its
// notifications as they are. A list change is noted; a ping is answered
// here.
func (s *session) fromUpstream(l *link, m jsonrpc.Message) {
	req, ok := m.(*jsonrpc.Request)
	if !ok {
		return
	}
	about := jsonrpc.ID{}
	if hc, ok := l.conn.(*httpConn); ok {
		about = hc.relatedOf(req)
	}
	if !about.IsValid() {
		about = l.relatedTo(progressToken(req.Params))
	}
	if !req.IsCall() {
		switch req.Method {
		case "notifications/tools/list_changed":
			s.mu.Lock()
			delete(s.listed, l)
			s.mu.Unlock()
		case "notifications/progress":
			req = s.afterWaiting(req)
		case "notifications/cancelled":
			// The upstream withdraws a request it sent the client: under
			// the client's id for it.
			p, err := objectOf(req.Params)
			if err != nil {
				return
			}
			up := rawIDKey(p["requestId"])
			s.mu.Lock()
			for key, o := range s.outbound {
				if o.link == l && idKey(o.id) == up {
					delete(s.outbound, key)
					p["requestId"] = outboundID(key)
				}
			}
			s.mu.Unlock()
			req = withParams(req, p.bytes())
		}
		_ = s.send(req, about)
		return
	}
	if req.Method == "ping" {
		_ = l.reply(s.ctx, respond(req.ID, nil, nil))
		return
	}
	id := req.ID
	s.mu.Lock()
	if _, taken := s.outbound[idKey(id)]; taken || len(s.links) > 1 {
		id, _ = jsonrpc.MakeID(fmt.Sprintf("%s-%d", l.cfg.Name, s.next.Add(1)))
	}
	s.outbound[idKey(id)] = &outbound{link: l, id: req.ID}
	s.mu.Unlock()
	if err := s.send(&jsonrpc.Request{ID: id, Method: req.Method, Params: req.Params}, about); err != nil {
		_ = l.reply(s.ctx, respond(req.ID, nil, wireError(codeInternal, "the client cannot be reached: %v", err)))
	}
}

// progressed notes that the gateway told progress n on token.
func (s *session) progressed(token string, n float64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.waited[token] = n
}

// afterWaiting is an upstream's progress notification, put after the
// progress the gateway told on its token while the call waited for
// approval: progress and total grow by it. The token is forgotten when the
// call ends (see callTool).
func (s *session) afterWaiting(n *jsonrpc.Request) *jsonrpc.Request {
	p, err := objectOf(n.Params)
	if err != nil {
		return n
	}
	s.mu.Lock()
	base := s.waited[string(p["progressToken"])]
	s.mu.Unlock()
	if base == 0 {
		return n
	}
	for _, k := range []string{"progress", "total"} {
		var v float64
		if json.Unmarshal(p[k], &v) == nil {
			p.set(k, v+base)
		}
	}
	return withParams(n, p.bytes())
}

// outboundID is the JSON of the id whose key is key.
func outboundID(key string) json.RawMessage {
	if v, ok := strings.CutPrefix(key, "s:"); ok {
		b, _ := json.Marshal(v)
		return b
	}
	return json.RawMessage(strings.TrimPrefix(key, "n:"))
}

// request sends the client a request of the gateway's own (an elicitation,
// a ping) and waits for its answer; when ctx ends first, the client is told
// the request is withdrawn.
func (s *session) request(ctx context.Context, method string, params any, about jsonrpc.ID) (json.RawMessage, error) {
	raw, err := json.Marshal(params)
	if err != nil {
		return nil, err
	}
	id, _ := jsonrpc.MakeID(fmt.Sprintf("assent-%d", s.next.Add(1)))
	key := idKey(id)
	ch := make(chan *jsonrpc.Response, 1)
	s.mu.Lock()
	s.outbound[key] = &outbound{ch: ch}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.outbound, key)
		s.mu.Unlock()
	}()
	if err := s.send(&jsonrpc.Request{ID: id, Method: method, Params: raw}, about); err != nil {
		return nil, err
	}
	select {
	case resp := <-ch:
		if resp.Error != nil {
			return nil, resp.Error
		}
		return resp.Result, nil
	case <-ctx.Done():
		p := object{"requestId": rawID(id)}
		_ = s.send(&jsonrpc.Request{Method: "notifications/cancelled", Params: p.bytes()}, about)
		return nil, context.Cause(ctx)
	}
}

// notify sends the client a notification of the gateway's own.
func (s *session) notify(method string, params any, about jsonrpc.ID) error {
	raw, err := json.Marshal(params)
	if err != nil {
		return err
	}
	return s.send(&jsonrpc.Request{Method: method, Params: raw}, about)
}

// clientName is the client's name in its initialize.
func (s *session) clientName() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.client.obj("clientInfo").str("name")
}

// canElicit reports whether the client said it can show forms.
func (s *session) canElicit() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	caps := s.client.obj("capabilities")
	raw, ok := caps["elicitation"]
	if !ok || string(raw) == "null" {
		return false
	}
	e, _ := objectOf(raw)
	// An empty elicitation capability is form mode; one that names only
	// url mode cannot show a form.
	_, form := e["form"]
	_, url := e["url"]
	return form || !url
}

// upstreamEnded ends the session when one of its upstreams went away: the
// client's requests to it cannot be answered any more.
func (s *session) upstreamEnded(l *link) {
	err := l.ended()
	if s.ctx.Err() != nil {
		return
	}
	s.log.Warn("upstream ended: ending the client's session", zap.Error(err))
	s.stop(err)
	_ = s.conn.Close()
}

// initialize opens a session with every upstream with the client's
// initialize, and answers the client: with one upstream, as it answered
// (the gateway's instructions added); with several, with what they offer
// together.
func (s *session) initialize(req *jsonrpc.Request) {
	select {
	case <-s.ready:
		s.answer(req.ID, nil, wireError(codeInvalidParams, "initialize: the session is initialized already"))
		return
	default:
	}
	params, err := objectOf(req.Params)
	if err != nil {
		s.answer(req.ID, nil, wireError(codeInvalidParams, "initialize: params: %v", err))
		return
	}
	cfgs := s.g.upstreamConfigs()
	links := make([]*link, len(cfgs))
	errs := make([]error, len(cfgs))
	var wg sync.WaitGroup
	for i, cfg := range cfgs {
		wg.Go(func() {
			l, err := dial(s.ctx, cfg, s.g.log)
			if err != nil {
				errs[i] = err
				return
			}
			go l.run(s.ctx, func(m jsonrpc.Message) { s.fromUpstream(l, m) })
			if err := l.initialize(s.ctx, req.Params); err != nil {
				_ = l.close()
				errs[i] = err
				return
			}
			links[i] = l
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		for _, l := range links {
			if l != nil {
				_ = l.close()
			}
		}
		s.log.Warn("initialize: an upstream failed", zap.Error(err))
		s.answer(req.ID, nil, wireError(codeInternal, "%v", err))
		return
	}
	s.mu.Lock()
	s.client, s.links = params, links
	s.mu.Unlock()
	for _, l := range links {
		go func() {
			<-l.done
			s.upstreamEnded(l)
		}()
	}
	close(s.ready)
	s.answer(req.ID, s.initialized(links), nil)
}

// initialized is the answer to the client's initialize.
func (s *session) initialized(links []*link) json.RawMessage {
	if len(links) == 1 {
		res := clone(links[0].init)
		res.set("instructions", joinText(links[0].init.str("instructions"), Instructions))
		return res.bytes()
	}
	res := object{}
	agreed := ""
	caps := object{}
	var texts []string
	for _, l := range links {
		if v := l.init.str("protocolVersion"); agreed == "" || v < agreed {
			agreed = v
		}
		for k, v := range l.init.obj("capabilities") {
			caps[k] = mergeCapability(caps[k], v)
		}
		if t := l.init.str("instructions"); t != "" {
			texts = append(texts, l.cfg.Name+": "+t)
		}
	}
	caps["tools"] = mergeCapability(caps["tools"], json.RawMessage(`{"listChanged":true}`))
	res.set("protocolVersion", agreed)
	res.set("capabilities", caps)
	res.set("serverInfo", mcp.Implementation{Name: "assent-mcp-gateway", Title: "Assent MCP gateway", Version: version()})
	res.set("instructions", joinText(strings.Join(texts, "\n\n"), Instructions))
	return res.bytes()
}

// clone is a copy of o.
func clone(o object) object {
	c := make(object, len(o))
	for k, v := range o {
		c[k] = v
	}
	return c
}

// joinText is a and b as paragraphs, either of them possibly empty.
func joinText(a, b string) string {
	switch {
	case a == "":
		return b
	case b == "":
		return a
	}
	return a + "\n\n" + b
}

// mergeCapability is capability a as b adds to it: members of both, the
// flags (listChanged, subscribe) true if either says so.
func mergeCapability(a, b json.RawMessage) json.RawMessage {
	x, errA := objectOf(a)
	y, errB := objectOf(b)
	if errA != nil || errB != nil {
		if len(a) > 0 {
			return a
		}
		return b
	}
	for k, v := range y {
		if old, ok := x[k]; ok && string(old) == "true" {
			continue
		}
		x[k] = v
	}
	return x.bytes()
}

// upstreamConfigs are the upstreams as named at Start.
func (g *Gateway) upstreamConfigs() []Upstream {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Clone(g.named)
}

// sessionID is the session a call asks under: the configured one, else
// this session's.
func (s *session) sessionID() string {
	if id := s.g.cfg.Identity.Session; id != "" {
		return id
	}
	return s.id
}

// trackCall registers a call in flight with the gateway, so that Close
// waits for it; ok is false once the gateway is closing.
func (g *Gateway) trackCall() (done func(), ok bool) {
	g.smu.Lock()
	defer g.smu.Unlock()
	if g.closed {
		return func() {}, false
	}
	g.inFlight.Add(1)
	return g.inFlight.Done, true
}
