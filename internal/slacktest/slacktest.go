// Package slacktest is a local Slack for tests: the Web API methods the Slack
// channel calls and a Socket Mode websocket, with helpers that post
// interactions as Slack does (signed, as form bodies).
package slacktest

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"
)

// Server is a local Slack: the Web API methods the channel calls
// (auth.test, chat.postMessage, chat.update, chat.postEphemeral, views.open,
// conversations.history, conversations.info, conversations.open,
// apps.connections.open) and a Socket Mode websocket. It keeps the messages
// as Slack would, with their metadata, and every call, for tests to
// inspect. Tests can make a method answer late (Delay) and a conversation
// refuse the bot (Fail).
type Server struct {
	t        testing.TB
	srv      *httptest.Server
	botToken string
	appToken string

	mu        sync.Mutex
	calls     []Call
	messages  []*Message                 // in the order posted
	lastTS    int64                      // the last message's timestamp, in microseconds
	acks      map[string]json.RawMessage // Socket Mode envelope id -> payload
	ws        *websocket.Conn
	wsWrite   sync.Mutex // gorilla connections take one writer at a time
	envelopes int
	changed   chan struct{}
	closing   chan struct{}
	wsDone    sync.WaitGroup
	delays    map[string]time.Duration // method -> how late it answers
	failing   map[string]string        // conversation -> the error of every call about it
}

// Call is one Web API call.
type Call struct {
	Method string
	Form   url.Values                 // form-encoded calls
	JSON   map[string]json.RawMessage // JSON calls (views.open)
}

// Message is a message in the fake workspace.
type Message struct {
	Channel, TS, ThreadTS, Text string
	Blocks                      string // JSON, as last posted or updated
	Updates                     int
	Posted                      time.Time // when chat.postMessage took it
	// Metadata is the message's metadata as posted (JSON: event_type and
	// event_payload), empty if none.
	Metadata string
}

// View is a modal the channel opened with views.open.
type View struct {
	TriggerID       string
	CallbackID      string `json:"callback_id"`
	PrivateMetadata string `json:"private_metadata"`
	Raw             string // the view's JSON
}

func New(t testing.TB, botToken, appToken string) *Server {
	t.Helper()
	f := &Server{t: t, botToken: botToken, appToken: appToken,
		acks: map[string]json.RawMessage{}, changed: make(chan struct{}, 1), closing: make(chan struct{}),
		delays: map[string]time.Duration{}, failing: map[string]string{}}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /auth.test", f.web(false, func(c Call) any {
		return map[string]any{"ok": true, "team": "Acme", "user_id": "UBOT", "bot_id": "BBOT"}
	}))
	mux.HandleFunc("POST /chat.postMessage", f.web(false, f.postMessage))
	mux.HandleFunc("POST /chat.update", f.web(false, f.update))
	mux.HandleFunc("POST /chat.postEphemeral", f.web(false, func(c Call) any {
		return map[string]any{"ok": true, "message_ts": "1.1"}
	}))
	mux.HandleFunc("POST /views.open", f.web(false, func(c Call) any {
		return map[string]any{"ok": true, "view": map[string]any{"id": "V1"}}
	}))
	mux.HandleFunc("POST /conversations.history", f.web(false, f.history))
	mux.HandleFunc("POST /conversations.info", f.web(false, f.info))
	mux.HandleFunc("POST /conversations.open", f.web(false, func(c Call) any {
		users := c.Form.Get("users")
		if users == "" || strings.Contains(users, ",") {
			return map[string]any{"ok": false, "error": "users_list_not_supplied"}
		}
		if code := f.failing[users]; code != "" {
			return map[string]any{"ok": false, "error": code}
		}
		return map[string]any{"ok": true, "channel": map[string]any{"id": DM(users)}}
	}))
	mux.HandleFunc("POST /apps.connections.open", f.web(true, func(c Call) any {
		return map[string]any{"ok": true, "url": "ws://" + f.srv.Listener.Addr().String() + "/ws"}
	}))
	mux.HandleFunc("GET /ws", f.socket)
	f.srv = httptest.NewServer(mux)
	t.Cleanup(f.close)
	return f
}

// URL is the Web API's base URL.
func (f *Server) URL() string { return f.srv.URL + "/" }

