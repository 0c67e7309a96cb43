package events_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nkeys"

	"github.com/assent-dev/assent/internal/testenv"
	"github.com/assent-dev/assent/pkg/events"
)

// newKey makes a decision key and its signer.
func newKey(t *testing.T) (*events.Signer, string) {
	t.Helper()
	kp, err := events.NewDecisionKey()
	if err != nil {
		t.Fatal(err)
	}
	s, err := events.NewSigner(kp)
	if err != nil {
		t.Fatal(err)
	}
	return s, s.PublicKey()
}

// sampleDecision is a decision as the broker makes one.
func sampleDecision(t *testing.T) events.Decided {
	t.Helper()
	args := json.RawMessage(`{"path":"/srv/reports/q3-draft.csv"}`)
	digest, err := events.ArgsDigest(args)
	if err != nil {
		t.Fatal(err)
	}
	return events.Decided{
		RequestID: events.NewID(), Outcome: events.Approved, Reason: "fine", Args: args, ArgsDigest: digest,
		DecidedAt:     time.Date(2026, 3, 4, 5, 6, 7, 890_123_000, time.UTC),
		RequestDigest: "sha256:81b1fa218536b0078493d9de4ecbd9ed86f1728d83b8cd4b0ff0ed67458e5da3",
	}
}

// decidedEvent builds a decided event with id and d, and sets its signature
// attribute to sig unless sig is empty.
func decidedEvent(t *testing.T, id string, d events.Decided, sig any) events.Event {
	t.Helper()
	e, err := events.New(events.TypeDecided, id, "broker/test", d)
	if err != nil {
		t.Fatal(err)
	}
	if sig != nil {
		if err := e.Context.SetExtension(events.SignatureAttribute, sig); err != nil {
			t.Fatal(err)
		}
	}
	return e
}

// signed builds d as a decided event signed by s, and returns it with its
// signature value.
func signed(t *testing.T, s *events.Signer, id string, d events.Decided) (events.Event, string) {
	t.Helper()
	e := decidedEvent(t, id, d, nil)
	if err := s.Sign(&e); err != nil {
		t.Fatal(err)
	}
	return e, e.Extensions()[events.SignatureAttribute].(string)
}

