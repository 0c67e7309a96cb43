package webhook

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/assent-dev/assent/internal/channels"
	"github.com/assent-dev/assent/pkg/events"
	"github.com/assent-dev/assent/pkg/handler"
)

// Decision is the body of an inbound decision: the responded data of the wire
// contract plus the request it answers.
type Decision struct {
	RequestID string          `json:"request_id"`
	Decision  events.Verdict  `json:"decision"`
	Reason    string          `json:"reason,omitempty"`
	Args      json.RawMessage `json:"args,omitempty"`
	Payload   json.RawMessage `json:"payload,omitempty"`
	// Remember asks the broker to reuse the answer, where the rule allows.
	Remember *events.Remember `json:"remember,omitempty"`
}

// Accepted is the answer to an inbound decision the bot passed on to the
// broker (202): the broker then decides, and the endpoints receive the
// decided event.
type Accepted struct {
	Status    string         `json:"status"` // "accepted"
	RequestID string         `json:"request_id"`
	Principal string         `json:"principal"`
	Decision  events.Verdict `json:"decision"`
	WebhookID string         `json:"webhook_id"`
}

// Error codes of inbound answers, in {"error": {"code", "message"}}.
const (
	CodeBadSignature   = "bad_signature"      // 401
	CodeStaleTimestamp = "stale_timestamp"    // 401
	CodeInvalid        = "invalid_request"    // 400
	CodeTooLarge       = "too_large"          // 413
	CodeNotFound       = "not_found"          // 404: no such endpoint or request
	CodeReplayed       = "replayed"           // 409: webhook-id seen before
	CodeAlreadyDecided = "already_decided"    // 409
	CodeExpired        = "expired"            // 410
	CodeNotEligible    = "not_eligible"       // 403
	CodeMethod         = "method_not_allowed" // 405
	CodeUnavailable    = "unavailable"        // 503: NATS unreachable; send again
)

// maxBody bounds an inbound body: an answer is at most an event's size.
const maxBody = events.DefaultMaxEventSize

// httpError is an inbound refusal.
type httpError struct {
	status  int
	code    string
	message string
	// decision is the request's decision, for already_decided and expired.
	decision *handler.Decision
}

func (e *httpError) Error() string { return e.code + ": " + e.message }

func refuse(status int, code, format string, a ...any) *httpError {
	return &httpError{status: status, code: code, message: fmt.Sprintf(format, a...)}
}

// serveInbound is POST /webhooks/in/{name}: verify, then answer as the
// endpoint's principal.
func (a *Adapter) serveInbound(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	in := a.inbound[name]
	if in == nil {
		writeError(w, refuse(http.StatusNotFound, CodeNotFound, "no inbound webhook named %q: configure it under webhooks.inbound", truncate(name, 40)))
		return
	}
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		writeError(w, refuse(http.StatusMethodNotAllowed, CodeMethod, "%s: use POST", r.Method))
		return
	}
	log := a.log.With(zap.String("inbound", in.name), zap.String("principal", in.principal), zap.String("webhook_id", truncate(r.Header.Get(HeaderID), 80)))
	acc, herr := a.decide(r.Context(), in, r, w)
	if herr != nil {
		if herr.status >= 500 {
			log.Warn("inbound decision not passed on", zap.String("code", herr.code), zap.String("error", herr.message))
		} else {
			log.Info("inbound decision refused", zap.Int("status", herr.status), zap.String("code", herr.code), zap.String("error", herr.message))
		}
		writeError(w, herr)
		return
	}
	log.Info("inbound decision passed to the broker", zap.String("request_id", acc.RequestID), zap.String("decision", string(acc.Decision)))
	writeJSON(w, http.StatusAccepted, acc)
}

// decide checks one inbound message and answers it. Whatever it refuses
// changes nothing: a webhook-id claimed for a message that is then refused
// is released, so the sender may send it again.
func (a *Adapter) decide(ctx context.Context, in *inbound, r *http.Request, w http.ResponseWriter) (*Accepted, *httpError) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, refuse(http.StatusRequestEntityTooLarge, CodeTooLarge, "body over %d bytes", maxBody)
		}
		return nil, refuse(http.StatusBadRequest, CodeInvalid, "reading the body: %v", err)
	}
	if err := Verify(in.secret, r.Header, body, time.Now()); err != nil {
		if errors.Is(err, ErrStale) {
			return nil, refuse(http.StatusUnauthorized, CodeStaleTimestamp, "%v", err)
		}
		return nil, refuse(http.StatusUnauthorized, CodeBadSignature,
			"%v: sign the body with the inbound endpoint's secret, as Standard Webhooks says (webhook-id, webhook-timestamp, webhook-signature)", err)
	}
	d, herr := parseDecision(body)
	if herr != nil {
		return nil, herr
	}
	key := seenKey(in.name, r.Header.Get(HeaderID))
	if herr := a.claim(ctx, key); herr != nil {
		return nil, herr
	}
	acc, herr := a.answer(ctx, in, d, r.Header.Get(HeaderID))
	if herr != nil {
		a.release(key)
		return nil, herr
	}
	return acc, nil
}