func (f *Server) close() {
	close(f.closing)
	f.mu.Lock()
	if f.ws != nil {
		f.ws.Close()
	}
	f.mu.Unlock()
	f.wsDone.Wait()
	f.srv.Close()
}

func (f *Server) signal() {
	select {
	case f.changed <- struct{}{}:
	default:
	}
}

// web serves one Web API method: it checks the token (the app-level one if
// app), records the call and answers with do's result.
func (f *Server) web(app bool, do func(Call) any) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		c := Call{Method: strings.TrimPrefix(r.URL.Path, "/")}
		token := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
		if strings.HasPrefix(r.Header.Get("Content-Type"), "application/json") {
			body, _ := io.ReadAll(r.Body)
			if len(body) > 0 {
				if err := json.Unmarshal(body, &c.JSON); err != nil {
					f.t.Errorf("%s: body %s: %v", c.Method, body, err)
				}
			}
		} else {
			if err := r.ParseForm(); err != nil {
				f.t.Errorf("%s: form: %v", c.Method, err)
			}
			c.Form = r.PostForm
			if token == "" {
				token = c.Form.Get("token")
			}
		}
		want := f.botToken
		if app {
			want = f.appToken
		}
		w.Header().Set("Content-Type", "application/json")
		if token != want {
			_ = json.NewEncoder(w).Encode(map[string]any{"ok": false, "error": "invalid_auth"})
			return
		}
		f.mu.Lock()
		f.calls = append(f.calls, c)
		resp := do(c)
		delay := f.delays[c.Method]
		f.mu.Unlock()
		f.signal()
		if delay > 0 {
			// Done, but answered late, as a slow Slack does.
			select {
			case <-time.After(delay):
			case <-r.Context().Done():
				return
			case <-f.closing:
			}
		}
		_ = json.NewEncoder(w).Encode(resp)
	}
}

// DM is the id of the direct message conversation with user, as
// conversations.open answers it.
func DM(user string) string { return "D" + user }

// Delay makes method answer d late, after it has done its work (a posted
// message is stored at once); 0 answers at once again.
func (f *Server) Delay(method string, d time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.delays[method] = d
}

// Fail makes every call about conversation (posting in it, updating,
// reading its history or info, opening a DM with a user id) fail with
// Slack's error code: "channel_not_found", "not_in_channel" (then
// conversations.info answers with is_member false), "is_archived". An
// empty code lets it work again.
func (f *Server) Fail(conversation, code string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if code == "" {
		delete(f.failing, conversation)
		return
	}
	f.failing[conversation] = code
}

// refused returns the answer of a call about channel that Fail set, or nil.
func (f *Server) refused(channel string) any {
	code := f.failing[channel]
	if channel == "" || channel == "CMISSING" {
		code = "channel_not_found"
	}
	if code == "" {
		return nil
	}
	return map[string]any{"ok": false, "error": code}
}

// history is conversations.history: the conversation's top-level messages,
// newest first, between oldest and latest, a page of limit at a time, with
// their metadata when include_all_metadata is set.
func (f *Server) history(c Call) any {
	ch := c.Form.Get("channel")
	if r := f.refused(ch); r != nil {
		return r
	}
	oldest, latest := c.Form.Get("oldest"), c.Form.Get("latest")
	limit, _ := strconv.Atoi(c.Form.Get("limit"))
	if limit <= 0 || limit > 1000 {
		limit = 100
	}
	skip, _ := strconv.Atoi(c.Form.Get("cursor"))
	withMeta := c.Form.Get("include_all_metadata") == "1" || c.Form.Get("include_all_metadata") == "true"
	var msgs []map[string]any
	for i := len(f.messages) - 1; i >= 0; i-- {
		m := f.messages[i]
		if m.Channel != ch || m.ThreadTS != "" || (oldest != "" && tsBefore(m.TS, oldest)) || (latest != "" && !tsBefore(m.TS, latest)) {
			continue
		}
		out := map[string]any{"type": "message", "ts": m.TS, "text": m.Text, "user": "UBOT", "bot_id": "BBOT"}
		if withMeta && m.Metadata != "" {
			out["metadata"] = json.RawMessage(m.Metadata)
		}
		msgs = append(msgs, out)
	}
	msgs = msgs[min(skip, len(msgs)):]
	more := len(msgs) > limit
	next := ""
	if more {
		msgs = msgs[:limit]
		next = strconv.Itoa(skip + limit)
	}
	return map[string]any{"ok": true, "messages": msgs, "has_more": more, "response_metadata": map[string]any{"next_cursor": next}}
}

