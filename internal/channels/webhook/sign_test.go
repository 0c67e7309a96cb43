package webhook_test

import (
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/assent-dev/assent/internal/channels/webhook"
	"github.com/assent-dev/assent/internal/testenv"
)

// newSecret returns a fresh secret as configured ("whsec_...") and its key.
func newSecret(t testing.TB) (string, []byte) {
	t.Helper()
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		t.Fatal(err)
	}
	return webhook.SecretPrefix + base64.StdEncoding.EncodeToString(key), key
}

// signed returns the headers of a message signed with key at ts.
func signed(key []byte, id string, ts time.Time, body []byte) http.Header {
	h := http.Header{}
	h.Set(webhook.HeaderID, id)
	h.Set(webhook.HeaderTimestamp, strconv.FormatInt(ts.Unix(), 10))
	h.Set(webhook.HeaderSignature, webhook.Sign(key, id, ts, body))
	return h
}

// TestSignKnownAnswer pins the signature to the Standard Webhooks definition,
// computed here independently of Sign: base64 HMAC-SHA256 over
// id.timestamp.body.
func TestSignKnownAnswer(t *testing.T) {
	key := []byte("0123456789abcdef0123456789abcdef")
	ts := time.Unix(1700000000, 0)
	body := []byte(`{"hello":"world"}`)
	m := hmac.New(sha256.New, key)
	m.Write([]byte("msg_1.1700000000." + string(body)))
	want := "v1," + base64.StdEncoding.EncodeToString(m.Sum(nil))
	if got := webhook.Sign(key, "msg_1", ts, body); got != want {
		t.Fatalf("Sign = %s, want %s", got, want)
	}
	// A vector of the Standard Webhooks reference libraries.
	refKey, err := webhook.ParseSecret("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
	if err != nil {
		t.Fatal(err)
	}
	got := webhook.Sign(refKey, "msg_p5jXN8AQM9LWM0D4loKWxJek", time.Unix(1614265330, 0), []byte(`{"test": 2432232314}`))
	if want := "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="; got != want {
		t.Fatalf("reference vector: Sign = %s, want %s", got, want)
	}
}

func TestVerify(t *testing.T) {
	_, key := newSecret(t)
	_, other := newSecret(t)
	now := time.Now()
	body := []byte(`{"request_id":"r1","decision":"approve"}`)
	good := signed(key, "msg-1", now, body)
	with := func(f func(h http.Header)) http.Header {
		h := good.Clone()
		f(h)
		return h
	}
	for _, c := range []struct {
		name string
		h    http.Header
		body []byte
		want error
	}{
		{"valid", good, body, nil},
		{"header names in any case", with(func(h http.Header) {
			h.Set("WEBHOOK-ID", good.Get(webhook.HeaderID))
			h.Set("Webhook-Signature", good.Get(webhook.HeaderSignature))
		}), body, nil},
		{"one of several signatures", with(func(h http.Header) {
			h.Set(webhook.HeaderSignature, "v1,AAAA v2,whatever "+good.Get(webhook.HeaderSignature)+" v1,BBBB")
		}), body, nil},
		{"4 minutes old", signed(key, "msg-1", now.Add(-4*time.Minute), body), body, nil},
		{"4 minutes ahead", signed(key, "msg-1", now.Add(4*time.Minute), body), body, nil},
		{"other secret", signed(other, "msg-1", now, body), body, webhook.ErrBadSignature},
		{"body changed", good, append(bytes.Clone(body), ' '), webhook.ErrBadSignature},
		{"id changed", with(func(h http.Header) { h.Set(webhook.HeaderID, "msg-2") }), body, webhook.ErrBadSignature},
		{"timestamp changed within tolerance", with(func(h http.Header) {
			h.Set(webhook.HeaderTimestamp, strconv.FormatInt(now.Unix()-1, 10))
		}), body, webhook.ErrBadSignature},
		{"only another version", with(func(h http.Header) {
			h.Set(webhook.HeaderSignature, "v1a,"+strings.TrimPrefix(good.Get(webhook.HeaderSignature), "v1,"))
		}), body, webhook.ErrBadSignature},
		{"signature without version", with(func(h http.Header) {
			h.Set(webhook.HeaderSignature, strings.TrimPrefix(good.Get(webhook.HeaderSignature), "v1,"))
		}), body, webhook.ErrBadSignature},
		{"6 minutes old", signed(key, "msg-1", now.Add(-6*time.Minute), body), body, webhook.ErrStale},
		{"6 minutes ahead", signed(key, "msg-1", now.Add(6*time.Minute), body), body, webhook.ErrStale},
		{"no id", with(func(h http.Header) { h.Del(webhook.HeaderID) }), body, webhook.ErrNoSignature},
		{"no timestamp", with(func(h http.Header) { h.Del(webhook.HeaderTimestamp) }), body, webhook.ErrNoSignature},
		{"no signature", with(func(h http.Header) { h.Del(webhook.HeaderSignature) }), body, webhook.ErrNoSignature},
		{"timestamp not seconds", with(func(h http.Header) { h.Set(webhook.HeaderTimestamp, now.Format(time.RFC3339)) }), body, webhook.ErrNoSignature},
		{"negative timestamp", with(func(h http.Header) { h.Set(webhook.HeaderTimestamp, "-5") }), body, webhook.ErrNoSignature},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := webhook.Verify(key, c.h, c.body, now)
			if c.want == nil && err != nil || c.want != nil && !errors.Is(err, c.want) {
				t.Fatalf("Verify = %v, want %v", err, c.want)
			}
		})
	}
}