// TestSignVerify: a signed decision verifies with its key trusted, and any
// change to what the signature covers, another key, an untrusted key, a
// missing or malformed attribute is refused with its error.
func TestSignVerify(t *testing.T) {
	signer, pub := newKey(t)
	other, _ := newKey(t)
	trusted, err := events.NewTrustedKeys(pub)
	if err != nil {
		t.Fatal(err)
	}
	id := events.NewID()
	base := sampleDecision(t)
	_, sig := signed(t, signer, id, base)
	_, otherSig := signed(t, other, id, base)
	sigPart := sig[strings.LastIndexByte(sig, '.')+1:]
	otherSigPart := otherSig[strings.LastIndexByte(otherSig, '.')+1:]
	user, _ := nkeys.CreateUser()
	userPub, _ := user.PublicKey()

	edit := func(f func(d *events.Decided)) events.Decided {
		d := base
		f(&d)
		return d
	}
	cases := []struct {
		name string
		id   string
		d    events.Decided
		sig  any
		want error
	}{
		{"as signed", id, base, sig, nil},
		{"reason is not covered", id, edit(func(d *events.Decided) { d.Reason = "changed" }), sig, nil},
		{"event id", events.NewID(), base, sig, events.ErrBadSignature},
		{"request id", id, edit(func(d *events.Decided) { d.RequestID = events.NewID() }), sig, events.ErrBadSignature},
		{"outcome", id, edit(func(d *events.Decided) { d.Outcome = events.Denied }), sig, events.ErrBadSignature},
		{"args digest", id, edit(func(d *events.Decided) {
			d.Args = json.RawMessage(`{"path":"/"}`)
			d.ArgsDigest, _ = events.ArgsDigest(d.Args)
		}), sig, events.ErrBadSignature},
		{"args digest dropped", id, edit(func(d *events.Decided) { d.ArgsDigest = "" }), sig, events.ErrBadSignature},
		{"request digest", id, edit(func(d *events.Decided) { d.RequestDigest = "sha256:" + strings.Repeat("0", 64) }), sig, events.ErrBadSignature},
		{"request digest dropped", id, edit(func(d *events.Decided) { d.RequestDigest = "" }), sig, events.ErrBadSignature},
		{"decided at", id, edit(func(d *events.Decided) { d.DecidedAt = d.DecidedAt.Add(time.Nanosecond) }), sig, events.ErrBadSignature},
		{"decided at elsewhere", id, edit(func(d *events.Decided) { d.DecidedAt = d.DecidedAt.In(time.FixedZone("X", 3600)) }), sig, events.ErrBadSignature},
		{"wrong key: names the trusted key, signed by another", id, base, "v1." + pub + "." + otherSigPart, events.ErrBadSignature},
		{"unknown key", id, base, otherSig, events.ErrUntrustedKey},
		{"missing attribute", id, base, nil, events.ErrUnsigned},
		{"no version", id, base, pub + "." + sigPart, events.ErrBadSignature},
		{"another version", id, base, "v2." + pub + "." + sigPart, events.ErrBadSignature},
		{"a user key", id, base, "v1." + userPub + "." + sigPart, events.ErrBadSignature},
		{"padded signature", id, base, sig + "==", events.ErrBadSignature},
		{"short signature", id, base, sig[:len(sig)-4], events.ErrBadSignature},
		{"standard base64", id, base, "v1." + pub + "." + strings.NewReplacer("-", "+", "_", "/").Replace(sigPart) + "+", events.ErrBadSignature},
		{"not a string", id, base, 7, events.ErrBadSignature},
		{"empty", id, base, "", events.ErrBadSignature},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := decidedEvent(t, c.id, c.d, c.sig)
			got, err := trusted.Verify(&e)
			if !errors.Is(err, c.want) || (err != nil) != (c.want != nil) {
				t.Fatalf("Verify = %v, want %v", err, c.want)
			}
			if err != nil {
				if !errors.Is(err, events.ErrInvalid) {
					t.Errorf("%v does not match ErrInvalid", err)
				}
				return
			}
			if got.RequestID != c.d.RequestID || got.Outcome != c.d.Outcome || got.Reason != c.d.Reason {
				t.Errorf("Verify returned %+v", got)
			}
		})
	}
}

