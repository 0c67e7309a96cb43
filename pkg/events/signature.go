package events

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode"

	"github.com/nats-io/nkeys"
)

// Decision signatures. A broker with a decision key signs every decided event
// it publishes, so that a reader can tell the broker's decision from one that
// anybody able to publish on assent.decision.<id> made, whatever the NATS
// server's permissions. docs/protocol.md ("Signed decisions") describes the
// scheme byte by byte, with a worked example.
//
// The key is an nkeys account key pair: an Ed25519 key whose seed reads
// "SA..." and whose public key reads "A...". An account key, rather than a
// user key, so that the broker's NATS credentials (user keys) are never
// taken for its decision key by mistake, and the other way round.

// SignatureAttribute is the CloudEvents extension attribute that carries a
// decided event's signature: "v1.<public key>.<signature>", the signature in
// unpadded base64url.
const SignatureAttribute = "assentsig"

const (
	// signatureVersion opens a signature value: the scheme that made it.
	signatureVersion = "v1"
	// signatureContext is the first line of the canonical text of scheme v1,
	// so that a signature made for anything else never verifies as one.
	signatureContext = "assent-decision-v1"
)

// Signature errors, each also matching ErrInvalid.
var (
	// ErrUnsigned: the decided event carries no signature attribute.
	ErrUnsigned = invalid("decision not signed")
	// ErrUntrustedKey: the signature names a key the reader does not trust.
	ErrUntrustedKey = invalid("decision signed by a key that is not trusted")
	// ErrBadSignature: the signature attribute is malformed, or does not
	// verify: the event was changed after it was signed, or was signed with
	// another key than the one it names.
	ErrBadSignature = invalid("bad decision signature")
)

// CanonicalDecision returns the text a decided event's signature covers:
// seven lines joined by "\n" (no final line feed) holding "assent-decision-v1",
// the event id, the request id, the outcome, the args digest, the request
// digest (either digest may be empty), and the decision time in UTC as RFC
// 3339 with as many fractional digits as needed (time.RFC3339Nano: none for
// a whole second, at most nine, trailing zeros dropped), which is how Go
// writes a UTC time in JSON. A value holding a line feed or a carriage return
// has no canonical text (ErrBadValue).
func CanonicalDecision(eventID string, d Decided) ([]byte, error) {
	if d.DecidedAt.IsZero() {
		return nil, fieldErr("decided_at", ErrMissingField)
	}
	lines := []struct{ name, v string }{
		{"id", eventID},
		{"request_id", d.RequestID},
		{"outcome", string(d.Outcome)},
		{"args_digest", d.ArgsDigest},
		{"request_digest", d.RequestDigest},
	}
	var b bytes.Buffer
	b.WriteString(signatureContext)
	for _, l := range lines {
		if strings.ContainsAny(l.v, "\r\n") {
			return nil, fieldErr(l.name, fmt.Errorf("%w: holds a line break", ErrBadValue))
		}
		b.WriteByte('\n')
		b.WriteString(l.v)
	}
	b.WriteByte('\n')
	b.WriteString(d.DecidedAt.UTC().Format(time.RFC3339Nano))
	return b.Bytes(), nil
}

// NewDecisionKey makes a new decision key: an nkeys account key pair.
func NewDecisionKey() (nkeys.KeyPair, error) { return nkeys.CreateAccount() }

// ParseDecisionKey reads a decision key from the contents of a seed file: an
// nkeys account seed ("SA..."), alone with white space around it, or
// decorated as nsc writes it (between "-----BEGIN ... NKEY SEED-----" lines).
// A seed of another type (a user's "SU...") is refused.
func ParseDecisionKey(seed []byte) (nkeys.KeyPair, error) {
	kp, err := nkeys.FromSeed(bytes.TrimSpace(seed))
	if err != nil {
		var derr error
		if kp, derr = nkeys.ParseDecoratedNKey(seed); derr != nil {
			return nil, fmt.Errorf("decision key: not an nkeys seed: %w", err)
		}
	}
	if err := checkDecisionKey(kp); err != nil {
		return nil, err
	}
	return kp, nil
}

// checkDecisionKey checks that kp can sign and is an account key.
func checkDecisionKey(kp nkeys.KeyPair) error {
	if _, err := kp.Seed(); err != nil {
		return fmt.Errorf("decision key: a public key only, want its seed: %w", err)
	}
	pub, err := kp.PublicKey()
	if err != nil {
		return fmt.Errorf("decision key: %w", err)
	}
	if nkeys.Prefix(pub) != nkeys.PrefixByteAccount {
		return fmt.Errorf("decision key: a %s key, want an account key (seed SA..., public key A...)", nkeys.Prefix(pub))
	}
	return nil
}

// Signer signs decided events with a decision key. It is safe for
// concurrent use.
type Signer struct {
	key    nkeys.KeyPair
	public string
}

// NewSigner returns a signer with key, an account key pair with its seed
// (NewDecisionKey, ParseDecisionKey).
func NewSigner(key nkeys.KeyPair) (*Signer, error) {
	if key == nil {
		return nil, errors.New("decision key: nil")
	}
	if err := checkDecisionKey(key); err != nil {
		return nil, err
	}
	pub, _ := key.PublicKey() // checked above
	return &Signer{key: key, public: pub}, nil
}

// PublicKey is the key readers trust to accept this signer's decisions
// ("A...").
func (s *Signer) PublicKey() string { return s.public }

// Sign signs e, a decided event, over the canonical text of the data it
// carries (CanonicalDecision), and sets its SignatureAttribute. Change
// nothing that the text covers afterwards.
func (s *Signer) Sign(e *Event) error {
	d, err := DecodeDecided(e)
	if err != nil {
		return err
	}
	text, err := canonicalEvent(e, d)
	if err != nil {
		return err
	}
	sig, err := s.key.Sign(text)
	if err != nil {
		return fmt.Errorf("sign decision: %w", err)
	}
	return e.Context.SetExtension(SignatureAttribute, signatureVersion+"."+s.public+"."+base64.RawURLEncoding.EncodeToString(sig))
}