// tsBefore compares Slack timestamps ("1700000000.000001").
func tsBefore(a, b string) bool {
	fa, _ := strconv.ParseFloat(a, 64)
	fb, _ := strconv.ParseFloat(b, 64)
	return fa < fb
}

// info is conversations.info: every conversation exists, with the bot a
// member, unless Fail says otherwise.
func (f *Server) info(c Call) any {
	ch := c.Form.Get("channel")
	member := true
	if code := f.failing[ch]; code == "not_in_channel" {
		member = false
	} else if r := f.refused(ch); r != nil {
		return r
	}
	return map[string]any{"ok": true, "channel": map[string]any{"id": ch, "name": strings.ToLower(ch), "is_channel": !strings.HasPrefix(ch, "D"), "is_im": strings.HasPrefix(ch, "D"), "is_member": member}}
}

// postMessage and update run under f.mu.
func (f *Server) postMessage(c Call) any {
	ch := c.Form.Get("channel")
	if r := f.refused(ch); r != nil {
		return r
	}
	if strings.HasPrefix(ch, "U") {
		ch = DM(ch) // Slack posts to a user id in the bot's DM with them
	}
	// Slack's timestamps are the time of posting, to the microsecond, and
	// unique in a conversation.
	us := max(time.Now().UnixMicro(), f.lastTS+1)
	f.lastTS = us
	ts := fmt.Sprintf("%d.%06d", us/1e6, us%1e6)
	f.messages = append(f.messages, &Message{Channel: ch, TS: ts, ThreadTS: c.Form.Get("thread_ts"), Text: c.Form.Get("text"),
		Blocks: readable(c.Form.Get("blocks")), Posted: time.Now(), Metadata: c.Form.Get("metadata")})
	return map[string]any{"ok": true, "channel": ch, "ts": ts, "message": map[string]any{"ts": ts, "text": c.Form.Get("text")}}
}

func (f *Server) update(c Call) any {
	if r := f.refused(c.Form.Get("channel")); r != nil {
		return r
	}
	for _, m := range f.messages {
		if m.Channel == c.Form.Get("channel") && m.TS == c.Form.Get("ts") {
			m.Text, m.Blocks = c.Form.Get("text"), readable(c.Form.Get("blocks"))
			m.Updates++
			return map[string]any{"ok": true, "channel": m.Channel, "ts": m.TS, "text": m.Text}
		}
	}
	return map[string]any{"ok": false, "error": "message_not_found"}
}

// readable re-encodes JSON without escaping <, > and &, for tests to read
// the mrkdwn as Slack would.
func readable(raw string) string {
	if raw == "" {
		return ""
	}
	var v any
	if err := json.Unmarshal([]byte(raw), &v); err != nil {
		return raw
	}
	var b strings.Builder
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v)
	return strings.TrimSpace(b.String())
}

// Calls returns the calls of method so far.
func (f *Server) Calls(method string) []Call {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []Call
	for _, c := range f.calls {
		if c.Method == method {
			out = append(out, c)
		}
	}
	return out
}

// MessagesOf returns copies of the request's top-level messages (found by
// the request id they show), in the order posted.
func (f *Server) MessagesOf(id string) []Message {
	var out []Message
	for _, m := range f.Messages() {
		if m.ThreadTS == "" && strings.Contains(m.Blocks, id) {
			out = append(out, m)
		}
	}
	return out
}

// Message returns a copy of the request's top-level message, found by the
// request id it shows; ok is false if none was posted.
func (f *Server) Message(id string) (m Message, ok bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, m := range f.messages {
		if m.ThreadTS == "" && strings.Contains(m.Blocks, id) {
			return *m, true
		}
	}
	return Message{}, false
}

// Messages returns copies of every message posted, in order.
func (f *Server) Messages() []Message {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]Message, len(f.messages))
	for i, m := range f.messages {
		out[i] = *m
	}
	return out
}

// Replies returns the thread replies under ts.
func (f *Server) Replies(ts string) []Message {
	var out []Message
	for _, m := range f.Messages() {
		if m.ThreadTS == ts {
			out = append(out, m)
		}
	}
	return out
}

