package slacktest

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Sign is Slack's request signature of body sent at ts (Unix seconds).
func Sign(secret, ts, body string) string {
	mac := hmac.New(sha256.New, []byte(secret))
	fmt.Fprintf(mac, "v0:%s:%s", ts, body)
	return "v0=" + hex.EncodeToString(mac.Sum(nil))
}

// SignedHeader is the header Slack sends with body, signed with secret at at.
func SignedHeader(secret string, at time.Time, body string) http.Header {
	ts := strconv.FormatInt(at.Unix(), 10)
	h := http.Header{}
	h.Set("Content-Type", "application/x-www-form-urlencoded")
	h.Set("X-Slack-Request-Timestamp", ts)
	h.Set("X-Slack-Signature", Sign(secret, ts, body))
	return h
}

// Form is an interaction payload as Slack posts it: a form with one field.
func Form(t testing.TB, payload any) string {
	t.Helper()
	b, err := json.Marshal(payload)
	if err != nil {
		t.Fatal(err)
	}
	return url.Values{"payload": {string(b)}}.Encode()
}

// Post posts body with header to endpoint (an interactivity request URL)
// and returns the response's status and body.
func Post(t testing.TB, endpoint, body string, header http.Header) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, endpoint, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header = header.Clone()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// Click is a block_actions payload: user clicked the button action on m,
// the message of request id.
func Click(user, action, id string, m Message) map[string]any {
	return map[string]any{
		"type":       "block_actions",
		"user":       map[string]any{"id": user, "username": strings.ToLower(user)},
		"channel":    map[string]any{"id": m.Channel},
		"container":  map[string]any{"type": "message", "message_ts": m.TS, "channel_id": m.Channel},
		"message":    map[string]any{"ts": m.TS},
		"trigger_id": "trigger-" + user + "-" + action,
		"actions":    []any{map[string]any{"type": "button", "block_id": "assent.actions", "action_id": action, "value": id}},
	}
}

// Submit is a view_submission payload: user submitted v with values (input
// block id -> the action's state, such as Text or Radio).
func Submit(user string, v View, values map[string]any) map[string]any {
	state := map[string]any{}
	for id, val := range values {
		state[id] = map[string]any{id: val}
	}
	return map[string]any{
		"type": "view_submission",
		"user": map[string]any{"id": user},
		"view": map[string]any{"id": "V1", "type": "modal", "callback_id": v.CallbackID, "private_metadata": v.PrivateMetadata,
			"state": map[string]any{"values": state}},
	}
}

// Text is a plain text input's state.
func Text(s string) map[string]any { return map[string]any{"type": "plain_text_input", "value": s} }

// Radio is a radio buttons input's state.
func Radio(s string) map[string]any {
	return map[string]any{"type": "radio_buttons", "selected_option": map[string]any{"value": s}}
}