// parseDecision reads and checks an inbound body.
func parseDecision(body []byte) (Decision, *httpError) {
	var d Decision
	if err := events.CheckJSONText(body); err != nil {
		return d, refuse(http.StatusBadRequest, CodeInvalid, "body: %v", err)
	}
	if err := json.Unmarshal(body, &d); err != nil {
		return d, refuse(http.StatusBadRequest, CodeInvalid,
			`body: want a JSON object {"request_id", "decision": "approve"|"deny", "reason", "args", "payload"}: %v`, err)
	}
	var errs []error
	if err := events.CheckToken("request_id", d.RequestID); err != nil {
		errs = append(errs, err)
	}
	resp := events.Responded{Decision: d.Decision, Reason: d.Reason, Args: d.Args, Payload: d.Payload, Remember: d.Remember, Channel: Name}
	if err := resp.Validate(); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return d, refuse(http.StatusBadRequest, CodeInvalid, "%v", err)
	}
	return d, nil
}

// answer checks the request can take the decision, and passes it on.
func (a *Adapter) answer(ctx context.Context, in *inbound, d Decision, webhookID string) (*Accepted, *httpError) {
	id := d.RequestID
	if dec, decided, err := a.rt.Decision(ctx, id); err != nil {
		return nil, unavailable(err)
	} else if decided {
		herr := refuse(http.StatusConflict, CodeAlreadyDecided, "request %s was already %s by %s", id, dec.Outcome, channels.Who(dec))
		if dec.Outcome == events.Expired {
			herr = refuse(http.StatusGone, CodeExpired, "request %s expired at %s", id, dec.DecidedAt.Format(time.RFC3339))
		}
		herr.decision = &dec
		return nil, herr
	}
	if found, err := a.exists(ctx, id); err != nil {
		return nil, unavailable(err)
	} else if !found {
		return nil, refuse(http.StatusNotFound, CodeNotFound, "no request has id %s", id)
	}
	// Judge eligibility, and edited args against the request's
	// input_schema, here when the notice is known, so that the sender hears
	// why at once; otherwise the broker judges (it checks every answer).
	if n, _, ok, err := a.rt.Lookup(ctx, id); err == nil && ok {
		if a.env.Directory != nil {
			if err := a.env.Directory.MayAnswer(in.principal, n); err != nil {
				return nil, refuse(http.StatusForbidden, CodeNotEligible, "%s may not answer request %s: %v", in.principal, id, err)
			}
		}
		if d.Decision == events.Approve && !events.EmptyJSON(d.Args) {
			if problem := channels.ArgsProblem(n.InputSchema, d.Args); problem != "" {
				return nil, refuse(http.StatusBadRequest, CodeInvalid, "%s", problem)
			}
		}
	}
	err := a.rt.Answer(ctx, in.principal, id, handler.Response{
		Decision: d.Decision, Reason: d.Reason, Args: d.Args, Payload: d.Payload, Remember: d.Remember,
	})
	if errors.Is(err, events.ErrInvalid) {
		return nil, refuse(http.StatusBadRequest, CodeInvalid, "%v", err)
	}
	if err != nil {
		return nil, unavailable(err)
	}
	return &Accepted{Status: "accepted", RequestID: id, Principal: in.principal, Decision: d.Decision, WebhookID: webhookID}, nil
}

func unavailable(err error) *httpError {
	return refuse(http.StatusServiceUnavailable, CodeUnavailable, "the broker's NATS is unreachable (%v): send the message again later", err)
}

// exists reports whether the broker holds a request with id.
func (a *Adapter) exists(ctx context.Context, id string) (bool, error) {
	status, _, err := lookupRequest(ctx, a.env.NATS, id)
	return err == nil && status != events.LookupUnknown, err
}

// seenKey is the bucket key of a webhook-id sent to inbound endpoint name.
// The id is the sender's, any text: its hash makes it a valid key.
func seenKey(name, webhookID string) string {
	sum := sha256.Sum256([]byte(webhookID))
	return name + "." + hex.EncodeToString(sum[:])
}

// claim records key as seen, in this process and in the bucket (one create
// wins across processes), or refuses a replay.
func (a *Adapter) claim(ctx context.Context, key string) *httpError {
	replay := refuse(http.StatusConflict, CodeReplayed, "this webhook-id was accepted before: a message is taken once; send a new decision with a new webhook-id")
	if !a.seen.add(key, time.Now()) {
		return replay
	}
	val, _ := json.Marshal(map[string]any{"at": time.Now().UTC()})
	if _, err := a.ids.Create(ctx, key, val); err != nil {
		a.seen.remove(key)
		if errors.Is(err, jetstream.ErrKeyExists) {
			return replay
		}
		return unavailable(err)
	}
	return nil
}

// release forgets a claimed key.
func (a *Adapter) release(key string) {
	a.seen.remove(key)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := a.ids.Delete(ctx, key); err != nil {
		a.log.Warn("cannot release a webhook-id; the sender's retry will be refused as a replay for 10 minutes", zap.Error(err))
	}
}

func writeError(w http.ResponseWriter, e *httpError) {
	body := map[string]any{"error": map[string]string{"code": e.code, "message": e.message}}
	if e.decision != nil {
		body["decision"] = e.decision
	}
	writeJSON(w, e.status, body)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}