// TrustedKeys are the decision keys whose signatures a reader accepts: more
// than one while keys rotate. The zero value trusts no key.
type TrustedKeys struct {
	keys map[string]nkeys.KeyPair
}

// NewTrustedKeys trusts the decision keys with these public keys ("A...",
// account keys). It reports every key that is not one at once.
func NewTrustedKeys(publicKeys ...string) (*TrustedKeys, error) {
	t := &TrustedKeys{keys: make(map[string]nkeys.KeyPair, len(publicKeys))}
	var errs []error
	for _, k := range publicKeys {
		if !nkeys.IsValidPublicAccountKey(k) {
			errs = append(errs, fmt.Errorf("trusted key %q: not an nkeys account public key (A..., 56 characters)", truncate(k, 60)))
			continue
		}
		kp, err := nkeys.FromPublicKey(k)
		if err != nil {
			errs = append(errs, fmt.Errorf("trusted key %q: %w", truncate(k, 60), err))
			continue
		}
		t.keys[k] = kp
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return t, nil
}

// ParseTrustedKeys reads a list of decision keys' public keys separated by
// commas or white space, as a flag or an environment variable carries them,
// and checks each (NewTrustedKeys).
func ParseTrustedKeys(list string) ([]string, error) {
	keys := strings.FieldsFunc(list, func(r rune) bool { return r == ',' || unicode.IsSpace(r) })
	if _, err := NewTrustedKeys(keys...); err != nil {
		return nil, err
	}
	return keys, nil
}

// Keys returns the trusted public keys, sorted.
func (t *TrustedKeys) Keys() []string {
	out := make([]string, 0, len(t.keys))
	for k := range t.keys {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// Verify reads the data of e, a decided event, and checks that a trusted key
// signed it. It returns ErrUnsigned for an event without the signature
// attribute, ErrUntrustedKey for one signed by another key, ErrBadSignature
// for a malformed signature or one that does not verify, and the errors of
// DecodeDecided for data that is not a decision. It does not check the args
// against their digest (Decided.VerifyArgs) nor the request digest.
func (t *TrustedKeys) Verify(e *Event) (Decided, error) {
	key, sig, err := parseSignature(e)
	if err != nil {
		return Decided{}, err
	}
	verifier, ok := t.keys[key]
	if !ok {
		return Decided{}, fieldErr(SignatureAttribute, fmt.Errorf("%w: %s", ErrUntrustedKey, key))
	}
	d, err := DecodeDecided(e)
	if err != nil {
		return Decided{}, err
	}
	text, err := canonicalEvent(e, d)
	if err != nil {
		return Decided{}, fieldErr(SignatureAttribute, fmt.Errorf("%w: %w", ErrBadSignature, err))
	}
	if err := verifier.Verify(text, sig); err != nil {
		return Decided{}, fieldErr(SignatureAttribute, fmt.Errorf("%w: does not verify with %s: the event changed after it was signed, or another key signed it", ErrBadSignature, key))
	}
	return d, nil
}

// canonicalEvent is the canonical text of e, whose data is d. The decision
// time is a line of it as the data carries it, so that a reader in any
// language can take the string as it is: e is refused unless it carries the
// time in the canonical form (ErrBadValue).
func canonicalEvent(e *Event, d Decided) ([]byte, error) {
	var raw struct {
		DecidedAt string `json:"decided_at"`
	}
	if err := json.Unmarshal(e.Data(), &raw); err != nil {
		return nil, fieldErr("data", fmt.Errorf("%w: %v", ErrMalformed, err))
	}
	if want := d.DecidedAt.UTC().Format(time.RFC3339Nano); raw.DecidedAt != want {
		return nil, fieldErr("decided_at", fmt.Errorf("%w: %q is not in the form a signature covers (UTC, RFC 3339, as in %q)", ErrBadValue, truncate(raw.DecidedAt, 60), want))
	}
	return CanonicalDecision(e.ID(), d)
}

// parseSignature splits e's signature attribute into the public key it
// names and the signature bytes.
func parseSignature(e *Event) (key string, sig []byte, err error) {
	v, ok := e.Extensions()[SignatureAttribute]
	if !ok {
		return "", nil, fieldErr(SignatureAttribute, ErrUnsigned)
	}
	s, ok := v.(string)
	if !ok {
		return "", nil, fieldErr(SignatureAttribute, fmt.Errorf("%w: not a string", ErrBadSignature))
	}
	parts := strings.Split(s, ".")
	switch {
	case len(parts) != 3:
		return "", nil, fieldErr(SignatureAttribute, fmt.Errorf("%w: want v1.<public key>.<signature>", ErrBadSignature))
	case parts[0] != signatureVersion:
		return "", nil, fieldErr(SignatureAttribute, fmt.Errorf("%w: scheme %q (want %s)", ErrBadSignature, truncate(parts[0], 20), signatureVersion))
	case !nkeys.IsValidPublicAccountKey(parts[1]):
		return "", nil, fieldErr(SignatureAttribute, fmt.Errorf("%w: %q is not an account public key", ErrBadSignature, truncate(parts[1], 60)))
	}
	sig, err = base64.RawURLEncoding.Strict().DecodeString(parts[2])
	if err != nil || len(sig) != 64 {
		return "", nil, fieldErr(SignatureAttribute, fmt.Errorf("%w: the signature is not 64 bytes in unpadded base64url", ErrBadSignature))
	}
	return parts[1], sig, nil
}
