package adkassent

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"unicode/utf8"

	"google.golang.org/adk/session"
	"google.golang.org/adk/tool/toolconfirmation"
	"google.golang.org/genai"

	"github.com/assent-dev/assent/pkg/events"
)

// Confirmation is one adk_request_confirmation call, as Assent is asked about
// it.
type Confirmation struct {
	// CallID is the id of the adk_request_confirmation call; the answer
	// carries it.
	CallID string
	// RequestID is the Assent request id (RequestID of the session and CallID).
	RequestID string
	// Tool, Args and OriginalCallID are the original call's: what would run.
	Tool           string
	Args           json.RawMessage
	OriginalCallID string
	// Hint and Payload are what the tool passed to RequestConfirmation.
	Hint    string
	Payload json.RawMessage
}

// RequestID returns the Assent request id of the confirmation call callID in
// ADK session (app, user, sessionID), asked as agent. It is the same every
// time, in every process, so asking again after a restart is a retry of the
// same request and gets its decision.
func RequestID(agent, app, user, sessionID, callID string) string {
	h := sha256.New()
	for _, s := range []string{"assent-adk-v1", agent, app, user, sessionID, callID} {
		// Length-prefixed, so no two lists of parts hash alike.
		fmt.Fprintf(h, "%d:%s", len(s), s)
	}
	return "adk-" + hex.EncodeToString(h.Sum(nil)[:16])
}

// confirmationArgs is how ADK's adk_request_confirmation call carries the
// original call and the tool's confirmation: Go values in a live event, JSON
// objects in a session read back from storage; both encode alike.
type confirmationArgs struct {
	Original     *genai.FunctionCall `json:"originalFunctionCall"`
	Confirmation struct {
		Hint    string          `json:"hint"`
		Payload json.RawMessage `json:"payload"`
	} `json:"toolConfirmation"`
}

// confirmationOf reads an adk_request_confirmation call of the session whose
// request ids ids makes.
func confirmationOf(fc *genai.FunctionCall, ids func(callID string) string) (Confirmation, error) {
	raw, err := json.Marshal(fc.Args)
	if err != nil {
		return Confirmation{}, fmt.Errorf("%w: call %s: %v", ErrMalformed, fc.ID, err)
	}
	var a confirmationArgs
	if err := json.Unmarshal(raw, &a); err != nil {
		return Confirmation{}, fmt.Errorf("%w: call %s: %v", ErrMalformed, fc.ID, err)
	}
	if fc.ID == "" || a.Original == nil || a.Original.Name == "" {
		return Confirmation{}, fmt.Errorf("%w: call %q has no id or no original call", ErrMalformed, fc.ID)
	}
	args, err := normalArgs(a.Original.Args)
	if err != nil {
		return Confirmation{}, fmt.Errorf("%w: call %s: args: %v", ErrMalformed, fc.ID, err)
	}
	c := Confirmation{
		CallID:         fc.ID,
		RequestID:      ids(fc.ID),
		Tool:           a.Original.Name,
		Args:           args,
		OriginalCallID: a.Original.ID,
		Hint:           a.Confirmation.Hint,
	}
	if !isNull(a.Confirmation.Payload) {
		c.Payload = a.Confirmation.Payload
	}
	return c, nil
}

// normalArgs encodes a call's args as a session read back from storage holds
// them: every number a float64. A request asked live and asked again after a
// restart then carries the same args, and so has the same digest.
func normalArgs(args map[string]any) (json.RawMessage, error) {
	if len(args) == 0 {
		return json.RawMessage(`{}`), nil
	}
	raw, err := json.Marshal(args)
	if err != nil {
		return nil, err
	}
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		return nil, err
	}
	return json.Marshal(v)
}

// confirmationCalls returns the adk_request_confirmation calls in ev.
func confirmationCalls(ev *session.Event) []*genai.FunctionCall {
	if ev == nil || ev.Content == nil {
		return nil
	}
	var calls []*genai.FunctionCall
	for _, p := range ev.Content.Parts {
		if p.FunctionCall != nil && p.FunctionCall.Name == toolconfirmation.FunctionCallName {
			calls = append(calls, p.FunctionCall)
		}
	}
	return calls
}

// functionResponses returns the function responses in ev.
func functionResponses(ev *session.Event) []*genai.FunctionResponse {
	if ev == nil || ev.Content == nil {
		return nil
	}
	var rs []*genai.FunctionResponse
	for _, p := range ev.Content.Parts {
		if p.FunctionResponse != nil {
			rs = append(rs, p.FunctionResponse)
		}
	}
	return rs
}

// waiting reads a session's events and returns the confirmations it waits
// for: those nobody answered, and those this package answered whose original
// call has not run since (the process stopped between the answer and the
// run; ADK runs it when the answer is sent again). Malformed calls are
// returned as errors.
func waiting(evs []*session.Event, ids func(callID string) string) ([]Confirmation, []error) {
	type seen struct {
		c  Confirmation
		at int
	}
	var (
		calls    []seen
		errs     []error
		answered = map[string]int{}  // confirmation call id -> event index of an answer of ours
		foreign  = map[string]bool{} // confirmation call ids answered by someone else
		ran      = map[string]int{}  // original call id -> index of its last response
	)
	for i, ev := range evs {
		for _, fc := range confirmationCalls(ev) {
			c, err := confirmationOf(fc, ids)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			calls = append(calls, seen{c, i})
		}
		for _, fr := range functionResponses(ev) {
			if fr.Name != toolconfirmation.FunctionCallName {
				ran[fr.ID] = i
				continue
			}
			if _, ours := fr.Response[answerKey]; ours {
				answered[fr.ID] = i
			} else {
				foreign[fr.ID] = true
			}
		}
	}
	var out []Confirmation
	for _, s := range calls {
		if foreign[s.c.CallID] {
			continue
		}
		at, ok := answered[s.c.CallID]
		if !ok {
			out = append(out, s.c)
			continue
		}
		if r, ok := ran[s.c.OriginalCallID]; !ok || r < at {
			out = append(out, s.c)
		}
	}
	return out, errs
}

// truncateText cuts s to at most n bytes, on a character boundary.
func truncateText(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// isNull reports whether raw holds no JSON value, or null.
func isNull(raw json.RawMessage) bool {
	t := bytes.TrimSpace(raw)
	return len(t) == 0 || bytes.Equal(t, []byte("null"))
}

// hintLimit is the longest hint a request may carry.
const hintLimit = events.MaxTextLength