// Ephemerals returns the texts shown to user alone.
func (f *Server) Ephemerals(user string) []string {
	var out []string
	for _, c := range f.Calls("chat.postEphemeral") {
		if c.Form.Get("user") == user {
			out = append(out, c.Form.Get("text"))
		}
	}
	return out
}

// Views returns the modals opened so far.
func (f *Server) Views() []View {
	var out []View
	for _, c := range f.Calls("views.open") {
		var v View
		if err := json.Unmarshal(c.JSON["view"], &v); err != nil {
			f.t.Fatalf("views.open: %v", err)
		}
		_ = json.Unmarshal(c.JSON["trigger_id"], &v.TriggerID)
		v.Raw = string(c.JSON["view"])
		out = append(out, v)
	}
	return out
}

// Wait polls cond until it holds, failing the test after 20 seconds.
func (f *Server) Wait(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.After(20 * time.Second)
	for !cond() {
		select {
		case <-f.changed:
		case <-time.After(50 * time.Millisecond):
		case <-deadline:
			t.Fatalf("%s: not after 20s", what)
		}
	}
}

// socket is the Socket Mode websocket: it says hello, pings every second,
// and records acknowledgements.
func (f *Server) socket(w http.ResponseWriter, r *http.Request) {
	up := websocket.Upgrader{CheckOrigin: func(*http.Request) bool { return true }}
	conn, err := up.Upgrade(w, r, nil)
	if err != nil {
		f.t.Errorf("websocket upgrade: %v", err)
		return
	}
	f.mu.Lock()
	select {
	case <-f.closing:
		f.mu.Unlock()
		conn.Close()
		return
	default:
	}
	if f.ws != nil {
		f.ws.Close()
	}
	f.ws = conn
	f.wsDone.Add(1)
	f.mu.Unlock()
	defer f.wsDone.Done()
	defer func() {
		f.mu.Lock()
		if f.ws == conn {
			f.ws = nil
		}
		f.mu.Unlock()
	}()
	f.write(conn, map[string]any{"type": "hello", "num_connections": 1, "connection_info": map[string]any{"app_id": "A1"}})
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				f.wsWrite.Lock()
				_ = conn.WriteControl(websocket.PingMessage, []byte("ping"), time.Now().Add(time.Second))
				f.wsWrite.Unlock()
			}
		}
	}()
	f.signal()
	for {
		_, data, err := conn.ReadMessage()
		if err != nil {
			return
		}
		var ack struct {
			EnvelopeID string          `json:"envelope_id"`
			Payload    json.RawMessage `json:"payload"`
		}
		if err := json.Unmarshal(data, &ack); err != nil || ack.EnvelopeID == "" {
			f.t.Errorf("Socket Mode: not an acknowledgement: %s", data)
			continue
		}
		f.mu.Lock()
		if ack.Payload == nil {
			ack.Payload = json.RawMessage{}
		}
		f.acks[ack.EnvelopeID] = ack.Payload
		f.mu.Unlock()
		f.signal()
	}
}

func (f *Server) write(conn *websocket.Conn, v any) {
	f.wsWrite.Lock()
	defer f.wsWrite.Unlock()
	if err := conn.WriteJSON(v); err != nil {
		f.t.Errorf("Socket Mode write: %v", err)
	}
}

// Connected reports whether a Socket Mode client is connected.
func (f *Server) Connected() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.ws != nil
}

// Send sends an interactive envelope with payload over Socket Mode and
// returns its envelope id.
func (f *Server) Send(t testing.TB, payload any) string {
	t.Helper()
	f.mu.Lock()
	f.envelopes++
	id := fmt.Sprintf("env-%d", f.envelopes)
	conn := f.ws
	f.mu.Unlock()
	if conn == nil {
		t.Fatal("no Socket Mode connection")
	}
	f.write(conn, map[string]any{"type": "interactive", "envelope_id": id, "payload": payload, "accepts_response_payload": true})
	return id
}

// Ack waits for envelope id's acknowledgement and returns its payload
// (empty for none).
func (f *Server) Ack(t testing.TB, id string) json.RawMessage {
	t.Helper()
	var p json.RawMessage
	f.Wait(t, "acknowledgement of "+id, func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		var ok bool
		p, ok = f.acks[id]
		return ok
	})
	return p
}
