package httpapi

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/assent-dev/assent/internal/broker"
)

// writeTimeout bounds one write to an event stream client; a client that does
// not read is dropped, and resumes with Last-Event-ID when it reconnects.
const writeTimeout = 10 * time.Second

// events serves GET /v1/events: Server-Sent Events of every lifecycle event
// of the requests the caller sees, filtered by agent, session, type and
// request, resumable from the Last-Event-ID header (or ?after=), which is the
// stream sequence: after=0 replays the stream from its start, no after=
// follows the events from now on.
func (s *Server) events(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	f := broker.EventFilter{Types: splitList(q["type"]), Agents: splitList(q["agent"]), Sessions: splitList(q["session"]), RequestID: q.Get("request")}
	c := s.caller(r)
	agents, ok := agentScope(w, c, f.Agents)
	if !ok {
		return
	}
	f.Agents = agents
	from, resume := r.Header.Get("Last-Event-ID"), true
	if from == "" {
		from = q.Get("after")
		resume = from != ""
	}
	var after uint64
	if resume {
		n, err := strconv.ParseUint(from, 10, 64)
		if err != nil {
			writeError(w, http.StatusBadRequest, "invalid_request", fmt.Sprintf("Last-Event-ID/after: %q is not an event id (a stream sequence)", from))
			return
		}
		after = n
	} else {
		// No after=: the events from now on, fixed before the client is
		// told it is connected, so none stored after that is missed.
		n, err := s.b.LastSeq(r.Context())
		if err != nil {
			s.fail(w, err)
			return
		}
		after = n
	}
	rc := http.NewResponseController(w)
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Accel-Buffering", "no") // no buffering in front of us, as nginx would
	w.WriteHeader(http.StatusOK)
	if s.cfg.Observe != nil {
		s.cfg.Observe(1)
		defer s.cfg.Observe(-1)
	}

	var mu sync.Mutex
	send := func(b []byte) error {
		mu.Lock()
		defer mu.Unlock()
		_ = rc.SetWriteDeadline(time.Now().Add(writeTimeout))
		if _, err := w.Write(b); err != nil {
			return err
		}
		return rc.Flush()
	}
	// The client reconnects 2s after a drop, with the last id it saw.
	if err := send([]byte("retry: 2000\n: connected\n\n")); err != nil {
		return
	}
	ctx, stop := s.untilStopping(r.Context())
	defer stop()
	// The heartbeat stops, and is waited for, before the handler returns:
	// the response is net/http's again after that.
	var wg sync.WaitGroup
	defer wg.Wait()
	done := make(chan struct{})
	defer close(done)
	wg.Go(func() {
		t := time.NewTicker(s.cfg.Heartbeat)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case <-t.C:
				_ = send([]byte(": ping\n\n"))
			}
		}
	})
	var buf []byte
	vis := s.visibility(c)
	err := s.b.Subscribe(ctx, after, f, func(batch []*broker.Event) error {
		buf = buf[:0]
		for _, e := range batch {
			if !vis.Event(ctx, e) {
				continue
			}
			buf = fmt.Appendf(buf, "id: %d\nevent: %s\ndata: ", e.Seq, e.ShortType())
			buf = append(buf, e.JSON()...)
			buf = append(buf, "\n\n"...)
		}
		if len(buf) == 0 {
			return nil
		}
		return send(buf)
	})
	if errors.Is(err, broker.ErrFellBehind) {
		s.log.Info("event stream client fell behind; it resumes from its last event", zap.String("client", clientName(r)))
	}
}

// splitList reads a query parameter given several times or comma-separated.
func splitList(vs []string) []string {
	var out []string
	for _, v := range vs {
		for _, p := range strings.Split(v, ",") {
			if p = strings.TrimSpace(p); p != "" {
				out = append(out, p)
			}
		}
	}
	return out
}

// audit serves GET /v1/audit: the stream's events, filtered, in order, a page
// at a time. With Accept: application/x-ndjson (or ?format=ndjson) it writes
// one event per line and the cursor for the next page in X-Next-After.
func (s *Server) audit(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	c := s.caller(r)
	var asked []string
	if a := q.Get("agent"); a != "" {
		asked = []string{a}
	}
	agents, ok := agentScope(w, c, asked)
	if !ok {
		return
	}
	aq := broker.AuditQuery{RequestID: q.Get("request"), Agent: q.Get("agent"), Principal: q.Get("principal"),
		Channel: q.Get("channel"), Rule: q.Get("rule"), Types: splitList(q["type"])}
	var problems []string
	for name, dst := range map[string]*time.Time{"since": &aq.Since, "until": &aq.Until} {
		if v := q.Get(name); v != "" {
			t, err := time.Parse(time.RFC3339, v)
			if err != nil {
				problems = append(problems, fmt.Sprintf("%s: %q is not an RFC 3339 time such as 2026-11-22T10:00:00Z", name, v))
			}
			*dst = t
		}
	}
	if v := q.Get("after"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			problems = append(problems, fmt.Sprintf("after: %q is not a stream sequence", v))
		}
		aq.After = n
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 1000 {
			problems = append(problems, "limit: want a whole number from 1 to 1000")
		}
		aq.Limit = n
	}
	if len(problems) > 0 {
		writeError(w, http.StatusBadRequest, "invalid_request", strings.Join(problems, "; "))
		return
	}
	if len(agents) > 0 {
		aq.Agent = agents[0]
	}
	page, err := s.b.Audit(r.Context(), aq)
	if err != nil {
		s.fail(w, err)
		return
	}
	if !c.all() {
		// Only the events of requests the caller sees; next still continues
		// the log where this page's read stopped.
		vis := s.visibility(c)
		seen := page.Events[:0]
		for _, e := range page.Events {
			if vis.Event(r.Context(), e) {
				seen = append(seen, e)
			}
		}
		page.Events = seen
	}
	if q.Get("format") == "ndjson" || strings.Contains(r.Header.Get("Accept"), "application/x-ndjson") {
		w.Header().Set("Content-Type", "application/x-ndjson")
		if page.Next != 0 {
			w.Header().Set("X-Next-After", strconv.FormatUint(page.Next, 10))
		}
		w.WriteHeader(http.StatusOK)
		for _, e := range page.Events {
			_, _ = w.Write(append(e.JSON(), '\n'))
		}
		return
	}
	writeJSON(w, http.StatusOK, page)
}
