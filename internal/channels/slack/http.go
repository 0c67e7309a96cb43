package slack

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/slack-go/slack"
	"go.uber.org/zap"
)

const (
	// maxInteraction bounds an interaction's body; Slack's are a few KiB,
	// a modal's state at most some tens.
	maxInteraction = 1 << 20
	// replayWindow is how far a request's X-Slack-Request-Timestamp may be
	// from now, either way (slack.NewSecretsVerifier's check).
	replayWindow = 5 * time.Minute
	// replayKeep is how long a signature is remembered: a request accepted
	// now was signed at most replayWindow ago or ahead, so its signature
	// stops being accepted at most 2*replayWindow from now.
	replayKeep = 2*replayWindow + time.Minute
	// replayMax bounds the signatures remembered; past it the oldest are
	// forgotten first (only Slack can sign, so only Slack could fill it).
	replayMax = 100_000
	// interactionPatience bounds the work of one interaction.
	interactionPatience = 15 * time.Second
)

// Error codes of the interactions endpoint's refusals, in the body's
// {"error": {"code", "message"}}.
const (
	codeMissingSignature = "missing_signature"
	codeBadSignature     = "bad_signature"
	codeStale            = "stale_timestamp"
	codeReplayed         = "replayed"
	codeTooLarge         = "too_large"
	codeMalformed        = "malformed"
)

// refusal is why a request to the endpoint is refused.
type refusal struct {
	status        int
	code, message string
}

// serveInteractions is POST InteractionsPath: it authenticates the
// interaction Slack signed (DESIGN section 6), refuses stale and replayed
// ones, and handles it.
func (a *Adapter) serveInteractions(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxInteraction))
	if err != nil {
		refuse(w, refusal{http.StatusRequestEntityTooLarge, codeTooLarge, "interaction body too large or unreadable"})
		return
	}
	if no := a.verify(r.Header, body); no != nil {
		a.log.Warn("refused an interaction", zap.String("code", no.code), zap.String("remote", r.RemoteAddr))
		refuse(w, *no)
		return
	}
	form, err := url.ParseQuery(string(body))
	payload := form.Get("payload")
	if err != nil || payload == "" {
		refuse(w, refusal{http.StatusBadRequest, codeMalformed, "want a form with a payload field, as Slack posts interactions"})
		return
	}
	var cb slack.InteractionCallback
	if err := json.Unmarshal([]byte(payload), &cb); err != nil {
		refuse(w, refusal{http.StatusBadRequest, codeMalformed, "payload: " + err.Error()})
		return
	}
	// Finish what was started even if Slack stops waiting (after 3 seconds).
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), interactionPatience)
	defer cancel()
	if resp := a.interact(ctx, &cb); resp != nil {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(resp)
		return
	}
	w.WriteHeader(http.StatusOK)
}

// verify checks the request's Slack signature over body, its timestamp's
// window, and that it was not seen before.
func (a *Adapter) verify(h http.Header, body []byte) *refusal {
	sv, err := slack.NewSecretsVerifier(h, a.secrets.signingSecret)
	switch {
	case errors.Is(err, slack.ErrMissingHeaders):
		return &refusal{http.StatusUnauthorized, codeMissingSignature, "missing X-Slack-Signature or X-Slack-Request-Timestamp: only Slack may post here"}
	case errors.Is(err, slack.ErrExpiredTimestamp):
		return &refusal{http.StatusUnauthorized, codeStale, "X-Slack-Request-Timestamp is more than 5 minutes from this server's clock: a replay, or a clock that needs NTP"}
	case err != nil:
		return &refusal{http.StatusUnauthorized, codeBadSignature, "malformed X-Slack-Signature or X-Slack-Request-Timestamp"}
	}
	_, _ = sv.Write(body)
	if sv.Ensure() != nil {
		return &refusal{http.StatusUnauthorized, codeBadSignature, "bad signature: check that " + a.cfg.SigningSecretEnv + " holds this Slack app's Signing Secret (Basic Information, App Credentials)"}
	}
	// Hex decoding takes either case: one signature has many spellings.
	if !a.replays.first(strings.ToLower(h.Get("X-Slack-Signature")), a.now()) {
		return &refusal{http.StatusUnauthorized, codeReplayed, "this signed request was already received: replays are refused"}
	}
	return nil
}

func refuse(w http.ResponseWriter, no refusal) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(no.status)
	_ = json.NewEncoder(w).Encode(map[string]map[string]string{"error": {"code": no.code, "message": no.message}})
}

// replayGuard remembers the signatures of requests accepted lately, so that
// a captured request is refused if sent again while its timestamp is still
// in the window. It is per process: behind several replicas a replay may
// reach another one, where it answers once more what was answered already
// (the broker counts a principal's answer once).
type replayGuard struct {
	mu    sync.Mutex
	keep  time.Duration
	max   int
	seen  map[string]time.Time // signature -> when it was first seen
	order []string             // signatures, oldest first
}

func newReplayGuard(keep time.Duration, max int) *replayGuard {
	return &replayGuard{keep: keep, max: max, seen: map[string]time.Time{}}
}

// first records sig at now, and reports whether it was not seen before.
func (g *replayGuard) first(sig string, now time.Time) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	for len(g.order) > 0 && (len(g.order) >= g.max || now.Sub(g.seen[g.order[0]]) > g.keep) {
		delete(g.seen, g.order[0])
		g.order = g.order[1:]
	}
	if _, dup := g.seen[sig]; dup {
		return false
	}
	g.seen[sig] = now
	g.order = append(g.order, sig)
	return true
}

// len is how many signatures g remembers.
func (g *replayGuard) len() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.seen)
}