// TestVerifyAcrossEncodings: the signature survives both content modes and
// re-encoding, being over values rather than bytes.
func TestVerifyAcrossEncodings(t *testing.T) {
	signer, pub := newKey(t)
	trusted, _ := events.NewTrustedKeys(pub)
	e, _ := signed(t, signer, "", sampleDecision(t))
	for name, encode := range map[string]func(*events.Event) (events.Header, []byte, error){"structured": events.Encode, "binary": events.EncodeBinary} {
		h, body, err := encode(&e)
		if err != nil {
			t.Fatal(err)
		}
		got, err := events.Decode(h, body)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if _, err := trusted.Verify(&got); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	// Another layout of the same JSON.
	_, body, _ := events.Encode(&e)
	var pretty bytes.Buffer
	if err := json.Indent(&pretty, body, "", "  "); err != nil {
		t.Fatal(err)
	}
	got, err := events.Decode(nil, pretty.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := trusted.Verify(&got); err != nil {
		t.Errorf("indented: %v", err)
	}
}

// TestKeyRotation: readers trusting the old and the new key accept
// decisions signed by either; one trusting only the new key refuses the
// old one's.
func TestKeyRotation(t *testing.T) {
	a, pubA := newKey(t)
	b, pubB := newKey(t)
	both, err := events.NewTrustedKeys(pubA, pubB)
	if err != nil {
		t.Fatal(err)
	}
	onlyB, _ := events.NewTrustedKeys(pubB)
	byA, _ := signed(t, a, "", sampleDecision(t))
	byB, _ := signed(t, b, "", sampleDecision(t))
	for _, e := range []events.Event{byA, byB} {
		if _, err := both.Verify(&e); err != nil {
			t.Errorf("trusting both keys: %v", err)
		}
	}
	if _, err := onlyB.Verify(&byB); err != nil {
		t.Errorf("trusting B, B's decision: %v", err)
	}
	if _, err := onlyB.Verify(&byA); !errors.Is(err, events.ErrUntrustedKey) {
		t.Errorf("trusting B, A's decision: %v, want ErrUntrustedKey", err)
	}
	var none events.TrustedKeys
	if _, err := none.Verify(&byA); !errors.Is(err, events.ErrUntrustedKey) {
		t.Errorf("trusting no key: %v, want ErrUntrustedKey", err)
	}
	if got := both.Keys(); len(got) != 2 {
		t.Errorf("Keys() = %v", got)
	}
}

func TestCanonicalDecision(t *testing.T) {
	d := sampleDecision(t)
	text, err := events.CanonicalDecision("e-1", d)
	if err != nil {
		t.Fatal(err)
	}
	want := "assent-decision-v1\ne-1\n" + d.RequestID + "\napproved\n" + d.ArgsDigest + "\n" + d.RequestDigest + "\n2026-03-04T05:06:07.890123Z"
	if string(text) != want {
		t.Fatalf("canonical text\n%q\nwant\n%q", text, want)
	}
	// Empty digests are empty lines; a whole second has no fraction.
	d.ArgsDigest, d.RequestDigest, d.DecidedAt = "", "", time.Date(2026, 3, 4, 5, 6, 7, 0, time.FixedZone("X", -3600))
	text, _ = events.CanonicalDecision("e-1", d)
	if want := "assent-decision-v1\ne-1\n" + d.RequestID + "\napproved\n\n\n2026-03-04T06:06:07Z"; string(text) != want {
		t.Fatalf("canonical text\n%q\nwant\n%q", text, want)
	}
	// A line break would let two events share one text.
	d.ArgsDigest = "sha256:x\nsha256:y"
	if _, err := events.CanonicalDecision("e-1", d); !errors.Is(err, events.ErrBadValue) {
		t.Fatalf("line break in a digest: %v", err)
	}
	d = sampleDecision(t)
	d.DecidedAt = time.Time{}
	if _, err := events.CanonicalDecision("e-1", d); !errors.Is(err, events.ErrMissingField) {
		t.Fatalf("no decided_at: %v", err)
	}
}

func TestDecisionKeys(t *testing.T) {
	kp, err := events.NewDecisionKey()
	if err != nil {
		t.Fatal(err)
	}
	seed, _ := kp.Seed()
	pub, _ := kp.PublicKey()
	user, _ := nkeys.CreateUser()
	userSeed, _ := user.Seed()
	userPub, _ := user.PublicKey()
	decorated := "-----BEGIN ACCOUNT NKEY SEED-----\n" + string(seed) + "\n------END ACCOUNT NKEY SEED------\n"
	for _, c := range []struct {
		name string
		in   string
		ok   bool
	}{
		{"seed", string(seed), true},
		{"seed line", "\n  " + string(seed) + "\r\n", true},
		{"decorated", decorated, true},
		{"user seed", string(userSeed), false},
		{"public key", pub, false},
		{"garbage", "not a seed", false},
		{"empty", "", false},
	} {
		got, err := events.ParseDecisionKey([]byte(c.in))
		if c.ok != (err == nil) {
			t.Errorf("%s: ParseDecisionKey: %v", c.name, err)
			continue
		}
		if err == nil {
			if p, _ := got.PublicKey(); p != pub {
				t.Errorf("%s: public key %s, want %s", c.name, p, pub)
			}
		}
	}
	if _, err := events.NewSigner(user); err == nil {
		t.Error("NewSigner took a user key")
	}
	public, _ := nkeys.FromPublicKey(pub)
	if _, err := events.NewSigner(public); err == nil {
		t.Error("NewSigner took a public key")
	}

	if _, err := events.NewTrustedKeys(pub, userPub, "AXYZ"); err == nil || strings.Count(err.Error(), "trusted key") != 2 {
		t.Errorf("NewTrustedKeys reports %v, want the two bad keys", err)
	}
	keys, err := events.ParseTrustedKeys(" " + pub + ",\n" + string(mustPub(t)) + " ")
	if err != nil || len(keys) != 2 || keys[0] != pub {
		t.Errorf("ParseTrustedKeys = %v, %v", keys, err)
	}
	if keys, err := events.ParseTrustedKeys(""); err != nil || len(keys) != 0 {
		t.Errorf("ParseTrustedKeys(\"\") = %v, %v", keys, err)
	}
	if _, err := events.ParseTrustedKeys(pub + "," + userPub); err == nil {
		t.Error("ParseTrustedKeys took a user key")
	}
}

func mustPub(t *testing.T) string {
	t.Helper()
	_, pub := newKey(t)
	return pub
}

// protocolDoc is the wire contract, which holds the worked example.
const protocolDoc = "../../docs/protocol.md"

// docExample returns the fenced code blocks of the signed-decision worked
// example of docs/protocol.md, in order: the seed, the public key, the
// event, the canonical text, the signature value, the Python verifier. Each
// is the block's text without the line feed that ends it.
func docExample(t *testing.T) []string {
	t.Helper()
	doc, err := os.ReadFile(protocolDoc)
	if err != nil {
		t.Fatal(err)
	}
	const heading = "\n### Worked example: a signed decision\n"
	i := bytes.Index(doc, []byte(heading))
	if i < 0 {
		t.Fatalf("%s: no %q section", protocolDoc, strings.TrimSpace(heading))
	}
	doc = doc[i+len(heading):]
	if j := bytes.Index(doc, []byte("\n## ")); j >= 0 {
		doc = doc[:j]
	}
	var blocks []string
	for _, m := range regexp.MustCompile("(?s)\n```[a-z]*\n(.*?)\n```\n").FindAllSubmatch(doc, -1) {
		blocks = append(blocks, string(m[1]))
	}
	if len(blocks) != 6 {
		t.Fatalf("%s: the worked example has %d code blocks, want 6 (seed, public key, event, canonical text, signature, Python)", protocolDoc, len(blocks))
	}
	return blocks
}

// TestSignatureDocExample: the worked example of docs/protocol.md is what
// this package makes, byte for byte: the key from the seed, the canonical
// text of the event, its signature, and the event verifies.
func TestSignatureDocExample(t *testing.T) {
	ex := docExample(t)
	seed, pub, body, text, sig := ex[0], ex[1], ex[2], ex[3], ex[4]

	raw := make([]byte, 32)
	for i := range raw {
		raw[i] = byte(i)
	}
	fromRaw, _ := nkeys.FromRawSeed(nkeys.PrefixByteAccount, raw)
	if s, _ := fromRaw.Seed(); string(s) != seed {
		t.Errorf("the seed of bytes 0x00-0x1f is %s, the doc says %s", s, seed)
	}
	kp, err := events.ParseDecisionKey([]byte(seed))
	if err != nil {
		t.Fatal(err)
	}
	signer, err := events.NewSigner(kp)
	if err != nil {
		t.Fatal(err)
	}
	if signer.PublicKey() != pub {
		t.Errorf("public key %s, the doc says %s", signer.PublicKey(), pub)
	}

	e, err := events.Decode(events.Header{"Content-Type": {events.ContentTypeStructured}}, []byte(body))
	if err != nil {
		t.Fatal(err)
	}
	if got := e.Extensions()[events.SignatureAttribute]; got != sig {
		t.Errorf("the event's %s is %v, the doc's signature %s", events.SignatureAttribute, got, sig)
	}
	d, err := events.DecodeDecided(&e)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.VerifyArgs(); err != nil {
		t.Error(err)
	}
	canonical, err := events.CanonicalDecision(e.ID(), d)
	if err != nil {
		t.Fatal(err)
	}
	if string(canonical) != text {
		t.Errorf("canonical text\n%q\nthe doc says\n%q", canonical, text)
	}
	trusted, _ := events.NewTrustedKeys(pub)
	if _, err := trusted.Verify(&e); err != nil {
		t.Errorf("the doc's event does not verify: %v", err)
	}
	// Ed25519 signatures are deterministic: signing again gives the doc's.
	again := e.Clone()
	if err := signer.Sign(&again); err != nil {
		t.Fatal(err)
	}
	if got := again.Extensions()[events.SignatureAttribute]; got != sig {
		t.Errorf("signing the event gives\n%v\nthe doc says\n%s", got, sig)
	}
}

// TestSignatureDocPython runs the Python verifier of docs/protocol.md on the
// worked example, and on the example with its outcome changed.
func TestSignatureDocPython(t *testing.T) {
	py := testenv.Program(t, "python3", "python3")
	if out, err := exec.Command(py, "-c", "import cryptography").CombinedOutput(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("python3 has no cryptography package; .ci/run installs it (apt-get install -y python3-cryptography): %s", out)
		}
		t.Skipf("python3 has no cryptography package (apt-get install -y python3-cryptography): %s", out)
	}
	ex := docExample(t)
	dir := t.TempDir()
	script := ex[5] + `

import json, sys

event = json.loads(sys.stdin.read())
print(verify_decision(event, [sys.argv[1]])["outcome"])
`
	file := filepath.Join(dir, "verify.py")
	if err := os.WriteFile(file, []byte(script), 0o600); err != nil {
		t.Fatal(err)
	}
	run := func(body string) (string, error) {
		cmd := exec.Command(py, file, ex[1])
		cmd.Stdin = strings.NewReader(body)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	if out, err := run(ex[2]); err != nil || strings.TrimSpace(out) != "approved" {
		t.Fatalf("the doc's verifier on the doc's event: %v\n%s", err, out)
	}
	tampered := strings.Replace(ex[2], `"outcome": "approved"`, `"outcome": "denied"`, 1)
	if tampered == ex[2] {
		t.Fatal("the example has no approved outcome to change")
	}
	if out, err := run(tampered); err == nil || !strings.Contains(out, "InvalidSignature") {
		t.Fatalf("the doc's verifier accepted a changed outcome: %v\n%s", err, out)
	}
}

// FuzzVerifyDecision: whatever a message holds, Verify never panics, and
// only an event whose signed fields are the signed event's verifies.
func FuzzVerifyDecision(f *testing.F) {
	kp, err := nkeys.FromRawSeed(nkeys.PrefixByteAccount, make([]byte, 32))
	if err != nil {
		f.Fatal(err)
	}
	signer, _ := events.NewSigner(kp)
	trusted, _ := events.NewTrustedKeys(signer.PublicKey())
	d := events.Decided{RequestID: "0193a5b2-7c1e-7d3a-9f1e-3c2b1a0f9e8d", Outcome: events.Approved, Args: json.RawMessage(`{"path":"/tmp/x"}`),
		DecidedAt: time.Date(2025, 1, 2, 3, 4, 5, 250_000_000, time.UTC), RequestDigest: "sha256:81b1fa218536b0078493d9de4ecbd9ed86f1728d83b8cd4b0ff0ed67458e5da3"}
	d.ArgsDigest, _ = events.ArgsDigest(d.Args)
	e, err := events.New(events.TypeDecided, "0193a5b3-0000-7000-8000-000000000002", "broker/main", d)
	if err != nil {
		f.Fatal(err)
	}
	if err := signer.Sign(&e); err != nil {
		f.Fatal(err)
	}
	want, _ := events.CanonicalDecision(e.ID(), d)
	_, body, _ := events.Encode(&e)
	f.Add(body)
	f.Add(bytes.Replace(body, []byte(`"approved"`), []byte(`"denied"`), 1))
	f.Add(bytes.Replace(body, []byte(`.25Z"`), []byte(`.250Z"`), 1))
	f.Add(bytes.Replace(body, []byte(`"assentsig":"v1.`), []byte(`"assentsig":"v2.`), 1))
	f.Fuzz(func(t *testing.T, body []byte) {
		e, err := events.Decode(nil, body)
		if err != nil {
			return
		}
		got, err := trusted.Verify(&e)
		if err != nil {
			return
		}
		text, err := events.CanonicalDecision(e.ID(), got)
		if err != nil || !bytes.Equal(text, want) {
			t.Fatalf("an event with other signed fields verifies:\n%s\n%q", body, text)
		}
	})
}
