package email

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/assent-dev/assent/pkg/events"
)

// LinkBucket is the JetStream KV bucket where the channel records the links
// that were used (so each works once, across every bot process) and the
// mails it sent (so a retried notification does not mail twice).
const LinkBucket = "assent-email-links"

// linkLifetime bounds how long a link lives, whatever the request's
// deadline; linkKeep, the bucket's TTL, outlives it, so that a used link is
// remembered for as long as it could be used.
const (
	linkLifetime = 24 * time.Hour
	linkKeep     = linkLifetime + time.Hour
)

// linkBucketConfig is the bucket, as the channel declares it at start.
var linkBucketConfig = jetstream.KeyValueConfig{
	Bucket:      LinkBucket,
	Description: "Assent email channel: used approval links and sent mails",
	TTL:         linkKeep,
	History:     1,
	Storage:     jetstream.FileStorage,
}

// Why a link is refused.
var (
	// errBadLink: the token is malformed or its signature does not match
	// (tampered with, cut by a mail client, or signed with another secret).
	errBadLink = errors.New("link is not valid")
	// errLinkExpired: the link is authentic but past its expiry.
	errLinkExpired = errors.New("link expired")
)

// maxTokenLength bounds the tokens verify reads; real ones are about 330
// characters.
const maxTokenLength = 1024

// linkVersion is the payload version this package signs and reads.
const linkVersion = 1

// macContext separates link signatures from any other use of the secret.
const macContext = "assent email link v1\x00"

var b64 = base64.RawURLEncoding

// link is what an approval link carries: who may answer which request how,
// for which arguments, until when.
type link struct {
	V         int            `json:"v"`
	Request   string         `json:"r"`
	Principal string         `json:"p"`
	Decision  events.Verdict `json:"d"`
	// Args is events.ArgsDigest of the arguments the mail showed.
	Args string `json:"a"`
	// To is addressHash of the address the mail went to.
	To string `json:"t"`
	// Expires is the link's expiry, Unix seconds.
	Expires int64 `json:"e"`
}

// expires returns l's expiry as a time.
func (l link) expires() time.Time { return time.Unix(l.Expires, 0) }

// valid checks the fields of an authenticated payload.
func (l link) valid() error {
	switch {
	case l.V != linkVersion:
		return fmt.Errorf("version %d", l.V)
	case !events.ValidToken(l.Request):
		return errors.New("request id")
	case !events.ValidToken(l.Principal):
		return errors.New("principal")
	case l.Decision != events.Approve && l.Decision != events.Deny:
		return fmt.Errorf("decision %q", l.Decision)
	case !strings.HasPrefix(l.Args, "sha256:") || len(l.Args) != len("sha256:")+64:
		return errors.New("args digest")
	case len(l.To) != 32:
		return errors.New("address")
	case l.Expires <= 0:
		return errors.New("expiry")
	}
	return nil
}

// addressHash names an address in a link without showing it: the links of a
// mail are valid only while the address it went to is still the principal's.
func addressHash(addr string) string {
	sum := sha256.Sum256([]byte("assent email address\x00" + strings.ToLower(strings.TrimSpace(addr))))
	return hex.EncodeToString(sum[:16])
}

// signer makes and checks link tokens with one secret.
type signer struct{ key []byte }

func (s signer) mac(payload []byte) []byte {
	h := hmac.New(sha256.New, s.key)
	h.Write([]byte(macContext))
	h.Write(payload)
	return h.Sum(nil)
}

// sign returns the token of l: base64url(payload) "." base64url(HMAC).
func (s signer) sign(l link) string {
	l.V = linkVersion
	payload, err := json.Marshal(l)
	if err != nil {
		panic(err) // a struct of strings and ints always marshals
	}
	return b64.EncodeToString(payload) + "." + b64.EncodeToString(s.mac(payload))
}

// verify checks token's signature and reads its link. A token whose
// signature or form is wrong gives errBadLink; an authentic one past its
// expiry gives the link and errLinkExpired. Only the canonical encoding of a
// signed payload is accepted, so that each link has exactly one token (its
// single use is recorded by token).
func (s signer) verify(token string, now time.Time) (link, error) {
	if len(token) > maxTokenLength {
		return link{}, fmt.Errorf("%w: too long", errBadLink)
	}
	p, m, ok := strings.Cut(token, ".")
	if !ok {
		return link{}, fmt.Errorf("%w: no signature (was the link cut short?)", errBadLink)
	}
	payload, err1 := b64.DecodeString(p)
	mac, err2 := b64.DecodeString(m)
	if err1 != nil || err2 != nil || b64.EncodeToString(payload) != p || b64.EncodeToString(mac) != m {
		return link{}, fmt.Errorf("%w: not base64url", errBadLink)
	}
	if !hmac.Equal(mac, s.mac(payload)) {
		return link{}, fmt.Errorf("%w: signature does not match", errBadLink)
	}
	var l link
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&l); err != nil || dec.More() {
		return link{}, fmt.Errorf("%w: payload", errBadLink)
	}
	if err := l.valid(); err != nil {
		return link{}, fmt.Errorf("%w: %v", errBadLink, err)
	}
	if !now.Before(l.expires()) {
		return l, fmt.Errorf("%w at %s", errLinkExpired, l.expires().UTC().Format(time.RFC3339))
	}
	return l, nil
}

// usedKey is the bucket key that records the use of token.
func usedKey(token string) string {
	sum := sha256.Sum256([]byte(token))
	return "used." + hex.EncodeToString(sum[:])
}

// sentKey is the bucket key that records the mail of one notice (kind) of
// request id to principal.
func sentKey(id, principal, kind string) string {
	sum := sha256.Sum256([]byte(id + "\x00" + principal + "\x00" + kind))
	return "sent." + hex.EncodeToString(sum[:])
}

// mailedAt returns when principal was first mailed about request id (the
// earliest of its notices' sent records), zero if none is recorded.
func mailedAt(ctx context.Context, kv jetstream.KeyValue, id, principal string) time.Time {
	var first time.Time
	for _, k := range []kind{kindNew, kindEscalation, kindReminder} {
		e, err := kv.Get(ctx, sentKey(id, principal, k.String()))
		if err != nil {
			continue
		}
		if t, err := time.Parse(time.RFC3339Nano, string(e.Value())); err == nil && (first.IsZero() || t.Before(first)) {
			first = t
		}
	}
	return first
}

// use records that token was used by principal. If it was used before,
// jetstream.ErrKeyExists is returned.
func use(ctx context.Context, kv jetstream.KeyValue, token, principal string, at time.Time) error {
	b, _ := json.Marshal(struct {
		Principal string    `json:"principal"`
		At        time.Time `json:"at"`
	}{principal, at.UTC()})
	_, err := kv.Create(ctx, usedKey(token), b)
	return err
}

// used reports whether token was used.
func used(ctx context.Context, kv jetstream.KeyValue, token string) (bool, error) {
	_, err := kv.Get(ctx, usedKey(token))
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		return false, nil
	case err != nil:
		return false, err
	}
	return true, nil
}