func TestParseSecret(t *testing.T) {
	key := bytes.Repeat([]byte{7}, 32)
	b64 := base64.StdEncoding.EncodeToString(key)
	for _, c := range []struct {
		in   string
		want error
	}{
		{"whsec_" + b64, nil},
		{b64, nil}, // the prefix is optional
		{"  whsec_" + b64 + "\n", nil},
		{"whsec_" + strings.TrimRight(b64, "="), nil}, // unpadded
		{"", webhook.ErrBadSecret},
		{"whsec_", webhook.ErrBadSecret},
		{"whsec_not base64!", webhook.ErrBadSecret},
		{"whsec_" + base64.StdEncoding.EncodeToString(key[:16]), webhook.ErrBadSecret}, // too short
	} {
		got, err := webhook.ParseSecret(c.in)
		switch {
		case c.want != nil && !errors.Is(err, c.want):
			t.Errorf("ParseSecret(%q) = %v, want %v", c.in, err, c.want)
		case c.want == nil && (err != nil || !bytes.Equal(got, key)):
			t.Errorf("ParseSecret(%q) = %x, %v; want the key", c.in, got, err)
		}
	}
}

// channelsDoc is the documentation the examples live in.
const channelsDoc = "../../../docs/channels.md"

// setupBlock returns the first fenced code block in lang of the webhook
// section of docs/channels.md.
func setupBlock(t *testing.T, lang string) string {
	t.Helper()
	doc, err := os.ReadFile(channelsDoc)
	if err != nil {
		t.Fatal(err)
	}
	if i := bytes.Index(doc, []byte("\n## Webhooks\n")); i >= 0 {
		doc = doc[i:]
	}
	m := regexp.MustCompile("(?s)```" + lang + "\n(.*?)```").FindSubmatch(doc)
	if m == nil {
		t.Fatalf("docs/channels.md: the webhook section has no %s block", lang)
	}
	return string(m[1])
}

// TestSetupGoExample: the Go receiver of docs/channels.md is verifyWebhook below, to
// the byte, and it accepts what Sign makes and refuses what it must.
func TestSetupGoExample(t *testing.T) {
	src, err := os.ReadFile("sign_test.go")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?s)// BEGIN docs/channels\.md\n(.*?)// END docs/channels\.md`).FindSubmatch(src)
	if m == nil {
		t.Fatal("sign_test.go: no BEGIN/END docs/channels.md markers")
	}
	if got, want := strings.TrimSpace(setupBlock(t, "go")), strings.TrimSpace(string(m[1])); got != want {
		t.Fatalf("docs/channels.md's Go example differs from verifyWebhook in sign_test.go:\n%s\nwant:\n%s", got, want)
	}
	secret, key := newSecret(t)
	now := time.Now()
	body := []byte(`{"specversion":"1.0"}`)
	h := signed(key, "evt-1", now, body)
	if err := verifyWebhook(secret, h, body, now); err != nil {
		t.Fatalf("valid delivery refused: %v", err)
	}
	if err := verifyWebhook(secret, h, append(body, ' '), now); err == nil {
		t.Fatal("changed body accepted")
	}
	if err := verifyWebhook(secret, signed(key, "evt-1", now.Add(-6*time.Minute), body), body, now); err == nil {
		t.Fatal("stale delivery accepted")
	}
}

