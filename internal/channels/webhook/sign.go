package webhook

import (
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Header names of Standard Webhooks (https://www.standardwebhooks.com).
const (
	// HeaderID is the message id: the same on every retry of one message,
	// so a receiver can tell a retry from a new message. Outbound it is the
	// CloudEvent id.
	HeaderID = "webhook-id"
	// HeaderTimestamp is when the attempt was signed, in Unix seconds.
	HeaderTimestamp = "webhook-timestamp"
	// HeaderSignature holds one or more space-separated signatures
	// "v1,<base64>" (more than one while a secret is being rotated).
	HeaderSignature = "webhook-signature"
)

// Tolerance is how far a message's webhook-timestamp may be from the
// receiver's clock, either way, before Verify refuses it as stale.
const Tolerance = 5 * time.Minute

// SecretPrefix starts a Standard Webhooks secret: "whsec_" + base64 of the key.
const SecretPrefix = "whsec_"

// MinSecretBytes is the shortest signing key accepted (the Standard Webhooks
// specification asks for 24 to 64 random bytes).
const MinSecretBytes = 24

// Errors Verify and ParseSecret return; branch on them with errors.Is.
var (
	// ErrNoSignature: the message lacks a webhook-id, webhook-timestamp or
	// webhook-signature header, or one of them is malformed.
	ErrNoSignature = errors.New("webhook: missing or malformed signature headers")
	// ErrStale: the webhook-timestamp is more than Tolerance away from now.
	ErrStale = errors.New("webhook: timestamp outside the tolerance")
	// ErrBadSignature: no v1 signature in webhook-signature matches the
	// message under the secret.
	ErrBadSignature = errors.New("webhook: no valid signature")
	// ErrBadSecret: a secret is not "whsec_" + base64 of at least
	// MinSecretBytes bytes.
	ErrBadSecret = errors.New("webhook: bad secret")
)

// ParseSecret decodes a Standard Webhooks secret ("whsec_" + base64; the
// prefix may be left out) into the key Sign and Verify take. The key must be
// at least MinSecretBytes long. Errors wrap ErrBadSecret.
func ParseSecret(s string) ([]byte, error) {
	s = strings.TrimPrefix(strings.TrimSpace(s), SecretPrefix)
	if s == "" {
		return nil, fmt.Errorf("%w: empty", ErrBadSecret)
	}
	key, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		// Some tools print base64 without its padding.
		if k, err2 := base64.RawStdEncoding.DecodeString(s); err2 == nil {
			key, err = k, nil
		}
	}
	if err != nil {
		return nil, fmt.Errorf("%w: want %s followed by standard base64: %v", ErrBadSecret, SecretPrefix, err)
	}
	if len(key) < MinSecretBytes {
		return nil, fmt.Errorf("%w: the key is %d bytes, want at least %d random bytes (make one with: echo %s$(openssl rand -base64 32))",
			ErrBadSecret, len(key), MinSecretBytes, SecretPrefix)
	}
	return key, nil
}

// Sign returns the Standard Webhooks signature of one delivery attempt:
// "v1," + the base64 of HMAC-SHA256, keyed with secret (the decoded key, see
// ParseSecret), over id + "." + the Unix seconds of ts + "." + body. Send it
// in the webhook-signature header, with id in webhook-id and the same Unix
// seconds in webhook-timestamp.
func Sign(secret []byte, id string, ts time.Time, body []byte) string {
	return sign(secret, id, strconv.FormatInt(ts.Unix(), 10), body)
}

func sign(secret []byte, id, ts string, body []byte) string {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(id))
	m.Write([]byte{'.'})
	m.Write([]byte(ts))
	m.Write([]byte{'.'})
	m.Write(body)
	return "v1," + base64.StdEncoding.EncodeToString(m.Sum(nil))
}

// Verify checks a received message, as a Standard Webhooks receiver must:
// the webhook-id, webhook-timestamp and webhook-signature headers are present
// (else ErrNoSignature), the timestamp is within Tolerance of now (else
// ErrStale), and at least one of the space-separated v1 signatures is body's
// signature under secret (else ErrBadSignature). Signatures are compared in
// constant time; other versions than v1 are skipped. Verify does not detect
// replays: remember the webhook-ids seen within the tolerance for that.
func Verify(secret []byte, h http.Header, body []byte, now time.Time) error {
	id, ts, sigs := h.Get(HeaderID), h.Get(HeaderTimestamp), h.Get(HeaderSignature)
	if id == "" || ts == "" || sigs == "" {
		return fmt.Errorf("%w: want %s, %s and %s", ErrNoSignature, HeaderID, HeaderTimestamp, HeaderSignature)
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil || sec < 0 {
		return fmt.Errorf("%w: %s %q is not Unix seconds", ErrNoSignature, HeaderTimestamp, truncate(ts, 24))
	}
	if off := now.Sub(time.Unix(sec, 0)); off > Tolerance || off < -Tolerance {
		return fmt.Errorf("%w: %s is %s from now, more than %s: check the sender's clock, and do not resend old messages",
			ErrStale, HeaderTimestamp, off.Round(time.Second).Abs(), Tolerance)
	}
	want := []byte(sign(secret, id, ts, body))
	ok := 0
	for s := range strings.FieldsSeq(sigs) {
		if strings.HasPrefix(s, "v1,") {
			ok |= subtle.ConstantTimeCompare(want, []byte(s))
		}
	}
	if ok != 1 {
		return ErrBadSignature
	}
	return nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
