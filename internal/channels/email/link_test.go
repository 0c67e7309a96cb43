package email

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/assent-dev/assent/pkg/events"
)

var testKey = []byte("0123456789abcdef0123456789abcdef")

func testLink(t testing.TB) link {
	t.Helper()
	digest, err := events.ArgsDigest(json.RawMessage(`{"path":"/srv/q3.csv"}`))
	if err != nil {
		t.Fatal(err)
	}
	return link{Request: "01a2-req", Principal: "alice", Decision: events.Approve, Args: digest, To: addressHash("Alice@Example.com"), Expires: time.Now().Add(time.Hour).Unix()}
}

// signRaw signs payload as sign would, whatever it holds.
func signRaw(s signer, payload []byte) string {
	return b64.EncodeToString(payload) + "." + b64.EncodeToString(s.mac(payload))
}

func TestLinkVerify(t *testing.T) {
	s := signer{key: testKey}
	l := testLink(t)
	token := s.sign(l)
	now := time.Now()
	payload, mac, _ := strings.Cut(token, ".")
	raw, _ := b64.DecodeString(payload)
	// The last character of a 32-byte MAC in unpadded base64 carries 4
	// unused bits: another character there decodes to the same bytes.
	last := mac[len(mac)-1]
	alias := mac[:len(mac)-1] + string(b64Alphabet[strings.IndexByte(b64Alphabet, last)^1])
	reshape := func(f func(map[string]any)) string {
		var m map[string]any
		_ = json.Unmarshal(raw, &m)
		f(m)
		b, _ := json.Marshal(m)
		return signRaw(s, b)
	}
	cases := []struct {
		name  string
		token string
		now   time.Time
		want  error
	}{
		{"valid", token, now, nil},
		{"expired", token, time.Unix(l.Expires, 0), errLinkExpired},
		{"other secret", signer{key: []byte(strings.Repeat("k", 32))}.sign(l), now, errBadLink},
		{"payload changed", b64.EncodeToString([]byte(strings.Replace(string(raw), `"alice"`, `"alicf"`, 1))) + "." + mac, now, errBadLink},
		{"decision swapped", b64.EncodeToString([]byte(strings.Replace(string(raw), `"approve"`, `"deny"`, 1))) + "." + mac, now, errBadLink},
		{"signature changed", payload + "." + string(b64Alphabet[strings.IndexByte(b64Alphabet, mac[0])^1]) + mac[1:], now, errBadLink},
		{"non-canonical signature", payload + "." + alias, now, errBadLink},
		{"padded", token + "=", now, errBadLink},
		{"no signature", payload, now, errBadLink},
		{"empty", "", now, errBadLink},
		{"too long", token + strings.Repeat("A", maxTokenLength), now, errBadLink},
		{"unknown field", reshape(func(m map[string]any) { m["x"] = 1 }), now, errBadLink},
		{"bad decision", reshape(func(m map[string]any) { m["d"] = "maybe" }), now, errBadLink},
		{"bad principal", reshape(func(m map[string]any) { m["p"] = "alice.>" }), now, errBadLink},
		{"other version", reshape(func(m map[string]any) { m["v"] = 2 }), now, errBadLink},
		{"no expiry", reshape(func(m map[string]any) { delete(m, "e") }), now, errBadLink},
		{"trailing data", signRaw(s, append(append([]byte{}, raw...), []byte(` {}`)...)), now, errBadLink},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := s.verify(c.token, c.now)
			if !errors.Is(err, c.want) || (c.want == nil) != (err == nil) {
				t.Fatalf("verify: %v, want %v", err, c.want)
			}
			if err == nil && got != (link{V: linkVersion, Request: l.Request, Principal: l.Principal, Decision: l.Decision, Args: l.Args, To: l.To, Expires: l.Expires}) {
				t.Fatalf("verify: %+v, want %+v", got, l)
			}
		})
	}
}

const b64Alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"

func TestKeys(t *testing.T) {
	a, b := usedKey("token-a"), usedKey("token-b")
	if a == b || !strings.HasPrefix(a, "used.") || len(a) != len("used.")+64 {
		t.Fatalf("used keys %q %q", a, b)
	}
	if sentKey("r", "alice", "new") == sentKey("r", "alice", "reminder") || sentKey("r", "al", "ice") == sentKey("r", "ali", "ce") {
		t.Fatal("sent keys collide")
	}
	if addressHash(" Alice@Example.COM ") != addressHash("alice@example.com") || addressHash("alice@example.com") == addressHash("bob@example.com") {
		t.Fatal("address hashes: want case-insensitive and distinct")
	}
}

// FuzzVerify: no token makes verify panic, and every token it accepts is
// the one sign makes for the link it read (one token per link: its single
// use is recorded by token).
func FuzzVerify(f *testing.F) {
	s := signer{key: testKey}
	token := s.sign(testLink(f))
	for _, seed := range []string{token, token[:len(token)/2], token + "=", strings.Replace(token, ".", "..", 1), "", ".", "e30.", "e30.AAAA"} {
		f.Add(seed)
	}
	now := time.Now()
	f.Fuzz(func(t *testing.T, token string) {
		l, err := s.verify(token, now)
		if err != nil {
			return
		}
		if again := s.sign(l); again != token {
			t.Fatalf("accepted %q, which sign writes as %q", token, again)
		}
	})
}

// FuzzVerifyPayload: whatever payload carries a valid signature (one made
// with the secret), verify either refuses it or returns a well-formed link.
func FuzzVerifyPayload(f *testing.F) {
	s := signer{key: testKey}
	valid, _ := json.Marshal(testLink(f))
	for _, seed := range []string{string(valid), `{}`, `null`, `[]`, `{"v":1}`, `{"v":1,"r":"a","p":"b","d":"deny","a":"sha256:` + strings.Repeat("0", 64) + `","t":"` + strings.Repeat("0", 32) + `","e":99999999999}`} {
		f.Add([]byte(seed))
	}
	now := time.Unix(1, 0)
	f.Fuzz(func(t *testing.T, payload []byte) {
		l, err := s.verify(signRaw(s, payload), now)
		if err != nil {
			if !errors.Is(err, errBadLink) && !errors.Is(err, errLinkExpired) {
				t.Fatalf("verify: %v matches neither errBadLink nor errLinkExpired", err)
			}
			return
		}
		if err := l.valid(); err != nil {
			t.Fatalf("accepted %q: %v", payload, err)
		}
	})
}