// BEGIN docs/channels.md
// verifyWebhook checks an Assent webhook delivery (Standard Webhooks).
// secret is the endpoint's secret ("whsec_..."), body the raw request body.
func verifyWebhook(secret string, h http.Header, body []byte, now time.Time) error {
	key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, "whsec_"))
	if err != nil {
		return fmt.Errorf("bad secret: %w", err)
	}
	id, ts := h.Get("webhook-id"), h.Get("webhook-timestamp")
	sec, err := strconv.ParseInt(ts, 10, 64)
	if id == "" || err != nil {
		return errors.New("missing webhook-id or webhook-timestamp")
	}
	if d := now.Sub(time.Unix(sec, 0)); d > 5*time.Minute || d < -5*time.Minute {
		return errors.New("timestamp more than 5 minutes off")
	}
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte(id + "." + ts + "."))
	mac.Write(body)
	want := []byte("v1," + base64.StdEncoding.EncodeToString(mac.Sum(nil)))
	for _, sig := range strings.Fields(h.Get("webhook-signature")) {
		if hmac.Equal([]byte(sig), want) {
			return nil
		}
	}
	return errors.New("no valid signature")
}

// END docs/channels.md

// TestSetupPythonExample runs docs/channels.md's Python receiver with python3: its
// sign must equal Sign, its verify must accept what Sign makes and refuse a
// changed body, a wrong secret and a stale timestamp.
func TestSetupPythonExample(t *testing.T) {
	py := testenv.Program(t, "python3", "python3")
	secret, key := newSecret(t)
	_, otherKey := newSecret(t)
	now := time.Now()
	body := []byte(`{"specversion":"1.0","id":"evt-1","data":{"note":"ünïcode & <tags>"}}`)
	h := signed(key, "evt-1", now, body)
	stale := signed(key, "evt-1", now.Add(-6*time.Minute), body)
	forged := signed(otherKey, "evt-1", now, body)
	driver := fmt.Sprintf(`
import sys
secret = %q
body = bytes.fromhex(%q)
def headers(id, ts, sig):
    return {"webhook-id": id, "webhook-timestamp": ts, "webhook-signature": sig}
got = sign(secret, "evt-1", %q, body)
if got != %q:
    sys.exit("sign: got %%s, want %%s" %% (got, %q))
verify(secret, headers("evt-1", %q, "v1,AAAA " + %q), body)
def refused(what, h, b):
    try:
        verify(secret, h, b)
    except ValueError:
        return
    sys.exit("verify accepted " + what)
refused("a changed body", headers("evt-1", %q, %q), body + b" ")
refused("a wrong secret", headers("evt-1", %q, %q), body)
refused("a stale timestamp", headers("evt-1", %q, %q), body)
refused("no headers", {}, body)
print("ok")
`, secret, fmt.Sprintf("%x", body),
		h.Get(webhook.HeaderTimestamp), h.Get(webhook.HeaderSignature), h.Get(webhook.HeaderSignature),
		h.Get(webhook.HeaderTimestamp), h.Get(webhook.HeaderSignature),
		h.Get(webhook.HeaderTimestamp), h.Get(webhook.HeaderSignature),
		forged.Get(webhook.HeaderTimestamp), forged.Get(webhook.HeaderSignature),
		stale.Get(webhook.HeaderTimestamp), stale.Get(webhook.HeaderSignature))
	file := filepath.Join(t.TempDir(), "receiver.py")
	if err := os.WriteFile(file, []byte(setupBlock(t, "python")+driver), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(py, file).CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "ok" {
		t.Fatalf("python3 %s: %v\n%s", file, err, out)
	}
}

// FuzzVerify: Verify never panics, and accepts exactly what Sign signed.
func FuzzVerify(f *testing.F) {
	f.Add([]byte("0123456789abcdef01234567"), "msg_1", int64(1700000000), []byte(`{"a":1}`), "v1,abc")
	f.Add([]byte{}, "", int64(0), []byte{}, "")
	f.Add([]byte("k"), "id with spaces", int64(-1), []byte("\x00\xff"), "v1, v1,,, v2,x")
	f.Fuzz(func(t *testing.T, key []byte, id string, sec int64, body []byte, sig string) {
		now := time.Unix(sec, 0)
		h := http.Header{}
		h.Set(webhook.HeaderID, id)
		h.Set(webhook.HeaderTimestamp, strconv.FormatInt(sec, 10))
		h.Set(webhook.HeaderSignature, sig)
		_ = webhook.Verify(key, h, body, now) // must not panic
		good := webhook.Sign(key, id, now, body)
		h.Set(webhook.HeaderSignature, sig+" "+good)
		err := webhook.Verify(key, h, body, now)
		valid := id != "" && sec >= 0
		if valid && err != nil {
			t.Fatalf("Verify refused a signed message: %v", err)
		}
		if err == nil {
			h.Set(webhook.HeaderSignature, sig)
			if webhook.Verify(key, h, append(bytes.Clone(body), 'x'), now) == nil {
				t.Fatal("Verify accepted a changed body")
			}
		}
	})
}
